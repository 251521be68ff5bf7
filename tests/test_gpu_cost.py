"""`mmpe compare gpu_cost` on a machine without CUDA: a clear error, and the coordinates and
columns it would measure (the measurement itself runs in the GPU tier's machine)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("lightning", reason="mmpe compare needs mmpe[recipes]")

from mmpe.recipes import RECIPES, gpu_cost

import mmpe


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_without_cuda_it_refuses_naming_the_device(tmp_path) -> None:
    with pytest.raises(RuntimeError, match="CUDA"):
        gpu_cost.run_one("alibi", seed=0, out_dir=tmp_path, cli_args=[])


def test_columns_and_the_coordinates_behind_them() -> None:
    assert "gpu_cost" in RECIPES
    spec = gpu_cost.COMPARE
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
