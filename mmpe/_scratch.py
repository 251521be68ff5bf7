"""Scratch blocks reused from one block of query rows to the next, in the tiles and checkpointed plans.

Each block of queries needs the same few multi-MB tensors (its distance rows, a term's rows for
every head). On the CPU a fresh one costs its page faults: a `[6, 256, 4096]` float32 block
took 6.0 ms to fill freshly and 2.0 ms to refill (Xeon with AVX-512, one thread), and with one
at every block and pass ALiBi's rows took 0.29 s of a 1.34 s step on a 4,096-node graph, 0.13 s
with the blocks kept. Inside `reuse_blocks()` (the tiles plan's loops), `block_empty` gives a
call site back the storage it had for the previous block — only where nothing else holds it
any more (no view, no autograd saved tensor), so a number a caller kept is never overwritten.
Outside that context, or where that cannot be checked, it is `torch.empty`.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

#: default budget of one block of bias rows in the sdpa route's block-wise plans (bytes); ``MMPE_ATTN_BLOCK_BYTES``
#: overrides it.
BLOCK_BYTES = 1 << 28


def block_bytes() -> int:
    """Bytes one block of bias rows may take before SDPA runs block by block over queries.

    Raises:
        ValueError: `MMPE_ATTN_BLOCK_BYTES` set to anything but a positive integer.
    """
    return int(positive_env("MMPE_ATTN_BLOCK_BYTES", BLOCK_BYTES, int, "a positive integer (bytes)"))


def positive_env(name: str, default: float, parse, expected: str) -> float:
    """The environment variable `name` read with `parse` (`default` when unset).

    Raises:
        ValueError: a value `parse` refuses or not > 0, naming the variable and `expected`.
    """
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = parse(text)
    except ValueError:
        value = None
    if value is None or not value > 0:
        raise ValueError(f"{name} must be {expected}, got {text!r}")
    return value


_local = threading.local()

#: torch's count of references to a storage (private; where absent, nothing is reused)
_use_count = getattr(torch._C, "_storage_Use_Count", None)


@contextmanager
def reuse_blocks() -> Iterator[None]:
    """Within this context `block_empty` reuses each call site's storage (per thread; nested
    contexts keep their own, and every block is released on exit)."""
    pools = getattr(_local, "pools", None)
    if pools is None:
        pools = _local.pools = []
    pools.append({})
    try:
        yield
    finally:
        pools.pop()


def _free(buf: Tensor) -> bool:
    """No tensor but the pool's own (and the storage handle made to ask) uses `buf`'s storage."""
    storage = buf.untyped_storage()
    return _use_count(storage._cdata) <= 2


def block_empty(owner: object, name: str, shape: Sequence[int], dtype: torch.dtype,
                device: torch.device) -> Tensor:
    """An uninitialised contiguous tensor of `shape`, as `torch.empty`; inside `reuse_blocks()`
    on the CPU, the storage that call site `name` of `owner` had before, where it is free and
    large enough.

    `owner` is the object the block serves (an encoding, the coordinates), so that two encodings
    of one layer never share a block."""
    if torch.compiler.is_compiling():  # (nothing to reuse in a traced graph; an id() there
        return torch.empty(shape, dtype=dtype, device=device)  # would guard on each object)
    pools = getattr(_local, "pools", None)
    device = torch.device(device)
    if not pools or device.type != "cpu" or _use_count is None:
        return torch.empty(shape, dtype=dtype, device=device)
    pool, numel, key = pools[-1], math.prod(shape), (id(owner), name)
    buf = pool.get(key)
    if buf is None or buf.dtype != dtype or buf.numel() < numel or not _free(buf):
        buf = pool[key] = torch.empty(numel, dtype=dtype, device=device)
    return buf[:numel].view(tuple(shape))
