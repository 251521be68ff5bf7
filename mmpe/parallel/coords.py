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

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from mmpe._scratch import block_bytes
from mmpe.coords.base import Coordinates, MaskMod, RowBlock
from mmpe.coords.capabilities import defines
from mmpe.coords.sequence import Sequence
from mmpe.coords.views import view_class
from mmpe.parallel.collectives import gather_tokens, group_size_rank
from mmpe.parallel.layout import check_layout, shard_index, shard_spans
from mmpe.parallel.refusals import ContextParallelError

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
        world_size: the group's size `W`.
        rank: this process's rank in the group.
        spans: `(start, length)` of each contiguous chunk this rank holds.
    """

    view_prefix = "Sharded"
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

    # --- what a shard changes in the attention call (see Coordinates' members) ---

    def check_encodings(self, encodings: Iterable[Any], *, window: Any = None,
                        cache: Any = None) -> None:
        """Refuse, by name and with the reason, what a shard cannot run.

        Refuse, by name and with the reason, what a shard cannot run: a key/value cache, a
        local window, an encoding that declares a
        [`shard_refusal`][mmpe.encodings.base.Encoding.shard_refusal], and one whose needs a
        shard does not offer (per-token layout tables).

        Raises:
            ContextParallelError: naming the encoding or the setting, and why.
        """
        if cache is not None:
            raise ContextParallelError("context parallel: cache must be None (cached decoding "
                                       "runs on one device; unshard the prompt's outputs first)")
        if window is not None:
            raise ContextParallelError("context parallel: a local window (LocalWindow) is not "
                                       "supported on a shard: its mask reads query indices")
        for enc in encodings:
            name = getattr(enc, "registry_name", type(enc).__name__)
            reason = getattr(type(enc), "shard_refusal", None)
            if reason:
                raise ContextParallelError(f"context parallel: {name} is refused: {reason}")
            try:
                enc.check_coords(self)
            except (TypeError, ValueError) as err:
                raise ContextParallelError(f"context parallel: {name} cannot run on a shard: "
                                           f"{err}") from err

    def step_keys(self, tokens: int) -> int:
        """Every token of the sequence `n`, once a rank's `n/W` tokens are gathered."""
        return self.full.num_keys

    def gather_keys(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Every rank's keys and values in sequence order.

        Every rank's keys and values in sequence order, `[b, n_kv, n, h_d]` from this
        rank's `[b, n_kv, n/W, h_d]` (differentiable: a key's gradient is summed back onto
        the rank that owns it)."""
        return (gather_tokens(k, 2, self.group, self.layout),
                gather_tokens(v, 2, self.group, self.layout))

    def row_blocks(self, batch: int, length_dependent: bool) -> list[RowBlock] | None:
        """The rank's queries in causal chunks, each on a `Sequence` of its own.

        On a plain causal `Sequence` (implicit positions, no documents or padding): per
        contiguous chunk of the rank's queries, `Sequence(c, offset=start, causal=True)` —
        the key/value cache's coordinates, queries `start … start+c−1` after the keys before
        them — with the keys cut at `stop = start + c` (later keys are masked): the routes see
        what a cached prefill step is, and offset terms keep their `O(n)` forms. A chunk whose
        `c × stop` mask would pass the block budget (`MMPE_ATTN_BLOCK_BYTES`) is cut into
        blocks of rows, each recomputed in the backward, so no rank holds an `n/W × n` mask.
        None elsewhere (the pairwise members answer at global indices), and where a rotation
        depends on the total length (the cut keys would change it)."""
        full = self.full
        if type(full) is not Sequence or full.mask_key() is None or length_dependent:
            return None
        out, lo = [], 0
        for start, c in self.spans:
            # a block's boolean mask rows (and SDPA's float copy) within the block budget
            rows = max(1, block_bytes() // (8 * batch * (start + c)))
            blocked = rows < c
            step = rows if blocked else c
            for r in range(0, c, step):
                size = min(step, c - r)
                part = Sequence(size, offset=start + r, causal=True, device=full.device)
                out.append(RowBlock(lo + r, lo + r + size, start + r + size, part, blocked))
            lo += c
        return out

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


def _sharded_members(full_type: type) -> dict[str, Any]:
    """The members a shard of `full_type` coordinates offers: exactly the pairwise and
    positional ones `full_type` defines, answered by the whole sequence's."""
    members: dict[str, Any] = {}
    for name in _QUERY_FIRST:
        if defines(full_type, name):
            members[name] = _query_member(name)
    for name in _GLOBAL:
        if defines(full_type, name):
            members[name] = _global_member(name)
    if defines(full_type, "query_positions"):
        members["query_positions"] = property(_query_positions)
    return members


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
    view = view_class(ShardedCoords, type(coords), _sharded_members, inherit=False)
    return view(coords, index, group, layout, world, rank)


def unshard(x: Tensor, coords: ShardedCoords, dim: int = 1) -> Tensor:
    """Every rank's tokens of `x` in sequence order.

    Every rank's tokens of `x` in sequence order (differentiable; for evaluation, losses
    over the whole sequence, or checks).

    Shapes: `x [..., n/W, ...]` along `dim` -> `[..., n, ...]`.

    Raises:
        TypeError: `coords` not `ShardedCoords`.
        ValueError: `x` without `n/W` entries along `dim`.
    """
    _check_unshard(x, coords, dim)
    return gather_tokens(x, dim, coords.group, coords.layout)


def _check_unshard(x: Tensor, coords: ShardedCoords, dim: int) -> None:
    if not isinstance(coords, ShardedCoords):
        raise TypeError(f"context parallel: unshard needs the ShardedCoords of shard(...), got "
                        f"{type(coords).__name__}")
    if not isinstance(x, Tensor) or x.dim() == 0 or x.shape[dim] != coords.num_queries:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"context parallel: unshard: x must hold this rank's "
                         f"{coords.num_queries} tokens along dim {dim}, got {shape}")


def unshard_for_loss(x: Tensor, coords: ShardedCoords, dim: int = 1) -> Tensor:
    """Every rank's tokens of `x` in sequence order, for a loss every rank computes.

    Every rank's tokens of `x` in sequence order, for a loss that **every rank** computes
    alike over the whole sequence (a sequence-level objective, a global normalisation).

    With [`unshard`][mmpe.parallel.coords.unshard] such a loss counts `W` times: each of the
    `W` ranks' identical losses sends its gradient to every token's owner, so after
    [`reduce_gradients`][mmpe.parallel.collectives.reduce_gradients] every gradient is `W ×`
    the unsharded one. Here the backward keeps this rank's own rows of its (identical)
    gradient, once: `loss(unshard_for_loss(out, sharded)).backward()` then
    `reduce_gradients(model, group)` gives the unsharded model's gradients.

    Shapes: `x [..., n/W, ...]` along `dim` -> `[..., n, ...]`.

    Raises:
        TypeError: `coords` not `ShardedCoords`.
        ValueError: `x` without `n/W` entries along `dim`.
    """
    _check_unshard(x, coords, dim)
    return _OwnRows.apply(x, coords, dim % x.dim())


class _OwnRows(torch.autograd.Function):
    """Forward: the gathered `full`; backward: this rank's rows of the gradient (the loss is
    the same on every rank, so its gradient is too)."""

    @staticmethod
    def forward(ctx, x: Tensor, coords: ShardedCoords, dim: int) -> Tensor:  # noqa: D102
        ctx.index, ctx.dim = coords.index.to(x.device), dim
        return gather_tokens(x, dim, coords.group, coords.layout)

    @staticmethod
    def backward(ctx, grad: Tensor):  # noqa: D102
        return grad.index_select(ctx.dim, ctx.index), None, None
