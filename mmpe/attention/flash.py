"""The one door to SDPA's private fused CPU kernel that returns the log-sum-exp (the relation
paths need it for their backward pass), with a plain computation where this torch lacks it."""

from __future__ import annotations

import torch
from torch import Tensor


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
