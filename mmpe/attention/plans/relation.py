"""The relation plan on sequences (CPU).

The relation plan on sequences (CPU): content-free score terms on ``toeplitz`` coordinates
read from tables over the ``n_q + n_k − 1`` offsets, with a backward pass that reduces the
gradient of the scores onto those tables (no ``n×n`` tensor kept)."""

from __future__ import annotations

import math
from collections.abc import Sequence as Seq

import torch
from torch import Tensor

from mmpe.attention import forms
from mmpe.attention.masks import _only_causal
from mmpe.attention.memory import block_bytes
from mmpe.attention.plans.flash import _attend_block
from mmpe.attention.plans.plan import run_plan
from mmpe.attention.term_layouts import (
    CompactBias,
    antidiagonal_buffer,
    antidiagonal_sums,
    toeplitz_rows,
)
from mmpe.encodings.base import AttentionCall, ScoreEncoding
from mmpe.prepare import memoized

#: queries per block on the relation plan where the block's bias is materialised (FIRE, packed
#: documents) and in its backward pass: ``[n_h, 64, n_k]`` blocks measured fastest on one core
#: from n = 2048 to 8192 (the blocks of the backward's five products stay in cache); capped by
#: ``MMPE_ATTN_BLOCK_BYTES``.
RELATION_BLOCK_ROWS = 64

#: the relation plan is taken where one batch entry's dense bias `[n_h, n_q, n_k]` float32 would
#: be at least this large: below it the dense bias in one SDPA call is faster (fwd+bwd of the
#: layer, d_model 512, 8 heads, two threads: at 128 causal tokens and batch 32, 0.5 MB, T5 1.23×
#: the unbiased layer here and 1.13× dense, ALiBi 1.07× and 1.01×; at 512 tokens and batch 8,
#: 8 MB, T5 1.03× here and 1.39× dense, ALiBi 1.12× and 1.12×; benchmarks/bench_layers.py).
RELATION_MIN_BIAS_BYTES = 2 << 20


def applies(scores: Seq[ScoreEncoding], ctx: AttentionCall) -> bool:
    """Whether the relation plan can run the call.

    Whether this plan can run the call: the CPU, float32/64, not under
    ``torch.compile``, ``toeplitz`` coordinates, and every term content-free, additive and
    either a function of the relation (structures ``relation``, ``distance``) or of a class
    with a compact form (FIRE)."""
    coords, q = ctx.coords, ctx.q
    return (len(scores) > 0 and q.device.type == "cpu"
            and q.dtype in (torch.float32, torch.float64)
            and not torch.compiler.is_compiling()
            and getattr(coords, "toeplitz", False) is True
            and all(e.content_free and e.additive
                    and (forms.offers(e, "relation_table") or forms.offers(e, "compact"))
                    for e in scores))


def pays(scores: Seq[ScoreEncoding], ctx: AttentionCall) -> bool:
    """Whether one batch entry's dense bias reaches `RELATION_MIN_BIAS_BYTES`."""
    coords = ctx.coords
    return ctx.num_heads * coords.num_queries * coords.num_keys * 4 >= RELATION_MIN_BIAS_BYTES


def attend(scores: Seq[ScoreEncoding], ctx: AttentionCall, scale: float) -> Tensor:
    """The call's output on the relation plan.

    The call's output `[b, n_h, n_q, h_d]` on this plan (where it
    [applies][mmpe.attention.plans.relation.applies])."""
    return RelationPlan.build(scores, ctx, scale).run(ctx.q, ctx.k, ctx.v)


class RelationPlan:
    """Softmax attention with content-free score terms on ``toeplitz`` coordinates (CPU).

    Terms that depend on the relation alone (structures `relation` and `distance`) are summed
    into one table over the ``n_q + n_k − 1`` offsets, with ``−inf`` on the offsets a causal
    mask removes; others come as [`CompactBias`][mmpe.attention.term_layouts.CompactBias]. Queries
    are taken in blocks, each block's rows reversed so that its bias is a strided view of the
    table ([`toeplitz_rows`][mmpe.attention.term_layouts.toeplitz_rows]): SDPA's fused CPU kernel
    reads it with no ``n×n`` tensor, and a causal block stops at its last query's key. The
    backward pass ([`PlanAttention`][mmpe.attention.plans.plan.PlanAttention]) recomputes each
    block's probabilities from the saved log-sum-exp and reduces the gradient of the scores onto
    the table (anti-diagonal sums) and the compact terms, instead of scattering an ``n×n``
    gradient through an autograd graph.

    Equal to the other plans (tests/attention/test_attention_fastbias.py compares against the
    math route, gradients included). Taken by
    [`build`][mmpe.attention.plans.relation.RelationPlan.build] only where it applies; otherwise
    ``None``.
    """

    def __init__(self, ctx: AttentionCall, scale: float, table: Tensor,
                 compact: list[CompactBias], rows: int, cap: int) -> None:
        coords = ctx.coords
        self.coords, self.scale, self.table, self.compact = coords, scale, table, compact
        self.n_q, self.n_k = coords.num_queries, coords.num_keys
        self.causal = getattr(coords, "causal", False) is True
        self.dense_mask = coords.mask_mod() is not None and not _only_causal(coords)
        self.rows, self.heads = rows, ctx.num_heads
        # A bias that is a view of the table costs no memory: the forward pass then takes larger
        # blocks (SDPA's kernel runs faster on them; at n = 8192, 512 rows: 1.04× the causal
        # kernel, 64 rows: 1.4×), up to a 1/16 of the queries recomputed above the diagonal.
        self.forward_rows = rows
        if not compact and not self.dense_mask:
            self.forward_rows = min(cap, max(rows, min(512, self.n_q // 16)))

    @classmethod
    def build(cls, scores: Seq[ScoreEncoding], ctx: AttentionCall,
              scale: float) -> RelationPlan:
        """The plan for a call where [applies][mmpe.attention.plans.relation.applies]."""
        coords, q = ctx.coords, ctx.q
        n_q, n_k = coords.num_queries, coords.num_keys
        relation = torch.arange(n_k - 1, -n_q, -1, device=q.device)  # table index s = 0, 1 …
        table, compact = None, []
        for enc in scores:
            if forms.offers(enc, "relation_table"):
                key = ("relation_table", id(enc), ctx.num_heads, n_q, n_k)
                term = memoized(coords, key,
                                lambda enc=enc: forms.relation_table(enc, ctx, relation))
                table = term if table is None else table + term
            else:
                key = ("compact", id(enc), ctx.num_heads, n_q, n_k)
                compact.append(memoized(coords, key, lambda enc=enc: forms.compact(enc, ctx)))
        if table is None:
            table = torch.zeros(1, relation.shape[0], device=q.device)
        if getattr(coords, "causal", False) is True:  # the causal mask, folded into the table
            table = table.masked_fill(relation < 0, float("-inf"))
        table = table.to(q.dtype).contiguous()
        cap = max(1, block_bytes() // (q.shape[0] * ctx.num_heads * n_k * q.element_size()))
        return cls(ctx, scale, table, compact, min(RELATION_BLOCK_ROWS, cap), cap)

    def run(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Attention output `[b, n_h, n_q, h_d]`.

        Attention output ``[b, n_h, n_q, h_d]``; the autograd inputs are the table and the
        compact terms' tensors."""
        return run_plan(self, q, k, v, self.table, *(t for c in self.compact for t in c.tensors))

    def blocks(self, rows: int) -> list[tuple[int, int, int]]:
        """The blocks of `rows` queries and the keys each needs.

        ``(start, stop, keys)`` of each block of ``rows`` queries: a causal block needs the
        keys up to its last query's only."""
        out = []
        for start in range(0, self.n_q, rows):
            stop = min(self.n_q, start + rows)
            out.append((start, stop, stop + self.n_k - self.n_q if self.causal else self.n_k))
        return out

    def bias(self, start: int, stop: int, keys: int, out: Tensor | None = None) -> Tensor:
        """The additive term of a block of queries.

        Scores' additive term of queries ``stop−1 … start`` (reversed), ``[b', n_h', R, K]``
        (masked pairs at ``−inf``): a view of the table when it is the only term and no ``out``
        (``[b, n_h, R, K]``) is given to write it into."""
        view = toeplitz_rows(self.table, self.n_q, start, stop, keys)[None]
        if not self.compact and not self.dense_mask and out is None:
            return view
        mask = None
        if self.dense_mask:
            mask = self.coords.dense_mask(start, stop)[..., :keys].flip(-2)
        if out is None:
            batch = max([c.batch for c in self.compact] + [1 if mask is None else mask.shape[0]])
            out = view.new_empty(batch, self.heads if self.compact else view.shape[1],
                                 stop - start, keys)
        if self.compact:
            # The table's offsets of this block (pair (r, k) at r + k), for the first compact
            # term to add in the same pass as its own.
            first = self.n_q - stop
            base = self.table[:, first:first + stop - start + keys - 1]
            for i, c in enumerate(self.compact):
                c.add_rows(out, start, stop, base if i == 0 else None)
        else:
            out.copy_(view.expand_as(out))
        if mask is not None:
            out.masked_fill_(~mask, float("-inf"))
        return out

    @torch.no_grad()
    def forward(self, q: Tensor, k: Tensor, v: Tensor, *inputs: Tensor) -> tuple[Tensor, Tensor]:
        """Output and the log-sum-exp of each query's scores.

        Output ``[b, n_h, n_q, h_d]`` and the log-sum-exp of each query's scores
        ``[b, n_h, n_q]``, block by block with SDPA's fused CPU kernel (the terms are the
        plan's own: ``inputs`` are read from it)."""
        b, h, n_q, _ = q.shape
        out = q.new_empty(b, h, n_q, v.shape[-1])
        lse = q.new_empty(b, h, n_q, dtype=torch.float32 if q.dtype != torch.float64 else q.dtype)
        for start, stop, keys in self.blocks(self.forward_rows):
            o, m = _attend_block(q[:, :, start:stop].flip(2), k[:, :, :keys], v[:, :, :keys],
                                 self.bias(start, stop, keys), self.scale)
            out[:, :, start:stop] = o.flip(2)
            lse[:, :, start:stop] = m.flip(-1)
        for c in self.compact:
            c.release()
        return out, lse

    @torch.no_grad()
    def backward(self, q: Tensor, k: Tensor, v: Tensor, inputs: Seq[Tensor], out: Tensor,
                 lse: Tensor, d_out: Tensor, needs: Seq[bool]) -> tuple[Tensor | None, ...]:
        """Gradients with respect to `q, k, v`, the table and the compact tensors.

        Gradients w.r.t. ``q, k, v``, the table and the compact tensors (None where
        ``needs`` is False): per block ``P = exp(S − lse)``, ``dS = P ⊙ (dO·Vᵀ − rowsum(dO ⊙
        O))``, then ``dQ = dS·K·scale``, ``dK += dSᵀ·Q·scale``, ``dV += Pᵀ·dO``; ``dS`` is
        written into an anti-diagonal buffer, whose sums over rows are the table's gradient."""
        b, h, n_q, d = q.shape
        n_k, dv_ = k.shape[2], v.shape[-1]
        need_q, need_k, need_v, need_table, *need_compact = needs
        k3 = k.contiguous().view(b * h, n_k, d)
        v3 = v.contiguous().view(b * h, n_k, dv_)
        d_out = d_out.to(out.dtype)
        delta = (d_out * out).sum(-1, dtype=lse.dtype)  # rowsum(dO ⊙ O) [b, h, n_q]
        dq = torch.empty_like(q, memory_format=torch.contiguous_format) if need_q else None
        dk = k3.new_zeros(b * h, n_k, d) if need_k else None
        dv = v3.new_zeros(b * h, n_k, dv_) if need_v else None
        d_table = torch.zeros_like(self.table) if need_table else None
        compact_grads, flags = [], iter(need_compact)
        for c in self.compact:
            compact_grads.append([torch.zeros_like(t) if next(flags) else None
                                  for t in c.tensors])
        need_buffer = need_table or any(g is not None for gs in compact_grads for g in gs)
        floor = math.log(torch.finfo(q.dtype).tiny) + 0.5
        for start, stop, keys in self.blocks(self.rows):
            rows = stop - start
            qr = q[:, :, start:stop].flip(2).reshape(b * h, rows, d)
            dor = d_out[:, :, start:stop].flip(2).reshape(b * h, rows, dv_)
            # P = exp(bias − lse + scale·q·kᵀ): the bias and −lse in one pass, then one GEMM.
            probs = q.new_empty(b, h, rows, keys)
            lse_rows = lse[:, :, start:stop].flip(-1)[..., None].to(q.dtype)
            if self.compact or self.dense_mask:
                self.bias(start, stop, keys, out=probs).sub_(lse_rows)
            else:
                torch.sub(self.bias(start, stop, keys), lse_rows, out=probs)
            probs = probs.view(b * h, rows, keys)
            probs.baddbmm_(qr, k3[:, :keys].transpose(1, 2), alpha=self.scale)
            # exp is ~30× slower where its result would be subnormal or zero (ALiBi's far pairs,
            # masked pairs): from tiny, P stays a normal number ≤ 2·10⁻³⁸ instead of 0.
            probs.clamp_(min=floor).exp_()
            if dv is not None:
                dv[:, :keys].baddbmm_(probs.transpose(1, 2), dor)
            if need_buffer:
                buf, ds = antidiagonal_buffer((b, h, rows, keys), probs)
            else:
                buf, ds = None, probs.new_empty(b, h, rows, keys)
            ds.copy_(delta[:, :, start:stop].flip(-1)[..., None].neg().to(q.dtype).expand_as(ds))
            ds3 = ds.view(b * h, rows, keys)
            ds3.baddbmm_(dor, v3[:, :keys].transpose(1, 2)).mul_(probs)
            if dq is not None:
                dq[:, :, start:stop] = torch.bmm(ds3, k3[:, :keys]).mul_(self.scale).view(
                    b, h, rows, d).flip(2)
            if dk is not None:
                dk[:, :keys].baddbmm_(ds3.transpose(1, 2), qr, alpha=self.scale)
            if d_table is not None:
                sums = antidiagonal_sums(buf, 1)  # [h, R + K − 1], summed over the batch
                if d_table.shape[0] == 1:
                    sums = sums.sum(0, keepdim=True)
                d_table[:, n_q - stop:n_q - stop + sums.shape[-1]] += sums
            for c, grads in zip(self.compact, compact_grads, strict=True):
                if any(g is not None for g in grads):
                    c.accumulate_grads(buf, start, stop, grads)
        for c in self.compact:
            c.release()
        return (dq, None if dk is None else dk.view(b, h, n_k, d),
                None if dv is None else dv.view(b, h, n_k, dv_), d_table,
                *(g for grads in compact_grads for g in grads))
