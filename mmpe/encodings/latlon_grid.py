"""A learned position embedding per cell of a regular latitude–longitude grid (FourCastNet)."""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor, nn

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Spherical
from mmpe.earth import area_weights, weighted_mean, weighted_rmse
from mmpe.encodings._sphere import sphere_angles
from mmpe.encodings.base import InputEncoding
from mmpe.registry import register
from mmpe.validation import check_finite_float, check_int

__all__ = ["LatLonGridPE", "area_weights", "latlon_cells", "weighted_mean", "weighted_rmse"]


def latlon_cells(lat: Tensor, lon: Tensor, n_lat: int, n_lon: int) -> tuple[Tensor, Tensor]:
    """The cell `(i, j)` of an `n_lat × n_lon` grid that contains each point (int64).

    The grid is [`mmpe.Sphere.grid`][mmpe.coords.sphere.Sphere.grid]'s: row `i` spans latitudes
    `[−π/2 + i·π/n_lat, −π/2 + (i+1)·π/n_lat)` (south to north, centres at `(i + ½)` steps,
    the north pole in the last row), column `j` is centred on `λ_j = −π + j·2π/n_lon` and
    spans `±π/n_lon` around it (periodic: `λ = π − ε` falls in column 0). A grid's own cell
    centres map to their cell exactly (half a cell from every boundary).

    Args:
        lat, lon: radians, broadcastable.

    Returns:
        `(i, j)` of the broadcast shape.
    """
    lat64, lon64 = lat.to(torch.float64), lon.to(torch.float64)
    i = torch.floor((lat64 + math.pi / 2) * (n_lat / math.pi)).clamp(0, n_lat - 1)
    j = torch.remainder(torch.round((lon64 + math.pi) * (n_lon / (2 * math.pi))), n_lon)
    return i.long(), j.long()


#: cells a point may lie from its cell's centre before latlon_grid says which grid it assumed:
#: a quarter (the SST recipe's HadISST cells sit 0.1 cells east of the centres and bin without
#: doubt; at half a cell, an ERA5 row on the pole, the cell is a coin toss)
OFF_CENTRE = 0.25


def cell_offsets(lat: Tensor, lon: Tensor, n_lat: int, n_lon: int) -> Tensor:
    """How far each point lies from the centre of its grid cell, in cells.

    How far each point lies from the centre of its [`latlon_cells`][mmpe.encodings.latlon_grid.latlon_cells]
    cell, in cells (the larger of the latitude and longitude offsets, in `[0, ½]`), float64."""
    lat64, lon64 = lat.detach().to(torch.float64), lon.detach().to(torch.float64)
    i, j = latlon_cells(lat64, lon64, n_lat, n_lon)
    d_lat = (lat64 + math.pi / 2) * (n_lat / math.pi) - (i + 0.5)
    d_lon = torch.remainder((lon64 + math.pi) * (n_lon / (2 * math.pi)) - j + 0.5, n_lon) - 0.5
    return torch.maximum(d_lat.abs(), d_lon.abs())


def _warn_off_centre(lat: Tensor, lon: Tensor, n_lat: int, n_lon: int) -> None:
    """Say which grid the table assumes when the points are not at its cell centres: binning
    them is a choice (an ERA5 grid with rows on the poles shares cells between rows)."""
    off = cell_offsets(lat, lon, n_lat, n_lon)
    far = off > OFF_CENTRE
    if bool(far.any()):
        warnings.warn(
            f"latlon_grid: {int(far.sum())} of {far.numel()} points lie more than a quarter cell "
            f"from the cell centres of the {n_lat}×{n_lon} grid the table assumes (Sphere.grid's "
            f"layout: rows centred "
            f"at latitude -90 + (i + 0.5)·{180 / n_lat:g}°, columns at longitude -180 + "
            f"j·{360 / n_lon:g}°), up to {float(off.max()):.2f} cells away; each reads the cell "
            f"that contains it. Build the coordinates with Sphere.grid({n_lat}, {n_lon}), or "
            "the table with your data's grid_shape", UserWarning, stacklevel=6)


@register(
    "latlon_grid", hook="input", needs=(Spherical,), learnable=True, family="sphere",
    aliases=("fourcastnet_pos",),
    paper="Pathak et al. 2022, FourCastNet: A Global Data-driven High-resolution Weather Model "
          "using Adaptive Fourier Neural Operators (arXiv:2202.11214), §3: learned position "
          "embedding of the AFNO/ViT patch grid",
    context=("d_model", "grid_shape"))
class LatLonGridPE(InputEncoding):
    """`P = E[i(φ), j(λ)]`: one learned `d_model` vector per cell of a regular lat/lon grid.

    FourCastNet (Pathak et al. 2022) cuts the 720 × 1440 ERA5 field into 8 × 8 patches and adds a
    learned position embedding `[1, h·w, d]` (initialised `trunc_normal(std=0.02)`, as
    ViT) to the patch tokens: one vector per cell of the `(h, w) = (90, 180)` patch grid. Here
    the table is `E [n_lat, n_lon, d_model]` and a token at `(φ, λ)` reads the row of the
    cell that contains it ([`latlon_cells`][mmpe.encodings.latlon_grid.latlon_cells]), so on `Sphere.grid(n_lat, n_lon)` tokens —
    with or without a time axis — `P` is exactly FourCastNet's table in row-major
    `(lat, lon)` order, repeated over the time steps; scattered points get their cell's
    vector. A table learned on one grid is tied to it: coordinates that record their own
    `grid_shape` (`Sphere.grid`) must have the table's `(n_lat, n_lon)`; on other coordinates,
    points more than a quarter cell from the centres of this layout (an ERA5 grid with rows on
    the poles, scattered stations) are binned to the cell that contains them, with a warning
    that names the grid assumed and how far the points lie from its centres.

    Metrics on such grids are latitude-weighted: [`mmpe.earth.area_weights`][mmpe.earth.area_weights] and
    [`mmpe.earth.weighted_rmse`][mmpe.earth.weighted_rmse] (re-exported here).

    Args:
        d_model: width.
        grid_shape: `(n_lat, n_lon)` of the table (FourCastNet's patch grid: `(90, 180)`).
        init_std: std of the truncated-normal initialisation (0.02; 0 = zeros).

    Shapes: `forward(coords) -> [n, d_model]` or `[b, n, d_model]`.

    Raises:
        ValueError: `grid_shape` not two positive ints, non-positive `d_model`, negative
            `init_std`; coordinates from `Sphere.grid` of another `(n_lat, n_lon)`.
        TypeError: coordinates not on the sphere (`Spherical`).

    Warns:
        UserWarning: coordinates without a `grid_shape` whose points are not at the cell
            centres of the table's grid (more than a quarter cell away).
    """

    def __init__(self, d_model: int, grid_shape: tuple[int, int] = (90, 180),
                 init_std: float = 0.02) -> None:
        super().__init__()
        check_int("latlon_grid", "d_model", d_model)
        shape = tuple(grid_shape) if isinstance(grid_shape, (tuple, list)) else None
        if shape is None or len(shape) != 2 or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape):
            raise ValueError(f"latlon_grid: grid_shape must be (n_lat, n_lon), two positive ints, "
                             f"got {grid_shape!r}")
        init_std = check_finite_float("latlon_grid", "init_std", init_std, low=0.0)
        self.grid_shape = shape
        self.table = nn.Parameter(torch.zeros(*shape, d_model))
        if init_std > 0:  # 0: a zero-initialised table
            nn.init.trunc_normal_(self.table, std=init_std)

    def cells(self, coords: Coordinates) -> tuple[Tensor, Tensor]:
        """Each token's cell `(i, j)`, `[n]` or `[b, n]` int64."""
        lat, lon = sphere_angles(self, coords)
        recorded = getattr(coords, "grid_shape", None)
        if recorded is not None and tuple(recorded[-2:]) != self.grid_shape:
            raise ValueError(
                f"latlon_grid: the table is {self.grid_shape[0]}×{self.grid_shape[1]} (n_lat, n_lon) "
                f"but the coordinates are a {recorded[-2]}×{recorded[-1]} grid; build latlon_grid "
                f"with grid_shape=({recorded[-2]}, {recorded[-1]})")
        if recorded is None and not torch.compiler.is_compiling():
            _warn_off_centre(lat, lon, *self.grid_shape)
        return latlon_cells(lat, lon, *self.grid_shape)

    def forward(self, coords: Coordinates) -> Tensor:
        i, j = self.cells(coords)
        return self.table[i.to(self.table.device), j.to(self.table.device)]
