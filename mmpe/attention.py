"""Multi-head attention that composes any list of positional encodings.

Rotary encodings rotate ``q`` and ``k``; score encodings are merged into one
FlexAttention ``score_mod``; a kernel encoding replaces the softmax. Three execution paths
give the same numbers:

* ``"flex"`` — ``torch.nn.attention.flex_attention`` with the composed ``score_mod`` and a
  ``BlockMask`` from the coordinates' ``mask_mod``: no ``n×n`` bias tensor, memory O(n) on a
  GPU. Compiled with ``torch.compile`` on CUDA, one copy per score-mod family with dynamic
  shapes (:mod:`mmpe.flex_compile`).
* ``"sdpa"`` — ``scaled_dot_product_attention`` with the additive score terms evaluated on
  all pairs (the same functions, called on broadcast index grids) as ``attn_mask``, block by
  block over queries. On the CPU, content-free terms on ``toeplitz`` sequences (implicit
  positions, packed documents) take the relation path instead: tables over the ``n_q + n_k − 1``
  offsets, read by the fused kernel as strided views, with a backward pass that sums the
  gradient of the scores along the diagonals (:class:`_RelationPlan`).
* ``"math"`` — explicit ``q·kᵀ``, score mods, mask, kernel; needed by non-additive score mods
  with a non-softmax kernel, or value-side terms that need the probabilities.

``backend="auto"`` picks per device: on CUDA, flex when there are score terms or a mask (else
SDPA, whose flash kernels are fastest without a bias); on CPU, SDPA — measured on torch
2.13/2.15, FlexAttention has no backward pass on the CPU, its CPU kernel is 4–5× slower than
SDPA, and without a BlockMask its CPU scratch memory is O(n²).

:class:`MultiHeadAttention` is self-attention with grouped-query heads and an optional
:class:`~mmpe.cache.KVCache`; :class:`CrossAttention` attends from one token set to another,
each with its own coordinates (see :class:`~mmpe.coords.cross.Cross`).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence as Seq

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from einops import rearrange
from torch import Tensor, nn

from mmpe import flex_compile
from mmpe.cache import KVCache
from mmpe.coords.base import Coordinates, index_grid
from mmpe.coords.cross import Cross
from mmpe.encodings.base import (
    AttentionContext,
    CompactBias,
    Encoding,
    KernelEncoding,
    RotaryEncoding,
    ScoreEncoding,
    ScoreMod,
    antidiagonal_buffer,
    antidiagonal_sums,
    toeplitz_rows,
)
from mmpe.prepare import forward_scope, memoized
from mmpe.validation import check_positive_int

BACKENDS = ("auto", "flex", "sdpa", "math")


def compose_score_mods(mods: Seq[ScoreMod]) -> ScoreMod | None:
    """One ``score_mod`` applying ``mods`` in order, or None for an empty list."""
    if not mods:
        return None

    def composed(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        for mod in mods:
            score = mod(score, b, h, q_idx, kv_idx)
        return score

    return composed


def _check_positive(name: str, value: object) -> int:
    check_positive_int("attention", name, value)
    return int(value)


def _autocast(x: Tensor) -> bool:
    """Whether autocast is on for ``x``'s device (then x and the weights may differ in dtype)."""
    try:
        return torch.is_autocast_enabled(x.device.type)
    except TypeError:  # torch < 2.4: no device argument
        return torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled()


def _head_dim(d_model: int, num_heads: int, head_dim: int | None) -> int:
    """``h_d``: given, or ``d_model // num_heads`` (which must divide)."""
    _check_positive("d_model", d_model)
    _check_positive("num_heads", num_heads)
    if head_dim is None:
        if d_model % num_heads:
            raise ValueError(
                f"attention: d_model={d_model} must be divisible by num_heads={num_heads}"
            )
        return d_model // num_heads
    return _check_positive("head_dim", head_dim)


class _Attention(nn.Module):
    """What self- and cross-attention share: encodings by hook, path choice, the three paths."""

    def _setup(self, num_heads: int, num_kv_heads: int | None, head_dim: int,
               encodings: Seq[Encoding], backend: str) -> None:
        _check_positive("num_heads", num_heads)
        num_kv_heads = num_heads if num_kv_heads is None else _check_positive("num_kv_heads",
                                                                              num_kv_heads)
        if num_heads % num_kv_heads:
            raise ValueError(f"attention: num_heads={num_heads} must be a multiple of "
                             f"num_kv_heads={num_kv_heads}")
        if backend not in BACKENDS:
            raise ValueError(f"attention: backend must be one of {BACKENDS}, got {backend!r}")
        if isinstance(encodings, (str, Encoding)):
            raise TypeError("attention: encodings must be a list of built encodings, got a "
                            f"single {type(encodings).__name__}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.backend = backend
        self.rotary, self.scores, kernels = _split_by_hook(encodings)
        if len(kernels) > 1:
            raise ValueError(f"attention: at most one kernel encoding, got {len(kernels)}")
        self.kernel = kernels[0] if kernels else None

    def _projection_weight(self) -> Tensor | None:
        """The input projection's weight (encodings may keep float32 tables in a bf16 model)."""
        for name in ("qkv", "q_proj"):
            layer = getattr(self, name, None)
            if isinstance(layer, nn.Linear):
                return layer.weight
        return next((p for p in self.parameters() if p.is_floating_point()), None)

    def _check_x(self, arg: str, x: Tensor, width: int, tokens: int, what: str) -> None:
        if not isinstance(x, Tensor):
            raise TypeError(f"attention: {arg} must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"attention: {arg} must be a floating-point tensor, got {x.dtype}")
        weight = self._projection_weight()
        if weight is not None and x.dtype != weight.dtype and not _autocast(x):
            raise TypeError(f"attention: {arg} is {x.dtype} but the layer's weights are "
                            f"{weight.dtype}; cast one to the other (x.to(dtype) or "
                            "module.to(dtype)) or run under torch.autocast")
        if x.dim() != 3 or x.shape[-1] != width:
            raise ValueError(f"attention: {arg} must be [b, s, {width}], got {tuple(x.shape)}")
        if x.shape[1] != tokens:
            raise ValueError(f"attention: {arg} has s={x.shape[1]} tokens but the coordinates "
                             f"have {tokens} {what}")
        if x.shape[0] == 0:
            raise ValueError(f"attention: {arg} has batch size 0 ({tuple(x.shape)}); attention "
                             "needs at least one example")

    def _check_batch(self, x: Tensor, coords: Coordinates) -> None:
        if coords.batch_size is not None and coords.batch_size != x.shape[0]:
            raise ValueError(f"attention: x has batch {x.shape[0]} but the coordinates hold "
                             f"positions for {coords.batch_size} examples")

    def _rotate(self, q: Tensor, k: Tensor, coords: Coordinates) -> tuple[Tensor, Tensor]:
        for rotary in self.rotary:
            q, k = rotary(q, k, coords)
        return q, k

    def _expand_kv(self, t: Tensor) -> Tensor:
        groups = self.num_heads // t.shape[1]
        return t if groups == 1 else t.repeat_interleave(groups, dim=1)

    # -- path selection -------------------------------------------------------------------
    def path(self, device: torch.device) -> str:
        """The execution path for this call: ``"flex"``, ``"sdpa"`` or ``"math"``."""
        kernel_softmax = self.kernel is None or self.kernel.is_softmax
        needs_math = not kernel_softmax or any(s.needs_probs for s in self.scores)
        if self.backend == "math" or needs_math:
            if self.backend == "flex":
                raise ValueError("attention: backend='flex' cannot run a non-softmax kernel "
                                 "or value-side score terms; use 'math' or 'auto'")
            return "math"
        if self.backend == "flex":
            if not flex_compile.available():
                raise flex_compile.FlexUnavailableError(
                    f"attention: backend='flex' needs torch >= 2.6 (this is {torch.__version__}: "
                    "its FlexAttention cannot differentiate learned score terms); use 'auto' "
                    "or 'sdpa'")
            return "flex"
        additive = all(s.additive for s in self.scores)
        if self.backend == "sdpa":
            return "sdpa" if additive else "math"
        if device.type == "cuda" and self.scores and flex_compile.available():
            return "flex"
        return "sdpa" if additive else "math"

    def attend(self, ctx: AttentionContext) -> Tensor:
        """Attention output ``[b, n_h, n_q, h_d]`` for the context's (rotated) q, k, v."""
        assert ctx.q is not None and ctx.k is not None and ctx.v is not None
        scale = _softmax_scale(self.scores, ctx.head_dim)
        path = self.path(ctx.q.device)
        if path == "flex":
            return self._flex(ctx, scale)
        if path == "sdpa":
            return self._sdpa(ctx, scale)
        return self._math(ctx, scale)

    def _flex(self, ctx: AttentionContext, scale: float) -> Tensor:
        from torch.nn.attention.flex_attention import flex_attention

        mods = _flex_mods(self.scores, ctx)
        score_mod = compose_score_mods(mods)
        block_mask = _block_mask(ctx.coords, ctx.q.device)
        # Inductor's flex kernel refuses q/k/v that are views of one projection buffer.
        q, k, v = (t.contiguous() for t in (ctx.q, ctx.k, ctx.v))
        if ctx.q.device.type != "cuda" or torch.compiler.is_compiling():
            return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                  scale=scale)
        return flex_compile.flex(q, k, v, mods, score_mod, block_mask, scale,
                                 kinds=tuple(type(e) for e in self.scores))

    def _sdpa(self, ctx: AttentionContext, scale: float) -> Tensor:
        coords = ctx.coords
        plan = _RelationPlan.build(self.scores, ctx, scale) if self.scores else None
        if plan is not None:
            return plan.run(ctx.q, ctx.k, ctx.v)
        if self.scores and _bias_bytes(ctx, coords.num_queries) > block_bytes():
            return self._sdpa_blocks(ctx, scale)
        if not self.scores and _large_mask(ctx):  # a padded point cloud of 60k points, say
            return self._sdpa_blocks(ctx, scale)
        bias = None
        for enc in self.scores:
            term = _bias(enc, ctx)
            bias = term if bias is None else bias + term
        if bias is None:
            if _plain_causal(coords):  # the fused causal kernel, no dense mask
                return F.scaled_dot_product_attention(ctx.q, ctx.k, ctx.v, is_causal=True,
                                                      scale=scale)
            attn_mask = _dense_mask(coords)
        else:
            attn_mask = _cast_bias(bias, ctx.q.dtype, _dense_mask(coords))
        return F.scaled_dot_product_attention(ctx.q, ctx.k, ctx.v, attn_mask=attn_mask, scale=scale)

    def _sdpa_blocks(self, ctx: AttentionContext, scale: float) -> Tensor:
        """SDPA over blocks of queries, each with only its rows of the bias and mask: peak
        memory O(block × n_k) instead of O(n_q × n_k). With gradients, each block is
        recomputed in the backward pass (activation checkpointing) rather than kept."""
        n_q = ctx.coords.num_queries
        rows = max(1, block_bytes() // max(1, _bias_bytes(ctx, 1)))
        outs = []
        for start in range(0, n_q, rows):
            stop = min(n_q, start + rows)
            run = functools.partial(self._sdpa_rows, ctx, scale, start, stop)
            if torch.is_grad_enabled():
                outs.append(torch.utils.checkpoint.checkpoint(run, use_reentrant=False))
            else:
                outs.append(run())
        return torch.cat(outs, dim=2)

    def _sdpa_rows(self, ctx: AttentionContext, scale: float, start: int, stop: int) -> Tensor:
        bias = None
        for enc in self.scores:
            term = enc.bias_rows(ctx, start, stop)
            bias = term if bias is None else bias + term
        mask = ctx.coords.dense_mask(start, stop)
        bias = mask if bias is None else _cast_bias(bias, ctx.q.dtype, mask)
        return F.scaled_dot_product_attention(ctx.q[:, :, start:stop], ctx.k, ctx.v,
                                              attn_mask=bias, scale=scale)

    def _math(self, ctx: AttentionContext, scale: float) -> Tensor:
        coords = ctx.coords
        _check_memory(3 * _bias_bytes(ctx, coords.num_queries), "the math path's scores", ctx)
        scores = (ctx.q @ ctx.k.transpose(-2, -1)).float() * scale
        score_mod = compose_score_mods([e.score_mod(ctx) for e in self.scores])
        if score_mod is not None:
            b, h, qi, ki = index_grid(coords.batch_size or 1, ctx.num_heads, coords.num_queries,
                                      coords.num_keys, scores.device)
            scores = score_mod(scores, b, h, qi, ki)
        mask = _dense_mask(coords)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        v = ctx.v.float()
        if self.kernel is not None and not self.kernel.is_softmax:
            out = self.kernel.attend(scores, v, ctx)
            probs = None
        else:
            probs = scores.softmax(dim=-1)
            out = probs @ v
        for enc in self.scores:
            if enc.needs_probs:
                if probs is None:
                    raise ValueError(f"attention: {type(enc).__name__} needs softmax probabilities "
                                     f"but the kernel is {type(self.kernel).__name__}")
                term = enc.value_term(probs, ctx)
                if term is not None:
                    out = out + term
        return out.to(ctx.q.dtype)


class MultiHeadAttention(_Attention):
    """Self-attention with positional encodings at the rotary, score and kernel hooks.

    Args:
        d_model: model width.
        num_heads: query heads ``n_h``.
        encodings: built encodings (rotary, score, kernel; input encodings belong to the
            model's embedding, see :class:`mmpe.transformer.Transformer`). At most one kernel.
        num_kv_heads: key/value heads ``n_kv`` for grouped-query attention (Ainslie et al.
            2023; ``1`` is multi-query attention, Shazeer 2019); a divisor of ``num_heads``,
            default ``num_heads``. The cache keeps ``n_kv`` heads.
        head_dim: ``h_d``; defaults to ``d_model // num_heads``.
        qkv_bias: bias in the q/k/v projection.
        backend: ``"auto"``, ``"flex"``, ``"sdpa"`` or ``"math"`` (see the module docstring).

    Shapes: ``forward(x [b, s, d_model], coords, cache=None) -> [b, s, d_model]``; ``coords``
    has ``n_q = s`` queries and ``n_k`` keys: ``s`` without a cache, ``cache.length + s``
    with one (``Sequence(s, offset=cache.length, causal=True)``).

    Raises:
        ValueError: ``d_model`` not divisible by ``num_heads`` (with no ``head_dim``), heads
            that do not divide, an input encoding or more than one kernel in ``encodings``, an
            unknown ``backend``; at forward, ``x`` not ``[b, s, d_model]`` with ``s`` equal to
            the coordinates' queries, a batch that differs from the coordinates', or
            coordinates whose key count is not ``cache.length + s``.
        TypeError: ``x`` not a floating-point tensor, ``encodings`` not a list.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        encodings: Seq[Encoding] = (),
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        qkv_bias: bool = True,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        head_dim = _head_dim(d_model, num_heads, head_dim)
        self._setup(num_heads, num_kv_heads, head_dim, encodings, backend)
        self.d_model = d_model
        width = (num_heads + 2 * self.num_kv_heads) * head_dim
        self.qkv = nn.Linear(d_model, width, bias=qkv_bias)
        self.proj = nn.Linear(num_heads * head_dim, d_model)

    def forward(self, x: Tensor, coords: Coordinates, cache: KVCache | None = None) -> Tensor:
        if not isinstance(coords, Coordinates):
            raise TypeError(f"attention: coords must be an mmpe Coordinates object, got "
                            f"{type(coords).__name__}")
        self._check_x("x", x, self.d_model, coords.num_queries, "queries")
        self._check_batch(x, coords)
        past = 0 if cache is None else cache.length
        if coords.num_keys != past + x.shape[1]:
            raise ValueError(f"attention: the coordinates have {coords.num_keys} keys but there "
                             f"are {past} cached + {x.shape[1]} new tokens; build them with "
                             f"offset={past} (e.g. Sequence({x.shape[1]}, offset={past}, "
                             "causal=True))")
        with forward_scope(coords):
            coords.prepare()
            q, k, v = self._project(x)
            # Length-dependent rotations (dynamic NTK, xPos …) re-rotate every key each step.
            lazy = cache is not None and any(r.length_dependent for r in self.rotary)
            if not lazy:
                q, k = self._rotate(q, k, coords)
            if cache is not None:
                k, v = cache.update(k, v, owner=self, causal=getattr(coords, "causal", None))
            if lazy:
                q, k = self._rotate(q, k, coords)
            ctx = AttentionContext(coords, self.num_heads, self.head_dim, x.shape[0], x, q,
                                   self._expand_kv(k), self._expand_kv(v), cache=cache)
            out = self.attend(ctx)
        return self.proj(rearrange(out, "b h s d -> b s (h d)"))

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        d, hq, hkv = self.head_dim, self.num_heads, self.num_kv_heads
        q, k, v = self.qkv(x).split((hq * d, hkv * d, hkv * d), dim=-1)
        return (rearrange(q, "b s (h d) -> b h s d", h=hq),
                rearrange(k, "b s (h d) -> b h s d", h=hkv),
                rearrange(v, "b s (h d) -> b h s d", h=hkv))


class CrossAttention(_Attention):
    """Attention from queries ``x`` to another token set ``memory``, each with its coordinates.

    The coordinates of the call are ``Cross(coords, memory_coords)``
    (:class:`~mmpe.coords.cross.Cross`): rotary encodings rotate ``q`` by the query side's
    positions and ``k`` by the key side's; a distance-based score needs a distance between the
    two sides (both on one grid, sequence, sphere or point space) and is refused with an
    error naming the ``Metric`` capability otherwise; latent queries
    (:class:`~mmpe.coords.cross.Latents`) have no position. With identical coordinates on both
    sides and ``memory is x`` it computes what :class:`MultiHeadAttention` does.

    Args:
        d_model: width of ``x`` (and of the output).
        num_heads, num_kv_heads, head_dim, qkv_bias, backend: as :class:`MultiHeadAttention`.
        encodings: built rotary/score/kernel encodings.
        kv_dim: width of ``memory`` (default ``d_model``).

    Shapes: ``forward(x [b, n_q, d_model], coords, memory [b, n_k, kv_dim], memory_coords)
    -> [b, n_q, d_model]``.

    Raises:
        ValueError: as :class:`MultiHeadAttention`, for ``x`` and for ``memory`` against
            ``memory_coords``' keys.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        encodings: Seq[Encoding] = (),
        *,
        kv_dim: int | None = None,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        qkv_bias: bool = True,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        head_dim = _head_dim(d_model, num_heads, head_dim)
        kv_dim = d_model if kv_dim is None else _check_positive("kv_dim", kv_dim)
        self._setup(num_heads, num_kv_heads, head_dim, encodings, backend)
        self.d_model, self.kv_dim = d_model, kv_dim
        self.q_proj = nn.Linear(d_model, num_heads * head_dim, bias=qkv_bias)
        self.kv_proj = nn.Linear(kv_dim, 2 * self.num_kv_heads * head_dim, bias=qkv_bias)
        self.proj = nn.Linear(num_heads * head_dim, d_model)

    def forward(self, x: Tensor, coords: Coordinates, memory: Tensor,
                memory_coords: Coordinates) -> Tensor:
        pair = coords if isinstance(coords, Cross) else Cross(coords, memory_coords)
        self._check_x("x", x, self.d_model, pair.num_queries, "queries")
        self._check_x("memory", memory, self.kv_dim, pair.num_keys, "keys")
        if memory.shape[0] != x.shape[0]:
            raise ValueError(f"attention: x has batch {x.shape[0]} but memory {memory.shape[0]}")
        self._check_batch(x, pair)
        with forward_scope(pair):
            pair.prepare()
            q = rearrange(self.q_proj(x), "b s (h d) -> b h s d", h=self.num_heads)
            k, v = rearrange(self.kv_proj(memory), "b s (two h d) -> two b h s d", two=2,
                             h=self.num_kv_heads)
            q, k = self._rotate(q, k, pair)
            ctx = AttentionContext(pair, self.num_heads, self.head_dim, x.shape[0], x, q,
                                   self._expand_kv(k), self._expand_kv(v))
            out = self.attend(ctx)
        return self.proj(rearrange(out, "b h s d -> b s (h d)"))


def _softmax_scale(scores: Seq[ScoreEncoding], head_dim: int) -> float:
    """The first scale an encoding prescribes, else ``1/sqrt(h_d)`` (a loop, not ``next()`` on
    a generator: torch 2.5's compiler cannot trace the latter)."""
    for enc in scores:
        scale = enc.softmax_scale(head_dim)
        if scale is not None:
            return scale
    return 1.0 / math.sqrt(head_dim)


def _flex_mods(scores: Seq[ScoreEncoding], ctx: AttentionContext,
               tables: bool | None = None) -> list[ScoreMod]:
    """The ``score_mod`` terms for FlexAttention. On a GPU, learned terms that are a function of
    the relation alone on ``toeplitz`` coordinates (T5, KERPLE, learnable ALiBi slopes) are
    summed into one per-offset table ``[n_h, n_q + n_k − 1]`` built outside the kernel with
    ordinary autograd, and the kernel reads it once per pair. The kernel's gradient for a
    captured tensor is an atomic add per (query, key) pair into the slot it read: into T5's
    32 buckets × heads, every pair contends for a handful of addresses (90× the unbiased
    layer at n = 4,096); into ``2n − 1`` offsets per head the adds spread out.

    ``tables``: use the per-offset table (default: on CUDA only)."""
    table, mods = None, []
    coords = ctx.coords
    if tables is None:
        tables = ctx.q.device.type == "cuda"
    use_table = tables and getattr(coords, "toeplitz", False) is True
    if use_table:
        n_q, n_k = coords.num_queries, coords.num_keys
        relation = torch.arange(n_k - 1, -n_q, -1, device=ctx.q.device)
    for enc in scores:
        learned = any(p.requires_grad for p in enc.parameters())
        term = None
        if use_table and learned and enc.content_free and enc.additive:
            term = memoized(coords, ("relation_bias", id(enc), ctx.num_heads, n_q, n_k),
                            lambda enc=enc: enc.relation_bias(ctx, relation))
        if term is None:
            mods.append(enc.score_mod(ctx))
        else:
            table = term if table is None else table + term
    if table is not None:
        last_query = torch.full((), coords.num_queries - 1, device=ctx.q.device)
        mods.insert(0, _relation_mod(table.float().contiguous(), last_query))
    return mods


def _relation_mod(table: Tensor, last_query: Tensor) -> ScoreMod:
    """``score + table[h, kv_idx − q_idx + n_q − 1]``: entry ``s`` of the table is relation
    ``n_k − 1 − s``, and pair ``(q, k)`` has relation ``q + n_k − n_q − k``. ``n_q − 1`` is a
    0-d tensor, not an int, so that a new length is not a new compile."""

    def relation_table(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor,
                       kv_idx: Tensor) -> Tensor:
        return score + table[h, kv_idx - q_idx + last_query]

    return relation_table


def _bias(enc: ScoreEncoding, ctx: AttentionContext) -> Tensor:
    """The encoding's eager bias; content-free ones once per forward (shared by layers)."""
    if not enc.content_free:
        return enc.bias(ctx)
    key = ("bias", id(enc), ctx.num_heads, ctx.coords.num_queries, ctx.coords.num_keys)
    return memoized(ctx.coords, key, lambda: enc.bias(ctx))


#: default budget of one block of bias rows on the CPU path (bytes); ``MMPE_ATTN_BLOCK_BYTES``
#: overrides it.
BLOCK_BYTES = 1 << 28


def block_bytes() -> int:
    """Bytes one block of bias rows may take before SDPA runs block by block over queries."""
    return int(os.environ.get("MMPE_ATTN_BLOCK_BYTES", BLOCK_BYTES))


def _bias_bytes(ctx: AttentionContext, rows: int) -> int:
    return ctx.q.shape[0] * ctx.num_heads * rows * ctx.coords.num_keys * 4


def _large_mask(ctx: AttentionContext) -> bool:
    """Whether the coordinates' dense boolean mask (not SDPA's own causal one) would exceed
    :func:`block_bytes`: then SDPA runs block by block with each block's rows of the mask."""
    coords = ctx.coords
    if coords.mask_mod() is None or _plain_causal(coords):
        return False
    return (coords.batch_size or 1) * coords.num_queries * coords.num_keys > block_bytes()


def _check_memory(needed: int, what: str, ctx: AttentionContext) -> None:
    """Fail before allocating what this machine cannot hold, naming the size and alternatives."""
    if ctx.q.device.type != "cpu" or torch.compiler.is_compiling():
        return
    total = _physical_memory()
    if total and needed > total:
        raise MemoryError(
            f"attention: {what} for b={ctx.q.shape[0]}, n_h={ctx.num_heads}, "
            f"n_q={ctx.coords.num_queries}, n_k={ctx.coords.num_keys} need {needed / 2**30:.1f} "
            f"GiB, more than this machine's {total / 2**30:.1f} GiB; use the block-wise SDPA "
            "path (backend='sdpa' with softmax and additive terms), FlexAttention on a GPU "
            "(backend='flex'), or shorter sequences")


@functools.cache
def _physical_memory() -> int | None:
    """Bytes of physical memory (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _cast_bias(bias: Tensor, dtype: torch.dtype, mask: Tensor | None) -> Tensor:
    """The summed bias, masked pairs at ``-inf``, in the attention dtype. In bf16/fp16 the
    maximum over each row's allowed pairs is taken out first (softmax ignores it): a large bias
    (SwinV2's up to 16, FoX's long decays) then keeps its differences instead of losing
    |bias|·2⁻⁹ to rounding."""
    if mask is not None:
        bias = bias.masked_fill(~mask, float("-inf"))
    if dtype == bias.dtype or not dtype.is_floating_point or torch.finfo(dtype).bits > 16:
        return bias.to(dtype)
    top = bias.amax(dim=-1, keepdim=True).detach()
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    return (bias - top).to(dtype)


def _dense_mask(coords: Coordinates) -> Tensor | None:
    return memoized(coords, ("dense_mask",), coords.dense_mask)


def _only_causal(coords: Coordinates) -> bool:
    """On ``toeplitz`` coordinates: the mask is causality alone (no documents, no padding)."""
    return (getattr(coords, "causal", False) is True
            and getattr(coords, "document_ids", None) is None and coords.key_mask is None)


def _plain_causal(coords: Coordinates) -> bool:
    """A causal mask with nothing else: square, no cache, no documents, no padding, and every
    key's position its index (so the mask is SDPA's ``is_causal`` triangle)."""
    return (getattr(coords, "toeplitz", False) is True and _only_causal(coords)
            and coords.num_queries == coords.num_keys and coords.batch_size is None)


#: queries per block on the relation path where the block's bias is materialised (FIRE, packed
#: documents) and in its backward pass: ``[n_h, 64, n_k]`` blocks measured fastest on one core
#: from n = 2048 to 8192 (the blocks of the backward's five products stay in cache); capped by
#: ``MMPE_ATTN_BLOCK_BYTES``.
RELATION_BLOCK_ROWS = 64


class _RelationPlan:
    """Softmax attention with content-free score terms on ``toeplitz`` coordinates (CPU).

    Terms that depend on the relation alone (:meth:`ScoreEncoding.relation_bias`) are summed
    into one table over the ``n_q + n_k − 1`` offsets, with ``−inf`` on the offsets a causal
    mask removes; others come as :class:`~mmpe.encodings.base.CompactBias`. Queries are taken
    in blocks, each block's rows reversed so that its bias is a strided view of the table
    (:func:`~mmpe.encodings.base.toeplitz_rows`): SDPA's fused CPU kernel reads it with no
    ``n×n`` tensor, and a causal block stops at its last query's key. The backward pass
    (:class:`_RelationAttention`) recomputes each block's probabilities from the saved
    log-sum-exp and reduces the gradient of the scores onto the table (anti-diagonal sums) and
    the compact terms, instead of scattering an ``n×n`` gradient through an autograd graph.

    Equal to the other paths (tests/test_attention_fastbias.py compares against the math path,
    gradients included). Taken by :meth:`build` only where it applies; otherwise ``None``.
    """

    def __init__(self, ctx: AttentionContext, scale: float, table: Tensor,
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
    def build(cls, scores: Seq[ScoreEncoding], ctx: AttentionContext,
              scale: float) -> _RelationPlan | None:
        """The plan, or None where this path does not apply: not on the CPU, not float32/64,
        under ``torch.compile``, coordinates without ``toeplitz``, or a score term that reads
        the content or has neither a relation table nor a compact form."""
        coords, q = ctx.coords, ctx.q
        if (q.device.type != "cpu" or q.dtype not in (torch.float32, torch.float64)
                or torch.compiler.is_compiling() or getattr(coords, "toeplitz", False) is not True
                or not all(e.content_free and e.additive for e in scores)):
            return None
        n_q, n_k = coords.num_queries, coords.num_keys
        relation = torch.arange(n_k - 1, -n_q, -1, device=q.device)  # table index s = 0, 1 …
        table, compact = None, []
        for enc in scores:
            key = ("relation_bias", id(enc), ctx.num_heads, n_q, n_k)
            term = memoized(coords, key, lambda enc=enc: enc.relation_bias(ctx, relation))
            if term is None:
                key = ("compact_bias", id(enc), ctx.num_heads, n_q, n_k)
                term = memoized(coords, key, lambda enc=enc: enc.compact_bias(ctx))
                if term is None:
                    return None
                compact.append(term)
            else:
                table = term if table is None else table + term
        if table is None:
            table = torch.zeros(1, relation.shape[0], device=q.device)
        if getattr(coords, "causal", False) is True:  # the causal mask, folded into the table
            table = table.masked_fill(relation < 0, float("-inf"))
        table = table.to(q.dtype).contiguous()
        cap = max(1, block_bytes() // (q.shape[0] * ctx.num_heads * n_k * q.element_size()))
        return cls(ctx, scale, table, compact, min(RELATION_BLOCK_ROWS, cap), cap)

    def run(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Attention output ``[b, n_h, n_q, h_d]``."""
        tensors = [t for c in self.compact for t in c.tensors]
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, self.table, *tensors)):
            return _RelationAttention.apply(self, q, k, v, self.table, *tensors)
        return self.forward(q, k, v)[0]

    def blocks(self, rows: int) -> list[tuple[int, int, int]]:
        """``(start, stop, keys)`` of each block of ``rows`` queries: a causal block needs the
        keys up to its last query's only."""
        out = []
        for start in range(0, self.n_q, rows):
            stop = min(self.n_q, start + rows)
            out.append((start, stop, stop + self.n_k - self.n_q if self.causal else self.n_k))
        return out

    def bias(self, start: int, stop: int, keys: int, out: Tensor | None = None) -> Tensor:
        """Scores' additive term of queries ``stop−1 … start`` (reversed), ``[b', n_h', R, K]``
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
    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Output ``[b, n_h, n_q, h_d]`` and the log-sum-exp of each query's scores
        ``[b, n_h, n_q]``, block by block with SDPA's fused CPU kernel."""
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
    def backward(self, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                 d_out: Tensor, needs: Seq[bool]) -> tuple[Tensor | None, ...]:
        """Gradients w.r.t. ``q, k, v``, the table and the compact tensors (None where
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


class _RelationAttention(torch.autograd.Function):
    """Autograd of :class:`_RelationPlan`: saves ``q, k, v``, the output and the log-sum-exp
    (``O(n)``), not the scores. Its backward pass is not itself differentiable (no double
    backward: use ``backend="math"`` for gradient penalties through attention)."""

    @staticmethod
    def forward(fctx, plan: _RelationPlan, q: Tensor, k: Tensor, v: Tensor, table: Tensor,
                *tensors: Tensor) -> Tensor:
        out, lse = plan.forward(q, k, v)
        fctx.plan = plan
        fctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(fctx, d_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse = fctx.saved_tensors
        grads = fctx.plan.backward(q, k, v, out, lse, d_out, fctx.needs_input_grad[1:])
        return (None, *grads)


def _attend_block(q: Tensor, k: Tensor, v: Tensor, bias: Tensor,
                  scale: float) -> tuple[Tensor, Tensor]:
    """``softmax(q·kᵀ·scale + bias)·v`` and the log-sum-exp of each row, by the fused CPU kernel
    (a plain computation where this torch lacks it)."""
    if _FLASH_CPU is not None:
        return _FLASH_CPU(q, k, v, 0.0, False, attn_mask=bias, scale=scale)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale + bias
    lse = scores.logsumexp(-1)
    return torch.matmul((scores - lse[..., None]).exp(), v), lse


def _flash_cpu():
    """SDPA's fused CPU kernel with a float mask and its log-sum-exp (a private op: None where
    this torch has no such op, or one without ``attn_mask``)."""
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    try:
        return op if op is not None and "attn_mask" in str(op.default._schema) else None
    except AttributeError:
        return None


_FLASH_CPU = _flash_cpu()


def _block_mask(coords: Coordinates, device: torch.device):
    """The ``BlockMask`` of the coordinates' ``mask_mod``, built once per forward."""
    mask_mod = coords.mask_mod()
    if mask_mod is None:
        return None

    def build():
        if torch.compiler.is_compiling():
            from torch.nn.attention.flex_attention import create_block_mask

            return create_block_mask(mask_mod, coords.batch_size, None, coords.num_queries,
                                     coords.num_keys, device=device)
        return flex_compile.block_mask(mask_mod, coords.batch_size, coords.num_queries,
                                       coords.num_keys, device)

    return memoized(coords, ("block_mask", str(device)), build)


def _split_by_hook(
    encodings: Seq[Encoding],
) -> tuple[nn.ModuleList, nn.ModuleList, list[KernelEncoding]]:
    rotary, scores, kernels = nn.ModuleList(), nn.ModuleList(), []
    for enc in encodings:
        if isinstance(enc, RotaryEncoding):
            rotary.append(enc)
        elif isinstance(enc, ScoreEncoding):
            scores.append(enc)
        elif isinstance(enc, KernelEncoding):
            kernels.append(enc)
        else:
            raise ValueError(
                f"attention: {type(enc).__name__} (hook {getattr(enc, 'hook', '?')!r}) is not a "
                "rotary, score or kernel encoding; add input encodings to the embeddings"
            )
    return rotary, scores, kernels
