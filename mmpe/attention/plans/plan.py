"""What the CPU SDPA plans share: the interface the dispatch reads, and one autograd Function.

A plan ([relation][mmpe.attention.plans.relation], [grid][mmpe.attention.plans.grid],
[tiles][mmpe.attention.plans.tiles]) runs softmax attention block by block with SDPA's fused
CPU kernel, keeping each query's log-sum-exp (`O(n)`) instead of the scores; its backward pass
recomputes each block's probabilities from it. Each plan module offers the dispatch
([mmpe.attention.dispatch][]) three functions: `applies(scores, ctx)` (whether it can run the
call), `pays(scores, ctx)` (whether it beats the dense bias there) and `attend(scores, ctx,
scale)` (the output).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Protocol

import torch
from torch import Tensor


class Plan(Protocol):
    """One call's plan.
    `inputs` are the tensors its score terms depend on that may take a gradient (an offset table,
    parameters, positions): the autograd inputs besides `q, k, v`. A plan that reads its terms from
    itself ignores them in `forward`."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor,
                *inputs: Tensor) -> tuple[Tensor, Tensor]:
        """Output `[b, n_h, n_q, h_d]` and each query's log-sum-exp `[b, n_h, n_q]`."""
        ...

    def backward(self, q: Tensor, k: Tensor, v: Tensor, inputs: Seq[Tensor], out: Tensor,
                 lse: Tensor, d_out: Tensor, needs: Seq[bool]) -> tuple[Tensor | None, ...]:
        """Gradients w.r.t. `q, k, v` and each of `inputs` (None where `needs` is False)."""
        ...


class PlanAttention(torch.autograd.Function):
    """Autograd of a plan.

    Autograd of a [Plan][mmpe.attention.plans.plan.Plan]: saves `q, k, v`, the output and the
    log-sum-exp (`O(n)`), not the bias or the scores. The inputs are held as they are (a saved
    copy would not be the tensor `autograd.grad` must differentiate towards, which the tiles
    plan's pullbacks need; they are parameters, coordinate tensors or a small table, alive
    anyway). Not itself differentiable (no double backward: use `route="math"` for gradient
    penalties through attention)."""

    @staticmethod
    def forward(fctx, plan: Plan, q: Tensor, k: Tensor, v: Tensor, *inputs: Tensor) -> Tensor:
        out, lse = plan.forward(q, k, v, *inputs)
        fctx.plan, fctx.inputs = plan, inputs
        fctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(fctx, d_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse = fctx.saved_tensors
        grads = fctx.plan.backward(q, k, v, fctx.inputs, out, lse, d_out,
                                   fctx.needs_input_grad[1:])
        return (None, *grads)


def run_plan(plan: Plan, q: Tensor, k: Tensor, v: Tensor, *inputs: Tensor) -> Tensor:
    """The plan's output.

    The plan's output `[b, n_h, n_q, h_d]`: through [PlanAttention][mmpe.attention.plans.plan.PlanAttention]
    where a gradient is wanted, else its forward pass alone."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, *inputs)):
        return PlanAttention.apply(plan, q, k, v, *inputs)
    return plan.forward(q, k, v, *inputs)[0]
