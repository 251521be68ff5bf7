"""The text recipe on 4 CPU ranks as docs/long_sequences.md gives the command: Lightning's
`ModelParallelStrategy`, a 2 × 2 mesh, FSDP2 over the data ranks from a meta-device build
(`--model.fsdp true`) and context parallelism over the other dimension. The run trains, logs a
finite loss on every step and writes its sharded checkpoint (torch.distributed.checkpoint
walks every state_dict key, the encodings' saved settings included).

The file name puts it in the `train` tier (tests/conftest.py): it spawns processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")

COMMAND = ["-m", "mmpe.recipes.text", "fit", "--model.context_parallel", "balanced",
           "--model.fsdp", "true", "--model.encoding", "t5", "--model.d_model", "32",
           "--model.depth", "2", "--model.num_heads", "2", "--data.batch_size", "8",
           "--trainer.accelerator", "cpu", "--trainer.devices", "4", "--trainer.max_steps", "3",
           "--trainer.limit_val_batches", "1", "--trainer.val_check_interval", "3",
           "--trainer.strategy", "lightning.pytorch.strategies.ModelParallelStrategy",
           "--trainer.strategy.data_parallel_size", "2",
           "--trainer.strategy.tensor_parallel_size", "2"]


def test_the_recipe_trains_with_fsdp2_and_context_parallel_on_four_ranks(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MMPE_THREADS": "1"}
    run = subprocess.run([sys.executable, *COMMAND, "--trainer.default_root_dir", str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "FSDP2: parameters sharded over 2 data-parallel ranks" in run.stdout + run.stderr
    checkpoints = list(tmp_path.rglob("*.ckpt"))
    assert checkpoints and len(list(checkpoints[0].glob("*.distcp"))) == 4
