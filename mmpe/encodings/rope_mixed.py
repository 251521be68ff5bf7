"""RoPE-Mixed: rotary embedding with learnable mixed-axis frequencies (Heo et al. 2024)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Positioned
from mmpe.encodings._grid import phase_cos_sin, rotate
from mmpe.encodings._positions import check_qk, newest_key_positions
from mmpe.encodings._precision import KeepDtype, float32, full_precision
from mmpe.encodings.base import RotaryEncoding
from mmpe.encodings.rope import apply_rotary, rotation_dtype, same_positions
from mmpe.registry import register


def init_mixed_freqs(head_dim: int, num_heads: int, num_axes: int = 2, base: float = 10.0,
                     rotate: bool = True, generator: torch.Generator | None = None) -> Tensor:
    """Initial frequencies `[A, n_h, h_d/2]` of RoPE-Mixed (Heo et al. 2024, §3.2).

    2D (the paper, and timm's `init_random_2d_freqs`): magnitudes `base^(−4j/h_d)`,
    `j < h_d/4`, each used twice — along a random per-head direction `φ` and along
    `φ + π/2`: `θ_x = [m cos φ, m cos(φ+π/2)]`, `θ_y = [m sin φ, m sin(φ+π/2)]`. With
    `rotate=False` (`φ = 0`) this is axial RoPE. Other `A`: each pair gets a random unit
    direction in `R^A` times its magnitude.
    """
    if head_dim % 4:
        raise ValueError(f"rope_mixed: head_dim must be divisible by 4, got {head_dim}")
    mag = 1.0 / base ** (torch.arange(0, head_dim, 4, dtype=torch.float32) / head_dim)  # [h_d/4]
    if num_axes == 2:
        if rotate:
            angles = torch.rand(num_heads, 1, generator=generator) * 2 * math.pi
        else:
            angles = torch.zeros(num_heads, 1)
        fx = torch.cat((mag * torch.cos(angles), mag * torch.cos(angles + math.pi / 2)), dim=-1)
        fy = torch.cat((mag * torch.sin(angles), mag * torch.sin(angles + math.pi / 2)), dim=-1)
        return torch.stack((fx, fy), dim=0)
    dirs = torch.randn(num_axes, num_heads, head_dim // 2, generator=generator)
    dirs = dirs / dirs.norm(dim=0, keepdim=True)
    return dirs * torch.cat((mag, mag)).view(1, 1, -1)


@register(
    "rope_mixed", hook="rotary", needs=(Positioned,), learnable=True, family="rotary",
    aliases=("rope_vit_mixed",),
    paper="Heo et al. 2024, Rotary Position Embedding for Vision Transformer (ECCV), eq. 11 (RoPE-Mixed)", context=("num_heads", "head_dim", "num_axes"))
class MixedRoPE(KeepDtype, RotaryEncoding):
    """RoPE whose pair frequencies mix the axes and are learned per head (RoPE-Mixed, eq. 11).

    Pair `j` of head `h` rotates a token at `(p_x, p_y)` by
    `θ^x_{h,j} p_x + θ^y_{h,j} p_y` (nD: `Σ_a θ^a_{h,j} p_a`): a learnable 2D frequency
    vector per pair, so heads can attend along diagonals — the paper's fix for axial RoPE's
    missing mixed-axis frequencies. Initialised with [`init_mixed_freqs`][mmpe.encodings.rope_mixed.init_mixed_freqs] (`base` 10 as
    in the paper). One instance holds one layer's frequencies `[A, n_h, h_d/2]`; the paper
    learns them per layer (`Transformer(share_encodings=False)`). The frequencies stay
    float32 when the module is cast to bf16/fp16, and the phases are formed in float32 outside
    autocast (a bf16 frequency is off by ~4 rad at position 4000).

    The rotated pairs are interleaved `(2i, 2i+1)`, matching timm's `RotaryEmbeddingMixed`
    (`get_embed(shape)[layer]` with `apply_rot_embed_cat`): timm's default
    `grid_indexing="xy"` puts the column coordinate on `freqs[0]` (`x`) and the row on
    `freqs[1]` (`y`); mmpe's `freqs[a]` follows the grid's axes, `(h, w)` — so mmpe
    `freqs[0] = timm freqs[1]` and vice versa. Prefix tokens sit at 0 (not rotated).

    Args:
        head_dim: `h_d` (divisible by 4).
        num_heads: `n_h`.
        num_axes: `A` (2 for images).
        base: frequency base (10, the paper's and timm's `temperature`).
        rotate: random initial direction per head (the paper); False gives axial RoPE at init.

    Shapes: `forward(q [b, n_h, n, h_d], k, grid) -> (q, k)` in the inputs' dtype (bf16/fp16
    rotated in their own dtype, [`rotation_dtype`][mmpe.encodings.rope.rotation_dtype]).

    Raises:
        ValueError: `head_dim` not divisible by 4, `num_heads < 1`, a grid whose number of
            axes differs from `num_axes`, q/k with other heads or head dim.
    """

    def __init__(self, head_dim: int, num_heads: int, num_axes: int = 2, base: float = 10.0,
                 rotate: bool = True) -> None:
        super().__init__()
        if head_dim <= 0 or head_dim % 4:
            raise ValueError(f"rope_mixed: head_dim must be a positive multiple of 4, got {head_dim}")
        if num_heads < 1 or num_axes < 1:
            raise ValueError(f"rope_mixed: num_heads and num_axes must be >= 1, got {num_heads}, {num_axes}")
        self.head_dim, self.num_heads, self.num_axes = head_dim, num_heads, num_axes
        self.freqs = nn.Parameter(init_mixed_freqs(head_dim, num_heads, num_axes, base, rotate))

    keep_dtype = ("freqs",)

    def phase(self, coords: Coordinates, keys: bool = False, n_keys: int | None = None) -> Tensor:
        """Rotation angles of the query (or key) tokens.

        `[n_h, n, h_d/2]` (`[b, n_h, n, h_d/2]` for batched positions) angles
        `Σ_a p_a θ^a` of the query (or key) tokens (float32, float64 for float64 positions
        such as absolute time stamps; differentiable in `freqs`)."""
        pos = newest_key_positions(coords, n_keys) if keys else coords.query_positions
        if pos.shape[-1] != self.num_axes:
            raise ValueError(f"rope_mixed: built for num_axes={self.num_axes}, the coordinates "
                             f"have {pos.shape[-1]} axes; build it with num_axes="
                             f"{pos.shape[-1]} (a model: context={{'num_axes': "
                             f"{pos.shape[-1]}}})")
        # float64 stays float64: Unix seconds (≈ 1.7e9) in float32 lose their seconds
        pos = float32(pos.to(self.freqs.device))  # [n, A] or [b, n, A]
        with full_precision(pos.device):
            return torch.einsum("...na,ahj->...hnj", pos, self.freqs.to(pos.dtype))

    def forward(self, q: Tensor, k: Tensor, coords: Coordinates) -> tuple[Tensor, Tensor]:
        self.check_coords(coords)
        check_qk("rope_mixed", q, k, self.head_dim, coords)
        if k.shape[1] != self.num_heads:
            raise ValueError(f"rope_mixed: its frequencies are per head; k has {k.shape[1]} heads "
                             f"but it was built for num_heads={self.num_heads} (no GQA)")
        if q.shape[1] != self.num_heads:
            raise ValueError(f"rope_mixed: built for num_heads={self.num_heads}, q has {q.shape[1]}")
        cos, sin = phase_cos_sin(self.phase(coords), rotation_dtype(q.dtype))
        if rotation_dtype(k.dtype) == cos.dtype and same_positions(
                coords.query_positions, newest_key_positions(coords, k.shape[-2])):
            # A grid's keys are its queries: one phase and one cos/sin table for both.
            return apply_rotary(q, cos, sin, True), apply_rotary(k, cos, sin, True)
        return apply_rotary(q, cos, sin, True), rotate(k, self.phase(coords, True, k.shape[-2]), True)

    def no_weight_decay(self) -> set[str]:
        """The frequencies are excluded from weight decay (as in the paper's code and timm)."""
        return {"freqs"}
