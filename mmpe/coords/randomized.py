"""Randomised positional encodings (Ruoss et al. 2023): train on positions of a longer range.

Ruoss, Delétang, Genewein, Grau-Moya, Csordás, Bennani, Legg, Veness, "Randomized Positional
Encodings Boost Length Generalization of Transformers" (ACL 2023), Section 3: for a training
sequence of `n` tokens, draw `n` distinct positions uniformly from `[0, L_max)` and sort
them; the model then sees every position up to `L_max` during training while keeping the
order of its tokens, so positions of sequences longer than the training ones are not new at
test time. Evaluation uses the ordinary positions `0 … n−1`.

The positions feed `Sequence` as `position_ids`, so the method
works with every encoding that reads positions from the coordinates (sinusoidal, learned with a
table of `L_max` rows, RoPE and its scalings, ALiBi, T5, FIRE, KERPLE …) and leaves those that
do not (NoPE, CoPE's contextual positions) unchanged.
"""

from __future__ import annotations

import operator

import torch
from torch import Tensor

#: keys drawn at once by the dense sampler (16 MiB of float32); longer ranges are sampled
#: by drawing positions until enough are distinct, in O(length) memory
_DENSE_KEYS = 1 << 22


def randomized_positions(batch: int, length: int, max_len: int, *,
                         generator: torch.Generator | None = None,
                         device: torch.device | str | None = None) -> Tensor:
    """Random sorted positions: `length` distinct ones per row from `[0, max_len)`.

    `[batch, length]` int64: per row a sorted sample of `length` distinct positions from
    `[0, max_len)`, uniform over all such subsets.

    Memory is O(batch · min(max_len, 2²²) + length): a range of 2³⁴ positions costs what its
    `length` positions cost. `batch`, `length` and `max_len` may be any integers (numpy's
    too).

    Raises:
        ValueError: `batch` or `length` < 1, or `max_len < length` (the range must hold
            every token of the sequence: set `max_len` at least to the longest evaluation
            length).
        TypeError: `generator` not a `torch.Generator` (or None).
    """
    batch, length, max_len = (_count(n, v) for n, v in
                              (("batch", batch), ("length", length), ("max_len", max_len)))
    if max_len < length:
        raise ValueError(f"randomized_positions: max_len={max_len} is shorter than the sequence "
                         f"length {length}; the range of random positions must cover every token")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError("randomized_positions: generator must be a torch.Generator or None, got "
                        f"{type(generator).__name__} (seed one: torch.Generator().manual_seed(s))")
    where = generator.device if generator is not None else device
    if max_len <= _DENSE_KEYS:
        rows = max(1, _DENSE_KEYS // max_len)
        parts = [_dense(min(rows, batch - start), length, max_len, generator, where)
                 for start in range(0, batch, rows)]
        out = torch.cat(parts)
    else:
        out = torch.stack([_sparse(length, max_len, generator, where) for _ in range(batch)])
    return out.to(device) if device is not None else out


def _count(name: str, value) -> int:
    try:
        number = operator.index(value)
    except TypeError:
        number = None
    if number is None or isinstance(value, bool) or number < 1:
        raise ValueError(f"randomized_positions: {name} must be an int >= 1, got {value!r}")
    return number


def _dense(rows: int, length: int, max_len: int, generator, device) -> Tensor:
    # The `length` largest of max_len i.i.d. uniforms index a uniformly random subset.
    keys = torch.rand(rows, max_len, generator=generator, device=device)
    return keys.topk(length, dim=-1).indices.sort(dim=-1).values


def _sparse(length: int, max_len: int, generator, device) -> Tensor:
    """The first `length` distinct values of an i.i.d. uniform stream over `[0, max_len)`:
    by symmetry a uniformly random subset (drawn in rounds of the number still missing)."""
    picked = torch.empty(0, dtype=torch.long, device=device)
    while picked.numel() < length:
        need = length - picked.numel()
        draw = torch.randint(0, max_len, (need,), generator=generator, device=device)
        # keep the new values in stream order, each once and not already picked
        fresh = draw[~torch.isin(draw, picked)]
        _, first = _first_occurrences(fresh)
        picked = torch.cat((picked, fresh[first]))
    return picked.sort().values


def _first_occurrences(values: Tensor) -> tuple[Tensor, Tensor]:
    """Distinct values and the sorted index of each one's first occurrence."""
    uniq, inverse = torch.unique(values, return_inverse=True)
    index = torch.arange(values.numel(), device=values.device)
    first = torch.full((uniq.numel(),), values.numel(), dtype=torch.long, device=values.device)
    first = first.scatter_reduce(0, inverse, index, reduce="amin")
    return uniq, first.sort().values
