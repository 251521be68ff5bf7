"""xPos: RoPE with an exponential decay per frequency (Sun et al. 2022)."""

from __future__ import annotations

import torch
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Positioned1D
from mmpe.encodings._positions import check_qk, position_bound, rotary_positions
from mmpe.encodings.rope import RoPE, apply_rotary, rope_cos_sin
from mmpe.registry import register


@register(
    "xpos", hook="rotary", needs=(Positioned1D,), learnable=False, family="rotary",
    paper="Sun et al. 2022, A Length-Extrapolatable Transformer (arXiv:2212.10554), §3.2, eq. 10", context=("head_dim",))
class XPos(RoPE):
    """Extrapolatable position embedding (Sun et al. 2022, eq. 10).

    Queries at position `n` are rotated as RoPE and multiplied by `ζ_i^{n/γ_B}`, keys at
    `m` by `ζ_i^{−m/γ_B}`, per channel pair `i`, with
    `ζ_i = (2i/d + γ)/(1 + γ) ∈ (0, 1)` (`γ = 0.4`) and `γ_B` = `scale_base` (512). The
    logit then carries `ζ_i^{(n − m)/γ_B}`: an attention resolution that decays with the
    distance for a causal decoder (`n ≥ m`). Positions are shifted by half the largest key
    position before exponentiating (the ratio is unchanged) to keep the factors near 1, as in
    the reference code and rotary-embedding-torch. The paper pairs it with blockwise causal
    attention at inference; that is a masking choice of the model, not part of this encoding.

    Args:
        head_dim, base, rotary_dim, interleaved: as [`RoPE`][mmpe.encodings.rope.RoPE].
        scale_base: `γ_B` (tokens, > 0).
        gamma: `γ` (> 0).

    Raises:
        ValueError: `scale_base ≤ 0`, `gamma ≤ 0`, and RoPE's errors (odd rotary dim …).
    """

    length_dependent = True  # rotations change with the number of tokens
    saved_settings = ("base", "rotary_dim", "interleaved", "scale_base", "gamma")

    def __init__(self, head_dim: int, base: float = 10000.0, scale_base: float = 512.0,
                 gamma: float = 0.4, rotary_dim: int | None = None, interleaved: bool = False) -> None:
        super().__init__(head_dim, base, rotary_dim, interleaved)
        if not scale_base > 0:
            raise ValueError(f"xpos: scale_base must be > 0, got {scale_base}")
        if not gamma > 0:
            raise ValueError(f"xpos: gamma must be > 0, got {gamma}")
        self.scale_base, self.gamma = float(scale_base), float(gamma)

    def zeta(self) -> Tensor:
        """`ζ_i = (2i/d + γ)/(1 + γ)`, float64 `[rotary_dim/2]`."""
        i2 = torch.arange(0, self.rotary_dim, 2, dtype=torch.float64)
        return (i2 / self.rotary_dim + self.gamma) / (1 + self.gamma)

    def forward(self, q: Tensor, k: Tensor, coords: Coordinates) -> tuple[Tensor, Tensor]:
        self.check_coords(coords)
        check_qk("xpos", q, k, self.head_dim, coords)
        qpos, kpos = (p[..., 0] for p in rotary_positions(coords, k))
        top = position_bound(coords)
        inv_freq = self.inv_freq(top)
        log_zeta = self.zeta().log().to(qpos.device)

        def rotate(x: Tensor, pos: Tensor, sign: float) -> Tensor:
            cos, sin = rope_cos_sin(pos, inv_freq)
            power = (pos.to(torch.float64) - top // 2) / self.scale_base
            scale = torch.exp(sign * power.unsqueeze(-1) * log_zeta).to(torch.float32)
            return apply_rotary(x, cos * scale, sin * scale, self.interleaved)

        return rotate(q, qpos, 1.0), rotate(k, kpos, -1.0)
