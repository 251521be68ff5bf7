"""A rank's view of sharded coordinates: its own tokens as queries, every token as keys.

The KV cache already taught mmpe's coordinates queries that are not the keys (`Sequence(s,
offset=p)`: `n_q = s` queries at positions `p … p+s−1`, `n_k = p + s` keys). Under context
parallelism a rank's queries are a subset of the keys that need not be the last ones (the
`balanced` layout holds two chunks), so [`ShardedCoords`][mmpe.parallel.coords.ShardedCoords]
generalises the offset to an index: query `i` of the rank is token `index[i]` of the whole
sequence, and every pairwise member (`relation`, `distance`, `extent`, the mask) answers with
the global coordinates' own member at `index[q_idx]`. The encodings see global positions and
global offsets and never know they run on a shard.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import Tensor

from mmpe.coords.base import Coordinates, MaskMod
from mmpe.coords.capabilities import defines
from mmpe.parallel.collectives import gather_tokens, group_size_rank
from mmpe.parallel.layout import check_layout, shard_index, shard_spans

#: pairwise members whose first argument is a query index: answered at `index[q_idx]`
_QUERY_FIRST = ("relation", "distance", "extent", "query_index", "offset", "offsets")
#: members read as they are (they describe the keys, i.e. the whole sequence)
_GLOBAL = ("causal", "num_axes", "key_positions", "max_position", "key_index", "metric", "axes")


class ShardedCoords(Coordinates):
    """The coordinates of one rank's tokens within the whole sequence's `coords`.

    Queries: the `n/W` tokens `index` of this rank (global positions); keys: all `n` tokens,
    which the attention gathers from the ranks of `group`. Built by
    [`shard`][mmpe.parallel.coords.shard], which picks a subclass offering exactly the
    pairwise and positional capabilities of `coords` (`Directed`, `Metric`, `Positioned`):
    per-token tables of the whole layout (`GridLayout`, graph spectra) are not offered, and an
    encoding that needs them is refused by its own capability check.

    Attributes:
        full: the whole sequence's coordinates.
        index: `[n/W]` int64 global token indices of this rank's queries (ascending).
        group: the context group (None: the default group).
        layout: `"contiguous"` or `"balanced"`.
        world_size, rank: of the group.
        spans: `(start, length)` of each contiguous chunk this rank holds.
    """

    supports_cache = False
    capability_note = ("sharded by mmpe.parallel: a rank offers the pairwise members and "
                       "positions of the whole sequence, not its per-token layout tables")

    def __init__(self, full: Coordinates, index: Tensor, group: dist.ProcessGroup | None,
                 layout: str, world_size: int, rank: int) -> None:
        self.full, self.index, self.group = full, index, group
        self.layout, self.world_size, self.rank = layout, world_size, rank
        #: `(start, length)` of the rank's contiguous chunks of the sequence (host integers)
        self.spans = shard_spans(full.num_queries, world_size, rank, layout)

    @property
    def num_queries(self) -> int:
        """This rank's tokens `n/W`."""
        return self.index.shape[0]

    @property
    def num_keys(self) -> int:
        """Every token of the sequence `n`."""
        return self.full.num_keys

    @property
    def batch_size(self) -> int | None:
        return self.full.batch_size

    @property
    def device(self):
        return self.full.device

    @property
    def key_mask(self) -> Tensor | None:
        return self.full.key_mask

    def prepare(self) -> None:
        self.full.prepare()

    def mask_mod(self) -> MaskMod | None:
        mod, index = self.full.mask_mod(), self.index
        if mod is None:
            return None

        def mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return mod(b, h, index[q_idx], kv_idx)

        return mask

    def take(self, x: Tensor, dim: int = 1) -> Tensor:
        """This rank's tokens of `x` (`x [..., n, ...]` along `dim` -> `[..., n/W, ...]`).

        Raises:
            ValueError: `x` without `n` entries along `dim`.
        """
        if not isinstance(x, Tensor) or x.dim() <= dim % max(x.dim(), 1) or \
                x.shape[dim] != self.full.num_queries:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"context parallel: take: x must hold the sequence's "
                             f"{self.full.num_queries} tokens along dim {dim}, got {shape}")
        return x.index_select(dim, self.index.to(x.device))

    def check_encodings(self, encodings: Any) -> None:
        """Refuse encodings that cannot run on a shard (see
        [`mmpe.parallel.attention.check_encodings`][mmpe.parallel.attention.check_encodings])."""
        from mmpe.parallel.refusals import check_encodings

        check_encodings(encodings, self)

    def context_parallel_attention(self, layer: Any, x: Tensor, cache: Any) -> Tensor:
        """What `MultiHeadAttention.forward` runs on these coordinates (see
        [`mmpe.parallel.attention`][mmpe.parallel.attention])."""
        from mmpe.parallel.attention import sharded_attention

        return sharded_attention(layer, x, self, cache)

    def __repr__(self) -> str:
        return (f"ShardedCoords({self.full!r}, rank={self.rank}/{self.world_size}, "
                f"layout={self.layout!r}, tokens={self.num_queries})")


def _query_member(name: str):
    def member(self, q_idx: Tensor, *args, **kwargs):
        return getattr(self.full, name)(self.index[q_idx], *args, **kwargs)

    member.__name__ = name
    member.__doc__ = f"The whole sequence's `{name}` at this rank's query `index[q_idx]`."
    return member


def _global_member(name: str):
    return property(lambda self: getattr(self.full, name),
                    doc=f"The whole sequence's `{name}`.")


def _query_positions(self) -> Tensor:
    """`[n/W, a]` or `[b, n/W, a]`: the global positions of this rank's tokens."""
    return self.full.query_positions.index_select(-2, self.index)


_CLASSES: dict[type, type[ShardedCoords]] = {}


def sharded_class(full_type: type) -> type[ShardedCoords]:
    """The `ShardedCoords` subclass offering the members `full_type` defines (one per type)."""
    if full_type not in _CLASSES:
        members: dict[str, Any] = {"__doc__": ShardedCoords.__doc__}
        for name in _QUERY_FIRST:
            if defines(full_type, name):
                members[name] = _query_member(name)
        for name in _GLOBAL:
            if defines(full_type, name):
                members[name] = _global_member(name)
        if defines(full_type, "query_positions"):
            members["query_positions"] = property(_query_positions)
        _CLASSES[full_type] = type(f"Sharded{full_type.__name__}", (ShardedCoords,), members)
    return _CLASSES[full_type]


def shard(coords: Coordinates, group: dist.ProcessGroup | None = None,
          layout: str = "contiguous") -> ShardedCoords:
    """This rank's share of `coords` over the context group `group`.

    Every rank of `group` calls it with the same `coords` (the whole sequence); each gets its
    tokens' global indices and positions. Pass the result where the coordinates went
    (`model(x_local, sharded)`, `MultiHeadAttention(x_local, sharded)`), with the rank's
    tokens `sharded.take(x)`; `unshard` gathers outputs back.

    Args:
        coords: self-attention coordinates of the whole sequence (`n_q = n_k = n`).
        group: the context group (None: the default group).
        layout: `"contiguous"` or `"balanced"` (causal masks: equal work per rank), see
            [`mmpe.parallel.layout`][mmpe.parallel.layout].

    Returns:
        a [`ShardedCoords`][mmpe.parallel.coords.ShardedCoords] with `n/W` queries and `n` keys.

    Raises:
        TypeError: `coords` not mmpe Coordinates.
        ValueError: coordinates with keys other than their queries (a cache step), `n` not
            divisible by the layout's chunk count, an unknown layout.
        RuntimeError: torch.distributed not initialised.
    """
    if not isinstance(coords, Coordinates):
        raise TypeError(f"context parallel: coords must be mmpe Coordinates, got "
                        f"{type(coords).__name__}")
    if isinstance(coords, ShardedCoords):
        raise ValueError("context parallel: coords are already sharded; shard the whole "
                         "sequence's coordinates once")
    check_layout(layout)
    if coords.num_keys != coords.num_queries:
        raise ValueError(f"context parallel: coords must be self-attention coordinates of the "
                         f"whole sequence (n_q = n_k), got n_q={coords.num_queries}, "
                         f"n_k={coords.num_keys} (a cached step cannot be sharded)")
    world, rank = group_size_rank(group)
    index = shard_index(coords.num_queries, world, rank, layout, device=coords.device)
    return sharded_class(type(coords))(coords, index, group, layout, world, rank)


def unshard(x: Tensor, coords: ShardedCoords, dim: int = 1) -> Tensor:
    """Every rank's tokens of `x` in sequence order (differentiable; for evaluation, losses
    over the whole sequence, or checks).

    Shapes: `x [..., n/W, ...]` along `dim` -> `[..., n, ...]`.

    Raises:
        TypeError: `coords` not `ShardedCoords`.
        ValueError: `x` without `n/W` entries along `dim`.
    """
    if not isinstance(coords, ShardedCoords):
        raise TypeError(f"context parallel: unshard needs the ShardedCoords of shard(...), got "
                        f"{type(coords).__name__}")
    if not isinstance(x, Tensor) or x.dim() == 0 or x.shape[dim] != coords.num_queries:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"context parallel: unshard: x must hold this rank's "
                         f"{coords.num_queries} tokens along dim {dim}, got {shape}")
    return gather_tokens(x, dim, coords.group, coords.layout)
