"""The grid plan's backward pass (CPU): gradients of attention with a block-Toeplitz bias.

Two cases, per call of [GridPlan][mmpe.attention.plans.grid.GridPlan]:

- **A constant bias** (ALiBi, or any table that takes no gradient: frozen parameters): SDPA's
  fused CPU backward per head and block of queries, each block's bias rows copied from the
  head's expanded table `E` into one buffer (up to `GRID_FUSED_KEYS_BYTES` of keys per head;
  beyond, the tiles below without the table's gradient, which hold less memory).
- **A learned bias** (T5, KERPLE, FIRE, Swin, SwinV2-CPB): per head and tile of `R` queries ×
  `K` keys, in cache, `P = exp(bias − lse + scale·q·kᵀ)`, `dS = P ⊙ (dO·Vᵀ − rowsum(dO ⊙ O))`,
  `dQ += dS·K·scale`, `dK += dSᵀ·Q·scale`, `dV += Pᵀ·dO`, and `dS` added into the slices of
  `dE` the tile's bias came from (folded onto the offset table per head and group of queries),
  or onto the prefix tokens' three values per head.

Both recompute each block's probabilities from the log-sum-exp the forward pass saved; nothing
of `n × n` is kept.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from typing import Protocol

import torch
from torch import Tensor

from mmpe.attention.plans.flash import _attend_block_backward


class GridTiling(Protocol):
    """What the backward pass reads of the grid plan.

    What the backward pass reads of the grid plan
    ([GridPlan][mmpe.attention.plans.grid.GridPlan], which imports this module): its sizes and
    the layout of the offset table's expansion `E`."""

    scale: float
    prefix: int  #: prefix tokens `P`
    cells: int  #: grid cells
    slab: int  #: cells per value of the first axis `M`

    def groups(self) -> Iterator[tuple[Tensor, Tensor]]: ...
    def blocks(self, tokens: Tensor, rows: int) -> list[tuple[Tensor, int, int]]: ...
    def expand(self, table: Tensor, index: Tensor) -> Tensor: ...
    def fold(self, d_table: Tensor, d_e: Tensor, index: Tensor) -> None: ...
    def rows_view(self, e_head: Tensor, base: int, count: int, keys: int) -> Tensor: ...
    def prefix_rows(self, prefix: Tensor) -> Tensor: ...

#: bytes of one head's block of bias rows in the backward pass of a constant bias (512 rows at
#: n = 4,096, 128 at 16,384: the fused backward with a contiguous bias measured 1.13–1.19× the
#: kernel with none for blocks of 256–1,024 rows, copy included; with the forward pass's
#: strided views, one batch entry per first-axis index, 1.3–1.5×).
GRID_FIXED_BIAS_BYTES = 8 << 20

#: most bytes of one head's keys (of one batch entry) for which a constant bias takes SDPA's
#: fused backward: each call returns key and value gradients of that size, and the kernel
#: holds buffers of it, which at 128 × 128 (4 MB) put the peak memory 12 % over the unbiased
#: layer's (the tiles by hand: 7 %); at 64 × 64 (1 MB) the fused backward is the faster.
GRID_FUSED_KEYS_BYTES = 2 << 20

#: queries per block of the backward pass of a learned bias (measured at 64 × 64: 512 rows
#: 1.26×, 256 rows 1.40× the fused backward of the unbiased layer; fewer calls per key).
GRID_BACKWARD_ROWS = 512

#: keys per tile of the backward pass of a learned bias: a head's `[512, 512]` probabilities
#: (1 MB) stay in the cache; 256 measured 1.32×, 1,024 1.36× against 512's 1.26×.
GRID_KEY_TILE = 512


@torch.no_grad()
def backward(plan: GridTiling, q: Tensor, k: Tensor, v: Tensor, table: Tensor, prefix: Tensor,
             out: Tensor, lse: Tensor, d_out: Tensor,
             needs: Seq[bool]) -> tuple[Tensor | None, ...]:
    """Gradients with respect to `q, k, v`, the offset table and the prefix values.

    Gradients w.r.t. `q, k, v`, the offset table `[n_h, 2 s_0 − 1, R']` and the prefix values
    `[n_h, 3]` (None where `needs` is False)."""
    need_q, need_k, need_v, need_table, need_prefix = needs
    d_out = d_out.to(out.dtype)
    constant = not (need_table or need_prefix)
    if constant and k[:, 0].numel() * k.element_size() <= GRID_FUSED_KEYS_BYTES:
        dq, dk, dv = fixed_backward(plan, q, k, v, table, prefix, out, lse, d_out)
        return (dq if need_q else None, dk if need_k else None, dv if need_v else None,
                None, None)
    acc = _TableBackward(plan, q, k, v, d_out, out, lse, needs, table, prefix)
    for head in range(q.shape[1]):
        acc.take_head(head)
        for index, tokens in plan.groups():
            e = plan.expand(table[head], index)
            d_e = None if constant else torch.zeros_like(e)
            acc.cell_rows(head, plan.blocks(tokens, GRID_BACKWARD_ROWS), e, d_e)
            if d_e is not None:
                plan.fold(acc.d_table[head], d_e, index)
        if plan.prefix:
            acc.prefix_rows(head)
    return (acc.dq if need_q else None, acc.dk if need_k else None,
            acc.dv if need_v else None, acc.d_table if need_table else None,
            acc.d_prefix if need_prefix else None)


def fixed_backward(plan: GridTiling, q: Tensor, k: Tensor, v: Tensor, table: Tensor,
                   prefix: Tensor, out: Tensor, lse: Tensor,
                   d_out: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients with respect to `q, k, v` where the bias takes none.

    Gradients w.r.t. `q, k, v` where the bias takes none: SDPA's fused backward per head and
    block of `GRID_FIXED_BIAS_BYTES` of bias rows, copied from `E` (cell keys) and the prefix
    values (prefix keys); then the head's prefix queries."""
    b, h, n, _ = q.shape
    p = plan.prefix
    dq, dk, dv = (torch.zeros_like(t) for t in (q, k, v))
    rows = max(1, GRID_FIXED_BIAS_BYTES // (n * q.element_size()))
    for head in range(h):
        # contiguous: the projections leave one head's keys strided by the other heads
        # contiguous: the projections leave one head's keys strided by the other heads, and
        # the kernel reads a copy faster (1.16× against 1.20× at 64 × 64)
        kh, vh = k[:, head:head + 1].contiguous(), v[:, head:head + 1].contiguous()
        for index, tokens in plan.groups():
            e = plan.expand(table[head], index)
            for block, base, count in plan.blocks(tokens, rows):
                bias = q.new_empty(1, 1, block.shape[0], n)
                bias[0, 0, :, :p] = prefix[head, 1]  # cell → prefix keys
                bias[0, 0, :, p:].unflatten(0, (count, -1)).copy_(
                    plan.rows_view(e, base, count, plan.cells))
                gq, gk, gv = _attend_block_backward(
                    d_out[:, head:head + 1, block], q[:, head:head + 1, block], kh, vh,
                    out[:, head:head + 1, block], lse[:, head:head + 1, block], bias, plan.scale)
                dq[:, head, block] = gq[:, 0]
                dk[:, head] += gk[:, 0]
                dv[:, head] += gv[:, 0]
        if p:  # the prefix queries, a head at a time (key gradients of one head's size)
            heads = slice(head, head + 1)
            gq, gk, gv = _attend_block_backward(
                d_out[:, heads, :p], q[:, heads, :p], kh, vh, out[:, heads, :p],
                lse[:, heads, :p], plan.prefix_rows(prefix)[None, heads], plan.scale)
            dq[:, head, :p] = gq[:, 0]
            dk[:, head] += gk[:, 0]
            dv[:, head] += gv[:, 0]
    return dq, dk, dv


class _TableBackward:
    """The backward pass of a learned bias for one call: the accumulators and the products of
    one head's tile of queries × keys."""

    def __init__(self, plan: GridTiling, q: Tensor, k: Tensor, v: Tensor, d_out: Tensor,
                 out: Tensor, lse: Tensor, needs: Seq[bool], table: Tensor,
                 prefix: Tensor) -> None:
        need_q, need_k, need_v, need_table, need_prefix = needs
        self.bias = need_table or need_prefix
        self.plan, self.q, self.k, self.v, self.d_out = plan, q, k, v, d_out
        self.lse = lse.to(q.dtype)
        self.neg_delta = -(d_out * out).sum(-1, dtype=lse.dtype).to(q.dtype)  # −rowsum(dO ⊙ O)
        self.prefix = prefix
        self.dq = torch.zeros_like(q) if need_q else None
        self.dk = torch.zeros_like(k) if need_k else None
        self.dv = torch.zeros_like(v) if need_v else None
        self.d_table = torch.zeros_like(table)
        self.d_prefix = torch.zeros_like(prefix)
        self.floor = math.log(torch.finfo(q.dtype).tiny) + 0.5
        self.kh = self.vh = k

    def take_head(self, head: int) -> None:
        """One head's keys and values `[b, n, h_d]` (strided by the other heads as the
        projections leave them: a contiguous copy measured no faster here)."""
        self.kh, self.vh = self.k[:, head], self.v[:, head]

    def cell_rows(self, head: int, blocks: list[tuple[Tensor, int, int]], e: Tensor,
                  d_e: Tensor | None) -> None:
        """One head's cell queries of one group, in blocks `(tokens, base, G)` of
        [blocks][mmpe.attention.plans.grid.GridPlan.blocks], against every key; `e`, `d_e` are the
        head's `E` and `dE` `[C', (2 s_0 − 1)·M]` (in cache across the blocks)."""
        plan, width = self.plan, e.shape[0]

        def bias(out: Tensor, c: int, ls: Tensor, base: int, count: int) -> None:
            view = plan.rows_view(e, base + c, count, out.shape[1])
            torch.sub(view, ls.view(count, width, 1), out=out.view(count, width, -1))

        def grad(ds: Tensor, c: int, base: int, count: int) -> None:
            # one slice per first-axis index: the block's view of E overlaps itself
            for g in range(count):
                start = base + g * plan.slab + c
                d_e[:, start:start + ds.shape[1]] += ds[g * width:(g + 1) * width]

        for i in range(self.q.shape[0]):
            for rows, base, count in blocks:
                # cell → prefix keys: column 1 of the prefix values
                self._head_rows(i, head, rows, 1 if plan.prefix else None,
                                functools.partial(bias, base=base, count=count),
                                functools.partial(grad, base=base, count=count)
                                if d_e is not None else None)

    def prefix_rows(self, head: int) -> None:
        """One head's prefix queries: prefix → prefix keys (column 2), prefix → cell keys
        (column 0)."""
        rows = torch.arange(self.plan.prefix, device=self.q.device)
        for i in range(self.q.shape[0]):
            self._head_rows(i, head, rows, 2,
                            functools.partial(self._fixed_bias, head=head, column=0),
                            functools.partial(self._fixed_grad, head=head, column=0)
                            if self.bias else None)

    def _fixed_bias(self, out: Tensor, c: int, ls: Tensor, head: int, column: int) -> None:
        """A tile whose pairs all have the prefix value `column`: its bias − lse."""
        out.copy_((self.prefix[head, column] - ls).expand_as(out))

    def _fixed_grad(self, ds: Tensor, c: int, head: int, column: int) -> None:
        self.d_prefix[head, column] += ds.sum()

    def _head_rows(self, i: int, head: int, rows: Tensor, prefix_column: int | None,
                   cell_bias, cell_grad) -> None:
        """One head's block of queries: a tile of the prefix keys (their bias is
        `prefix[head, prefix_column]`), then tiles of the cell keys (`cell_bias` writes a
        tile's bias − lse, `cell_grad` takes its `dS`)."""
        p, n = self.plan.prefix, self.k.shape[2]
        span = _span(rows)
        qr, dor = self.q[i, head, span], self.d_out[i, head, span]
        ls, nd = self.lse[i, head, span, None], self.neg_delta[i, head, span, None]
        dqr = torch.zeros_like(qr) if self.dq is not None else None
        if prefix_column is not None:
            self._tile(i, head, qr, dor, ls, nd, dqr, 0, p,
                       functools.partial(self._fixed_bias, head=head, column=prefix_column),
                       functools.partial(self._fixed_grad, head=head, column=prefix_column)
                       if self.bias else None)
        for c in range(0, n - p, GRID_KEY_TILE):
            width = min(n - p - c, GRID_KEY_TILE)
            self._tile(i, head, qr, dor, ls, nd, dqr, c, width, cell_bias, cell_grad, offset=p)
        if dqr is not None:
            self.dq[i, head, span] = dqr.mul_(self.plan.scale)

    def _tile(self, i: int, head: int, qr: Tensor, dor: Tensor, ls: Tensor, nd: Tensor,
              dqr: Tensor | None, c: int, width: int, write_bias, take_grad,
              offset: int = 0) -> None:
        """Keys `offset + c … offset + c + width − 1` of one head's block of queries."""
        keys = slice(offset + c, offset + c + width)
        kt, vt = self.kh[i, keys], self.vh[i, keys]
        scale = self.plan.scale
        probs = qr.new_empty(qr.shape[0], width)
        write_bias(probs, c, ls)
        probs.addmm_(qr, kt.t(), alpha=scale)
        # exp is ~30× slower where its result would be subnormal or zero (far pairs of a steep
        # bias): from tiny, P stays a normal number ≤ 2·10⁻³⁸ instead of 0.
        probs.clamp_(min=self.floor).exp_()
        if self.dv is not None:
            self.dv[i, head, keys].addmm_(probs.t(), dor)
        ds = torch.addmm(nd, dor, vt.t()).mul_(probs)
        if dqr is not None:
            dqr.addmm_(ds, kt)
        if self.dk is not None:
            self.dk[i, head, keys].addmm_(ds.t(), qr, alpha=scale)
        if take_grad is not None:
            take_grad(ds, c)


def _span(rows: Tensor) -> slice | Tensor:
    """`rows` as a slice where they are consecutive (views instead of gathers)."""
    start, count = int(rows[0]), rows.shape[0]
    return slice(start, start + count) if int(rows[-1]) - start == count - 1 else rows
