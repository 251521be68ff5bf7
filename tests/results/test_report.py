"""mmpe report: mean ± sd over stored seeds, winners only beyond seed noise, marked blocks."""

import json
import math
import sys
import types
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("lightning")

from mmpe.recipes import RECIPES  # noqa: E402
from mmpe.recipes.compare import CompareSpec, recipe_spec  # noqa: E402

from mmpe import cli  # noqa: E402
from mmpe.results import report, store  # noqa: E402

SPEC = CompareSpec(metric="acc", columns=["a", "b"], xlabel="x", lower_is_better=False,
                   default_encodings=["p", "q"], higher_is_better=("b",), title="toy")
LOW_B = CompareSpec(metric="acc", columns=["a", "b"], xlabel="x", lower_is_better=False,
                    default_encodings=["p"], higher_is_better=(), title="toy")


def rec(enc, seed, a, b=None, setting="default", recipe="toy"):
    return {"recipe": recipe, "setting": setting, "encoding": enc, "seed": seed,
            "metrics": {"a": a, "b": b}}


finite = st.floats(-1e3, 1e3, allow_nan=False)
sds = st.floats(1e-3, 10, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(finite, sds, finite, sds, st.floats(0.1, 10))
def test_separation_is_symmetric_and_scale_free(m1, s1, m2, s2, k):
    a, b = report.Cell(m1, s1, 3), report.Cell(m2, s2, 3)
    assert report.separated(a, b) == report.separated(b, a)
    scaled = report.separated(report.Cell(k * m1, k * s1, 3), report.Cell(k * m2, k * s2, 3))
    pooled = math.sqrt((s1 ** 2 + s2 ** 2) / 2)
    if abs(abs(m1 - m2) - report.NOISE_SDS * pooled) > 1e-6 * (1 + abs(m1) + abs(m2)):
        assert scaled == report.separated(a, b) == (abs(m1 - m2) > report.NOISE_SDS * pooled)


@given(finite)
def test_one_seed_or_equal_means_never_separate(m):
    assert not report.separated(report.Cell(m, None, 1), report.Cell(m + 100, None, 1))
    assert not report.separated(report.Cell(m, 1.0, 3), report.Cell(m, 1.0, 3))


def test_table_bolds_only_a_winner_beyond_noise():
    records = [rec("p", s, 0.90 + s / 1000, 0.5 + s / 10) for s in range(3)]
    records += [rec("q", s, 0.80 + s / 1000, 0.52 + s / 10) for s in range(3)]
    table = report.render_table(SPEC, records)
    assert "| p | **0.901 ± 0.001** | 0.600 ± 0.100 | 3 (0–2) |" in table
    assert "| q | 0.801 ± 0.001 | 0.620 ± 0.100 | 3 (0–2) |" in table
    assert "a: **p**" in table and "b: p, q (within noise)" in table  # b: lower is better


def test_column_direction_follows_the_spec():
    records = [rec("p", s, 1.0 + s / 1000, 1.0 + s / 1000) for s in range(3)]
    records += [rec("q", s, 2.0 + s / 1000, 2.0 + s / 1000) for s in range(3)]
    lower = CompareSpec(metric="m", columns=["a", "b"], xlabel="x", lower_is_better=True,
                        default_encodings=["p"], higher_is_better=("b",))
    table = report.render_table(lower, records)
    assert "a: **p**" in table and "b: **q**" in table
    assert "a: **q**" in report.render_table(LOW_B, records)


def test_na_when_any_seed_cannot_evaluate_and_seed_list():
    records = [rec("p", 0, 0.5, None), rec("p", 2, 0.7, 0.1), rec("p", 5, 0.6, 0.2)]
    table = report.render_table(SPEC, records)
    assert "| p | 0.600 ± 0.100 | n/a | 3 (0, 2, 5) |" in table
    assert "nothing is marked" in table


def test_rows_settings_and_missing_runs():
    records = [rec("p", s, 0.5, 0.5, setting=t) for s in range(2) for t in ("default", "concat")]
    table = report.render_table(SPEC, records, settings=["default", "concat"], rows=["p"])
    assert "| p (default) |" in table and "| p (concat) |" in table
    with pytest.raises(LookupError, match="setting 'long'"):
        report.render_table(SPEC, records, settings=["long"])
    with pytest.raises(LookupError, match="'zz'"):
        report.render_table(SPEC, records, rows=["zz"])


def test_block_parsing():
    block = report.Block.parse("text setting=default,concat rows=a,b plot=docs/img/x.png")
    assert block == report.Block("text", ("default", "concat"), ("a", "b"), None, "docs/img/x.png")
    with pytest.raises(ValueError, match="unknown key 'colour'"):
        report.Block.parse("text colour=red")
    with pytest.raises(ValueError, match="recipe name"):
        report.Block.parse("setting=x")


@pytest.fixture
def toy_recipe(monkeypatch):
    fake = types.ModuleType("mmpe.recipes.toy")
    fake.COMPARE = SPEC
    monkeypatch.setitem(sys.modules, "mmpe.recipes.toy", fake)
    monkeypatch.setitem(RECIPES, "toy", ("mmpe.recipes.toy", "a stand-in"))


def test_rewrite_check_and_cli(tmp_path, toy_recipe, capsys):
    for s in range(3):
        store.append(tmp_path / "store", {**rec("p", s, 0.5 + s / 100, 0.1), "extra": 1})
    doc = tmp_path / "page.md"
    doc.write_text("intro\n<!-- mmpe:report toy -->\ntyped by hand\n<!-- mmpe:end -->\nafter\n")
    assert report.stale([doc], tmp_path / "store", specs=recipe_spec) == [f"{doc}: mmpe:report toy"]
    assert cli.main(["report", "--store", str(tmp_path / "store"), "--check", str(doc)]) == 1
    assert cli.main(["report", "--store", str(tmp_path / "store"), "--write", str(doc)]) == 0
    text = doc.read_text()
    assert "| p | 0.510 ± 0.010 | 0.100 ± 0.000 | 3 (0–2) |" in text and text.endswith("after\n")
    assert report.stale([doc], tmp_path / "store", specs=recipe_spec) == []
    capsys.readouterr()
    assert cli.main(["report", "toy", "--store", str(tmp_path / "store")]) == 0
    assert "0.510 ± 0.010" in capsys.readouterr().out
    assert cli.main(["report", "toy", "--store", str(tmp_path / "empty")]) == 2
    assert "no stored runs" in capsys.readouterr().err


def test_store_rejects_broken_lines(tmp_path):
    path = store.store_file(tmp_path, "toy")
    path.write_text(json.dumps(rec("p", 0, 1.0)) + "\nnot json\n")
    with pytest.raises(ValueError, match=r"toy.jsonl:2: not JSON"):
        store.read(tmp_path, "toy")
    path.write_text(json.dumps({"recipe": "toy", "encoding": "p"}) + "\n")
    with pytest.raises(ValueError, match="lacks"):
        store.read(tmp_path, "toy")
    with pytest.raises(ValueError, match="lacks"):
        store.append(tmp_path, {"recipe": "toy"})
    assert store.setting_name([]) == "default" and store.setting_name([], "long") == "long"
    assert store.setting_name(["--a", "1"]).startswith("custom-")
    assert store.setting_name(["--a", "1"]) != store.setting_name(["--a", "2"])


def test_summary_block_is_the_best_line_only():
    records = [rec("p", s, 0.90 + s / 1000, 0.5) for s in range(3)]
    records += [rec("q", s, 0.80 + s / 1000, 0.5) for s in range(3)]
    assert report.render_table(SPEC, records, summary=True) == "a: **p**; b: p, q (within noise)."
    assert report.Block.parse("toy summary rows=p,q").summary
    alone = report.render_table(SPEC, [r for r in records if r["encoding"] == "p"], summary=True)
    assert alone == "a: p (the only row); b: p (the only row)."
    assert report.Block.parse('toy columns="gate attn,b"').columns == ("gate attn", "b")


def test_the_docs_gpu_cost_blocks_render_from_the_store(tmp_path, capsys) -> None:
    """`mmpe report --check` of a page with a `gpu_cost` block: a measurement, not a recipe,
    whose spec is the script's (`mmpe.recipes.MEASUREMENTS`)."""
    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    start = text.index("<!-- mmpe:report gpu_cost")
    page = tmp_path / "page.md"
    page.write_text(text[start:text.index("<!-- mmpe:end -->", start) + 17] + "\n")
    assert cli.main(["report", "--check", str(page), "--store", str(root / "results")]) == 0
    assert "all 1 blocks" in capsys.readouterr().out
    with pytest.raises(ValueError, match="unknown recipe 'gpu_cos'"):
        cli._check_recipe("gpu_cos", measurements=True)
