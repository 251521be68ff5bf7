"""Context groups that are subgroups of the world, on spawned gloo ranks: a 2 × 2 data ×
context mesh (4 ranks) and uneven groups on 3 ranks ({0, 1} and {2}, then {0} and {1, 2}).
Outputs, input gradients and every parameter's gradient equal the unsharded model's (issue 61:
`torch.distributed.nn.functional.all_gather`'s backward on gloo raised `Global rank 0 is not
part of group` on every group without global rank 0).

The file name puts it in the `train` tier (tests/conftest.py): it spawns processes.
"""

from __future__ import annotations

import json
from pathlib import Path

import cp_cases
import mesh_cases
import pytest


def _rows(out: Path, world: int) -> list[dict]:
    return [{**row, "rank": r} for r in range(world)
            for row in json.loads((out / f"rank{r}.json").read_text())]


@pytest.mark.parametrize("world", [4, 3])
def test_subgroup_context_groups_equal_the_unsharded_model(world: int, tmp_path: Path) -> None:
    cp_cases.spawn(world, str(tmp_path), mesh_cases.worker)
    rows = _rows(tmp_path, world)
    assert len(rows) == world * (3 if world == 4 else 4)
    for row in rows:  # a loss every rank computes over the whole sequence
        if row["case"] == ["whole-sequence loss"]:
            assert row["unshard_for_loss"] < 1e-5
            assert abs(row["unshard"] - 1.0) < 1e-4  # the control: W = 2 times the gradient
    bad = [(r["rank"], r["case"], r.get("error") or r["errors"]) for r in rows if not r["ok"]]
    assert not bad, bad
    # every group size of the case ran, groups of one included
    assert {r["world"] for r in rows} == ({2} if world == 4 else {1, 2})


def test_fsdp2_with_context_parallel_from_meta_equals_one_process(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed.fsdp")
    cp_cases.spawn(4, str(tmp_path), mesh_cases.fsdp_worker)
    ranks = [json.loads((tmp_path / f"fsdp_rank{r}.json").read_text()) for r in range(4)]
    for name in mesh_cases._FSDP_MODELS:
        got = ranks[0][name]
        assert isinstance(got, list), got
        assert all(r[name] == got for r in ranks)  # every rank logs the whole batch's loss
        want = mesh_cases.train_single(name)
        assert len(got) == len(want) == mesh_cases.FSDP_STEPS
        diffs = [abs(a - b) / b for a, b in zip(got, want, strict=True)]
        assert max(diffs) < 1e-5, f"{name}: loss curves differ by up to {max(diffs):.3g}"
        assert want[-1] < want[0] * 0.9  # the run learns


def test_shared_encodings_are_the_models_not_a_blocks() -> None:
    """The encodings the blocks share are registered once, on the model; no block holds one
    as a submodule (what FSDP2's per-block wrapping walks), each block still reads them."""
    import mmpe
    from mmpe.encodings.base import Encoding

    model = mmpe.Transformer(32, 4, 2, ["rope", "alibi", "t5"])
    names = [m.registry_name for m in model.shared_encodings]
    assert names == ["rope", "alibi", "t5"]
    for block in model.blocks:
        assert not any(isinstance(m, Encoding) for m in block.modules())
        assert [e.registry_name for e in block.attn.all_encodings()] == names
        assert all(a is b for a, b in zip(block.attn.all_encodings(), model.shared_encodings,
                                          strict=False))
    assert len(list(model.parameters())) == len({id(p) for p in model.parameters()})
    own = mmpe.Transformer(32, 4, 2, ["alibi"], share_encodings=False)
    assert len(own.shared_encodings) == 0
    assert all(len(b.attn.scores) == 1 and b.attn.scores[0] in list(b.modules())
               for b in own.blocks)
