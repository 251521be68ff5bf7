"""Differentiable gathers over a context group: every rank's tokens in sequence order.

mmpe's gather is its own autograd function rather than
`torch.distributed.nn.functional.all_gather`, whose backward on gloo scatters with the group
rank where a global rank is expected: on any group without global rank 0 (the context groups
of a data × context mesh) the first backward raises `Global rank 0 is not part of group`.
Here the backward sums the gradients of every rank's copies of a rank's tokens back onto it
with a reduce-scatter over the group where the backend has one (NCCL), and an all-reduce and
a slice where it does not (gloo): each rank's K/V receive the gradients of every query that
attended to them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from mmpe.parallel.layout import gather_order


def group_size_rank(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """`(W, r)` of `group` (None: the default group).

    Raises:
        RuntimeError: torch.distributed not initialised (naming `init_process_group`).
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("context parallel: torch.distributed is not initialised; call "
                           "torch.distributed.init_process_group (or run under Lightning's "
                           "ModelParallelStrategy) before sharding")
    return dist.get_world_size(group), dist.get_rank(group)


def _has_reduce_scatter(group: dist.ProcessGroup | None) -> bool:
    """Whether the group's backend implements reduce-scatter (gloo does not)."""
    return dist.get_backend(group) != "gloo"


class _AllGather(torch.autograd.Function):
    """`[W, *t.shape]`: every rank's `t` stacked in group-rank order; backward: each rank gets
    the sum over the ranks of its slice's gradient."""

    @staticmethod
    def forward(ctx, t: Tensor, group: dist.ProcessGroup | None) -> Tensor:  # noqa: D102
        ctx.group = group
        world, _ = group_size_rank(group)
        out = t.new_empty((world, *t.shape))
        dist.all_gather(list(out.unbind(0)), t.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # noqa: D102
        group = ctx.group
        grad = grad.contiguous()
        if _has_reduce_scatter(group):
            mine = grad.new_empty(grad.shape[1:])
            dist.reduce_scatter(mine, list(grad.unbind(0)), group=group)
            return mine, None
        dist.all_reduce(grad, group=group)
        return grad[dist.get_rank(group)].clone(), None


def gather_tokens(t: Tensor, dim: int, group: dist.ProcessGroup | None, layout: str) -> Tensor:
    """Every rank's `t` concatenated along `dim` in sequence order.

    Every rank's `t` concatenated along `dim` in sequence order (differentiable, on any
    subgroup of the world).

    Shapes: `t [..., n/W, ...]` (the `dim` axis holds this rank's tokens) -> `[..., n, ...]`.
    """
    world, _ = group_size_rank(group)
    dim = dim % t.dim()
    parts = _AllGather.apply(t, group)  # [W, ..., n/W, ...]
    full = parts.movedim(0, dim).flatten(dim, dim + 1)  # rank-major along dim
    order = gather_order(full.shape[dim], world, layout, device=full.device)
    return full if order is None else full.index_select(dim, order)


def reduce_gradients(module: torch.nn.Module, group: dist.ProcessGroup | None) -> None:
    """Sum every parameter's gradient over the context group, in place.

    A rank's loss covers its own tokens only, and the gathered K/V send every rank's share of a
    parameter's gradient back through the all-gather: the gradient of the whole sequence's loss
    is the sum of the ranks' (replicated parameters, as DDP reduces them over data ranks).
    """
    for p in module.parameters():
        if p.grad is not None:
            # an FSDP2 parameter's gradient is a DTensor: its local shard is summed (the
            # context ranks of one data rank hold the same shard)
            to_local = getattr(p.grad, "to_local", None)
            dist.all_reduce(to_local() if callable(to_local) else p.grad, group=group)
