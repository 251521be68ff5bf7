"""What the command line prints and refuses (issue 52): `mmpe list --matrix` within `--width`
and `$COLUMNS`, whole footer sentences, no `mmpe plot` option silently ignored, one count of
the shipped coordinate types, and the lazy `mmpe` package (`import mmpe` imports nothing).

All in-process (`cli.main`), fast: the import and start-up budgets, which need fresh
interpreters, are in test_import_budget.py (the subprocess tier).
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import mmpe
from mmpe import cli, registry
from mmpe.plot import plot_command

ROOT = Path(__file__).resolve().parents[2]


def _lines(capsys, argv: list[str]) -> list[str]:
    assert cli.main(argv) == 0
    return capsys.readouterr().out.splitlines()


@settings(max_examples=6)  # (each draw checks 79 × 13 pairs: about a second)
@given(width=st.integers(60, 260))
@example(width=60)
@example(width=100)
def test_matrix_fits_the_width_with_every_type_once(width: int) -> None:
    """Every line within `width` (60 holds the widest type beside the names); every shipped
    type is one whole column header, once; the marks agree with the registry."""
    entries = registry.available()
    kinds = list(registry.shipped_coordinate_types())
    text = cli.matrix_table(entries, width)
    assert max(map(len, text.splitlines())) <= width
    tables = text.split("\n\n")
    heads = [t.splitlines()[0].split() for t in tables]
    assert all(h[:2] == ["NAME", "HOOK"] for h in heads)
    assert [k for h in heads for k in h[2:]] == kinds
    for table, head in zip(tables, heads, strict=True):
        rows = table.splitlines()[1:1 + len(entries)]
        assert [r.split()[2:] for r in rows] == [
            ["✓" if k in e.coords else "·" for k in head[2:]] for e in entries]


def test_matrix_reads_columns_and_width(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "70")
    assert max(map(len, _lines(capsys, ["list", "--matrix"]))) <= 70
    assert max(map(len, _lines(capsys, ["list", "--matrix", "--width", "90"]))) <= 90


@settings(max_examples=30)
@given(width=st.integers(40, 200))
def test_list_footer_is_whole_sentences_within_the_width(width: int) -> None:
    text = cli.list_table(registry.available(), width)
    lines = text.splitlines()
    footer = " ".join(lines[1 + len(registry.available()):])
    assert footer.endswith(".") and "…" not in footer
    assert footer.startswith(f"{len(registry.available())} encodings.")
    assert all(len(line) <= max(width, 20) for line in lines[1 + len(registry.available()):])


#: (encoding, options) -> the flag `mmpe plot` must refuse: each option the chosen figures do
#: not read, on every kind of figure (decay, matrix/similarity, bias, grid maps, sphere, graph).
REFUSED = [
    ("rope", {"grid": (3,)}, "--grid"),
    ("rope", {"grid": (4, 4)}, "--grid"),
    ("rope", {"query": 4}, "--query"),
    ("rope", {"smiles": "CCO"}, "--smiles"),
    ("rope", {"features": True}, "--features"),
    ("rope", {"prefix": "attn"}, "--prefix"),
    ("sinusoidal", {"query": 3}, "--query"),
    ("sinusoidal", {"smiles": "CCO"}, "--smiles"),
    ("sinusoidal", {"features": True}, "--features"),
    ("alibi", {"features": True}, "--features"),
    ("alibi", {"query": 3}, "--query"),
    ("swin", {"length": 16}, "--length"),
    ("spherical_harmonics", {"length": 16}, "--length"),
    ("spherical_harmonics", {"query": 2}, "--query"),
    ("lappe", {"features": True}, "--features"),
    ("lappe", {"length": 16}, "--length"),
]


@pytest.mark.parametrize(("name", "options", "flag"), REFUSED,
                         ids=[f"{n}-{f}" for n, _, f in REFUSED])
def test_plot_refuses_an_option_its_figures_do_not_read(tmp_path, name, options, flag) -> None:
    if name == "lappe":  # graph encodings are drawn on a molecule, made from SMILES by RDKit
        pytest.importorskip("rdkit")
    with pytest.raises(ValueError, match=re.escape(flag)):
        plot_command(name, out=tmp_path, **options)
    assert not list(tmp_path.iterdir())  # refused before anything is drawn


def test_plot_command_line_refuses_grid_on_a_rotary_encoding(tmp_path, capsys) -> None:
    assert cli.main(["plot", "rope", "--grid", "3", "--out", str(tmp_path)]) == 2
    assert "--grid" in capsys.readouterr().err


def test_one_count_of_shipped_coordinate_types(monkeypatch) -> None:
    """Coordinates defined outside `mmpe.coords` (the multimodal recipe's `strip`, installed as
    `mmpe.recipes.multimodal`, or a user's) do not change the count, which is the README's and
    the matrix page's."""
    from mmpe.coords import base

    before = list(registry.shipped_coordinate_types())
    monkeypatch.setattr(base, "_COORDINATE_TYPES", dict(base._COORDINATE_TYPES))
    for module in ("mmpe.recipes.multimodal", "user_code"):
        type(f"Strip_{module}", (base.Coordinates,), {
            "kind": f"strip_{module}", "__module__": module, "num_queries": 1})
    assert f"strip_{module}" in base.coordinate_types()
    kinds = list(registry.shipped_coordinate_types())
    assert kinds == before and not any(k.startswith("strip") for k in kinds)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"run on {len(kinds)} coordinate types" in readme
    page = (ROOT / "docs" / "matrix.md").read_text(encoding="utf-8")
    assert f"every coordinate type mmpe ships ({len(kinds)})" in page


def _type_checking_names() -> dict[str, str]:
    """`name -> module` of the imports under `if TYPE_CHECKING:` in mmpe/__init__.py."""
    tree = ast.parse((ROOT / "mmpe" / "__init__.py").read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    names = {}
    for node in block.body:
        for alias in node.names:
            names[alias.asname or alias.name] = "" if node.module == "mmpe" else node.module
    return names


def test_the_lazy_package_table_is_the_type_checking_block() -> None:
    """`_EXPORTS` (what the interpreter reads) names what the TYPE_CHECKING block imports
    (what type checkers read), and both are `__all__`; every name resolves to its module's."""
    assert mmpe._EXPORTS == _type_checking_names()
    assert set(mmpe._EXPORTS) == set(mmpe.__all__)
    for name, module in mmpe._EXPORTS.items():
        want = importlib.import_module(f"mmpe.{name}") if not module else \
            getattr(importlib.import_module(module), name)
        assert getattr(mmpe, name) is want, name
    assert set(mmpe.__all__) <= set(dir(mmpe))
    assert mmpe.encodings.alibi.ALiBi is registry.get("alibi").cls
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        mmpe.nonexistent  # noqa: B018
