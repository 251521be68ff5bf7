"""The main job's console (issue 59, item 5): a recipe's Trainer prints no Lightning
advertisement ("💡 Tip … litlogger"), no `LeafSpec` deprecation warning, and no "Epoch 0/-2"
progress bar label on a steps-based run; `mmpe compare` prints each run (a line as it starts,
one with its metrics as it ends) and the table, nothing of Lightning's."""

from __future__ import annotations

import logging
import re
import warnings

import pytest

pytest.importorskip("lightning", reason="the recipes need mmpe[recipes]")

from mmpe.recipes import text
from mmpe.recipes.common import CONFIGS
from mmpe.recipes.compare import compare

pytestmark = pytest.mark.usefixtures("one_thread")

#: test_recipe_text's tiny run, with the progress bar left on
TINY = ["--trainer.max_steps", "4", "--trainer.val_check_interval", "2",
        "--trainer.limit_val_batches", "2",
        "--model.d_model", "32", "--model.depth", "1", "--model.num_heads", "2",
        "--data.eval_chars", "2048", "--data.batch_size", "8", "--data.context_length", "16"]

#: what the console must not show
NOISE = ("💡", "Tip:", "litlogger", "litmodels", "LeafSpec", "Epoch 0/-2", "/-2")


def _no_noise(output: str, caught: list[warnings.WarningMessage]) -> None:
    for noise in NOISE:
        assert noise not in output, f"{noise!r} printed:\n{output}"
    leaf = [str(w.message) for w in caught if "LeafSpec" in str(w.message)]
    assert not leaf, leaf


def test_a_recipe_trainer_prints_no_tip_no_leafspec_and_counts_steps(tmp_path, capfd,
                                                                     caplog) -> None:
    caplog.set_level(logging.INFO)  # under pytest, Lightning's log lines reach its handler
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # what is not filtered by message shows
        cli = text.make_cli(["--config", str(CONFIGS / "text" / "default.yaml"),
                             "--model.encoding", "alibi", "--trainer.default_root_dir",
                             str(tmp_path), "--trainer.logger", "false", *TINY], run=False)
        cli.trainer.fit(cli.model, cli.datamodule)
        text.evaluate_lengths(cli.trainer, cli.model, cli.datamodule)
    out = capfd.readouterr()
    _no_noise(out.out + out.err + caplog.text, caught)
    assert "to step 4" in out.out + out.err  # the bar is labelled by steps


def test_compare_prints_its_runs_and_the_table_only(tmp_path, capfd, caplog) -> None:
    caplog.set_level(logging.INFO)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = compare("text", "alibi,nope", out_dir=tmp_path / "out", seeds=1,
                        store=tmp_path / "store", cli_args=TINY, allow_dirty=True)
    print(table)
    out = capfd.readouterr()
    _no_noise(out.out + out.err + caplog.text, caught)
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("lightning")]
    for lightning_line in ("Seed set to", "GPU available", "TPU available", "Trainer.fit",
                           "Testing", "━"):
        assert lightning_line not in out.out + out.err, out
    lines = out.out.splitlines()
    run = r"\[mmpe compare text\] '(alibi|nope)' seed 0: "
    assert [bool(re.fullmatch(run + "training", line)) for line in lines[:4:2]] == [True, True]
    ended = [line for line in lines if re.fullmatch(run + r"1x [\d.]+, 2x .*\(\d+ s\)", line)]
    assert len(ended) == 2, lines
    assert lines[4].startswith("| encoding |"), lines
    assert out.err.strip() == "", out.err
