"""Every Python example in docs/**/*.md runs as written: each doc's examples, in order, as one
script in a fresh interpreter (the walk-throughs register encodings and define classes).

README sections a page includes (``--8<-- "README.md:NAME"``) are not part of the page's file:
their examples run in tests/test_readme.py. Non-runnable blocks are ```bash or ```text.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS_DIR = Path(__file__).resolve().parent.parent / "docs"
DOCS = sorted(DOCS_DIR.rglob("*.md"))


@pytest.mark.parametrize("doc", DOCS, ids=[d.relative_to(DOCS_DIR).as_posix() for d in DOCS])
def test_doc_examples_run(doc: Path, tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.S)
    if not blocks:
        pytest.skip(f"{doc.name} has no Python example")
    script = tmp_path / f"{doc.stem}_examples.py"
    script.write_text("\n\n".join(blocks), encoding="utf-8")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    if run.returncode and "FlexUnavailableError" in run.stderr:
        pytest.skip(f"{doc.name} shows backend='flex', which needs torch >= 2.6")
    assert run.returncode == 0, run.stderr[-4000:]


#: Pages whose every Python block runs on its own, as a reader copies one.
STANDALONE = ["geometry.md"]


@pytest.mark.parametrize("name", STANDALONE)
def test_each_block_runs_as_copied(name: str, tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", (DOCS_DIR / name).read_text(encoding="utf-8"), flags=re.S)
    assert blocks, f"{name} has no Python example"
    for i, block in enumerate(blocks, start=1):
        run = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True,
                             timeout=300, cwd=tmp_path)
        assert run.returncode == 0, f"{name} block {i}:\n{run.stderr[-3000:]}"
