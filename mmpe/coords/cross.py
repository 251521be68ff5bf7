"""Coordinates for cross-attention: queries in one coordinate system, keys in another.

Text tokens attend to an image grid, DETR object queries to image features, a Perceiver's
latents to video tubelets, a decoder to its encoder. [`Cross`][mmpe.coords.cross.Cross] pairs the query side's
coordinates with the key side's and answers only what is defined between the two:

* **positions** (`Positioned`) when both sides have positions on the same number of axes
  *in one position space* — two coordinate objects of the same class (two sequences, two
  grids, two sphere point sets, M-RoPE ids on both sides), two point sets in the same
  `units`, or a pair registered with `register_cross_positions`: rotary encodings rotate
  `q` by the query side's positions and `k` by the key side's, so a score depends on
  `p_q − p_k`, a difference that means something only within one space. Unrelated systems
  (sphere radians → points in metres, grid cells → the sphere, token indices → metres) offer
  no positions, and a rotary encoding is refused naming both types;
* a **distance** (`Metric`) only when both sides live in one space — two sequences, two
  grids of the same axes, scale and metric, two sphere point sets, two point sets in the same
  units — so ALiBi, T5, FIRE … measure it; otherwise a distance-based score is refused by the
  ordinary capability check, naming `Metric`;
* a signed **relation** (`Directed`, never causal) between two sequences.

[`Latents`][mmpe.coords.cross.Latents] are tokens with no position at all (a Perceiver resampler's learned latents,
DETR's object queries): paired with anything, they offer no capability, so only encodings
that need none (NoPE) apply.

Register a distance between two more coordinate classes with `register_cross_distance`, and
a shared position space with `register_cross_positions`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from mmpe.coords.base import Coordinates, MaskMod, index_grid, safe_sqrt
from mmpe.coords.capabilities import Positioned

CrossDistance = Callable[[Coordinates, Coordinates, Tensor, Tensor, "Tensor | None"], Tensor]
_CROSS_DISTANCES: dict[tuple[type, type], CrossDistance] = {}
SameSpace = Callable[[Coordinates, Coordinates], bool]
# (query class, key class) -> a check that two such objects share one position space (None:
# always). Two objects of one class need no entry (they share a space unless an entry says).
_CROSS_POSITIONS: dict[tuple[type, type], SameSpace | None] = {}


def register_cross_distance(query_cls: type, key_cls: type, fn: CrossDistance) -> None:
    """Define the distance between a `query_cls` query and a `key_cls` key.

    `fn(queries, keys, q_idx, kv_idx, b)` returns a non-negative float32 tensor of the
    indices' broadcast shape, written with indexing and elementwise ops only (it runs inside
    FlexAttention). It may raise `ValueError` when the two objects are not in one space
    (e.g. grids of different scale); [`Cross`][mmpe.coords.cross.Cross] then offers no `Metric`.

    Raises:
        TypeError: a class that is not a `Coordinates` subclass, or `fn` not callable.
    """
    _check_pair("register_cross_distance", query_cls, key_cls)
    if not callable(fn):
        raise TypeError(f"register_cross_distance: fn must be callable, got {fn!r}")
    _CROSS_DISTANCES[(query_cls, key_cls)] = fn


def _check_pair(where: str, query_cls: object, key_cls: object) -> None:
    for arg, cls in (("query_cls", query_cls), ("key_cls", key_cls)):
        if not (isinstance(cls, type) and issubclass(cls, Coordinates)):
            raise TypeError(f"{where}: {arg} must be a Coordinates subclass, got {cls!r}")


def register_cross_positions(query_cls: type, key_cls: type,
                             same_space: SameSpace | None = None) -> None:
    """Declare that `query_cls` queries and `key_cls` keys have positions in one space.

    `Cross` then offers their positions (`Positioned`) to rotary encodings, which score
    `p_q − p_k`. Two objects of the same class share a space by default; two classes do only
    once registered, since the difference of, say, radians on a sphere and metres in a point
    cloud means nothing.

    Args:
        query_cls: the query side's coordinate class.
        key_cls: the key side's coordinate class.
        same_space: `same_space(queries, keys)` is `False` for two objects of these classes
            that are not in one space after all (other units, other axes); `None`: always.

    Raises:
        TypeError: a class that is not a `Coordinates` subclass, or `same_space` neither
            callable nor None.
    """
    _check_pair("register_cross_positions", query_cls, key_cls)
    if same_space is not None and not callable(same_space):
        raise TypeError(f"register_cross_positions: same_space must be callable or None, got "
                        f"{same_space!r}")
    _CROSS_POSITIONS[(query_cls, key_cls)] = same_space


def _position_space_note(queries: Coordinates, keys: Coordinates) -> str | None:
    """`None` when the two sides' positions are in one space, else why not (both named)."""
    q_name, k_name = type(queries).__name__, type(keys).__name__
    for q_cls in type(queries).__mro__:
        for k_cls in type(keys).__mro__:
            if (q_cls, k_cls) in _CROSS_POSITIONS:
                check = _CROSS_POSITIONS[(q_cls, k_cls)]
                if check is None or check(queries, keys):
                    return None
                return (f"{queries!r} queries and {keys!r} keys are not in one position space "
                        "(other axes or units), so no positions to rotate q and k by")
    if type(queries) is type(keys):
        return None
    return (f"{q_name} queries and {k_name} keys have positions in unrelated coordinate "
            f"systems (a rotary encoding would score the difference of a {q_name} position and "
            f"a {k_name} position), so no positions; if they are one space, declare it with "
            f"mmpe.coords.register_cross_positions({q_name}, {k_name})")


class Latents(Coordinates):
    """`n` tokens without positions: a Perceiver's latents, DETR's object queries.

    Raises:
        ValueError: `n` not a positive int.
    """

    kind = "latents"

    def __init__(self, n: int, *, device: torch.device | str | None = None) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"Latents: n must be a positive int (tokens), got {n!r}")
        self.n = n
        self._device = torch.device(device) if device is not None else torch.device("cpu")

    @property
    def num_queries(self) -> int:
        return self.n

    @property
    def device(self) -> torch.device:
        return self._device

    def __repr__(self) -> str:
        return f"Latents({self.n})"


class Cross(Coordinates):
    """Queries on `queries`' tokens, keys on `keys`' tokens (see the module docstring).

    Args:
        queries: coordinates of the query tokens (their `num_queries` and query positions).
        keys: coordinates of the key tokens (their `num_keys` and key positions; a padded
            key side masks its padding through its `key_mask`).
        ignore_causal: cross-attention has no causal mask between two sequences, so causal
            coordinates on either side are refused; True drops the flag where it belongs to
            another attention (a decoder block passes its causal self-attention coordinates).

    Raises:
        TypeError: an argument that is not a [`Coordinates`][mmpe.coords.base.Coordinates].
        ValueError: batch sizes that differ between the two sides; causal coordinates on
            either side without `ignore_causal=True`.
    """

    kind = "cross"

    def __init__(self, queries: Coordinates, keys: Coordinates, ignore_causal: bool = False) -> None:
        for arg, c in (("queries", queries), ("keys", keys)):
            if not isinstance(c, Coordinates):
                raise TypeError(f"Cross: {arg} must be an mmpe Coordinates object, "
                                f"got {type(c).__name__}")
            if getattr(c, "causal", False) is True and not ignore_causal:
                raise ValueError(
                    f"Cross: {arg} are causal ({type(c).__name__}(..., causal=True)), but "
                    "cross-attention has no causal mask between two sequences; build them "
                    "with causal=False, or pass Cross(..., ignore_causal=True) where the flag "
                    "belongs to a self-attention (a decoder block's)")
        bq, bk = queries.batch_size, keys.batch_size
        if bq is not None and bk is not None and bq != bk:
            raise ValueError(f"Cross: the query side has batch {bq} but the key side {bk}")
        self.queries, self.keys = queries, keys
        self._batch = bq if bq is not None else bk
        notes = []  # why a capability is absent, shown by the encodings' capability check
        both_placed = isinstance(queries, Positioned) and isinstance(keys, Positioned)
        space_note = _position_space_note(queries, keys) if both_placed else None
        if both_placed and queries.num_axes == keys.num_axes and space_note is None:
            # Instance members: the capability check sees them on this object only.
            self.num_axes = queries.num_axes
            self.query_positions = queries.query_positions
            self.key_positions = keys.key_positions
        elif both_placed and space_note is None:
            notes.append(f"{type(queries).__name__} queries have positions on "
                         f"{queries.num_axes} axes, {type(keys).__name__} keys on "
                         f"{keys.num_axes}, so no positions")
        elif space_note is not None:
            notes.append(space_note)
        fn = _CROSS_DISTANCES.get((type(queries), type(keys)))
        if fn is None:
            notes.append(f"no distance is defined between {type(queries).__name__} "
                         f"queries and {type(keys).__name__} keys")
        elif not _same_space(fn, queries, keys):
            notes.append(f"{queries!r} and {keys!r} are not in one space (different "
                         "axes, scale or units), so no distance between them")
        else:
            self._distance_fn = fn
            self.distance = self._distance
            self.extent = self._extent
            self._extent_table: Tensor | None = None  # pairwise: built when asked
        from mmpe.coords.sequence import Sequence

        if type(queries) is Sequence and type(keys) is Sequence:
            self.relation = self._relation
            self.causal = False
        if notes:
            self.capability_note = "; ".join(notes)

    @property
    def num_queries(self) -> int:
        return self.queries.num_queries

    @property
    def num_keys(self) -> int:
        return self.keys.num_keys

    @property
    def batch_size(self) -> int | None:
        return self._batch

    @property
    def device(self) -> torch.device:
        return self.queries.device

    def prepare(self) -> None:
        """Build both sides' tables before FlexAttention traces a score mod.

        Both sides' tables, and each query's farthest key where a distance is defined
        (`extent`), before FlexAttention traces a score mod."""
        self.queries.prepare()
        self.keys.prepare()
        if getattr(self, "_distance_fn", None) is not None and self._extent_table is None:
            self._extent_table = self._farthest_key()

    @property
    def key_mask(self) -> Tensor | None:
        return self.keys.key_mask

    def mask_mod(self) -> MaskMod | None:
        """Masks the key side's padding (`keys.key_mask`); the query side is never masked."""
        valid = self.keys.key_mask
        if valid is None:
            return None
        if valid.dim() == 1:
            return lambda b, h, q_idx, kv_idx: valid[kv_idx]
        return lambda b, h, q_idx, kv_idx: valid[b, kv_idx]

    def _distance(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        return self._distance_fn(self.queries, self.keys, q_idx, kv_idx, b)

    def _extent(self, q_idx: Tensor, b: Tensor | None = None) -> Tensor:
        if self._extent_table is None:
            self._extent_table = self._farthest_key()
        table = self._extent_table  # [b or 1, n_q]: the farthest key of each query
        return table[0 if b is None or table.shape[0] == 1 else b, q_idx]

    def _farthest_key(self, pairs_per_block: int = 1 << 22) -> Tensor:
        """Each query's largest distance to a key, `[b or 1, n_q]`, in blocks of query rows
        (O(block) memory; the same per-pair distances as one `[n_q, n_k]` table)."""
        batch, n_q, n_k = self._batch or 1, self.num_queries, self.num_keys
        rows = max(1, pairs_per_block // max(1, batch * n_k))
        parts = []
        for start in range(0, n_q, rows):
            size = min(rows, n_q - start)
            b, _, q, k = index_grid(batch, 1, size, n_k, self.device)
            d = self._distance_fn(self.queries, self.keys, q + start, k,
                                  b if self._batch else None)
            parts.append(d.expand(batch, 1, size, n_k)[:, 0].amax(dim=-1))
        return torch.cat(parts, dim=-1)

    def _relation(self, q_idx: Tensor, kv_idx: Tensor, b: Tensor | None = None) -> Tensor:
        return self.queries.query_index(q_idx, b) - self.keys.key_index(kv_idx, b)

    def __repr__(self) -> str:
        return f"Cross(queries={self.queries!r}, keys={self.keys!r})"


def _same_space(fn: CrossDistance, queries: Coordinates, keys: Coordinates) -> bool:
    check = getattr(fn, "same_space", None)
    return True if check is None else bool(check(queries, keys))


def _per_axis(pos: Tensor, idx: Tensor, b: Tensor | None, axis: int) -> Tensor:
    column = pos[..., axis]
    if column.dim() == 1:
        return column[idx]
    return column[0 if b is None else b, idx]


def _euclidean(queries: Coordinates, keys: Coordinates, q_idx: Tensor, kv_idx: Tensor,
               b: Tensor | None = None) -> Tensor:
    qpos, kpos = queries.query_positions, keys.key_positions
    acc = None
    for a in range(qpos.shape[-1]):  # per axis: FlexAttention gathers scalars
        d = (_per_axis(qpos, q_idx, b, a) - _per_axis(kpos, kv_idx, b, a)).float()
        acc = d * d if acc is None else acc + d * d
    return safe_sqrt(acc)  # coincident query and key: gradient 0, not NaN


def _sequence_distance(queries, keys, q_idx, kv_idx, b=None) -> Tensor:
    return (queries.query_index(q_idx, b) - keys.key_index(kv_idx, b)).abs().to(torch.float32)


def _grid_distance(queries, keys, q_idx, kv_idx, b=None) -> Tensor:
    acc = None
    for a in range(queries.ndim):
        d = _per_axis(queries.query_positions, q_idx, None, a) - \
            _per_axis(keys.key_positions, kv_idx, None, a)
        d = d * d if queries.metric == "euclidean" else d.abs()
        if acc is None:
            acc = d
        else:
            acc = torch.maximum(acc, d) if queries.metric == "chebyshev" else acc + d
    dist = torch.sqrt(acc) if queries.metric == "euclidean" else acc
    prefix = queries.is_prefix(q_idx) | keys.is_prefix(kv_idx)
    return torch.where(prefix, torch.full_like(dist, queries.prefix_distance), dist)


_grid_distance.same_space = lambda q, k: (q.ndim == k.ndim and q.scale == k.scale  # type: ignore
                                          and q.metric == k.metric)


def _sphere_distance(queries, keys, q_idx, kv_idx, b=None) -> Tensor:
    from mmpe.coords.sphere import great_circle

    def take(values: Tensor, idx: Tensor) -> Tensor:
        return values[idx] if values.dim() == 1 else values[0 if b is None else b, idx]

    return great_circle(take(queries.lat, q_idx), take(queries.lon, q_idx),
                        take(keys.lat, kv_idx), take(keys.lon, kv_idx)).to(torch.float32)


def _points_same_space(q, k) -> bool:
    return q.num_axes == k.num_axes and q.units == k.units


def _register_shipped() -> None:
    from mmpe.coords.grid import Grid
    from mmpe.coords.points import Points
    from mmpe.coords.sequence import Sequence
    from mmpe.coords.sphere import Sphere

    register_cross_distance(Sequence, Sequence, _sequence_distance)
    register_cross_distance(Grid, Grid, _grid_distance)
    register_cross_distance(Sphere, Sphere, _sphere_distance)
    _euclidean_points = _wrap(_euclidean, _points_same_space)
    register_cross_distance(Points, Points, _euclidean_points)
    register_cross_positions(Points, Points, _points_same_space)


def _wrap(fn: CrossDistance, same_space: Callable[[Coordinates, Coordinates], bool]):
    def wrapped(queries, keys, q_idx, kv_idx, b=None):
        return fn(queries, keys, q_idx, kv_idx, b)

    wrapped.same_space = same_space  # type: ignore[attr-defined]
    return wrapped


_register_shipped()
