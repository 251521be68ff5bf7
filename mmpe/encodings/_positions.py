"""Positions and shapes the rotary and table encodings share: `q`/`k` checks, the positions of
a cached decoder's newest keys, integer table rows (re-exported by `mmpe.encodings.base`)."""

from __future__ import annotations

import torch
from torch import Tensor

from mmpe.coords.base import Coordinates


def check_qk(name: str, q: Tensor, k: Tensor, head_dim: int | None = None,
             coords: Coordinates | None = None) -> None:
    """Validate rotary inputs `q` `[b, n_h, n_q, h_d]` and `k` `[b, n_kv, s_k, h_d]`.

    Rank 4; the same `b` and `h_d`; `n_h` a multiple of `n_kv` (grouped-query
    attention); with `coords`, `n_q` equal to its query count and `s_k` at most its key
    count (a cached decoder passes only the newest keys: they are the *last* `s_k` keys).

    Raises:
        ValueError: naming the argument and the expected shape.
    """
    for arg, t in (("q", q), ("k", k)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name}: {arg} must be [b, n_h, s, h_d] (rank 4), got {shape}")
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1] or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"{name}: q {tuple(q.shape)} and k {tuple(k.shape)} must share b and h_d, and q's "
            "heads must be a multiple of k's"
        )
    if head_dim is not None and q.shape[-1] != head_dim:
        raise ValueError(f"{name}: q and k must have h_d={head_dim}, got {q.shape[-1]}")
    if coords is not None:
        if q.shape[-2] != coords.num_queries:
            raise ValueError(f"{name}: q has {q.shape[-2]} tokens but the coordinates have "
                             f"{coords.num_queries} queries")
        if k.shape[-2] > coords.num_keys:
            raise ValueError(f"{name}: k has {k.shape[-2]} tokens but the coordinates have only "
                             f"{coords.num_keys} keys")


def position_bound(coords: Coordinates) -> int:
    """One more than the largest key position (1D coordinates), computed once per object.

    `Sequence` knows it without reading the device (`max_position`); for other coordinates
    the value is read once and remembered on the object, so the layers of a model share it
    instead of each stalling the device.
    """
    known = getattr(coords, "max_position", None)
    if isinstance(known, int):
        return known + 1
    memo = coords.__dict__.get("_mmpe_position_bound")
    if memo is None:
        memo = coords.__dict__["_mmpe_position_bound"] = int(coords.key_positions[..., 0].max()) + 1
    return memo


def rotary_positions(coords: Coordinates, k: Tensor) -> tuple[Tensor, Tensor]:
    """Positions `[.., n_q, a]` of the queries and `[.., s_k, a]` of the keys `k` holds.

    A cached decoder rotates only its new keys: they are the last `s_k` of the coordinates'
    keys, so the cache keeps keys already rotated at their own positions.
    """
    return coords.query_positions, newest_key_positions(coords, k.shape[-2])


def newest_key_positions(coords: Coordinates, n_keys: int | None) -> Tensor:
    """Positions `[.., n_keys, a]` of the last `n_keys` keys (all keys for None): the keys
    a cached step holds."""
    kpos = coords.key_positions
    return kpos if n_keys is None else kpos[..., kpos.shape[-2] - n_keys:, :]


def table_positions(name: str, coords: Coordinates) -> Tensor:
    """Query positions `[s]` or `[b, s]` of 1D coordinates as table rows (int64).

    Raises:
        ValueError: positions that are not integers (a learned table has one row per integer
            position; continuous positions need a functional encoding such as `sinusoidal`).
    """
    pos = coords.query_positions[..., 0]
    if pos.dtype.is_floating_point or pos.dtype == torch.bool:
        raise ValueError(f"{name}: a learned table needs integer positions, got {pos.dtype} "
                         "positions; use a functional encoding (sinusoidal, rope) instead")
    return pos.long()
