"""Learned tensors a `score_mod` captures, laid out so compiled FlexAttention can differentiate
them.

Inductor's FlexAttention backward produces the gradient of a captured tensor only as the
scatter of one indexing of it (`torch.ops.flex_lib.zeros_and_scatter`): a captured tensor that
requires grad and is read twice, or used without an index (a 0-d scalar multiplied in), fails
to lower ("Using multiple indexing operations …" / an `AssertionError` in
`process_joint_outputs`). These helpers give each learned value its own `[num_heads]` copy,
read once as `t[h]`; autograd outside the kernel sums the per-head gradients back.
"""

from __future__ import annotations

from torch import Tensor


def per_head(value: Tensor, num_heads: int) -> Tensor:
    """A 0-d `value` repeated per head, `[num_heads]` (a copy that back-propagates to `value`).

    Raises:
        ValueError: `value` is not 0-d.
    """
    if value.dim() != 0:
        raise ValueError(f"per_head: value must be 0-d, got shape {tuple(value.shape)}")
    return value.expand(num_heads).clone()


def per_head_units(t: Tensor, dim: int, num_heads: int) -> list[Tensor]:
    """The slices of `t` along `dim`, each a `[num_heads]` tensor: a 0-d slice repeated per head,
    a `[num_heads]` slice copied (copies, not views: a view's storage offset becomes symbolic
    under dynamic shapes, which the kernel's joint graph cannot trace).

    Raises:
        ValueError: a slice is neither 0-d nor `[num_heads]`.
    """
    out = []
    for unit in t.unbind(dim):
        if unit.dim() == 0:
            out.append(per_head(unit, num_heads))
        elif tuple(unit.shape) == (num_heads,):
            out.append(unit.clone())
        else:
            raise ValueError(f"per_head_units: slices of t along dim {dim} must be 0-d or "
                             f"[{num_heads}], got {tuple(unit.shape)}")
    return out
