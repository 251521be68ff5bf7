"""The one door to SDPA's private fused CPU kernels.

The one door to SDPA's private fused CPU kernels that return and take the log-sum-exp (the
relation, grid and tiles plans need it for their backward passes), with a plain computation
where this torch lacks them.

Both ops exist with the same schema from torch 2.5 (the floor) to 2.11:
``_scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, *, attn_mask,
scale) -> (out, logsumexp)`` and ``..._backward(grad_out, q, k, v, out, logsumexp, dropout_p,
is_causal, *, attn_mask, scale) -> (dq, dk, dv)``. A fully masked query row (every bias
``−inf``) gets output 0, log-sum-exp 0 and gradients 0 from the kernels; the plain computations
give the same.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _attend_block(q: Tensor, k: Tensor, v: Tensor, bias: Tensor,
                  scale: float) -> tuple[Tensor, Tensor]:
    """``softmax(q·kᵀ·scale + bias)·v`` and the log-sum-exp of each row, by the fused CPU kernel
    (a plain computation where this torch lacks it).

    Shapes: ``q [b, h, R, d]``, ``k, v [b, h, n, d]``, ``bias`` broadcastable to ``[b, h, R,
    n]`` in q's dtype (``−inf`` = masked) → ``out [b, h, R, d]``, ``lse [b, h, R]`` (float32 for
    float32/bf16 q, float64 for float64)."""
    if _FLASH_CPU is not None:
        return _FLASH_CPU(q, k, v, 0.0, False, attn_mask=_rows_contiguous(bias), scale=scale)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale + bias
    lse = scores.logsumexp(-1)
    # a fully masked row: lse −inf would make every probability NaN; the kernel gives 0 and 0
    lse = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    return torch.matmul((scores - lse[..., None]).exp(), v), lse


def _attend_block_backward(d_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                           lse: Tensor, bias: Tensor,
                           scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients ``(dq, dk, dv)`` of one block of [_attend_block][mmpe.attention.plans.flash._attend_block]
    (its ``out`` and ``lse`` given; the bias is a constant here), by the fused CPU kernel's
    backward (a plain computation where this torch lacks it). Shapes as ``_attend_block``'s;
    ``dk``, ``dv`` are those of this block's queries only (a caller sums them over blocks)."""
    if _FLASH_CPU_BACKWARD is not None:
        return _FLASH_CPU_BACKWARD(d_out, q, k, v, out, lse, 0.0, False,
                                   attn_mask=_rows_contiguous(bias), scale=scale)
    probs = (torch.matmul(q, k.transpose(-2, -1)) * scale + bias - lse[..., None].to(q.dtype)).exp()
    d_scores = probs * (torch.matmul(d_out, v.transpose(-2, -1))
                        - (d_out * out).sum(-1, keepdim=True))
    dq = torch.matmul(d_scores, k) * scale
    dk = torch.matmul(d_scores.transpose(-2, -1), q) * scale
    dv = torch.matmul(probs.transpose(-2, -1), d_out)
    return dq, dk, dv


def _rows_contiguous(bias: Tensor) -> Tensor:
    """The mask with unit stride along keys: torch 2.5's fused CPU kernel reads a mask whose
    last dimension is strided (a transposed view) as if it were contiguous, and returns wrong
    numbers without an error (fixed by torch 2.11). Broadcast (stride-0) leading dimensions are
    kept as they are; they are read correctly."""
    return bias if bias.stride(-1) == 1 or bias.shape[-1] == 1 else bias.contiguous()


def _flash_op(name: str):
    """A private SDPA CPU op that takes a float mask (None where this torch has no such op, or
    one without ``attn_mask``)."""
    op = getattr(torch.ops.aten, name, None)
    try:
        return op if op is not None and "attn_mask" in str(op.default._schema) else None
    except AttributeError:
        return None


def _flash_cpu():
    """SDPA's fused CPU kernel with a float mask and its log-sum-exp, or None."""
    return _flash_op("_scaled_dot_product_flash_attention_for_cpu")


_FLASH_CPU = _flash_cpu()
#: its backward pass, from the saved output and log-sum-exp (None where this torch lacks it).
_FLASH_CPU_BACKWARD = _flash_op("_scaled_dot_product_flash_attention_for_cpu_backward")
