"""A run's code state counts the recipes it imports: where `mmpe.recipes` resolves to another
checkout than the package (an editable install of one clone with `PYTHONPATH` at a worktree of
another commit: the trap that trained a worktree's runs on the main clone's recipes), the state
is dirty, not the package's clean commit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from mmpe.results import store

ROOT = Path(__file__).resolve().parents[2]


def _repo(path: Path) -> Path:
    run = {"cwd": path, "check": True, "capture_output": True}
    subprocess.run(["git", "init", "-q"], **run)
    (path / "x.py").write_text("x = 1\n")
    subprocess.run(["git", "add", "x.py"], **run)
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x"],
                   **run)
    return path


def test_recipes_from_another_checkout_make_the_state_dirty(tmp_path, monkeypatch) -> None:
    own, _ = store._checkout(ROOT)
    if own["commit"] is None:
        pytest.skip("not a git checkout")
    monkeypatch.setattr(store, "_companions", lambda: [ROOT / "recipes"])
    assert store.git_state() == own  # the package's own recipes: its own state
    monkeypatch.setattr(store, "_companions", lambda: [_repo(tmp_path)])
    assert store.git_state() == {"commit": own["commit"], "dirty": True}
