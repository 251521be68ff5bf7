"""Content-dependent score encodings: Shaw, Transformer-XL, TENER, Huang 1-4, DeBERTa, CoPE."""

import math
import warnings

import pytest
import torch
from helpers import assert_routes_agree

import mmpe
from mmpe import MultiHeadAttention, Sequence, Transformer
from mmpe.attention import dense_bias
from mmpe.encodings.base import AttentionCall
from mmpe.encodings.sinusoidal import sinusoidal_table
from mmpe.encodings.transformer_xl import xl_sinusoid

warnings.filterwarnings("ignore")
H, D, N = 2, 8, 7
CTX = {"num_heads": H, "head_dim": D, "d_model": H * D, "max_len": 8}
RELATIVE = ["shaw", "transformer_xl", "tener", "huang_1", "huang_2", "huang_3", "huang_4",
            "deberta", "cope"]


def build(name, **kw):
    enc = mmpe.build(name, context=CTX, **kw)
    with torch.no_grad():  # non-trivial parameters so formula checks can fail
        for p in enc.parameters():
            p.copy_(torch.randn_like(p) * 0.5 + (1.0 if name in ("huang_1", "huang_2") else 0.0))
    return enc


def context(coords=None, b=2):
    coords = coords or Sequence(N)
    n_q, n_k = coords.num_queries, coords.num_keys
    return AttentionCall(coords, H, D, b, torch.randn(b, n_k, H * D), torch.randn(b, H, n_q, D),
                            torch.randn(b, H, n_k, D), torch.randn(b, H, n_k, D))


def rel_grid(n):  # j − i
    i = torch.arange(n)
    return i[None, :] - i[:, None]


def test_shaw_keys_and_values_match_the_direct_formula():
    enc = build("shaw", max_relative_position=2, values=True)
    ctx = context()
    a_k = enc.key_table[rel_grid(N).clamp(-2, 2) + 2]  # [N, N, D] (fine in a test)
    expected = torch.einsum("bhid,ijd->bhij", ctx.q, a_k) / math.sqrt(D)
    assert torch.allclose(dense_bias([enc], ctx), expected, atol=1e-5)
    probs = torch.randn(2, H, N, N).softmax(-1)
    a_v = enc.value_table[rel_grid(N).clamp(-2, 2) + 2]
    assert torch.allclose(enc.value_term(probs, ctx), torch.einsum("bhij,ijd->bhid", probs, a_v),
                          atol=1e-5)
    assert enc.needs_probs and not build("shaw").needs_probs


def test_shaw_values_change_the_attention_output():
    enc = build("shaw", values=True)
    mha = MultiHeadAttention(H * D, H, [enc])
    x = torch.randn(2, N, H * D)
    out = mha(x, Sequence(N))
    enc.value_table.data.zero_()
    assert not torch.allclose(out, mha(x, Sequence(N)), atol=1e-4)


def test_huang_1_and_2_multiply_the_logit():
    for name, signed in (("huang_1", False), ("huang_2", True)):
        enc = build(name, max_relative_position=3)
        ctx = context()
        rel = rel_grid(N).clamp(-3, 3)
        rows = rel + 3 if signed else rel.abs()
        from mmpe.coords.base import index_grid
        b, h, q, k = index_grid(1, H, N, N)
        score = torch.randn(2, H, N, N)
        out = enc.score_mod(ctx)(score, b, h, q, k)
        assert torch.allclose(out, score * enc.table[rows].permute(2, 0, 1)[None], atol=1e-6)
    # method 1 is symmetric in the direction, method 2 is not
    assert build("huang_1").table.shape[0] == 17 and build("huang_2").table.shape[0] == 33


def test_huang_3_is_the_trilinear_product():
    enc = build("huang_3", max_relative_position=2)
    ctx = context()
    a = enc.table[rel_grid(N).clamp(-2, 2) + 2]  # [N, N, D]
    total = torch.einsum("bhid,bhjd,ijd->bhij", ctx.q, ctx.k, a) / math.sqrt(D)
    plain = ctx.q @ ctx.k.transpose(-2, -1) / math.sqrt(D)
    assert torch.allclose(plain + dense_bias([enc], ctx), total, atol=1e-4)


def test_huang_4_is_shaw_plus_the_key_term_and_equals_shaw_without_it():
    h4 = build("huang_4", max_relative_position=3)
    shaw = mmpe.build("shaw", context=CTX, max_relative_position=3)
    shaw.key_table.data.copy_(h4.key_table.data)
    ctx = context()
    a = h4.key_table[rel_grid(N).clamp(-3, 3) + 3]
    key_term = torch.einsum("bhjd,ijd->bhij", ctx.k, a) / math.sqrt(D)
    assert torch.allclose(dense_bias([h4], ctx), dense_bias([shaw], ctx) + key_term, atol=1e-5)
    ctx.k = torch.zeros_like(ctx.k)  # zero key-side term
    assert torch.allclose(dense_bias([h4], ctx), dense_bias([shaw], ctx), atol=0)


def test_transformer_xl_terms_b_c_d():
    enc = build("transformer_xl")
    ctx = context(Sequence(N, causal=True))
    rel = -rel_grid(N)  # i − j
    r = enc.r_net(xl_sinusoid(rel, H * D)).view(N, N, H, D)  # [i, j, h, d]
    expected = (torch.einsum("bhid,ijhd->bhij", ctx.q + enc.v[None, :, None], r)
                + torch.einsum("bhjd,hd->bhj", ctx.k, enc.u)[:, :, None, :]) / math.sqrt(D)
    assert torch.allclose(dense_bias([enc], ctx), expected, atol=1e-5)
    s = xl_sinusoid(torch.tensor([3]), 4)[0]
    assert torch.allclose(s, torch.tensor([math.sin(3), math.sin(3 / 100), math.cos(3), math.cos(3 / 100)]))


def test_tener_formula_unscaled_and_direction_aware():
    enc = build("tener")
    assert enc.softmax_scale(D) == 1.0 and build("tener", scaled=True).softmax_scale(D) is None
    ctx = context()
    rel = -rel_grid(N)  # t − j
    r = sinusoidal_table(rel, D)  # [t, j, d]
    expected = (torch.einsum("bhtd,tjd->bhtj", ctx.q + enc.v[None, :, None], r)
                + torch.einsum("bhjd,hd->bhj", ctx.k, enc.u)[:, :, None, :])
    bias = dense_bias([enc], ctx)
    assert torch.allclose(bias, expected, atol=1e-5)
    # direction: with content removed the term is vᵀR_{t−j}, and R_{+r} ≠ R_{−r} (sin is odd)
    ctx.q, ctx.k = torch.zeros_like(ctx.q), torch.zeros_like(ctx.k)
    bias = dense_bias([enc], ctx)[0, 0]
    assert not torch.allclose(bias[3, 1], bias[3, 5], atol=1e-3)  # key 2 left vs 2 right
    assert torch.allclose(bias[3, 1], bias[5, 3])  # depends on t − j only
    # absolute sinusoid dot products cannot tell left from right: PE_t·PE_{t−k} = PE_t·PE_{t+k}
    pe = sinusoidal_table(torch.arange(10), D)
    assert torch.allclose(pe[5] @ pe[3], pe[5] @ pe[7], atol=1e-5)


def test_deberta_buckets_equal_hf_and_terms_match_formula():
    pytest.importorskip("transformers")
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    from mmpe.encodings.deberta import log_bucket_position
    rel = torch.arange(-700, 701)
    for size, maxpos in ((256, 512), (32, 128), (8, 64)):
        assert torch.equal(log_bucket_position(rel, size, maxpos), make_log_bucket_position(rel, size, maxpos).long())
    enc = build("deberta", position_buckets=4, max_relative_positions=16)
    assert math.isclose(enc.softmax_scale(D), 1 / math.sqrt(3 * D))
    ctx = context(Sequence(12))
    rel = -rel_grid(12)  # i − j
    idx = (log_bucket_position(rel, 4, 16) + 4).clamp(0, 7)
    kr = enc.pos_key_proj(enc.rel_embeddings).view(8, H, D)[idx]  # [i, j, h, d]
    qr = enc.pos_query_proj(enc.rel_embeddings).view(8, H, D)[idx]
    expected = (torch.einsum("bhid,ijhd->bhij", ctx.q, kr)
                + torch.einsum("bhjd,ijhd->bhij", ctx.k, qr)) / math.sqrt(3 * D)
    assert torch.allclose(dense_bias([enc], ctx), expected, atol=1e-5)


def test_cope_all_gates_one_gives_relative_positions():
    enc = build("cope", npos_max=5)
    ctx = context(Sequence(N, causal=True))
    causal = torch.ones(N, N).tril()
    term = enc.term(ctx, gates=causal.expand(2, H, N, N))
    z = ctx.q @ enc.pos_emb  # [b, h, i, p]
    pos = (-rel_grid(N) + 1).clamp(0, 4)  # i − j + 1, clipped to npos_max − 1
    expected = z.gather(-1, pos.expand(2, H, N, N))
    assert torch.allclose(term * causal, expected * causal, atol=1e-6)


def test_cope_interpolates_fractional_positions_and_needs_causal():
    enc = build("cope", npos_max=6)
    ctx = context(Sequence(3, causal=True), b=1)
    gates = torch.tensor([[1.0, 0, 0], [0.5, 0.75, 0], [0.25, 0.5, 0.5]]).expand(1, H, 3, 3)
    z = ctx.q @ enc.pos_emb
    term = enc.term(ctx, gates=gates)
    # query 2, key 0: p = 1.25 → 0.75·z[1] + 0.25·z[2]
    assert torch.allclose(term[0, :, 2, 0], 0.75 * z[0, :, 2, 1] + 0.25 * z[0, :, 2, 2], atol=1e-6)
    with pytest.raises(ValueError, match="causal"):
        enc.score_mod(context(Sequence(3), b=1))


@pytest.mark.parametrize("name", RELATIVE)
def test_flex_sdpa_and_math_paths_agree(name):
    enc = build(name)
    mha = MultiHeadAttention(H * D, H, [enc])
    x = torch.randn(2, 6, H * D)
    # causal, per-example positions (packed documents); and bidirectional where defined
    coords_list = [Sequence(document_ids=torch.tensor([[0] * 4 + [1] * 2, [0] * 5 + [1]]), causal=True)]
    if name != "cope":
        coords_list.append(Sequence(6))
    for coords in coords_list:
        assert_routes_agree(mha, x, coords)


@pytest.mark.parametrize("name,kw", [(n, {}) for n in RELATIVE] + [("shaw", {"values": True})])
def test_gradients_reach_every_parameter(name, kw):
    spec = {"name": name, **kw}
    model = Transformer(H * D, H, 2, [spec], context={"max_len": 8})
    model(torch.randn(2, 10, H * D), Sequence(10, causal=True)).square().mean().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name,kw,match", [
    ("shaw", dict(max_relative_position=0), "max_relative_position"),
    ("huang_1", dict(max_relative_position=0), "max_relative_position"),
    ("huang_2", dict(max_relative_position=-1), "max_relative_position"),
    ("huang_3", dict(max_relative_position=0), "max_relative_position"),
    ("huang_4", dict(max_relative_position=0), "max_relative_position"),
    ("deberta", dict(position_buckets=1), "position_buckets"),
    ("deberta", dict(position_buckets=64, max_relative_positions=20), "max_relative_positions"),
    ("cope", dict(npos_max=1), "npos_max"),
    ("tener", dict(head_dim=7), "head_dim"),
    ("transformer_xl", dict(d_model=15), "d_model"),
])
def test_bad_options_raise(name, kw, match):
    with pytest.raises(ValueError, match=match):
        mmpe.build(name, context=CTX, **kw)


def test_head_count_mismatch_is_a_clear_error():
    enc = mmpe.build("transformer_xl", context=CTX)
    ctx = context()
    ctx.num_heads = 4
    with pytest.raises(ValueError, match="num_heads"):
        enc.score_mod(ctx)


def test_deberta_attention_equals_hf_disentangled_self_attention():
    tr = pytest.importorskip("transformers")
    from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention

    config = tr.DebertaV2Config(hidden_size=H * D, num_attention_heads=H, relative_attention=True,
                                position_buckets=4, max_relative_positions=16, share_att_key=False,
                                pos_att_type=["c2p", "p2c"], attention_probs_dropout_prob=0.0,
                                hidden_dropout_prob=0.0)
    peer = DisentangledSelfAttention(config).eval()
    enc = mmpe.build("deberta", context=CTX, position_buckets=4, max_relative_positions=16)
    mha = MultiHeadAttention(H * D, H, [enc]).eval()
    with torch.no_grad():
        for p in (*peer.parameters(), enc.rel_embeddings):
            p.normal_()
        mha.qkv.weight.copy_(torch.cat([peer.query_proj.weight, peer.key_proj.weight, peer.value_proj.weight]))
        mha.qkv.bias.copy_(torch.cat([peer.query_proj.bias, peer.key_proj.bias, peer.value_proj.bias]))
        mha.proj.weight.copy_(torch.eye(H * D))
        mha.proj.bias.zero_()
        enc.pos_key_proj.load_state_dict(peer.pos_key_proj.state_dict())
        enc.pos_query_proj.load_state_dict(peer.pos_query_proj.state_dict())
        x = torch.randn(2, 20, H * D)
        theirs = peer(x, torch.ones(2, 1, 20, 20), rel_embeddings=enc.rel_embeddings)[0]
        ours = mha(x, Sequence(20))
    assert (ours - theirs).abs().max() < 1e-4
