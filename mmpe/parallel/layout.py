"""Which tokens each rank of a context group holds: the two layouts.

`contiguous`: rank `r` of `W` holds tokens `r·n/W … (r+1)·n/W − 1`. `balanced` (the "zigzag"
or head–tail layout of Llama 3's context parallelism, Dubey et al. 2024, §3.3.2): the sequence
is cut into `2W` chunks and rank `r` holds chunks `r` and `2W−1−r`, so under a causal mask
every rank has the same number of allowed (query, key) pairs (a contiguous layout gives the
last rank `2W−1` times the first rank's work).
"""

from __future__ import annotations

import torch
from torch import Tensor

LAYOUTS = ("contiguous", "balanced")


def check_layout(layout: object) -> str:
    """`layout` if it is one of `LAYOUTS`.

    Raises:
        ValueError: any other value (naming the two).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"context parallel: layout must be one of {LAYOUTS}, got {layout!r}")
    return layout  # type: ignore[return-value]


def chunks_per_rank(layout: str) -> int:
    """Chunks a rank holds: 1 (`contiguous`) or 2 (`balanced`)."""
    return 1 if check_layout(layout) == "contiguous" else 2


def shard_index(n: int, world_size: int, rank: int, layout: str = "contiguous",
                device: torch.device | str | None = None) -> Tensor:
    """Global indices of the tokens rank `rank` holds, `[n / W]` int64, ascending.

    Args:
        n: tokens of the whole sequence (a multiple of `W`, or of `2W` for `balanced`).
        world_size: ranks `W` of the context group (> 0).
        rank: this rank, `0 … W−1`.
        layout: `"contiguous"` or `"balanced"` (see the module docstring).
        device: where the indices live.

    Raises:
        ValueError: `n` not a multiple of the chunk count, a rank outside `0 … W−1`, an
            unknown layout.
    """
    chunks = chunks_per_rank(layout) * world_size
    for name, value in (("n", n), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"context parallel: {name} must be a positive int, got {value!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"context parallel: rank must be in 0 … {world_size - 1}, got {rank!r}")
    if n % chunks:
        raise ValueError(f"context parallel: the sequence has n={n} tokens, which the "
                         f"{layout!r} layout cannot split over {world_size} ranks: n must be a "
                         f"multiple of {chunks} ({'2·' if layout == 'balanced' else ''}world "
                         "size); pad the batch")
    return torch.cat([torch.arange(start, start + size, device=device)
                      for start, size in shard_spans(n, world_size, rank, layout)])


def shard_spans(n: int, world_size: int, rank: int, layout: str) -> list[tuple[int, int]]:
    """The `(start, length)` of each chunk rank `rank` holds, in order.

    `(start, length)` of each chunk rank `rank` holds, in order (host integers: no device
    read); `n` as checked by `shard_index`."""
    chunks = chunks_per_rank(layout) * world_size
    size = n // chunks
    held = [rank] if layout == "contiguous" else [rank, chunks - 1 - rank]
    return [(c * size, size) for c in held]


def gather_order(n: int, world_size: int, layout: str,
                 device: torch.device | str | None = None) -> Tensor | None:
    """The permutation that puts the ranks' tokens back in sequence order, or None.

    The permutation that puts the ranks' tokens, concatenated in rank order, back in
    sequence order (`[n]` int64), or None where that order already is the sequence's
    (`contiguous`)."""
    if check_layout(layout) == "contiguous":
        return None
    held = torch.cat([shard_index(n, world_size, r, layout, device) for r in range(world_size)])
    return torch.argsort(held)
