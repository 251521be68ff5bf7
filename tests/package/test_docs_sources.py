"""Quick checks of the documentation sources (no site build, so they run in `make test`): the
generated matrix page, the README's length and its moved sections, install facts that must
agree on every page. The site itself is built in tests/package/test_docs_site.py."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _gen_matrix():
    """docs/gen_matrix.py as a module (imported, it writes nothing)."""
    spec = importlib.util.spec_from_file_location("gen_matrix", DOCS / "gen_matrix.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_matrix_page_has_every_encoding_and_coordinate_type() -> None:
    """matrix.md (written at build time) has a row per registered encoding, a column per
    shipped coordinate type, a reason for every refusal, and agrees with `mmpe list --matrix`."""
    from mmpe import cli, registry

    page = _gen_matrix().page()
    kinds = list(registry.shipped_coordinate_types())
    entries = registry.available()
    for e in entries:
        row = re.search(rf"<tr><td><code>{re.escape(e.name)}</code></td>(.*?)</tr>", page)
        assert row, e.name
        marks = re.findall(r">([✓✗])</td>", row.group(1))
        assert [m == "✓" for m in marks] == [k in e.coords for k in kinds], e.name
        assert f"| `{e.name}` | {e.hook} |" in page, e.name
    for kind in kinds:
        assert f"<span>{kind}</span>" in page, kind
    assert page.count('title="refused: lacks ') == sum(
        k not in e.coords for e in entries for k in kinds)
    terminal = cli.matrix_table(entries, width=400).splitlines()[1:-1]
    assert [line.split()[2:2 + len(kinds)] for line in terminal] == [
        ["✓" if k in e.coords else "·" for k in kinds] for e in entries]
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "matrix.md" in config and "docs/gen_matrix.py" in config
