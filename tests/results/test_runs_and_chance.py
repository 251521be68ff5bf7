"""Runs tied to commits (a committed store refuses a dirty-tree run) and chance-aware tables."""

import subprocess

import pytest

pytest.importorskip("lightning")

from mmpe.recipes.compare import CompareSpec, compare  # noqa: E402

from mmpe import cli  # noqa: E402
from mmpe.results import report, store  # noqa: E402

CHANCE = CompareSpec(metric="acc", columns=["copy", "parity", "parity reach"], xlabel="x",
                     lower_is_better=False, default_encodings=["p"], title="toy",
                     chance={"copy": 0.0, "parity": 0.5})


def rec(enc, seed, copy, parity, dirty=False):
    return {"recipe": "toy", "setting": "default", "encoding": enc, "seed": seed,
            "metrics": {"copy": copy, "parity": parity, "parity reach": 1.0},
            "git": {"commit": "abc", "dirty": dirty}}


def git(repo, *args):
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    """A checkout with a committed `results/` and an ignored `runs/`."""
    git(tmp_path, "init", "-q")
    (tmp_path / ".gitignore").write_text("runs/\n")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "keep.txt").write_text("x\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    return tmp_path


def test_committed_store_refuses_a_dirty_run_unless_asked(repo, tmp_path_factory):
    dirty = rec("p", 0, 1.0, 0.5, dirty=True)
    assert store.committed_store(repo / "results")
    assert not store.committed_store(repo / "runs" / "results")
    outside = tmp_path_factory.mktemp("outside")
    assert not store.committed_store(outside)
    with pytest.raises(store.DirtyTreeError, match="allow-dirty"):
        store.append(repo / "results", dirty)
    assert not store.store_file(repo / "results", "toy").exists()
    store.append(repo / "results", dirty, allow_dirty=True)  # asked: stored, flagged
    store.append(repo / "runs" / "results", dirty)  # scratch store: no refusal
    store.append(outside, dirty)
    store.append(repo / "results", rec("p", 1, 1.0, 0.5))  # a clean run always goes in
    assert [r["git"]["dirty"] for r in store.read(repo / "results", "toy")] == [True, False]
    store.check_clean(repo / "results", {"commit": "abc", "dirty": False})
    store.check_clean(repo / "results", {"commit": None, "dirty": None})  # outside a checkout


def test_compare_refuses_before_training(repo, monkeypatch, capsys):
    monkeypatch.setattr(store, "git_state", lambda cwd=None: {"commit": "abc", "dirty": True})
    with pytest.raises(store.DirtyTreeError):
        compare("lengthgen", encodings="nope", store=repo / "results", out_dir=repo / "runs")
    assert not store.store_file(repo / "results", "lengthgen").exists()
    assert cli.main(["compare", "lengthgen", "--encodings", "nope", "--store",
                     str(repo / "results")]) != 0
    assert "--allow-dirty" in capsys.readouterr().err


def test_tables_flag_dirty_rows_and_chance_cells():
    records = [rec("p", s, 0.9 + s / 100, 0.51 + s / 100) for s in range(3)]
    records += [rec("q", s, 0.01 + s / 100, 0.11 + s / 100, dirty=s == 1) for s in range(3)]
    table = report.render_table(CHANCE, records)
    assert "| p | **0.910 ± 0.010** | 0.520 ± 0.010° | 1.000 ± 0.000 | 3 (0–2) |" in table
    assert "| q † | 0.020 ± 0.010° | 0.120 ± 0.010° |" in table
    assert "parity: no row above chance" in table  # both at (or below) chance: no best
    assert "°: at chance" in table and "0.5 in parity" in table and "≈ 0 in copy" in table
    assert "†: 1 of this table's 6 runs" in table
    assert "parity reach:" in table and "parity reach: no row" not in table  # no chance level
    clean = report.render_table(CHANCE, [r for r in records if r["encoding"] == "p"],
                                columns=["copy"])
    assert "°" not in clean and "†" not in clean  # no legend without a marked cell


def test_chance_is_never_the_best():
    summary = {"p": {"c": report.Cell(0.54, 0.01, 3)}, "q": {"c": report.Cell(0.70, 0.3, 3)}}
    assert report.best_in_column(summary, "c", False, 0.5)[0] == "q"
    assert report.best_in_column(summary, "c", False, None)[0] == "q"
    summary["q"]["c"] = report.Cell(0.2, 0.01, 3)
    assert report.best_in_column(summary, "c", False, 0.5) == (None, False, [])
    assert report.at_chance(report.Cell(0.55, None, 1), 0.5)
    assert not report.at_chance(report.Cell(0.56, None, 1), 0.5)
    assert report.chance_level(CHANCE, "parity") == 0.5
    assert report.chance_level(CHANCE, "parity reach") is None


def test_merged_rows_join_settings_and_mark_what_is_not_learned_or_not_run():
    spec = CompareSpec(metric="acc", columns=["a in", "a out", "b in", "b out"], xlabel="x",
                       lower_is_better=False, default_encodings=["p"],
                       in_distribution=lambda c: c.replace("out", "in") if "out" in c else None)
    records = []
    for s in range(2):
        records.append({"recipe": "toy", "setting": "task-a", "encoding": "p", "seed": s,
                        "metrics": {"a in": 0.99, "a out": 0.6 + s / 10}})
        records.append({"recipe": "toy", "setting": "task-b", "encoding": "p", "seed": s,
                        "metrics": {"b in": 0.5, "b out": 0.4}})
    records.append({"recipe": "toy", "setting": "task-a", "encoding": "q", "seed": 0,
                    "metrics": {"a in": 0.97, "a out": 0.2}})
    table = report.render_table(spec, records, settings=["task-a", "task-b"], merge=True,
                                rows=["p", "q", "r"])
    assert "| p | 0.990 ± 0.000 | 0.650 ± 0.071 | 0.500 ± 0.000 | 0.400 ± 0.000‡ | 2 (0, 1) |" in table
    assert "| q | 0.970 | 0.200 | – | – | 1 (0) |" in table
    assert "| r | – | – | – | – | 0 |" in table
    assert "b out: not learned in distribution by any row" in table
    assert "‡: not learned in distribution" in table
    assert "a out: p (within noise)" in table or "a out: p, q" in table or "a out: **p**" in table


def test_a_marker_may_quote_a_column_with_a_greater_than_sign():
    text = ('<!-- mmpe:report toy setting=a,b merge columns="copy >L,copy ≤L" -->\nold\n'
            "<!-- mmpe:end -->\n<!-- mmpe:report toy -->\nold\n<!-- mmpe:end -->\n")
    found = report.blocks(text)
    assert [b.columns for b, _ in found] == [("copy >L", "copy ≤L"), None]
    assert found[0][0].merge and found[0][0].settings == ("a", "b")


def test_the_gate_reads_an_in_distribution_column_the_table_does_not_show():
    spec = CompareSpec(metric="acc", columns=["a in", "a out"], xlabel="x",
                       lower_is_better=False, default_encodings=["p"],
                       in_distribution=lambda c: "a in" if c == "a out" else None)
    records = [{"recipe": "toy", "setting": "default", "encoding": e, "seed": 0,
                "metrics": {"a in": i, "a out": o}} for e, i, o in (("p", 0.9, 0.5), ("q", 1.0, 0.3))]
    table = report.render_table(spec, records, columns=["a out"])
    assert "| p | 0.500‡ |" in table and "| q | 0.300 |" in table
    assert "a out: q (the only row learned and above chance)" in table
