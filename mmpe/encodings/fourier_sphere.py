"""Fourier features of the unit vector on S² (Tancik et al. 2020; Mildenhall et al. 2020)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Spherical
from mmpe.coords.sphere import lat_lon_to_unit
from mmpe.encodings._precision import KeepDtype, module_dtype
from mmpe.encodings._sphere import check_positive_int, sphere_angles
from mmpe.encodings.base import InputEncoding
from mmpe.registry import register


def fourier_features(u: Tensor, B: Tensor) -> Tensor:
    """`γ(u) = [cos(2π B u), sin(2π B u)]` for `u [..., 3]` and `B [m, 3]` → `[..., 2m]`."""
    phase = 2 * math.pi * (u.to(torch.float64) @ B.to(torch.float64, copy=False).T)
    return torch.cat((phase.cos(), phase.sin()), dim=-1)


def nerf_frequencies(num_frequencies: int) -> Tensor:
    """NeRF's axis-aligned frequency matrix `B = diag(2^k / 2)` rows for `k < K` and each axis.

    `2π B u` then gives the phases `2^k π u_i` of Mildenhall et al. 2020, eq. 4. `[3K, 3]`.
    """
    scales = 2.0 ** torch.arange(num_frequencies, dtype=torch.float64) / 2
    eye = torch.eye(3, dtype=torch.float64)
    return (scales[:, None, None] * eye[None]).reshape(-1, 3)


@register(
    "fourier_sphere", hook="input", needs=(Spherical,), learnable=True, family="sphere",
    aliases=("fourier_features_sphere",),
    paper="Tancik et al. 2020, Fourier Features Let Networks Learn High Frequency Functions in "
          "Low Dimensional Domains (NeurIPS); Mildenhall et al. 2020, NeRF (ECCV), eq. 4", context=("d_model",))
class FourierSpherePE(KeepDtype, InputEncoding):
    """`P = W γ(u) + c` with `u ∈ S²` the point's unit vector and `γ` Fourier features.

    `γ(u) = [cos(2π B u), sin(2π B u)]` (Tancik et al. 2020). With `random=True` the rows
    of `B [m, 3]` are drawn once from `N(0, scale²)` (Gaussian random Fourier features);
    with `random=False` they are NeRF's deterministic octaves, phases `2^k π u_i` for
    `k < num_frequencies` on each axis (Mildenhall et al. 2020), plus `u` itself. Because
    `u` is a smooth function on the sphere, the encoding is continuous across the date line
    and the same at a pole for every longitude. `W` (learned) maps the features to `d_model`.

    Args:
        d_model: output width.
        num_frequencies: `m` random rows (default 64), or NeRF octaves per axis (default 6:
            phases up to `32π u`, about 3° wavelength on the globe).
        scale: standard deviation of `B` (cycles per unit of `u`; random only).
        random: Gaussian (True, default) or deterministic NeRF octaves.
        seed: seed of the Gaussian draw (the matrix is a buffer, saved with the model; it stays
            float32 when the module is cast to bf16/fp16, since it sets the phases).

    Shapes: `forward(coords) -> [s, d_model]` or `[b, s, d_model]`.

    Raises:
        ValueError: non-positive `d_model` / `num_frequencies` / `scale`.
        TypeError: coordinates not on the sphere.
    """

    def __init__(self, d_model: int, num_frequencies: int | None = None, scale: float = 4.0,
                 random: bool = True, seed: int = 0) -> None:
        super().__init__()
        if num_frequencies is None:
            num_frequencies = 64 if random else 6
        check_positive_int("fourier_sphere", "d_model", d_model)
        check_positive_int("fourier_sphere", "num_frequencies", num_frequencies)
        if not scale > 0:
            raise ValueError(f"fourier_sphere: scale must be > 0, got {scale}")
        self.random = bool(random)
        if self.random:
            gen = torch.Generator().manual_seed(seed)
            B = torch.randn(num_frequencies, 3, generator=gen, dtype=torch.float64) * scale
        else:
            B = nerf_frequencies(num_frequencies)
        self.register_buffer("B", B.float())
        n_feat = 2 * B.shape[0] + (0 if self.random else 3)
        self.proj = nn.Linear(n_feat, d_model)

    def features(self, coords: Coordinates) -> Tensor:
        """`γ(u)` (and `u` for NeRF octaves), `[s or b, s, n_features]` float32."""
        lat, lon = sphere_angles(self, coords)
        u = lat_lon_to_unit(lat.to(torch.float64), lon.to(torch.float64))
        feats = fourier_features(u, self.B)
        if not self.random:
            feats = torch.cat((u, feats), dim=-1)
        return feats.float()

    keep_dtype = ("B",)

    def forward(self, coords: Coordinates) -> Tensor:
        return self.proj(self.features(coords).to(module_dtype(self.proj)))
