"""The documentation site: `mkdocs build --strict` passes and the pages have their content.

The first tests check the sources (every encoding module and every top-level name has an API
entry, every section a page includes from README.md or another page exists); the last builds the whole site as
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

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: `--8<-- "FILE:NAME"`: the lines between FILE's `<!-- --8<-- [start:NAME] -->` and
#: `<!-- --8<-- [end:NAME] -->` (README.md's intro and quickstart; docs pages' result sections).
SNIPPET = re.compile(r'^--8<-- "([-\w./]+\.md):([a-z][-_0-9a-z]*)"$', flags=re.M)


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


def test_included_sections_exist() -> None:
    used = {pair for page in DOCS.rglob("*.md")
            for pair in SNIPPET.findall(page.read_text(encoding="utf-8"))}
    assert ("README.md", "quickstart") in used, "the home page does not include the quickstart"
    for source, name in sorted(used):
        text = (ROOT / source).read_text(encoding="utf-8")
        for kind in ("start", "end"):
            marker = f"<!-- --8<-- [{kind}:{name}] -->"
            assert text.count(marker) == 1, f"{source} needs exactly one {marker!r} line"


def _text(html: str) -> str:
    """The page's text: tags dropped, entities decoded, runs of white space made one space."""
    return re.sub(r"\s+", " ", htmllib.unescape(re.sub(r"<[^>]+>", " ", html)))


def _first_rows(source: str, name: str) -> list[str]:
    """The first data row of every table in a marked section, as the page's text shows it."""
    section = source.split(f"<!-- --8<-- [start:{name}] -->")[1].split(
        f"<!-- --8<-- [end:{name}] -->")[0]
    rows = []
    for table in re.findall(r"(?:^\|.*\|\n)+", section, flags=re.M):
        lines = table.splitlines()
        if len(lines) > 2:
            cells = re.split(r"(?<!\\)\|", lines[2])[1:-1]
            text = " ".join(re.sub(r"[*`]", "", c).replace("\\|", "|").strip() for c in cells)
            rows.append(re.sub(r"\s+", " ", text))
    return rows


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `make docs` builds it (strict: any warning fails), built once per module."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings_handlers.python")
    pytest.importorskip("mkdocs_gen_files")
    pytest.importorskip("matplotlib")
    out = tmp_path_factory.mktemp("docs")
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(out / "site")],
        capture_output=True, text=True, timeout=600, cwd=out,
        # no banners about MkDocs 2 (Material's, and mkdocs-gen-files' through properdocs)
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"})
    assert run.returncode == 0, run.stderr[-4000:]
    assert "WARNING" not in run.stderr, run.stderr[-4000:]
    return out / "site"


def test_site_builds_strict(site: Path) -> None:
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

    # Benchmark and result tables live in marked sections (pages include them from each other):
    # the first row of every table of each section is on the page that has or includes it.
    for page in ("benchmarks.md", "results.md", "multimodal.md"):
        shown = _text((site / page.replace(".md", ".html")).read_text(encoding="utf-8"))
        assert "--8<--" not in shown, page
        own = (DOCS / page).read_text(encoding="utf-8")
        sections = [(own, name) for name in re.findall(r"<!-- --8<-- \[start:([-\w]+)\] -->", own)]
        sections += [((ROOT / source).read_text(encoding="utf-8"), name)
                     for source, name in SNIPPET.findall(own)]
        rows = [row for text, name in sections for row in _first_rows(text, name)]
        assert rows, page
        for row in rows:
            assert row in shown, (page, row)

    # Offline: no web fonts and no scripts or stylesheets from elsewhere.
    for path in site.rglob("*.html"):
        text = path.read_text(encoding="utf-8")
        assert "fonts.googleapis" not in text and "fonts.gstatic" not in text, path
        external = re.findall(r'<(?:script|link)\b[^>]*(?:src|href)="(?:https?:)?//[^"]*"', text)
        assert not external, (path, external[:3])


#: Sphinx roles and RST literals: mkdocstrings (Google style, Markdown) shows them as typed.
RAW_MARKUP = re.compile(r":(?:func|class|meth|data|mod|attr|exc|obj):`|``")


def _prose(html: str) -> str:
    """A page's text outside code blocks (a code example may show any markup it likes)."""
    return _text(re.sub(r"<pre\b.*?</pre>", " ", html, flags=re.S))


def test_no_raw_sphinx_markup(site: Path) -> None:
    """Docstrings cross-reference in autorefs syntax (``[`x`][mmpe.module.x]``) and quote code
    in single backticks: no ``:func:`x` `` or double backticks reach the HTML."""
    found = {}
    for path in sorted(site.rglob("*.html")):
        hits = RAW_MARKUP.findall(_prose(path.read_text(encoding="utf-8")))
        if hits:
            found[path.relative_to(site).as_posix()] = len(hits)
    assert not found, f"raw Sphinx roles or double backticks (count per page): {found}"


_RETURNS = re.compile(r'doc-section-title">(?:Returns|Yields):</span></p>\s*<table>(.*?)</table>',
                      flags=re.S)


def test_returns_rows_are_whole(site: Path) -> None:
    """A Returns / Yields row is one whole description: a wrapped sentence whose continuation
    line is not indented deeper than its first line renders as extra rows repeating the type,
    the earlier row then ending mid-sentence."""
    split = []
    for path in sorted((site / "api").rglob("*.html")):
        for table in _RETURNS.findall(path.read_text(encoding="utf-8")):
            rows = re.findall(r'<tr class="doc-section-item">.*?<div class="doc-md-description">'
                              r"(.*?)</div>", table, flags=re.S)
            for row in rows[:-1]:
                text = _text(row).strip()
                if not text.endswith((".", ";", ":", "!", "?")):
                    split.append(f"{path.name}: {text[-60:]!r}")
    assert not split, f"Returns rows that end mid-sentence (split items): {split}"


#: Modality pages and the figure each must show (generated at build time by docs/gen_figures.py).
FIGURES = {
    "text.html": "text_length", "grids.html": "grid_bias", "graphs.html": "graph_molecule",
    "tables.html": "table_feature_graph", "sphere.html": "sphere_map",
    "geometry.html": "geometry_kernels", "multimodal.html": "multimodal",
    "gallery.html": "gallery_",
}


@pytest.mark.parametrize("page", sorted(FIGURES))
def test_modality_pages_show_a_generated_figure(site: Path, page: str) -> None:
    html = (site / page).read_text(encoding="utf-8")
    images = re.findall(r'<img[^>]+src="([^"]+\.png)"', html)
    ours = [src for src in images if FIGURES[page] in src]
    assert ours, f"{page} shows no {FIGURES[page]}* figure: {images}"
    for src in ours:
        png = (site / page).parent / src
        assert png.is_file() and png.stat().st_size > 5_000, src
    assert "glightbox" in html, f"{page}: figures do not open enlarged"


def test_architecture_has_a_diagram(site: Path) -> None:
    html = (site / "architecture.html").read_text(encoding="utf-8")
    assert '<pre class="mermaid">' in html, "the Mermaid diagram is not rendered as one"


def test_formulas_version_changelog_and_sources(site: Path) -> None:
    """Formulas render offline (arithmatex spans, KaTeX and its fonts shipped with the site),
    the header names the version, the changelog is a page, API entries show their source."""
    import mmpe

    geometry = (site / "geometry.html").read_text(encoding="utf-8")
    assert geometry.count('class="arithmatex"') >= 4
    katex = sorted((site / "javascripts" / "vendor").glob("katex-*"))
    assert katex, "KaTeX is not shipped with the site"
    assert (katex[0] / "katex.min.js").is_file() and list((katex[0] / "fonts").glob("*.woff2"))
    assert "katex.min.js" in geometry and "katex-init.js" in geometry
    index = (site / "index.html").read_text(encoding="utf-8")
    assert f"mmpe {mmpe.__version__}" in index
    changelog = _text((site / "changelog.html").read_text(encoding="utf-8"))
    assert "Changelog" in changelog and "Unreleased" in changelog
    score = (site / "api" / "encodings" / "score.html").read_text(encoding="utf-8")
    assert "Source code in" in score and "mmpe/encodings/" in score
    matrix = (site / "matrix.html").read_text(encoding="utf-8")
    assert 'class="mmpe-matrix"' in matrix


def test_generated_figures_are_readable_at_page_width(site: Path) -> None:
    """Every figure drawn at build time has labels of at least 10 px where the page shows it
    (the text column, 688 px at a 1,400 px window; docs/gen_figures.py measures the smallest
    text of each figure), at most six panels in a gallery figure, and each figure is shown
    once on its page."""
    import json

    sizes = json.loads((site / "img" / "gen" / "label_sizes.json").read_text(encoding="utf-8"))
    assert len(sizes) >= 10
    small = {name: s["min_label_px"] for name, s in sizes.items() if s["min_label_px"] < 10}
    assert not small, f"labels under 10 px at the column's width: {small}"
    crowded = {name: s["panels"] for name, s in sizes.items()
               if name.startswith("gallery_") and s["panels"] > 9}
    assert not crowded, f"gallery figures with more than 9 panels: {crowded}"
    for page in sorted(site.glob("*.html")):
        images = re.findall(r'<img[^>]+src="(img/gen/[^"]+\.png)"', page.read_text(encoding="utf-8"))
        twice = {src for src in images if images.count(src) > 1}
        assert not twice, f"{page.name} shows {twice} more than once"
