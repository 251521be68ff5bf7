"""Learned absolute position embeddings (BERT, GPT)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmpe.coords.base import Coordinates
from mmpe.coords.capabilities import Positioned1D
from mmpe.encodings._positions import position_bound, table_positions
from mmpe.encodings.base import InputEncoding, PositionOutOfRangeError
from mmpe.registry import register


@register(
    "learned", hook="input", needs=(Positioned1D,), learnable=True, family="absolute",
    extrapolates=False, aliases=("learned_absolute",),
    paper="Devlin et al. 2019 (BERT); Radford et al. 2018/2019 (GPT, GPT-2)", context=("d_model", "max_len"))
class LearnedPE(InputEncoding):
    """A trainable vector per position, added to token embeddings (BERT; GPT).

    `P[p] = E[p]` with `E` an `[max_len, d_model]` table initialised N(0, 0.02²) as in
    GPT-2. The table has rows for positions `0 … max_len-1` only: a position past it has no
    embedding, so the method cannot extrapolate by construction.

    Args:
        d_model: embedding width.
        max_len: number of positions in the table (tokens).
        out_of_range: `"error"` (default) raises for positions `>= max_len`; `"clamp"`
            gives them the last row's embedding (an explicit, lossy choice).

    Shapes: `forward(coords) -> [s, d_model]` or `[b, s, d_model]`.

    Raises:
        ValueError: non-positive `d_model` or `max_len`, unknown `out_of_range`.
        PositionOutOfRangeError: (a `ValueError`) at forward, when a position is
            `>= max_len` and `out_of_range="error"`, instead of an index crash.
    """

    def __init__(self, d_model: int, max_len: int = 512, out_of_range: str = "error") -> None:
        super().__init__()
        if out_of_range not in ("error", "clamp"):
            raise ValueError(f"learned: out_of_range must be 'error' or 'clamp', got {out_of_range!r}")
        self.out_of_range = out_of_range
        if d_model <= 0:
            raise ValueError(f"learned: d_model must be > 0, got {d_model}")
        if max_len <= 0:
            raise ValueError(f"learned: max_len must be > 0 (tokens), got {max_len}")
        self.max_len = max_len
        self.table = nn.Parameter(torch.randn(max_len, d_model) * 0.02)

    def forward(self, coords: Coordinates) -> Tensor:
        self.check_coords(coords)
        pos = table_positions("learned", coords)
        if self.out_of_range == "clamp":
            return self.table[pos.clamp(max=self.max_len - 1)]
        top = position_bound(coords) - 1  # read once per coordinates object
        if top >= self.max_len:
            raise PositionOutOfRangeError(
                f"learned: position {top} is past the table of max_len={self.max_len} positions; "
                "learned absolute embeddings cannot extrapolate (build with a larger max_len)"
            )
        return self.table[pos]
