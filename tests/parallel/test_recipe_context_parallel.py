"""Context parallelism (mmpe.parallel) on spawned gloo processes: every registered encoding
sharded over 2 and 4 ranks equals the unsharded layer (outputs, input gradients, every
parameter's gradient summed over the ranks) within `mmpe.testing.TOLERANCES`, or is refused by
name; and a 2-rank training run follows the single-process loss curve.

The file name puts it in the `train` tier (tests/conftest.py): it spawns processes. The cases
of one group run in one spawn (`cp_cases.py`), so the group's start-up is paid once.
"""

from __future__ import annotations

import json
from pathlib import Path

import cp_cases
import pytest

from mmpe.parallel import REFUSED
from mmpe.registry import available


def _run(tmp_path: Path, world: int, kinds: tuple = ()) -> list[dict]:
    cp_cases.spawn(world, str(tmp_path), cp_cases.worker, (), kinds)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    assert all(len(r) == len(ranks[0]) for r in ranks)
    return [row for r in ranks for row in r]


def _check(rows: list[dict]) -> None:
    bad = [(row["case"], row.get("error") or row.get("errors")) for row in rows
           if not row.get("ok") and "refused" not in row and "unsharded_refuses" not in row]
    assert not bad, f"{len(bad)} sharded cases differ or fail, e.g. {bad[:3]}"
    for row in rows:
        if "refused" in row:  # by name, with a reason: REFUSED's or the shard's missing members
            name = row["case"][0]
            assert f"context parallel: {name} " in row["refused"]
            assert name in REFUSED or "needs coordinates providing" in row["refused"]
    refused = {row["case"][0] for row in rows if "refused" in row}
    for name in REFUSED:  # every refusal in the table is exercised and raised
        assert name in refused, f"{name} is in REFUSED but no case refused it"
    # the rows are drawn from the registry: every encoding running on a sequence has some
    names = {row["case"][0] for row in rows}
    on_sequences = {e.name for e in available() if e.supports(cp_cases.sequences()["causal"])
                    or e.supports(cp_cases.sequences()["bidirectional"])}
    assert on_sequences <= names


def test_two_ranks_every_encoding_layout_padding_documents_gqa_grid(tmp_path: Path) -> None:
    rows = _run(tmp_path, 2)
    _check(rows)
    kinds = {row["case"][1] for row in rows if row.get("ok")}
    assert kinds == set(cp_cases.sequences())
    assert any(row["case"][3] == 2 and row.get("ok") for row in rows)  # GQA ran


def test_four_ranks_every_encoding_both_layouts(tmp_path: Path) -> None:
    _check(_run(tmp_path, 4, ("causal", "bidirectional", "causal_padding")))


@pytest.mark.parametrize("world", [2])
def test_training_follows_the_single_process_curve(tmp_path: Path, world: int) -> None:
    cp_cases.spawn(world, str(tmp_path), cp_cases.train_worker)
    got = json.loads((tmp_path / "train_rank0.json").read_text())
    want = cp_cases.train_single()
    assert len(got) == len(want) == cp_cases.TRAIN_STEPS
    diffs = [abs(a - b) for a, b in zip(got, want, strict=True)]
    assert max(diffs) < 1e-4, f"loss curves differ by up to {max(diffs):.3g}"
