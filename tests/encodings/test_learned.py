import pytest
import torch

import mmpe
from mmpe import Sequence
from mmpe.encodings.base import PositionOutOfRangeError


def test_table_lookup_and_gradient():
    enc = mmpe.build("learned", d_model=8, max_len=16)
    pe = enc(Sequence(5, offset=0))
    assert torch.equal(pe, enc.table[:5])
    pe.sum().backward()
    assert enc.table.grad[:5].abs().sum() > 0 and enc.table.grad[5:].abs().sum() == 0


def test_past_the_table_is_a_clear_error():
    enc = mmpe.build("learned", d_model=8, max_len=16)
    with pytest.raises(PositionOutOfRangeError, match="position 31 is past the table of max_len=16"):
        enc(Sequence(32))
    assert issubclass(PositionOutOfRangeError, ValueError)


def test_bad_options():
    with pytest.raises(ValueError, match="max_len"):
        mmpe.build("learned", d_model=8, max_len=0)


def test_clamp_option_repeats_the_last_row():
    enc = mmpe.build("learned", d_model=4, max_len=8, out_of_range="clamp")
    pe = enc(Sequence(12))
    assert torch.equal(pe[8:], enc.table[7].expand(4, 4))
    with pytest.raises(ValueError, match="out_of_range"):
        mmpe.build("learned", d_model=4, out_of_range="wrap")
