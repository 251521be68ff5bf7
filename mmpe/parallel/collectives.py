"""Differentiable gathers over a context group: every rank's tokens in sequence order.

`torch.distributed.nn.functional.all_gather` is differentiable: its backward sends each
rank the sum, over the ranks, of the gradients of the copies of its tokens (a reduce-scatter;
on gloo torch emulates it with an all-to-all and a sum). A rank's K/V thus receive the
gradients of every rank's queries that attended to them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.nn.functional import all_gather

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


def gather_tokens(t: Tensor, dim: int, group: dist.ProcessGroup | None, layout: str) -> Tensor:
    """Every rank's `t` concatenated along `dim` in sequence order (differentiable).

    Shapes: `t [..., n/W, ...]` (the `dim` axis holds this rank's tokens) -> `[..., n, ...]`.
    """
    world, _ = group_size_rank(group)
    parts = all_gather(t.contiguous(), group=group or dist.group.WORLD)
    if torch.is_grad_enabled() and t.requires_grad:
        # The gradient of each part is a strided slice of the concatenation's; the gather's
        # backward on gloo (an all-to-all) sends such views wrongly (wrong input gradients in
        # the tests), so each part's gradient is made contiguous first.
        for part in parts:
            part.register_hook(torch.Tensor.contiguous)
    full = torch.cat(parts, dim=dim)
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
            dist.all_reduce(p.grad, group=group)
