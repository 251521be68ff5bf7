"""Benchmark tables: stored by `benchmarks/_store.py`, rendered by `mmpe.results.bench_report`;
every benchmark table in README.md and docs/ is what the committed store (results/bench)
renders, so a typed or stale benchmark number fails here."""

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from mmpe.results import bench_report, report

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
STORE = ROOT / "results"


def _store_module():
    spec = importlib.util.spec_from_file_location("bench_store", ROOT / "benchmarks" / "_store.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bstore = _store_module()


def _table(ratios, ms=(1.0, 2.0)):
    t = bstore.Table("peers", "Toy benchmark", ["operation", "peer", "mmpe ms", "peer / mmpe"],
                     [None, None, "{:.2f}", "{:.2f}"])
    t.add("RoPE apply", "HF", ms[0], ratios[0])
    t.add("ALiBi", "x-transformers", ms[1], ratios[1])
    return t


def _write(tmp_path, *tables, config=None, bench="bench_toy"):
    return bstore.write(tmp_path / "bench", bench, list(tables), threads=1,
                        config=config or {"n": 8})


def _render(tmp_path, args):
    return bench_report.render_block(bench_report.BenchBlock.parse(args), tmp_path)


def test_a_stored_run_renders_as_it_printed(tmp_path):
    path = _write(tmp_path, _table((3.14159, 0.5)))
    assert path == tmp_path / "bench" / "bench_toy.jsonl"
    record = json.loads(path.read_text())
    assert record["rows"][0] == ["RoPE apply", "HF", 1.0, 3.14159]  # raw floats, not text
    assert {"host", "threads", "torch", "python", "date", "git", "config"} <= record.keys()
    text = _render(tmp_path, "bench_toy table=peers")
    lines = text.splitlines()
    assert lines[0] == "| operation | peer | mmpe ms | peer / mmpe |"
    assert lines[2] == "| RoPE apply | HF | 1.00 | 3.14 |"
    assert lines[3] == "| ALiBi | x-transformers | 2.00 | 0.50 |"
    assert "one run" in lines[-1] and "1 thread," in lines[-1] and "torch " in lines[-1]


def test_cells_are_min_max_over_runs(tmp_path):
    _write(tmp_path, _table((3.0, 0.5)))
    _write(tmp_path, _table((2.0, 0.504), ms=(1.0, 2.5)))
    _write(tmp_path, _table((4.0, 0.5)))
    lines = _render(tmp_path, "bench_toy table=peers").splitlines()
    assert lines[2] == "| RoPE apply | HF | 1.00 | 2.00–4.00 |"
    assert lines[3] == "| ALiBi | x-transformers | 2.00–2.50 | 0.50 |"  # equal to the format
    assert "min–max over 3 runs" in lines[-1]
    newest = _render(tmp_path, "bench_toy table=peers runs=1").splitlines()
    assert newest[2] == "| RoPE apply | HF | 1.00 | 4.00 |"
    picked = _render(tmp_path, 'bench_toy table=peers columns="operation,peer / mmpe"')
    assert picked.splitlines()[:3] == ["| operation | peer / mmpe |", "|---|---|",
                                       "| RoPE apply | 2.00–4.00 |"]


def test_a_range_measured_in_one_run_and_rows_from_several(tmp_path):
    t = bstore.Table("coords", "Toy", ["coordinates", "encoding", "ratio", "MiB"],
                     [None, None, "{:.2f}", "{:.0f}"])
    t.add("grid 32x32", "alibi", (1.1, 1.3), 10)
    t.add("grid 32x32", "none", 1.0, None)
    _write(tmp_path, t)
    u = bstore.Table("coords", "Toy", t.columns, t.formats)
    u.add("points 1024", "alibi", 2.0, 30)
    _write(tmp_path, u)
    lines = _render(tmp_path, "bench_toy table=coords").splitlines()
    assert lines[2:5] == ["| grid 32x32 | alibi | 1.10–1.30 | 10 |",
                          "| grid 32x32 | none | 1.00 | — |",
                          "| points 1024 | alibi | 2.00 | 30 |"]
    assert "one run per row (the rows come from 2 stored runs)" in lines[-1]
    v = bstore.Table("coords", "Toy", t.columns, t.formats)
    v.add("points 1024", "alibi", 2.5, 30)
    _write(tmp_path, v)
    lines = _render(tmp_path, "bench_toy table=coords").splitlines()
    assert lines[4] == "| points 1024 | alibi | 2.00–2.50 | 30 |"
    assert "min–max over 1–2 runs per row" in lines[-1]


def test_only_runs_of_the_newest_config_are_combined(tmp_path):
    _write(tmp_path, _table((9.0, 9.0)), config={"n": 2})  # e.g. a --quick run
    _write(tmp_path, _table((3.0, 0.5)))
    assert "| RoPE apply | HF | 1.00 | 3.00 |" in _render(tmp_path, "bench_toy table=peers")


def _set_hosts(tmp_path, hosts, bench="bench_toy"):
    path = tmp_path / "bench" / f"{bench}.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for record, host in zip(records, hosts, strict=True):
        record["host"] = host
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_runs_of_one_machine_are_combined(tmp_path):
    # A ratio to the unbiased layer belongs to its CPU: the EPYC's 3.00 and the Xeon's 1.50
    # never make one "1.50–3.00" cell. Without host=, the newest run's machine; with it, the
    # named one; a host with no run names the stored ones.
    _write(tmp_path, _table((3.0, 0.5)))
    _write(tmp_path, _table((1.5, 0.5)))
    _set_hosts(tmp_path, ["AMD EPYC", "Intel(R) Xeon(R) Processor"])
    newest = _render(tmp_path, "bench_toy table=peers")
    assert "| RoPE apply | HF | 1.00 | 1.50 |" in newest and "Xeon" in newest
    assert "AMD" not in newest
    amd = _render(tmp_path, 'bench_toy table=peers host="AMD EPYC"')
    assert "| RoPE apply | HF | 1.00 | 3.00 |" in amd and "Xeon" not in amd
    with pytest.raises(ValueError, match="no stored run of table 'peers' on a host containing "
                                         "'ARM'.*AMD EPYC, Intel"):
        _render(tmp_path, "bench_toy table=peers host=ARM")
    with pytest.raises(ValueError, match="host must name a machine"):
        _render(tmp_path, "bench_toy table=peers host=")


def test_rows_newest_shows_each_row_from_its_newest_commit(tmp_path):
    # The grid rows re-measured after a change of the code (commit bbb) replace those of aaa,
    # a new row (peer) sits among them in the new run's order; the points row, measured at aaa
    # only, stays. Without rows=newest the ranges mix both commits.
    columns, formats = ["coordinates", "encoding", "ratio"], [None, None, "{:.2f}"]
    t = bstore.Table("coords", "Toy", columns, formats)
    for row in (("grid", "alibi", 1.5), ("grid", "none", 1.0), ("points", "alibi", 2.0)):
        t.add(*row)
    _write(tmp_path, t)
    _write(tmp_path, t)
    u = bstore.Table("coords", "Toy", columns, formats)
    for row in (("grid", "alibi", 1.1), ("grid", "peer", 2.6), ("grid", "none", 1.0)):
        u.add(*row)
    _write(tmp_path, u)
    _write(tmp_path, u)
    path = tmp_path / "bench" / "bench_toy.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for record, commit in zip(records, ["aaa", "aaa", "bbb", "bbb"], strict=True):
        record["git"] = {"commit": commit, "dirty": False}
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    mixed = _render(tmp_path, "bench_toy table=coords").splitlines()
    assert mixed[2] == "| grid | alibi | 1.10–1.50 |"
    lines = _render(tmp_path, "bench_toy table=coords rows=newest").splitlines()
    assert lines[2:6] == ["| grid | alibi | 1.10 |", "| grid | peer | 2.60 |",
                          "| grid | none | 1.00 |", "| points | alibi | 2.00 |"]
    assert "commit aaa, bbb" in lines[-1] and "over 2 runs" in lines[-1]
    with pytest.raises(ValueError, match="rows must be 'newest'"):
        _render(tmp_path, "bench_toy table=coords rows=all")


def test_unknown_benchmark_table_or_column_names_the_block(tmp_path):
    _write(tmp_path, _table((3.0, 0.5)))
    with pytest.raises(ValueError, match=r"bench_nope table=peers.*no stored runs"):
        _render(tmp_path, "bench_nope table=peers")
    with pytest.raises(ValueError, match=r"bench_toy table=nope.*stored: peers"):
        _render(tmp_path, "bench_toy table=nope")
    with pytest.raises(ValueError, match=r"columns=nope.*no column"):
        _render(tmp_path, "bench_toy table=peers columns=nope")
    for bad in ("table=peers", "bench_toy", "bench_toy table=peers runs=0",
                "bench_toy table=peers colour=red"):
        with pytest.raises(ValueError, match="mmpe:bench block"):
            bench_report.BenchBlock.parse(bad)
    with pytest.raises(ValueError, match="columns"):
        bstore.Table("t", "t", ["a", "b"], [None])


def test_check_mode_catches_a_typed_number(tmp_path):
    _write(tmp_path, _table((3.0, 0.5)))
    _write(tmp_path, _table((2.0, 0.5)))
    page = tmp_path / "page.md"
    page.write_text("Intro.\n\n<!-- mmpe:bench bench_toy table=peers -->\n<!-- mmpe:end -->\n")
    assert bench_report.stale([page], tmp_path) == [f"{page}: mmpe:bench bench_toy table=peers"]
    page.write_text(bench_report.rewrite(page.read_text(), tmp_path))
    assert "2.00–3.00" in page.read_text()
    assert bench_report.stale([page], tmp_path) == []
    page.write_text(page.read_text().replace("2.00–3.00", "2.50–3.00"))  # a hand edit
    assert bench_report.stale([page], tmp_path)
    page.write_text(bench_report.rewrite(page.read_text(), tmp_path))
    _write(tmp_path, _table((5.0, 0.5)))  # a new run: the page is stale until re-rendered
    assert bench_report.stale([page], tmp_path)


def test_mmpe_report_renders_bench_blocks_too(tmp_path):
    _write(tmp_path, _table((3.0, 0.5)))
    page = tmp_path / "page.md"
    page.write_text("<!-- mmpe:bench bench_toy table=peers -->\n<!-- mmpe:end -->\n")
    no_recipe = {}.__getitem__  # the page has no mmpe:report block: no recipe is looked up
    assert report.stale([page], tmp_path, specs=no_recipe)
    page.write_text(report.rewrite(page.read_text(), tmp_path, specs=no_recipe))
    assert "| RoPE apply | HF | 1.00 | 3.00 |" in page.read_text()
    assert report.stale([page], tmp_path, specs=no_recipe) == []


def _bench_blocks():
    return [(page, block) for page in PAGES
            for block, _ in bench_report.blocks(page.read_text(encoding="utf-8"))]


def test_every_bench_block_matches_the_committed_store():
    assert _bench_blocks(), "README.md and docs/ have no mmpe:bench blocks"
    assert bench_report.stale(PAGES, STORE) == []


def test_no_benchmark_number_is_typed_in_the_benchmarks_section():
    """Outside the rendered blocks, the benchmarks section (docs/benchmarks.md) quotes no
    measured number (a decimal or a ratio): prose points at the tables instead."""
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    section = text.split("<!-- --8<-- [start:benchmarks] -->")[1].split(
        "<!-- --8<-- [end:benchmarks] -->")[0]
    prose = report.BLOCK.sub("", bench_report.BLOCK.sub("", section))  # both are rendered
    assert not re.findall(r"\d+\.\d+|\d+(?:\.\d+)?×", prose), "typed numbers in the benchmarks"
