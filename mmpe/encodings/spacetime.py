"""Latitude × longitude × time: a spatial sphere encoding composed with a temporal 1D one.

The coordinate views it reads are in `mmpe.coords.spacetime`
([`TimeLine`][mmpe.coords.TimeLine], `LatLonOnly`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from mmpe.coords import spacetime as _views
from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Spherical, provides
from mmpe.encodings._sphere import sphere_angles
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import InputEncoding
from mmpe.registry import build, get, register
from mmpe.validation import check_bool, check_int

Spec = str | Mapping[str, Any]


def _canonical(spec: Spec, where: str) -> tuple[str, dict[str, Any], str]:
    """`(name, options, text)` of a spec: a registry name or `{"name": ..., **options}`."""
    if isinstance(spec, str):
        return spec, {}, spec
    if isinstance(spec, Mapping):
        options = dict(spec)
        if "name" not in options or not isinstance(options["name"], str):
            raise ValueError(f"spacetime: {where} must be a registry name or a mapping with a "
                             f"'name' key, got {spec!r}")
        name = options.pop("name")
        text = json.dumps({"name": name, **options}, sort_keys=True, default=repr)
        return name, options, text
    raise TypeError(f"spacetime: {where} must be a str or a mapping, got {type(spec).__name__}")


@register(
    "spacetime", hook="input", needs=(Spherical,), learnable=True, family="sphere",
    aliases=("latlon_time",),
    paper="Composition used by spatio-temporal Earth models: Gao et al. 2022, Earthformer: "
          "Exploring Space-Time Transformers for Earth System Forecasting (NeurIPS; summed "
          "per-axis position embeddings over T × H × W); Pathak et al. 2022 (FourCastNet); "
          "Rußwurm et al. 2024 spherical harmonics + Vaswani et al. 2017 sinusoids in time",
    context=("d_model",))
class SpaceTimePE(SavesSettings, InputEncoding):
    """`P = P_space(φ, λ) + P_time(t)` (or `[P_space, P_time]`): one encoding per factor.

    Spatio-temporal Earth models encode a token at latitude `φ`, longitude `λ` and time
    `t` by a spatial and a temporal encoding added together — Earthformer sums embeddings of
    its `T`, `H`, `W` axes. This composes any spatial input encoding on the sphere
    (`spatial`: `"spherical_harmonics"`, `"latlon_sincos"`, `"sphere_c"`,
    `"latlon_grid"` …; it must read only `lat`/`lon`) with any 1D input encoding of the
    time stamps (`temporal`: `"sinusoidal"`, `"scaled_sinusoidal"` …) of
    [`mmpe.Sphere`][mmpe.coords.sphere.Sphere] (`Sphere(..., time=t)` or `Sphere.grid(n_lat, n_lon, times)`):

    * `concat=False` (default): both produce `d_model` channels and are added;
    * `concat=True`: the spatial part produces `d_model − time_dim` channels, the temporal
      part `time_dim`, concatenated (space first).

    A sphere without time stamps is one snapshot at `t = 0` (the temporal part then adds the
    same vector to every token). Each part is built with `mmpe.build(spec, context={"d_model":
    width})`, so a spec is a registry name or `{"name": ..., **options}`; the parts are the
    submodules `spatial` and `temporal`, and the specs are saved in the state_dict.

    Args:
        d_model: output width.
        spatial: the spatial encoding's spec (default `"spherical_harmonics"`).
        temporal: the temporal encoding's spec (default `"sinusoidal"`: Vaswani et al.'s
            sinusoids of the time stamp, in its unit).
        concat: concatenate instead of adding.
        time_dim: channels of the temporal part when `concat` (even for sinusoids).

    Shapes: `forward(coords) -> [n, d_model]` or `[b, n, d_model]`.

    Raises:
        ValueError: a spec that is not an input encoding, a spatial encoding that needs more
            than `lat`/`lon`, a temporal one that does not run on 1D positions, a
            `time_dim` outside `[1, d_model − 1]` with `concat`; what the parts raise.
        TypeError: coordinates not on the sphere (`Spherical`).
    """

    saved_settings = ("spatial_spec", "temporal_spec", "concat", "time_dim")

    def __init__(self, d_model: int, spatial: Spec = "spherical_harmonics",
                 temporal: Spec = "sinusoidal", concat: bool = False, time_dim: int = 16) -> None:
        super().__init__()
        check_int("spacetime", "d_model", d_model)
        check_int("spacetime", "time_dim", time_dim)
        concat = check_bool("spacetime", "concat", concat)
        if concat and time_dim > d_model - 1:
            raise ValueError(f"spacetime: time_dim must lie in [1, d_model - 1] = [1, {d_model - 1}] "
                             f"with concat=True, got {time_dim}")
        s_name, s_opts, self.spatial_spec = _canonical(spatial, "spatial")
        t_name, t_opts, self.temporal_spec = _canonical(temporal, "temporal")
        s_entry, t_entry = get(s_name), get(t_name)
        if s_entry.hook != "input" or t_entry.hook != "input":
            bad = s_name if s_entry.hook != "input" else t_name
            raise ValueError(f"spacetime: {bad!r} is a {get(bad).hook} encoding; spatial and "
                             "temporal must be input encodings")
        if not provides(_views.LatLonOnly, s_entry.needs):
            raise ValueError(f"spacetime: spatial={s_name!r} needs {[c.__name__ for c in s_entry.needs]}; "
                             "a spatial part must read only lat/lon (Spherical)")
        if not provides(_views.TimeLine, t_entry.needs):
            raise ValueError(f"spacetime: temporal={t_name!r} needs {[c.__name__ for c in t_entry.needs]}; "
                             "a temporal part must run on 1D positions (Positioned1D)")
        self.concat, self.time_dim, self.d_model = bool(concat), time_dim, d_model
        s_width, t_width = (d_model - time_dim, time_dim) if concat else (d_model, d_model)
        self.spatial = build(s_name, context={"d_model": s_width}, **s_opts)
        self.temporal = build(t_name, context={"d_model": t_width}, **t_opts)

    def time_coordinates(self, coords: Coordinates) -> _views.TimeLine:
        """The tokens' time stamps as 1D coordinates (zeros without a time axis)."""
        lat, _ = sphere_angles(self, coords)
        time = getattr(coords, "time", None)
        if time is None:
            time = torch.zeros_like(lat)
        return _views.TimeLine(time)

    def forward(self, coords: Coordinates) -> Tensor:
        time = self.temporal(self.time_coordinates(coords))
        space = self.spatial(coords)
        if self.concat:
            dtype = torch.promote_types(space.dtype, time.dtype)
            lead = torch.broadcast_shapes(space.shape[:-1], time.shape[:-1])
            return torch.cat((space.to(dtype).expand(*lead, space.shape[-1]),
                              time.to(dtype).expand(*lead, time.shape[-1])), dim=-1)
        return space + time

    def extra_repr(self) -> str:
        return f"concat={self.concat}, time_dim={self.time_dim}"

