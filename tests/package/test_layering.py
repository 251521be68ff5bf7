"""Imports go down the layers only, and the modules' import graph has no cycle.

Every module of mmpe (and the recipes, installed as `mmpe.recipes`) is read with `ast`, never
imported: every `import` and `from … import` at any depth (module level, class bodies,
functions, `if TYPE_CHECKING:`) is mapped to the module it names. A module may import its own
layer and the layers below it (`LAYERS`, bottom first), and the imports form no cycle: neither
those that run when a module is imported nor the lazy ones inside functions (a lazy import
hides a cycle from the interpreter, not from the reader).

The one exception is the registry's lazy load of the built-in encodings (`ALLOWED`, naming the
exact pair and why); an entry that no longer matches an import fails, so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Where each installed package's sources are (pyproject's package-dir).
SOURCES = {"mmpe": ROOT / "mmpe", "mmpe.recipes": ROOT / "recipes", "mmpe.configs": ROOT / "configs"}

#: Bottom first. A module belongs to the entry with the longest matching prefix; `mmpe` alone
#: is the package's `__init__` (the facade that re-exports the core), nothing below it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("mmpe._optional", "mmpe.validation", "mmpe._scratch", "mmpe.table_maths",
                    "mmpe.graph_maths", "mmpe.earth", "mmpe.flex_compile", "mmpe.rebuild")),
    ("coordinates", ("mmpe.coords", "mmpe.molecules")),
    ("registry", ("mmpe.registry", "mmpe.context")),
    ("encodings", ("mmpe.encodings",)),
    # the KV cache is the attention modules' own state (it imports nothing of mmpe)
    ("attention", ("mmpe.attention", "mmpe.prepare", "mmpe.cache")),
    ("models", ("mmpe.transformer", "mmpe.functional", "mmpe.generation", "mmpe.lm",
                "mmpe.schedule", "mmpe.cross_blocks", "mmpe.checkpoints", "mmpe.testing",
                "mmpe.parallel")),
    ("integrations and plots", ("mmpe.integrations", "mmpe.plot")),
    ("package", ("mmpe",)),
    ("results", ("mmpe.results",)),
    # The command line dispatches to the recipes (`mmpe compare`).
    ("recipes and the command line", ("mmpe.recipes", "mmpe.configs", "mmpe.cli")),
]

#: (importer, imported) -> why the import may go up (or close a cycle).
ALLOWED: dict[tuple[str, str], str] = {
    ("mmpe.registry", "mmpe.encodings"):
        "plugin discovery: the registry imports the built-in encodings package on its first "
        "lookup (as it loads entry-point plugins), inside `_ensure_loaded`",
}


def _modules() -> dict[str, Path]:
    out = {}
    for package, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((package, *parts))] = path
    return out


MODULES = _modules()


def layer_of(module: str) -> int:
    best = None
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            exact_only = prefix == "mmpe"
            if module == prefix or (not exact_only and module.startswith(prefix + ".")):
                if best is None or len(prefix) > best[1]:
                    best = (rank, len(prefix))
    if best is None:
        raise LookupError(f"{module} is in no layer: add it to LAYERS in tests/package/test_layering.py")
    return best[0]


def _known(name: str) -> str | None:
    """The module `name` refers to (its longest prefix that is a module), None outside mmpe."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(module: str) -> list[tuple[str, int, bool]]:
    """`(imported module, line, runs at import time)` of every mmpe import in `module`."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, at_import: bool) -> None:
        for child in ast.iter_child_nodes(node):
            here = at_import
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                here = False
            if isinstance(node, ast.If) and _is_type_checking(node.test) and child in node.body:
                here = False
            if isinstance(child, ast.Import):
                for alias in child.names:
                    target = _known(alias.name)
                    if target:
                        out.append((target, child.lineno, here))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    source = ".".join([*base, *([child.module] if child.module else [])])
                else:
                    source = child.module or ""
                for alias in child.names:
                    # `from pkg import sub` imports the submodule `pkg.sub`
                    target = _known(f"{source}.{alias.name}") if f"{source}.{alias.name}" in MODULES \
                        else _known(source)
                    if target:
                        out.append((target, child.lineno, here))
            visit(child, here)

    visit(ast.parse(path.read_text(encoding="utf-8")), True)
    return [(t, line, now) for t, line, now in out if t != module]


EDGES = {m: imports(m) for m in MODULES}


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


def test_no_module_imports_a_higher_layer() -> None:
    bad = []
    for module, found in EDGES.items():
        for target, line, _ in found:
            if layer_of(target) > layer_of(module) and (module, target) not in ALLOWED:
                bad.append(f"{MODULES[module].relative_to(ROOT)}:{line}: {module} "
                           f"({LAYERS[layer_of(module)][0]}) imports {target} "
                           f"({LAYERS[layer_of(target)][0]})")
    assert not bad, "imports that go up a layer:\n" + "\n".join(sorted(bad))


#: Inside `mmpe.attention`, bottom first (issue 56): the vocabulary every path shares, the
#: forms of a term, the paths that read them, the choice of a route, the layers, the facade.
ATTENTION_LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("floor", ("mmpe.attention.record", "mmpe.attention.memory", "mmpe.attention.generic",
               "mmpe.attention.term_layouts", "mmpe.attention.masks")),
    ("forms", ("mmpe.attention.fast_forms", "mmpe.attention.forms")),
    ("kernels", ("mmpe.attention.flex", "mmpe.attention.plans", "mmpe.attention.fold",
                 "mmpe.attention.fla")),
    ("route", ("mmpe.attention.dispatch", "mmpe.attention.route")),
    ("layers", ("mmpe.attention.modules",)),
    ("facade", ("mmpe.attention",)),
]


def attention_layer_of(module: str) -> int:
    for rank, (_, prefixes) in enumerate(ATTENTION_LAYERS):
        if any(module == p or (p != "mmpe.attention" and module.startswith(p + "."))
               for p in prefixes):
            return rank
    raise LookupError(f"{module} is in no attention layer: add it to ATTENTION_LAYERS")


def test_no_attention_module_imports_a_higher_attention_layer() -> None:
    inside = [m for m in MODULES if m == "mmpe.attention" or m.startswith("mmpe.attention.")]
    bad = []
    for module in inside:
        for target, line, _ in EDGES[module]:
            if target in inside and attention_layer_of(target) > attention_layer_of(module):
                bad.append(f"{MODULES[module].relative_to(ROOT)}:{line}: {module} imports "
                           f"{target} ({ATTENTION_LAYERS[attention_layer_of(target)][0]})")
    assert not bad, "imports that go up inside mmpe.attention:\n" + "\n".join(sorted(bad))


def test_the_import_graph_has_no_cycle() -> None:
    graph = nx.DiGraph()
    graph.add_nodes_from(MODULES)
    graph.add_edges_from((m, t) for m, found in EDGES.items() for t, _, _ in found
                         if (m, t) not in ALLOWED)
    cycles = [" -> ".join([*c, c[0]]) for c in nx.simple_cycles(graph)]
    assert not cycles, "import cycles:\n" + "\n".join(sorted(cycles)[:20])


@pytest.mark.parametrize("pair", sorted(ALLOWED), ids=lambda p: f"{p[0]}->{p[1]}")
def test_every_exception_is_still_needed(pair: tuple[str, str]) -> None:
    importer, imported = pair
    assert ALLOWED[pair].strip(), f"{pair}: give the reason"
    assert importer in MODULES, f"{importer} is gone: remove its ALLOWED entry"
    assert any(t == imported for t, _, _ in EDGES[importer]), \
        f"{importer} no longer imports {imported}: remove the ALLOWED entry"


def test_the_reader_sees_function_level_and_type_checking_imports() -> None:
    """The registry's lazy load of the encodings is read, and not as an import-time one; a
    `TYPE_CHECKING` import is not import-time either."""
    found = {(t, now) for t, _, now in EDGES["mmpe.registry"]}
    assert ("mmpe.encodings", False) in found and ("mmpe.context", True) in found
    assert ("mmpe.encodings.base", False) in {(t, now) for t, _, now in EDGES["mmpe.attention.memory"]}


def test_the_only_exception_is_the_registry_lazy_load() -> None:
    assert set(ALLOWED) == {("mmpe.registry", "mmpe.encodings")}
    assert not any(now for t, _, now in EDGES["mmpe.registry"] if t == "mmpe.encodings")
