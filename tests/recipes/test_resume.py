"""Resuming is exact, for every recipe: ``fit`` for 2N steps straight, then ``fit --ckpt_path``
from the checkpoint the straight run saved after N steps, to 2N. The resumed run must train on
the very batches the straight run trained on in its last N steps (sample fingerprints, epoch and
batch index per step) and end with the same parameters (float tolerance; measured: equal).

Resume points fall mid-epoch, at an epoch's end, across validation runs, with dropout and
per-epoch random offsets. The text recipe runs in the default session (one device, and two
``ddp_fork`` ranks); the others are ``slow`` (``make test-slow``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning", reason="the recipes need mmpe[recipes]")

import torch
from helpers import run_in_fresh_process
from lightning.pytorch.callbacks import ModelCheckpoint
from mmpe.recipes import tabular
from mmpe.recipes.common import CONFIGS, planned_steps
from test_distributed import TINY, max_param_diff, one_thread, recorder_arg, run_in_process

# A resumed run logs to a new version directory; Lightning warns that the checkpoint directory changed.
pytestmark = pytest.mark.filterwarnings("ignore:The dirpath has changed")

#: Extra arguments so that the N + N steps cross an epoch boundary on one device.
EPOCHS: dict[str, list[str]] = {"vision": ["--data.train_samples", "24"]}
TOLERANCE = 1e-6


def _rank_records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def check_resume(recipe: str, folder: Path, monkeypatch: pytest.MonkeyPatch, n: int = 4,
                 extra: list[str] | None = None) -> float:
    """2n steps straight vs n + resume n; returns the largest parameter difference."""
    args = [*EPOCHS.get(recipe, []), *(extra or []), "--trainer.max_steps", str(2 * n),
            "--checkpoint.every_n_train_steps", str(n), "--checkpoint.save_top_k", "-1"]
    run_in_process(recipe, folder, [*args, *recorder_arg(folder / "straight")], monkeypatch)
    versions = sorted(folder.glob("runs/*/lightning_logs/version_*"))
    assert len(versions) == 1 and (versions[0] / "config.yaml").exists()
    (ckpt,) = versions[0].glob(f"checkpoints/epoch=*-step={n}.ckpt")
    run_in_process(recipe, folder, [*args, *recorder_arg(folder / "resumed"), "--ckpt_path", str(ckpt)],
                   monkeypatch)

    straight, resumed = _rank_records(folder / "straight"), _rank_records(folder / "resumed")
    assert straight and len(straight) == len(resumed)
    for a, b in zip(straight, resumed, strict=True):
        assert len(a["steps"]) == 2 * n and len(b["steps"]) == n
        assert b["steps"][0]["ids"] != a["steps"][0]["ids"], "the resumed run replays the first batch"
        assert b["steps"] == a["steps"][n:], "the resumed run trains on other batches"
    diff = max(max_param_diff(torch.load(folder / "straight" / f"rank{r}.pt"),
                              torch.load(folder / "resumed" / f"rank{r}.pt")) for r in range(len(straight)))
    assert diff <= TOLERANCE, f"{recipe}: straight and resumed parameters differ by {diff}"
    # The optimizer state of the two last checkpoints agrees as well.
    last = [torch.load(v / "checkpoints" / "last.ckpt", weights_only=False)
            for v in sorted(folder.glob("runs/*/lightning_logs/version_*"))]
    assert [c["global_step"] for c in last] == [2 * n, 2 * n]
    moments = [[t for s in c["optimizer_states"][0]["state"].values() for t in s.values()
                if torch.is_tensor(t) and t.dim() > 0] for c in last]
    assert len(moments[0]) == len(moments[1]) > 0
    assert max(float((x - y).abs().max()) for x, y in zip(*moments, strict=True) if x.numel()) <= TOLERANCE
    return diff


def test_text_resume_mid_epoch_is_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 6 batches per epoch: the checkpoint at step 4 is mid-epoch 0, the run ends in epoch 1.
    diff = check_resume("text", tmp_path, monkeypatch, n=4)
    print(f"\ntext resume mid-epoch: max parameter difference {diff}")


def test_text_resume_at_epoch_end_is_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 3 batches per epoch: the checkpoint at step 3 closes epoch 0.
    diff = check_resume("text", tmp_path, monkeypatch, n=3, extra=["--data.samples_per_epoch", "12"])
    print(f"\ntext resume at epoch end: max parameter difference {diff}")


def test_text_resume_under_ddp_is_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 2 ranks x 3 batches per epoch: the checkpoint at step 4 is mid-epoch 1.
    if run_in_fresh_process(__file__, "test_text_resume_under_ddp_is_exact"):
        return
    diff = check_resume("text", tmp_path, monkeypatch, n=4, extra=[
        "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp_fork"])
    print(f"\ntext resume under DDP (2 ranks): max parameter difference {diff}")


@pytest.mark.slow
def test_text_resume_with_workers_is_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Workers prefetch batches: the loader counts the batches it hands out, not those fetched.
    diff = check_resume("text", tmp_path, monkeypatch, n=4, extra=["--data.num_workers", "2"])
    print(f"\ntext resume with 2 workers: max parameter difference {diff}")


def test_tabular_schedule_length_is_lightnings_estimate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tabular recipe sizes its schedule without loading the data (which would break resume)
    and gets the number Lightning estimates once the data is loaded."""
    with one_thread(monkeypatch):
        cli = tabular.make_cli(["--config", str(CONFIGS / "tabular/default.yaml"), "--data.batch_size", "16",
                                "--trainer.max_epochs", "2", "--trainer.accumulate_grad_batches", "2",
                                "--trainer.limit_train_batches", "5", "--trainer.limit_val_batches", "0",
                                "--trainer.logger", "false",
                                "--trainer.enable_checkpointing", "false", "--model.d_model", "8",
                                "--model.depth", "1", "--model.num_heads", "2",
                                "--trainer.default_root_dir", str(tmp_path)], run=False)
        cli.trainer.fit(cli.model, cli.datamodule)
    size = len(cli.datamodule.data["train"][2])
    assert not any(isinstance(c, ModelCheckpoint) for c in cli.trainer.callbacks)
    for max_steps in (-1, 4):  # the epoch count decides, then max_steps
        cli.trainer.fit_loop.epoch_loop.max_steps = max_steps
        assert planned_steps(cli.trainer, size, 16) == cli.trainer.estimated_stepping_batches


@pytest.mark.slow
@pytest.mark.parametrize("recipe", [r for r in TINY if r != "text"])
def test_recipe_resume_is_exact(recipe: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    diff = check_resume(recipe, tmp_path, monkeypatch)
    print(f"\n{recipe} resume: max parameter difference {diff}")
