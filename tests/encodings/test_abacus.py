"""Abacus embeddings (McLeish et al. 2024) and the Numbers coordinates they read."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpe
from mmpe.coords.numbers import Numbers, digit_places
from mmpe.encodings.base import PositionOutOfRangeError


def test_digit_places_restart_at_every_number():
    is_digit = torch.tensor([0, 1, 1, 0, 1, 1, 1, 0, 0, 1], dtype=torch.bool)
    assert digit_places(is_digit).tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 0, 1]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=40))
def test_digit_places_match_a_scan(bits):
    expected, run = [], 0
    for b in bits:
        run = run + 1 if b else 0
        expected.append(run)
    assert digit_places(torch.tensor(bits)).tolist() == expected


def test_equal_significance_shares_a_vector_wherever_it_stands():
    """3+4-digit operands: the units digits of both numbers get the same embedding, which no
    absolute table gives (control: learned positions differ)."""
    #          a0 a1 a2  +  b0 b1 b2 b3  =
    tokens = torch.tensor([[1, 2, 3, 11, 4, 5, 6, 7, 12]])
    coords = Numbers.from_tokens(tokens, list(range(10)), causal=True)
    enc = mmpe.build("abacus", d_model=16).eval()
    p = enc(coords)[0]
    assert torch.equal(p[0], p[4]) and torch.equal(p[2], p[6])
    assert torch.equal(p[3], p[8])  # non-digits share row 0
    assert not torch.equal(p[0], p[1])
    learned = mmpe.build("learned", d_model=16, max_len=16)(coords)
    assert not torch.equal(learned[0, 0], learned[0, 4])


def test_training_offset_shifts_every_digit_by_one_draw():
    tokens = torch.tensor([[1, 2, 11, 3]])
    coords = Numbers.from_tokens(tokens, list(range(10)))
    enc = mmpe.build("abacus", d_model=4, max_digits=4, max_offset=50).train()
    seen = set()
    for seed in range(20):
        torch.manual_seed(seed)
        p = enc(coords)[0]
        rows = [int((enc.table == p[i]).all(-1).nonzero()) for i in range(4)]
        assert rows[2] == 0 and rows[1] == rows[0] + 1 and rows[3] == rows[0]
        seen.add(rows[0] - 1)
    assert len(seen) > 5 and max(seen) <= 50  # k varies, within 0 … max_offset
    enc.eval()
    rows = [int((enc.table == v).all(-1).nonzero()) for v in enc(coords)[0]]
    assert rows == [1, 2, 0, 1]


def test_refuses_plain_sequences_and_long_numbers():
    enc = mmpe.build("abacus", d_model=4, max_digits=3)
    with pytest.raises(TypeError, match="digit_positions"):
        enc(mmpe.Sequence(5))
    with pytest.raises(PositionOutOfRangeError, match="max_digits=3"):
        enc.eval()(Numbers(torch.ones(5, dtype=torch.bool)))


@pytest.mark.parametrize("bad", [torch.ones(4), torch.ones(1, 2, 3, dtype=torch.bool), [True]])
def test_numbers_names_is_digit(bad):
    with pytest.raises(ValueError, match="is_digit"):
        Numbers(bad)


def test_numbers_is_a_sequence_for_every_other_encoding():
    tokens = torch.randint(0, 20, (2, 7))
    coords = Numbers.from_tokens(tokens, list(range(10)), causal=True)
    plain = mmpe.Sequence(7, causal=True)
    torch.manual_seed(0)
    attn = mmpe.MultiHeadAttention(16, 2, encodings=[mmpe.build("rope", head_dim=8), mmpe.build("alibi", num_heads=2)])
    x = torch.randn(2, 7, 16)
    assert torch.allclose(attn(x, coords), attn(x, plain), atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(tokens=st.lists(st.integers(0, 30), min_size=1, max_size=12),
       digit_ids=st.lists(st.integers(0, 30), max_size=10, unique=True),
       as_type=st.sampled_from(["list", "tensor", "numpy"]))
def test_from_tokens_places_match_a_scan_for_every_set_of_digit_ids(tokens, digit_ids, as_type):
    """Any digit-id set, the empty one included (a vocabulary without digits: every place 0),
    given as a list, a tensor or an array; `[]` is float32 to torch and was refused."""
    import numpy as np

    ids = {"list": digit_ids, "tensor": torch.tensor(digit_ids, dtype=torch.long),
           "numpy": np.asarray(digit_ids)}[as_type]
    nums = Numbers.from_tokens(torch.tensor(tokens), ids)
    want, run = [], 0
    for t in tokens:
        run = run + 1 if t in digit_ids else 0
        want.append(run)
    assert nums.digit_positions.tolist() == want
    if not digit_ids:
        assert not nums.digit_positions.any()
        enc = mmpe.build("abacus", d_model=8)
        torch.testing.assert_close(enc(nums), enc.table[0].expand(len(tokens), 8))
