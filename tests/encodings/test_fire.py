import math

import pytest
import torch

import mmpe
from mmpe import Sequence
from mmpe.attention import dense_bias
from mmpe.encodings.base import AttentionCall


def test_formula_on_hand_computed_pair():
    fire = mmpe.build("fire", num_heads=2, init_L=4.0)
    ctx = AttentionCall(Sequence(10, causal=True), 2, 8, 1)
    x = fire.normalised_distance(ctx, torch.tensor(9), torch.tensor(2), torch.tensor(0))
    psi = lambda v: math.log(0.1 * v + 1)
    assert x.item() == pytest.approx(psi(7) / (psi(max(4, 9)) + 1e-6), rel=1e-5)
    # Below the threshold L the normaliser is psi(L), not psi(i).
    x_short = fire.normalised_distance(ctx, torch.tensor(2), torch.tensor(0), torch.tensor(0))
    assert x_short.item() == pytest.approx(psi(2) / (psi(4) + 1e-6), rel=1e-5)


def test_bias_is_mlp_of_normalised_distance_and_bounded_inputs():
    fire = mmpe.build("fire", num_heads=3, init_L=2.0)
    ctx = AttentionCall(Sequence(64, causal=True), 3, 8, 1)
    bias = dense_bias([fire], ctx)
    q, k = torch.tensor(40), torch.tensor(10)
    x = fire.normalised_distance(ctx, q, k, torch.tensor(0))
    assert torch.allclose(bias[0, :, 40, 10], fire.mlp(x.view(1, 1))[0], atol=1e-6)
    qi, ki = torch.arange(64)[:, None], torch.arange(64)[None, :]
    xs = fire.normalised_distance(ctx, qi, ki, torch.tensor(0))
    assert xs[qi >= ki].max() <= 1.0 + 1e-5  # causal pairs map into [0, 1]


def test_score_mod_equals_eager_bias_and_gradients_reach_c_and_L():
    fire = mmpe.build("fire", num_heads=2, init_L=3.0)
    ctx = AttentionCall(Sequence(12, causal=True), 2, 8, 1)
    from mmpe.coords.base import index_grid

    b, h, q, k = index_grid(1, 2, 12, 12)
    via_mod = fire.score_mod(ctx)(torch.zeros(()), b, h, q, k)
    assert torch.allclose(via_mod, dense_bias([fire], ctx), atol=1e-5)
    dense_bias([fire], ctx).square().sum().backward()
    for name, p in fire.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_bad_options():
    for kwargs, arg in (({"num_heads": 0}, "num_heads"), ({"num_heads": 2, "init_c": 0}, "init_c"),
                        ({"num_heads": 2, "init_L": -1}, "init_L")):
        with pytest.raises(ValueError, match=f"fire: {arg} must be"):
            mmpe.build("fire", **kwargs)
