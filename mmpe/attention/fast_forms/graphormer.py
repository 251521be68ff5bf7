"""Graphormer's CPU forms.

Graphormer's CPU forms (Ying et al. 2021, eqs. 6–7): the spatial bias `b_φ` gathered head by
head by hop code, its gradient summed by bucket by hand tile by tile, and the dense forms of
the edge and combined biases from their pair tables. Numbers of each
class's `score_mod`."""

from __future__ import annotations

import torch
from torch import Tensor

from mmpe._scratch import block_empty
from mmpe.attention.fast_forms.by_class import get, register
from mmpe.attention.generic import pair_rows
from mmpe.attention.term_layouts import (
    SCATTER_LANES,
    BiasTiles,
    fold_lanes,
    key_tiles,
    lane_codes,
)
from mmpe.encodings.base import AttentionCall
from mmpe.encodings.graphormer import (
    GraphormerBias,
    GraphormerEdge,
    GraphormerSpatial,
    spatial_buckets,
)


def _gather(table: Tensor, buckets: Tensor) -> Tensor:
    """`table [buckets, n_h]` at `buckets [b, R, n]`, head-major `[b, n_h, R, n]` contiguous
    (`table[buckets].permute(0, 3, 1, 2)` has the same numbers channel-last, stride(-1) = n_h,
    which CUDA's fused SDPA kernels refuse as a mask)."""
    heads = torch.arange(table.shape[1], device=buckets.device).view(1, -1, 1, 1)
    return table.t()[heads, buckets[:, None]]


def rows(self: GraphormerSpatial, ctx: AttentionCall, start: int, stop: int) -> Tensor:
    """`table[bucket]` on the pairs of queries `start … stop−1`, `[b, n_h, stop−start, n]`:
    the buckets of those rows only (the default would bucket every pair per block); where
    no gradient is recorded, gathered head by head (one contiguous block, no copy)."""
    if torch.is_grad_enabled() and self.table.requires_grad:
        buckets = spatial_buckets(ctx.coords.spd[:, start:stop], self.max_distance)
        return _gather(self.table, buckets)
    return _gathered_rows(self, ctx, start, stop)


def _gathered_rows(self: GraphormerSpatial, ctx: AttentionCall, start: int,
                   stop: int) -> Tensor:
    """The rows without a graph, `[b, n_h, R, n]`: head by head, an `index_select` of the
    head's column of `b_φ` at the block's bucket codes into one scratch block."""
    buckets = _buckets(self, ctx, start, stop)
    with torch.no_grad():
        per_head = self.table.detach().t().contiguous()  # [n_h, buckets]
        rows = block_empty(self, "rows", (per_head.shape[0], *buckets.shape),
                           per_head.dtype, buckets.device)
        flat = buckets.reshape(-1)
        for head, values in enumerate(per_head):  # index_select: ~3× torch.take's speed
            torch.index_select(values, 0, flat, out=rows[head].view(-1))
    return rows.transpose(0, 1)


def tiles(self: GraphormerSpatial, ctx: AttentionCall, start: int, stop: int,
               width: int) -> BiasTiles:
    """The rows of queries `start … stop−1` tile by tile.

    The rows of queries `start … stop−1` tile by tile, for the tiles plan's
    backward pass (see `BiasTiles`): the block's bucket
    codes once (contiguous per tile), per head and tile a gather from the head's column of
    `b_φ` and a `scatter_add` of the tile's `dS` into the head's gradient."""
    return _SpatialTiles(self.table, _buckets(self, ctx, start, stop), width)


def _buckets(self: GraphormerSpatial, ctx: AttentionCall, start: int, stop: int) -> Tensor:
    """The bucket codes of queries `start … stop−1`, `[b, R, n]` (a scratch block: see
    `mmpe._scratch`)."""
    spd = ctx.coords.spd[:, start:stop]
    return spatial_buckets(spd, self.max_distance,
                           out=block_empty(self, "buckets", spd.shape, spd.dtype,
                                           spd.device))


class _SpatialTiles(BiasTiles):
    """Graphormer's spatial bias as `BiasTiles`: `table [buckets, n_h]` (with its graph), the
    block's bucket codes per tile `[b, R, K]` spread over lanes
    (`lane_codes`), and the gradient `[n_h, buckets·lanes]`."""

    def __init__(self, table: Tensor, buckets: Tensor, width: int) -> None:
        self.table = table
        self.dtype = table.dtype
        self.codes = [lane_codes(t) for t in key_tiles(buckets, width)]
        # [n_h, buckets·lanes]: each head's column of the table, every value SCATTER_LANES times
        self.values = table.detach().t().repeat_interleave(SCATTER_LANES, dim=1).contiguous()
        self.grad: Tensor | None = None

    def write(self, out: Tensor, i: int, head: int, j: int, add: bool) -> None:
        codes = self.codes[j][min(i, self.codes[j].shape[0] - 1)].view(-1)
        if add or out.dtype != self.values.dtype:
            term = torch.index_select(self.values[head], 0, codes).view_as(out)
            out.add_(term) if add else out.copy_(term)
        else:
            torch.index_select(self.values[head], 0, codes, out=out.view(-1))

    def take(self, d_s: Tensor, i: int, head: int, j: int) -> None:
        if self.grad is None:
            self.grad = torch.zeros(self.values.shape, dtype=d_s.dtype)
        codes = self.codes[j][min(i, self.codes[j].shape[0] - 1)].view(-1)
        self.grad[head].scatter_add_(0, codes, d_s.view(-1))

    def pullback(self) -> tuple[list[Tensor], list[Tensor]]:
        grad = torch.zeros_like(self.values) if self.grad is None else self.grad
        return [self.table], [fold_lanes(grad).t().to(self.table.dtype)]


def edge_dense(self: GraphormerEdge, ctx: AttentionCall) -> Tensor:
    """The edge bias `c_ij` on every pair, `[b, n_h, n, n]`: its pair table itself."""
    return self.pair_bias(ctx.coords)


def bias_dense(self: GraphormerBias, ctx: AttentionCall) -> Tensor:
    """Spatial plus edge bias, `[b, n_h, n, n]`: each part's fast dense or rows form.

    Each part's fast dense form, else its fast rows on every query, else its generic one."""
    out = None
    for part in (self.spatial, self.edge):
        if part is None:
            continue
        dense, rows_form = get(part, "dense"), get(part, "rows")
        n = ctx.coords.num_queries
        term = (dense(part, ctx) if dense is not None
                else rows_form(part, ctx, 0, n) if rows_form is not None
                else pair_rows(part, ctx, 0, n))
        out = term if out is None else out + term
    return out


register(GraphormerSpatial, rows=rows, tiles=tiles)
register(GraphormerEdge, dense=edge_dense)
register(GraphormerBias, dense=bias_dense)
