"""Axial nD rotary position embedding: the head dimension split across the grid's axes."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import GridLayout, Positioned
from mmpe.encodings._state import SavesSettings
from mmpe.encodings.base import RotaryEncoding, check_qk, newest_key_positions
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
    "rope_axial", hook="rotary", needs=(Positioned,), learnable=False, family="rotary",
    aliases=("rope_2d", "rope_nd", "axial_rope"),
    paper="Heo et al. 2024, Rotary Position Embedding for Vision Transformer (ECCV), eq. 9 "
          "(RoPE-Axial); Su et al. 2021 (RoFormer)", context=("head_dim", "num_axes"))
class AxialRoPE(SavesSettings, RotaryEncoding):
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

    saved_settings = ("base", "interleaved")  # num_axes is checked against the coordinates

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

    def phase(self, coords: Coordinates, keys: bool = False, n_keys: int | None = None) -> Tensor:
        """``[n, h_d/2]`` (or ``[b, n, h_d/2]``) rotation angles of the query (or the last
        ``n_keys`` key) tokens (float64, radians)."""
        pos = newest_key_positions(coords, n_keys) if keys else coords.query_positions
        if self.num_axes is not None and pos.shape[-1] != self.num_axes:
            raise ValueError(f"rope_axial: built for num_axes={self.num_axes}, the coordinates "
                             f"have {pos.shape[-1]} axes")
        return axial_phase(pos, self.head_dim, self.base)

    def _table(self, coords: Coordinates, keys: bool,
               n_keys: int | None = None) -> tuple[Tensor, Tensor]:
        phase = torch.remainder(self.phase(coords, keys, n_keys), 2 * math.pi)
        return phase.cos().float(), phase.sin().float()

    def cos_sin(self, coords: Coordinates, keys: bool = False,
                n_keys: int | None = None) -> tuple[Tensor, Tensor]:
        """``cos``/``sin`` of :meth:`phase`, float32; cached per grid (shape, scale, prefix, device)
        since a grid's positions follow from those, computed each call for other coordinates."""
        if not isinstance(coords, GridLayout) or torch.compiler.is_compiling():
            return self._table(coords, keys, n_keys)
        key = (coords.shape, getattr(coords, "scale", None), coords.prefix_tokens,
               str(coords.device))
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, self._table(coords, False))
        return self._cache[1]

    def forward(self, q: Tensor, k: Tensor, coords: Coordinates) -> tuple[Tensor, Tensor]:
        self.check_coords(coords)
        check_qk("rope_axial", q, k, self.head_dim, coords)
        qcos, qsin = self.cos_sin(coords)
        # A grid's keys are its queries; other coordinates may place keys elsewhere.
        kcos, ksin = (qcos, qsin) if isinstance(coords, GridLayout) else \
            self.cos_sin(coords, True, k.shape[-2])
        return (apply_rotary(q, qcos, qsin, self.interleaved),
                apply_rotary(k, kcos, ksin, self.interleaved))
