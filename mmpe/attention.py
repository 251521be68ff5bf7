"""Multi-head attention that composes any list of positional encodings.

Rotary encodings rotate ``q`` and ``k``; score encodings are merged into one
FlexAttention ``score_mod``; a kernel encoding replaces the softmax. Three execution paths
give the same numbers:

* ``"flex"`` — ``torch.nn.attention.flex_attention`` with the composed ``score_mod`` and a
  ``BlockMask`` from the coordinates' ``mask_mod``: no ``n×n`` bias tensor, memory O(n) on a
  GPU. Compiled with ``torch.compile`` on CUDA.
* ``"sdpa"`` — ``scaled_dot_product_attention`` with the additive score terms evaluated on
  all pairs (the same functions, called on broadcast index grids) as ``attn_mask``.
* ``"math"`` — explicit ``q·kᵀ``, score mods, mask, kernel; needed by non-additive score mods
  with a non-softmax kernel, or value-side terms that need the probabilities.

``backend="auto"`` picks per device: on CUDA, flex when there are score terms or a mask (else
SDPA, whose flash kernels are fastest without a bias); on CPU, SDPA — measured on torch
2.13/2.15, FlexAttention has no backward pass on the CPU, its CPU kernel is 4–5× slower than
SDPA, and without a BlockMask its CPU scratch memory is O(n²).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence as Seq

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from mmpe.coords.base import Coordinates, index_grid
from mmpe.encodings.base import (
    AttentionContext,
    Encoding,
    KernelEncoding,
    RotaryEncoding,
    ScoreEncoding,
    ScoreMod,
)

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


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


class MultiHeadAttention(nn.Module):
    """Self-attention with positional encodings at the rotary, score and kernel hooks.

    Args:
        d_model: model width.
        num_heads: ``n_h``.
        encodings: built encodings (rotary, score, kernel; input encodings belong to the
            model's embedding, see :class:`mmpe.transformer.Transformer`). At most one kernel.
        head_dim: ``h_d``; defaults to ``d_model // num_heads``.
        qkv_bias: bias in the q/k/v projection.
        backend: ``"auto"``, ``"flex"``, ``"sdpa"`` or ``"math"`` (see the module docstring).

    Shapes: ``forward(x [b, s, d_model], coords) -> [b, s, d_model]``; ``coords`` gives
    ``n_q = s`` queries (and ``n_k = s`` keys: this module keeps no cache).

    Raises:
        ValueError: ``d_model`` not divisible by ``num_heads`` (with no ``head_dim``), an input
            encoding or more than one kernel in ``encodings``, an unknown ``backend``, or ``x``
            not ``[b, s, d_model]`` with ``s`` equal to the coordinates' token count.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        encodings: Seq[Encoding] = (),
        *,
        head_dim: int | None = None,
        qkv_bias: bool = True,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"attention: num_heads must be >= 1, got {num_heads}")
        if head_dim is None:
            if d_model % num_heads:
                raise ValueError(
                    f"attention: d_model={d_model} must be divisible by num_heads={num_heads}"
                )
            head_dim = d_model // num_heads
        if backend not in BACKENDS:
            raise ValueError(f"attention: backend must be one of {BACKENDS}, got {backend!r}")
        self.d_model, self.num_heads, self.head_dim, self.backend = d_model, num_heads, head_dim, backend
        self.qkv = nn.Linear(d_model, 3 * num_heads * head_dim, bias=qkv_bias)
        self.proj = nn.Linear(num_heads * head_dim, d_model)
        self.rotary, self.scores, kernels = _split_by_hook(encodings)
        if len(kernels) > 1:
            raise ValueError(f"attention: at most one kernel encoding, got {len(kernels)}")
        self.kernel = kernels[0] if kernels else None

    def forward(self, x: Tensor, coords: Coordinates) -> Tensor:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"attention: x must be [b, s, d_model={self.d_model}], got {tuple(x.shape)}")
        if x.shape[1] != coords.num_queries:
            raise ValueError(
                f"attention: x has s={x.shape[1]} tokens but coords has {coords.num_queries}"
            )
        coords.prepare()
        q, k, v = rearrange(self.qkv(x), "b s (three h d) -> three b h s d", three=3, h=self.num_heads)
        for rotary in self.rotary:
            q, k = rotary(q, k, coords)
        ctx = AttentionContext(coords, self.num_heads, self.head_dim, x.shape[0], x, q, k, v)
        out = self.attend(ctx)
        return self.proj(rearrange(out, "b h s d -> b s (h d)"))

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
            return "flex"
        additive = all(s.additive for s in self.scores)
        if self.backend == "sdpa":
            return "sdpa" if additive else "math"
        if device.type == "cuda" and self.scores:
            return "flex"
        return "sdpa" if additive else "math"

    def attend(self, ctx: AttentionContext) -> Tensor:
        """Attention output ``[b, n_h, n_q, h_d]`` for the context's (rotated) q, k, v."""
        assert ctx.q is not None and ctx.k is not None and ctx.v is not None
        scale = next((s for e in self.scores if (s := e.softmax_scale(ctx.head_dim)) is not None),
                     1.0 / math.sqrt(ctx.head_dim))
        path = self.path(ctx.q.device)
        if path == "flex":
            return self._flex(ctx, scale)
        if path == "sdpa":
            return self._sdpa(ctx, scale)
        return self._math(ctx, scale)

    def _flex(self, ctx: AttentionContext, scale: float) -> Tensor:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        score_mod = compose_score_mods([e.score_mod(ctx) for e in self.scores])
        mask_mod = ctx.coords.mask_mod()
        block_mask = None
        if mask_mod is not None:
            block_mask = create_block_mask(
                mask_mod, ctx.coords.batch_size, None, ctx.coords.num_queries,
                ctx.coords.num_keys, device=ctx.q.device,
            )
        fn = _compiled_flex() if ctx.q.device.type == "cuda" else flex_attention
        return fn(ctx.q, ctx.k, ctx.v, score_mod=score_mod, block_mask=block_mask, scale=scale)

    def _sdpa(self, ctx: AttentionContext, scale: float) -> Tensor:
        bias = None
        for enc in self.scores:
            term = enc.bias(ctx)
            bias = term if bias is None else bias + term
        mask = ctx.coords.dense_mask()
        if bias is not None:
            bias = bias.to(ctx.q.dtype)
            attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
        else:
            attn_mask = mask
        return F.scaled_dot_product_attention(ctx.q, ctx.k, ctx.v, attn_mask=attn_mask, scale=scale)

    def _math(self, ctx: AttentionContext, scale: float) -> Tensor:
        coords = ctx.coords
        scores = (ctx.q @ ctx.k.transpose(-2, -1)).float() * scale
        score_mod = compose_score_mods([e.score_mod(ctx) for e in self.scores])
        if score_mod is not None:
            b, h, qi, ki = index_grid(coords.batch_size or 1, ctx.num_heads, coords.num_queries,
                                      coords.num_keys, scores.device)
            scores = score_mod(scores, b, h, qi, ki)
        mask = coords.dense_mask()
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
