"""The package as users install it: what the wheel holds, what the core imports, a real install."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXTRA_MODULES

try:  # the standard library from Python 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
#: the development lock: the wheel is installed under its versions, as a user of a checkout would
LOCK = ROOT / "requirements" / "lock.txt"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_import_mmpe_pulls_in_no_extra_and_no_recipe():
    """``import mmpe`` (and every core submodule) needs only torch, einops, numpy and scipy."""
    code = (
        "import sys, mmpe, mmpe.functional, mmpe.plot, mmpe.testing, mmpe.graph_maths, "
        "mmpe.table_maths, mmpe.earth, mmpe.lm, mmpe.cross_blocks, mmpe.generation\n"
        f"extras = {EXTRA_MODULES!r}\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in extras or m == 'recipes'"
        " or m.startswith(('mmpe.recipes', 'recipes.')))\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT / "tests").stdout.strip()
    assert out == "[]"


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_core_library_never_imports_the_recipes():
    """Only the CLI's ``compare`` command reaches the recipes (lazily, naming the extra)."""
    offenders = []
    for path in (ROOT / "mmpe").rglob("*.py"):
        if path.name == "cli.py":
            continue
        if path.relative_to(ROOT).as_posix() == "mmpe/compare.py":
            continue  # 0.1's module, a deprecated re-export of mmpe.recipes.compare until 0.3
        if any(n == "recipes" or n.startswith(("recipes.", "mmpe.recipes")) for n in _imports(path)):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_every_package_directory_is_in_the_wheel_list():
    """A new subpackage must be listed in pyproject (explicit list, mapped directories)."""
    setup = PYPROJECT["tool"]["setuptools"]
    listed = set(setup["packages"])
    dirs = setup["package-dir"]
    found = set()
    for name, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *rel)))
    assert found == listed
    configs = sorted((ROOT / "configs").glob("*/*.yaml"))
    assert configs and setup["package-data"]["mmpe.configs"] == ["*/*.yaml"]


def test_recipe_table_lists_every_recipe_module():
    """``mmpe.recipes.RECIPES`` is static; it must name each module that defines ``COMPARE``."""
    from mmpe.recipes import RECIPES

    modules = {p.stem for p in (ROOT / "recipes").glob("*.py")
               if "COMPARE" in {t.id for n in ast.parse(p.read_text()).body
                                if isinstance(n, ast.Assign) for t in n.targets
                                if isinstance(t, ast.Name)}}
    assert set(RECIPES) == modules
    assert all(mod == f"mmpe.recipes.{name}" for name, (mod, _) in RECIPES.items())


def test_core_dependencies_and_extras():
    project = PYPROJECT["project"]
    core = sorted(d.split(">")[0].split("[")[0] for d in project["dependencies"])
    assert core == ["einops", "numpy", "scipy", "torch"]
    extras = project["optional-dependencies"]
    assert {"timm", "pyg", "hf", "recipes", "data"} <= set(extras)
    for path in ("LICENSE", "CHANGELOG.md", "mmpe/py.typed"):
        assert (ROOT / path).is_file(), path
    assert project["urls"]


def test_missing_extra_names_the_pip_command(monkeypatch):
    from mmpe._optional import require

    monkeypatch.setitem(sys.modules, "timm", None)  # None in sys.modules: import fails
    with pytest.raises(ImportError, match=r"pip install 'mmpe\[timm\]'"):
        require("timm", "mmpe.integrations.timm")


@pytest.mark.slow
def test_wheel_installs_and_compare_runs_from_another_directory(tmp_path):
    """Build the wheel, install it with ``[recipes,data]`` (under the lock's versions) into a
    fresh venv outside the repo,
    and train ``mmpe compare text`` for a few steps from an unrelated folder."""
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(ROOT)], check=True)
    (wheel,) = wheels.glob("mmpe-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "-c", str(LOCK), f"{wheel}[recipes,data]"], check=True)
    subprocess.run([*pip, "--no-deps", "-r", str(ROOT / "requirements" / "nodeps.txt")], check=True)
    work = tmp_path / "elsewhere"
    (work / "recipes").mkdir(parents=True)  # a user's own recipes/ folder must not shadow ours
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    tiny = ["--trainer.max_steps", "4", "--trainer.val_check_interval", "2",
            "--trainer.limit_val_batches", "2", "--trainer.enable_progress_bar", "false",
            "--model.d_model", "32", "--model.depth", "1", "--model.num_heads", "2",
            "--data.eval_chars", "2048", "--data.batch_size", "8", "--data.context_length", "16"]
    run = subprocess.run([str(venv / "bin" / "mmpe"), "compare", "text", "--encodings", "rope",
                          "--seeds", "1", "--out", "out", "--", *tiny], cwd=work, env=env, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "| rope |" in run.stdout
    assert (work / "out" / "results.md").is_file()
    assert (work / "runs" / "results" / "text.jsonl").is_file()  # the default store
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import mmpe, mmpe.recipes; print(mmpe.recipes.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True, check=True).stdout
    assert str(venv) in where and str(ROOT) not in where
