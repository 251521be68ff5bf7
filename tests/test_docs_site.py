"""The documentation site: `mkdocs build --strict` passes and the pages have their content.

The first tests check the sources (every encoding module and every top-level name has an API
entry, every README section a page includes exists); the last builds the whole site as
`make docs` does, with warnings as errors (about 20 s on 2 shared CPU cores), and skips when
the `docs` extra is not installed.
"""

from __future__ import annotations

import html as htmllib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SNIPPET = re.compile(r'^--8<-- "README\.md:([a-z][-_0-9a-z]*)"$', flags=re.M)


def test_every_encoding_module_has_an_api_entry() -> None:
    directives = {m for page in (DOCS / "api").rglob("*.md")
                  for m in re.findall(r"^::: (\S+)$", page.read_text(encoding="utf-8"), flags=re.M)}
    modules = sorted(p.stem for p in (ROOT / "mmpe" / "encodings").glob("[a-z]*.py"))
    missing = [m for m in modules if f"mmpe.encodings.{m}" not in directives]
    assert not missing, f"add `::: mmpe.encodings.<name>` to a page of docs/api/encodings: {missing}"


def test_every_top_level_name_is_listed() -> None:
    import mmpe

    page = (DOCS / "api" / "mmpe.md").read_text(encoding="utf-8")
    missing = [name for name in mmpe.__all__ if f"`{name}`" not in page]
    assert not missing, f"docs/api/mmpe.md does not list {missing}"


def test_included_readme_sections_exist() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    used = {name for page in DOCS.rglob("*.md")
            for name in SNIPPET.findall(page.read_text(encoding="utf-8"))}
    assert used, "no page includes a README section"
    for name in sorted(used):
        for kind in ("start", "end"):
            marker = f"<!-- --8<-- [{kind}:{name}] -->"
            assert readme.count(marker) == 1, f"README.md needs exactly one {marker!r} line"


def _text(html: str) -> str:
    """The page's text: tags dropped, entities decoded, runs of white space made one space."""
    return re.sub(r"\s+", " ", htmllib.unescape(re.sub(r"<[^>]+>", " ", html)))


def _first_rows(readme: str, name: str) -> list[str]:
    """The first data row of every table in a README section, as the page's text shows it."""
    section = readme.split(f"<!-- --8<-- [start:{name}] -->")[1].split(
        f"<!-- --8<-- [end:{name}] -->")[0]
    rows = []
    for table in re.findall(r"(?:^\|.*\|\n)+", section, flags=re.M):
        lines = table.splitlines()
        if len(lines) > 2:
            cells = re.split(r"(?<!\\)\|", lines[2])[1:-1]
            text = " ".join(re.sub(r"[*`]", "", c).replace("\\|", "|").strip() for c in cells)
            rows.append(re.sub(r"\s+", " ", text))
    return rows


def test_site_builds_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings_handlers.python")
    site = tmp_path / "site"
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert run.returncode == 0, run.stderr[-4000:]
    assert "WARNING" not in run.stderr, run.stderr[-4000:]

    # Pages are files (use_directory_urls: false), so the site reads from file:// too.
    for page in ("index.html", "install.html", "architecture.html", "text.html", "grids.html",
                 "graphs.html", "tables.html", "sphere.html", "benchmarks.html", "results.html",
                 "api/coords.html", "api/encodings/score.html", "api/recipes.html"):
        assert (site / page).is_file(), page

    coords = (site / "api" / "coords.html").read_text(encoding="utf-8")
    for name in ("Sequence", "Grid", "Graph", "Sphere"):
        assert f'id="mmpe.coords.{name}"' in coords, name
    assert 'id="mmpe.coords.capabilities.Metric"' in coords
    score = _text((site / "api" / "encodings" / "score.html").read_text(encoding="utf-8"))
    assert "ALiBi" in score and "Press" in score

    # Benchmark and result tables come from README.md, included by section: the first row of
    # every table of each included section is on the page.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in ("benchmarks.md", "results.md"):
        shown = _text((site / page.replace(".md", ".html")).read_text(encoding="utf-8"))
        assert "--8<--" not in shown, page
        sections = SNIPPET.findall((DOCS / page).read_text(encoding="utf-8"))
        rows = [row for name in sections for row in _first_rows(readme, name)]
        assert rows, page
        for row in rows:
            assert row in shown, (page, row)

    # Offline: no web fonts and no scripts or stylesheets from elsewhere.
    for path in site.rglob("*.html"):
        text = path.read_text(encoding="utf-8")
        assert "fonts.googleapis" not in text and "fonts.gstatic" not in text, path
        external = re.findall(r'<(?:script|link)\b[^>]*(?:src|href)="(?:https?:)?//[^"]*"', text)
        assert not external, (path, external[:3])
