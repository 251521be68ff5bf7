"""A cache of values derived from a module's weights, valid while the weights are unchanged.

The key is compared by value, not by `(data_ptr, _version)`: an update through `.data`
(an EMA / DINO / BYOL teacher: `t.data.mul_(m).add_(s.data, alpha=1 - m)`) bumps neither, and a
value keyed on them would outlive the weights it was derived from. The weights these caches
serve are small (a rotation's generators, a relative-position table), so a copy and an
element-wise comparison per hit cost far less than the transform they save.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor


class WeightsCache:
    """At most `size` values, each stored with a copy of the tensors it was derived from.

    `get(key, weights)` returns the value stored under `key` only while every tensor of
    `weights` equals (dtype, shape, device and values) its copy; `put` stores a new one
    (emptying the cache when it is full). Inference tensors are never stored: they have no
    version counter and cannot be saved for a later training forward.
    """

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._entries: dict[Hashable, tuple[tuple[Tensor, ...], object]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def get(self, key: Hashable, weights: Sequence[Tensor]) -> object | None:
        hit = self._entries.get(key)
        if hit is None or not _same(hit[0], weights):
            return None
        return hit[1]

    def put(self, key: Hashable, weights: Sequence[Tensor], value: object) -> None:
        leaves = value if isinstance(value, tuple) else (value,)
        if any(isinstance(t, Tensor) and t.is_inference() for t in (*leaves, *weights)):
            return
        if len(self._entries) >= self.size:
            self._entries.clear()
        self._entries[key] = (tuple(w.detach().clone() for w in weights), value)


def _same(saved: tuple[Tensor, ...], weights: Sequence[Tensor]) -> bool:
    if len(saved) != len(weights):
        return False
    return all(a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
               and torch.equal(a, b.detach()) for a, b in zip(saved, weights, strict=True))
