"""Every Python example in docs/*.md runs as written: each doc's examples, in order, as one
script in a fresh interpreter (the walk-throughs register encodings and define classes)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = sorted((Path(__file__).resolve().parent.parent / "docs").glob("*.md"))


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_doc_examples_run(doc: Path, tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.S)
    if not blocks:
        pytest.skip(f"{doc.name} has no Python example")
    script = tmp_path / f"{doc.stem}_examples.py"
    script.write_text("\n\n".join(blocks), encoding="utf-8")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
