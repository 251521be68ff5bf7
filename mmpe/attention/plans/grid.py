"""The relation plan on grids (CPU): a bias that depends only on the cell offset, block-Toeplitz.

On a [Grid][mmpe.coords.grid.Grid] of shape `(s_0, …, s_{A−1})` (`A ≥ 2`), a score term that
depends on a pair only through the per-axis offset of its two cells (ALiBi, T5, KERPLE and FIRE
on grid distance, Swin/BEiT tables, SwinV2's CPB: see `forms.offset_only_on_grids`) is
a table `U` over the `Π (2 s_a − 1)` offsets, plus one value per head for each kind of pair
with a prefix token (prefix→cell, cell→prefix, prefix→prefix). The table is read from the
encoding's own `score_mod` on one representative pair per offset, so it holds exactly the
numbers the other plans compute.

Layout: queries are taken in groups of `C` consecutive cells of a slab of the first axis (in
row-major order), for every value of the first axis. For one group
each head's table is expanded into `E [C, (2 s_0 − 1)·M]` (`M = Π_{a≥1} s_a`, the cells of one
slab of the first axis), in which the bias of queries with first index `c_0` over all cell keys
is the slice at offset `(s_0 − 1 − c_0)·M`: a view. Putting the `s_0` values of `c_0` in the
batch dimension makes the whole group's bias one strided view, which SDPA's fused CPU kernel
reads with no `n×n` tensor, in one call per group and head; the few prefix keys are merged in
by their log-sum-exp. `E` is `O(C × n)`.

The backward pass ([mmpe.attention.plans.grid_backward][]) recomputes each block's probabilities
from the saved log-sum-exp (as the relation plan does, [mmpe.attention.plans.relation][]): by SDPA's
fused backward where the bias is constant, else by hand, adding the gradient of the scores
into the slices of `dE` it read, which an `index_add` folds back onto the offset table; prefix
pairs reduce onto their three values per head. Nothing of `n × n` is kept.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from collections.abc import Sequence as Seq

import torch
from torch import Tensor

from mmpe.attention import forms
from mmpe.attention.forms import offset_table
from mmpe.attention.plans import grid_backward
from mmpe.attention.plans.flash import _attend_block
from mmpe.attention.plans.plan import run_plan
from mmpe.coords.grid import Grid
from mmpe.encodings.base import AttentionCall, ScoreEncoding
from mmpe.prepare import memoized

#: the grid plan is taken where the dense bias `[b, n_h, n, n]` would be at least this large
#: and no term has a trainable parameter (ALiBi): below it, one fused SDPA call with the dense
#: bias is faster (fwd+bwd of the layer, 6 heads, 32 × 32 + cls, 25 MB: ALiBi 1.11× the
#: unbiased layer dense, 1.21× on the grid plan).
GRID_MIN_BIAS_BYTES = 64 << 20

#: the same where a term has trainable parameters (T5, KERPLE, FIRE, Swin, SwinV2-CPB), whose
#: dense bias costs a computation per pair, for the bias of one batch entry. Measured on an AMD
#: EPYC (fwd+bwd, grid plan / dense plan, `force_plan`): d_model 768 and 12 heads, Swin at 24 × 24
#: + cls (16 MB) 1.06–1.16 at batch 1 and 2, 1.31× against 1.46× the unbiased layer at batch 8
#: (benchmarks/bench_layers.py), T5 0.93–1.12 at batch 8; at 32 × 32 + cls (50 MB, batch 8) Swin
#: 0.81–0.90. d_model 384 and 6 heads at 32 × 32 + cls (25 MB, batch 1): the grid plan 1.27–1.39×
#: the unbiased layer in time and 1.31–1.46× in memory, the dense plan 1.32–2.08× and 5.0–7.3×
#: (benchmarks/bench_attention.py --coords).
GRID_MIN_LEARNED_BIAS_BYTES = 20 << 20

#: most cells of a slab per group of queries (a row of a 64 × 64 grid; 4 rows of 16 × 16 × 16).
GRID_CHUNK = 64

#: bytes of one head's expanded table `E` for one group of queries (and of its gradient): the
#: chunk of cells is cut to fit (64 at 64 × 64 and 16 × 16 × 16, 19 at 128 × 128). Its
#: copies in the backward pass count against the plan's peak memory, kept within 10 % of the
#: unbiased layer's at 128 × 128 (which holds q, k, v, the output and their gradients).
GRID_TABLE_BYTES = 5 << 19

def applies(scores: Seq[ScoreEncoding], ctx: AttentionCall) -> bool:
    """Whether the grid plan can run the call.

    Whether the grid plan can run the call: CPU, float32/64, not compiling, self-attention on
    an unmasked [Grid][mmpe.coords.grid.Grid] of two axes or more, and every score term
    content-free, additive and a function of the cell offset
    ([offset_only_on_grids][mmpe.attention.forms.offset_only_on_grids])."""
    coords, q = ctx.coords, ctx.q
    return (len(scores) > 0 and q.device.type == "cpu"
            and q.dtype in (torch.float32, torch.float64)
            and not torch.compiler.is_compiling() and isinstance(coords, Grid)
            and coords.ndim >= 2 and coords.mask_mod() is None
            and coords.num_queries == coords.num_keys == coords.num_tokens
            and all(e.content_free and e.additive and forms.offset_only_on_grids(e)
                    for e in scores))


def pays(scores: Seq[ScoreEncoding], ctx: AttentionCall) -> bool:
    """Whether the grid plan beats the dense bias.

    Whether the grid plan beats the dense bias: the bias of one batch entry is
    `GRID_MIN_BIAS_BYTES` or more (`GRID_MIN_LEARNED_BIAS_BYTES` where a term has a trainable
    parameter). One entry's, since a content-free bias `[1, n_h, n, n]` is shared by the batch
    and the grid plan's work grows with the batch as the dense plan's does (ViT-B/16 at 224
    px, batch 8: 1.9 MB, the dense plan)."""
    coords = ctx.coords
    learned = any(p.requires_grad for e in scores for p in e.parameters())
    least = GRID_MIN_LEARNED_BIAS_BYTES if learned else GRID_MIN_BIAS_BYTES
    return ctx.num_heads * coords.num_queries * coords.num_keys * 4 >= least


def takes_grid_path(scores: Seq[ScoreEncoding], ctx: AttentionCall) -> bool:
    """Whether the call runs on the grid plan.

    Whether the call runs on the grid plan: it [applies][mmpe.attention.plans.grid.applies]
    and [pays][mmpe.attention.plans.grid.pays]."""
    return applies(scores, ctx) and pays(scores, ctx)


def attend(scores: Seq[ScoreEncoding], ctx: AttentionCall, scale: float) -> Tensor:
    """The call's output on the grid plan.

    The call's output `[b, n_h, n, h_d]` on this plan (where it
    [applies][mmpe.attention.plans.grid.applies])."""
    plan, table, prefix = GridPlan.build(scores, ctx, scale)
    return plan.run(ctx.q, ctx.k, ctx.v, table, prefix)


class GridPlan:
    """Softmax attention with an offset-only bias on a grid.

    Softmax attention with an offset-only bias on a grid: layout and forward pass (the
    backward pass is [mmpe.attention.plans.grid_backward][])."""

    def __init__(self, grid: Grid, scale: float, itemsize: int) -> None:
        self.grid, self.scale = grid, scale
        self.shape, self.prefix = grid.shape, grid.prefix_tokens
        self.slab = math.prod(self.shape[1:])  # M: cells per value of the first axis
        self.cells = grid.num_cells
        row = (2 * self.shape[0] - 1) * self.slab * itemsize  # one column of a head's E
        self.chunk = max(1, min(GRID_CHUNK, self.slab, GRID_TABLE_BYTES // row))

    @classmethod
    def build(cls, scores: Seq[ScoreEncoding], ctx: AttentionCall,
              scale: float) -> tuple[GridPlan, Tensor, Tensor]:
        """The plan, the offset table and the prefix values of a call.

        The plan, the offset table `U [n_h, 2 s_0 − 1, R']` (`R' = Π_{a≥1} (2 s_a − 1)`,
        indexed by `kv − q + s − 1`) and the prefix values `[n_h, 3]`, in q's dtype, for a call
        where [applies][mmpe.attention.plans.grid.applies]."""
        grid = ctx.coords
        total = None
        for enc in scores:
            key = ("grid_offset_table", id(enc), ctx.num_heads, grid.shape, grid.prefix_tokens)
            term = memoized(grid, key, lambda enc=enc: offset_table(enc, ctx))
            total = term if total is None else total + term
        total = total.to(ctx.q.dtype)
        body = total[:, :-3].reshape(ctx.num_heads, 2 * grid.shape[0] - 1, -1)
        plan = cls(grid, scale, ctx.q.element_size())
        return plan, body, total[:, -3:]

    def run(self, q: Tensor, k: Tensor, v: Tensor, table: Tensor, prefix: Tensor) -> Tensor:
        """Attention output `[b, n_h, n, h_d]`.

        Attention output `[b, n_h, n, h_d]`; the autograd inputs are the table and the
        prefix values."""
        return run_plan(self, q, k, v, table, prefix)

    # -- layout -------------------------------------------------------------------------------
    def groups(self) -> Iterator[tuple[Tensor, Tensor]]:
        """Per group of queries: the offset indices and the query tokens.

        Per group of queries: the index into the table's `R'` offsets of each (query cell of
        the chunk, cell of a slab) `[C', M]`, and the group's query tokens `[s_0, C']` (row
        `c_0`). A chunk is `C'` consecutive cells of a slab in row-major order (a grid row's
        columns, or several rows of a 3D grid's short last axis: the kernel's tiles of query
        rows stay full). Made one at a time (all of them at 128 × 128 take 32 MB)."""
        rest = self.shape[1:]  # the axes of a slab
        sizes = [2 * s - 1 for s in rest]
        table_strides = torch.tensor([math.prod(sizes[a + 1:]) for a in range(len(rest))])
        cells = torch.cartesian_prod(*(torch.arange(s) for s in rest)).reshape(-1, len(rest))
        first = torch.arange(self.shape[0])[:, None] * self.slab + self.prefix
        for j0 in range(0, self.slab, self.chunk):
            query = cells[j0:j0 + self.chunk]
            # kv − q + s − 1 per axis, flattened as the table: [C', M]
            index = ((cells[None] - query[:, None] + torch.tensor(rest) - 1)
                     * table_strides).sum(-1)
            tokens = first + torch.arange(j0, j0 + query.shape[0])[None]  # [s_0, C']
            yield index.to(self.grid.device), tokens.to(self.grid.device)

    def blocks(self, tokens: Tensor, rows: int) -> list[tuple[Tensor, int, int]]:
        """A group's queries in blocks of about `rows`.

        A group's queries in blocks of about `rows`: `(tokens [G·C'], base, G)` for `G`
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
        """The expansion `E` of one head's table for one group.

        `E [C', (2 s_0 − 1)·M]` of one head's table `[2 s_0 − 1, R']` and one group: row `j`
        holds, at `a_0·M + cell`, the table's value for query cell `j` and a key at first-axis
        offset `a_0` and `cell` (one gather, then one transposing copy: 7× faster than
        indexing both axes at once)."""
        offsets, (width, cells) = table.shape[0], index.shape
        gathered = table.index_select(1, index.reshape(-1)).view(offsets, width, cells)
        return gathered.transpose(0, 1).reshape(width, offsets * cells)

    def fold(self, d_table: Tensor, d_e: Tensor, index: Tensor) -> None:
        """Add one head's `dE` onto its offset table's gradient.

        Add one head's `dE` (the layout of [expand][mmpe.attention.plans.grid.GridPlan.expand])
        onto its offset table's gradient `[2 s_0 − 1, R']`."""
        offsets, (width, cells) = d_table.shape[0], index.shape
        d_e = d_e.view(width, offsets, cells).transpose(0, 1).reshape(offsets, -1)
        d_table.index_add_(1, index.reshape(-1), d_e)

    def rows_view(self, e_head: Tensor, base: int, count: int, keys: int) -> Tensor:
        """Bias of a block's queries on `keys` cell keys from `base`.

        Bias of a block's queries on `keys` cell keys from `base`, `[G, C', keys]`: a view of
        one head's `E` `[C', (2 s_0 − 1)·M]` (overlapping: the block-Toeplitz structure)."""
        return e_head.as_strided((count, e_head.shape[0], keys), (self.slab, e_head.stride(0), 1),
                                 e_head.storage_offset() + base)

    # -- forward ------------------------------------------------------------------------------
    def cell_block(self, x: Tensor, head: int, tokens: Tensor, count: int) -> Tensor:
        """One head's rows `tokens` of `x` laid out per block.

        One head's rows `tokens` (a block of [blocks][mmpe.attention.plans.grid.GridPlan.blocks])
        of `x [b, n_h, n, ·]` as `[G, b, C', ·]`: the block's first-axis indices in the batch
        dimension, the batch in the heads dimension (so one strided view is their bias)."""
        rows = x[:, head, tokens]
        return rows.view(x.shape[0], count, -1, *x.shape[3:]).transpose(0, 1)

    def cell_bias(self, e_head: Tensor, base: int, count: int, batch: int) -> Tensor:
        """The bias of a block on the cell keys, `[G, b, C', cells]`: a view of one head's `E`."""
        view = self.rows_view(e_head, base, count, self.cells)
        return view.unsqueeze(1).expand(count, batch, view.shape[1], self.cells)

    @torch.no_grad()
    def forward(self, q: Tensor, k: Tensor, v: Tensor, table: Tensor,
                prefix: Tensor) -> tuple[Tensor, Tensor]:
        """Output and each query's log-sum-exp.

        Output `[b, n_h, n, h_d]` and each query's log-sum-exp `[b, n_h, n]`: per group and
        head, one call of SDPA's fused CPU kernel for the group's cell queries against the cell
        keys (contiguous: the projections leave them strided by the other heads, which measured
        1.15× slower), the bias a strided view of `E` (no copy: `E` is read from the cache),
        merged with the few prefix keys by their log-sum-exp."""
        b, h, n, _ = q.shape
        # laid out [b, n, n_h, h_d] as SDPA's own output: the layer's merge of the heads is then a
        # view, not a second copy of the output (25 MB at 128 × 128)
        out = q.new_empty(b, n, h, v.shape[-1]).transpose(1, 2)
        lse = q.new_empty(b, h, n, dtype=torch.float32 if q.dtype != torch.float64 else q.dtype)
        p = self.prefix
        for head in range(h):
            kc, vc = k[:, head, p:].contiguous(), v[:, head, p:].contiguous()
            for index, tokens in self.groups():
                e = self.expand(table[head], index)
                block, base, count = self.blocks(tokens, tokens.numel())[0]
                qb = self.cell_block(q, head, block, count)
                o, m = _attend_block(qb, kc.expand(count, *kc.shape), vc.expand(count, *vc.shape),
                                     self.cell_bias(e, base, count, b), self.scale)
                if p:  # cell → prefix keys: column 1 of the prefix values
                    o, m = self.merge_prefix_keys(qb, k[:, head, :p], v[:, head, :p],
                                                  prefix[head, 1], o, m)
                out[:, head, block] = o.transpose(0, 1).flatten(1, 2)
                lse[:, head, block] = m.transpose(0, 1).flatten(1, 2)
        if p:
            bias = self.prefix_rows(prefix)[None]
            o, m = _attend_block(q[:, :, :p], k, v, bias, self.scale)
            out[:, :, :p], lse[:, :, :p] = o, m
        return out, lse

    def merge_prefix_keys(self, qb: Tensor, kp: Tensor, vp: Tensor, value: Tensor,
                          out: Tensor, lse: Tensor) -> tuple[Tensor, Tensor]:
        """Attention over the cell keys and the prefix keys together.

        Attention over the cell keys (`out`, `lse` of a block `[G, b, C', ·]`) and the prefix
        keys `kp, vp [b, P, h_d]` (bias `value`) together, from the two partial softmaxes."""
        scores = torch.matmul(qb, kp.transpose(-2, -1)).mul_(self.scale).add_(value)
        part = scores.logsumexp(-1).to(lse.dtype)
        total = torch.logaddexp(lse, part)
        total = torch.where(torch.isneginf(total), torch.zeros_like(total), total)
        weights = (scores - total[..., None].to(scores.dtype)).exp()
        out = out * (lse - total).exp()[..., None].to(out.dtype) + torch.matmul(weights, vp)
        return out, total

    def prefix_rows(self, prefix: Tensor) -> Tensor:
        """The bias of the prefix queries `[n_h, P, n]`: prefix→prefix, then prefix→cell."""
        h, p = prefix.shape[0], self.prefix
        return torch.cat((prefix[:, 2, None, None].expand(h, p, p),
                          prefix[:, 0, None, None].expand(h, p, self.cells)), dim=2)

    # -- backward -----------------------------------------------------------------------------
    def backward(self, q: Tensor, k: Tensor, v: Tensor, inputs: Seq[Tensor], out: Tensor,
                 lse: Tensor, d_out: Tensor, needs: Seq[bool]) -> tuple[Tensor | None, ...]:
        """Gradients with respect to `q, k, v`, the offset table and the prefix values.

        Gradients w.r.t. `q, k, v`, the offset table and the prefix values (`inputs`; None
        where `needs` is False), by [mmpe.attention.plans.grid_backward][]."""
        table, prefix = inputs
        return grid_backward.backward(self, q, k, v, table, prefix, out, lse, d_out, needs)
