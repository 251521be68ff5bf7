"""Sphere encodings on a world map: [`plot_sphere`][mmpe.plot.sphere.plot_sphere]."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmpe.coords.sphere import Sphere
from mmpe.encodings.base import InputEncoding
from mmpe.plot._common import build, evaluating, name_of, positions
from mmpe.plot.style import DIVERGING, finish, new_figure, symmetric_limit

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["plot_sphere"]


def _coastlines() -> Any:
    """cartopy's `PlateCarree` when cartopy and its Natural Earth coastlines are here
    offline (cartopy would otherwise try to download them while drawing), else None."""
    try:
        import cartopy
        import cartopy.crs as ccrs
    except Exception:
        return None
    try:
        fmt = {"category": "physical", "name": "coastline", "resolution": "110m",
               "config": cartopy.config}
        loader = cartopy.config["downloaders"][("shapefiles", "natural_earth")]
        local = [loader.target_path(fmt), loader.pre_downloaded_path(fmt)]
        if not any(p is not None and Path(p).is_file() for p in local):
            return None
    except Exception:
        return None
    return ccrs.PlateCarree()


def plot_sphere(enc: InputEncoding | str, coords: Sphere | None = None, *, n_lat: int = 90,
                n_lon: int = 180, components: int | Seq[int] = 4, features: bool = False,
                context: Mapping[str, Any] | None = None,
                path: str | os.PathLike | None = None) -> Figure:
    """Components of a sphere encoding on a world map (equirectangular: longitude × latitude).

    Coastlines come from cartopy when it and its Natural Earth data are installed; otherwise
    the maps are plain longitude/latitude axes.

    Args:
        enc: an input encoding on [`Sphere`][mmpe.coords.sphere.Sphere] coordinates, or a registry name
            (`d_model` 64 by default).
        coords: a `Sphere.grid(n_lat, n_lon)` (default built from `n_lat`, `n_lon`).
        components: how many (the first `k`) or which output channels to map.
        features: map the encoding's raw features (`enc.features(coords)`, e.g. the spherical
            harmonics `Y_l^m`) instead of its output.
        path: write a PNG here.

    Raises:
        ValueError: not an input encoding; `coords` not a 2D `Sphere.grid`; a component
            out of range; `features` for an encoding without `features`.
    """
    fn = "plot_sphere"
    enc = build(fn, enc, InputEncoding, {"d_model": 64, **(context or {})})
    if coords is None:
        coords = Sphere.grid(n_lat, n_lon)
    shape = getattr(coords, "grid_shape", None)
    if not isinstance(coords, Sphere) or shape is None or len(shape) != 2:
        raise ValueError(f"{fn}: coords must be a Sphere.grid(n_lat, n_lon) without times, "
                         f"got {type(coords).__name__} with grid_shape {shape}")
    n_lat, n_lon = shape
    if features:
        if not hasattr(enc, "features"):
            raise ValueError(f"{fn}: {name_of(enc)} has no raw features to map; use features=False")
        enc.check_coords(coords)
        with evaluating(enc):
            vals = enc.features(coords)
        vals = vals[0] if vals.dim() == 3 else vals
        vals = vals.detach().float().cpu()
    else:
        vals = positions(enc, coords)
    vals = vals.numpy().reshape(n_lat, n_lon, -1)
    dim = vals.shape[-1]
    picks = list(range(min(components, dim))) if isinstance(components, int) else list(components)
    if not picks or any(not 0 <= c < dim for c in picks):
        raise ValueError(f"{fn}: components must lie in [0, {dim}), got {components!r}")
    proj = _coastlines()
    cols = 1 if len(picks) == 1 else 2
    rows = math.ceil(len(picks) / cols)
    fig = new_figure(5.0 * cols, 2.7 * rows + 0.5)
    dlon = 360.0 / n_lon
    extent = (-180.0 - dlon / 2, 180.0 - dlon / 2, -90.0, 90.0)
    for i, c in enumerate(picks):
        kw = {"projection": proj} if proj is not None else {}
        ax = fig.add_subplot(rows, cols, i + 1, **kw)
        lim = symmetric_limit(vals[..., c])
        img_kw = {"transform": proj} if proj is not None else {}
        im = ax.imshow(vals[..., c], origin="lower", extent=extent, cmap=DIVERGING,
                       vmin=-lim, vmax=lim, interpolation="nearest", **img_kw)
        if proj is not None:
            ax.coastlines(linewidth=0.5)
            ax.set_global()
        else:
            ax.set_xticks(range(-180, 181, 60))
            ax.set_yticks(range(-90, 91, 30))
            ax.tick_params(labelsize=7)
            ax.set_xlabel("longitude (°)", fontsize=8)
            ax.set_ylabel("latitude (°)", fontsize=8)
        if features and getattr(enc, "registry_name", "") == "spherical_harmonics":
            deg = math.isqrt(c)
            ax.set_title(f"Y_{deg}^{c - deg * deg - deg}", fontsize=9)
        else:
            ax.set_title(f"{'feature' if features else 'component'} {c}", fontsize=9)
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(f"{name_of(enc)} on the sphere ({n_lat}×{n_lon} grid)")
    return finish(fig, path)
