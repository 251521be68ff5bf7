"""Memory of the sdpa route's plans and the math route.

Memory of the sdpa route's plans and the math route: the budget of one block of bias rows, and a guard that
fails before allocating what this process cannot hold (`mmpe.validation.check_memory`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mmpe import validation
from mmpe.attention import record

if TYPE_CHECKING:  # an annotation only: importing the encodings here would be circular
    from mmpe.encodings.base import AttentionCall

# the budget sits low in the package: encodings bound their per-pair features by it too
from mmpe._scratch import BLOCK_BYTES, block_bytes  # noqa: E402, F401


def bias_row_bytes(ctx: AttentionCall, rows: int) -> int:
    """Bytes of `rows` query rows of the call's dense float32 bias, `[b, n_h, rows, n_k]`."""
    return ctx.q.shape[0] * ctx.num_heads * rows * ctx.coords.num_keys * 4


def check_memory(needed: int, what: str, ctx: AttentionCall) -> None:
    """Fail before allocating what this process cannot hold now.

    Fail before allocating what this process cannot hold now, naming the size and the ways
    out (those of `record_attention` inside its block): `mmpe.validation.check_memory`, the
    one door of every `n × n` request.

    Raises:
        MemoryError: `needed` bytes exceed what this process can allocate now.
    """
    if torch.compiler.is_compiling():  # traced code is not checked; its message cannot trace
        return
    if record.recording():
        ways = record.ways_out()
    else:
        ways = ("use the sdpa route's block-wise plans (route='sdpa' with softmax and additive terms), "
                "FlexAttention on a GPU (route='flex'), or shorter sequences")
    validation.check_memory(
        "attention", needed, f"{what} for b={ctx.q.shape[0]}, n_h={ctx.num_heads}, "
        f"n_q={ctx.coords.num_queries}, n_k={ctx.coords.num_keys}", ctx.q.device, ways)
