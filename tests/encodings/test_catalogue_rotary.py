"""RoPE extensions (PI, NTK, dynamic NTK, YaRN, LongRoPE, Llama 3) and xPos against peers."""

import math
import warnings

import pytest
import torch

import mmpe
from mmpe import Sequence
from mmpe.encodings.rope_scaling import RoPEYaRN

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

warnings.filterwarnings("ignore")


def hf(rope_type, head_dim=32, max_pos=256, seq_len=None, **params):
    config = LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                         max_position_embeddings=max_pos,
                         rope_parameters={"rope_type": rope_type, "rope_theta": params.pop("base", 10000.0),
                                          **params})
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len)
    return inv_freq.double(), scaling


def close(ours, theirs):
    assert torch.allclose(ours.double(), theirs, rtol=2e-6, atol=0), (ours - theirs).abs().max()


@pytest.mark.parametrize("factor", [2.0, 4.0, 0.5])
def test_position_interpolation_equals_hf_linear(factor):
    enc = mmpe.build("rope_pi", head_dim=32, factor=factor)
    theirs, scaling = hf("linear", factor=factor)
    close(enc.inv_freq(100), theirs)
    assert enc.attention_scaling == scaling == 1.0


@pytest.mark.parametrize("head_dim", [16, 32, 64])
def test_ntk_equals_hf_dynamic_at_the_length_where_its_factor_is_s(head_dim):
    # HF has no static NTK entry; dynamic NTK with factor 2 at n = L·(2s−1)/s = 96 uses b·2^{d/(d−2)}.
    theirs, _ = hf("dynamic", head_dim=head_dim, max_pos=64, seq_len=96, factor=2.0)
    close(mmpe.build("rope_ntk", head_dim=head_dim, factor=2.0).inv_freq(10), theirs)
    d = head_dim  # lowest frequency divided by exactly s, highest kept
    ours = mmpe.build("rope_ntk", head_dim=d, factor=8.0).inv_freq(10)
    plain = mmpe.build("rope", head_dim=d).inv_freq(10)
    assert ours[0] == plain[0]
    assert math.isclose(ours[-1] / plain[-1], 1 / 8, rel_tol=1e-12)


@pytest.mark.parametrize("seq_len", [10, 64, 65, 200, 1024])
def test_dynamic_ntk_equals_hf(seq_len):
    enc = mmpe.build("rope_dynamic_ntk", head_dim=32, factor=4.0, original_max_position_embeddings=64)
    theirs, scaling = hf("dynamic", max_pos=64, seq_len=seq_len, factor=4.0)
    close(enc.inv_freq(seq_len), theirs)
    assert enc.attention_scaling == scaling


@pytest.mark.parametrize("params", [
    dict(factor=4.0, original_max_position_embeddings=64),
    dict(factor=16.0, original_max_position_embeddings=4096, base=500000.0),
    dict(factor=8.0, original_max_position_embeddings=2048, beta_fast=16, beta_slow=2, truncate=False),
    dict(factor=40.0, original_max_position_embeddings=4096, mscale=1.0, mscale_all_dim=0.707),
    dict(factor=4.0, original_max_position_embeddings=4096, attention_factor=1.5),
])
@pytest.mark.parametrize("head_dim", [32, 128])
def test_yarn_equals_hf(params, head_dim):
    theirs, scaling = hf("yarn", head_dim=head_dim, max_pos=65536, **dict(params))
    p = dict(params)
    enc = mmpe.build("rope_yarn", head_dim=head_dim, original_max_position_embeddings=p.pop("original_max_position_embeddings"), **p)
    close(enc.inv_freq(100), theirs)
    assert math.isclose(enc.attention_scaling, scaling, rel_tol=1e-12)


def test_yarn_temperature_is_the_papers_formula():
    for s in (2.0, 8.0, 32.0):
        assert math.isclose(RoPEYaRN(64, factor=s).attention_scaling, 0.1 * math.log(s) + 1)


@pytest.mark.parametrize("seq_len", [50, 64, 65, 300])
def test_longrope_equals_hf(seq_len):
    short = [1.0 + 0.05 * i for i in range(16)]
    long = [1.0 + 0.4 * i for i in range(16)]
    theirs, scaling = hf("longrope", max_pos=256, seq_len=seq_len, factor=4.0,
                         original_max_position_embeddings=64, short_factor=short, long_factor=long)
    enc = mmpe.build("rope_longrope", head_dim=32, factor=4.0, original_max_position_embeddings=64, short_factor=short,
                     long_factor=long)
    close(enc.inv_freq(seq_len), theirs)
    assert math.isclose(enc.attention_scaling, scaling, rel_tol=1e-12)
    assert math.isclose(scaling, math.sqrt(1 + math.log(4) / math.log(64)))


@pytest.mark.parametrize("params", [
    dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192,
         base=500000.0),
    dict(factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64),
    dict(factor=32.0, low_freq_factor=2.0, high_freq_factor=8.0, original_max_position_embeddings=512),
])
def test_llama3_equals_hf(params):
    theirs, scaling = hf("llama3", head_dim=128, **dict(params))
    p = dict(params)
    enc = mmpe.build("rope_llama3", head_dim=128, original_max_position_embeddings=p.pop("original_max_position_embeddings"), **p)
    close(enc.inv_freq(100), theirs)
    assert enc.attention_scaling == scaling == 1.0


@pytest.mark.parametrize("name", ["rope_pi", "rope_ntk", "rope_dynamic_ntk", "rope_yarn",
                                  "rope_longrope", "rope_llama3"])
def test_scaled_rope_matches_rotation_by_its_own_frequencies(name):
    # forward = rotation of each pair by m·θ'_i, times the attention scaling on cos and sin.
    enc = mmpe.build(name, context={"head_dim": 8, "original_max_position_embeddings": 4})
    q, k = torch.randn(1, 1, 6, 8), torch.randn(1, 1, 6, 8)
    rq, rk = enc(q, k, Sequence(6))
    theta, a = enc.inv_freq(6), enc.attention_scaling
    for m in range(6):
        ang = m * theta
        c, s = torch.cos(ang).float() * a, torch.sin(ang).float() * a
        x1, x2 = q[0, 0, m, :4], q[0, 0, m, 4:]
        assert torch.allclose(rq[0, 0, m], torch.cat((x1 * c - x2 * s, x2 * c + x1 * s)), atol=1e-5)


def test_xpos_equals_rotary_embedding_torch():
    ret = pytest.importorskip("rotary_embedding_torch")
    peer = ret.RotaryEmbedding(dim=16, use_xpos=True, xpos_scale_base=64)
    q, k = torch.randn(2, 3, 40, 16), torch.randn(2, 3, 40, 16)
    pq, pk = peer.rotate_queries_and_keys(q, k)
    enc = mmpe.build("xpos", head_dim=16, scale_base=64, interleaved=True)
    oq, ok = enc(q, k, Sequence(40))
    assert (oq - pq).abs().max() < 1e-5 and (ok - pk).abs().max() < 1e-5


def test_xpos_logit_depends_on_offset_and_decays():
    enc = mmpe.build("xpos", head_dim=16, scale_base=8)
    q = torch.randn(1, 1, 1, 16).expand(1, 1, 30, 16)
    k = torch.randn(1, 1, 1, 16).expand(1, 1, 30, 16)
    rq, rk = enc(q, k, Sequence(30))
    s = rq[0, 0] @ rk[0, 0].T
    assert torch.allclose(s[10, 4], s[25, 19], rtol=1e-4)  # same n − m
    zeta = enc.zeta()
    expected = (q[0, 0, 0, :8] * k[0, 0, 0, :8] + q[0, 0, 0, 8:] * k[0, 0, 0, 8:]).double()
    assert torch.isclose(s[5, 5].double(), expected.sum(), rtol=1e-4)  # offset 0: plain q·k
    # q = k: every pair's term is |x|² ζ^{Δ/γ_B} cos(Δθ); at Δ = 1 the decay is visible
    x = torch.randn(1, 1, 1, 16).expand(1, 1, 3, 16)
    rq, rk = enc(x, x, Sequence(3))
    theta = enc.inv_freq(3)
    pair = (x[0, 0, 0, :8] ** 2 + x[0, 0, 0, 8:] ** 2).double()
    assert torch.isclose((rq[0, 0, 1] @ rk[0, 0, 0]).double(),
                         (pair * zeta ** (1 / 8) * torch.cos(theta)).sum(), rtol=1e-4)


@pytest.mark.parametrize("name,kw,match", [
    ("rope_pi", dict(factor=0.0), "factor"),
    ("rope_ntk", dict(factor=-1.0), "factor"),
    ("rope_dynamic_ntk", dict(factor=0), "factor"),
    ("rope_yarn", dict(factor=0.0), "factor"),
    ("rope_longrope", dict(factor=-2.0), "factor"),
    ("rope_llama3", dict(factor=0.0), "factor"),
    ("rope_yarn", dict(head_dim=15), "head_dim"),
    ("rope_pi", dict(head_dim=16, rotary_dim=7), "rotary_dim"),
    ("xpos", dict(head_dim=9), "head_dim"),
    ("xpos", dict(scale_base=0), "scale_base"),
    ("rope_yarn", dict(beta_fast=1, beta_slow=2), "beta"),
    ("rope_llama3", dict(low_freq_factor=4, high_freq_factor=1), "low_freq_factor"),
    ("rope_longrope", dict(long_factor=[1.0, 2.0]), "long_factor"),
    ("rope_dynamic_ntk", dict(original_max_position_embeddings=0), "original_max_position_embeddings"),
])
def test_bad_options_raise(name, kw, match):
    kw = {"head_dim": 16, **kw}
    with pytest.raises(ValueError, match=match):
        mmpe.build(name, **kw)


def test_registry_metadata():
    for name in ("rope_pi", "rope_ntk", "rope_dynamic_ntk", "rope_yarn", "rope_longrope",
                 "rope_llama3", "xpos"):
        entry = mmpe.registry.get(name)
        assert entry.hook == "rotary" and entry.family == "rotary" and entry.paper
