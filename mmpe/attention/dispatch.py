"""The routes a call runs on, once the route is chosen.

The routes a call runs on — flex, dense, SDPA and math — once [mmpe.attention.route][]
has chosen one.

On the CPU ``route="auto"`` is SDPA: FlexAttention has no
backward pass on the CPU, its CPU kernel is 4–5× slower than SDPA, and without a BlockMask its
CPU scratch memory is O(n²). An SDPA call takes one plan,
chosen once ([sdpa_plan][mmpe.attention.dispatch.sdpa_plan]) from the terms' structures, the
coordinates, the device and the sizes: the relation plan on ``toeplitz`` sequences
(``attention/plans/relation.py``), the grid plan (``plans/grid.py``), the tiles plan on points
and graphs (``plans/tiles.py``), checkpointed blocks, or the dense bias in one call.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from collections.abc import Iterator
from collections.abc import Sequence as Seq

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor

from mmpe import flex_compile
from mmpe.attention import forms, record
from mmpe.attention.flex import block_mask_of, compose_score_mods, flex_mods
from mmpe.attention.masks import cast_bias, dense_mask_of, kernel_mask_of, large_mask, plain_causal
from mmpe.attention.memory import bias_row_bytes, block_bytes, check_memory
from mmpe.attention.plans import grid, relation, tiles
from mmpe.coords.base import index_grid
from mmpe.encodings.base import AttentionCall, KernelEncoding, ScoreEncoding
from mmpe.prepare import memoized


def run_flex(scores: Seq[ScoreEncoding], ctx: AttentionCall, scale: float) -> Tensor:
    """FlexAttention with the composed `score_mod` and the coordinates' `BlockMask`.

    FlexAttention with the composed ``score_mod`` and the coordinates' ``BlockMask``
    (compiled per score-mod family on CUDA, see [mmpe.flex_compile][])."""
    from torch.nn.attention.flex_attention import flex_attention

    mods = flex_mods(scores, ctx)
    score_mod = compose_score_mods(mods)
    block_mask = block_mask_of(ctx.coords, ctx.q.device)
    # Inductor's flex kernel refuses q/k/v that are views of one projection buffer.
    q, k, v = (t.contiguous() for t in (ctx.q, ctx.k, ctx.v))
    try:
        if ctx.q.device.type != "cuda" or torch.compiler.is_compiling():
            return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
        return flex_compile.flex(q, k, v, mods, score_mod, block_mask, scale,
                                 kinds=tuple(type(e) for e in scores))
    except Exception as err:
        # Tracing re-raises a plugin's error from here, outside its own frames: name it.
        from mmpe.registry import note_plugin_errors

        note_plugin_errors(err, scores)
        raise


#: the sdpa route's plans (``run_sdpa``), in the order the decision tries them
SDPA_PLANS = ("relation", "grid", "tiles", "checkpointed", "dense")

_FORCED: contextvars.ContextVar[str | None] = contextvars.ContextVar("mmpe_sdpa_plan",
                                                                      default=None)


@contextlib.contextmanager
def force_plan(plan: str | None) -> Iterator[None]:
    """Run every sdpa-route call inside on `plan`, for tests and benchmarks.

    Run every sdpa-route call inside on `plan` (one of `SDPA_PLANS`), for tests and
    benchmarks that compare the plans; a call the plan cannot run raises `ValueError`. `None`:
    the ordinary decision.

    Raises:
        ValueError: an unknown plan.
    """
    if plan is not None and plan not in SDPA_PLANS:
        raise ValueError(f"force_plan: plan must be one of {SDPA_PLANS} or None, got {plan!r}")
    token = _FORCED.set(plan)
    try:
        yield
    finally:
        _FORCED.reset(token)


def _applicable(scores: Seq[ScoreEncoding], ctx: AttentionCall) -> dict[str, bool]:
    """Which plans can run the call (each condition tested once)."""
    return {"relation": relation.applies(scores, ctx), "grid": grid.applies(scores, ctx),
            "tiles": tiles.applies(scores, ctx), "checkpointed": True, "dense": True}


def sdpa_plan(scores: Seq[ScoreEncoding], ctx: AttentionCall) -> str:
    """The one decision of an sdpa-route call.

    The one decision of an sdpa-route call, from the terms' structures, the coordinates, the
    device and the sizes:

    * ``relation``: content-free terms of the relation on ``toeplitz`` sequences, where one
      entry's dense bias is large (``RELATION_MIN_BIAS_BYTES``);
    * ``grid``: terms of the cell offset on a grid, where one entry's dense bias is large;
    * ``tiles``: other content-free terms whose dense bias exceeds the block budget, or
      learned ones with hand-written tiles (their backward beats autograd's dense graph);
    * ``checkpointed``: checkpointed blocks of query rows (content-dependent terms, a large mask);
    * ``dense``: one SDPA call with the dense bias (timm's way).
    """
    can = _applicable(scores, ctx)
    # (a compiled model keeps the ordinary decision: dynamo does not trace a ContextVar)
    forced = None if torch.compiler.is_compiling() else _FORCED.get()
    if forced is not None:
        if not can[forced]:
            raise ValueError(f"force_plan: the {forced!r} plan cannot run this call "
                             f"({[type(e).__name__ for e in scores]} on "
                             f"{type(ctx.coords).__name__})")
        return forced
    if can["relation"] and relation.pays(scores, ctx):
        return "relation"
    if can["grid"] and grid.pays(scores, ctx):
        return "grid"
    if tiles.pays(scores, ctx):
        return "tiles" if can["tiles"] else "checkpointed"
    if not scores and large_mask(ctx):  # a padded point cloud of 60k points, say
        return "checkpointed"
    return "dense"


def run_sdpa(scores: Seq[ScoreEncoding], ctx: AttentionCall, scale: float) -> Tensor:
    """SDPA with the additive terms as `attn_mask`.

    SDPA with the additive terms as ``attn_mask``, on the plan
    [sdpa_plan][mmpe.attention.dispatch.sdpa_plan] chooses."""
    plan = sdpa_plan(scores, ctx)
    if plan == "relation":  # a table over the offsets of a sequence (plans/relation.py)
        return relation.attend(scores, ctx, scale)
    if plan == "grid":  # an offset-only bias on a grid: block-Toeplitz tables (plans/grid.py)
        return grid.attend(scores, ctx, scale)
    if plan == "tiles":  # content-free terms, a hand-written backward (plans/tiles.py)
        return tiles.attend(scores, ctx, scale)
    if plan == "checkpointed":
        return _sdpa_blocks(scores, ctx, scale)
    return run_dense(scores, ctx, scale)


def run_dense(scores: Seq[ScoreEncoding], ctx: AttentionCall, scale: float) -> Tensor:
    """One SDPA call with the terms' dense bias: the dense route.

    One SDPA call with the terms' dense bias ([dense_bias][mmpe.attention.forms.dense_bias],
    broadcast over the batch where it does not depend on the example) and the coordinates'
    mask as ``attn_mask``: the dense route on every device, and the sdpa route's dense plan."""
    coords = ctx.coords
    if not scores:
        if plain_causal(coords):  # the fused causal kernel, no dense mask
            return F.scaled_dot_product_attention(ctx.q, ctx.k, ctx.v, is_causal=True,
                                                  scale=scale)
        attn_mask = kernel_mask_of(coords, ctx.q.dtype)
    elif all(e.content_free for e in scores):
        # one mask in q's dtype per forward for the layers that share these terms (SDPA keeps
        # each call's mask for its backward: a copy per layer otherwise)
        key = ("dense_mask", tuple(id(e) for e in scores), ctx.num_heads, ctx.q.dtype,
               torch.is_grad_enabled(), coords.num_queries, coords.num_keys)
        attn_mask = memoized(coords, key, lambda: _dense_mask(scores, ctx))
    else:
        attn_mask = _dense_mask(scores, ctx)
    return F.scaled_dot_product_attention(ctx.q, ctx.k, ctx.v, attn_mask=attn_mask, scale=scale)


def _dense_mask(scores: Seq[ScoreEncoding], ctx: AttentionCall) -> Tensor:
    """The summed bias and the mask, written once, head-major, into a buffer padded to 8
    columns, in q's dtype: the layout CUDA's memory-efficient kernel takes as given
    (tests/attention/sdpa_rules.py); a strided gather (a table by offset, channel-last)
    would send it to the math kernel."""
    bias = forms.summed_bias(scores, ctx)  # the layer checked the terms
    return cast_bias(bias, ctx.q.dtype, dense_mask_of(ctx.coords), aligned=True)


def _sdpa_blocks(scores: Seq[ScoreEncoding], ctx: AttentionCall, scale: float) -> Tensor:
    """SDPA over blocks of queries, each with only its rows of the bias and mask: peak
    memory O(block × n_k) instead of O(n_q × n_k). With gradients, each block is
    recomputed in the backward pass (activation checkpointing) rather than kept."""
    n_q = ctx.coords.num_queries
    rows = max(1, block_bytes() // max(1, bias_row_bytes(ctx, 1)))
    outs = []
    for start in range(0, n_q, rows):
        stop = min(n_q, start + rows)
        run = functools.partial(_sdpa_rows, scores, ctx, scale, start, stop)
        if torch.is_grad_enabled():
            outs.append(torch.utils.checkpoint.checkpoint(run, use_reentrant=False))
        else:
            outs.append(run())
    return torch.cat(outs, dim=2)


def _sdpa_rows(scores: Seq[ScoreEncoding], ctx: AttentionCall, scale: float, start: int,
               stop: int) -> Tensor:
    bias = None
    for enc in scores:
        term = forms.rows(enc, ctx, start, stop)
        bias = term if bias is None else bias + term
    mask = ctx.coords.dense_mask(start, stop)
    bias = mask if bias is None else cast_bias(bias, ctx.q.dtype, mask)
    return F.scaled_dot_product_attention(ctx.q[:, :, start:stop], ctx.k, ctx.v,
                                          attn_mask=bias, scale=scale)


def run_math(scores: Seq[ScoreEncoding], kernel: KernelEncoding | None, ctx: AttentionCall,
             scale: float, *, mask: Tensor | None = None, allowed: Tensor | None = None,
             dropout: float = 0.0, return_probs: bool = False) -> Tensor | tuple[Tensor, Tensor | None]:
    """Explicit ``q·kᵀ``, score mods, mask, then the kernel (or softmax and value-side terms).

    The math route of the attention layers, and the eager attention of the HF interface
    (`mmpe.integrations.transformers`), whose masks and dropout come in as HF gives them.

    Args:
        mask: an additive float mask broadcastable to `[b, n_h, n_q, n_k]`, added to the
            scores after the score mods (HF's float `attention_mask`).
        allowed: a boolean mask broadcastable likewise, True where a query may attend, on top
            of the coordinates' own (HF's boolean `attention_mask`). Before a softmax its
            masked logits are the float32 minimum, not `-inf`: a row it masks entirely (an HF
            padding query) gets finite, uniform weights, not NaN, as in HF's eager attention.
            A non-softmax kernel reads them at `-inf`, like the coordinates' masked pairs.
        dropout: the probability of dropping an attention weight after the softmax (as HF's
            eager attention does); the value-side terms read the weights after it.
        return_probs: also return the weights that multiplied the values (float32, after
            dropout), None with a non-softmax kernel.

    Returns:
        The output `[b, n_h, n_q, h_d]` in `q`'s dtype, or `(output, weights)` with
            `return_probs`.
    """
    coords = ctx.coords
    # scores, their score-modded and masked copies, and the probabilities: four at once (one
    # more where record_attention keeps them)
    copies = 5 if record.recording() else 4
    check_memory((copies + (dropout > 0)) * bias_row_bytes(ctx, coords.num_queries),
                 "the math route's scores" + (" (recorded)" if copies == 5 else ""), ctx)
    scores_ = _math_scores(scores, ctx, scale, mask)
    softmax = kernel is None or kernel.is_softmax
    if allowed is not None:
        fill = torch.finfo(torch.float32).min if softmax else float("-inf")
        scores_ = scores_.masked_fill(~allowed, fill)
    v = ctx.v.float()
    if not softmax:
        out = kernel.attend(scores_, v, ctx)
        probs = None
    else:
        probs = scores_.softmax(dim=-1)
        record.record(probs)
        if dropout > 0:
            probs = F.dropout(probs, p=dropout, training=True)
        out = probs @ v
    out = _value_terms(scores, kernel, ctx, probs, out).to(ctx.q.dtype)
    return (out, probs) if return_probs else out


def _math_scores(scores: Seq[ScoreEncoding], ctx: AttentionCall, scale: float,
                 mask: Tensor | None) -> Tensor:
    """The float32 logits: ``q·kᵀ`` scaled, the score mods, the additive mask, then the
    coordinates' mask at ``-inf``."""
    coords = ctx.coords
    logits = (ctx.q @ ctx.k.transpose(-2, -1)).float() * scale
    score_mod = compose_score_mods([e.score_mod(ctx) for e in scores])
    if score_mod is not None:
        b, h, qi, ki = index_grid(coords.batch_size or 1, ctx.num_heads, coords.num_queries,
                                  coords.num_keys, logits.device)
        logits = score_mod(logits, b, h, qi, ki)
    if mask is not None:
        logits = logits + mask.float()
    own = dense_mask_of(coords)
    if own is not None:
        logits = logits.masked_fill(~own, float("-inf"))
    return logits


def _value_terms(scores: Seq[ScoreEncoding], kernel: KernelEncoding | None,
                 ctx: AttentionCall, probs: Tensor | None, out: Tensor) -> Tensor:
    """`out` plus the value-side terms of the encodings that read the probabilities."""
    for enc in scores:
        if enc.needs_probs:
            if probs is None:
                raise ValueError(f"attention: {type(enc).__name__} needs softmax probabilities "
                                 f"but the kernel is {type(kernel).__name__}")
            term = enc.value_term(probs, ctx)
            if term is not None:
                out = out + term
    return out


def _softmax_scale(scores: Seq[ScoreEncoding], head_dim: int) -> float:
    """The first scale an encoding prescribes, else ``1/sqrt(h_d)`` (a loop, not ``next()`` on
    a generator: torch 2.5's compiler cannot trace the latter)."""
    for enc in scores:
        scale = enc.softmax_scale(head_dim)
        if scale is not None:
            return scale
    return 1.0 / math.sqrt(head_dim)
