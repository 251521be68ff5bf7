"""Input-hook catalogue: axial (Reformer) and scaled sinusoidal (FLASH / x-transformers)."""

import warnings

import pytest
import torch

import mmpe
from mmpe import Sequence, Transformer
from mmpe.encodings.base import PositionOutOfRangeError

warnings.filterwarnings("ignore")


def test_axial_equals_hf_reformer_axial_embeddings():
    tr = pytest.importorskip("transformers")
    from transformers.models.reformer.modeling_reformer import AxialPositionEmbeddings

    config = tr.ReformerConfig(axial_pos_shape=(4, 8), axial_pos_embds_dim=(6, 10), hidden_size=16,
                               hidden_dropout_prob=0.0, max_position_embeddings=32)
    peer = AxialPositionEmbeddings(config).train()
    ours = mmpe.build("axial", d_model=16, shape=(4, 8), dims=(6, 10))
    with torch.no_grad():
        ours.row.copy_(torch.randn(4, 6))
        ours.col.copy_(torch.randn(8, 10))
        peer.weights[0].copy_(ours.row[:, None, :])
        peer.weights[1].copy_(ours.col[None, :, :])
    expected = peer(torch.arange(32)[None])[0]
    assert torch.allclose(ours(Sequence(32)), expected, atol=0)


def test_axial_formula_default_shape_and_no_extrapolation():
    enc = mmpe.build("axial", context={"d_model": 8, "max_len": 64})
    assert enc.shape == (8, 8) and enc.dims == (4, 4)
    assert sum(p.numel() for p in enc.parameters()) == 8 * 4 + 8 * 4  # not 64 * 8
    p = enc(Sequence(64))
    assert torch.equal(p[19], torch.cat((enc.row[2], enc.col[3])))
    assert torch.equal(enc(Sequence(position_ids=torch.tensor([[5, 63]])))[0, 1], p[63])
    with pytest.raises(PositionOutOfRangeError, match="cannot extrapolate"):
        enc(Sequence(65))
    assert mmpe.registry.get("axial").extrapolates is False
    odd = mmpe.build("axial", d_model=8, max_len=50)  # ceil: 8 columns, 7 rows
    assert odd.shape == (7, 8) and odd.max_len == 56


@pytest.mark.parametrize("kw,match", [(dict(dims=(3, 3)), "dims"), (dict(shape=(0, 4)), "shape"),
                                      (dict(max_len=0), "max_len")])
def test_axial_bad_options(kw, match):
    with pytest.raises(ValueError, match=match):
        mmpe.build("axial", d_model=8, **kw)


def test_scaled_sinusoidal_equals_x_transformers():
    xt = pytest.importorskip("x_transformers.x_transformers")
    peer = xt.ScaledSinusoidalEmbedding(16)
    ours = mmpe.build("scaled_sinusoidal", d_model=16)
    assert torch.isclose(ours.scale, peer.scale[0])
    with torch.no_grad():
        ours.scale.fill_(0.7)
        peer.scale.fill_(0.7)
    theirs = peer(torch.zeros(1, 50, 16))
    mine = ours(Sequence(50))
    # x-transformers concatenates [sin | cos]; mmpe interleaves (sin, cos) per frequency
    assert torch.allclose(mine[:, 0::2], theirs[:, :8], atol=1e-5)
    assert torch.allclose(mine[:, 1::2], theirs[:, 8:], atol=1e-5)


def test_scaled_sinusoidal_is_sinusoidal_times_learned_scale_and_trains():
    ours = mmpe.build("scaled_sinusoidal", d_model=8, init_scale=2.0)
    plain = mmpe.build("sinusoidal", d_model=8)
    assert torch.allclose(ours(Sequence(10)), 2.0 * plain(Sequence(10)))
    model = Transformer(8, 2, 1, [ours])
    model(torch.randn(2, 10, 8), Sequence(10, causal=True)).square().mean().backward()
    assert ours.scale.grad is not None and ours.scale.grad.abs() > 0
    with pytest.raises(ValueError, match="d_model"):
        mmpe.build("scaled_sinusoidal", d_model=7)
