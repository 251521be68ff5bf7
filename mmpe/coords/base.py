"""The coordinate protocol: where each token sits, and how two tokens relate.

Every data type in mmpe is a coordinate system. An encoding asks its coordinates two
questions and never looks at the data type itself:

* ``query_positions`` / ``key_positions`` — per-token coordinates, shape ``[n, a]`` or
  ``[b, n, a]`` (``a`` axes). Input and rotary encodings read these.
* ``relation(q_idx, kv_idx, b)`` and ``distance(q_idx, kv_idx, b)`` — per pair, computed
  from *index tensors* that broadcast against each other. Score encodings read these. Because
  they take indices, the same call works inside a FlexAttention ``score_mod`` (scalar indices,
  no ``n×n`` tensor) and eagerly (broadcast ``[n, 1]`` and ``[1, n]`` index grids).

A new coordinate type subclasses :class:`Coordinates` and implements those members; every
registered encoding whose metadata lists its ``kind`` then works on it unchanged.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import Tensor

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


class Coordinates(ABC):
    """Base class of every coordinate system.

    Attributes:
        kind: the coordinate type name used in registry metadata (``"sequence"``, ``"grid"`` …).
        directed: whether :meth:`relation` carries a meaningful sign (query before/after key).
    """

    kind: str = ""
    directed: bool = False

    @property
    @abstractmethod
    def num_queries(self) -> int:
        """Number of query tokens ``n_q``."""

    @property
    def num_keys(self) -> int:
        """Number of key tokens ``n_k``: ``n_q`` in self-attention; a cached decoder has more."""
        return self.num_queries

    @property
    @abstractmethod
    def query_positions(self) -> Tensor:
        """Coordinates of the query tokens, ``[n_q, a]`` or ``[b, n_q, a]``."""

    @property
    def key_positions(self) -> Tensor:
        """Coordinates of the key tokens, ``[n_k, a]`` or ``[b, n_k, a]`` (the queries' by default)."""
        return self.query_positions

    @abstractmethod
    def relation(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Relative position of key ``kv_idx`` seen from query ``q_idx`` (signed where ``directed``).

        ``q_idx``, ``kv_idx`` and ``b`` are integer tensors that broadcast together; the
        result has their broadcast shape.
        """

    def distance(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """Non-negative distance between query ``q_idx`` and key ``kv_idx`` (float)."""
        return self.relation(q_idx, kv_idx, b).abs().to(torch.float32)

    def extent(self, q_idx: Tensor, b: Tensor | None = None) -> Tensor:
        """How far keys can lie from query ``q_idx`` (float, the distance's units).

        FIRE normalises distances by it: the query position ``i`` on a causal sequence, the
        diameter of the coordinate set elsewhere (grid diagonal, graph diameter, π on the sphere).
        """
        raise NotImplementedError(f"{type(self).__name__} does not define extent()")

    def mask_mod(self) -> MaskMod | None:
        """FlexAttention-style ``mask_mod(b, h, q_idx, kv_idx) -> bool`` (True = may attend), or None."""
        return None

    @property
    def device(self) -> torch.device:
        return self.query_positions.device

    @property
    def batch_size(self) -> int | None:
        """Batch size when positions differ per example, else None."""
        pos = self.query_positions
        return pos.shape[0] if pos.dim() == 3 else None

    def dense_mask(self) -> Tensor | None:
        """The :meth:`mask_mod` evaluated on all pairs, ``[b or 1, 1, n_q, n_k]`` bool, or None."""
        mod = self.mask_mod()
        if mod is None:
            return None
        b, h, q, k = index_grid(self.batch_size or 1, 1, self.num_queries, self.num_keys, self.device)
        return mod(b, h, q, k).expand(self.batch_size or 1, 1, self.num_queries, self.num_keys)


def index_grid(
    batch: int, heads: int, n_q: int, n_k: int, device: torch.device | str | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Broadcastable index tensors ``b [B,1,1,1]``, ``h [1,H,1,1]``, ``q [1,1,Q,1]``, ``k [1,1,1,K]``.

    Calling a ``score_mod`` or ``mask_mod`` with these evaluates it on every pair at once:
    this is how the eager (SDPA) path reuses the exact function FlexAttention compiles.
    """
    def ar(n: int, shape: tuple[int, ...]) -> Tensor:
        return torch.arange(n, device=device).view(shape)

    return (ar(batch, (batch, 1, 1, 1)), ar(heads, (1, heads, 1, 1)),
            ar(n_q, (1, 1, n_q, 1)), ar(n_k, (1, 1, 1, n_k)))
