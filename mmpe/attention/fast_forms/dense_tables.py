"""Dense forms of terms that are a lookup into a table.

Dense forms of terms that are a lookup into a table: the whole `[b or 1, n_h, n_q, n_k]` bias
in one gather (timm's way for Swin/BEiT: the offset table indexed by a cached relative-position
index), or the encoding's own pair table (SPE, RRWP), instead of `score_mod` on every pair of
an index grid. Numbers of each class's `score_mod`."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mmpe.attention.fast_forms.by_class import register
from mmpe.encodings._grid import as_grid, check_ndim
from mmpe.encodings.base import AttentionCall
from mmpe.encodings.rrwp import RRWP
from mmpe.encodings.spe import SPE
from mmpe.encodings.swin import SwinRelativeBias, relative_position_index
from mmpe.encodings.swinv2_cpb import SwinV2CPB

#: The flat relative-position index (int64 `[n·n]`) per (grid shape, prefix tokens, device):
#: a function of those alone, so shared by every Swin / SwinV2 layer; a few entries, cleared
#: when full. Compiled graphs build the index in the graph instead (no side effects there).
_INDEX_CACHE: dict[tuple, Tensor] = {}
INDEX_CACHE_MAX = 8


def _flat_index(grid, device: torch.device) -> Tensor:
    key = (tuple(grid.shape), grid.prefix_tokens, device)
    if torch.compiler.is_compiling():
        return relative_position_index(grid.shape, grid.prefix_tokens).to(device).view(-1)
    index = _INDEX_CACHE.get(key)
    if index is None:
        if len(_INDEX_CACHE) >= INDEX_CACHE_MAX:
            _INDEX_CACHE.clear()
        # A normal tensor even under inference_mode: the cached index is later saved for
        # backward by a training forward, which an inference tensor cannot be.
        with torch.inference_mode(False):
            index = _INDEX_CACHE[key] = relative_position_index(
                grid.shape, grid.prefix_tokens).to(device).view(-1)
    return index


def offset_table_bias(grid, table: Tensor, prefix_entries: bool) -> Tensor:
    """The dense form of `offset_table_mod`.

    The dense form of [`offset_table_mod`][mmpe.encodings.swin.offset_table_mod]: the bias
    `[1, n_h, n, n]` (`table`'s dtype) of `table` `[Π (2 s_a − 1) (+3), n_h]`.

    One `index_select` of the head-major table (`[n_h, R]`, a few kB) with the flattened
    [`relative_position_index`][mmpe.encodings.swin.relative_position_index] writes the bias
    contiguous in `[n_h, n·n]` order, so adding it to `[b, n_h, n, n]` scores streams both
    operands (gathering `[n, n, n_h]` rows and permuting left a strided bias that made the
    addition ~2× slower).
    """
    index = _flat_index(grid, table.device)
    if grid.prefix_tokens and not prefix_entries:  # prefix pairs read a zero row
        r = math.prod([2 * s - 1 for s in grid.shape])
        table = torch.cat((table[:r], table.new_zeros(3, table.shape[1])), dim=0)
    n = math.prod(grid.shape) + grid.prefix_tokens
    return table.t().contiguous().index_select(1, index).view(1, table.shape[1], n, n)


def swin_dense(self: SwinRelativeBias, ctx: AttentionCall) -> Tensor:
    """`[1, n_h, n, n]` gathered from the offset table with a cached index."""
    grid = as_grid("swin", ctx.coords)
    check_ndim("swin", grid, len(self.grid_shape), f"grid_shape {self.grid_shape}")
    return offset_table_bias(grid, self.table_for(grid.shape), self.prefix_bias)


def cpb_dense(self: SwinV2CPB, ctx: AttentionCall) -> Tensor:
    """`[1, n_h, n, n]` gathered from the CPB MLP's table with a cached index."""
    grid = as_grid("swinv2_cpb", ctx.coords)
    check_ndim("swinv2_cpb", grid, len(self.grid_shape), f"grid_shape {self.grid_shape}")
    return offset_table_bias(grid, self.table_for(grid.shape), False)


def spe_dense(self: SPE, ctx: AttentionCall) -> Tensor:
    """`Z` on all pairs, `[b, n_h, n, n]`: the table its `score_mod` reads."""
    return self._bias(ctx.coords)


def rrwp_dense(self: RRWP, ctx: AttentionCall) -> Tensor:
    """The bias on all pairs, `[b, n_h, n, n]`: the table its `score_mod` reads."""
    return self.pair_bias(ctx.coords)


register(SwinRelativeBias, dense=swin_dense)
register(SwinV2CPB, dense=cpb_dense)
register(SPE, dense=spe_dense)
register(RRWP, dense=rrwp_dense)
