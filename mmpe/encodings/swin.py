"""Swin / BEiT learned relative position bias table over grid offsets."""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmpe._optional import require
from mmpe.coords.capabilities import GridLayout
from mmpe.coords.grid import Grid
from mmpe.encodings._grid import as_grid, check_ndim, check_shape
from mmpe.encodings._state import SavesSettings
from mmpe.encodings._weights_cache import WeightsCache
from mmpe.encodings.base import AttentionCall, ScoreEncoding, ScoreMod
from mmpe.registry import register


def offset_index(grid, q_idx: Tensor, kv_idx: Tensor, prefix_entries: bool = True) -> Tensor:
    """Swin's relative position index of each pair.

    Swin's relative position index of each pair (int64, the broadcast of `q_idx` and
    `kv_idx`, token indices of `grid`, a `GridLayout`).

    `index(q, k) = Σ_a (c_{q,a} − c_{k,a} + s_a − 1) · Π_{b>a} (2 s_b − 1)` — the offset, shifted to
    be non-negative, flattened over the `R = Π (2 s_a − 1)` possible offsets. With prefix tokens
    and `prefix_entries` (BEiT) three more entries follow: prefix→cell `R`, cell→prefix `R+1`,
    prefix→prefix `R+2`; without, a pair with a prefix token gets the index of cell 0.
    """
    sizes = [2 * s - 1 for s in grid.shape]
    index = None
    for a, s in enumerate(grid.shape):
        term = (grid.cell_index(q_idx, a) - grid.cell_index(kv_idx, a) + (s - 1)) \
            * math.prod(sizes[a + 1:])
        index = term if index is None else index + term
    if grid.prefix_tokens and prefix_entries:
        r = math.prod(sizes)
        pq, pk = grid.is_prefix(q_idx), grid.is_prefix(kv_idx)
        index = torch.where(pq, torch.where(pk, r + 2, r), torch.where(pk, r + 1, index))
    return index


def relative_position_index(shape: tuple[int, ...], prefix_tokens: int = 0) -> Tensor:
    """Swin's relative position index of every pair of a grid.

    [`offset_index`][mmpe.encodings.swin.offset_index] of every pair of a grid of `shape`
    (row-major tokens after `prefix_tokens`), `[n, n]` int64. In 2D equals timm's
    `gen_relative_position_index`."""
    grid = Grid(tuple(shape), prefix_tokens=prefix_tokens)
    tokens = torch.arange(grid.num_tokens)
    return offset_index(grid, tokens[:, None], tokens[None, :])


def offset_table_mod(grid, table: Tensor, prefix_entries: bool) -> ScoreMod:
    """A `score_mod` that adds `table[index(q, k), h]`.

    `score + table[index(q, k), h]` with [`offset_index`][mmpe.encodings.swin.offset_index]
    computed per pair.

    `table` `[Π (2 s_a − 1) (+3), n_h]` for `grid.shape`. Pairs involving a prefix token
    read the three extra entries when `prefix_entries`, else get 0.
    """
    zero_prefix = grid.prefix_tokens > 0 and not prefix_entries

    def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        bias = table[offset_index(grid, q_idx, kv_idx, prefix_entries), h]
        if zero_prefix:
            return score + torch.where(grid.is_prefix(q_idx) | grid.is_prefix(kv_idx), 0.0, bias)
        return score + bias

    return mod


@register(
    "swin", hook="score", needs=(GridLayout,), learnable=True, family="bias",
    aliases=("swin_bias", "beit_bias", "relpos_table"),
    paper="Liu et al. 2021, Swin Transformer: Hierarchical Vision Transformer using Shifted Windows "
          "(ICCV), §3.2 eq. 4; Bao et al. 2022, BEiT (ICLR) §2.6 (prefix-token entries, table "
          "interpolation)", context=("num_heads", "grid_shape"))


class SwinRelativeBias(SavesSettings, ScoreEncoding):
    """A learned bias per head for every relative offset on the grid: `score + B̂[Δ, h]` (Swin eq. 4).

    The table `B̂` `[Π (2 s_a − 1) (+3), n_h]` holds one entry per possible per-axis offset
    `Δ = c_q − c_k` within the training grid `grid_shape` (a Swin window; here the whole
    grid), gathered by [`relative_position_index`][mmpe.encodings.swin.relative_position_index]. Prefix tokens: with `prefix_bias`
    (default) three learned entries per head — prefix→cell, cell→prefix, prefix→prefix (BEiT);
    otherwise their bias is 0.

    On a grid of another shape the table is interpolated to the new offset range: in 2D exactly
    as BEiT/timm (`timm.layers.resize_rel_pos_bias_table`: geometric-progression source
    coordinates, bilinear), in 1D/3D linear/trilinear with `align_corners=True`.

    Args:
        num_heads: `n_h`.
        grid_shape: the training grid (window) shape.
        prefix_bias: learn BEiT's three prefix entries.

    Raises:
        ValueError: bad `num_heads` / `grid_shape`; a grid whose number of axes differs.
    """

    saved_settings = ("grid_shape",)  # (2, 3) and (3, 2) have tables of one size
    #: a table over the cell offsets (and prefix kinds) of a grid
    structure = "offset"

    def __init__(self, num_heads: int, grid_shape: tuple[int, ...], prefix_bias: bool = True) -> None:
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"swin: num_heads must be >= 1, got {num_heads}")
        self.grid_shape = check_shape("swin", "grid_shape", grid_shape)
        self.num_heads, self.prefix_bias = num_heads, bool(prefix_bias)
        size = math.prod(2 * s - 1 for s in self.grid_shape) + (3 if prefix_bias else 0)
        self.table = nn.Parameter(nn.init.trunc_normal_(torch.empty(size, num_heads), std=0.02))
        self._cache = WeightsCache(size=1)

    @property
    def num_relative(self) -> int:
        """Offset entries of the training table (without prefix entries)."""
        return math.prod(2 * s - 1 for s in self.grid_shape)

    def table_for(self, shape: tuple[int, ...]) -> Tensor:
        """The table for a grid of `shape` (interpolated if it differs), `[Π (2s−1) (+3), n_h]`."""
        shape = tuple(shape)
        if shape == self.grid_shape:
            return self.table
        caching = not torch.is_grad_enabled() and not torch.compiler.is_compiling()
        hit = self._cache.get(shape, [self.table]) if caching else None
        if hit is not None:  # compared by value: an update through `.data` is seen
            return hit
        extra = self.table[self.num_relative:]
        body = self.table[: self.num_relative]
        new_sizes = tuple(2 * s - 1 for s in shape)
        if len(shape) == 2:
            require("timm", "swin: resizing a 2D relative-position table as BEiT/timm do")
            from timm.layers import resize_rel_pos_bias_table

            with warnings.catch_warnings():  # timm's interpolator warns about its own indexing
                warnings.simplefilter("ignore", UserWarning)
                body = resize_rel_pos_bias_table(
                    body, new_window_size=shape,
                    new_bias_shape=(math.prod(new_sizes), self.num_heads),
                    old_window_size=self.grid_shape)
        else:
            old_sizes = tuple(2 * s - 1 for s in self.grid_shape)
            vol = body.T.reshape(1, self.num_heads, *old_sizes)
            mode = "linear" if len(shape) == 1 else "trilinear"
            if len(shape) > 3:
                raise ValueError(f"swin: interpolating tables of more than 3 axes is not supported, "
                                 f"got a grid {shape}")
            vol = F.interpolate(vol.float(), size=new_sizes, mode=mode, align_corners=True)
            body = vol.reshape(self.num_heads, -1).T.to(self.table.dtype)
        table = torch.cat((body, extra), dim=0)
        if caching:
            self._cache.put(shape, [self.table], table)
        return table

    def score_mod(self, ctx: AttentionCall) -> ScoreMod:
        if not ctx.checked:  # a direct call: no layer checked it
            self.check_call(ctx)
        grid = as_grid("swin", ctx.coords)
        check_ndim("swin", grid, len(self.grid_shape), f"grid_shape {self.grid_shape}")
        return offset_table_mod(grid, self.table_for(grid.shape), self.prefix_bias)
