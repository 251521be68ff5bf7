"""DAPE (Zheng et al. 2024) against a direct float64 evaluation of its formula.

`A = QKᵀ/√d + B + f(QKᵀ/√d, B)` with `f` a two-layer LeakyReLU MLP over the `2·n_h` values of a
pair (the heads' logits, then the heads' biases); the reference evaluates it head by head and
channel by channel in float64, over random weights, inner terms, lengths and coordinates.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import SAMPLE_COORDS, assert_bfloat16_and_autocast_follow_float32, model_context
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpe
from mmpe.attention import dense_bias
from mmpe.cache import KVCache
from mmpe.coords import Sequence
from mmpe.encodings.base import AttentionCall

D_MODEL, HEADS = 16, 2
INNERS = ["alibi", "kerple_log", "kerple_power", "fire", "t5"]


def reference(mha, enc, x, coords, bias=None) -> torch.Tensor:
    """The layer in float64: projections, logits, the inner bias (closed form for ALiBi, else the
    inner term's own dense bias), the MLP written out per channel, the mask, softmax."""
    b, n, _ = x.shape
    h, d = HEADS, D_MODEL // HEADS
    xd = x.double()
    qkv = F.linear(xd, mha.qkv.weight.double(), mha.qkv.bias.double())
    q, k, v = (t.unflatten(-1, (h, d)).transpose(1, 2) for t in qkv.split(h * d, dim=-1))
    logits = q @ k.transpose(-1, -2) / math.sqrt(d)
    if bias is None:
        ctx = AttentionCall(coords, h, d, b, x, q.float(), k.float(), v.float())
        bias = dense_bias([enc.inner], ctx).double()
    bias = bias.expand_as(logits)
    w1, b1 = enc.mlp[0].weight.double(), enc.mlp[0].bias.double()
    w2, b2 = enc.mlp[2].weight.double(), enc.mlp[2].bias.double()
    hidden = b1.view(1, -1, 1, 1).expand(b, -1, n, coords.num_keys).clone()
    for c in range(h):  # channels 0 … n_h−1: logits; n_h … 2n_h−1: biases
        hidden = hidden + w1[:, c].view(1, -1, 1, 1) * logits[:, c : c + 1]
        hidden = hidden + w1[:, h + c].view(1, -1, 1, 1) * bias[:, c : c + 1]
    hidden = torch.where(hidden > 0, hidden, 0.01 * hidden)  # LeakyReLU, slope 0.01
    refine = torch.einsum("oh,bhqk->boqk", w2, hidden) + b2.view(1, -1, 1, 1)
    z = logits + bias + refine
    mask = coords.dense_mask()
    if mask is not None:
        z = z.masked_fill(~mask, float("-inf"))
    out = z.softmax(-1) @ v
    return F.linear(out.transpose(1, 2).flatten(-2), mha.proj.weight.double(),
                    mha.proj.bias.double())


def make(inner="alibi", seed=0, hidden=8):
    torch.manual_seed(seed)
    enc = mmpe.build("dape", num_heads=HEADS, inner=inner, hidden=hidden)
    return enc, mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc])


@settings(max_examples=20)
@given(seed=st.integers(0, 2**16), n=st.integers(1, 9), inner=st.sampled_from(INNERS),
       causal=st.booleans(), hidden=st.integers(1, 12), scale=st.floats(0.1, 3.0))
def test_forward_and_gradients_equal_the_formula(seed, n, inner, causal, hidden, scale):
    enc, mha = make(inner, seed, hidden)
    with torch.no_grad():  # weights large enough that the MLP matters
        for p in enc.mlp.parameters():
            p.mul_(scale)
    x = torch.randn(2, n, D_MODEL, generator=torch.Generator().manual_seed(seed))
    coords = Sequence(n, causal=causal)
    got = mha(x, coords)
    want = reference(mha, enc, x, coords)
    assert (got.double() - want).abs().max() < 2e-5
    params = [p for p in mha.parameters() if p.requires_grad]
    weight = torch.randn(got.shape, generator=torch.Generator().manual_seed(seed + 1))
    g_got = torch.autograd.grad((got * weight).sum(), params)
    g_want = torch.autograd.grad((want * weight.double()).sum(), params)
    for p, a, b in zip(params, g_got, g_want, strict=True):
        assert (a.double() - b).abs().max() < 1e-4 * (1 + b.abs().max()), p.shape


def test_alibi_bias_is_the_closed_form():
    """The inner bias checked independently of mmpe's own: ALiBi's `−m_h·|i − j|`."""
    enc, mha = make("alibi", seed=1)
    x, coords = torch.randn(2, 7, D_MODEL), Sequence(7, causal=True)
    i = torch.arange(7)
    slopes = enc.inner.slopes.double().view(1, -1, 1, 1)
    bias = -slopes * (i[:, None] - i[None, :]).abs().double()
    assert (mha(x, coords).double() - reference(mha, enc, x, coords, bias)).abs().max() < 2e-5


def _zeroed(enc):
    with torch.no_grad():
        enc.mlp[2].weight.zero_()
        enc.mlp[2].bias.zero_()


def _inner_alone(enc, mha):
    alone = mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc.inner])
    alone.load_state_dict({k: v for k, v in mha.state_dict().items()
                           if k.startswith(("qkv.", "proj."))}, strict=False)
    return alone


@pytest.mark.parametrize("cname", sorted(SAMPLE_COORDS))
@pytest.mark.parametrize("inner", ["alibi", "t5", "fire", "cope", "shaw"])
def test_zero_mlp_is_the_inner_term_on_every_coordinate_type_it_runs_on(inner, cname):
    coords = SAMPLE_COORDS[cname]()
    context = {**model_context(coords), "d_model": D_MODEL, "num_heads": HEADS,
               "head_dim": D_MODEL // HEADS}
    torch.manual_seed(0)
    base = mmpe.build(inner, context=context)
    enc = mmpe.build("dape", inner=base, num_heads=HEADS)
    _zeroed(enc)
    mha = mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc])
    alone = _inner_alone(enc, mha)
    x = torch.randn(coords.batch_size or 2, coords.num_queries, D_MODEL)
    if not mmpe.registry.get(inner).supports(coords):  # refused as the inner term refuses
        with pytest.raises((TypeError, ValueError), match="dape needs coordinates providing"):
            mha(x, coords)
        return
    torch.testing.assert_close(mha(x, coords), alone(x, coords), atol=1e-5, rtol=1e-4)


def test_a_config_and_the_context_build_the_inner_term():
    enc = mmpe.build("dape", inner={"name": "kerple_log"}, context={"num_heads": 4,
                                                                    "d_model": 32})
    assert type(enc.inner).__name__.lower().startswith("kerple") and enc.inner.num_heads == 4
    fox = mmpe.build("dape", inner="fox", context={"num_heads": 4, "d_model": 32})
    assert fox.needs == fox.inner.needs and fox.inner.gate.in_features == 32


def test_cached_decoding_equals_the_full_pass():
    enc, mha = make("kerple_log", seed=3)
    x = torch.randn(1, 7, D_MODEL)
    full = mha(x, Sequence(7, causal=True))
    cache, outs = KVCache(), []
    with torch.no_grad():
        for t, s in ((0, 3), (3, 1), (4, 3)):
            outs.append(mha(x[:, t:t + s], Sequence(s, offset=t, causal=True), cache=cache))
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=2e-6, rtol=1e-5)


def test_other_score_terms_of_the_layer_still_add():
    """With ALiBi beside DAPE(T5), the layer adds ALiBi to DAPE's logits."""
    torch.manual_seed(0)
    enc = mmpe.build("dape", inner="t5", num_heads=HEADS)
    alibi = mmpe.build("alibi", num_heads=HEADS)
    mha = mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc, alibi])
    x, coords = torch.randn(1, 6, D_MODEL), Sequence(6, causal=True)
    q, k, v = mha._project(x)
    ctx = AttentionCall(coords, HEADS, D_MODEL // HEADS, 1, x, q, k, v)
    i = torch.arange(6)
    z = enc.logits(ctx) - alibi.slopes.view(-1, 1, 1) * (i[:, None] - i[None, :]).float()
    z = z.masked_fill(i[None, :] > i[:, None], float("-inf"))
    want = mha.proj((z.softmax(-1) @ v).transpose(1, 2).flatten(-2))
    torch.testing.assert_close(mha(x, coords), want, atol=1e-5, rtol=1e-4)


def test_bad_inner_terms_and_sizes_are_refused():
    with pytest.raises(TypeError, match="dape: inner must be an additive score encoding"):
        mmpe.build("dape", num_heads=2, inner="rope", head_dim=8)
    with pytest.raises(ValueError, match="dape: inner must add a term.*rescales"):
        mmpe.build("dape", num_heads=2, inner="da_transformer")
    with pytest.raises(ValueError, match="dape: inner must add a term.*value term"):
        mmpe.build("dape", num_heads=2, inner={"name": "shaw", "values": True}, head_dim=8)
    with pytest.raises(ValueError, match="hidden"):
        mmpe.build("dape", num_heads=2, hidden=0)
    with pytest.raises(KeyError):
        mmpe.build("dape", num_heads=2, inner="no_such_term")
    enc = mmpe.build("dape", num_heads=4)
    with pytest.raises(ValueError, match="built for num_heads=4"):
        mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc])(torch.randn(1, 3, D_MODEL), Sequence(3))


def test_runs_in_bfloat16_and_under_autocast():
    enc, mha = make("fire")
    x, coords = torch.randn(2, 10, D_MODEL), Sequence(10, causal=True)
    assert_bfloat16_and_autocast_follow_float32(mha, x, coords)


def test_a_query_with_every_key_masked_attends_to_nothing() -> None:
    # left padding: the pad query sees only itself, a masked key; its row must not be NaN,
    # which its value would carry to every later token in the next layer
    torch.manual_seed(0)
    pad = torch.tensor([[False, True, True, True]])
    coords = mmpe.Sequence(4, causal=True, padding_mask=pad)
    layer = mmpe.MultiHeadAttention(16, 2, [mmpe.build("dape", num_heads=2)])
    out = layer(torch.randn(1, 4, 16), coords)
    assert torch.isfinite(out).all()
