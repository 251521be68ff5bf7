"""Every recipe under DDP: 2 CPU processes (gloo), a few steps with a tiny model.

A callback records a fingerprint of every sample each rank trains on; the ranks must see
disjoint samples within an epoch (up to the few that Lightning's ``DistributedSampler`` repeats
to even out the ranks), different batches at every step, and end with equal parameters. The run
must leave its resolved config and its checkpoints in its log directory.

The ``slow`` tests (``make test-slow``) launch every recipe the way a user does, as
``python -m mmpe.recipes.<name> fit --trainer.strategy ddp --trainer.devices 2`` (Lightning starts
the second rank as a subprocess). The default session runs the text recipe through the same
``fit`` command in-process with ``--trainer.strategy ddp_fork`` (the same DDP strategy, the
ranks forked instead of re-imported: seconds instead of a minute on two busy cores).
:class:`BatchRecorder` and the per-recipe arguments are shared with ``tests/recipes/test_resume.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("lightning", reason="the recipes need mmpe[recipes]")

import torch
from helpers import run_in_fresh_process
from lightning.pytorch.callbacks import Callback

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"


# ---------------------------------------------------------------------------------------------
# Recording what each rank trains on
# ---------------------------------------------------------------------------------------------
def _digest(*tensors: Any) -> str:
    h = hashlib.blake2b(digest_size=8)
    for t in tensors:
        h.update(torch.as_tensor(t).detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def sample_ids(batch: Any) -> list[str]:
    """A content fingerprint per sample of a collated batch (tensor, tuple, dict or PyG Batch)."""
    if hasattr(batch, "ptr") and hasattr(batch, "num_graphs"):  # torch_geometric Batch
        ptr = batch.ptr.tolist()
        return [_digest(batch.x[ptr[i]:ptr[i + 1]], batch.y[i]) for i in range(batch.num_graphs)]
    if isinstance(batch, dict):
        parts = [batch[k] for k in sorted(batch)]
    elif isinstance(batch, (list, tuple)):
        parts = list(batch)
    else:
        parts = [batch]
    return [_digest(*(p[i] for p in parts)) for i in range(len(parts[0]))]


class BatchRecorder(Callback):
    """Writes ``<out>/rank<r>.json`` (per training batch: epoch, batch index, global step, sample
    fingerprints; and the training set's size) and ``<out>/rank<r>.pt`` (final parameters)."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.steps: list[dict[str, Any]] = []
        self.dataset_size = 0

    def on_train_start(self, trainer, pl_module) -> None:
        self.dataset_size = len(trainer.train_dataloader.dataset)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.steps.append({"epoch": trainer.current_epoch, "batch_idx": batch_idx,
                           "step": trainer.global_step, "ids": sample_ids(batch)})

    def on_train_end(self, trainer, pl_module) -> None:
        out = Path(self.out)
        out.mkdir(parents=True, exist_ok=True)
        rank = trainer.global_rank
        (out / f"rank{rank}.json").write_text(json.dumps(
            {"rank": rank, "world_size": trainer.world_size, "dataset_size": self.dataset_size,
             "steps": self.steps}))
        params = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}
        torch.save(params, out / f"rank{rank}.pt")


# ---------------------------------------------------------------------------------------------
# Tiny settings per recipe (LightningCLI arguments; paths relative to the run's folder)
# ---------------------------------------------------------------------------------------------
def write_tones(root: Path, labels: int = 4, speakers: int = 7, sr: int = 16000) -> None:
    """``<root>/tone<k>/<speaker>_<k>.wav``: tones of 300·(k+1) Hz; with 7 speakers the audio
    split holds 5 training speakers (20 clips: an even number, shared by 2 ranks without padding)."""
    import soundfile as sf

    rng = np.random.default_rng(0)
    for k in range(labels):
        for s in range(speakers):
            n = int(sr * (0.3 + 0.05 * s))
            t = np.arange(n) / sr
            wav = 0.5 * np.sin(2 * np.pi * 300 * (k + 1) * t) + 0.01 * rng.standard_normal(n)
            path = root / f"tone{k}" / f"spk{s}_{k}.wav"
            path.parent.mkdir(parents=True, exist_ok=True)
            sf.write(path, wav.astype(np.float32), sr, subtype="PCM_16")


SMALL = ["--model.d_model", "16", "--model.depth", "1", "--model.num_heads", "2"]
NO_BAR = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
          "--trainer.log_every_n_steps", "1"]

TINY: dict[str, list[str]] = {
    "text": ["--config", str(CONFIGS / "text/default.yaml"), *SMALL, "--data.context_length", "16",
             "--data.batch_size", "4", "--data.eval_chars", "512", "--data.samples_per_epoch", "24",
             "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
             "--model.warmup_steps", "1"],
    "vision": ["--config", str(CONFIGS / "vision/default.yaml"), *SMALL, "--data.train_samples", "48",
               "--data.eval_samples", "8", "--data.batch_size", "4", "--trainer.val_check_interval", "2",
               "--trainer.limit_val_batches", "1", "--model.warmup_steps", "1"],
    "video": ["--config", str(CONFIGS / "video/default.yaml"), "--model.d_model", "24", "--model.depth", "1",
              "--data.train_clips", "24", "--data.eval_clips", "4", "--data.batch_size", "4",
              "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
              "--model.warmup_steps", "1"],
    "audio": ["--config", str(CONFIGS / "audio/default.yaml"), *SMALL, "--data.root", "wavs",
              "--data.slow_root", "null", "--data.batch_size", "4", "--trainer.val_check_interval", "2",
              "--trainer.limit_val_batches", "1", "--model.warmup_steps", "1"],
    "graph": ["--config", str(CONFIGS / "graph/default.yaml"), *SMALL, "--data.batch_size", "8",
              "--trainer.check_val_every_n_epoch", "null", "--trainer.val_check_interval", "2",
              "--trainer.limit_val_batches", "1", "--model.warmup_steps", "1"],
    "tabular": ["--config", str(CONFIGS / "tabular/default.yaml"), *SMALL, "--data.dataset", "wine",
                "--data.batch_size", "16", "--model.warmup_steps", "1",
                "--checkpoint.every_n_epochs", "null"],  # the tests checkpoint every n steps
    "sphere": ["--config", str(CONFIGS / "sphere/land.yaml"), *SMALL, "--data.n_obs", "16",
               "--data.batch_size", "2", "--data.train_examples", "12", "--data.test_examples", "2",
               "--trainer.val_check_interval", "2", "--model.warmup_steps", "1"],
}
RECIPES = list(TINY)


def prepare(recipe: str, folder: Path) -> None:
    """Data a recipe's tiny run reads from its folder (the audio WAVs)."""
    if recipe == "audio" and not (folder / "wavs").exists():
        write_tones(folder / "wavs")


def recipe_env() -> dict[str, str]:
    """Child-process environment: the repo and tests/ importable, one thread per process."""
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests"), str(Path(__file__).parent),
                            os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "MMPE_THREADS": "1", "OMP_NUM_THREADS": "1",
            "PYTHONWARNINGS": "ignore"}


def recorder_arg(out: Path) -> list[str]:
    return ["--trainer.callbacks", json.dumps([{"class_path": "test_distributed.BatchRecorder",
                                                "init_args": {"out": str(out)}}])]


def run_cli(recipe: str, folder: Path, args: list[str], launcher: str = "python",
            timeout: int = 600) -> None:
    """``python -m mmpe.recipes.<recipe> fit ARGS`` in ``folder`` (relative paths land there).

    ``launcher``: ``"python"`` (one process; under ``--trainer.strategy ddp`` Lightning starts the
    other ranks), ``"torchrun"`` (``torchrun --standalone --nproc_per_node 2 -m mmpe.recipes.<recipe> fit …``) or
    ``"slurm"`` (two processes with the environment ``srun --ntasks-per-node 2`` gives its tasks).
    """
    prepare(recipe, folder)
    command = ["-m", f"mmpe.recipes.{recipe}", "fit", *TINY[recipe], *NO_BAR, *args]
    env = recipe_env()
    if launcher == "torchrun":
        torchrun = Path(sys.executable).with_name("torchrun")
        runs = [subprocess.Popen([str(torchrun), "--standalone", "--nproc_per_node", "2", *command], cwd=folder, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    elif launcher == "slurm":
        slurm = {"SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "1",
                 "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURM_NODELIST": "localhost",
                 "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "mmpe-test"}
        runs = [subprocess.Popen([sys.executable, *command], cwd=folder, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True,
                                 env={**env, **slurm, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)})
                for r in range(2)]
    else:
        runs = [subprocess.Popen([sys.executable, *command], cwd=folder, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    for run in runs:
        out, err = run.communicate(timeout=timeout)
        assert run.returncode == 0, out[-3000:] + err[-6000:]


@contextlib.contextmanager
def one_thread(monkeypatch: pytest.MonkeyPatch):
    """Recipes started in this process use one thread (tiny steps on a busy machine run far
    faster); the process's thread count is restored afterwards."""
    threads = torch.get_num_threads()
    monkeypatch.setenv("MMPE_THREADS", "1")
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def run_in_process(recipe: str, folder: Path, args: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The same ``fit`` command through ``mmpe.recipes.<recipe>.make_cli`` in this process, in ``folder``."""
    prepare(recipe, folder)
    monkeypatch.chdir(folder)
    with one_thread(monkeypatch):
        module = importlib.import_module(f"mmpe.recipes.{recipe}")
        return module.make_cli(["fit", *TINY[recipe], *NO_BAR, *args])


def load_records(out: Path, world_size: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world_size)]


def max_param_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) if a[k].numel() else 0.0 for k in a)


# ---------------------------------------------------------------------------------------------
# The check
# ---------------------------------------------------------------------------------------------
STEPS = 4


def check_ddp(recipe: str, folder: Path, launcher: str = "python",
              monkeypatch: pytest.MonkeyPatch | None = None) -> dict[str, Any]:
    """Train ``recipe`` on 2 CPU ranks with ``--trainer.strategy ddp`` (launched by ``launcher``,
    see :func:`run_cli`; ``"fork"``: ``ddp_fork`` in this process) and check what each rank saw."""
    out = folder / "record"
    args = ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.max_steps", str(STEPS),
            "--checkpoint.every_n_train_steps", "2", *recorder_arg(out)]
    if launcher == "fork":
        assert monkeypatch is not None
        run_in_process(recipe, folder, [*args, "--trainer.strategy", "ddp_fork"], monkeypatch)
    else:
        run_cli(recipe, folder, [*args, "--trainer.strategy", "ddp"], launcher)
    ranks = load_records(out, 2)
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert all(len(r["steps"]) == STEPS for r in ranks), [len(r["steps"]) for r in ranks]
    size = ranks[0]["dataset_size"]
    pad = -size % 2  # DistributedSampler repeats this many samples so that both ranks get as many
    overlaps = []
    for epoch in sorted({s["epoch"] for s in ranks[0]["steps"]}):
        seen = [[i for s in r["steps"] if s["epoch"] == epoch for i in s["ids"]] for r in ranks]
        assert all(seen), f"a rank saw no sample in epoch {epoch}"
        overlap = set(seen[0]) & set(seen[1])
        assert len(overlap) <= pad, f"{recipe}: ranks shared {len(overlap)} samples in epoch {epoch}"
        overlaps.append(len(overlap))
    # The ranks' batches differ at every step (the bug: both ranks trained on the same batches).
    for a, b in zip(ranks[0]["steps"], ranks[1]["steps"], strict=True):
        assert a["ids"] != b["ids"]
    params = [torch.load(out / f"rank{r}.pt") for r in range(2)]
    diff = max_param_diff(*params)
    assert diff == 0.0, f"{recipe}: rank parameters differ by {diff}"
    # What a run leaves behind by default: resolved config and checkpoints in its log dir.
    configs = list(folder.glob("runs/*/lightning_logs/version_*/config.yaml"))
    assert len(configs) == 1, configs
    ckpts = configs[0].parent / "checkpoints"
    assert (ckpts / "last.ckpt").exists() and list(ckpts.glob("epoch=*-step=*.ckpt"))
    return {"overlaps": overlaps, "pad": pad, "param_diff": diff}


def test_text_ddp_two_ranks_disjoint_batches_equal_parameters(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    if run_in_fresh_process(__file__, "test_text_ddp_two_ranks_disjoint_batches_equal_parameters"):
        return
    result = check_ddp("text", tmp_path, "fork", monkeypatch)
    assert result["overlaps"] == [0, 0]  # 24 windows per epoch, 3 batches of 4 per rank: 2 epochs


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_ddp_two_ranks_disjoint_batches_equal_parameters(recipe: str, tmp_path: Path) -> None:
    result = check_ddp(recipe, tmp_path)
    print(f"\nDDP {recipe}: overlaps per epoch {result['overlaps']} (allowed {result['pad']}), "
          f"rank parameter difference {result['param_diff']}")


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "slurm"])
def test_text_ddp_under_torchrun_and_slurm(launcher: str, tmp_path: Path) -> None:
    """The launch lines of docs/distributed.md: ``torchrun``, and the environment of ``srun``."""
    assert check_ddp("text", tmp_path, launcher)["overlaps"] == [0, 0]
