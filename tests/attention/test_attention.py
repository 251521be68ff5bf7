import warnings

import pytest
import torch
from helpers import assert_routes_agree

import mmpe
from mmpe import MultiHeadAttention, Sequence, Transformer
from mmpe.attention import compose_score_mods, which_route

warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")

ATTENTION_ENCODINGS = [[], ["rope"], ["alibi"], ["t5"], ["fire"], ["rope", "alibi"], ["rope", "t5", "fire"], ["nope"]]


def _mha(names, heads=4, d=64, **kw):
    encs = [mmpe.build(n, context={"num_heads": heads, "head_dim": d // heads}) for n in names]
    for e in encs:  # non-zero learned tables so the test can fail
        for p in e.parameters():
            torch.nn.init.normal_(p, std=0.5) if p.dim() == 2 and p.shape[0] > 8 else None
    return MultiHeadAttention(d, heads, encs, **kw)


@pytest.mark.parametrize("names", ATTENTION_ENCODINGS)
@pytest.mark.parametrize("coords", [
    Sequence(23), Sequence(23, causal=True),
    Sequence(document_ids=torch.tensor([[0] * 9 + [1] * 14, [0] * 20 + [1] * 3]), causal=True),
])
def test_flex_sdpa_and_math_paths_agree(names, coords):
    mha = _mha(names)
    x = torch.randn(2, 23, 64)
    assert_routes_agree(mha, x, coords)


def test_auto_route_per_device():
    mha, seq = _mha(["alibi"]), mmpe.Sequence(16)
    assert which_route(mha, seq, device="cpu") == "sdpa"
    # FlexAttention on CUDA from torch 2.6 (mmpe.flex_compile.MIN_TORCH); SDPA before.
    want = "flex" if mmpe.flex_compile.available() else "dense"
    assert which_route(mha, seq, device="cuda", device_name="described") == want
    assert which_route(_mha(["rope"]), seq, device="cuda", device_name="described") == "sdpa"


def test_attention_is_causal():
    mha = _mha(["alibi"])
    x = torch.randn(1, 10, 64)
    y = x.clone()
    y[:, 7:] = torch.randn(1, 3, 64)
    out_x, out_y = mha(x, Sequence(10, causal=True)), mha(y, Sequence(10, causal=True))
    assert torch.allclose(out_x[:, :7], out_y[:, :7], atol=1e-6)
    assert not torch.allclose(out_x[:, 7:], out_y[:, 7:], atol=1e-3)


@pytest.mark.parametrize("names", [["learned"], ["t5"], ["fire"], ["sinusoidal", "rope", "alibi"]])
def test_gradient_reaches_every_learnable_parameter(names):
    model = Transformer(32, 4, 2, names, context={"max_len": 16})
    coords = Sequence(12, causal=True)
    model(torch.randn(3, 12, 32), coords).square().mean().backward()
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_encodings_shared_across_layers_by_default():
    shared = Transformer(32, 4, 3, ["t5"])
    own = Transformer(32, 4, 3, ["t5"], share_encodings=False)
    n_shared = sum(p.numel() for p in shared.parameters())
    n_own = sum(p.numel() for p in own.parameters())
    assert n_own - n_shared == 2 * 32 * 4  # two more T5 tables of 32 buckets x 4 heads


def test_compose_score_mods_order_and_empty():
    assert compose_score_mods([]) is None
    add = lambda s, b, h, q, k: s + 1
    dbl = lambda s, b, h, q, k: s * 2
    z = torch.zeros(())
    assert compose_score_mods([add, dbl])(z, z, z, z, z).item() == 2.0


def test_bad_input():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        MultiHeadAttention(30, 4)
    with pytest.raises(ValueError, match="route must be one of"):
        MultiHeadAttention(32, 4, route="fast")
    with pytest.raises(ValueError, match="add input encodings to the embeddings"):
        MultiHeadAttention(32, 4, [mmpe.build("sinusoidal", d_model=32)])
    with pytest.raises(ValueError, match="at most one kernel"):
        MultiHeadAttention(32, 4, [mmpe.build("nope"), mmpe.build("nope")])
    mha = _mha(["alibi"], d=32)
    with pytest.raises(ValueError, match=r"x must be \[b, s, 32\]"):
        mha(torch.randn(5, 32), Sequence(5))
    with pytest.raises(ValueError, match="s=6 tokens but the coordinates have 5 queries"):
        mha(torch.randn(1, 6, 32), Sequence(5))
    with pytest.raises(TypeError, match="floating-point"):
        mha(torch.ones(1, 5, 32, dtype=torch.long), Sequence(5))
    with pytest.raises(ValueError, match="batch 3 but the coordinates hold positions for 2"):
        mha(torch.randn(3, 5, 32), Sequence(position_ids=torch.zeros(2, 5, dtype=torch.long)))
    with pytest.raises(ValueError, match="8 keys but there are 0 cached"):
        mha(torch.randn(1, 5, 32), Sequence(5, offset=3))
    with pytest.raises(TypeError, match="Coordinates"):
        mha(torch.randn(1, 5, 32), 5)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        MultiHeadAttention(32, 4, num_kv_heads=3)
    with pytest.raises(ValueError, match="depth"):
        Transformer(32, 4, 0)
