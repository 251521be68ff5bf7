"""Every hand-written fast form pays: a stored row of `benchmarks/bench_fast_forms.py` shows it.

docs/plugins.md keeps a fast form only while a stored benchmark shows ≥ 1.3× time or ≥ 1.5×
peak memory against the generic path of its structure on a shape users run. This test reads
the committed store (results/bench/bench_fast_forms.jsonl), it times nothing: each class of
`mmpe.attention.fast_forms.FAST_FORMS` needs a row, on one of its shapes, whose fast side read
its forms and whose newest stored ratio meets the rule. A new form without a row, or a form
whose row stops paying, fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmpe.attention import fast_forms
from mmpe.registry import available

STORE = Path(__file__).resolve().parents[2] / "results" / "bench" / "bench_fast_forms.jsonl"
TIME, MEMORY = 1.3, 1.5  # the rule of docs/plugins.md


def _newest_rows() -> dict[tuple[str, str], dict]:
    """(shape, encoding) -> the newest stored row as {column: cell}, from runs of the newest
    config (the renderer combines only those)."""
    runs = [json.loads(line) for line in STORE.read_text().splitlines() if line.strip()]
    runs = [r for r in runs if r["table"] == "forms"]
    newest = runs[-1]["config"]
    rows: dict[tuple[str, str], dict] = {}
    for run in runs:
        if run["config"] == newest:
            for cells in run["rows"]:
                row = dict(zip(run["columns"], cells, strict=True))
                rows[row["shape"], row["encoding"]] = row
    return rows


def _pays(row: dict) -> bool:
    return row["forms read"] != "none" and (row["time: generic / fast"] >= TIME
                                            or row["memory: generic / fast"] >= MEMORY)


NAMES = {e.cls: e.name for e in available()}


@pytest.mark.parametrize("cls", sorted(fast_forms.FAST_FORMS, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_each_fast_form_has_a_stored_row_that_pays(cls) -> None:
    assert cls in NAMES, f"{cls.__name__}: a fast form of a class the registry does not build"
    rows = [row for (_, name), row in _newest_rows().items() if name == NAMES[cls]]
    assert rows, (f"{cls.__name__}: no stored row in {STORE.name}; run "
                  "`python benchmarks/bench_fast_forms.py --store results/bench`")
    assert any(_pays(row) for row in rows), (
        f"{cls.__name__}: no shape where its fast forms pay (≥ {TIME}× time or ≥ {MEMORY}× "
        f"memory): {[(r['shape'], r['time: generic / fast'], r['memory: generic / fast']) for r in rows]}")


def test_the_rule_reads_the_ratio_columns() -> None:
    """The control: a row that reads no form, or pays neither way, does not pay."""
    base = {"forms read": "rows", "time: generic / fast": 1.31, "memory: generic / fast": 1.0}
    assert _pays(base)
    assert not _pays({**base, "forms read": "none"})
    assert not _pays({**base, "time: generic / fast": 1.29})
    assert _pays({**base, "time: generic / fast": 1.0, "memory: generic / fast": 1.5})
