"""Grid encodings: numbers vs timm / HF transformers / closed forms, resolution changes, bad input."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("timm", reason="timm (mmpe[timm]) gives the reference values")

import torch
import torch.nn.functional as F
from helpers import generic_bias
from timm.layers import resample_abs_pos_embed
from timm.layers.pos_embed_rel import (
    RelPosMlp,
    gen_relative_position_index,
    resize_rel_pos_bias_table,
)
from timm.layers.pos_embed_sincos import (
    RotaryEmbeddingCat,
    RotaryEmbeddingMixed,
    apply_rot_embed_cat,
    build_sincos2d_pos_embed,
)

import mmpe
from mmpe.attention import MultiHeadAttention, dense_bias
from mmpe.coords import Composite, Grid, Sequence
from mmpe.encodings.base import AttentionCall
from mmpe.encodings.swin import relative_position_index
from mmpe.transformer import Transformer


def bias(enc, grid, heads):
    return dense_bias([enc], AttentionCall(grid, heads, 8, 1))[0]


def timm_rotate(x, emb, half=False, prefix=1):
    return torch.cat((x[:, :, :prefix], apply_rot_embed_cat(x[:, :, prefix:], emb, half=half)), 2)


# -- sincos ----------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(5, 7), (4, 4)])
@pytest.mark.parametrize("temperature", [10000.0, 100.0])
def test_sincos_matches_timm(shape, temperature):
    g = Grid(shape, prefix_tokens=1)
    pe = mmpe.build("sincos", d_model=64, layout="timm", temperature=temperature)(g)
    ref = build_sincos2d_pos_embed(list(shape), 64, temperature=temperature)
    torch.testing.assert_close(pe[1:], ref, atol=1e-6, rtol=0)
    assert pe[0].abs().max() == 0  # cls token: zeros
    # MAE layout = timm reverse_coord + interleave, tokens transposed back to row-major
    mae = mmpe.build("sincos", d_model=64, temperature=temperature)(g)[1:]
    h, w = shape
    ref = build_sincos2d_pos_embed(list(shape), 64, temperature=temperature, reverse_coord=True,
                                   interleave_sin_cos=True).reshape(w, h, 64).transpose(0, 1)
    torch.testing.assert_close(mae, ref.reshape(h * w, 64), atol=1e-6, rtol=0)


def test_sincos_mae_closed_form_and_detr():
    # MAE get_2d_sincos_pos_embed: [sin(w·ω), cos(w·ω), sin(h·ω), cos(h·ω)], ω_k = 10000^(-k/F)
    g = Grid((3, 4))
    pe = mmpe.build("sincos", d_model=16)(g)
    omega = 1.0 / 10000 ** (torch.arange(4) / 4.0)
    hh, ww = g.grid_index[:, 0:1].float(), g.grid_index[:, 1:2].float()
    ref = torch.cat([(ww * omega).sin(), (ww * omega).cos(), (hh * omega).sin(), (hh * omega).cos()], 1)
    torch.testing.assert_close(pe, ref)
    from transformers.models.detr.modeling_detr import DetrSinePositionEmbedding

    for normalize in (False, True):
        enc = mmpe.build("sincos", d_model=64, layout="detr", normalize=normalize)
        ref = DetrSinePositionEmbedding(32, normalize=normalize)((1, 3, 5, 7), "cpu", torch.float32)
        torch.testing.assert_close(enc(Grid((5, 7))), ref[0].flatten(1).T, atol=1e-6, rtol=0)


def test_sincos_3d_and_errors():
    g = Grid((2, 3, 4), prefix_tokens=2)
    pe = mmpe.build("sincos", d_model=48, layout="timm")(g)
    assert pe.shape == (26, 48)
    # axis t (first) sin block depends only on t
    t = g.grid_index[:, 0].float()
    torch.testing.assert_close(pe[2:, :8], (t[:, None] / 10000 ** (torch.arange(8) / 8.0)).sin())
    with pytest.raises(ValueError, match="divisible by 2·axes = 6"):
        mmpe.build("sincos", d_model=64)(g)
    class Unplaced(mmpe.Coordinates):  # tokens with no position at all
        num_queries = 4

    with pytest.raises(TypeError, match="Positioned.*query_positions"):
        mmpe.build("sincos", d_model=64)(Unplaced())


# -- learned grid ----------------------------------------------------------------------------
@pytest.mark.parametrize("new", [(4, 5), (8, 10), (3, 7), (2, 2)])
def test_learned_grid_resample_equals_timm(new):
    enc = mmpe.build("learned_grid", d_model=32, grid_shape=(4, 5), prefix_tokens=1)
    pe = enc(Grid(new, prefix_tokens=1))
    posemb = torch.cat((enc.prefix, enc.table))[None]
    ref = resample_abs_pos_embed(posemb, list(new), old_size=[4, 5], num_prefix_tokens=1)[0]
    torch.testing.assert_close(pe, ref, atol=0, rtol=0)
    assert pe.shape == (1 + math.prod(new), 32)


def test_learned_grid_prefix_handling_resample_and_3d():
    enc = mmpe.build("learned_grid", d_model=8, grid_shape=(2, 3, 3))
    g = Grid((2, 3, 3), prefix_tokens=1)
    pe = enc(g)
    assert pe[0].abs().max() == 0  # no prefix table: zeros (timm no_embed_class)
    torch.testing.assert_close(pe[1:], enc.table)
    longer = enc(g.with_shape((4, 3, 3)))[1:]
    ref = F.interpolate(enc.table.T.reshape(1, 8, 2, 3, 3), size=(4, 3, 3), mode="trilinear",
                        align_corners=False).reshape(8, -1).T
    torch.testing.assert_close(longer, ref)
    with pytest.raises(ValueError, match="3 axes but the grid"):
        enc(Grid((4, 4)))
    two = mmpe.build("learned_grid", d_model=8, grid_shape=(3, 3), prefix_tokens=2)
    with pytest.raises(ValueError, match="2 prefix embeddings but the grid has 1"):
        two(Grid((3, 3), prefix_tokens=1))
    before = two(Grid((6, 6), prefix_tokens=2)).detach()
    two.resample_((6, 6))
    assert two.table.shape == (36, 8)
    torch.testing.assert_close(two(Grid((6, 6), prefix_tokens=2)), before)


# -- factorized ------------------------------------------------------------------------------
def test_factorized_is_time_plus_space_and_resamples_time():
    enc = mmpe.build("factorized", d_model=8, grid_shape=(2, 3, 3), prefix_tokens=1)
    g = Grid((2, 3, 3), prefix_tokens=1)
    pe = enc(g)
    assert pe.shape == (19, 8) and len(enc.tables) == 2
    assert enc.tables[0].shape == (2, 8) and enc.tables[1].shape == (9, 8)
    expected = enc.tables[0][:, None] + enc.tables[1][None]
    torch.testing.assert_close(pe[1:].view(2, 9, 8), expected)
    torch.testing.assert_close(pe[0], enc.prefix[0])
    longer = enc(g.with_shape((5, 3, 3)))[1:].view(5, 9, 8)
    time = F.interpolate(enc.tables[0].T[None], size=5, mode="nearest")[0].T  # TimeSformer
    torch.testing.assert_close(longer, time[:, None] + enc.tables[1][None])
    bigger = enc(g.with_shape((2, 6, 6)))[1:].view(2, 36, 8)
    space = resample_abs_pos_embed(enc.tables[1][None], [6, 6], old_size=[3, 3], num_prefix_tokens=0)
    torch.testing.assert_close(bigger, enc.tables[0][:, None] + space, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="partition"):
        mmpe.build("factorized", d_model=8, grid_shape=(2, 3), groups=((0,), (0, 1)))


# -- axial and mixed RoPE --------------------------------------------------------------------
@pytest.mark.parametrize("interleaved", [True, False])
def test_rope_axial_matches_timm_rotary_cat(interleaved):
    g = Grid((5, 7), prefix_tokens=1)
    q, k = torch.randn(2, 2, 3, 36, 32).unbind(0)
    enc = mmpe.build("rope_axial", head_dim=32, interleaved=interleaved, base=100.0)
    timm_rope = RotaryEmbeddingCat(32, in_pixels=False, temperature=100.0, rotate_half=not interleaved)
    for grid in (g, g.with_shape((9, 4))):  # a new resolution: same formula, no table
        emb = timm_rope.get_embed(list(grid.shape))
        q_, k_ = torch.randn(2, 2, 3, grid.num_tokens, 32).unbind(0)
        oq, ok = enc(q_, k_, grid)
        torch.testing.assert_close(oq, timm_rotate(q_, emb, not interleaved), atol=2e-6, rtol=1e-5)
        torch.testing.assert_close(ok, timm_rotate(k_, emb, not interleaved), atol=2e-6, rtol=1e-5)
    oq, _ = enc(q, k, g)
    torch.testing.assert_close(oq[:, :, 0], q[:, :, 0])  # prefix token: not rotated


def test_rope_axial_relative_and_errors():
    # scores depend only on per-axis offsets: shift both tokens by the same offset
    enc = mmpe.build("rope_axial", head_dim=24)
    g = Grid((4, 5, 6))
    v1, v2 = torch.randn(2, 24)

    def score(i, j):
        q = v1.expand(1, 1, g.num_tokens, 24).clone()
        k = v2.expand(1, 1, g.num_tokens, 24).clone()
        oq, ok = enc(q, k, g)
        return (oq[0, 0, i] * ok[0, 0, j]).sum()

    def tok(t, h, w):
        return (t * 5 + h) * 6 + w

    torch.testing.assert_close(score(tok(0, 1, 2), tok(1, 3, 0)), score(tok(2, 0, 3), tok(3, 2, 1)))
    with pytest.raises(ValueError, match=r"head_dim=16 must be divisible by 2·axes = 6"):
        enc16 = mmpe.build("rope_axial", head_dim=16)
        enc16(torch.randn(1, 1, 120, 16), torch.randn(1, 1, 120, 16), g)
    with pytest.raises(ValueError, match="divisible by 2·axes = 6"):
        mmpe.build("rope_axial", head_dim=20, num_axes=3)


def test_rope_mixed_matches_timm_and_learns():
    g = Grid((5, 7), prefix_tokens=1)
    timm_rope = RotaryEmbeddingMixed(48, depth=2, num_heads=3, temperature=10.0)
    enc = mmpe.build("rope_mixed", head_dim=16, num_heads=3)
    with torch.no_grad():  # timm grid_indexing="xy": freqs[0] is x (column) = mmpe axis 1
        enc.freqs.copy_(timm_rope.freqs[:, 1].flip(0))
    q, k = torch.randn(2, 2, 3, 36, 16).unbind(0)
    oq, ok = enc(q, k, g)
    emb = timm_rope.get_embed([5, 7])[1]
    torch.testing.assert_close(oq, timm_rotate(q, emb), atol=3e-6, rtol=1e-5)
    torch.testing.assert_close(ok, timm_rotate(k, emb), atol=3e-6, rtol=1e-5)
    (oq * ok).sum().backward()
    assert enc.freqs.grad is not None and enc.freqs.grad.abs().sum() > 0
    axial = mmpe.build("rope_mixed", head_dim=16, num_heads=3, rotate=False)
    # rotate=False: x-frequencies on the first half of the pairs, y on the second (axial)
    assert axial.freqs[0, :, 4:].abs().max() < 1e-6 and axial.freqs[1, :, :4].abs().max() < 1e-6
    with pytest.raises(ValueError, match="multiple of 4"):
        mmpe.build("rope_mixed", head_dim=18, num_heads=2)


# -- M-RoPE ------------------------------------------------------------------------------------
def test_mrope_matches_hf_qwen2vl():
    from transformers.models.qwen2_vl import modeling_qwen2_vl
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig

    Qwen2VLRotaryEmbedding = modeling_qwen2_vl.Qwen2VLRotaryEmbedding
    # HF renamed the rotation (transformers < 5.17: apply_multimodal_rotary_pos_emb).
    apply_rotary_pos_emb = getattr(modeling_qwen2_vl, "apply_rotary_pos_emb", None)
    if apply_rotary_pos_emb is None:
        pytest.skip("this transformers has no qwen2_vl.apply_rotary_pos_emb")

    cfg = Qwen2VLTextConfig(hidden_size=128, num_attention_heads=2, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 12, 12]})
    hf = Qwen2VLRotaryEmbedding(cfg)
    c = Composite([3, (3, 4), 2, (2, 2, 3), 4])
    q, k = torch.randn(2, 1, 2, c.num_queries, 64).unbind(0)
    cos, sin = hf(q, c.position_ids[:, None, :])
    rq, rk = apply_rotary_pos_emb(q, k, cos, sin)
    enc = mmpe.build("mrope", head_dim=64)
    assert enc.mrope_section == (8, 12, 12)
    oq, ok = enc(q, k, c)
    torch.testing.assert_close(oq, rq, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(ok, rk, atol=2e-6, rtol=1e-5)
    # text-only: plain 1D RoPE
    rope = mmpe.build("rope", head_dim=64)
    s = Sequence(6)
    torch.testing.assert_close(enc(q[..., :6, :], k[..., :6, :], s), rope(q[..., :6, :], k[..., :6, :], s))
    with pytest.raises(ValueError, match="summing to head_dim/2 = 32"):
        mmpe.build("mrope", head_dim=64, mrope_section=(8, 8, 8))


# -- Swin / BEiT table ---------------------------------------------------------------------
def test_relative_position_index_matches_timm():
    for shape in [(3, 5), (4, 4), (1, 6)]:
        assert torch.equal(relative_position_index(shape), gen_relative_position_index(shape))
        assert torch.equal(relative_position_index(shape, 1),
                           gen_relative_position_index(shape, class_token=True))
    idx3 = relative_position_index((2, 3, 4))
    assert idx3.min() == 0 and idx3.max() == 3 * 5 * 7 - 1 and idx3.unique().numel() == 3 * 5 * 7


@pytest.mark.filterwarnings("ignore::UserWarning")  # timm's interpolator indexing warning
@pytest.mark.parametrize("shape", [(4, 5), (6, 8)])
def test_swin_bias_and_interpolated_table_equal_timm(shape):
    enc = mmpe.build("swin", num_heads=3, grid_shape=(4, 5))
    grid = Grid(shape, prefix_tokens=1)
    b = bias(enc, grid, 3)
    table = enc.table
    if shape != (4, 5):
        table = resize_rel_pos_bias_table(enc.table, shape, ((2 * shape[0] - 1) * (2 * shape[1] - 1) + 3, 3),
                                          old_window_size=(4, 5))
    ref = table[gen_relative_position_index(shape, class_token=True)].permute(2, 0, 1)
    torch.testing.assert_close(b, ref, atol=1e-6, rtol=0)
    assert b.shape == (3, grid.num_tokens, grid.num_tokens)


def test_swin_without_prefix_bias_and_3d():
    enc = mmpe.build("swin", num_heads=2, grid_shape=(2, 3, 3), prefix_bias=False)
    g = Grid((2, 3, 3), prefix_tokens=1)
    b = bias(enc, g, 2)
    assert b[:, 0].abs().max() == 0 and b[:, :, 0].abs().max() == 0
    torch.testing.assert_close(b[:, 1:, 1:], enc.table[relative_position_index((2, 3, 3))].permute(2, 0, 1))
    longer = bias(enc, g.with_shape((3, 3, 3)), 2)
    assert longer.shape == (2, 28, 28) and torch.isfinite(longer).all()
    # trilinear with align_corners keeps the corner offsets
    assert torch.allclose(longer[:, 1, -1], b[:, 1, -1])


def test_swinv2_cpb_matches_timm_relposmlp():
    enc = mmpe.build("swinv2_cpb", num_heads=3, grid_shape=(4, 5), hidden=64)
    for shape in [(4, 5), (7, 9)]:
        ref = RelPosMlp(shape, num_heads=3, hidden_dim=64, prefix_tokens=1, mode="swin",
                        pretrained_window_size=(4, 5)).eval()
        with torch.no_grad():
            ref.mlp.fc1.weight.copy_(enc.mlp[0].weight)
            ref.mlp.fc1.bias.copy_(enc.mlp[0].bias)
            ref.mlp.fc2.weight.copy_(enc.mlp[2].weight)
        out = bias(enc, Grid(shape, prefix_tokens=1), 3)
        torch.testing.assert_close(out, ref.get_bias()[0], atol=1e-5, rtol=1e-5)
        assert 0 <= out.min() and out.max() <= 16


# -- every grid method in attention -----------------------------------------------------------
GRID_METHODS = {
    "sincos": {}, "learned_grid": {"grid_shape": (3, 4)}, "factorized": {"grid_shape": (3, 4)},
    "swin": {"grid_shape": (3, 4)}, "swinv2_cpb": {"grid_shape": (3, 4)},
    "rope_axial": {}, "rope_mixed": {}, "mrope": {}, "alibi": {}, "t5": {}, "fire": {},
}


@pytest.mark.parametrize("name", sorted(GRID_METHODS))
def test_grid_methods_registered_and_run_at_two_resolutions(name):
    entry = mmpe.registry.get(name)
    assert "grid" in entry.coords
    ctx = {"d_model": 32, "num_heads": 2, "head_dim": 16, **GRID_METHODS[name]}
    spec = {"name": name, **({"hidden": 32} if name == "swinv2_cpb" else {})}
    model = Transformer(32, 2, 1, [spec], context=ctx)
    for shape in [(3, 4), (5, 6)]:
        g = Grid(shape, prefix_tokens=1)
        out = model(torch.randn(2, g.num_tokens, 32), g)
        assert out.shape == (2, g.num_tokens, 32) and torch.isfinite(out).all()


@pytest.mark.parametrize("name", ["swin", "swinv2_cpb"])
def test_table_biases_flex_equals_eager(name):
    import warnings

    warnings.filterwarnings("ignore", message="flex_attention called without")
    g = Grid((3, 4), prefix_tokens=1)
    enc = mmpe.build(name, num_heads=2, grid_shape=(3, 4))
    flex = MultiHeadAttention(16, 2, [enc], route="flex")
    sdpa = MultiHeadAttention(16, 2, [enc], route="sdpa")
    sdpa.load_state_dict(flex.state_dict())
    x = torch.randn(1, g.num_tokens, 16)
    with torch.no_grad():  # FlexAttention has no backward on CPU
        torch.testing.assert_close(flex(x, g), sdpa(x, g), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name,opts", [("swin", {}), ("swin", {"prefix_bias": False}),
                                       ("swinv2_cpb", {"hidden": 16})])
@pytest.mark.parametrize("shape", [(3, 4), (5, 5)])
def test_gathered_bias_equals_score_mod(name, opts, shape):
    enc = mmpe.build(name, num_heads=2, grid_shape=(3, 4), **opts)
    for prefix in (0, 2):
        ctx = AttentionCall(Grid(shape, prefix_tokens=prefix), 2, 8, 1)
        torch.testing.assert_close(dense_bias([enc], ctx), generic_bias(enc, ctx))


@pytest.mark.parametrize("mode", ["bicubic", "bilinear", "nearest"])
def test_learned_grid_resamples_in_every_interpolation_mode(mode: str) -> None:
    """Each accepted mode resamples a 2D table (nearest raised inside torch: it takes no
    align_corners); nearest copies table entries, the others blend them."""
    enc = mmpe.build("learned_grid", d_model=8, grid_shape=(4, 4), interpolation=mode)
    with torch.no_grad():
        enc.table.copy_(torch.arange(16.0)[:, None].expand(16, 8))
    out = enc(mmpe.Grid((8, 8)))
    assert out.shape[-2:] == (64, 8)
    values = set(out.reshape(-1, 8)[:, 0].tolist())
    assert values <= set(range(16)) if mode == "nearest" else not values <= set(range(16))
