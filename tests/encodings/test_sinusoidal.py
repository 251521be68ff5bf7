import math

import pytest
import torch

import mmpe
from mmpe import Sequence
from mmpe.encodings.sinusoidal import sinusoidal_table


def test_closed_form_values():
    pe = mmpe.build("sinusoidal", d_model=8)(Sequence(5))
    for p in range(5):
        for i in range(4):
            w = 10000 ** (-2 * i / 8)
            assert pe[p, 2 * i].item() == pytest.approx(math.sin(p * w), abs=1e-6)
            assert pe[p, 2 * i + 1].item() == pytest.approx(math.cos(p * w), abs=1e-6)


def test_shift_is_a_fixed_linear_map():
    """PE(pos + k) = M_k PE(pos) with M_k block-diagonal 2x2 rotations, the same for every pos."""
    d, k = 16, 7
    table = sinusoidal_table(torch.arange(60), d).double()
    w = 10000 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    m = torch.zeros(d, d, dtype=torch.float64)
    for i, wi in enumerate(w):
        c, s = math.cos(k * wi), math.sin(k * wi)
        m[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, s], [-s, c]])
    assert torch.allclose(table[k:], table[:-k] @ m.T, atol=1e-5)


def test_matches_x_transformers_absolute_form():
    # x-transformers' ScaledSinusoidalEmbedding uses [sin | cos] halves; same frequencies.
    from x_transformers.x_transformers import ScaledSinusoidalEmbedding

    ref = ScaledSinusoidalEmbedding(16)
    x = torch.zeros(1, 10, 16)
    out = ref(x, pos=torch.arange(10)) / ref.scale
    ours = sinusoidal_table(torch.arange(10), 16)
    ours_halves = torch.cat((ours[:, 0::2], ours[:, 1::2]), dim=-1)
    assert torch.allclose(out.squeeze(0), ours_halves, atol=1e-5)


def test_large_positions_keep_precision():
    pe = sinusoidal_table(torch.tensor([10**7]), 4)
    assert pe[0, 0].item() == pytest.approx(math.sin(1e7), abs=1e-6)


def test_bad_d_model():
    with pytest.raises(ValueError, match="d_model"):
        mmpe.build("sinusoidal", d_model=7)
