"""Attention weights of every attention call in a block, recorded for heatmaps.

```python
with mmpe.attention.record_attention() as weights:
    model(x, coords)
# weights[i]: [b, n_h, n_q, n_k] float32 on the CPU, one per attention call, in call order
# (a Transformer's layers in order)
```

Recording runs the math path (explicit scores, then softmax), which gives the same numbers as
the flex and SDPA paths (tests/attention/test_attention.py) but materialises `n_q × n_k` per head: use it
on short inputs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor

_ACTIVE: list[list[Tensor]] = []


def recording() -> bool:
    """Whether a [`record_attention`][mmpe.attention.record.record_attention] block is open."""
    return bool(_ACTIVE)


@contextmanager
def record_attention() -> Iterator[list[Tensor]]:
    """Inside the block every attention call takes the math path and appends its softmax
    weights `[b, n_h, n_q, n_k]` (float32, detached, CPU; masked pairs 0) to the yielded list.

    Raises:
        ValueError: (at the attention call) a kernel encoding that replaces the softmax
            (stick-breaking): it has no softmax weights to record.
    """
    weights: list[Tensor] = []
    _ACTIVE.append(weights)
    try:
        yield weights
    finally:
        _ACTIVE.remove(weights)


def record(probs: Tensor) -> None:
    """Append `probs` to the innermost open block (called by the math path)."""
    if _ACTIVE:
        _ACTIVE[-1].append(probs.detach().float().cpu())
