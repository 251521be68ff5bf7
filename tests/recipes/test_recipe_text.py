import math

import pytest

pytest.importorskip("lightning", reason="the recipes need mmpe[recipes]")

import torch
from mmpe.recipes import text
from mmpe.recipes.common import CONFIGS

TINY = ["--trainer.max_steps", "4", "--trainer.val_check_interval", "2",
        "--trainer.limit_val_batches", "2", "--trainer.enable_progress_bar", "false",
        "--model.d_model", "32", "--model.depth", "1", "--model.num_heads", "2",
        "--data.eval_chars", "2048", "--data.batch_size", "8", "--data.context_length", "16"]


def test_split_is_by_play_and_disjoint():
    plays = text.shakespeare_plays()
    assert len(plays) == 42
    split = text.split_plays(list(plays), 4, 4)
    assert [len(split[k]) for k in ("train", "val", "test")] == [34, 4, 4]
    assert not set(split["train"]) & (set(split["val"]) | set(split["test"]))
    assert "sonnets" in split["train"] and not (set(split["test"]) & text.POEMS)
    with pytest.raises(ValueError, match="val_plays"):
        text.split_plays(list(plays), 0, 4)
    assert split == text.split_plays(list(plays), 4, 4)  # deterministic


def test_vocabulary_and_windows():
    data = text.ShakespeareData(context_length=16, eval_chars=1024)
    assert 60 < data.vocab_size < 100 and data.vocab[0] == "<unk>"
    batch = next(iter(data.eval_dataloader("test", 64)))
    assert batch.shape[1] == 65
    # consecutive non-overlapping windows share their boundary character as target/input
    assert torch.equal(batch[0, -1], batch[1, 0])


def test_run_one_trains_and_evaluates_every_length(tmp_path):
    out = text.run_one("alibi", seed=0, out_dir=tmp_path, cli_args=TINY)
    assert list(out) == ["1x", "2x", "4x", "8x", "16x"]
    assert all(v is not None and math.isfinite(v) and 0 < v < 8 for v in out.values())
    assert (tmp_path / "lightning_logs").exists()


def test_learned_reports_na_past_its_table(tmp_path):
    out = text.run_one("learned", seed=0, out_dir=tmp_path, cli_args=TINY)
    assert out["1x"] is not None and all(out[k] is None for k in ("2x", "4x", "8x", "16x"))


@pytest.mark.slow
def test_default_training_learns_well_below_unigram(tmp_path):
    out = text.run_one("alibi", seed=0, out_dir=tmp_path, cli_args=["--trainer.enable_progress_bar", "false"])
    assert out["1x"] < 3.0  # unigram entropy of the text is ~4.8 bits/char
    assert out["16x"] < out["1x"] + 0.1  # ALiBi holds past the training length


def test_generate_from_a_trained_checkpoint_with_and_without_cache(tmp_path, capsys):
    text.run_one("rope", seed=0, out_dir=tmp_path, cli_args=TINY)
    ckpt = next(tmp_path.rglob("last.ckpt"))
    greedy = text.generate_text(ckpt, "ROMEO.\n", 24, temperature=0.0)
    assert greedy.startswith("ROMEO.\n") and len(greedy) == len("ROMEO.\n") + 24
    assert greedy == text.generate_text(ckpt, "ROMEO.\n", 24, temperature=0.0, use_cache=False)
    sampled = text.generate_text(ckpt, "To be", 12, temperature=0.8, top_k=10, seed=3)
    vocab = set(text.ShakespeareData(context_length=16).vocab)
    assert len(sampled) == 17 and set(sampled[5:]) <= vocab | {"\ufffd"}
    assert text.generate_main(["--checkpoint", str(ckpt), "--prompt", "KING", "--max_new_tokens",
                               "8", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("KING")
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        text.generate_text(tmp_path / "missing.ckpt", "x")


@pytest.mark.parametrize("combine", ["add", "concat"])
def test_input_combine_is_a_cli_option(combine):
    cli = text.make_cli(["--config", str(CONFIGS / "text" / "default.yaml"),
                         "--model.encoding", "sinusoidal", "--model.input_combine", combine,
                         "--trainer.logger", "false", *TINY], run=False)
    model = cli.model
    assert model.hparams.input_combine == combine
    assert len(model.transformer.input_projections) == (combine == "concat")
    assert model(torch.randint(0, model.hparams.vocab_size, (2, 16))).shape[:2] == (2, 16)


def test_input_combine_rejects_other_values():
    with pytest.raises(ValueError, match="input_combine must be one of 'add', 'concat'"):
        text.CharLM("learned", input_combine="sum")


def test_all_resolves_to_what_runs_on_a_causal_lm():
    """`mmpe compare text --encodings all` must not pick encodings that refuse a causal
    sequence (conv_pe reads future frames): the run stopped there."""
    from mmpe.recipes.compare import resolve_encodings

    names = resolve_encodings(text.COMPARE, "all", None)
    assert "conv_pe" not in names and {"rope", "alibi", "fox", "stick_breaking"} <= set(names)
