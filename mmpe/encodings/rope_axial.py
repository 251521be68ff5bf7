"""Axial nD rotary position embedding: the head dimension split across the grid's axes."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.encodings._grid import as_grid
from mmpe.encodings.base import RotaryEncoding, check_qk
from mmpe.encodings.rope import apply_rotary, rope_inv_freq
from mmpe.registry import register


def axial_phase(positions: Tensor, head_dim: int, base: float = 10000.0) -> Tensor:
    """Rotation angle of every channel pair, ``[n, head_dim/2]`` float64 (radians).

    ``positions`` ``[n, A]``. Pair ``j`` of axis ``a``'s block (``head_dim/(2A)`` pairs each,
    axes in order) turns by ``p_a · θ_j`` with ``θ_j = base^(−2j/(head_dim/A))`` — 1D RoPE
    over ``head_dim/A`` channels per axis.

    Raises:
        ValueError: ``head_dim`` not divisible by ``2·A``.
    """
    axes = positions.shape[-1]
    if head_dim <= 0 or head_dim % (2 * axes):
        raise ValueError(
            f"rope_axial: head_dim={head_dim} must be divisible by 2·axes = {2 * axes} "
            f"for a {axes}-axis grid (each axis rotates head_dim/axes channels in pairs)"
        )
    inv = rope_inv_freq(head_dim // axes, base).to(positions.device)  # [h_d/(2A)]
    phase = positions.to(torch.float64).unsqueeze(-1) * inv  # [n, A, h_d/(2A)]
    return phase.flatten(-2)


@register(
    "rope_axial", hook="rotary", coords=("grid",), learnable=False, family="rotary",
    aliases=("rope_2d", "rope_nd", "axial_rope"),
    paper="Heo et al. 2024, Rotary Position Embedding for Vision Transformer (ECCV), eq. 9 "
          "(RoPE-Axial); Su et al. 2021 (RoFormer)",
)
class AxialRoPE(RotaryEncoding):
    """RoPE on each grid axis over its own share of the head dimension (RoPE-Axial).

    With ``A`` axes each axis owns ``h_d/A`` channels (``h_d/(2A)`` rotation pairs): in 2D the
    first half of the pairs rotates by the row coordinate ``p_y·θ_j``, the second half by the
    column ``p_x·θ_j``, ``θ_j = base^(−2j/(h_d/2))``. The score of two patches then depends on
    their positions only through the per-axis offsets. Positions are the grid's (cell index ×
    scale); prefix tokens sit at 0 and are not rotated (as timm leaves its prefix tokens).

    Equals timm's ``RotaryEmbeddingCat(dim=h_d, in_pixels=False, temperature=base)`` applied
    with ``apply_rot_embed_cat`` (``interleaved=True`` ↔ timm's default layout,
    ``interleaved=False`` ↔ ``rotate_half=True``).

    Args:
        head_dim: ``h_d``, divisible by ``2·A`` (4 for images, 6 for video).
        base: frequency base (timm's ``temperature``, 10000).
        interleaved: rotate channel pairs ``(2i, 2i+1)`` (timm's default) or ``(i, i + h_d/2)``.
        num_axes: if given, checks ``head_dim`` at construction; otherwise at forward.

    Shapes: ``forward(q [b, n_h, n, h_d], k [b, n_h, n, h_d], grid) -> (q, k)``.

    Raises:
        ValueError: ``head_dim`` not divisible by ``2·axes`` (naming both), bad q/k shapes.
    """

    def __init__(self, head_dim: int, base: float = 10000.0, interleaved: bool = False,
                 num_axes: int | None = None) -> None:
        super().__init__()
        if head_dim <= 0 or head_dim % 2:
            raise ValueError(f"rope_axial: head_dim must be a positive even int, got {head_dim}")
        if num_axes is not None and (num_axes < 1 or head_dim % (2 * num_axes)):
            raise ValueError(
                f"rope_axial: head_dim={head_dim} must be divisible by 2·axes = {2 * num_axes}"
            )
        if base <= 1:
            raise ValueError(f"rope_axial: base must be > 1, got {base}")
        self.head_dim, self.base, self.interleaved = head_dim, float(base), interleaved
        self.num_axes = num_axes
        self._cache: tuple[tuple, Tensor] | None = None

    def phase(self, coords: Coordinates) -> Tensor:
        """``[n, h_d/2]`` rotation angles of the tokens (float64, radians)."""
        grid = as_grid("rope_axial", coords)
        return axial_phase(grid.query_positions, self.head_dim, self.base)

    def cos_sin(self, coords: Coordinates) -> tuple[Tensor, Tensor]:
        """``cos``/``sin`` of :meth:`phase`, float32, cached per grid (shape, scale, prefix, device)."""
        grid = as_grid("rope_axial", coords)
        key = (grid.shape, grid.scale, grid.prefix_tokens, str(grid.device))
        if self._cache is None or self._cache[0] != key:
            phase = torch.remainder(self.phase(grid), 2 * math.pi)
            self._cache = (key, (phase.cos().float(), phase.sin().float()))
        return self._cache[1]

    def forward(self, q: Tensor, k: Tensor, coords: Coordinates) -> tuple[Tensor, Tensor]:
        self.check_coords(coords)
        check_qk("rope_axial", q, k, self.head_dim)
        cos, sin = self.cos_sin(coords)
        return (apply_rotary(q, cos, sin, self.interleaved),
                apply_rotary(k, cos, sin, self.interleaved))
