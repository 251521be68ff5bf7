"""PackedGrids / PerImage: native-resolution packing of image grids (NaViT, timm NaFlex ViT).

Checked against timm 1.0.31's NaFlex ViT (`timm.models.naflexvit.NaFlexEmbeds`, whose
`_apply_learned_naflex_pos_embed` / `_apply_factorized_naflex_pos_embed` resample the learned
table per image grid), with a control that fails the same comparison; attention on a pack equals
attention on each image alone (hypothesis over shapes), and no image leaks into another.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpe
from mmpe.testing import assert_coordinates_contract

D, HEADS = 16, 2


# -- layout -----------------------------------------------------------------------------------
def test_layout_positions_ids_and_padding() -> None:
    p = mmpe.PackedGrids([(2, 3), (1, 2)], prefix_tokens=1, max_tokens=12)
    assert p.num_queries == p.num_keys == 12 and p.num_images == 2 and p.batch_size is None
    assert p.image_ids.tolist() == [0] * 7 + [1] * 3 + [-1, -1]
    assert p.prefix_mask.tolist() == [True] + [False] * 6 + [True, False, False, False, False]
    assert p.query_positions.tolist() == (
        [[0.0, 0.0]] + [[float(r), float(c)] for r in range(2) for c in range(3)]
        + [[0.0, 0.0], [0.0, 0.0], [0.0, 1.0]] + [[0.0, 0.0]] * 2)
    assert p.key_mask.tolist() == [True] * 10 + [False] * 2
    # Each image's positions are those of its own Grid.
    for grid, tokens in zip(p.grids(), p.unpack(p.query_positions[None]), strict=True):
        assert torch.equal(tokens, grid.query_positions)
    b = mmpe.PackedGrids([[(2, 2), (1, 3)], [(3, 3)]], max_tokens=10)
    assert b.batch_size == 2 and b.query_positions.shape == (2, 10, 2)
    assert b.image_ids.tolist() == [[0] * 4 + [1] * 3 + [-1] * 3, [0] * 9 + [-1]]
    assert b.distinct_shapes == [(2, 2), (1, 3), (3, 3)]


def test_block_diagonal_mask() -> None:
    p = mmpe.PackedGrids([[(2, 2), (1, 3)], [(3, 3)]], prefix_tokens=1, max_tokens=12)
    mask = p.dense_mask()[:, 0]
    ids = p.image_ids
    want = ((ids[:, :, None] == ids[:, None, :]) & (ids[:, None, :] >= 0)) | torch.eye(12, dtype=torch.bool)
    assert torch.equal(mask, want)
    assert mask[0, :5, :5].all() and not mask[0, :5, 5:].any()       # image 0 sees only itself
    assert not mask[0, :10, 10:].any() and torch.equal(mask[0, 10:, 10:], torch.eye(2, dtype=torch.bool))
    # One unpadded image per row needs no mask (as a Grid).
    assert mmpe.PackedGrids([[(2, 2)], [(1, 4)]]).mask_mod() is None


@pytest.mark.parametrize("make", [
    lambda: mmpe.PackedGrids([(2, 3), (1, 2)], prefix_tokens=1, max_tokens=12),
    lambda: mmpe.PackedGrids([[(2, 2), (1, 3)], [(3, 3)]], max_tokens=10),
    lambda: mmpe.PackedGrids([[(3, 2)], [(1, 1), (2, 2)]], prefix_tokens=2, metric="manhattan"),
    lambda: mmpe.PackedGrids([(2, 2, 2), (1, 2, 3)], metric="chebyshev"),
    lambda: mmpe.PackedGrids([(4, 4)]),
], ids=["one_pack_prefix_padded", "batch_padded", "batch_manhattan", "3d_chebyshev", "single"])
def test_coordinates_contract(make) -> None:
    p = make()
    assert_coordinates_contract(p)
    assert isinstance(p, mmpe.Metric) and isinstance(p, mmpe.Positioned)
    assert not isinstance(p, mmpe.GridLayout) and not isinstance(p, mmpe.Directed)


def test_pairs_equal_each_image_alone() -> None:
    """distance / extent of a pack's pairs inside one image = that image's Grid, for every metric."""
    for metric in ("euclidean", "manhattan", "chebyshev"):
        p = mmpe.PackedGrids([[(2, 3), (3, 1)], [(4, 2)]], prefix_tokens=1, metric=metric,
                             prefix_distance=0.5, max_tokens=12)
        b, _, q, k = mmpe.coords.index_grid(2, 1, 12, 12)
        dist, ext = p.distance(q, k, b)[:, 0], p.extent(q, b)[:, 0, :, 0]
        start = 0
        for row, pack in enumerate(p.image_shapes):
            start = 0
            for shape in pack:
                g = p.grid(shape)
                n = g.num_tokens
                gq, gk = torch.arange(n)[:, None], torch.arange(n)[None]
                sl = slice(start, start + n)
                torch.testing.assert_close(dist[row, sl, sl], g.distance(gq, gk), rtol=0, atol=0)
                torch.testing.assert_close(ext[row, sl], g.extent(torch.arange(n)), rtol=0, atol=0)
                start += n


# -- errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "match"), [
    ({"shapes": []}, "non-empty list"),
    ({"shapes": [[(2, 2)], []]}, r"shapes\[1\] must be a non-empty list"),
    ({"shapes": [(2, 0)]}, r"shapes\[0\] must be a tuple of positive ints"),
    ({"shapes": [(2, 2), (2, 2, 2)]}, r"shapes\[1\] = \(2, 2, 2\) has 3 axes"),
    ({"shapes": [(2, 2)], "prefix_tokens": -1}, "prefix_tokens must be an int >= 0"),
    ({"shapes": [(2, 2), (3, 3)], "max_tokens": 10}, "row 0 holds 13 tokens .* max_tokens is 10"),
    ({"shapes": [(2, 2)], "metric": "cosine"}, "metric must be one of"),
    ({"shapes": [(2, 2)], "prefix_distance": -1.0}, "prefix_distance must be"),
])
def test_bad_input(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        mmpe.PackedGrids(**kwargs)


def test_pack_errors_and_batch_index() -> None:
    p = mmpe.PackedGrids([(2, 2), (1, 3)], prefix_tokens=1)
    with pytest.raises(ValueError, match="must hold 2 tensors"):
        p.pack([torch.zeros(5, 4)])
    with pytest.raises(ValueError, match=r"tokens\[1\] must be \[3, d\]"):
        p.pack([torch.zeros(4, 4), torch.zeros(4, 4)], prefix=torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"x must be \[1, 9, d\]"):
        p.pool(torch.zeros(2, 9, 4))
    b = mmpe.PackedGrids([[(2, 2)], [(1, 3)]])
    with pytest.raises(ValueError, match="needs the batch index b"):
        b.distance(torch.tensor(0), torch.tensor(1))


def test_encodings_that_cannot_run_raise() -> None:
    p = mmpe.PackedGrids([(2, 2), (1, 3)], prefix_tokens=1)
    table = mmpe.build("learned_grid", d_model=D, grid_shape=(2, 2))
    with pytest.raises(TypeError, match=r"GridLayout needs shape.*wrap input encodings .* mmpe\.PerImage"):
        table(p)
    ctx = {"d_model": D, "num_heads": HEADS, "head_dim": D // HEADS, "max_len": 64,
           "grid_shape": (2, 2)}
    for name in ("shaw", "rope", "cope", "swin"):
        with pytest.raises((TypeError, ValueError), match="PackedGrids"):
            mmpe.build(name, context=ctx).check_coords(p)
    with pytest.raises(TypeError, match="must be an input encoding"):
        mmpe.PerImage(mmpe.build("alibi", num_heads=2))


# -- tokens -----------------------------------------------------------------------------------
def test_pack_unpack_pool_first_fit() -> None:
    shapes = [(2, 3), (4, 4), (1, 2), (3, 3), (2, 2)]
    p = mmpe.PackedGrids.first_fit(shapes, max_tokens=22, prefix_tokens=1)
    assert p.batched and len(p.image_tokens()) == 5
    assert p.source.tolist() == [0, 2, 3, 1, 4] and p.max_tokens == 22
    assert p.image_shapes == [[(2, 3), (1, 2), (3, 3)], [(4, 4), (2, 2)]]
    cells = [torch.randn(math.prod(shapes[i]), 3) for i in p.source.tolist()]
    cls = torch.randn(1, 3)
    x = p.pack(cells, prefix=cls)
    assert x.shape == (2, 22, 3) and torch.all(x[p.key_mask.logical_not()] == 0)
    for got, c in zip(p.unpack(x), cells, strict=True):
        assert torch.equal(got, torch.cat((cls, c)))
    torch.testing.assert_close(p.pool(x), torch.stack([c.mean(0) for c in cells]))
    assert torch.equal(p.pool(x, "first"), cls.expand(5, 3))
    with pytest.raises(ValueError, match="needs 17 tokens"):
        mmpe.PackedGrids.first_fit([(4, 4)], max_tokens=16, prefix_tokens=1)


# -- timm NaFlex ViT --------------------------------------------------------------------------
SHAPES = [(3, 5), (6, 2), (4, 4), (7, 7), (2, 9)]  # smaller, larger, equal, other aspect ratios


def _naflex(pos_embed: str):
    """timm's NaFlex patch embedding on SHAPES (one image per row, padded), and its inputs."""
    naflex = pytest.importorskip("timm.models.naflexvit")
    torch.manual_seed(0)
    emb = naflex.NaFlexEmbeds(patch_size=2, in_chans=1, embed_dim=D, proj_type="linear",
                              class_token=False, pos_embed=pos_embed, pos_embed_grid_size=(4, 4))
    with torch.no_grad():  # a table whose resampling matters: no two cells alike
        for prm in (emb.pos_embed, emb.pos_embed_y, emb.pos_embed_x):
            if prm is not None:
                prm.normal_()
    images = [torch.randn(1, 1, 2 * h, 2 * w) for h, w in SHAPES]
    n = max(h * w for h, w in SHAPES)
    patches, coord, valid = [], [], []
    for image, (h, w) in zip(images, SHAPES, strict=True):
        x, grid = naflex.batch_patchify(image, (2, 2))
        assert grid == (h, w)
        patches.append(torch.cat((x[0], x.new_zeros(n - h * w, x.shape[-1]))))
        yx = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij"), -1)
        coord.append(torch.cat((yx.reshape(-1, 2), torch.zeros(n - h * w, 2, dtype=torch.long))))
        valid.append(torch.arange(n) < h * w)
    with torch.no_grad():
        ref, _ = emb(torch.stack(patches), torch.stack(coord), torch.stack(valid))
    tokens = [emb.proj(naflex.batch_patchify(image, (2, 2))[0][0]) for image in images]
    return emb, tokens, [ref[i, : h * w] for i, (h, w) in enumerate(SHAPES)]


def _mmpe_embed(encoding, tokens, packed) -> list[torch.Tensor]:
    with torch.no_grad():
        return packed.unpack(packed.pack(tokens) + mmpe.PerImage(encoding)(packed))


def _close(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    return all(torch.allclose(g, w, atol=1e-5, rtol=1e-5) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("rows", [1, 2], ids=["one_pack", "two_packs"])
def test_learned_table_equals_timm_naflex(rows: int) -> None:
    emb, tokens, ref = _naflex("learned")
    shapes = SHAPES if rows == 1 else [SHAPES[:2], SHAPES[2:]]
    packed = mmpe.PackedGrids(shapes, max_tokens=160)
    table = mmpe.build("learned_grid", d_model=D, grid_shape=(4, 4))
    with torch.no_grad():
        table.table.copy_(emb.pos_embed.reshape(16, D))
    got = _mmpe_embed(table, tokens, packed)
    for g, w in zip(got, ref, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    # Control: a table not resampled per image — resampled once to the pack's bounding grid
    # (7×9) and cropped to each image (absolute patch indices) — fails the same comparison.
    with torch.no_grad():
        big = table.grid_table((7, 9)).reshape(7, 9, D)
        crop = [t + big[:h, :w].reshape(h * w, D) for t, (h, w) in zip(tokens, SHAPES, strict=True)]
    assert not _close(crop, ref)


def test_factorized_tables_equal_timm_naflex() -> None:
    emb, tokens, ref = _naflex("factorized")
    packed = mmpe.PackedGrids(SHAPES)
    fac = mmpe.build("factorized", d_model=D, grid_shape=(4, 4), groups=((0,), (1,)),
                     interpolation_1d="linear")
    with torch.no_grad():
        fac.tables[0].copy_(emb.pos_embed_y[0])
        fac.tables[1].copy_(emb.pos_embed_x[0])
    got = _mmpe_embed(fac, tokens, packed)
    for g, w in zip(got, ref, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    # Control: nearest-neighbour 1D tables (TimeSformer's default) fail the same comparison.
    fac.interpolation_1d = "nearest"
    assert not _close(_mmpe_embed(fac, tokens, packed), ref)


def test_per_image_input_encodings_equal_each_grid() -> None:
    p = mmpe.PackedGrids([[(2, 3), (3, 3)], [(1, 4)]], prefix_tokens=1, max_tokens=18)
    for enc in (mmpe.build("sincos", d_model=D), mmpe.build("learned_grid", d_model=D, grid_shape=(3, 3),
                                                            prefix_tokens=1)):
        out = mmpe.PerImage(enc)(p)
        assert out.shape == (2, 18, D) and torch.all(out[~p.key_mask] == 0)
        for got, grid in zip(p.unpack(out), p.grids(), strict=True):
            torch.testing.assert_close(got, enc(grid), rtol=0, atol=0)
        grid = mmpe.Grid((3, 3), prefix_tokens=1)
        assert torch.equal(mmpe.PerImage(enc)(grid), enc(grid))  # a plain grid: the encoding
    # Gradients reach the wrapped table through the per-token gather.
    enc = mmpe.PerImage(mmpe.build("learned_grid", d_model=D, grid_shape=(3, 3)))
    enc(p).sum().backward()
    assert enc.encoding.table.grad is not None and enc.encoding.table.grad.abs().sum() > 0


# -- attention: a pack equals each image alone --------------------------------------------------
def _attention(names: list[str], seed: int = 0) -> mmpe.MultiHeadAttention:
    torch.manual_seed(seed)
    ctx = {"d_model": D, "num_heads": HEADS, "head_dim": D // HEADS, "num_axes": 2}
    encs = [mmpe.build(n, context=ctx) for n in names]
    return mmpe.MultiHeadAttention(D, HEADS, encs)


def _alone_vs_packed(packed: mmpe.PackedGrids, attn, route: str, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    tokens = [torch.randn(n, D, generator=g) for n in packed.image_tokens()]
    x = packed.pack(tokens)
    attn.route = route
    with torch.no_grad():
        out = packed.unpack(attn(x, packed))
        alone = [attn(t[None], grid)[0] for t, grid in zip(tokens, packed.grids(), strict=True)]
    return out, alone


shape_st = st.tuples(st.integers(1, 4), st.integers(1, 4))


@settings(max_examples=20, deadline=None)
@given(packs=st.lists(st.lists(shape_st, min_size=1, max_size=3), min_size=1, max_size=2),
       prefix=st.integers(0, 2), pad=st.integers(0, 3),
       names=st.sampled_from([["rope_axial"], ["alibi"], ["rope_axial", "alibi"], ["fire"]]),
       route=st.sampled_from(["sdpa", "math"]))
def test_packed_attention_equals_each_image_alone(packs, prefix, pad, names, route) -> None:
    longest = max(sum(prefix + h * w for h, w in pack) for pack in packs)
    packed = mmpe.PackedGrids(packs, prefix_tokens=prefix, max_tokens=longest + pad)
    out, alone = _alone_vs_packed(packed, _attention(names), route)
    for got, want in zip(out, alone, strict=True):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_flex_block_mask_path_and_control() -> None:
    """FlexAttention (BlockMask from mask_mod) equals each image alone; without the packed
    mask (the same tokens as one grid-free row) the comparison fails."""
    packed = mmpe.PackedGrids([[(2, 3), (3, 3)], [(4, 2), (1, 1)]], prefix_tokens=1, max_tokens=18)
    attn = _attention(["rope_axial", "alibi"])
    for route in ("flex", "sdpa"):
        out, alone = _alone_vs_packed(packed, attn, route)
        for got, want in zip(out, alone, strict=True):
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)

    class Unmasked(mmpe.PackedGrids):
        def mask_mod(self):
            return None

    leaky = Unmasked([[(2, 3), (3, 3)], [(4, 2), (1, 1)]], prefix_tokens=1, max_tokens=18)
    out, alone = _alone_vs_packed(leaky, attn, "sdpa")
    assert not all(torch.allclose(g, w, atol=1e-3) for g, w in zip(out, alone, strict=True))


@settings(max_examples=15, deadline=None)
@given(pack=st.lists(shape_st, min_size=2, max_size=4), victim=st.integers(0, 3))
def test_no_cross_image_leakage(pack, victim) -> None:
    """Changing one image's tokens changes no other image's output (nor any padding row)."""
    victim %= len(pack)
    packed = mmpe.PackedGrids(pack, prefix_tokens=1, max_tokens=sum(1 + h * w for h, w in pack) + 2)
    attn = _attention(["rope_axial", "alibi"])
    x = torch.randn(1, packed.num_queries, D)
    y = x.clone()
    y[0, packed.image_ids == victim] += 10 * torch.randn(int((packed.image_ids == victim).sum()), D)
    with torch.no_grad():
        a, b = packed.unpack(attn(x, packed)), packed.unpack(attn(y, packed))
    for i, (u, v) in enumerate(zip(a, b, strict=True)):
        if i != victim:
            torch.testing.assert_close(u, v, atol=1e-6, rtol=0)


def test_transformer_on_packs_equals_each_image_alone() -> None:
    torch.manual_seed(0)
    table = mmpe.PerImage(mmpe.build("learned_grid", d_model=D, grid_shape=(3, 3), prefix_tokens=1))
    model = mmpe.Transformer(D, HEADS, 2, [table, "rope_axial", "alibi"]).eval()
    packed = mmpe.PackedGrids([[(2, 3), (3, 3)], [(4, 4)]], prefix_tokens=1, max_tokens=20)
    tokens = [torch.randn(n, D) for n in packed.image_tokens()]
    with torch.no_grad():
        out = packed.unpack(model(packed.pack(tokens), packed))
        for got, t, grid in zip(out, tokens, packed.grids(), strict=True):
            torch.testing.assert_close(got, model(t[None], grid)[0], atol=2e-5, rtol=1e-4)


# -- the vision recipe: mixed-resolution training -------------------------------------------
def test_vision_recipe_trains_on_packed_mixed_resolutions(tmp_path) -> None:
    pytest.importorskip("lightning", reason="the recipes need mmpe[recipes]")
    from mmpe.recipes import vision
    from mmpe.recipes.common import CONFIGS, MissingDataError

    try:
        vision.load_mnist()
    except MissingDataError as err:
        pytest.skip(str(err))
    cli = vision.make_cli([
        "--config", str(CONFIGS / "vision" / "mixed.yaml"),
        "--trainer.max_steps", "3", "--trainer.limit_val_batches", "1", "--trainer.val_check_interval", "3",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--data.train_samples", "96",
        "--data.eval_samples", "32", "--data.batch_size", "32", "--model.d_model", "32",
        "--model.depth", "1", "--model.warmup_steps", "1", "--model.max_tokens", "64",
    ], run=False)
    model, data = cli.model, cli.datamodule
    assert model.hparams.mixed_resolution is True  # linked from data.mixed_resolution
    assert isinstance(model.encoder.transformer.input_encodings[0], mmpe.PerImage)
    images, labels = next(iter(data.train_dataloader()))
    sizes = {tuple(x.shape[-2:]) for x in images}
    assert len(images) == len(labels) == 32 and len(sizes) > 5
    assert any(h != w for h, w in sizes) and all(h % 7 == 0 and w % 7 == 0 for h, w in sizes)
    before = model.encoder.transformer.input_encodings[0].encoding.table.detach().clone()
    cli.trainer.fit(model, data)
    assert cli.trainer.global_step == 3
    assert not torch.equal(before, model.encoder.transformer.input_encodings[0].encoding.table)
    # The packed forward equals classifying each digit alone; evaluation runs on square grids.
    model.eval()
    with torch.no_grad():
        packed = model(images[:6])
        alone = torch.cat([model(x[None]) for x in images[:6]])
    torch.testing.assert_close(packed, alone, atol=1e-4, rtol=1e-4)
    results = vision.evaluate_resolutions(cli.trainer, model, data, resolutions=(28,), canvases=())
    assert 0.0 <= results["28px"] <= 1.0
    with pytest.raises(ValueError, match="needs mixed_resolution=True"):
        vision.ViTClassifier(d_model=16, num_heads=2, depth=1)([torch.zeros(1, 14, 21)])
