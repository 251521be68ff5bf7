"""The relation path on grids (CPU): a bias that depends only on the cell offset, block-Toeplitz.

On a [Grid][mmpe.coords.grid.Grid] of shape `(s_0, …, s_{A−1})` (`A ≥ 2`), a score term that
depends on a pair only through the per-axis offset of its two cells (ALiBi, T5, KERPLE and FIRE
on grid distance, Swin/BEiT tables, SwinV2's CPB: encodings that set `grid_offset_only`) is
a table `U` over the `Π (2 s_a − 1)` offsets, plus one value per head for each kind of pair
with a prefix token (prefix→cell, cell→prefix, prefix→prefix). The table is read from the
encoding's own `score_mod` on one representative pair per offset, so it holds exactly the
numbers the other paths compute.

Layout: queries are taken in groups that share every cell index but the first and a chunk of
`C` columns of the last (a grid row's chunk, for every value of the first axis). For one group
the table is expanded once into `E [n_h, C, (2 s_0 − 1)·M]` (`M = Π_{a≥1} s_a`, the cells of one
slab of the first axis), in which the bias of queries with first index `c_0` over all cell keys
is the slice at offset `(s_0 − 1 − c_0)·M`: a view. Putting the `s_0` values of `c_0` in the
batch dimension makes the whole group's bias one strided view, which SDPA's fused CPU kernel
reads with no `n×n` tensor, in one call. `E` is `O(C × n)`.

The backward pass recomputes each block's probabilities from the saved log-sum-exp (as the
sequence path does, [mmpe.attention.relation][]) and adds the gradient of the scores into the
slices of `dE` it read, which an `index_add` folds back onto the offset table; prefix pairs
reduce onto their three values per head. Nothing of `n × n` is kept.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence as Seq

import torch
from torch import Tensor

from mmpe.attention.flash import _attend_block
from mmpe.attention.memory import _bias_bytes
from mmpe.coords.grid import Grid
from mmpe.encodings.base import AttentionContext, ScoreEncoding
from mmpe.prepare import memoized

#: the grid path is taken where the dense bias `[b, n_h, n, n]` would be at least this large;
#: below it, one fused SDPA call with the dense bias is faster (measured at 32 × 32 + cls, 6
#: heads, 25 MB: 1.06–1.15× the unbiased layer dense, 1.65–1.9× on the grid path).
GRID_MIN_BIAS_BYTES = 64 << 20

#: most columns of the last axis per group of queries.
GRID_CHUNK = 64

#: bytes of one group's expanded table `E` (and of its gradient): the chunk of columns is cut to
#: fit (at 128 × 128 with 6 heads, 8 columns). A few MiB keeps the path's peak memory within a
#: few percent of the unbiased layer's (which holds q, k, v, the output and their gradients).
GRID_TABLE_BYTES = 8 << 20

#: bytes of one head's block of bias rows in the forward pass (512 rows at n = 4,096: SDPA's
#: CPU kernel tiles blocks of 192 rows or more in 64-row tiles, smaller ones in 32-row tiles).
GRID_FORWARD_BYTES = 8 << 20

#: queries per block of the backward pass.
GRID_BACKWARD_ROWS = 256

#: keys per tile of the backward pass: a head's `[256, 512]` probabilities (512 kB) stay in the
#: cache; measured 1.25× faster than whole rows of keys at n = 4,096.
GRID_KEY_TILE = 512


def takes_grid_path(scores: Seq[ScoreEncoding], ctx: AttentionContext) -> bool:
    """Whether the call runs on the grid path: CPU, float32/64, not compiling, self-attention
    on an unmasked [Grid][mmpe.coords.grid.Grid] of two axes or more whose dense bias would take
    `GRID_MIN_BIAS_BYTES` or more, and every score term content-free, additive and declared a
    function of the cell offset (`grid_offset_only`)."""
    coords, q = ctx.coords, ctx.q
    if torch.compiler.is_compiling():  # a traced model keeps its dense or flex path
        return False
    return (len(scores) > 0 and q.device.type == "cpu"
            and _bias_bytes(ctx, coords.num_queries) >= GRID_MIN_BIAS_BYTES
            and q.dtype in (torch.float32, torch.float64)
            and not torch.compiler.is_compiling() and isinstance(coords, Grid)
            and coords.ndim >= 2 and coords.mask_mod() is None
            and coords.num_queries == coords.num_keys == coords.num_tokens
            and all(e.content_free and e.additive and getattr(e, "grid_offset_only", False)
                    for e in scores))


def offset_pairs(grid: Grid) -> tuple[Tensor, Tensor]:
    """Token indices `(q_idx, kv_idx)` `[Π (2 s_a − 1) + 3]` of one pair per cell offset, in the
    order of the offset table (row-major over `kv − q + s_a − 1` per axis), then a
    prefix→cell, a cell→prefix and a prefix→prefix pair (token 0 stands in for a prefix token
    where the grid has none; those three entries are then unused)."""
    axes = [torch.arange(-(s - 1), s) for s in grid.shape]  # kv − q per axis
    delta = torch.cartesian_prod(*axes).reshape(-1, grid.ndim)
    strides = torch.tensor([math.prod(grid.shape[a + 1:]) for a in range(grid.ndim)])
    p = grid.prefix_tokens
    q_idx = p + ((-delta).clamp(min=0) * strides).sum(-1)
    kv_idx = p + (delta.clamp(min=0) * strides).sum(-1)
    cell = torch.tensor([p])
    first = torch.tensor([0])
    q_idx = torch.cat((q_idx, first, cell, first))
    kv_idx = torch.cat((kv_idx, cell, first, first))
    return q_idx.to(grid.device), kv_idx.to(grid.device)


def offset_table(enc: ScoreEncoding, ctx: AttentionContext) -> Tensor:
    """The encoding's term on every cell offset and prefix kind, `[n_h, Π (2 s_a − 1) + 3]`
    float32 (see [offset_pairs][mmpe.attention.grid.offset_pairs]), from its own `score_mod`:
    differentiable in its parameters."""
    grid = ctx.coords
    q_idx, kv_idx = offset_pairs(grid)
    b = torch.zeros(1, 1, dtype=torch.long, device=q_idx.device)
    pair_term = getattr(enc, "pair_term", None)
    if pair_term is not None:  # a term whose score_mod reads a table over every pair
        return pair_term(ctx, q_idx, kv_idx, b[0]).float().transpose(0, 1)
    h = torch.arange(ctx.num_heads, device=q_idx.device)[:, None]
    zero = torch.zeros((), device=q_idx.device)
    term = enc.score_mod(ctx)(zero, b, h, q_idx[None], kv_idx[None])
    return term.float().expand(ctx.num_heads, q_idx.shape[0])


class _GridPlan:
    """Softmax attention with an offset-only bias on a grid: layout and forward pass (the
    backward pass is [_Backward][mmpe.attention.grid._Backward])."""

    def __init__(self, grid: Grid, scale: float, heads: int, itemsize: int) -> None:
        self.grid, self.scale = grid, scale
        self.shape, self.prefix = grid.shape, grid.prefix_tokens
        self.slab = math.prod(self.shape[1:])  # M: cells per value of the first axis
        self.cells = grid.num_cells
        row = heads * (2 * self.shape[0] - 1) * self.slab * itemsize  # one column of E
        self.chunk = max(1, min(GRID_CHUNK, self.shape[-1], GRID_TABLE_BYTES // row))
        self.groups = self._groups()

    @classmethod
    def build(cls, scores: Seq[ScoreEncoding], ctx: AttentionContext,
              scale: float) -> tuple[_GridPlan, Tensor, Tensor] | None:
        """The plan, the offset table `U [n_h, 2 s_0 − 1, R']` (`R' = Π_{a≥1} (2 s_a − 1)`,
        indexed by `kv − q + s − 1`) and the prefix values `[n_h, 3]`, in q's dtype; or None
        where the grid path does not apply."""
        if not takes_grid_path(scores, ctx):
            return None
        grid = ctx.coords
        total = None
        for enc in scores:
            key = ("grid_offset_table", id(enc), ctx.num_heads, grid.shape, grid.prefix_tokens)
            term = memoized(grid, key, lambda enc=enc: offset_table(enc, ctx))
            total = term if total is None else total + term
        total = total.to(ctx.q.dtype)
        body = total[:, :-3].reshape(ctx.num_heads, 2 * grid.shape[0] - 1, -1)
        plan = cls(grid, scale, ctx.num_heads, ctx.q.element_size())
        return plan, body, total[:, -3:]

    def run(self, q: Tensor, k: Tensor, v: Tensor, table: Tensor, prefix: Tensor) -> Tensor:
        """Attention output `[b, n_h, n, h_d]`."""
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, table, prefix)):
            return _GridAttention.apply(self, q, k, v, table, prefix)
        return self.forward(q, k, v, table, prefix)[0]

    # -- layout -------------------------------------------------------------------------------
    def _groups(self) -> list[tuple[Tensor, Tensor]]:
        """Per group of queries: the index into the table's `R'` offsets of each (column of the
        chunk, cell of a slab) `[C', M]`, and the group's query tokens `[s_0, C']` (row `c_0`)."""
        rest = self.shape[1:]  # the axes of a slab
        sizes = [2 * s - 1 for s in rest]
        table_strides = torch.tensor([math.prod(sizes[a + 1:]) for a in range(len(rest))])
        cell_strides = torch.tensor([math.prod(rest[a + 1:]) for a in range(len(rest))])
        cells = torch.cartesian_prod(*(torch.arange(s) for s in rest)).reshape(-1, len(rest))
        # every index of the axes between the first and the last (one empty one in 2D)
        middles = [torch.tensor(m, dtype=torch.long)
                   for m in itertools.product(*(range(s) for s in rest[:-1]))]
        first = torch.arange(self.shape[0])[:, None] * self.slab + self.prefix
        out = []
        for mid in middles:
            for j0 in range(0, rest[-1], self.chunk):
                cols = torch.arange(j0, min(rest[-1], j0 + self.chunk))
                query = torch.cat((mid.expand(cols.shape[0], -1), cols[:, None]), dim=1)
                # kv − q + s − 1 per axis, flattened as the table: [C', M]
                index = ((cells[None] - query[:, None] + torch.tensor(rest) - 1)
                         * table_strides).sum(-1)
                tokens = first + (query * cell_strides).sum(-1)[None]  # [s_0, C']
                out.append((index.to(self.grid.device), tokens.to(self.grid.device)))
        return out

    def blocks(self, tokens: Tensor, rows: int) -> list[tuple[Tensor, int, int]]:
        """A group's queries in blocks of about `rows`: `(tokens [G·C'], base, G)` for `G`
        first-axis indices taken downwards from the top one, whose slice of `E` starts at `base`
        (block `g`'s at `base + g·M`, so one strided view reads the whole block's bias)."""
        s0, width = self.shape[0], tokens.shape[1]
        count = max(1, rows // width)
        out = []
        for top in range(s0 - 1, -1, -count):
            c0 = torch.arange(top, max(top - count, -1), -1, device=tokens.device)
            out.append((tokens[c0].reshape(-1), (s0 - 1 - top) * self.slab, c0.shape[0]))
        return out

    def expand(self, table: Tensor, index: Tensor) -> Tensor:
        """`E [n_h, C', (2 s_0 − 1)·M]` of one group: row `j` holds, at `a_0·M + cell`, the
        table's value for query column `j` and a key at first-axis offset `a_0` and `cell`
        (gathered one first-axis offset at a time: no transient copy of `E`)."""
        h, offsets, _ = table.shape
        e = table.new_empty(h, index.shape[0], offsets, self.slab)
        for a0 in range(offsets):
            e[:, :, a0] = table[:, a0, index]
        return e.view(h, index.shape[0], offsets * self.slab)

    def fold(self, d_table: Tensor, d_e: Tensor, index: Tensor) -> None:
        """Add a group's `dE` (the layout of [expand][mmpe.attention.grid._GridPlan.expand])
        onto the offset table's gradient."""
        h, offsets, _ = d_table.shape
        d_e = d_e.view(h, index.shape[0], offsets, self.slab)
        flat = index.reshape(-1)
        for a0 in range(offsets):
            d_table[:, a0].index_add_(1, flat, d_e[:, :, a0].reshape(h, -1))

    def rows_view(self, e_head: Tensor, base: int, count: int, keys: int) -> Tensor:
        """Bias of a block's queries on `keys` cell keys from `base`, `[G, C', keys]`: a view of
        one head's `E` `[C', (2 s_0 − 1)·M]` (overlapping: the block-Toeplitz structure)."""
        return e_head.as_strided((count, e_head.shape[0], keys), (self.slab, e_head.stride(0), 1),
                                 e_head.storage_offset() + base)

    # -- forward ------------------------------------------------------------------------------
    @torch.no_grad()
    def forward(self, q: Tensor, k: Tensor, v: Tensor, table: Tensor,
                prefix: Tensor) -> tuple[Tensor, Tensor]:
        """Output `[b, n_h, n, h_d]` and each query's log-sum-exp `[b, n_h, n]`: per group and
        head, blocks of queries against every key by SDPA's fused CPU kernel, each block's bias
        copied from `E` into one buffer (the kernel tiles large blocks faster than a view could
        be read by many small calls)."""
        b, h, n, _ = q.shape
        out = q.new_empty(b, h, n, v.shape[-1])
        lse = q.new_empty(b, h, n, dtype=torch.float32 if q.dtype != torch.float64 else q.dtype)
        p = self.prefix
        rows = max(1, GRID_FORWARD_BYTES // (n * q.element_size()))
        for index, tokens in self.groups:
            e = self.expand(table, index)
            for block, base, count in self.blocks(tokens, rows):
                bias = q.new_empty(1, 1, block.shape[0], n)
                for head in range(h):
                    if p:  # cell → prefix: column 1 of the prefix values
                        bias[0, 0, :, :p] = prefix[head, 1]
                    cells = bias[0, 0, :, p:].unflatten(0, (count, -1))
                    cells.copy_(self.rows_view(e[head], base, count, self.cells))
                    o, m = _attend_block(q[:, head:head + 1, block], k[:, head:head + 1],
                                         v[:, head:head + 1], bias, self.scale)
                    out[:, head, block], lse[:, head, block] = o[:, 0], m[:, 0]
        if p:
            bias = self.prefix_rows(prefix)[None]
            o, m = _attend_block(q[:, :, :p], k, v, bias, self.scale)
            out[:, :, :p], lse[:, :, :p] = o, m
        return out, lse

    def prefix_rows(self, prefix: Tensor) -> Tensor:
        """The bias of the prefix queries `[n_h, P, n]`: prefix→prefix, then prefix→cell."""
        h, p = prefix.shape[0], self.prefix
        return torch.cat((prefix[:, 2, None, None].expand(h, p, p),
                          prefix[:, 0, None, None].expand(h, p, self.cells)), dim=2)

    # -- backward -----------------------------------------------------------------------------
    @torch.no_grad()
    def backward(self, q: Tensor, k: Tensor, v: Tensor, table: Tensor, prefix: Tensor,
                 out: Tensor, lse: Tensor, d_out: Tensor,
                 needs: Seq[bool]) -> tuple[Tensor | None, ...]:
        """Gradients w.r.t. `q, k, v`, the offset table and the prefix values (None where
        `needs` is False). Per head and tile of `R` queries × `K` keys (in cache): `P =
        exp(bias − lse + scale·q·kᵀ)`, `dS = P ⊙ (dO·Vᵀ − rowsum(dO ⊙ O))`, `dQ += dS·K·scale`,
        `dK += dSᵀ·Q·scale`, `dV += Pᵀ·dO`, and `dS` added into the slices of `dE` (or the
        prefix values) the tile's bias came from."""
        need_q, need_k, need_v, need_table, need_prefix = needs
        acc = _Backward(self, q, k, v, d_out.to(out.dtype), out, lse, needs, table, prefix)
        for index, tokens in self.groups:
            e = self.expand(table, index)
            d_e = torch.zeros_like(e) if acc.bias else None
            acc.cell_rows(self.blocks(tokens, GRID_BACKWARD_ROWS), e, d_e)
            if d_e is not None:
                self.fold(acc.d_table, d_e, index)
        if self.prefix:
            acc.prefix_rows()
        return (acc.dq if need_q else None, acc.dk if need_k else None,
                acc.dv if need_v else None, acc.d_table if need_table else None,
                acc.d_prefix if need_prefix else None)


class _Backward:
    """The grid path's backward pass for one call: the accumulators and the products of one
    head's tile of queries × keys."""

    def __init__(self, plan: _GridPlan, q: Tensor, k: Tensor, v: Tensor, d_out: Tensor,
                 out: Tensor, lse: Tensor, needs: Seq[bool], table: Tensor,
                 prefix: Tensor) -> None:
        need_q, need_k, need_v, need_table, need_prefix = needs
        self.plan, self.q, self.k, self.v, self.d_out = plan, q, k, v, d_out
        self.lse = lse.to(q.dtype)
        self.neg_delta = -(d_out * out).sum(-1, dtype=lse.dtype).to(q.dtype)  # −rowsum(dO ⊙ O)
        self.prefix = prefix
        self.bias = need_table or need_prefix
        zeros = functools.partial(torch.zeros_like, memory_format=torch.contiguous_format)
        self.dq = zeros(q) if need_q else None
        self.dk = zeros(k) if need_k else None
        self.dv = zeros(v) if need_v else None
        self.d_table = torch.zeros_like(table) if self.bias else None
        self.d_prefix = torch.zeros_like(prefix) if self.bias else None
        self.floor = math.log(torch.finfo(q.dtype).tiny) + 0.5

    def cell_rows(self, blocks: list[tuple[Tensor, int, int]], e: Tensor,
                  d_e: Tensor | None) -> None:
        """The cell queries of one group, in blocks `(tokens, base, G)` of
        [blocks][mmpe.attention.grid._GridPlan.blocks], against every key. Head by head: one
        head's slices of `E`, `dE`, `K` and `V` stay in the cache across the blocks."""
        plan, width = self.plan, e.shape[1]

        def bias(out: Tensor, head: int, c: int, ls: Tensor, base: int, count: int) -> None:
            view = plan.rows_view(e[head], base + c, count, out.shape[1])
            torch.sub(view, ls.view(count, width, 1), out=out.view(count, width, -1))

        def grad(ds: Tensor, head: int, c: int, base: int, count: int) -> None:
            # one slice per first-axis index: the block's view of E overlaps itself
            for g in range(count):
                start = base + g * plan.slab + c
                d_e[head, :, start:start + ds.shape[1]] += ds[g * width:(g + 1) * width]

        for i in range(self.q.shape[0]):
            for head in range(self.q.shape[1]):
                for rows, base, count in blocks:
                    # cell → prefix keys: column 1 of the prefix values
                    self._head_rows(i, head, rows, 1 if plan.prefix else None,
                                    functools.partial(bias, base=base, count=count),
                                    functools.partial(grad, base=base, count=count)
                                    if d_e is not None else None)

    def prefix_rows(self) -> None:
        """The prefix queries: prefix → prefix keys (column 2), prefix → cell keys (column 0)."""
        rows = torch.arange(self.plan.prefix, device=self.q.device)
        bias = functools.partial(self._fixed_bias, column=0)
        grad = functools.partial(self._fixed_grad, column=0) if self.bias else None
        for i in range(self.q.shape[0]):
            for head in range(self.q.shape[1]):
                self._head_rows(i, head, rows, 2, bias, grad)

    def _fixed_bias(self, out: Tensor, head: int, c: int, ls: Tensor, column: int) -> None:
        """A tile whose pairs all have the prefix value `column`: its bias − lse."""
        out.copy_((self.prefix[head, column] - ls).expand_as(out))

    def _fixed_grad(self, ds: Tensor, head: int, c: int, column: int) -> None:
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
            grad = (functools.partial(self._fixed_grad, column=prefix_column)
                    if self.bias else None)
            self._tile(i, head, qr, dor, ls, nd, dqr, 0, p,
                       functools.partial(self._fixed_bias, column=prefix_column), grad)
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
        kt, vt = self.k[i, head, keys], self.v[i, head, keys]
        scale = self.plan.scale
        probs = qr.new_empty(qr.shape[0], width)
        write_bias(probs, head, c, ls)
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
            take_grad(ds, head, c)


def _span(rows: Tensor) -> slice | Tensor:
    """`rows` as a slice where they are consecutive (views instead of gathers)."""
    start, count = int(rows[0]), rows.shape[0]
    return slice(start, start + count) if int(rows[-1]) - start == count - 1 else rows


class _GridAttention(torch.autograd.Function):
    """Autograd of [_GridPlan][mmpe.attention.grid._GridPlan]: saves `q, k, v`, the output
    and the log-sum-exp (`O(n)`), not the scores. Not itself differentiable (no double
    backward: use `backend="math"` for gradient penalties through attention)."""

    @staticmethod
    def forward(fctx, plan: _GridPlan, q: Tensor, k: Tensor, v: Tensor, table: Tensor,
                prefix: Tensor) -> Tensor:
        out, lse = plan.forward(q, k, v, table, prefix)
        fctx.plan = plan
        fctx.save_for_backward(q, k, v, table, prefix, out, lse)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(fctx, d_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, table, prefix, out, lse = fctx.saved_tensors
        grads = fctx.plan.backward(q, k, v, table, prefix, out, lse, d_out,
                                   fctx.needs_input_grad[1:])
        return (None, *grads)
