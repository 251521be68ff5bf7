"""The tiles plan (CPU): content-free additive score terms on any coordinates.

Where the relation plan (Toeplitz sequences, [mmpe.attention.plans.relation][]) and the grid plan
([mmpe.attention.plans.grid][]) do not apply — points, graphs, sequences with explicit or padded
positions — and the dense bias `[b, n_h, n_q, n_k]` would exceed
[block_bytes][mmpe.attention.memory.block_bytes], attention runs here, block by block of query
rows. Forward, per block: the block's bias rows (the sum of each encoding's
[rows][mmpe.attention.forms.rows], with no autograd graph, masked pairs
at `−inf`), then all heads by SDPA's fused CPU kernel, which also returns each row's
log-sum-exp. Saved for the backward pass: `q, k, v`, the output and the log-sum-exp (`O(n)`
per head), never the bias.

Backward, per block, the bias rows are computed again, and:

* when nothing the bias depends on needs a gradient (fixed ALiBi slopes, positions without
  `requires_grad`), the fused kernel's own backward pass gives `dq, dk, dv`;
* otherwise the block's probabilities come back from the saved log-sum-exp, `P = exp(q·kᵀ·s +
  bias − lse)`, `dS = P ⊙ (dO·Vᵀ − rowsum(dO ⊙ O))`, and `dq, dk, dv` from matrix products
  (tile by tile of keys, the heads of a tile in turn, in the cache). An encoding with
  fast `tiles`
  (KERPLE-log, FIRE, Graphormer's spatial bias; [BiasTiles][mmpe.attention.term_layouts.BiasTiles])
  writes its bias into each tile and reduces the tile's `dS` at once onto a few small tensors
  (`r1, r2`; FIRE's pieces and input rows; the bucket table) that autograd carries on: no
  `[b, n_h, R, n_k]` bias or `dS` of the block, no per-pair, per-head graph. For the other
  terms the block's rows are made and `dS` is written into the block's gradient of the bias,
  pulled back by `torch.autograd.grad(rows, inputs, dS)` on that block's rows only (the
  encodings' own differentiable code)
  (`TilesPlan.pullback_bias`).

Which tensors the bias depends on is read from the autograd graph of one probe row (see
[bias_inputs][mmpe.attention.plans.tiles.bias_inputs]): the leaves it reaches (parameters,
positions that require a gradient) and, where a coordinate object holds a tensor computed from
such a leaf (`Points` keeps each axis of its positions), that tensor; they are inputs of the
autograd function, so the gradients reach them by the ordinary route.

Peak memory is `O(block × n_k)`: no tensor of `n_q × n_k` elements is made or kept.
Content-dependent terms, bf16/fp16 and compiled code keep the checkpointed plan of
[mmpe.attention.dispatch][].
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq

import torch
from torch import Tensor

from mmpe._scratch import reuse_blocks
from mmpe.attention import forms
from mmpe.attention.masks import cast_bias
from mmpe.attention.memory import bias_row_bytes, block_bytes
from mmpe.attention.plans.flash import _attend_block, _attend_block_backward
from mmpe.attention.plans.plan import run_plan
from mmpe.attention.term_layouts import BiasTiles
from mmpe.coords.base import Coordinates
from mmpe.coords.grid import Grid
from mmpe.encodings.base import AttentionCall, ScoreEncoding

#: queries per block of the forward pass and of the fused backward pass (capped by
#: `MMPE_ATTN_BLOCK_BYTES`): SDPA's CPU kernel tiles blocks of 192 rows or more in 64-row tiles.
TILES_FORWARD_ROWS = 256

#: queries per block where the backward pass computes `dS` itself (a learned bias, positions
#: with gradients) and some term has no fast `tiles`: the block's bias and `dS` are `[b, n_h,
#: R, n_k]` each.
TILES_BACKWARD_ROWS = 256

#: queries per block of that backward pass where every term has fast `tiles` (nothing of the block's `[b, n_h, R, n_k]` is made): at 4,096 points with
#: KERPLE-log, 512 rows 1.42× the unbiased layer, 256 rows 1.49×, 1,024 rows 1.41×.
TILES_TILED_ROWS = 512

#: keys per tile of that backward pass: one head's `[512, 256]` probabilities (512 kB) stay in
#: the cache across the tile's five products and the terms' passes (at 4,096 points with
#: KERPLE-log, 512 rows: 256 keys 1.42×, 512 keys 1.47×, 128 keys 1.49×).
TILES_KEY_TILE = 256


#: below the block budget, the query–key pairs per batch entry and head from which a layer
#: that trains its terms still runs here where every term has fast `tiles` (KERPLE-log, FIRE,
#: Graphormer's spatial bias; see `prefers_tiles`). Fwd+bwd of `MultiHeadAttention(384, 6)`,
#: one thread, Xeon, ratio to the unbiased layer, here / dense (median of 15–25 rounds, the
#: order alternated): KERPLE-log at 256 points 1.74 / 1.45, at 384 1.55 / 2.01, at 512
#: 1.66 / 1.95, at 1,024 1.91 / 2.81; FIRE 2.00 / 1.65, 1.96 / 2.42, 2.06 / 2.51, 2.18 / 3.28;
#: Graphormer on a 512-node graph 1.68 / 1.65, 1,024 nodes 1.84 / 2.41. The dense bias's
#: graph also holds 6–7× the unbiased layer's memory at 1,024 points; here about 1×.
TILES_MIN_TILED_PAIRS = 384 * 384

#: a term's pullback in that backward pass: the block's `dS [b, n_h, R, n_k]` → tensors and
#: their cotangents (see `TilesPlan.pullback_bias`)
Pullback = Callable[[Tensor], tuple[Seq[Tensor], Seq[Tensor]]]


def applies(scores: Seq[ScoreEncoding], ctx: AttentionCall) -> bool:
    """Whether a call whose dense bias is too large runs on the tiles plan.

    Whether a call whose dense bias is too large runs here: CPU, float32/64, not compiling,
    and at least one score term, every one content-free and additive."""
    q = ctx.q
    return (len(scores) > 0 and q is not None and q.device.type == "cpu"
            and q.dtype in (torch.float32, torch.float64)
            and not torch.compiler.is_compiling()
            and all(e.content_free and e.additive for e in scores))


def prefers_tiles(scores: Seq[ScoreEncoding], ctx: AttentionCall) -> bool:
    """Whether a call whose dense bias fits the budget runs on the tiles plan.

    Whether a call whose dense bias fits the block budget runs here all the same: in grad
    mode, on this plan's terms (`applies`), every one with fast `tiles` and one
    with a parameter that takes a gradient, no coordinate tensor that takes one (a force
    field's positions: the dense plan keeps the double backward that the tiles plan does
    not have), not on a [Grid][mmpe.coords.grid.Grid] (whose offset-only terms have the grid
    plan and its own thresholds), and at least `TILES_MIN_TILED_PAIRS` query–key pairs per
    entry and head."""
    coords = ctx.coords
    return (torch.is_grad_enabled() and not isinstance(coords, Grid)
            and applies(scores, ctx)
            and coords.num_queries * coords.num_keys >= TILES_MIN_TILED_PAIRS
            and all(forms.offers(e, "tiles") for e in scores)
            and any(p.requires_grad for e in scores for p in e.parameters())
            and not any(t.requires_grad for t in _coordinate_tensors(coords)))


def pays(scores: Seq[ScoreEncoding], ctx: AttentionCall) -> bool:
    """Whether the call's terms are better taken block by block.

    Whether the call's terms are better taken block by block than as one dense bias: the
    bias of every query exceeds the block budget (`mmpe.attention.memory.block_bytes`), or the
    terms [prefer tiles][mmpe.attention.plans.tiles.prefers_tiles]. Where this plan does not
    [apply][mmpe.attention.plans.tiles.applies], the dispatch takes checkpointed blocks of rows
    instead."""
    return len(scores) > 0 and (bias_row_bytes(ctx, ctx.coords.num_queries) > block_bytes()
                                or prefers_tiles(scores, ctx))


def attend(scores: Seq[ScoreEncoding], ctx: AttentionCall, scale: float) -> Tensor:
    """The call's output on the tiles plan.

    The call's output `[b, n_h, n_q, h_d]` on this plan (where it
    [applies][mmpe.attention.plans.tiles.applies])."""
    return TilesPlan(scores, ctx, scale).run(ctx.q, ctx.k, ctx.v)


class TilesPlan:
    """Softmax attention with content-free additive score terms, block by block of queries:
    the forward pass, and the backward pass of
    [PlanAttention][mmpe.attention.plans.plan.PlanAttention].

    Holds the encodings and a copy of the call without `x, q, k, v` (a content-free
    term does not read them; the autograd function saves q, k, v itself, so that
    `saved_tensors_hooks` see them)."""

    def __init__(self, scores: Seq[ScoreEncoding], ctx: AttentionCall, scale: float) -> None:
        self.scores, self.scale = list(scores), scale
        self.ctx = dataclasses.replace(ctx, x=None, q=None, k=None, v=None)
        coords = ctx.coords
        self.n_q, self.n_k = coords.num_queries, coords.num_keys
        itemsize = max(4, ctx.q.element_size())
        per_row = max(1, bias_row_bytes(ctx, 1) * itemsize // 4)
        cap = max(1, block_bytes() // per_row)
        self.forward_rows = min(TILES_FORWARD_ROWS, cap)
        # a learned distance kernel's per-pair features are `feature_width / n_h` times the
        # bias, and autograd keeps them for a block: bound the block by them as well
        width = max([ctx.num_heads, *(getattr(e, "feature_width", 1) for e in self.scores)])
        per_feature_row = ctx.q.shape[0] * self.n_k * width * 4
        self.backward_rows = min(TILES_BACKWARD_ROWS, cap,
                                 max(1, block_bytes() // max(1, per_feature_row)))
        self.tiled_rows = min(TILES_TILED_ROWS, cap)

    @classmethod
    def build(cls, scores: Seq[ScoreEncoding], ctx: AttentionCall,
              scale: float) -> TilesPlan | None:
        """The plan, or None where this plan does not apply.

        The plan, or None where this plan does not apply (see
        [applies][mmpe.attention.plans.tiles.applies])."""
        return cls(scores, ctx, scale) if applies(scores, ctx) else None

    def blocks(self, rows: int) -> Iterator[tuple[int, int]]:
        for start in range(0, self.n_q, rows):
            yield start, min(self.n_q, start + rows)

    def raw_bias(self, start: int, stop: int) -> Tensor:
        """The summed terms of queries `start … stop−1`.

        The summed terms of queries `start … stop−1`, `[b or 1, n_h, R, n_k]` (the
        encodings' dtype, float32 as a rule; unmasked), differentiable where grad mode is on."""
        total = None
        for enc in self.scores:
            term = forms.rows(enc, self.ctx, start, stop)
            total = term if total is None else total + term
        return total

    def bias(self, start: int, stop: int, dtype: torch.dtype,
             raw: Tensor | None = None) -> Tensor:
        """The block's bias as SDPA reads it.

        The block's bias as SDPA reads it: masked pairs at `−inf`, in `dtype` (the same cast
        as the dense plan's, `cast_bias`)."""
        if raw is None:
            with torch.no_grad():
                raw = self.raw_bias(start, stop)
        return cast_bias(raw, dtype, self.ctx.coords.dense_mask(start, stop))

    def run(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Attention output `[b, n_h, n_q, h_d]`.

        Attention output `[b, n_h, n_q, h_d]` (`q [b, n_h, n_q, h_d]`, `k, v [b, n_h, n_k,
        h_d]`, heads already expanded)."""
        # The fused kernel reads a block's queries and every key and value in each call: from
        # contiguous heads rather than the projections' `[b, n, n_h, h_d]` strides (4,096
        # points, one thread, on a Xeon with AVX-512: ALiBi's step 1.45 s → 1.32 s, FIRE's
        # 1.96 s → 1.89 s; on a grid, where the kernel is called once per group, ~1 %).
        q, k, v = (t.contiguous() for t in (q, k, v))
        inputs = bias_inputs(self) if torch.is_grad_enabled() else []
        return run_plan(self, q, k, v, *inputs)

    # -- forward ------------------------------------------------------------------------------
    @torch.no_grad()
    @reuse_blocks()  # each block's distance and term rows in the last one's storage
    def forward(self, q: Tensor, k: Tensor, v: Tensor, *inputs: Tensor) -> tuple[Tensor, Tensor]:
        """Output and each query's log-sum-exp.

        Output `[b, n_h, n_q, h_d]` and each query's log-sum-exp `[b, n_h, n_q]` (float32,
        float64 for float64 q; 0 on a fully masked row, whose output is 0). The terms are the
        plan's own (`inputs`, their tensors, are for the backward pass)."""
        b, h = q.shape[:2]
        out = q.new_empty(b, h, self.n_q, v.shape[-1])
        lse = q.new_empty(b, h, self.n_q,
                          dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
        for start, stop in self.blocks(self.forward_rows):
            # (the bias is not bound to a name: its storage is free for the next block's)
            o, m = _attend_block(q[:, :, start:stop], k, v, self.bias(start, stop, q.dtype),
                                 self.scale)
            out[:, :, start:stop], lse[:, :, start:stop] = o, m
        return out, lse

    # -- backward -----------------------------------------------------------------------------
    @torch.no_grad()
    def backward(self, q: Tensor, k: Tensor, v: Tensor, inputs: Seq[Tensor], out: Tensor,
                 lse: Tensor, d_out: Tensor, needs: Seq[bool]) -> tuple[Tensor | None, ...]:
        """Gradients with respect to `q, k, v` and each of `inputs`.

        Gradients w.r.t. `q, k, v` and each of `inputs` (None where `needs` is False or an
        input got none)."""
        d_out = d_out.to(q.dtype)
        if not any(needs[3:]):
            dq, dk, dv = self._fused_backward(q, k, v, out, lse, d_out)
            grads: list[Tensor | None] = [None] * len(inputs)
        else:
            dq, dk, dv, grads = self._bias_backward(q, k, v, out, lse, d_out, inputs, needs[3:])
        return (dq if needs[0] else None, dk if needs[1] else None, dv if needs[2] else None,
                *grads)

    @reuse_blocks()  # each block's distance and term rows in the last one's storage
    def _fused_backward(self, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                        d_out: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The fused kernel's backward per block (the bias a constant)."""
        dq = torch.empty_like(q, memory_format=torch.contiguous_format)
        dk = torch.zeros_like(k, memory_format=torch.contiguous_format)
        dv = torch.zeros_like(v, memory_format=torch.contiguous_format)
        for start, stop in self.blocks(self.forward_rows):
            rows = slice(start, stop)
            dq_b, dk_b, dv_b = _attend_block_backward(
                d_out[:, :, rows], q[:, :, rows], k, v, out[:, :, rows], lse[:, :, rows],
                self.bias(start, stop, q.dtype), self.scale)
            dq[:, :, rows] = dq_b
            dk += dk_b
            dv += dv_b
        return dq, dk, dv

    @reuse_blocks()  # each block's distance and term rows in the last one's storage
    def _bias_backward(self, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                       d_out: Tensor, inputs: Seq[Tensor], needs: Seq[bool]):
        """`dS` per block from the saved log-sum-exp; `dq, dk, dv` and the bias inputs'
        gradients from it. Within a block, batch entry by batch entry, tile by tile of
        `TILES_KEY_TILE` keys and head by head within a tile (a tile's probabilities stay in
        the cache across its five products; a term prepares a tile once for every head). A
        term with fast `tiles` ([BiasTiles][mmpe.attention.term_layouts.BiasTiles]) writes its bias
        into each tile and takes the tile's `dS` at once; the others' rows are made for the
        block (`[b or 1, n_h or 1, R, n_k]`), and where one of them takes a gradient, `dS` is
        written into the block's `[b, n_h, R, n_k]` gradient of the bias for its pullback."""
        dq = torch.zeros_like(q, memory_format=torch.contiguous_format)
        dk = torch.zeros_like(k, memory_format=torch.contiguous_format)
        dv = torch.zeros_like(v, memory_format=torch.contiguous_format)
        grads: list[Tensor | None] = [None] * len(inputs)
        wanted = [i for i, need in enumerate(needs) if need]
        neg_delta = -(d_out * out).sum(-1, keepdim=True, dtype=lse.dtype).to(q.dtype)
        lse = lse.to(q.dtype)
        b, h = q.shape[:2]
        tiled_terms = [e for e in self.scores if forms.offers(e, "tiles")]
        other_terms = [e for e in self.scores if not forms.offers(e, "tiles")]
        block = self.backward_rows if other_terms else self.tiled_rows
        for start, stop in self.blocks(block):
            rows = slice(start, stop)
            with torch.enable_grad():
                tiles = [forms.tiles(e, self.ctx, start, stop, TILES_KEY_TILE)
                         for e in tiled_terms]
            mask = self.ctx.coords.dense_mask(start, stop)
            raw, pullbacks = None, []
            if other_terms:
                raw, pullbacks = self.pullback_bias(start, stop, other_terms)
            # the terms' sum in their promoted dtype, as raw_bias adds them (float32 terms of
            # a float64 model are summed in float32, then cast)
            dtype = functools.reduce(torch.promote_types, [t.dtype for t in tiles],
                                     tiles[0].dtype if raw is None else raw.dtype)
            d_bias = q.new_empty(b, h, stop - start, self.n_k) if pullbacks else None
            bufs = _TileBuffers(q, stop - start, min(TILES_KEY_TILE, self.n_k), dtype,
                                d_bias is None)
            for i in range(b):
                # each head's rows and key tiles as views, made once (not per tile and head)
                per_head = [t[i, :, rows].unbind(0) for t in (q, d_out, lse[..., None],
                                                             neg_delta, dq)]
                key_tiles = [[t[i, head].split(TILES_KEY_TILE) for head in range(h)]
                             for t in (k, v, dk, dv)]
                for j, c in enumerate(range(0, self.n_k, TILES_KEY_TILE)):
                    keys = slice(c, min(self.n_k, c + TILES_KEY_TILE))
                    tile_mask = None if mask is None else _pick(mask, i, 0)[:, keys]
                    for head in range(h):
                        kt, vt, dkt, dvt = (t[head][j] for t in key_tiles)
                        qr, dor, ls, nd, dqr = (t[head] for t in per_head)
                        self._head_tile(
                            i, head, j, qr, kt, vt, dor, ls, nd,
                            None if raw is None else _pick(raw, i, head)[:, keys], tile_mask,
                            tiles, bufs, dqr, dkt, dvt,
                            None if d_bias is None else d_bias[i, head, :, keys])
            pulls = [pull(d_bias) for pull in pullbacks] + [t.pullback() for t in tiles]
            pairs = [pair for pull in pulls for pair in zip(*pull, strict=True)
                     if pair[0].requires_grad]
            if pairs:
                outputs, cotangents = zip(*pairs, strict=True)
                got = torch.autograd.grad(outputs, [inputs[i] for i in wanted], cotangents,
                                          retain_graph=True, allow_unused=True)
                for i, g in zip(wanted, got, strict=True):
                    if g is not None:
                        grads[i] = g if grads[i] is None else grads[i] + g
            del tiles, raw, pullbacks, pulls, pairs  # their blocks' storage: the next block's
        return dq, dk, dv, grads

    def pullback_bias(self, start: int, stop: int,
                      scores: Seq[ScoreEncoding] | None = None) -> tuple[Tensor, list[Pullback]]:
        """The summed terms of a block of queries and their pullbacks.

        The summed terms of queries `start … stop−1` (as
        `raw_bias`, without a graph; `scores`:
        those terms only, default all) and the
        pullbacks of the terms that take a gradient: each maps the block's `dS [b, n_h, R,
        n_k]` to tensors and their cotangents (`autograd.grad(tensors, inputs, cotangents)`
        is the term's vector-Jacobian product): their rows recorded by autograd and pulled back
        through their graph (a term with its gradient by hand has `tiles`)."""
        total, graphed, pulls = None, None, []
        for enc in self.scores if scores is None else scores:
            with torch.enable_grad():
                term = forms.rows(enc, self.ctx, start, stop)
                if term.requires_grad:
                    graphed = term if graphed is None else graphed + term
            term = term.detach()
            total = term if total is None else total + term
        if graphed is not None:
            # a bias shared by the batch (or heads) gets the sum of its pairs' gradients
            pulls.append(lambda d, t=graphed: ([t], [d.sum_to_size(t.shape).to(t.dtype)]))
        return total, pulls

    def _head_tile(self, i: int, head: int, j: int, qr: Tensor, kt: Tensor, vt: Tensor,
                   dor: Tensor, ls: Tensor, nd: Tensor, raw: Tensor | None,
                   mask: Tensor | None, tiles: Seq[BiasTiles], bufs: _TileBuffers, dqr: Tensor,
                   dkt: Tensor, dvt: Tensor, d_bias: Tensor | None) -> None:
        """One head's block of queries `qr [R, h_d]` against tile `j` of keys `kt, vt [K, h_d]`:
        `P = exp(bias − lse + s·q·kᵀ)`, `dS = P ⊙ (dO·Vᵀ − rowsum(dO ⊙ O))`, `dq += s·dS·K`,
        `dk += s·dSᵀ·Q`, `dv += Pᵀ·dO`; `dS` to each of `tiles` and into `d_bias [R, K]` where
        given. The bias: `raw [R, K]` (the other terms, where any) plus the tiles' terms,
        summed in the buffers' dtype, masked by `mask [R, K]` where given, then in q's dtype.
        The heads of one tile follow each other, so a term may prepare a tile once for all
        heads."""
        rows, cols = qr.shape[0], kt.shape[0]
        probs = bufs.probs[:rows * cols].view(rows, cols)
        total = probs if bufs.sums is None else bufs.sums[:rows * cols].view(rows, cols)
        if raw is not None:
            total.copy_(raw)
        for n, tile in enumerate(tiles):
            tile.write(total, i, head, j, add=raw is not None or n > 0)
        if mask is not None:
            total.masked_fill_(~mask, float("-inf"))
        if bufs.sums is not None:
            probs.copy_(total)
        probs.sub_(ls)
        probs.addmm_(qr, kt.t(), alpha=self.scale).exp_()
        dvt.addmm_(probs.t(), dor)
        d_s = d_bias if d_bias is not None else bufs.d_s[:rows * cols].view(rows, cols)
        d_s = torch.addmm(nd, dor, vt.t(), out=d_s).mul_(probs)
        dqr.addmm_(d_s, kt, alpha=self.scale)
        dkt.addmm_(d_s.t(), qr, alpha=self.scale)
        if tiles:
            ds_tile = d_s if d_s.is_contiguous() else d_s.contiguous()
            for tile in tiles:
                tile.take(ds_tile, i, head, j)


class _TileBuffers:
    """Scratch of one block's tiles: the probabilities (q's dtype), the terms' sum where their
    dtype is not q's, and `dS` where no block gradient of the bias is kept."""

    def __init__(self, q: Tensor, rows: int, width: int, dtype: torch.dtype,
                 own_ds: bool) -> None:
        self.probs = q.new_empty(rows * width)
        self.sums = None if dtype == q.dtype else q.new_empty(rows * width, dtype=dtype)
        self.d_s = q.new_empty(rows * width) if own_ds else None


def _pick(t: Tensor | None, i: int, head: int) -> Tensor | None:
    """`t [b or 1, n_h or 1, R, n_k]` at batch entry `i` and head `head` (broadcast)."""
    if t is None:
        return None
    return t[min(i, t.shape[0] - 1), min(head, t.shape[1] - 1)]


def bias_inputs(plan: TilesPlan) -> list[Tensor]:
    """The tensors that require a gradient and the plan's bias depends on.

    The tensors that require a gradient and the plan's bias depends on: the leaves the
    autograd graph of one probe row reaches (parameters, positions), except those reached
    through a tensor the coordinates hold (e.g. `Points`' per-axis positions computed from a
    leaf), which is listed instead — so a gradient w.r.t. a non-leaf position tensor still
    flows through the coordinates' own graph. Empty where the bias needs no gradient."""
    with torch.enable_grad():
        probe = plan.raw_bias(0, 1)
    if not probe.requires_grad or probe.grad_fn is None:
        return []
    stops = {(t.grad_fn, t.output_nr): t for t in _coordinate_tensors(plan.ctx.coords)
             if t.requires_grad and t.grad_fn is not None}
    found: dict[int, Tensor] = {}
    seen: set = set()
    stack = [(probe.grad_fn, probe.output_nr)]
    while stack:
        node, nr = stack.pop()
        if node is None:
            continue
        hit = stops.get((node, nr))
        if hit is not None:
            found.setdefault(id(hit), hit)
            continue
        if node in seen:
            continue
        seen.add(node)
        leaf = getattr(node, "variable", None)  # an AccumulateGrad node: a leaf
        if isinstance(leaf, Tensor):
            found.setdefault(id(leaf), leaf)
            continue
        stack.extend(node.next_functions)
    return list(found.values())


def _coordinate_tensors(coords: object, depth: int = 3) -> Iterator[Tensor]:
    """The tensors a coordinate object holds in its attributes (in lists, tuples and dicts,
    and in coordinate objects it holds, such as a window view's base)."""
    if depth < 0:
        return
    for value in vars(coords).values():
        items = (value.values() if isinstance(value, dict)
                 else value if isinstance(value, (list, tuple)) else (value,))
        for item in items:
            if isinstance(item, Tensor):
                yield item
            elif isinstance(item, Coordinates):
                yield from _coordinate_tensors(item, depth - 1)
