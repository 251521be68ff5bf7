"""Position-derived tensors computed once per model forward and shared by every layer.

Rotary cos/sin tables, the eager bias of an encoding shared across layers, the dense mask and
the FlexAttention `BlockMask` depend only on the coordinates (and the encoding's parameters,
which do not change during a forward). `Transformer.forward` opens a [`forward_scope`][mmpe.prepare.forward_scope] on
its coordinates; inside it [`memoized`][mmpe.prepare.memoized] computes each such tensor once. Outside a scope
(a single attention call) it simply computes. The memo is dropped when the forward ends, so a
coordinates object reused across training steps never serves a tensor from an earlier step.
Under `torch.compile` the memo is bypassed: the traced graph shares the computation itself.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TypeVar

import torch

T = TypeVar("T")
_MEMO = "_mmpe_forward_memo"
_ENABLED = [True]


@contextmanager
def sharing(enabled: bool) -> Iterator[None]:
    """Turn the per-forward sharing on or off inside the block (benchmarks measure both)."""
    before, _ENABLED[0] = _ENABLED[0], bool(enabled)
    try:
        yield
    finally:
        _ENABLED[0] = before


def forward_scope(coords: Any) -> AbstractContextManager[None]:
    """Share [`memoized`][mmpe.prepare.memoized] values across the layers of one forward on `coords`.

    Nested scopes on the same object share the outer one's memo. Under `torch.compile` it is
    `nullcontext()` (the compiler shares common subexpressions itself; and torch 2.5 cannot
    trace a generator-based context manager).
    """
    if torch.compiler.is_compiling():
        return nullcontext()
    return _scope(coords)


@contextmanager
def _scope(coords: Any) -> Iterator[None]:
    owner = _MEMO not in coords.__dict__
    if owner:
        coords.__dict__[_MEMO] = {}
    try:
        yield
    finally:
        if owner:
            coords.__dict__.pop(_MEMO, None)


def memoized(coords: Any, key: Hashable, compute: Callable[[], T]) -> T:
    """`compute()`, once per key inside a [`forward_scope`][mmpe.prepare.forward_scope] on `coords`."""
    if torch.compiler.is_compiling() or not _ENABLED[0]:
        return compute()
    memo = coords.__dict__.get(_MEMO)
    if memo is None:
        return compute()
    if key not in memo:
        memo[key] = compute()
    return memo[key]
