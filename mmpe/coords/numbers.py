"""Token sequences that contain numbers: every digit knows its place within its number.

Abacus embeddings (McLeish et al. 2024) give a digit the index of its place inside the number it
belongs to, so the digits of equal significance of two operands share a position however far
apart they sit in the sequence. `Numbers` carries that index beside the ordinary token
positions: it *is* a `Sequence` (every 1D encoding, causal mask and
cache works as on one) and adds the `DigitPositioned` capability.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mmpe.coords.capabilities import Capability
from mmpe.coords.sequence import Sequence


class DigitPositioned(Capability):
    """`digit_positions`: per key token, its 1-based place within its number (0: not a digit).

    Read by Abacus. Shape `[n_k]` or `[b, n_k]` int64; the queries are the last `n_q`.
    """

    members = ("digit_positions",)


class Numbers(Sequence):
    """A `Sequence` whose digits carry their place in their number.

    A *number* is a maximal run of consecutive digit tokens. Its first digit gets place 1, the
    next 2, and so on; every other token gets 0. Write numbers least-significant digit first
    (as McLeish et al. 2024 do) and place `i` is the `10^(i-1)` digit of every operand.

    Args:
        is_digit: `[n_k]` or `[b, n_k]` bool, True at digit tokens (`n_k = offset + n`:
            the cached tokens, then the new ones).
        **sequence_options: as `Sequence` (`offset`,
            `causal`, `position_ids`, `padding_mask`, `device` …); the length is that of
            `is_digit` minus `offset`.

    Raises:
        ValueError: `is_digit` not a bool tensor of rank 1 or 2, or its length or batch size
            differing from the sequence's.
    """

    kind = "numbers"
    #: `[n_k]` or `[b, n_k]` int64 places (declared here so the class offers `DigitPositioned`)
    digit_positions: Tensor

    def __init__(self, is_digit: Tensor, **sequence_options) -> None:
        if not isinstance(is_digit, Tensor) or is_digit.dtype != torch.bool or is_digit.dim() not in (1, 2):
            shape = tuple(is_digit.shape) if isinstance(is_digit, Tensor) else type(is_digit).__name__
            raise ValueError(f"Numbers: is_digit must be a bool tensor [n_k] or [b, n_k], got {shape}"
                             + (f" {is_digit.dtype}" if isinstance(is_digit, Tensor) else ""))
        offset = sequence_options.get("offset", 0)
        length = sequence_options.pop("length", None)
        if length is not None and length + offset != is_digit.shape[-1]:
            raise ValueError(f"Numbers: is_digit has {is_digit.shape[-1]} tokens but offset + length "
                             f"= {offset + length}")
        super().__init__(is_digit.shape[-1] - offset, **sequence_options)
        batch = self.batch_size
        if batch is not None and is_digit.dim() == 2 and is_digit.shape[0] != batch:
            raise ValueError(f"Numbers: is_digit has batch size {is_digit.shape[0]}, the sequence {batch}")
        device = sequence_options.get("device")
        self.is_digit = is_digit.to(device) if device is not None else is_digit
        self.digit_positions = digit_places(self.is_digit)

    @classmethod
    def from_tokens(cls, tokens: Tensor, digit_ids: Tensor | list[int], **sequence_options) -> Numbers:
        """Numbers over token ids.

        Numbers over token ids `[n]` or `[b, n]`: a token is a digit when its id is in
        `digit_ids` (the ids of `"0"` … `"9"` in the vocabulary; empty for a vocabulary
        without digits, where every place is 0).

        Raises:
            ValueError: `tokens` not an integer tensor; `digit_ids` not integer ids (a list or
                1-d tensor).
        """
        if not isinstance(tokens, Tensor) or tokens.is_floating_point() or tokens.dtype == torch.bool:
            raise ValueError(f"Numbers.from_tokens: tokens must be an integer tensor of token ids, "
                             f"got {tokens.dtype if isinstance(tokens, Tensor) else type(tokens).__name__}")
        try:
            digits = torch.as_tensor(digit_ids, device=tokens.device)
        except (TypeError, ValueError, RuntimeError):
            digits = None
        if digits is not None and digits.numel() == 0:  # a vocabulary without digits: [] is
            digits = digits.long().reshape(0)  # float32 to torch, yet no id is a digit
        if digits is None or digits.is_floating_point() or digits.dtype == torch.bool or \
                digits.dim() != 1:
            raise ValueError("Numbers.from_tokens: digit_ids must be the integer ids of the "
                             f"digit tokens (a list or 1-d tensor), got {digit_ids!r}")
        return cls(torch.isin(tokens, digits), **sequence_options)

    @property
    def query_digit_positions(self) -> Tensor:
        """Places of the query tokens: `[n]` or `[b, n]` (the last `n` keys)."""
        return self.digit_positions[..., self.offset:]

    def __repr__(self) -> str:
        return (f"Numbers(length={self.length}, offset={self.offset}, causal={self.causal}, "
                f"digits={int(self.is_digit.sum())})")


def digit_places(is_digit: Tensor) -> Tensor:
    """1-based place of every digit within its run of consecutive digits; 0 elsewhere.

    `[0, 1, 1, 0, 1] -> [0, 1, 2, 0, 1]`. Shape as `is_digit`, int64.
    """
    run = is_digit.long()
    count = run.cumsum(-1)
    # The count reached at the last non-digit before each token restarts the numbering there.
    reset = torch.where(is_digit, torch.zeros_like(count), count).cummax(-1).values
    return (count - reset) * run
