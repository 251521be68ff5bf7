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

import torch
from torch import Tensor


def randomized_positions(batch: int, length: int, max_len: int, *,
                         generator: torch.Generator | None = None,
                         device: torch.device | str | None = None) -> Tensor:
    """`[batch, length]` int64: per row a sorted sample of `length` distinct positions from
    `[0, max_len)`, uniform over all such subsets.

    Raises:
        ValueError: `batch` or `length` < 1, or `max_len < length` (the range must hold
            every token of the sequence: set `max_len` at least to the longest evaluation
            length).
    """
    for name, value in (("batch", batch), ("length", length), ("max_len", max_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"randomized_positions: {name} must be an int >= 1, got {value!r}")
    if max_len < length:
        raise ValueError(f"randomized_positions: max_len={max_len} is shorter than the sequence "
                         f"length {length}; the range of random positions must cover every token")
    # The `length` largest of max_len i.i.d. uniforms index a uniformly random subset.
    keys = torch.rand(batch, max_len, generator=generator, device=generator.device if generator else device)
    picked = keys.topk(length, dim=-1).indices
    return picked.sort(dim=-1).values.to(device) if device is not None else picked.sort(dim=-1).values
