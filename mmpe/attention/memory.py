"""Memory of the CPU attention paths: the budget of one block of bias rows, and a guard that
fails before allocating what the machine cannot hold."""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # an annotation only: importing the encodings here would be circular
    from mmpe.encodings.base import AttentionContext

# the budget sits low in the package: encodings bound their per-pair features by it too
from mmpe._scratch import BLOCK_BYTES, block_bytes  # noqa: E402, F401


def bias_row_bytes(ctx: AttentionContext, rows: int) -> int:
    """Bytes of `rows` query rows of the call's dense float32 bias, `[b, n_h, rows, n_k]`."""
    return ctx.q.shape[0] * ctx.num_heads * rows * ctx.coords.num_keys * 4


def check_memory(needed: int, what: str, ctx: AttentionContext) -> None:
    """Fail before allocating what this machine cannot hold now (its available memory, or its
    physical memory where the OS does not say), naming the size and alternatives."""
    if ctx.q.device.type != "cpu" or torch.compiler.is_compiling():
        return
    free = _available_memory()
    if free and needed > free:
        raise MemoryError(
            f"attention: {what} for b={ctx.q.shape[0]}, n_h={ctx.num_heads}, "
            f"n_q={ctx.coords.num_queries}, n_k={ctx.coords.num_keys} need {needed / 2**30:.1f} "
            f"GiB, more than the {free / 2**30:.1f} GiB this machine has free; use the "
            "block-wise SDPA path (backend='sdpa' with softmax and additive terms), "
            "FlexAttention on a GPU (backend='flex'), or shorter sequences")


def _available_memory() -> int | None:
    """Bytes the OS can give now (Linux `MemAvailable`), else the physical memory."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return _physical_memory()


@functools.cache
def _physical_memory() -> int | None:
    """Bytes of physical memory (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
