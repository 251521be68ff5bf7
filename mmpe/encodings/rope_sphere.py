"""RoPE on (latitude, longitude) with 2π-periodic longitude rotations."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Spherical
from mmpe.encodings._positions import check_qk
from mmpe.encodings._precision import KeepDtype
from mmpe.encodings._sphere import sphere_angles
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import RotaryEncoding
from mmpe.encodings.rope import apply_rotary
from mmpe.registry import register


def integer_frequencies(n: int, max_freq: float) -> Tensor:
    """`n` strictly increasing positive integers spaced geometrically from 1 to ~`max_freq`.

    `k_i = max(round(max_freq^{i/(n−1)}), k_{i−1} + 1)` (float64, `[n]`).
    """
    if n < 1:
        raise ValueError(f"rope_sphere: need at least one frequency, got {n}")
    out: list[float] = []
    for i in range(n):
        g = max_freq ** (i / (n - 1)) if n > 1 else 1.0
        k = float(round(g))
        out.append(max(k, out[-1] + 1) if out else max(k, 1.0))
    return torch.tensor(out, dtype=torch.float64)


@register(
    "rope_sphere", hook="rotary", needs=(Spherical,), learnable=False, family="rotary",
    aliases=("rope_latlon",),
    paper="Su et al. 2021 (RoFormer) applied axially to (lat, lon) as in 2D RoPE (Heo et al. "
          "2024, Rotary Position Embedding for Vision Transformer), with integer longitude "
          "frequencies so the rotation is 2π-periodic", context=("head_dim",))
class SphereRoPE(KeepDtype, SavesSettings, RotaryEncoding):
    """Axial rotary embedding on `(φ, λ)` (radians) with integer longitude frequencies.

    The `h_d/2` channel pairs are split: the first `n_lat` pairs rotate by `a_i · φ`, the
    others by `k_i · λ`, with `a_i`, `k_i` positive integers spaced geometrically up to
    `max_freq` ([`integer_frequencies`][mmpe.encodings.rope_sphere.integer_frequencies]). Then `q_mᵀ k_n` depends on positions only
    through `φ_m − φ_n` and `λ_m − λ_n`, and since every `k_i` is an integer, a rotation by
    `k_i λ` is 2π-periodic: a point at λ = 179.99° and one at −180° get (almost) the same
    rotation, and the relative phase of two points across the date line is the short way round.

    Limitation (by construction): at a pole all longitudes are one point, but their rotations
    differ, so RoPE on angles is not pole-invariant. Encodings of the unit vector
    (`spherical_harmonics`, `fourier_sphere`) or a great-circle bias (`alibi`) are.

    Args:
        head_dim: `h_d`, a multiple of 4.
        max_freq: highest frequency (rotations per radian) on each axis.
        lat_fraction: share of channel pairs for latitude (default ½).

    Shapes: `forward(q [b, n_h, s, h_d], k [b, n_h, s, h_d], coords) -> (q, k)`; channel pairs
    are `(i, i + h_d/2)` (GPT-NeoX layout, as [`mmpe.encodings.rope.RoPE`][mmpe.encodings.rope.RoPE]).

    Raises:
        ValueError: `head_dim` not a positive multiple of 4, `max_freq < 1`, or
            `lat_fraction` leaving an axis without pairs.
        TypeError: coordinates not on the sphere.
    """

    def __init__(self, head_dim: int, max_freq: float = 64.0, lat_fraction: float = 0.5) -> None:
        super().__init__()
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 4 or head_dim % 4:
            raise ValueError(f"rope_sphere: head_dim must be a positive multiple of 4, got {head_dim!r}")
        if max_freq < 1:
            raise ValueError(f"rope_sphere: max_freq must be >= 1, got {max_freq}")
        pairs = head_dim // 2
        n_lat = int(round(pairs * lat_fraction))
        if not 0 < n_lat < pairs:
            raise ValueError(f"rope_sphere: lat_fraction={lat_fraction} leaves an axis without "
                             f"channel pairs ({pairs} pairs)")
        self.head_dim = head_dim
        self.register_buffer("lat_freq", integer_frequencies(n_lat, max_freq), persistent=False)
        self.register_buffer("lon_freq", integer_frequencies(pairs - n_lat, max_freq),
                             persistent=False)

    keep_dtype = ("lat_freq", "lon_freq")  # float64 frequencies in bf16 models too
    saved_settings = ("lat_freq", "lon_freq")  # what max_freq and lat_fraction define

    def cos_sin(self, coords: Coordinates) -> tuple[Tensor, Tensor]:
        """`cos`/`sin` of the phases, `[s, h_d/2]` or `[b, s, h_d/2]` float32."""
        lat, lon = sphere_angles(self, coords)
        phase = torch.cat((lat.to(torch.float64)[..., None] * self.lat_freq,
                           lon.to(torch.float64)[..., None] * self.lon_freq), dim=-1)
        phase = torch.remainder(phase, 2 * math.pi)
        return phase.cos().float(), phase.sin().float()

    def forward(self, q: Tensor, k: Tensor, coords: Coordinates) -> tuple[Tensor, Tensor]:
        check_qk("rope_sphere", q, k, self.head_dim)
        cos, sin = self.cos_sin(coords)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
