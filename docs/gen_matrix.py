"""The encodings × coordinates matrix page, docs/matrix.md, written from the registry.

`python docs/gen_matrix.py` rewrites docs/matrix.md; the page is committed, so that it reads
where the repository is read (the README links it), and tests/package/test_docs_sources.py
fails while it differs from `page()`. Every registered encoding is a row, every coordinate type mmpe
ships a column: ✓ where the type provides every capability the encoding needs, ✗ where it does
not, and the section under each table names what the refused type lacks. `mmpe list --matrix`
prints the same cells in a terminal.
"""

from __future__ import annotations

import html
from collections import defaultdict

from mmpe import registry

#: What a hook means, for the section titles.
HOOKS = {
    "input": "Input encodings: added to (or concatenated with) the token embeddings",
    "rotary": "Rotary encodings: rotate queries and keys",
    "score": "Score encodings: a term added to the attention logits",
    "kernel": "Kernel encodings: change the attention itself",
}


def cells() -> dict[str, dict[str, list[str]]]:
    """`{encoding: {kind: what the kind lacks ([] where it runs)}}` over every registered
    encoding and every shipped coordinate type."""
    kinds = registry.shipped_coordinate_types()
    return {e.name: {kind: registry.refusals(e, cls) for kind, cls in kinds.items()}
            for e in registry.available()}


def _table(entries: list, table: dict[str, dict[str, list[str]]], kinds: list[str]) -> list[str]:
    head = "".join(f'<th class="mmpe-kind"><span>{k}</span></th>' for k in kinds)
    rows = []
    for e in entries:
        tds = []
        for k in kinds:
            lacks = table[e.name][k]
            if lacks:
                why = html.escape("refused: lacks " + "; ".join(lacks))
                tds.append(f'<td class="mmpe-no" title="{why}">✗</td>')
            else:
                tds.append('<td class="mmpe-yes" title="runs">✓</td>')
        rows.append(f"<tr><td><code>{e.name}</code></td>{''.join(tds)}</tr>")
    return ['<div class="mmpe-matrix-wrap"><table class="mmpe-matrix">',
            f"<thead><tr><th>encoding</th>{head}</tr></thead>", "<tbody>", *rows,
            "</tbody></table></div>"]


def _refusals(entries: list, table: dict[str, dict[str, list[str]]], kinds: list[str]) -> list[str]:
    """One bullet per coordinate type: what it lacks, and for which encodings."""
    lines = []
    for k in kinds:
        by_reason: dict[str, list[str]] = defaultdict(list)
        for e in entries:
            if table[e.name][k]:
                by_reason["; ".join(table[e.name][k])].append(e.name)
        if not by_reason:
            lines.append(f"- `{k}`: runs every encoding above.")
            continue
        parts = [f"lacks {reason} for {', '.join(f'`{n}`' for n in names)}"
                 for reason, names in sorted(by_reason.items())]
        lines.append(f"- `{k}`: " + "; ".join(parts) + ".")
    return lines


def page() -> str:
    """The Markdown of matrix.md."""
    entries = registry.available()
    kinds = list(registry.shipped_coordinate_types())
    table = cells()
    runs = sum(not lacks for row in table.values() for lacks in row.values())
    lines = [
        "# Which encodings run on which coordinates",
        "",
        f"Every registered encoding ({len(entries)}) against every coordinate type mmpe ships "
        f"({len(kinds)}): **✓** runs, **✗** is refused because the coordinates lack a "
        f"capability the encoding needs ({runs} of {len(entries) * len(kinds)} pairs run). "
        "Hover a ✗ to see what is missing; the list under each table says it for every "
        "refused pair. The page is written from the registry by `python docs/gen_matrix.py` "
        "(a test fails while it is out of date), so a new encoding or coordinate type appears "
        "by running it; "
        "`mmpe list --matrix` prints the same cells in a terminal, `mmpe list` one row per "
        "encoding.",
        "",
        "A capability is a small protocol on the coordinates ([Architecture](architecture.md)); "
        "your own coordinate class runs every encoding whose capabilities it provides "
        "([Extend mmpe](extending.md)). Some capabilities are set per object rather than "
        "declared on the class; the check here reads the class, as `mmpe list` does.",
        "",
    ]
    for hook, title in HOOKS.items():
        group = [e for e in entries if e.hook == hook]
        if not group:
            continue
        lines += [f"## {title}", "", *_table(group, table, kinds), "",
                  "??? note \"Why a coordinate type refuses (" + hook + ")\"", ""]
        lines += ["    " + line for line in _refusals(group, table, kinds)]
        lines += [""]
    lines += ["## Hooks and papers", "",
              "| encoding | hook | parameters | needs | paper |", "|---|---|---|---|---|"]
    for e in entries:
        needs = ", ".join(f"`{c.__name__}`" for c in e.needs) or "nothing"
        paper = e.paper.replace("|", "\\|")
        lines.append(f"| `{e.name}` | {e.hook} | {'learned' if e.learnable else 'fixed'} "
                     f"| {needs} | {paper} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from pathlib import Path

    (Path(__file__).resolve().parent / "matrix.md").write_text(page(), encoding="utf-8")
