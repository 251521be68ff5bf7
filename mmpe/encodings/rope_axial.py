"""Axial nD rotary position embedding: the head dimension split across the grid's axes."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Positioned
from mmpe.coords.grid import Grid
from mmpe.encodings._positions import check_qk, newest_key_positions
from mmpe.encodings._state import SETTINGS_PREFIX, SavesSettings, decode_setting
from mmpe.encodings.base import RotaryEncoding
from mmpe.encodings.rope import (
    rope_inv_freq,
    rotate_qk,
    rotation_dtype,
    same_positions,
)
from mmpe.registry import register

GRID_INDEXINGS = ("ij", "xy")


def axial_phase(positions: Tensor, head_dim: int, base: float = 10000.0,
                grid_indexing: str = "ij") -> Tensor:
    """Rotation angle of every channel pair, `[n, head_dim/2]` float64 (radians).

    `positions` `[n, A]` (or `[b, n, A]`). Pair `j` of axis block `a` (`head_dim/(2A)`
    pairs each) turns by `p_a · θ_j` with `θ_j = base^(−2j/(head_dim/A))` — 1D RoPE over
    `head_dim/A` channels per axis. `grid_indexing="ij"` takes the blocks in the axes' order
    (rows first in 2D); `"xy"` swaps the first two axes (columns first: timm's
    `grid_indexing="xy"`, `torch.meshgrid(indexing="xy")`); with one axis both are the same.

    Raises:
        ValueError: `head_dim` not divisible by `2·A`, `grid_indexing` not `"ij"`/`"xy"`.
    """
    axes = positions.shape[-1]
    if head_dim <= 0 or head_dim % (2 * axes):
        raise ValueError(
            f"rope_axial: head_dim={head_dim} must be divisible by 2·axes = {2 * axes} "
            f"for a {axes}-axis grid (each axis rotates head_dim/axes channels in pairs)"
        )
    if grid_indexing not in GRID_INDEXINGS:
        raise ValueError(f"rope_axial: grid_indexing must be 'ij' or 'xy', got {grid_indexing!r}")
    if grid_indexing == "xy" and axes >= 2:  # the first two axes swapped: (x, y, …) = (w, h, …)
        positions = positions[..., [1, 0, *range(2, axes)]]
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

    With `A` axes each axis owns `h_d/A` channels (`h_d/(2A)` rotation pairs). Pair `j`
    of the `a`-th block rotates by `p_a·θ_j`, `θ_j = base^(−2j/(h_d/A))` (2D:
    `base^(−4j/h_d)`, `j < h_d/4`). Which coordinate the blocks take is `grid_indexing`:

    * `"ij"` (default): the grid's axes in order — in 2D the first `h_d/4` pairs rotate by
      the row `p_y·θ_j`, the next `h_d/4` by the column `p_x·θ_j` (video: t, h, w).
    * `"xy"`: the first two axes swapped, as `torch.meshgrid(indexing="xy")` and timm's
      `grid_indexing="xy"` — in 2D the first `h_d/4` pairs rotate by the column `p_x`,
      the next by the row `p_y` (video: w, h, t). This is RoPE-ViT's axis order (Heo et al.
      2024, eq. 9: the official `compute_axial_cis` puts `t_x = t mod W` first), that of
      timm's `vit_*_patch16_rope_*` and PE models (timm's DINOv3 port uses `"ij"`).

    The score of two patches depends on their positions only through the per-axis offsets.
    Positions are the grid's (cell index × scale); prefix tokens sit at 0 and are not rotated
    (as timm leaves its prefix tokens).

    Equals timm's `RotaryEmbeddingCat(dim=h_d, in_pixels=False, temperature=base,
    grid_indexing=grid_indexing, rotate_half=not interleaved)` (index grid, `grid_offset=0`,
    no `ref_feat_shape`) applied with `apply_rot_embed_cat(..., half=not interleaved)`:
    timm's bands `freq_bands(h_d/4, temperature, step=1) = temperature^(−j/(h_d/4))` are
    `θ_j` above, its `[x bands, y bands]` per-token layout is the block order
    (`tests/encodings/test_rope_axial_timm.py`). timm's RoPE-ViT (`vit_small_patch16_rope_224`) is
    `grid_indexing="xy", base=100, interleaved=True`.

    Args:
        head_dim: `h_d`, divisible by `2·A` (4 for images, 6 for video).
        base: frequency base (timm's `temperature`; 10000, RoPE-ViT uses 100).
        interleaved: rotate channel pairs `(2i, 2i+1)` (timm's default, RoPE-ViT's complex
            pairs) or `(i, i + h_d/2)` (default; timm's `rotate_half=True`).
        num_axes: if given, checks `head_dim` at construction; otherwise at forward.
        grid_indexing: `"ij"` (default, axes in order: rows first) or `"xy"` (the first two
            axes swapped: columns first, timm's RoPE-ViT); see above.

    Shapes: `forward(q [b, n_h, n, h_d], k [b, n_h, n, h_d], grid) -> (q, k)` in the inputs'
    dtype; bf16/fp16 are rotated in their own dtype with tables rounded once from float64
    phases ([`rotation_dtype`][mmpe.encodings.rope.rotation_dtype], error measured there).

    Checkpoints: `base` and `interleaved` are saved with the state_dict, and
    `grid_indexing` when it is `"xy"` (a state_dict without it is `"ij"`, so checkpoints
    saved before the option load unchanged); a mismatch is a load error naming both values.

    Raises:
        ValueError: `head_dim` not divisible by `2·axes` (naming both), `grid_indexing`
            not `"ij"`/`"xy"`, bad q/k shapes.
    """

    saved_settings = ("base", "interleaved")  # num_axes is checked against the coordinates

    def __init__(self, head_dim: int, base: float = 10000.0, interleaved: bool = False,
                 num_axes: int | None = None, grid_indexing: str = "ij") -> None:
        super().__init__()
        if head_dim <= 0 or head_dim % 2:
            raise ValueError(f"rope_axial: head_dim must be a positive even int, got {head_dim}")
        if num_axes is not None and (num_axes < 1 or head_dim % (2 * num_axes)):
            raise ValueError(
                f"rope_axial: head_dim={head_dim} must be divisible by 2·axes = {2 * num_axes}"
            )
        if base <= 1:
            raise ValueError(f"rope_axial: base must be > 1, got {base}")
        if not isinstance(grid_indexing, str) or grid_indexing not in GRID_INDEXINGS:
            raise ValueError(f"rope_axial: grid_indexing must be 'ij' (axes in order, rows first) "
                             f"or 'xy' (first two axes swapped, columns first), got "
                             f"{grid_indexing!r}")
        self.head_dim, self.base, self.interleaved = head_dim, float(base), interleaved
        self.num_axes = num_axes
        self.grid_indexing = grid_indexing
        # (grid, settings, dtype) -> (cos, sin, their versions): a few grids (e.g. train and
        # eval resolution).
        self._cache: dict[tuple, tuple[Tensor, Tensor, tuple[int, int]]] = {}

    def function_settings(self) -> dict[str, Any]:
        """`base`, `interleaved` and, when not the default `"ij"`, `grid_indexing`."""
        out = super().function_settings()
        if self.grid_indexing != "ij":  # absent = "ij": state_dicts from before the option load
            out["grid_indexing"] = self.grid_indexing
        return out

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict,  # type: ignore[override]
                              missing_keys, unexpected_keys, error_msgs):
        key = prefix + SETTINGS_PREFIX + "grid_indexing"
        saved = state_dict.get(key)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        if self.grid_indexing == "ij" and saved is not None:  # not one of ours: checked here
            unexpected_keys[:] = [k for k in unexpected_keys if k != key]
            value = decode_setting(saved)
            if value != "ij":
                error_msgs.append(
                    f"{key}: rope_axial was saved with grid_indexing={value!r} but this module "
                    f"was built with grid_indexing='ij'; the setting changes the encoding's "
                    f"output, so build the module with grid_indexing={value!r}")

    #: distinct grids/dtypes whose tables are kept; the cache is emptied when it is full.
    cache_size = 8

    def phase(self, coords: Coordinates, keys: bool = False, n_keys: int | None = None) -> Tensor:
        """Rotation angles of the query (or key) tokens.

        `[n, h_d/2]` (or `[b, n, h_d/2]`) rotation angles of the query (or the last
        `n_keys` key) tokens (float64, radians)."""
        pos = newest_key_positions(coords, n_keys) if keys else coords.query_positions
        if self.num_axes is not None and pos.shape[-1] != self.num_axes:
            raise ValueError(f"rope_axial: built for num_axes={self.num_axes} (build it with the "
                             "coordinates' num_axes), the coordinates "
                             f"have {pos.shape[-1]} axes")
        return axial_phase(pos, self.head_dim, self.base, self.grid_indexing)

    def _table(self, coords: Coordinates, keys: bool, n_keys: int | None,
               dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        phase = torch.remainder(self.phase(coords, keys, n_keys), 2 * math.pi)
        return phase.cos().to(dtype), phase.sin().to(dtype)

    def cos_sin(self, coords: Coordinates, keys: bool = False, n_keys: int | None = None,
                dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """`cos`/`sin` of `phase`.

        `cos`/`sin` of [`phase`][mmpe.encodings.rope_axial.AxialRoPE.phase] (float64 phases, rounded once to `dtype`), each
        `[n, h_d/2]` (`[b, n, h_d/2]` for batched positions).

        On an mmpe [`Grid`][mmpe.coords.grid.Grid] the query tables are cached per (shape, scale,
        prefix tokens, device, `head_dim`, `base`, `num_axes`, `grid_indexing`,
        `dtype`) — everything a grid's positions and the angles follow from — so a model
        reuses them across layers and forwards (the cached tensors are returned; one edited in
        place is rebuilt at the next call). Other coordinates (whose positions the key cannot vouch for: another
        `GridLayout` may place its cells anywhere), key tables and compiled graphs (no side
        effects there) compute them each call.
        """
        if keys or type(coords) is not Grid or torch.compiler.is_compiling():
            return self._table(coords, keys, n_keys, dtype)
        key = (coords.shape, coords.scale, coords.prefix_tokens, coords.device, self.head_dim,
               self.base, self.num_axes, self.grid_indexing, dtype)
        hit = self._cache.get(key)
        # The tables themselves are returned: one edited in place (its version moved) is rebuilt.
        if hit is not None and (hit[0]._version, hit[1]._version) == hit[2]:
            return hit[0], hit[1]
        cos, sin = self._table(coords, False, None, dtype)
        if cos.is_inference():  # no version counter to guard it with: not cached
            return cos, sin
        if len(self._cache) >= self.cache_size:
            self._cache.clear()
        self._cache[key] = (cos, sin, (cos._version, sin._version))
        return cos, sin

    def forward(self, q: Tensor, k: Tensor, coords: Coordinates) -> tuple[Tensor, Tensor]:
        self.check_coords(coords)
        check_qk("rope_axial", q, k, self.head_dim, coords)
        qcos, qsin = self.cos_sin(coords, dtype=rotation_dtype(q.dtype))
        # A grid's keys are its queries (the same tensor); other coordinates may place keys
        # elsewhere, and a cached step holds only the newest keys.
        if rotation_dtype(k.dtype) == qcos.dtype and same_positions(
                coords.query_positions, newest_key_positions(coords, k.shape[-2])):
            kcos, ksin = qcos, qsin
        else:
            kcos, ksin = self.cos_sin(coords, True, k.shape[-2], rotation_dtype(k.dtype))
        return rotate_qk(q, k, qcos, qsin, kcos, ksin, self.interleaved)
