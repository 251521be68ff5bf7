"""Dense forms of terms that are a lookup into a table: the whole `[b or 1, n_h, n_q, n_k]` bias
in one gather (timm's way for Swin/BEiT: the offset table indexed by a cached relative-position
index), or the encoding's own pair table (SPE, RRWP), instead of `score_mod` on every pair of
an index grid. Numbers of each class's `score_mod`."""

from __future__ import annotations

from torch import Tensor

from mmpe.attention.fast_forms.table import register
from mmpe.encodings._grid import as_grid, check_ndim
from mmpe.encodings.base import AttentionContext
from mmpe.encodings.rrwp import RRWP
from mmpe.encodings.spe import SPE
from mmpe.encodings.swin import SwinRelativeBias, offset_table_bias
from mmpe.encodings.swinv2_cpb import SwinV2CPB


def swin_dense(self: SwinRelativeBias, ctx: AttentionContext) -> Tensor:
    """`[1, n_h, n, n]` gathered from the offset table with a cached index."""
    self.check_context(ctx)
    grid = as_grid("swin", ctx.coords)
    check_ndim("swin", grid, len(self.grid_shape), f"grid_shape {self.grid_shape}")
    return offset_table_bias(grid, self.table_for(grid.shape), self.prefix_bias,
                             self._index_cache)


def cpb_dense(self: SwinV2CPB, ctx: AttentionContext) -> Tensor:
    """`[1, n_h, n, n]` gathered from the CPB MLP's table with a cached index."""
    self.check_context(ctx)
    grid = as_grid("swinv2_cpb", ctx.coords)
    check_ndim("swinv2_cpb", grid, len(self.grid_shape), f"grid_shape {self.grid_shape}")
    return offset_table_bias(grid, self.table_for(grid.shape), False, self._index_cache)


def spe_dense(self: SPE, ctx: AttentionContext) -> Tensor:
    """`Z` on all pairs, `[b, n_h, n, n]`: the table its `score_mod` reads."""
    self.check_context(ctx)
    return self._bias(ctx.coords)


def rrwp_dense(self: RRWP, ctx: AttentionContext) -> Tensor:
    """The bias on all pairs, `[b, n_h, n, n]`: the table its `score_mod` reads."""
    self.check_context(ctx)
    return self.pair_bias(ctx.coords)


register(SwinRelativeBias, dense=swin_dense)
register(SwinV2CPB, dense=cpb_dense)
register(SPE, dense=spe_dense)
register(RRWP, dense=rrwp_dense)
