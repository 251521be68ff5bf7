"""Names moved in 0.2 still import from their old paths, with a `FutureWarning`, until 0.3; the
repository itself uses the new paths only.

Moved: `mmpe.recipes.{store, report, bench_report, attention_maps}` → `mmpe.results.*`;
`mmpe.recipes.compare.lower_is_better` → `mmpe.results.report`; `mmpe.coords.PerImage` and
`mmpe.coords.packed_grid.PerImage` → `mmpe.encodings.per_image`; `mmpe.encodings.spacetime.
TimeLine` → `mmpe.coords.spacetime`. (`mmpe.recipes.gpu_cost`: tests/gpu/test_gpu_cost.py;
`LayerSchedule.from_hf`: tests/models/test_layer_schedule.py.)
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OLD_MODULES = {"mmpe.recipes.store": "mmpe.results.store",
               "mmpe.recipes.report": "mmpe.results.report",
               "mmpe.recipes.bench_report": "mmpe.results.bench_report",
               "mmpe.recipes.attention_maps": "mmpe.results.attention_maps"}


def _fresh_import(name: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module(name)


@pytest.mark.parametrize(("old", "new"), sorted(OLD_MODULES.items()))
def test_an_old_results_module_warns_and_resolves_to_the_new_one(old, new, monkeypatch) -> None:
    with pytest.warns(FutureWarning, match=rf"{old} moved to {new}"):
        module = _fresh_import(old, monkeypatch)
    moved = importlib.import_module(new)
    public = [n for n in vars(moved) if not n.startswith("_") and callable(getattr(moved, n))
              and getattr(getattr(moved, n), "__module__", None) == new]
    assert public
    for name in public:
        if name not in ("render_block", "rewrite", "stale"):  # wrapped: see the next test
            assert getattr(module, name) is getattr(moved, name), name


def test_the_old_report_still_renders_without_specs(tmp_path, monkeypatch) -> None:
    """0.2's development `mmpe.recipes.report.stale(paths, store)` looked the recipes up
    itself; the old module keeps that default."""
    pytest.importorskip("lightning")
    with pytest.warns(FutureWarning):
        old = _fresh_import("mmpe.recipes.report", monkeypatch)
    page = tmp_path / "page.md"
    page.write_text("<!-- mmpe:report text -->\nstale\n<!-- mmpe:end -->\n")
    assert old.stale([page], ROOT / "results") == [f"{page}: mmpe:report text"]
    assert "| sinusoidal " in old.rewrite(page.read_text(), ROOT / "results")  # († if dirty)


def test_python_m_the_old_attention_maps_still_runs() -> None:
    run = subprocess.run([sys.executable, "-m", "mmpe.recipes.attention_maps", "--help"],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "--runs" in run.stdout and "moved to mmpe.results.attention_maps" in run.stderr


def test_lower_is_better_from_the_compare_module_warns() -> None:
    from mmpe.recipes import compare

    from mmpe.results.report import lower_is_better

    with pytest.warns(FutureWarning, match="mmpe.results.report.lower_is_better"):
        assert compare.lower_is_better is lower_is_better


@pytest.mark.parametrize("old", ["mmpe.coords", "mmpe.coords.packed_grid"])
def test_per_image_from_the_coordinates_warns(old: str) -> None:
    import mmpe
    from mmpe.encodings.per_image import PerImage

    module = importlib.import_module(old)
    with pytest.warns(FutureWarning, match="mmpe.encodings.per_image.PerImage"):
        assert module.PerImage is PerImage is mmpe.PerImage
    assert "PerImage" not in module.__all__


def test_time_line_from_the_encoding_warns() -> None:
    from mmpe.coords import TimeLine
    from mmpe.encodings import spacetime

    with pytest.warns(FutureWarning, match="mmpe.coords.spacetime.TimeLine"):
        assert spacetime.TimeLine is TimeLine


def test_the_new_paths_import_without_a_warning() -> None:
    code = ("import warnings; warnings.simplefilter('error', FutureWarning)\n"
            "import mmpe.results, mmpe.results.attention_maps, mmpe.encodings.per_image\n"
            "from mmpe.coords import TimeLine\n"
            "from mmpe.integrations.transformers import layer_schedule_from_hf\n")
    # the core may warn about its own moves in progress; only these imports are checked
    pre = "import warnings; warnings.simplefilter('ignore'); import mmpe\n"
    run = subprocess.run([sys.executable, "-c", pre + code], capture_output=True, text=True,
                         cwd=ROOT / "tests")
    assert run.returncode == 0, run.stderr[-2000:]


OLD_PATHS = (*OLD_MODULES, "mmpe.recipes.gpu_cost")


def _old_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        found += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n in OLD_PATHS]
    return found


def test_the_repository_uses_the_new_paths() -> None:
    """Nothing here imports an old module (so nothing here warns), but this test and the
    tests of the old paths."""
    allowed = {"tests/package/test_moved_names.py", "tests/gpu/test_gpu_cost.py"}
    files = [p for d in ("mmpe", "recipes", "benchmarks", "tests", "docs")
             for p in (ROOT / d).rglob("*.py")]
    found = [hit for p in files if p.relative_to(ROOT).as_posix() not in allowed
             for hit in _old_imports(p)]
    assert not found, found
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import mmpe.recipes

    assert mmpe.recipes.RECIPES["gpu_cost"][1].startswith("deprecated")
