import pytest
import torch

import mmpe
from mmpe import Sequence
from mmpe.attention import dense_bias
from mmpe.encodings.alibi import alibi_slopes
from mmpe.encodings.base import AttentionCall


def test_slopes_for_eight_heads_are_powers_of_two():
    assert alibi_slopes(8).tolist() == [2.0 ** -i for i in range(1, 9)]


def test_slopes_sixteen_heads_geometric():
    s = alibi_slopes(16)
    assert torch.allclose(s, torch.tensor([2 ** (-0.5 * i) for i in range(1, 17)]))


@pytest.mark.parametrize("heads", [1, 3, 5, 6, 12, 24])
def test_non_power_of_two_matches_paper_recipe_and_x_transformers(heads):
    from x_transformers.x_transformers import AlibiPositionalBias

    ref = AlibiPositionalBias._get_slopes(heads)
    assert torch.allclose(alibi_slopes(heads), torch.tensor(ref, dtype=torch.float32))
    if heads == 12:  # 8 slopes of 8 heads, then the odd-indexed of 16 heads: 2^-0.5, 2^-1.5, …
        assert torch.allclose(alibi_slopes(12)[8:], torch.tensor([2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5]))


def test_bias_is_minus_slope_times_distance():
    alibi = mmpe.build("alibi", num_heads=4)
    seq = Sequence(6, causal=True)
    bias = dense_bias([alibi], AttentionCall(seq, 4, 8, 1))
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    for h, m in enumerate(alibi_slopes(4)):
        assert torch.allclose(bias[0, h], -m * (i - j).abs().float())


def test_distance_unit_and_errors():
    a = mmpe.build("alibi", num_heads=2, distance_unit=2.0)
    bias = dense_bias([a], AttentionCall(Sequence(3), 2, 8, 1))
    assert bias[0, 0, 0, 2].item() == pytest.approx(-0.0625 * 1.0)
    with pytest.raises(ValueError, match="num_heads must be a positive int"):
        alibi_slopes(0)
    with pytest.raises(ValueError, match="distance_unit"):
        mmpe.build("alibi", num_heads=2, distance_unit=0)
    with pytest.raises(ValueError, match=r"slopes must be \[num_heads=2\]"):
        mmpe.build("alibi", num_heads=2, slopes=torch.ones(3))
    with pytest.raises(ValueError, match="num_heads=2, attention has 4"):
        dense_bias([a], AttentionCall(Sequence(3), 4, 8, 1))
