"""Abacus embeddings: a learned vector per digit place within a number (McLeish et al. 2024)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmpe.coords.base import Coordinates
from mmpe.coords.numbers import DigitPositioned
from mmpe.encodings.base import InputEncoding, PositionOutOfRangeError
from mmpe.registry import register


@register(
    "abacus", hook="input", needs=(DigitPositioned,), learnable=True, family="absolute",
    extrapolates=True,
    paper="McLeish et al. 2024, Transformers Can Do Arithmetic with the Right Embeddings "
          "(NeurIPS 2024), Section 3", context=("d_model",))
class Abacus(InputEncoding):
    """A trainable vector per *place of a digit within its number*, added to the embeddings.

    With `i` the 1-based place of a digit in its number (`Numbers.digit_positions`; 0 for a
    token that is not a digit), `P = E[i + k]` for digits and `P = E[0]` for other tokens.
    During training `k` is drawn uniformly from `{0, …, max_offset}` at every call, one
    draw for the whole batch (as in the paper), so rows past the longest training number are
    trained too and a model trained on 20-digit numbers can read 100-digit ones; in evaluation
    `k = 0`. Digits of the same significance share a vector wherever they stand, which is what
    lets addition generalise in length (numbers written least-significant digit first).

    Args:
        d_model: embedding width.
        max_digits: longest number (digits) the table must cover at `k = 0`.
        max_offset: largest training offset `k` (the paper's 100); 0 disables it.

    Shapes: `forward(coords: Numbers) -> [n, d_model]` or `[b, n, d_model]`.

    Raises:
        ValueError: non-positive `d_model` or `max_digits`, negative `max_offset`.
        PositionOutOfRangeError: at forward, a number longer than `max_digits`.
    """

    def __init__(self, d_model: int, max_digits: int = 64, max_offset: int = 100) -> None:
        super().__init__()
        for name, value, low in (("d_model", d_model, 1), ("max_digits", max_digits, 1),
                                 ("max_offset", max_offset, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"abacus: {name} must be an int >= {low}, got {value!r}")
        self.max_digits, self.max_offset = max_digits, max_offset
        # Row 0 is the non-digit vector; places 1 … max_digits + max_offset follow.
        self.table = nn.Parameter(torch.randn(max_digits + max_offset + 1, d_model) * 0.02)

    def forward(self, coords: Coordinates) -> Tensor:
        self.check_coords(coords)
        places = coords.query_digit_positions if hasattr(coords, "query_digit_positions") \
            else coords.digit_positions
        longest = int(places.max()) if places.numel() else 0
        if longest > self.max_digits:
            raise PositionOutOfRangeError(
                f"abacus: a number of {longest} digits is longer than max_digits={self.max_digits}; "
                "build with a larger max_digits")
        if self.training and self.max_offset > 0:
            k = int(torch.randint(0, self.max_offset + 1, ()))
            places = torch.where(places > 0, places + k, places)
        return self.table[places]
