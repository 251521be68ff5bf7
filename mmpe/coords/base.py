"""The coordinate protocol: where each token sits, and how two tokens relate.

Every data type in mmpe is a coordinate system. An encoding asks its coordinates two
questions and never looks at the data type itself:

* `query_positions` / `key_positions` — per-token coordinates, shape `[n, a]` or
  `[b, n, a]` (`a` axes). Input and rotary encodings read these.
* `relation(q_idx, kv_idx, b)` and `distance(q_idx, kv_idx, b)` — per pair, computed
  from *index tensors* that broadcast against each other. Score encodings read these. Because
  they take indices, the same call works inside a FlexAttention `score_mod` (scalar indices,
  no `n×n` tensor) and eagerly (broadcast `[n, 1]` and `[1, n]` index grids).

A new coordinate type subclasses [`Coordinates`][mmpe.coords.base.Coordinates] and implements the members of the
capabilities it offers ([`mmpe.coords.capabilities`][mmpe.coords.capabilities]); every registered encoding whose needs
those meet then works on it unchanged.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from mmpe.coords.capabilities import defines
from mmpe.validation import check_memory

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


_COORDINATE_TYPES: dict[str, type[Coordinates]] = {}


class RowBlock(NamedTuple):
    """Query rows of a call attended on their own coordinates.

    Query rows `lo … hi−1` of a call attended on the keys before `stop`, on `coords` (their
    own coordinates: those rows as queries, those keys); `checkpointed`: recomputed in the
    backward, so the block's mask and bias are not kept."""

    lo: int
    hi: int
    stop: int
    coords: Coordinates
    checkpointed: bool


def coordinate_types() -> dict[str, type[Coordinates]]:
    """Every coordinate class defined so far (mmpe's and users'), by `kind`."""
    return dict(_COORDINATE_TYPES)


class Coordinates(ABC):
    """Base class of every coordinate system: token counts, masks, batch and device.

    What an encoding may *ask* lives in the capabilities of [`mmpe.coords.capabilities`][mmpe.coords.capabilities]
    (`Metric`: `distance`/`extent`; `Directed`: `relation`/`causal`; `Positioned`:
    per-token positions; …). A subclass implements [`num_queries`][mmpe.coords.base.Coordinates.num_queries] and the members of the
    capabilities it offers, and every registered encoding whose needs those meet runs on it.

    Attributes:
        kind: a display name (`"sequence"`, `"grid"` …); also the key under which
            `coordinate_types` lists the class. Optional for user classes.
        supports_cache: whether the coordinates can describe a cached decoding step (keys
            before the queries: `num_keys = cache.length + num_queries`); attention refuses a
            key/value cache on coordinates without it. `Sequence` has it.
    """

    kind: str = ""
    supports_cache: bool = False

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("kind"):
            _COORDINATE_TYPES[cls.kind] = cls

    @property
    @abstractmethod
    def num_queries(self) -> int:
        """Number of query tokens `n_q`."""

    @property
    def num_keys(self) -> int:
        """Number of key tokens `n_k`: `n_q` in self-attention; a cached decoder has more."""
        return self.num_queries

    def prepare(self) -> None:
        """Compute lazily built tables now.

        Compute lazily built tables now (attention calls this before FlexAttention traces the
        score mods, which must only index tensors). The default has nothing to build."""
        return None

    @property
    def key_mask(self) -> Tensor | None:
        """`[n_k]` or `[b, n_k]` bool, True at real keys, where the keys are padded; or None.

        Cross-attention reads it to mask a padded key side.
        """
        return None

    def mask_mod(self) -> MaskMod | None:
        """FlexAttention-style `mask_mod(b, h, q_idx, kv_idx) -> bool` (True = may attend), or None."""
        return None

    def mask_key(self) -> tuple | None:
        """A hashable that determines `mask_mod` completely, or None.

        A hashable that determines `mask_mod` completely when the mask is a function of the
        sizes alone (a causal sequence with implicit positions), else None. Two coordinates
        with equal keys have the same mask, so its FlexAttention `BlockMask` is built once
        per process instead of once per forward. Override only where that holds exactly."""
        return None

    # --- what attention asks of the coordinates beyond positions: one spine for every call.
    # Ordinary coordinates hold all their keys on this process; sharded ones (mmpe.parallel)
    # override these members, and the attention code never asks which kind it has.

    def check_encodings(self, encodings: Iterable[Any], *, window: Any = None,
                        cache: Any = None) -> None:
        """Refuse what these coordinates cannot serve in one call.

        Refuse what these coordinates cannot serve in one call: nothing beyond each
        encoding's own `check_coords` on ordinary coordinates.

        Args:
            encodings: the built encodings of the call (input encodings from a model's forward).
            window: the layer's `LocalWindow`, or None.
            cache: the layer's `KVCache`, or None.

        Raises:
            ValueError: where an override refuses (e.g. `ContextParallelError` on a shard).
        """
        return None

    def step_keys(self, tokens: int) -> int:
        """The keys `tokens` new tokens of this process become.

        The keys `tokens` new tokens of this process become after
        [`gather_keys`][mmpe.coords.base.Coordinates.gather_keys]: `tokens` itself here."""
        return tokens

    def gather_keys(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of every token the queries attend to.

        Keys and values of every token the queries attend to, from this process's own
        `k`, `v` `[b, n_kv, s, h_d]`: the identity here (a shard all-gathers them)."""
        return k, v

    def row_blocks(self, batch: int, length_dependent: bool) -> list[RowBlock] | None:
        """Query rows attended separately, each on coordinates of its own, or None.

        Query rows attended separately, each on coordinates of its own, or None (every row
        at once, on these coordinates: the default).

        Args:
            batch: `b` of the call (a block's mask size grows with it).
            length_dependent: a rotation of the layer depends on the total key count (dynamic
                NTK, LongRoPE), so keys must not be cut.
        """
        return None

    @property
    def device(self) -> torch.device:
        """Where the coordinates' tensors live (from the positions when there are any, else CPU)."""
        if defines(self, "query_positions"):
            return self.query_positions.device  # type: ignore[attr-defined]
        return torch.device("cpu")

    @property
    def batch_size(self) -> int | None:
        """Batch size when positions differ per example, else None."""
        if defines(self, "query_positions"):
            pos = self.query_positions  # type: ignore[attr-defined]
            return pos.shape[0] if pos.dim() == 3 else None
        return None

    def dense_mask(self, start: int = 0, stop: int | None = None) -> Tensor | None:
        """The `mask_mod` evaluated on all pairs of a block of queries.

        The [`mask_mod`][mmpe.coords.base.Coordinates.mask_mod] evaluated on all pairs of queries `start … stop−1` (default:
        every query), `[b or 1, 1, rows, n_k]` bool, or None.

        Raises:
            MemoryError: the rows (and the int64 index pairs a mask compares) exceed what this
                process can allocate now (`mmpe.validation.check_memory`).
        """
        mod = self.mask_mod()
        if mod is None:
            return None
        stop = self.num_queries if stop is None else stop
        batch = self.batch_size or 1
        if not torch.compiler.is_compiling():  # traced sizes are symbolic: no guard on them
            # a bool per pair, and at its peak an int64 pair index the mask compares
            check_memory("Coordinates.dense_mask", batch * (stop - start) * self.num_keys * 9,
                         f"the mask's rows [b={batch}, 1, rows={stop - start}, "
                         f"n_k={self.num_keys}] bool",
                         self.device, "take it in blocks of rows (start=, stop=)")
        b, h, q, k = index_grid(batch, 1, self.num_queries, self.num_keys, self.device)
        return mod(b, h, q[:, :, start:stop], k).expand(batch, 1, stop - start, self.num_keys)


class StoredPositions(Coordinates):
    """Coordinates of one token set whose positions are stored.

    Coordinates of one token set whose positions are stored, `_pos` `[n, A]` or
    `[b, n, A]`: the queries' positions, and the keys' (self-attention)."""

    _pos: Tensor

    @property
    def num_queries(self) -> int:
        """Tokens per example `n`."""
        return self._pos.shape[-2]

    @property
    def query_positions(self) -> Tensor:
        """`[n, A]` or `[b, n, A]` positions (see the class)."""
        return self._pos

    @property
    def key_positions(self) -> Tensor:
        """The queries' positions (self-attention)."""
        return self._pos


def index_grid(
    batch: int, heads: int, n_q: int, n_k: int, device: torch.device | str | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Broadcastable index tensors `b [B,1,1,1]`, `h [1,H,1,1]`, `q [1,1,Q,1]`, `k [1,1,1,K]`.

    Calling a `score_mod` or `mask_mod` with these evaluates it on every pair at once:
    this is how the eager (SDPA) path reuses the exact function FlexAttention compiles.

    Raises:
        ValueError: a count that is not an int >= 0 (naming it).
    """
    for name, n in (("batch", batch), ("heads", heads), ("n_q", n_q), ("n_k", n_k)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"index_grid: {name} must be an int >= 0, got {n!r}")

    def ar(n: int, shape: tuple[int, ...]) -> Tensor:
        return torch.arange(n, device=device).view(shape)

    return (ar(batch, (batch, 1, 1, 1)), ar(heads, (1, heads, 1, 1)),
            ar(n_q, (1, 1, n_q, 1)), ar(n_k, (1, 1, 1, n_k)))


def distance_rows(coords: Coordinates, start: int, stop: int) -> Tensor:
    """The `distance` of queries `start … stop−1` to every key.

    The `distance` of queries `start … stop−1` to every key, `[b or 1, 1, stop−start,
    n_k]` float32, shared by the heads: from the coordinates' own eager `distance_rows(start,
    stop)` where they have one (`Points`, `Graph`: the same numbers in fewer passes), else
    `distance` on the rows' index grid (what a `score_mod` evaluates)."""
    rows = getattr(coords, "distance_rows", None)
    if rows is not None:
        return rows(start, stop)
    b, _, q, k = index_grid(coords.batch_size or 1, 1, coords.num_queries, coords.num_keys,
                            coords.device)
    return coords.distance(q[:, :, start:stop], k, b)


def safe_sqrt(x: Tensor) -> Tensor:
    """`√x` with gradient 0 (not NaN) at 0.

    `√x` for `x ≥ 0` with gradient 0 (not NaN) where `x == 0`: the distance of a point to
    itself, or of two coincident points, differentiated in their positions."""
    positive = x > 0
    return torch.where(positive, torch.sqrt(torch.where(positive, x, torch.ones_like(x))),
                       torch.zeros_like(x))
