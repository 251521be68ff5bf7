"""The multimodal recipe: digit strips, the four families, cached generation, the metrics."""

from __future__ import annotations

import pytest

pytest.importorskip("lightning", reason="the recipes need mmpe[recipes]")

import torch
from mmpe.recipes import multimodal as mm

SMALL = {"d_model": 32, "num_heads": 2, "depth": 2, "encoder_depth": 1, "num_latents": 8,
         "resampler_depth": 1}


@pytest.fixture(scope="module")
def data() -> mm.DigitStrips:
    return mm.DigitStrips(batch_size=8)


def test_text_encoding_and_metrics_on_a_hand_made_case() -> None:
    digits = torch.tensor([[3, 8, 1], [0, 0, 7]])
    text = mm.encode_text(digits)
    assert text.tolist() == [[mm.BOS, 3, mm.SPACE, 8, mm.SPACE, 1, mm.EOS],
                             [mm.BOS, 0, mm.SPACE, 0, mm.SPACE, 7, mm.EOS]]
    assert mm.decode_text(text[0, 1:]) == "3 8 1"
    assert mm.decode_text([5, mm.EOS, 6]) == "5"
    # right; one digit wrong; truncated; extra digits past the true length are ignored
    preds = ["3 8 1", "0 1 7"]
    assert mm.strip_metrics(preds, digits) == {"exact": 0.5, "digit": 5 / 6}
    assert mm.strip_metrics(["3 8", "0 0 7 9"], digits) == {"exact": 0.0, "digit": 5 / 6}
    assert mm.strip_metrics(["", "007"], digits) == {"exact": 0.0, "digit": 0.0}


def test_strips_shapes_and_held_out_split(data: mm.DigitStrips) -> None:
    images, digits = data.test_strips(3, 5)
    assert images.shape == (5, 1, 28, 84) and digits.shape == (5, 3)
    again, _ = data.test_strips(3, 5)
    assert torch.equal(images, again)  # fixed test set
    ds = mm.TrainStrips(*data.splits["train"], batch_size=4, max_k=4, num_batches=10)
    ks = {ds[(0, i)][0].shape[-1] // 28 for i in range(10)}
    assert ks <= {1, 2, 3, 4} and len(ks) > 1


def test_mrope_and_rope2d_coordinates() -> None:
    c = mm.strip_coords("mrope", (2, 3), 2, 8, torch.device("cpu"))
    assert c.query_positions[-2:].tolist() == [[3, 3, 3], [4, 4, 4]]  # text after the image
    step = mm.strip_coords("mrope", (2, 3), 2, 1, torch.device("cpu"))
    assert step.num_queries == 1 and step.num_keys == 8
    p = mm.strip_coords("rope2d", (2, 3), 2, 8, torch.device("cpu"))
    mask = p.dense_mask()[0, 0]
    assert mask[:6, :6].all() and not mask[:6, 6:].any()  # image: prefix, both ways
    assert mask[6, :7].all() and not mask[6, 7]             # text: causal


@pytest.mark.parametrize("family", mm.FAMILIES)
def test_family_trains_and_cached_generation_matches(family: str, data: mm.DigitStrips) -> None:
    torch.manual_seed(0)
    model = mm.StripReader(family=family, **SMALL)
    with torch.no_grad():  # open Flamingo's gates so the image matters in the check below
        for block in model.modules():
            if isinstance(block, mm.GatedCrossAttentionBlock):
                block.attn_gate.fill_(0.5)
                block.mlp_gate.fill_(0.5)
    images, digits = data.test_strips(2, 6)
    text = mm.encode_text(digits)
    assert model(images, text).shape == (6, 5, mm.VOCAB)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(3):
        loss = model.loss((images, digits))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    model.eval()
    wide, _ = data.test_strips(6, 3)  # wider than training
    for x in (images, wide):
        cached, plain = model.read(x, 9), model.read(x, 9, use_cache=False)
        assert cached == plain and len(cached) == x.shape[0]
    # the image prefix is cached too: one cached step equals the full forward
    bound = mm._Bound(model, images)
    full = model(images, text[:, :3])[:, -1]
    cache = model.make_cache()
    bound(text[:, :2], mm.Sequence(2, causal=True), cache)
    step = bound(text[:, 2:3], mm.Sequence(1, offset=cache.length, causal=True), cache)[:, -1]
    assert torch.allclose(step, full, atol=1e-5)


def test_unknown_family() -> None:
    with pytest.raises(ValueError, match="family must be one of"):
        mm.StripReader(family="blip")


def test_compare_takes_family_names() -> None:
    """`mmpe compare multimodal --encodings flamingo` names a family, not a registry encoding."""
    from mmpe.recipes.compare import resolve_encodings

    assert resolve_encodings(mm.COMPARE, "flamingo,llava", None) == ["flamingo", "llava"]
    with pytest.raises(KeyError, match="families: llava"):
        resolve_encodings(mm.COMPARE, "rope", None)


def test_gates_start_where_told_and_are_reported() -> None:
    model = mm.StripReader(family="flamingo", d_model=32, depth=2, gate_init=0.5)
    assert all(b.attn_gate.item() == 0.5 == b.mlp_gate.item() for b in model.decoder.xattn)
    assert all(b.attn_gate.item() == 0.0 for b in mm.StripReader(family="flamingo").decoder.xattn)
    with pytest.raises(ValueError, match="gate_init must be finite"):
        mm.StripReader(family="flamingo", gate_init=float("nan"))


@pytest.mark.slow
def test_short_training_learns_to_read(tmp_path) -> None:
    out = mm.run_one("mrope", seed=0, out_dir=tmp_path,
                     cli_args=["--trainer.max_steps", "150", "--data.batch_size", "32",
                               "--data.test_strips", "50"])
    assert set(out) == {f"{p}k={k}" for k in mm.EVAL_K for p in ("", "digit ")}
    assert out["digit_k=1"] > 0.3  # chance is 0.1
