"""Randomised positional encodings (Ruoss et al. 2023): sorted distinct draws from [0, L_max)."""

import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpe
from mmpe.coords import randomized_positions


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 4), st.integers(1, 30), st.integers(0, 40), st.integers(0, 2**31))
def test_sorted_distinct_in_range(batch, length, extra, seed):
    pos = randomized_positions(batch, length, length + extra, generator=torch.Generator().manual_seed(seed))
    assert pos.shape == (batch, length) and pos.dtype == torch.int64
    assert bool((pos[:, 1:] > pos[:, :-1]).all())
    assert int(pos.min()) >= 0 and int(pos.max()) < length + extra


def test_every_subset_is_equally_likely():
    """3 of 5 positions: C(5,3) = 10 subsets, each ~1/10 (chi-square against uniform)."""
    draws = randomized_positions(20_000, 3, 5, generator=torch.Generator().manual_seed(0))
    counts = Counter(tuple(r) for r in draws.tolist())
    assert len(counts) == math.comb(5, 3)
    expected = 20_000 / 10
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 27.9  # 9 degrees of freedom, p = 0.001


def test_range_shorter_than_the_sequence_is_refused():
    with pytest.raises(ValueError, match="max_len=4 is shorter"):
        randomized_positions(1, 5, 4)
    with pytest.raises(ValueError, match="length"):
        randomized_positions(1, 0, 4)


def test_relative_encodings_see_the_gaps():
    """RoPE scores under random positions equal those at the same explicit offsets; a shift of
    all positions changes nothing (relative), while a learned table sees new rows."""
    pos = randomized_positions(1, 6, 50, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    attn = mmpe.MultiHeadAttention(16, 2, encodings=[mmpe.build("rope", head_dim=8)])
    x = torch.randn(1, 6, 16)
    a = attn(x, mmpe.Sequence(causal=True, position_ids=pos))
    b = attn(x, mmpe.Sequence(causal=True, position_ids=pos + 7))
    c = attn(x, mmpe.Sequence(6, causal=True))
    assert torch.allclose(a, b, atol=1e-5)
    assert not torch.allclose(a, c, atol=1e-3)  # control: the gaps matter
