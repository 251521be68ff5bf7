"""Context parallelism (mmpe.parallel) on spawned gloo processes: every registered encoding
sharded over 2 and 4 ranks equals the unsharded layer (outputs, input gradients, every
parameter's gradient summed over the ranks) within `mmpe.testing.TOLERANCES`, or is refused by
name; and a 2-rank training run of the text recipe's model follows the single-process loss
curve for 50 steps.

The file name puts it in the `train` tier (tests/conftest.py): it spawns processes. Each group
runs all its cases in one spawn (`cp_cases.py`), so its start-up is paid once.
"""

from __future__ import annotations

import json
from pathlib import Path

import cp_cases
import pytest

from mmpe.parallel import refused_encodings
from mmpe.registry import available

pytest.importorskip("lightning", reason="the training run uses the text recipe (mmpe[recipes])")


def _rows(out: Path, world: int) -> list[dict]:
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    assert all(len(r) == len(ranks[0]) for r in ranks)
    return [{**row, "rank": i} for i, r in enumerate(ranks) for row in r]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """One 2-rank group: every case, then the training run."""
    out = tmp_path_factory.mktemp("cp2")
    cp_cases.spawn(2, str(out), cp_cases.worker, (), (), True)
    return out


def _check(rows: list[dict]) -> None:
    control = [row for row in rows if row["case"][1] == "control-local-positions"]
    rows = [row for row in rows if row["case"][1] != "control-local-positions"]
    # the control, RoPE and ALiBi on a shard numbered from 0, differs on every rank but the
    # first (whose local positions are the global ones) in output or gradients
    assert control and not any(row["ok"] for row in control if row["rank"] > 0)
    bad = [(row["case"], row.get("error") or row.get("errors")) for row in rows
           if not row.get("ok") and "refused" not in row and "unsharded_refuses" not in row]
    assert not bad, f"{len(bad)} sharded cases differ or fail, e.g. {bad[:3]}"
    declared = refused_encodings()
    for row in rows:
        if "refused" in row:  # by name, with a reason: declared, or the shard's missing members
            name = row["case"][0]
            assert f"context parallel: {name} " in row["refused"]
            assert name in declared or "needs coordinates providing" in row["refused"]
    refused = {row["case"][0] for row in rows if "refused" in row}
    assert declared  # fox and conv_pe declare theirs
    for name in declared:  # every declared refusal is exercised and raised
        assert name in refused, f"{name} declares a shard_refusal but no case refused it"
    # the rows are drawn from the registry: every encoding running on a sequence has some
    seqs = cp_cases.sequences()
    on_sequences = {e.name for e in available()
                    if e.supports(seqs["causal"]) or e.supports(seqs["bidirectional"])}
    assert on_sequences <= {row["case"][0] for row in rows}


def test_two_ranks_every_encoding_layout_padding_documents_gqa_grid(two_ranks: Path) -> None:
    rows = _rows(two_ranks, 2)
    _check(rows)
    assert {row["case"][1] for row in rows if row.get("ok")} == set(cp_cases.sequences())
    assert {row["case"][2] for row in rows if row.get("ok")} == {"contiguous", "balanced"}
    assert any(row["case"][3] == 2 and row.get("ok") for row in rows)  # GQA ran


def test_four_ranks_every_encoding_both_layouts(tmp_path: Path) -> None:
    # GQA, padding, documents and grids run on 2 ranks; here a block budget of 512 bytes cuts
    # the causal chunks into checkpointed blocks of 2 rows (ShardedCoords.row_blocks)
    cp_cases.spawn(4, str(tmp_path), cp_cases.worker, (), ("causal", "bidirectional"), False,
                   False, 512)
    _check(_rows(tmp_path, 4))


def test_training_follows_the_single_process_curve(two_ranks: Path) -> None:
    got = [json.loads((two_ranks / f"train_rank{r}.json").read_text()) for r in range(2)]
    want = cp_cases.train_single()
    assert got[0] == got[1]  # every rank logs the whole batch's loss
    assert len(got[0]) == len(want) == cp_cases.TRAIN_STEPS
    diffs = [abs(a - b) for a, b in zip(got[0], want, strict=True)]
    assert max(diffs) < 1e-5, f"loss curves differ by up to {max(diffs):.3g}"
    assert want[-1] < want[0] - 0.1  # the run learns: the curve is not flat


def test_the_text_recipe_names_a_bad_layout() -> None:
    from mmpe.recipes.text import CharLM

    with pytest.raises(ValueError, match="context_parallel must be None or one of"):
        CharLM(context_parallel="zigzag")
    assert CharLM(d_model=16, num_heads=2, depth=1, context_parallel="balanced").context_group is None
