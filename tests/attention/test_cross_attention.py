"""Cross-attention between coordinate systems, and the decoder / Flamingo building blocks."""

from __future__ import annotations

import pytest
import torch

import mmpe
from mmpe import Cross, CrossAttention, Grid, Latents, MultiHeadAttention, Sequence, Sphere
from mmpe.cross_blocks import DecoderBlock, GatedCrossAttentionBlock, PerceiverResampler

D, H = 32, 4


def _enc(name: str, coords=None):
    ctx = {"num_heads": H, "head_dim": D // H, "d_model": D}
    if coords is not None and isinstance(coords, mmpe.Positioned):
        ctx["num_axes"] = coords.num_axes
    return mmpe.build(name, context=ctx)


def _paths(module, *args):
    outs = {}
    with torch.no_grad():
        for route in ("flex", "sdpa", "math"):
            module.route = route
            outs[route] = module(*args)
    for route, out in outs.items():
        torch.testing.assert_close(out, outs["math"], atol=2e-5, rtol=1e-4, msg=route)
    return outs["math"]


SAME = {
    "sequence": (lambda: Sequence(7), ["rope", "alibi", "t5", "fire", "kerple_log", "shaw"]),
    "grid": (lambda: Grid((2, 3), prefix_tokens=1), ["rope_axial", "alibi", "fire", "t5"]),
    "sphere": (lambda: Sphere(torch.tensor([0.0, 30.0, -45.0, 60.0]),
                              torch.tensor([0.0, 90.0, 170.0, -20.0])), ["alibi", "fire"]),
    "points": (lambda: mmpe.Points(torch.randn(6, 2)), ["alibi", "kerple_power", "rope_axial"]),
}


@pytest.mark.parametrize("kind", sorted(SAME))
def test_cross_with_identical_coordinates_equals_self_attention(kind: str) -> None:
    make, names = SAME[kind]
    coords = make()
    for name in names:
        enc = _enc(name, coords)
        torch.manual_seed(0)
        self_attn = MultiHeadAttention(D, H, [enc])
        cross = CrossAttention(D, H, [enc])
        with torch.no_grad():  # the same weights: q from qkv's first block, k/v from the rest
            w, b = self_attn.qkv.weight, self_attn.qkv.bias
            cross.q_proj.weight.copy_(w[:D])
            cross.q_proj.bias.copy_(b[:D])
            cross.kv_proj.weight.copy_(w[D:])
            cross.kv_proj.bias.copy_(b[D:])
            cross.proj.load_state_dict(self_attn.proj.state_dict())
        x = torch.randn(2, coords.num_queries, D)
        ref = _paths(self_attn, x, coords)
        out = _paths(cross, x, coords, x, coords)
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4, msg=f"{kind}/{name}")


def test_text_attending_to_an_image_grid() -> None:
    text, image = Sequence(5), Grid((3, 4), prefix_tokens=1)
    pair = Cross(text, image)
    # Positions on different numbers of axes, no shared space: no capability at all.
    assert not isinstance(pair, mmpe.Positioned) and not isinstance(pair, mmpe.Metric)
    x, img = torch.randn(2, 5, D), torch.randn(2, image.num_queries, 48)
    attn = CrossAttention(D, H, [mmpe.build("nope")], kv_dim=48)
    assert _paths(attn, x, text, img, image).shape == (2, 5, D)
    with pytest.raises(TypeError, match="Metric"):
        CrossAttention(D, H, [_enc("alibi")], kv_dim=48)(x, text, img, image)
    with pytest.raises(TypeError, match="Positioned"):
        CrossAttention(D, H, [_enc("rope_axial")], kv_dim=48)(x, text, img, image)


def test_rotary_rotates_each_side_by_its_own_positions() -> None:
    # Two 1D sequences at different offsets: RoPE scores depend on p_q − p_k only.
    q_side = Sequence(position_ids=torch.arange(10, 14))
    k_side = Sequence(position_ids=torch.arange(0, 6))
    pair = Cross(q_side, k_side)
    assert isinstance(pair, mmpe.Directed) and pair.causal is False
    rope = _enc("rope")
    q, k = torch.randn(1, H, 4, D // H), torch.randn(1, H, 6, D // H)
    rq, rk = rope(q, k, pair)
    shifted = Cross(Sequence(position_ids=torch.arange(110, 114)),
                    Sequence(position_ids=torch.arange(100, 106)))
    sq, sk = rope(q, k, shifted)
    torch.testing.assert_close(rq @ rk.transpose(-1, -2), sq @ sk.transpose(-1, -2),
                               atol=1e-4, rtol=1e-4)
    d = pair.distance(torch.arange(4)[:, None], torch.arange(6)[None])
    assert d[0, 0] == 10 and d[3, 5] == 8 and pair.extent(torch.tensor(0)) == 10


def test_grids_of_another_scale_share_no_space_and_padded_keys_are_masked() -> None:
    assert not isinstance(Cross(Grid((2, 2)), Grid((2, 2), scale=(2.0, 2.0))), mmpe.Metric)
    assert isinstance(Cross(Grid((2, 2)), Grid((3, 5))), mmpe.Metric)
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    keys = mmpe.Points(torch.randn(2, 4, 3), mask=mask)
    queries = mmpe.Points(torch.randn(2, 3, 3))
    attn = CrossAttention(D, H, [_enc("alibi")])
    x, mem = torch.randn(2, 3, D), torch.randn(2, 4, D)
    changed = mem.clone()
    changed[~mask] = 100.0  # padded keys never matter
    torch.testing.assert_close(_paths(attn, x, queries, changed, keys),
                               _paths(attn, x, queries, mem, keys))


def test_latents_have_no_position_and_bad_input_is_refused() -> None:
    lat = Latents(4)
    assert not isinstance(Cross(lat, Grid((2, 2))), mmpe.Positioned)
    with pytest.raises(ValueError, match="positive int"):
        Latents(0)
    attn = CrossAttention(D, H)
    with pytest.raises(ValueError, match="memory must be"):
        attn(torch.randn(1, 4, D), lat, torch.randn(1, 4, D + 1), Latents(4))
    with pytest.raises(ValueError, match="5 tokens but the coordinates have 4 keys"):
        attn(torch.randn(1, 4, D), lat, torch.randn(1, 5, D), Latents(4))
    with pytest.raises(ValueError, match="batch"):
        attn(torch.randn(2, 4, D), lat, torch.randn(1, 4, D), Latents(4))
    with pytest.raises(ValueError, match="batch 2 but the key side 3"):
        Cross(mmpe.Points(torch.randn(2, 3, 2)), mmpe.Points(torch.randn(3, 3, 2)))


def test_detr_style_decoder_and_encoder_decoder_caching() -> None:
    torch.manual_seed(0)
    block = DecoderBlock(D, H, [_enc("rope")], [], kv_dim=24)
    memory, mem_coords = torch.randn(2, 13, 24), Grid((3, 4), prefix_tokens=1)
    queries = torch.randn(2, 6, D)
    full = block(queries, Sequence(6, causal=True), memory, mem_coords)
    cache = mmpe.KVCache()
    first = block(queries[:, :5], Sequence(5, causal=True), memory, mem_coords, cache)
    last = block(queries[:, 5:], Sequence(1, offset=5, causal=True), memory, mem_coords, cache)
    torch.testing.assert_close(torch.cat((first, last), 1), full, atol=1e-5, rtol=1e-5)
    detr = DecoderBlock(D, H, [], [])  # object queries: no position on the query side
    out = detr(torch.randn(2, 10, D), Latents(10), torch.randn(2, 13, D), mem_coords)
    assert out.shape == (2, 10, D)
    out.sum().backward()
    assert all(p.grad is not None for p in detr.parameters())


def test_flamingo_gated_block_starts_as_identity_and_resampler_shapes() -> None:
    torch.manual_seed(0)
    resampler = PerceiverResampler(D, H, depth=2, num_latents=5, max_frames=3)
    video = torch.randn(2, 3, 8, D)  # 3 frames of 8 tubelet/patch features
    visual = resampler(video)
    assert visual.shape == (2, 5, D)
    assert resampler(video[:, :1]).shape == (2, 5, D)
    with pytest.raises(ValueError, match="4 frames but max_frames=3"):
        resampler(torch.randn(1, 4, 8, D))
    gated = GatedCrossAttentionBlock(D, H)
    text = torch.randn(2, 7, D)
    torch.testing.assert_close(gated(text, Sequence(7), visual, Latents(5)), text)
    loss = gated(text, Sequence(7), visual, Latents(5)).sum() + visual.sum()
    loss.backward()
    assert gated.attn_gate.grad is not None and resampler.time_embed.grad is not None


def test_a_distance_bias_between_grids_of_different_scale_says_why() -> None:
    """Grids of different scale have no distance between them: the capability error names both
    sides and the reason, where it used to say only that `Cross` lacks `Metric`."""
    queries, keys = mmpe.Grid((4, 4), scale=(1.0, 1.0)), mmpe.Grid((2, 2), scale=(2.0, 2.0))
    attn = mmpe.CrossAttention(16, 2, [mmpe.build("alibi", context={"num_heads": 2})])
    with pytest.raises(TypeError, match=r"scale=\(2\.0, 2\.0\).*not in one space"):
        attn(torch.randn(1, 16, 16), queries, torch.randn(1, 4, 16), keys)
    same = mmpe.Grid((2, 2), scale=(1.0, 1.0))
    assert attn(torch.randn(1, 16, 16), queries, torch.randn(1, 4, 16), same).shape == (1, 16, 16)
