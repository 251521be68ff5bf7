"""mmpe encodings inside timm VisionTransformers: equivalence, training step, state_dict, resolution."""

from __future__ import annotations

import copy

import pytest
import torch

timm = pytest.importorskip("timm")

import mmpe  # noqa: E402
from mmpe.integrations.timm import TimmAttention, apply_encoding  # noqa: E402


def vit(**kw):
    torch.manual_seed(0)
    args = dict(pretrained=False, img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                num_classes=5)
    args.update(kw)
    return timm.create_model("vit_tiny_patch16_224", **args).eval()


def test_keep_pos_embed_without_encodings_is_identical_to_timm():
    ref, model = vit(), vit()
    apply_encoding(model, [], keep_pos_embed=True)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model(x), ref(x))


def test_learned_grid_reproduces_timm_vit_at_a_new_resolution():
    ref = vit(dynamic_img_size=True)
    model = vit(dynamic_img_size=True)
    pos = model.pos_embed.detach().clone()
    apply_encoding(model, "learned_grid")
    enc = model.mmpe_encodings[0]
    assert enc.grid_shape == (4, 4) and enc.prefix_tokens == 1
    with torch.no_grad():
        enc.prefix.copy_(pos[0, :1])
        enc.table.copy_(pos[0, 1:])
    for size in (32, 48, 56):  # 4x4 (training), 6x6 and 7x7 patch grids: bicubic resampling
        x = torch.randn(2, 3, size, size)
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-4)


def test_attention_wrapper_keeps_timm_keys_and_numbers_with_no_encoding():
    ref, model = vit(), vit()
    apply_encoding(model, [], keep_pos_embed=True)
    # Force the wrapper by giving a zero-slope ALiBi: identical numbers to timm's attention.
    model2 = vit()
    apply_encoding(model2, {"name": "alibi", "slopes": torch.zeros(2)}, keep_pos_embed=True)
    assert isinstance(model2.blocks[0].attn, TimmAttention)
    # timm's keys are kept; the encoding adds its own (ALiBi's slopes and settings).
    added = {k for k in model2.state_dict() if k.startswith("mmpe_encodings.")}
    assert set(ref.state_dict()) == set(model2.state_dict()) - added
    assert added == {"mmpe_encodings.0.slopes", "mmpe_encodings.0.settings.distance_unit"}
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model2(x), ref(x), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["learned_grid", "factorized", "rope_axial", "rope_mixed",
                                  "swin", "swinv2_cpb", "t5"])
def test_train_step_state_dict_round_trip_and_dynamic_size(name):
    model = vit(dynamic_img_size=True, reg_tokens=1)
    apply_encoding(model, name, share_encodings=name != "rope_mixed")
    assert model.pos_embed is None
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 5, (4,))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    enc_keys = [k for k in model.state_dict() if "mmpe_encodings" in k or "attn.encodings" in k]
    if name != "rope_axial":
        assert enc_keys and any(k in changed for k in enc_keys), "encoding parameters did not train"
    model.eval()
    fresh = vit(dynamic_img_size=True, reg_tokens=1)
    apply_encoding(fresh, name, share_encodings=name != "rope_mixed")
    fresh.load_state_dict(model.state_dict())
    for size in (32, 48):
        x = torch.randn(2, 3, size, size)
        torch.testing.assert_close(fresh(x), model(x))


def test_per_layer_encodings_and_errors():
    model = vit()
    apply_encoding(model, "rope_mixed", share_encodings=False)
    f0, f1 = model.blocks[0].attn.encodings[0].freqs, model.blocks[1].attn.encodings[0].freqs
    assert f0 is not f1 and not torch.equal(f0, f1)
    with pytest.raises(TypeError, match="timm VisionTransformer"):
        apply_encoding(torch.nn.Linear(2, 2), "sincos")
    with pytest.raises(ValueError, match="patch dropout"):
        apply_encoding(vit(patch_drop_rate=0.5), "sincos")
    fixed = vit()  # no dynamic_img_size: timm itself rejects other sizes
    apply_encoding(fixed, "rope_axial")
    assert fixed(torch.randn(1, 3, 32, 32)).shape == (1, 5)
    with pytest.raises(ValueError, match="already has mmpe encodings"):
        apply_encoding(fixed, "sincos")
    with pytest.raises(ValueError, match="divisible by 2·axes"):
        apply_encoding(vit(embed_dim=36, num_heads=2), "rope_axial")  # head_dim 18


def test_deepcopy_and_pickle_follow_the_copy():
    import copy
    import io

    model = vit(dynamic_img_size=True)
    apply_encoding(model, ["learned_grid", "swin"])
    ema = copy.deepcopy(model)
    with torch.no_grad():
        ema.mmpe_encodings[0].table.add_(torch.randn_like(ema.mmpe_encodings[0].table))
        ema.mmpe_encodings[1].table.add_(torch.randn_like(ema.mmpe_encodings[1].table))
    assert ema.blocks[0].attn.scores[0] is ema.mmpe_encodings[1]
    x = torch.randn(1, 3, 40, 40)
    assert not torch.allclose(ema(x), model(x))
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    torch.testing.assert_close(loaded(x), model(x))


def test_docstring_examples_run():
    import doctest

    import mmpe.coords.composite
    import mmpe.coords.grid
    import mmpe.integrations.timm

    for module in (mmpe.coords.grid, mmpe.coords.composite, mmpe.integrations.timm):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


# ----------------------------------------------------------------------------- beyond the plain ViT
def timm_model(name, **kw):
    torch.manual_seed(0)
    args = dict(pretrained=False, num_classes=5, img_size=32, patch_size=8, embed_dim=32, depth=2,
                num_heads=2)
    args.update(kw)
    return timm.create_model(name, **args).eval()


SWIN = dict(img_size=64, patch_size=4, window_size=4, embed_dim=16, depths=(2, 2), num_heads=(2, 4),
            depth=None)
EVA = ["vit_small_patch16_rope_224", "vit_small_patch16_rope_mixed_224", "eva02_tiny_patch14_224"]


def swin_model():
    args = {k: v for k, v in SWIN.items() if v is not None}
    torch.manual_seed(0)
    return timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, num_classes=5,
                             **args).eval()


def test_distilled_deit_learned_grid_reproduces_timm():
    ref = timm_model("deit_tiny_distilled_patch16_224")
    model = timm_model("deit_tiny_distilled_patch16_224")
    assert model.num_prefix_tokens == 2
    pos = model.pos_embed.detach().clone()
    apply_encoding(model, "learned_grid")  # was: timm crashed adding a None pos_embed
    enc = model.mmpe_encodings[0]
    with torch.no_grad():
        enc.prefix.copy_(pos[0, :2])  # cls, then the distillation token
        enc.table.copy_(pos[0, 2:])
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", EVA)
def test_eva_keeps_or_replaces_its_rope(name):
    ref = timm_model(name)
    x = torch.randn(2, 3, 32, 32)
    kept = timm_model(name)  # a zero-slope ALiBi forces mmpe's attention; timm's RoPE still applied
    apply_encoding(kept, {"name": "alibi", "slopes": torch.zeros(2)}, keep_pos_embed=True)
    assert isinstance(kept.blocks[0].attn, TimmAttention) and kept.rope is not None
    assert set(ref.state_dict()) == {k for k in kept.state_dict() if not k.startswith("mmpe_")}
    torch.testing.assert_close(kept(x), ref(x), atol=1e-5, rtol=1e-4)
    model = timm_model(name, dynamic_img_size=True)  # was: "patch dropout" error, then an unpack error
    apply_encoding(model, "rope_axial")
    assert model.rope is None and getattr(model, "pos_embed", None) is None
    out, theirs = model.forward_features(x), ref.forward_features(x)
    assert torch.isfinite(out).all()
    if name == "vit_small_patch16_rope_224":  # weak here: timm's layer scale (1e-5) hides
        # attention; test_rope_vit_rope_axial_equals_timm_where_attention_matters is the check
        torch.testing.assert_close(out, theirs, atol=1e-5, rtol=1e-4)
    if name.startswith("eva02"):  # EVA-02: base 10⁴ RoPE plus a learned pos_embed, both dropped
        assert not torch.allclose(out, theirs, atol=1e-3)
    assert model(torch.randn(1, 3, 48, 40)).shape == (1, 5)  # a 6x5 grid


def attention_matters(model):
    """Layer scale 1 (timm starts it at 1e-5) and weights of std 0.3 (timm: 0.02, near-uniform
    attention): the blocks' attention, and so the position encoding, changes the output."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.rsplit(".", 1)[-1] in ("gamma_1", "gamma_2") or ".ls" in n:
                p.fill_(1.0)
            elif p.dim() >= 2:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    return model


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


ROPE_VITS = [  # timm's RoPE-ViT, and the same model with each convention timm lets one change
    dict(),  # grid_indexing "xy", temperature 100, interleaved pairs
    dict(rope_rotate_half=True),
    dict(rope_grid_indexing="ij", rope_temperature=1000.0),
    dict(num_reg_tokens=2),
]


@pytest.mark.parametrize("kw", ROPE_VITS, ids=["rope_vit", "rotate_half", "ij_1000", "registers"])
@pytest.mark.parametrize("dynamic", [True, False])
def test_rope_vit_rope_axial_equals_timm_where_attention_matters(kw, dynamic):
    ref = attention_matters(timm_model("vit_small_patch16_rope_224", dynamic_img_size=dynamic, **kw))
    model = copy.deepcopy(ref)
    apply_encoding(model, "rope_axial")
    assert model.rope is None
    enc = model.mmpe_encodings[0]
    rope = ref.rope
    assert (enc.base, enc.grid_indexing, enc.interleaved) == (
        rope.temperature, rope.grid_indexing, not rope.rotate_half)
    controls = {  # each must fail the comparison that the model above passes
        "mmpe default convention": {"name": "rope_axial", "base": 10000.0, "grid_indexing": "ij",
                                    "interleaved": False},
        "other axis order": {"name": "rope_axial",
                             "grid_indexing": "ij" if rope.grid_indexing == "xy" else "xy"},
        "no position encoding": [],
    }
    others = {}
    for label, spec in controls.items():
        others[label] = copy.deepcopy(ref)
        apply_encoding(others[label], spec)
    sizes = [(32, 32), (24, 40), (40, 24)] if dynamic else [(32, 32)]  # 4x4, 3x5, 5x3 grids
    for size in sizes:
        x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(size[1]))
        theirs = ref.forward_features(x)
        ours = model.forward_features(x)
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
        assert _rel(ours, theirs) < 1e-5
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
        for label, other in others.items():
            assert _rel(other.forward_features(x), theirs) > 0.1, (label, size)


def test_rope_axial_takes_the_model_convention_unless_told_otherwise():
    from mmpe.integrations.timm import rope_axial_options

    rope_vit = timm_model("vit_small_patch16_rope_224")
    assert rope_axial_options(rope_vit) == {"base": 100.0, "grid_indexing": "xy", "interleaved": True}
    assert rope_axial_options(timm_model("vit_small_patch16_rope_mixed_224")) == {}
    assert rope_axial_options(vit()) == {}
    # EVA-02: frequencies, axis order, layout read; positions rescaled to ref_feat_shape (not exact)
    assert rope_axial_options(timm_model("eva02_tiny_patch14_224")) == {
        "base": 10000.0, "grid_indexing": "ij", "interleaved": True}
    for spec, opts, expected in [
        ({"name": "rope_2d", "base": 50.0}, {}, (50.0, "xy", True)),  # alias; the spec's base wins
        ("rope_axial", {"grid_indexing": "ij"}, (100.0, "ij", True)),  # **options win
    ]:
        model = timm_model("vit_small_patch16_rope_224")
        apply_encoding(model, spec, **opts)
        enc = model.mmpe_encodings[0]
        assert (enc.base, enc.grid_indexing, enc.interleaved) == expected
    per_layer = timm_model("vit_small_patch16_rope_224")
    apply_encoding(per_layer, ["rope_axial", "t5"], share_encodings=False)
    assert all(blk.attn.encodings[0].grid_indexing == "xy" for blk in per_layer.blocks)
    kept = timm_model("vit_small_patch16_rope_224")  # timm's RoPE kept: mmpe's adds to it as built
    apply_encoding(kept, "rope_axial", keep_pos_embed=True)
    assert kept.rope is not None and kept.mmpe_encodings[0].grid_indexing == "ij"
    built = mmpe.build("rope_axial", head_dim=16)  # a built encoding is used as given
    apply_encoding(timm_model("vit_small_patch16_rope_224"), built)
    assert (built.base, built.grid_indexing, built.interleaved) == (10000.0, "ij", False)


@pytest.mark.parametrize("name,kw", [("beit_base_patch16_224", {}),
                                     ("swin_tiny_patch4_window7_224", {"prefix_bias": False})])
def test_bias_tables_as_mmpe_swin_reproduce_timm(name, kw):
    """BEiT's and Swin's relative bias tables are mmpe's ``swin`` encoding (per block)."""
    ref = swin_model() if name.startswith("swin") else timm_model(name)
    with torch.no_grad():  # timm starts them at 0: give them values
        for n, p in ref.named_parameters():
            if n.endswith("relative_position_bias_table"):
                p.normal_()
    model = copy.deepcopy(ref)
    tables = [blk.attn.relative_position_bias_table.detach().clone() for blk in _blocks(model)]
    apply_encoding(model, {"name": "swin", **kw}, share_encodings=False)
    for blk, table in zip(_blocks(model), tables, strict=True):
        assert blk.attn.encodings[0].table.shape == table.shape
        with torch.no_grad():
            blk.attn.encodings[0].table.copy_(table)
    assert not any("relative_position_bias_table" in k for k in model.state_dict())
    size = 64 if name.startswith("swin") else 32
    x = torch.randn(2, 3, size, size)
    torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-4)
    kept = copy.deepcopy(ref)  # keep_pos_embed: timm's tables stay, mmpe adds to them
    apply_encoding(kept, {"name": "alibi", "slopes": torch.zeros(kept_heads(kept))}
                   if not name.startswith("swin") else [], keep_pos_embed=True)
    torch.testing.assert_close(kept(x), ref(x), atol=1e-5, rtol=1e-4)


def _blocks(model):
    if hasattr(model, "layers"):
        return [blk for stage in model.layers for blk in stage.blocks]
    return list(model.blocks)


def kept_heads(model):
    return model.blocks[0].attn.num_heads


@pytest.mark.parametrize("name,encodings,share", [
    ("deit_tiny_distilled_patch16_224", ["learned_grid", "alibi"], True),
    ("vit_small_patch16_rope_224", ["rope_axial", "t5"], True),
    ("eva02_tiny_patch14_224", ["rope_mixed"], False),
    ("beit_base_patch16_224", ["t5"], True),
    ("swin_tiny_patch4_window7_224", ["rope_axial", "swin"], True),
])
def test_tested_models_train_and_round_trip(name, encodings, share):
    make = swin_model if name.startswith("swin") else (lambda: timm_model(name))
    model = make()
    apply_encoding(model, encodings, share_encodings=share)
    model.train()
    size = 64 if name.startswith("swin") else 32
    x, y = torch.randn(2, 3, size, size), torch.randint(0, 5, (2,))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.nn.functional.cross_entropy(model(x), y).backward()
    torch.optim.AdamW(model.parameters(), lr=1e-2).step()  # grads are tiny: timm's head starts ~0
    enc_keys = [k for k in model.state_dict() if "encodings" in k and model.state_dict()[k].is_floating_point()]
    assert any(not torch.equal(model.state_dict()[k], before[k]) for k in enc_keys)
    model.eval()
    fresh = make()
    apply_encoding(fresh, encodings, share_encodings=share)
    fresh.load_state_dict(model.state_dict())
    torch.testing.assert_close(fresh(x), model(x))


def test_swin_and_eva_errors():
    with pytest.raises(ValueError, match="no input encodings"):
        apply_encoding(swin_model(), "sincos")
    with pytest.raises(ValueError, match="additive"):
        apply_encoding(swin_model(), "da_transformer")
    with pytest.raises(ValueError, match="names or configs"):
        apply_encoding(swin_model(), mmpe.build("alibi", num_heads=2))
    with pytest.raises(ValueError, match="patch dropout"):
        apply_encoding(timm_model("eva02_tiny_patch14_224", patch_drop_rate=0.5), "rope_axial")


@pytest.mark.parametrize(("name", "cls", "why"), [
    ("vit_relpos_small_patch16_224", "VisionTransformerRelPos", "shared_rel_pos"),
    ("xcit_nano_12_p16_224", "Xcit", "cross-covariance"),
    ("cait_xxs24_224", "Cait", "class-attention"),
])
def test_models_whose_attention_mmpe_cannot_take_are_refused_by_name(name, cls, why) -> None:
    """They used to fail deep inside (an unexpected keyword, a missing grid_size, None + Tensor)
    at the first forward; now before anything is changed, naming the class and the reason."""
    model = timm.create_model(name, pretrained=False, num_classes=10)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(TypeError, match=rf"{cls} is not supported: .*{why}"):
        apply_encoding(model, "alibi")
    assert not hasattr(model, "mmpe_grid_state")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
