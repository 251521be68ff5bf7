"""Quick checks of the documentation sources (no site build, so they run in `make test`): the
generated matrix page, the README's length and its moved sections, install facts that must
agree on every page. The site itself is built in tests/package/test_docs_site.py."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _gen_matrix():
    """docs/gen_matrix.py as a module (imported, it writes nothing)."""
    spec = importlib.util.spec_from_file_location("gen_matrix", DOCS / "gen_matrix.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_matrix_page_has_every_encoding_and_coordinate_type() -> None:
    """matrix.md has a row per registered encoding, a column per
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
    assert "matrix.md" in config


def test_the_committed_matrix_page_is_current() -> None:
    """docs/matrix.md is committed (the README links it where the repository is read); it must
    be what docs/gen_matrix.py writes now."""
    assert (DOCS / "matrix.md").read_text(encoding="utf-8") == _gen_matrix().page(), \
        "docs/matrix.md is out of date: run `python docs/gen_matrix.py`"


def _read(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


def _apt_packages() -> list[str]:
    """The Debian packages `make apt` installs (the Makefile's APT_PKGS)."""
    return re.search(r"^APT_PKGS\s*:=\s*(.+)$", _read("Makefile"), flags=re.M).group(1).split()


NUMBERS = {2: "two", 3: "three", 4: "four", 5: "five"}


def test_debian_packages_agree_everywhere() -> None:
    """README, the home page and the install page name the packages `make apt` installs, and
    say how many there are in words; no page keeps an older count."""
    packages = _apt_packages()
    count = NUMBERS[len(packages)]
    for path in ("README.md", "docs/index.md", "docs/install.md"):
        text = " ".join(_read(path).split())
        assert re.search(rf"\b{count} (recipes read )?debian", text.lower()), (path, count)
        for word in set(NUMBERS.values()) - {count}:
            assert f"{word} debian packages" not in text.lower(), (path, word)
        for package in packages:
            assert f"`{package}`" in text or f" {package}" in text, (path, package)
    install = _read("docs/install.md")
    apt = re.search(r"^apt-get install ([^#\n]+)", install, flags=re.M).group(1).split()
    assert apt == packages, "docs/install.md's apt-get line differs from `make apt`"


def _extras() -> dict[str, list[str]]:
    import tomllib

    project = tomllib.loads(_read("pyproject.toml"))["project"]
    return {extra: [re.split(r"[<>=!~ ]", dep)[0] for dep in deps]
            for extra, deps in project["optional-dependencies"].items()}


def test_install_page_lists_each_extra_as_pyproject_has_it() -> None:
    """The install page's table of extras names exactly the packages of each extra in
    pyproject.toml (dev: a subset, the rest are 'the peer libraries'); the audio recipe's
    torchaudio comes with the extra that installs the recipes."""
    extras = _extras()
    assert "torchaudio" in extras["recipes"]
    rows = {m.group(1): re.findall(r"`([^`]+)`", m.group(2)) for m in re.finditer(
        r"^\| `(\w+)` \| (.*?) \|", _read("docs/install.md"), flags=re.M)}
    for extra, deps in extras.items():
        assert extra in rows, f"docs/install.md has no row for the extra {extra!r}"
        if extra == "dev":
            assert set(rows[extra]) <= set(deps), rows[extra]
        else:
            assert sorted(rows[extra]) == sorted(deps), (extra, rows[extra], deps)


def test_python_floor_and_environment_size_are_stated() -> None:
    import tomllib

    floor = tomllib.loads(_read("pyproject.toml"))["project"]["requires-python"]
    version = floor.removeprefix(">=")
    for path in ("README.md", "docs/index.md", "docs/install.md"):
        text = " ".join(_read(path).split())
        assert f"Python ≥ {version}" in text, path
    for path in ("README.md", "docs/index.md", "docs/install.md"):
        text = " ".join(_read(path).split())
        assert "6.6 GB" in text and "CUDA" in text, path
    readme = _read("README.md")
    assert "pip install mmpe" not in readme, "mmpe is installed from a checkout"
    assert "make test-floor" in readme and "make test" in readme


def test_home_page_links_every_guide_page() -> None:
    """docs/index.md's "Where to go next" links every page of the nav (the API pages through
    api/index.md)."""
    nav = _read("mkdocs.yml").split("\nnav:\n")[1]
    pages = re.findall(r"^\s*-\s*(?:[^\n]*?:\s*)?([\w/]+\.md)\s*$", nav, flags=re.M)
    assert "index.md" in pages and "matrix.md" in pages
    home = _read("docs/index.md").split("## Where to go next")[1]
    guide = [p for p in pages if not p.startswith("api/") and p != "index.md"]
    missing = [p for p in guide if f"]({p})" not in home]
    assert not missing, f"docs/index.md's 'Where to go next' lacks {missing}"
    assert "](api/index.md)" in home


def test_readme_is_short() -> None:
    """README.md introduces, installs, shows one example, sums up and links: the tables and
    the long sections live in docs/ (rendered and tested there)."""
    lines = _read("README.md").count("\n")
    assert lines < 400, f"README.md has {lines} lines"


def test_readme_reaches_its_quickstart_within_60_lines() -> None:
    """What a newcomer needs comes first: what mmpe is, install, the two commands (the test
    command verbatim: CI reads it), then the quickstart, by line 60; the CI tiers and per-target
    timings live on docs/development.md."""
    lines = _read("README.md").splitlines()
    heads = [i + 1 for i, line in enumerate(lines) if line.startswith("## ")]
    quick = next(i + 1 for i, line in enumerate(lines) if line == "## Quickstart")
    assert quick <= 60, f"README.md's quickstart starts at line {quick}"
    before = "\n".join(lines[:quick])
    assert "## Install" in before and "## The two commands" in before, heads
    assert ("```bash\n# main job: the text recipe, 7 encodings x 3 seeds, prints the README's "
            "table\nmake run\nmake test   # the test suite (what CI runs via .ci/run)\n```"
            in before)
    assert "35.3 minutes" not in _read("README.md") and "35.3 minutes" in _read(
        "docs/development.md"), "the timings moved to docs/development.md"


def test_every_readme_link_resolves_in_the_repository() -> None:
    """Where the README is read (the forge, a clone), each relative link names a file that is
    committed: no page that exists only in the built site."""
    readme = _read("README.md")
    targets = {t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", readme)
               if not re.match(r"[a-z]+:", t) and not t.startswith("#")}
    missing = sorted(t for t in targets if not (ROOT / t).exists())
    assert not missing, f"README links to files not in the repository: {missing}"


def test_one_page_extends_mmpe() -> None:
    """Adding an encoding or a coordinate type is one page, docs/extending.md, which the README
    and the home page send that row of their tables to: an encoding, a coordinate type with
    its contract checker, and what a mask of None means; architecture.md keeps no second
    walk-through of either."""
    page = _read("docs/extending.md")
    for heading in ("## An encoding", "## A coordinate type", "### The contract checker",
                    "### The mask: what `mask_mod()` returning `None` means"):
        assert f"\n{heading}\n" in page, heading
    assert "assert_coordinates_contract(ring)" in page and "assert_encoding_paths(" in page
    assert "| add an encoding or a coordinate type | [Extend mmpe](docs/extending.md) |" in \
        _read("README.md")
    assert "| add an encoding or a coordinate type | [Extend mmpe](extending.md) |" in \
        _read("docs/index.md")
    architecture = _read("docs/architecture.md")
    assert "Walk-through" not in architecture and "](extending.md)" in architecture
    assert not (DOCS / "plugins.md").exists() and "extending.md" in _read("mkdocs.yml")


def test_small_stumbles_stay_fixed() -> None:
    """Issue 59 item 7: `mmpe plot`'s default `plots/` is ignored by git; no docs block saves a
    file into the reader's current directory; the site links no `localhost` address (it is
    not the reader's machine); the benchmarks page's aside says where its runs are."""
    import subprocess

    ignored = subprocess.run(["git", "check-ignore", "-q", "plots/x.png"], cwd=ROOT)
    if ignored.returncode != 128:  # 128: not a git checkout (an sdist)
        assert ignored.returncode == 0, ".gitignore does not cover plots/"
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        assert "http://localhost" not in text, page.name
        assert not re.search(r"torch\.save\((?:[^()]|\([^()]*\))*, \"[^\"/]+\"\)", text), \
            page.name
    assert 'docs: benchmarks, "Stored runs"' not in _read("docs/benchmarks.md")


def _returns_items(obj, found: list[str]) -> None:
    """Every Returns / Yields item of `obj`'s members but the last, as the site's parser reads
    them (griffe, Google style): a row that does not end a sentence was split off its rest."""
    for member in obj.members.values():
        if member.is_alias:
            continue
        if member.docstring is not None:
            for section in member.docstring.parse("google"):
                if section.kind.value in ("returns", "yields"):
                    for item in section.value[:-1]:
                        text = item.description.strip()
                        if not text.endswith((".", ";", ":", "!", "?")):
                            found.append(f"{member.path}: {text[-50:]!r}")
        if member.is_module or member.is_class:
            _returns_items(member, found)


@pytest.fixture(scope="module")
def package():
    """The package `mmpe` as the docs site's parser reads it (griffe, Google style, from the
    sources without importing them)."""
    import logging

    griffe = pytest.importorskip("griffe")
    logging.getLogger("griffe").setLevel(logging.ERROR)
    return griffe.load("mmpe", search_paths=[str(ROOT)], docstring_parser="google",
                       allow_inspection=False)


def test_returns_sections_are_one_item_each(package) -> None:
    """A wrapped Returns line not indented deeper than its first becomes a row of its own on
    the site, the row before it ending mid-sentence (the site test checks the HTML in
    make test-train; this reads the sources with the same parser, in seconds)."""
    found: list[str] = []
    _returns_items(package, found)
    assert not found, f"Returns / Yields items that end mid-sentence: {found}"


def _public_docstrings(obj):
    """`(member, docstring)` of every public object the site documents below `obj`: members
    whose name does not start with `_` (the site's filter `!^_`), in modules and classes whose
    names do not either, imported names (aliases) left to their own module."""
    for name, member in obj.members.items():
        if member.is_alias or name.startswith("_"):
            continue
        if member.docstring is not None and member.docstring.value.strip():
            yield member, member.docstring
        if member.is_module or member.is_class:
            yield from _public_docstrings(member)


_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def whole_sentence(line: str) -> bool:
    """The summary rule: `line` ends with `.`, `?`, `!` or `:`, and outside its code spans
    (text between matching runs of backticks) it has no stray backtick and as many closing
    as opening brackets of each kind `()`, `[]`, `{}`."""
    line = line.strip()
    if not line.endswith((".", "?", "!", ":")):
        return False
    prose = _CODE_SPAN.sub("", line)
    return "`" not in prose and all(prose.count(o) == prose.count(c)
                                    for o, c in ("()", "[]", "{}"))


def test_whole_sentence_rule() -> None:
    """What the rule lets through and what it catches (the cut-off rows issue 59 found)."""
    assert whole_sentence("The dense route's budget in bytes.")
    assert whole_sentence("Longitudes wrapped to `[−π, π)`.")  # brackets inside code
    assert whole_sentence("The sdpa plan of a call (one of `SDPA_PLANS`):")
    assert not whole_sentence("What the route of one call depends on, without its tensors "
                              "(a named tuple: the")
    assert not whole_sentence("The dense budget: `override`, else MMPE_DENSE_BIAS_BYTES, else")
    assert not whole_sentence("Gradients of `q, k, v` (None where `needs` is False).) x.")
    assert not whole_sentence("One batch `(edge_index [2, ΣE], batch.")


def test_docstring_summaries_are_one_whole_sentence(package) -> None:
    """The site's summary tables (Modules, Classes, Functions, Attributes) show a docstring's
    first line only, so every public docstring's first line is one whole sentence by
    `whole_sentence`'s rule: it ends with `.`, `?`, `!` or `:` and its brackets and
    backticks balance (the detail follows in the next paragraph)."""
    cut = [f"{d.parent.filepath.relative_to(ROOT) if d.parent else ''}:{d.lineno} "
           f"{member.path}: {d.value.strip().splitlines()[0]!r}"
           for member, d in _public_docstrings(package)
           if not whole_sentence(d.value.strip().splitlines()[0])]
    if package.docstring is not None and not whole_sentence(
            package.docstring.value.strip().splitlines()[0]):
        cut.append("mmpe/__init__.py: the package docstring")
    assert not cut, f"{len(cut)} docstring summaries end mid-sentence:\n" + "\n".join(cut)


_SPHINX_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|obj|exc):`")


def test_no_sphinx_roles_in_the_sources() -> None:
    """mkdocstrings renders `:func:`x`` and its kin as raw text: the package cross-references
    as `[name][mmpe.path.name]` (docstrings) or in backticks (`#:` comments). Every source
    file of `mmpe`, private ones included."""
    found = [f"{path.relative_to(ROOT)}:{i}"
             for path in sorted((ROOT / "mmpe").rglob("*.py"))
             for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if _SPHINX_ROLE.search(line)]
    assert not found, f"Sphinx roles (write [name][mmpe.path.name]): {found}"


def test_attributes_sections_name_one_attribute_per_item(package) -> None:
    """An Attributes item `a, b: ...` renders as an attribute named "a," of type "b": one
    attribute per item, its name an identifier."""
    bad = [f"{member.path}: {item.name!r}"
           for member, d in _public_docstrings(package)
           for section in d.parse("google") if section.kind.value == "attributes"
           for item in section.value if not item.name.isidentifier()]
    assert not bad, f"Attributes items that name more than one attribute: {bad}"
