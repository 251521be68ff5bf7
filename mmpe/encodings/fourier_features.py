"""Fourier feature encodings of continuous coordinates.

Fourier feature encodings of continuous coordinates: random Fourier features (Tancik et al.
2020) and NeRF's frequency encoding (Mildenhall et al. 2020), projected to `d_model`."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Positioned
from mmpe.encodings._geometry import pad_axes
from mmpe.encodings._precision import KeepDtype, module_dtype
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import InputEncoding
from mmpe.registry import register
from mmpe.validation import check_bool, check_finite_float, check_int


def random_fourier_features(positions: Tensor, B: Tensor) -> Tensor:
    """`γ(v) = [cos(2π B v), sin(2π B v)]` (Tancik et al. 2020, §5), `[..., 2m]` float32.

    Args:
        positions: `v` `[..., a]` (any real dtype; the phase is formed in float64).
        B: `[m, a]` frequencies (cycles per coordinate unit).

    `γ(x)·γ(y) = Σ_i cos(2π b_i·(x − y))`: the kernel is stationary (depends on `x − y`).
    """
    phase = 2 * math.pi * (positions.to(torch.float64) @ B.to(torch.float64, copy=False).T)
    return torch.cat((phase.cos(), phase.sin()), dim=-1).to(torch.float32)


def nerf_encoding(positions: Tensor, num_frequencies: int) -> Tensor:
    """`γ(p) = (sin(2⁰πp), cos(2⁰πp), …, sin(2^{L−1}πp), cos(2^{L−1}πp))` per coordinate.

    Mildenhall et al. 2020, eq. 4, applied to every axis of `positions` `[..., a]`. Layout
    (as the reference code): for `k = 0 … L−1`, `sin(2^k π p)` of all axes, then
    `cos(2^k π p)` of all axes: `[..., 2·L·a]` float32 (phases in float64).
    """
    p = positions.to(torch.float64)
    freqs = (2.0 ** torch.arange(num_frequencies, dtype=torch.float64, device=p.device)) * math.pi
    phase = p.unsqueeze(-2) * freqs.unsqueeze(-1)  # [..., L, a]
    return torch.stack((phase.sin(), phase.cos()), dim=-2).flatten(-3).to(torch.float32)


def _positions(name: str, enc: InputEncoding, coords: Coordinates, num_axes: int) -> Tensor:
    enc.check_coords(coords)
    pos = coords.query_positions
    return pad_axes(name, pos.to(torch.float64), num_axes)  # phases are formed in float64


@register(
    "fourier_features", hook="input", needs=(Positioned,), learnable=True, family="absolute",
    aliases=("random_fourier", "rff"),
    paper="Tancik et al. 2020, Fourier Features Let Networks Learn High Frequency Functions in "
          "Low Dimensional Domains (NeurIPS), Gaussian mapping §6",
    context=("d_model", "num_axes"))
class RandomFourierFeatures(KeepDtype, SavesSettings, InputEncoding):
    """`P = W·[cos(2πBv), sin(2πBv)] + c` with fixed `B ~ N(0, σ²)`: random Fourier features.

    Tancik et al. 2020 map a low-dimensional coordinate `v` (pixel, voxel, point) through
    `m` random sinusoids ([`random_fourier_features`][mmpe.encodings.fourier_features.random_fourier_features]) before an MLP, so that the network's
    neural tangent kernel becomes the stationary `k(x, y) = Σ_i cos(2π b_i·(x − y))` and can fit
    high frequencies; `σ` sets the bandwidth (cycles per coordinate unit). `B` is drawn once
    (from `seed`), never trained, and saved in the state_dict; a learned linear map projects
    the `2m` features to `d_model`. Positions are the coordinates' own (grid cells, points in
    Å, lat/lon in radians …): choose `σ` in those units.

    Args:
        d_model: output width.
        num_axes: `a`, axes of the positions (the model context passes the coordinates';
            positions with fewer axes get zeros appended, more are an error).
        num_frequencies: `m` (256 in the paper).
        sigma: `σ`, std of `B`'s entries (cycles per unit).
        seed: seed of the generator that draws `B`.

    Shapes: `forward(coords) -> [n, d_model]` or `[b, n, d_model]`.

    Raises:
        ValueError: non-positive `d_model`, `num_axes`, `num_frequencies` or `sigma`;
            coordinates with more than `num_axes` axes.
        TypeError: coordinates without positions (`Positioned`).
    """

    keep_dtype = ("B",)  # frequencies: float32 in a bf16 model (2πBv at v = 1000 needs it)

    def __init__(self, d_model: int, num_axes: int = 3, num_frequencies: int = 256,
                 sigma: float = 1.0, seed: int = 0) -> None:
        super().__init__()
        for arg, val in (("d_model", d_model), ("num_axes", num_axes),
                         ("num_frequencies", num_frequencies)):
            check_int("fourier_features", arg, val)
        sigma = check_finite_float("fourier_features", "sigma", sigma, low=0.0, low_open=True)
        check_int("fourier_features", "seed", seed, minimum=0)
        self.num_axes, self.sigma = num_axes, float(sigma)
        gen = torch.Generator().manual_seed(seed)
        self.register_buffer("B", torch.randn(num_frequencies, num_axes, generator=gen) * self.sigma)
        self.proj = nn.Linear(2 * num_frequencies, d_model)

    def features(self, coords: Coordinates) -> Tensor:
        """`γ(v)` `[(b,) n, 2m]` (float32) before the projection."""
        pos = _positions("fourier_features", self, coords, self.num_axes)
        return random_fourier_features(pos, self.B)

    def forward(self, coords: Coordinates) -> Tensor:
        return self.proj(self.features(coords).to(module_dtype(self.proj)))


@register(
    "nerf", hook="input", needs=(Positioned,), learnable=True, family="absolute",
    aliases=("nerf_frequency",),
    paper="Mildenhall et al. 2020, NeRF: Representing Scenes as Neural Radiance Fields for View "
          "Synthesis (ECCV), eq. 4",
    context=("d_model", "num_axes"))
class NeRFEncoding(SavesSettings, InputEncoding):
    """`P = W·γ(s·p) + c` with NeRF's `γ(p) = (sin(2^k πp), cos(2^k πp))_{k<L}` per axis.

    Mildenhall et al. 2020 (eq. 4) encode each coordinate of a 3D point with `L` octaves of
    sinusoids ([`nerf_encoding`][mmpe.encodings.fourier_features.nerf_encoding]; `L = 10` for positions, 4 for view directions), having
    normalised the scene to `[−1, 1]`; a learned linear map projects the `2·L·a` features
    to `d_model`. `scale` `s` multiplies the positions first (e.g. 1/half-extent of a
    point cloud; at integer grid positions and `s = 1` every `sin(2^k π p)` is 0).

    Args:
        d_model: output width.
        num_axes: `a` (3 for NeRF's points; the model context passes the coordinates';
            positions with fewer axes get zeros appended, more are an error).
        num_frequencies: `L`.
        scale: `s`, positions are multiplied by it (inverse coordinate units).
        include_input: also feed `s·p` itself (NeRF's code does; the paper's γ does not).

    Shapes: `forward(coords) -> [n, d_model]` or `[b, n, d_model]`.

    Raises:
        ValueError: non-positive `d_model`, `num_axes`, `num_frequencies` or `scale`;
            coordinates with more than `num_axes` axes.
        TypeError: coordinates without positions (`Positioned`).
    """

    saved_settings = ("scale",)

    def __init__(self, d_model: int, num_axes: int = 3, num_frequencies: int = 10,
                 scale: float = 1.0, include_input: bool = False) -> None:
        super().__init__()
        for arg, val in (("d_model", d_model), ("num_axes", num_axes),
                         ("num_frequencies", num_frequencies)):
            check_int("nerf", arg, val)
        scale = check_finite_float("nerf", "scale", scale, low=0.0, low_open=True)
        include_input = check_bool("nerf", "include_input", include_input)
        self.num_axes, self.num_frequencies = num_axes, num_frequencies
        self.scale, self.include_input = float(scale), bool(include_input)
        width = 2 * num_frequencies * num_axes + (num_axes if include_input else 0)
        self.proj = nn.Linear(width, d_model)

    def features(self, coords: Coordinates) -> Tensor:
        """`[s·p,] γ(s·p)` `[(b,) n, 2La (+a)]` (float32) before the projection."""
        pos = _positions("nerf", self, coords, self.num_axes).to(torch.float64) * self.scale
        feats = nerf_encoding(pos, self.num_frequencies)
        if self.include_input:
            feats = torch.cat((pos.to(torch.float32), feats), dim=-1)
        return feats

    def forward(self, coords: Coordinates) -> Tensor:
        return self.proj(self.features(coords).to(module_dtype(self.proj)))
