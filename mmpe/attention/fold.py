"""The fold route: a causal ALiBi bias folded into `q` and `k`, run on the unbiased kernel.

ALiBi (Press et al. 2022, Train Short, Test Long, ICLR) adds `−m_h (p_i − p_j)` to the score of
query `i` and key `j` (positions `p`, in units of `distance_unit`). Where the mask allows only
keys at or before the query (a causal `Sequence`), that is `m_h·p_j − m_h·p_i`, and the row
term `−m_h·p_i`, the same for every key of a query, cancels in the softmax. What is left is a
product of a query-side factor and a key-side one, so one extra channel of `q` and `k` carries
it exactly: `q' = [q, m_h / scale]`, `k' = [k, p_j]` give `scale · q'·k' = scale · q·k +
m_h·p_j`. The call is then plain SDPA with the coordinates' mask alone — `is_causal` on a plain
causal sequence, the fused kernel on the CPU, cuDNN or flash on a GPU — with no bias tensor and
no `score_mod`. (FlashBias, Wu et al., NeurIPS 2025, runs attention biases on the fast kernels
by the same low-rank decomposition.) The slope sits on the query side, so the keys of grouped-
query heads and of a KV cache hold positions only, and a learnable slope gets its gradient
through its channel.

Precision. The kernel accumulates `q'·k'` in float32: the logit `m_h·p_j` is formed at the
magnitude of `m·p`, so its error is about `m·p_max·2⁻²⁴` (6e-5 at `m·p = 1024`; the softmax
of the true logits is matched to that). In bf16 and fp16 the factors are split into a high and
a low part each (`c = c_hi + c_lo`, `p = p_hi + p_lo`, four channels: `c_hi·p_hi + c_hi·p_lo +
c_lo·p_hi + c_lo·p_lo`), which holds positions below 2¹⁶ (bf16) exactly. The extra channels are
padded with zeros to a multiple of 8 (the fused kernels' head-dimension rule), `v` as well.

Refused (by name, [fold_refusal][mmpe.attention.fold.fold_refusal]): any term but ALiBi;
bidirectional coordinates (`−m|p_i − p_j|` is not a product of a query and a key factor);
coordinates other than a `Sequence`; explicit `position_ids` (they need not increase along the
sequence, so a causal pair may have `p_j > p_i`).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch
import torch.nn.functional as F
from torch import Tensor

from mmpe.attention.masks import kernel_mask_of, plain_causal
from mmpe.encodings.alibi import ALiBi
from mmpe.encodings.base import AttentionCall, ScoreEncoding

#: the largest `max(m_h / distance_unit) · p_max` the rule folds in float32 (logit error
#: about this times 2⁻²⁴: 6e-5)
FOLD_FP32_MAX_LOGIT = 2.0**10
#: positions a bf16 / fp16 high-and-low split holds exactly
_SPLIT_EXACT = {torch.bfloat16: 2**16, torch.float16: 2**22}


def fold_refusal(scores: Seq[ScoreEncoding], coords: object) -> str | None:
    """Why the terms cannot be folded into `q` and `k` on `coords`, or None where they can."""
    if not scores:
        return "no score term to fold"
    others = [type(s).__name__ for s in scores if type(s) is not ALiBi]
    if others:
        return f"only ALiBi folds into q and k; {others} do not"
    from mmpe.coords.sequence import Sequence

    if not isinstance(coords, Sequence):
        return f"ALiBi folds on a causal Sequence; the coordinates are {type(coords).__name__}"
    if not coords.causal:
        return ("bidirectional ALiBi, -m|p_i - p_j|, is not a product of a query factor and a "
                "key factor; only the causal bias folds")
    if coords.explicit_positions:
        return ("explicit position_ids need not increase along the sequence, so a causal pair "
                "may have p_j > p_i; the fold needs the implicit positions")
    return None


def fold_precise(scores: Seq[ScoreEncoding], coords: object, dtype: torch.dtype) -> bool:
    """Whether the folded logits meet the unfolded ones' precision in `dtype` (module doc)."""
    p_max = int(getattr(coords, "max_position", 0))
    if dtype in _SPLIT_EXACT:
        return p_max < _SPLIT_EXACT[dtype]
    if torch.compiler.is_compiling():  # the slopes' host read would break the graph
        return False
    steepest = max(float(s.slopes.detach().abs().max()) / s.distance_unit for s in scores)
    return steepest * p_max <= FOLD_FP32_MAX_LOGIT


def run_fold(scores: Seq[ScoreEncoding], ctx: AttentionCall, scale: float) -> Tensor:
    """The attention output `[b, n_h, n_q, h_d]` with the terms folded into `q` and `k`.

    Raises:
        ValueError: terms or coordinates the fold does not hold for (the reason named).
    """
    reason = fold_refusal(scores, ctx.coords)
    if reason is not None:
        raise ValueError(f"attention: route='fold': {reason}; use 'auto'")
    coords, q, k, v = ctx.coords, ctx.q, ctx.k, ctx.v
    q_extra, k_extra = [], []
    work = torch.promote_types(q.dtype, torch.float32)  # the factors before the split
    positions = coords.key_positions[..., 0].to(work)  # [n_k] or [b, n_k], tokens
    for enc in scores:
        factor = enc.slopes.to(work) / (enc.distance_unit * scale)  # [n_h]
        q_parts, k_parts = _split(factor, q.dtype), _split(positions, q.dtype)
        for c in q_parts:
            for p in k_parts:
                q_extra.append(c.view(1, -1, 1, 1).expand(q.shape[0], -1, q.shape[2], 1))
                k_extra.append(_key_channel(p, k))
    width = q.shape[-1] + len(q_extra)
    pad = -width % 8
    q2 = torch.cat([q, *q_extra, q.new_zeros(*q.shape[:-1], pad)], dim=-1)
    k2 = torch.cat([k, *k_extra, k.new_zeros(*k.shape[:-1], pad)], dim=-1)
    v2 = torch.cat([v, v.new_zeros(*v.shape[:-1], width + pad - v.shape[-1])], dim=-1)
    if plain_causal(coords):
        out = F.scaled_dot_product_attention(q2, k2, v2, is_causal=True, scale=scale)
    else:  # a cache, documents, padding or a window: the mask alone, no bias
        out = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=kernel_mask_of(coords, q.dtype),
                                             scale=scale)
    return out[..., :v.shape[-1]]


def _split(x: Tensor, dtype: torch.dtype) -> list[Tensor]:
    """`x` (float32 or float64) as parts in `dtype` that sum to it: one in float32/64, a high
    and a low part in bf16/fp16. Only the low part carries the gradient (the parts sum to
    `x`)."""
    if dtype not in _SPLIT_EXACT:
        return [x.to(dtype)]
    high = x.detach().to(dtype)
    return [high, (x - high.to(x.dtype)).to(dtype)]


def _key_channel(p: Tensor, k: Tensor) -> Tensor:
    """Positions `[n_k]` or `[b, n_k]` as a channel `[b, h_kv, n_k, 1]` of `k`."""
    p = p if p.dim() == 2 else p.unsqueeze(0)
    return p[:, None, :, None].expand(k.shape[0], k.shape[1], k.shape[2], 1)
