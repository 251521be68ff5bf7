"""`benchmarks/gpu/gpu_cost.py` on a machine without CUDA: a clear error, and the coordinates and
columns it would measure (the measurement itself runs in the GPU tier's machine); its rounds
are stored as the measurement `gpu_cost` of the results store."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning", reason="the GPU cost's spec is a CompareSpec of mmpe[recipes]")

from mmpe.recipes import MEASUREMENTS, RECIPES
from mmpe.recipes.compare import recipe_spec

import mmpe

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "gpu_cost.py"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_cost", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_cost = _script()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_without_cuda_it_refuses_naming_the_device(tmp_path, capsys) -> None:
    with pytest.raises(RuntimeError, match="CUDA"):
        gpu_cost.run_one("alibi", seed=0, out_dir=tmp_path, cli_args=[])
    assert gpu_cost.main(["--store", str(tmp_path / "store")]) == 0  # the script: says so
    assert "no CUDA device" in capsys.readouterr().out and not (tmp_path / "store").exists()


def test_columns_and_the_coordinates_behind_them() -> None:
    # A measurement, not a recipe: `mmpe report` renders its stored rounds with the script's spec.
    assert "gpu_cost" in MEASUREMENTS and "gpu_cost" not in RECIPES
    spec = gpu_cost.COMPARE
    assert recipe_spec("gpu_cost") == spec
    assert spec.columns == gpu_cost.TIME + gpu_cost.MEMORY and spec.lower_is_better
    tokens = {c: gpu_cost._coords(c, "cpu")[0].num_queries for c in gpu_cost.TIME}
    assert tokens == {"seq 4k": 4096, "seq 16k": 16384, "seq 32k": 32768, "grid 64²": 4096,
                      "grid 128²": 16384, "video 16×32²": 16384, "points 4k": 4096}
    for column in gpu_cost.TIME:
        coords, heads = gpu_cost._coords(column, "cpu")
        assert (gpu_cost.D_MODEL // heads) % (2 * getattr(coords, "num_axes", 1)) == 0
    # Every default encoding supports at least one column's coordinates.
    for name in spec.default_encodings:
        entry = mmpe.get(name)
        assert any(entry.supports(gpu_cost._coords(c, "cpu")[0]) for c in gpu_cost.TIME), name


def test_rounds_go_through_the_results_store(tmp_path, monkeypatch, capsys) -> None:
    """`main` stores one record per (encoding, round) with the store's one writer and skips
    stored rounds; the measurement is stood in for (no GPU here)."""
    monkeypatch.setattr(gpu_cost.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_cost.store, "device_name", lambda: "cuda (stand-in)")
    calls = []

    def run_one(encoding, *, seed, out_dir, cli_args):
        calls.append((encoding, seed))
        return {c: 1.0 + seed for c in gpu_cost.COMPARE.columns}

    monkeypatch.setattr(gpu_cost, "run_one", run_one)
    args = ["--encodings", "alibi,rope", "--seeds", "2", "--store", str(tmp_path)]
    assert gpu_cost.main(args) == 0
    assert calls == [("alibi", 0), ("rope", 0), ("alibi", 1), ("rope", 1)]
    lines = [json.loads(x) for x in (tmp_path / "gpu_cost.jsonl").read_text().splitlines()]
    assert [(r["recipe"], r["setting"], r["encoding"], r["seed"]) for r in lines] == [
        ("gpu_cost", "default", "alibi", 0), ("gpu_cost", "default", "rope", 0),
        ("gpu_cost", "default", "alibi", 1), ("gpu_cost", "default", "rope", 1)]
    assert lines[0]["device"] == "cuda (stand-in)" and lines[0]["config"] == {}
    assert "| alibi | 1.50 ± 0.71 |" in capsys.readouterr().out
    assert gpu_cost.main(args) == 0 and len(calls) == 4  # stored rounds are skipped
