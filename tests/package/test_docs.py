"""Every Python block of README.md and of the docs pages runs as a reader copies it.

Blocks are read by pytest-codeblocks, whose markers are HTML comments the site does not show:

- ``<!--pytest-codeblocks:cont-->`` before a block that continues the previous one: the two
  run as one script (a reader copies both);
- ``<!--pytest-codeblocks:expected-output-->`` before the ```` ```text ```` block that shows
  what the code prints: the printed output must equal it;
- ``<!--pytest-codeblocks:importorskip(rdkit)-->`` before a block that needs an extra: it skips
  without it (and under ``MMPE_HIDE_EXTRAS=1``, ``make test-core``).

Every other block must run on its own. Each runs in a fresh interpreter, not with the plugin's
in-process ``exec``: the walk-throughs register encodings and define classes, which must not
leak into the other tests' registry. Under ``MMPE_HIDE_EXTRAS=1`` the child hides the extras as
tests/conftest.py does here, so a block that needs one and does not say so fails there.

Sections a page includes from another file (``--8<-- "README.md:NAME"``, ``--8<--
"docs/results.md:NAME"``) are not part of the page's file: their blocks run as that file's. Blocks that are not run are ```` ```bash ```` or ```` ```text ````.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pytest_codeblocks")
from pytest_codeblocks import extract_from_file

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

#: The widest code line a page may show: wider ones are cut off at 1400 px, often hiding the
#: comment that says what a line prints.
MAX_CODE_LINE = 88

#: Runs a block file in the child, first hiding the extras when the tests hide them.
_CHILD = """
import os, runpy, sys
if os.environ.get("MMPE_HIDE_EXTRAS") == "1":
    sys.path.insert(0, {tests!r})
    import conftest  # noqa: F401  (installs the same import hook as in the parent)
runpy.run_path(sys.argv[1], run_name="__main__")
"""


def _blocks() -> list:
    cases = []
    for page in PAGES:
        for block in extract_from_file(page):
            if block.syntax == "python":
                name = f"{page.relative_to(ROOT).as_posix()}:{block.lineno}"
                cases.append(pytest.param(block, id=name))
    return cases


BLOCKS = _blocks()


def test_blocks_are_found() -> None:
    """The parser sees every ```python fence (a marker typo would silently drop blocks)."""
    fences = sum(p.read_text(encoding="utf-8").count("```python\n") for p in PAGES)
    continued = sum(p.read_text(encoding="utf-8").count("<!--pytest-codeblocks:cont-->")
                    for p in PAGES)
    assert len(BLOCKS) + continued == fences
    assert len(BLOCKS) >= 30


@pytest.mark.parametrize("block", BLOCKS)
def test_block_runs_as_copied(block, tmp_path: Path) -> None:
    if block.importorskip:
        pytest.importorskip(block.importorskip)
    for mark in block.marks:  # e.g. <!--pytest.mark.skipif(...)--> before a block
        evaluated = eval(mark, {"sys": sys, "pytest": pytest})  # noqa: S307 (our own docs)
        if evaluated.name == "skip" or (evaluated.name == "skipif" and evaluated.args[0]):
            pytest.skip(evaluated.kwargs.get("reason", mark))
    script = tmp_path / "block.py"
    script.write_text(block.code, encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "-c", _CHILD.format(tests=str(ROOT / "tests")), str(script)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "MPLBACKEND": "Agg"})
    if run.returncode and "FlexUnavailableError" in run.stderr:
        pytest.skip("the block shows route='flex', which needs torch >= 2.6")
    assert run.returncode == 0, f"line {block.lineno}:\n{block.code}\n{run.stderr[-4000:]}"
    if block.expected_output is not None:
        assert run.stdout == block.expected_output, f"line {block.lineno} prints otherwise"


def test_code_lines_fit() -> None:
    """Every line of every fenced block (code, shell, output) is at most MAX_CODE_LINE wide."""
    wide = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for fence in re.finditer(r"^( *)```[^\n]*\n(.*?)^\1```", text, flags=re.S | re.M):
            first = text.count("\n", 0, fence.start(2)) + 1
            for i, line in enumerate(fence.group(2).splitlines()):
                if len(line) > MAX_CODE_LINE:
                    wide.append(f"{page.relative_to(ROOT)}:{first + i} ({len(line)})")
    assert not wide, f"code lines wider than {MAX_CODE_LINE} characters: {wide}"
