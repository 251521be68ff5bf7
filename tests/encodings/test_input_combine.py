"""``Transformer(input_combine=...)``: input encodings added to or concatenated with the tokens."""

from __future__ import annotations

import io

import pytest
import torch

import mmpe
from mmpe.coords import Grid, Sequence
from mmpe.transformer import INPUT_COMBINE, ConcatProjection, Transformer, pe_width

D, H = 32, 4


def _pair(encoding, coords_context=None, **kw):
    """An ``add`` and a ``concat`` model with the same weights (the projection aside)."""
    ctx = {"max_len": 64, **(coords_context or {})}
    torch.manual_seed(0)
    add = Transformer(D, H, 2, [encoding], context=ctx, **kw)
    cat = Transformer(D, H, 2, [encoding], context=ctx, input_combine="concat", **kw)
    missing, unexpected = cat.load_state_dict(add.state_dict(), strict=False)
    assert not unexpected and sorted(missing) == ["input_projections.0.proj.bias",
                                                  "input_projections.0.proj.weight"]
    return add, cat


@pytest.mark.parametrize("encoding", ["sinusoidal", "learned", "conv_pe"])
def test_add_is_the_old_behaviour_bit_for_bit(encoding):
    torch.manual_seed(0)
    default = Transformer(D, H, 2, [encoding], context={"max_len": 64})
    torch.manual_seed(0)
    add = Transformer(D, H, 2, [encoding], context={"max_len": 64}, input_combine="add")
    assert add.state_dict().keys() == default.state_dict().keys()
    assert not any("input_projections" in k for k in add.state_dict())
    x, coords = torch.randn(2, 10, D), Sequence(10)
    # the old forward, written out: enc.combine, the blocks, the final norm
    h = x
    for enc in default.input_encodings:
        h = enc.combine(h, coords)
    for block in default.blocks:
        h = block(h, coords)
    assert torch.equal(add(x, coords), default.norm(h))
    assert torch.equal(default(x, coords), default.norm(h))


def test_concat_output_shape_and_gradient_reaches_the_projection():
    model = Transformer(D, H, 2, ["sinusoidal"], input_combine="concat")
    proj = model.input_projections[0]
    assert isinstance(proj, ConcatProjection) and proj.proj.weight.shape == (D, 2 * D)
    x = torch.randn(3, 12, D, requires_grad=True)
    out = model(x, Sequence(12))
    assert out.shape == (3, 12, D)
    out.square().sum().backward()
    g = proj.proj.weight.grad
    assert g is not None and g[:, :D].abs().sum() > 0 and g[:, D:].abs().sum() > 0
    assert proj.proj.bias.grad.abs().sum() > 0 and x.grad.abs().sum() > 0


def test_concat_with_identity_projection_equals_add():
    # W = [I | I], b = 0 is the initialisation: concat starts as the added model.
    add, cat = _pair("sinusoidal")
    w = cat.input_projections[0].proj.weight
    assert torch.equal(w, torch.cat((torch.eye(D), torch.eye(D)), dim=1))
    x, coords = torch.randn(2, 16, D), Sequence(16)
    torch.testing.assert_close(cat(x, coords), add(x, coords), rtol=0, atol=1e-6)


def test_building_the_projection_leaves_the_global_rng_alone():
    # same seed: every parameter but the projection starts as in the add model
    torch.manual_seed(3)
    add = Transformer(D, H, 2, ["learned"], context={"max_len": 16})
    after_add = torch.rand(1)
    torch.manual_seed(3)
    cat = Transformer(D, H, 2, ["learned"], context={"max_len": 16},
                      input_combine="concat")
    assert torch.equal(torch.rand(1), after_add)
    ref = add.state_dict()
    for key, value in cat.state_dict().items():
        if not key.startswith("input_projections"):
            assert torch.equal(value, ref[key]), key


def test_concat_closed_form():
    # Linear([x ; P]) = x W_x^T + P W_p^T + b for any W = [W_x | W_p]
    proj = ConcatProjection(D, 8)
    with torch.no_grad():
        proj.proj.weight.normal_()
        proj.proj.bias.normal_()
    x, pe = torch.randn(2, 5, D), torch.randn(5, 8)
    w = proj.proj.weight
    expect = x @ w[:, :D].T + pe @ w[:, D:].T + proj.proj.bias
    torch.testing.assert_close(proj(x, pe), expect)
    # a batched P is taken as is, a [1, s, d_pe] one broadcast
    pe_b = torch.randn(2, 5, 8)
    torch.testing.assert_close(proj(x, pe_b), x @ w[:, :D].T + pe_b @ w[:, D:].T + proj.proj.bias)
    torch.testing.assert_close(proj(x, pe[None]), expect)


def test_concat_trained_projection_differs_from_add():
    add, cat = _pair("learned")
    with torch.no_grad():
        cat.input_projections[0].proj.weight[:, D:] *= 0.5  # W_p = I/2: x + P/2
    x, coords = torch.randn(2, 8, D), Sequence(8)
    half = add.input_encodings[0](coords) * 0.5
    h = x + half
    for block in add.blocks:
        h = block(h, coords)
    torch.testing.assert_close(cat(x, coords), add.norm(h), rtol=0, atol=1e-5)


@pytest.mark.parametrize("bad", ["sum", "ADD", "", None, 1, ("add",)])
def test_bad_values_raise_naming_the_option_and_the_allowed_values(bad):
    with pytest.raises(ValueError, match=r"input_combine must be one of 'add', 'concat'"):
        Transformer(D, H, 1, ["sinusoidal"], input_combine=bad)
    assert INPUT_COMBINE == ("add", "concat")


def test_shape_mismatch_names_the_expected_shape():
    proj = ConcatProjection(D, 16, "sinusoidal")
    with pytest.raises(ValueError, match=r"P must be \[5, 16\] or \[2, 5, 16\]"):
        proj(torch.randn(2, 5, D), torch.randn(6, 16))
    with pytest.raises(ValueError, match=r"P must be \[5, 16\]"):
        proj(torch.randn(2, 5, D), torch.randn(5, D))
    with pytest.raises(ValueError, match=r"P must be"):
        proj(torch.randn(2, 5, D), torch.randn(3, 5, 16))
    with pytest.raises(ValueError, match=rf"x must be \[b, s, {D}\]"):
        proj(torch.randn(2, 5, D + 1), torch.randn(5, 16))
    with pytest.raises(ValueError, match="d_pe must be a positive int"):
        ConcatProjection(D, 0)
    model = Transformer(D, H, 1, ["sinusoidal"], input_combine="concat")
    with pytest.raises(ValueError, match=r"x must be \[b, s, 32\]"):
        model.input_projections[0](torch.randn(1, 4, 16), torch.randn(4, D))


def test_state_dict_round_trip():
    torch.manual_seed(1)
    model = Transformer(D, H, 2, ["sinusoidal"], input_combine="concat")
    with torch.no_grad():
        model.input_projections[0].proj.weight.add_(0.1 * torch.randn(D, 2 * D))
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    fresh = Transformer(D, H, 2, ["sinusoidal"], input_combine="concat")
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    x, coords = torch.randn(2, 7, D), Sequence(7)
    assert torch.equal(fresh(x, coords), model(x, coords))
    with pytest.raises(RuntimeError, match="input_projections"):
        Transformer(D, H, 2, ["sinusoidal"]).load_state_dict(model.state_dict())


def test_content_dependent_and_grid_encodings():
    # conv_pe: P = GELU(conv(x)) depends on the tokens; concat projects [x ; P]
    add, cat = _pair("conv_pe", None)
    x, coords = torch.randn(2, 20, D), Sequence(20)
    torch.testing.assert_close(cat(x, coords), add(x, coords), rtol=0, atol=1e-5)
    # a grid encoding with a prefix token: P has a zero row for the cls token
    grid = Grid((3, 4), prefix_tokens=1)
    add, cat = _pair("learned_grid", {"grid_shape": (3, 4)})
    x = torch.randn(2, 13, D)
    torch.testing.assert_close(cat(x, grid), add(x, grid), rtol=0, atol=1e-5)


def test_pe_width_reads_the_encodings_width():
    assert pe_width(mmpe.build("sinusoidal", d_model=24), D) == 24
    assert pe_width(mmpe.build("tabpet", d_model=D, width=8), D) == 8
    model = Transformer(D, H, 1, [mmpe.build("sinusoidal", d_model=16)], input_combine="concat")
    assert model.input_projections[0].proj.weight.shape == (D, D + 16)
    assert model(torch.randn(1, 5, D), Sequence(5)).shape == (1, 5, D)


def test_concat_without_an_input_encoding_warns_and_changes_nothing():
    with pytest.warns(UserWarning, match="no input encoding"):
        model = Transformer(D, H, 1, ["rope"], input_combine="concat")
    assert len(model.input_projections) == 0


# --- the recipes' models (need mmpe[recipes] and the data packages for the CLI) ------------
def test_text_recipe_model_forward():
    pytest.importorskip("lightning", reason="the recipes need mmpe[recipes]")
    from mmpe.recipes.text import CharLM

    for encoding in ("sinusoidal", "learned"):
        torch.manual_seed(0)
        add = CharLM(encoding, d_model=D, num_heads=H, depth=1, max_len=16)
        torch.manual_seed(0)
        cat = CharLM(encoding, d_model=D, num_heads=H, depth=1, max_len=16, input_combine="concat")
        tokens = torch.randint(0, 85, (2, 16))
        assert cat(tokens).shape == (2, 16, 85)
        torch.testing.assert_close(cat(tokens), add(tokens), rtol=0, atol=1e-5)  # [I | I] at init
        assert "transformer.input_projections.0.proj.weight" in cat.state_dict()
    with pytest.raises(ValueError, match="input_combine"):
        CharLM("sinusoidal", input_combine="stack")


def test_vision_and_audio_recipe_models_forward():
    pytest.importorskip("lightning", reason="the recipes need mmpe[recipes]")
    pytest.importorskip("torchaudio", reason="the audio recipe needs torchaudio")
    from mmpe.recipes.audio import SpectrogramTransformer
    from mmpe.recipes.vision import ViTClassifier

    for encoding in ("sincos", "learned_grid"):
        vit = ViTClassifier(encoding, d_model=D, num_heads=H, depth=1, input_combine="concat")
        assert vit.encoder.transformer.input_combine == "concat"
        assert vit(torch.randn(2, 1, 28, 28)).shape == (2, 10)
        assert vit(torch.randn(2, 1, 42, 42)).shape == (2, 10)  # a larger grid
    for encoding in ("conv_pe", "sincos"):
        ast = SpectrogramTransformer(encoding, d_model=D, num_heads=H, depth=1,
                                     input_combine="concat")
        assert ast(torch.randn(2, 100, 40)).shape == (2, 10)
        assert ast(torch.randn(2, 200, 40)).shape == (2, 10)
