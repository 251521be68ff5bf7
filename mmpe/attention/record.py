"""Attention weights of every attention call in a block, recorded for heatmaps.

```python
with mmpe.attention.record_attention() as weights:
    model(x, coords)
# weights[i]: [b, n_h, n_q, n_k] float32 on the CPU, one per attention call, in call order
# (a Transformer's layers in order)
```

Recording runs the math route (explicit scores, then softmax), which gives the same numbers as
the flex and sdpa routes (tests/attention/test_attention.py) but materialises `n_q × n_k` per head:
use it on short inputs. The math route refuses, before allocating, a call this process cannot
hold next to what the block already keeps (`mmpe.validation.check_memory`); `calls=` keeps a
subset of the calls and `query_stride=` every k-th query's row, to keep less.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from torch import Tensor

from mmpe.validation import check_int


@dataclass
class _Block:
    """One open `record_attention` block: what it keeps, and how many calls it has seen."""

    weights: list[Tensor]
    calls: frozenset[int] | None
    query_stride: int
    seen: int = field(default=0)


_ACTIVE: list[_Block] = []


def recording() -> bool:
    """Whether a [`record_attention`][mmpe.attention.record.record_attention] block is open."""
    return bool(_ACTIVE)


@contextmanager
def record_attention(calls: Collection[int] | None = None,
                     query_stride: int = 1) -> Iterator[list[Tensor]]:
    """Record the softmax weights of every attention call inside the block.

    Inside the block every attention call takes the math route and appends its softmax
    weights `[b, n_h, n_q, n_k]` (float32, detached, CPU; masked pairs 0) to the yielded list.

    Args:
        calls: which attention calls to keep, by their 0-based index in call order (a
            Transformer's layers, in order); None keeps every call.
        query_stride: keep every `query_stride`-th query's row, `[b, n_h, ⌈n_q/k⌉, n_k]` (rows
            still sum to 1): a downsampled map at `1/k` of the memory.

    Raises:
        TypeError: a call index or `query_stride` not an int.
        ValueError: `calls` not a collection (or an index < 0); `query_stride` < 1. At the
            attention call: a kernel encoding that replaces the softmax (stick-breaking): it
            has no softmax weights to record.
        MemoryError: (at the attention call) scores this process cannot hold now next to the
            weights already kept, with their size and the ways out.
    """
    check_int("record_attention", "query_stride", query_stride)
    if calls is not None:
        if isinstance(calls, (str, bytes)) or not isinstance(calls, Collection):
            raise ValueError(f"record_attention: calls must be a collection of call indices "
                             f"(ints >= 0) or None, got {calls!r}")
        for i in calls:
            check_int("record_attention", "calls", i, minimum=0)
        calls = frozenset(calls)
    block = _Block([], calls, query_stride)
    _ACTIVE.append(block)
    try:
        yield block.weights
    finally:
        _ACTIVE.remove(block)


def record(probs: Tensor) -> None:
    """Count a call and, where an open block keeps it, append `probs`.

    Count a call and, where the innermost open block keeps it, append `probs` (called by
    the math route)."""
    if not _ACTIVE:
        return
    block = _ACTIVE[-1]
    index, block.seen = block.seen, block.seen + 1
    if block.calls is not None and index not in block.calls:
        return
    kept = probs.detach().float().cpu()
    if block.query_stride > 1:  # a copy: a strided view would keep every row alive
        kept = kept[..., ::block.query_stride, :].clone()
    block.weights.append(kept)


def ways_out() -> str:
    """What a `record_attention` block too large for memory can do instead.

    What a `record_attention` block too large for memory can do instead (for the refusal
    of the math route's scores)."""
    held = sum(w.nbytes for block in _ACTIVE for w in block.weights)
    count = sum(len(block.weights) for block in _ACTIVE)
    return (f"record_attention already keeps {held / 2**30:.1f} GiB from {count} calls; record "
            "fewer tokens, a subset of the calls (record_attention(calls={0, 5})) or a "
            "downsampled map (record_attention(query_stride=8): every 8th query's row)")
