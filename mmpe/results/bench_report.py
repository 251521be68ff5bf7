"""Benchmark tables rendered from stored benchmark runs (`results/bench/<script>.jsonl`).

Every `benchmarks/bench_*.py --store results/bench` run appends one JSON line per table it
prints (`benchmarks/_store.py`: raw numbers, a format per column, host, threads, torch, date,
commit). README.md and the docs hold the tables between markers::

    <!-- mmpe:bench bench_text table=peers -->
    ...rendered table and caption...
    <!-- mmpe:end -->

Options after the script's stem: `table=ID` (required), `runs=N` (the newest N stored runs
of that table, counting a run that measured only some rows as one; default all), `columns="a,b"` (pick and order columns; text columns are always the row
labels that identify a row across runs), `rows=newest` (each row from the runs of the newest
commit that measured it: rows re-measured after a change show only the new numbers),
`host="text"` (only runs on a machine whose name contains `text`; without it, those of the
newest run's machine: a ratio to the unbiased layer is a property of the CPU, and a cell's
range over two CPUs would be neither's), `pending` (a table measured on a machine this one is
not, such as a GPU: until a run is stored the block says so, naming the script, instead of
failing). Only runs with the newest run's `config` (sizes,
repeats) are combined. A numeric cell is `min–max` over the runs holding that row (one value
where they agree to the column's format); a generated caption names the runs, dates, hosts,
threads and torch versions. `mmpe report --write/--check` renders these blocks beside the
`mmpe:report` ones, and a test fails where a page differs from what the store renders, so a
benchmark number can be neither typed nor stale.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmpe.results import store as _store

BLOCK = re.compile(r"(<!-- mmpe:bench (?P<args>[^>]*?) -->\n)(?P<body>.*?)(<!-- mmpe:end -->)",
                   re.DOTALL)

#: The benchmark store's folder inside a results store.
SUBDIR = "bench"


def bench_store(store: str | Path) -> Path:
    """The benchmark store of a results store (`results` → `results/bench`)."""
    return Path(store) / SUBDIR


@dataclass(frozen=True)
class BenchBlock:
    """What one `mmpe:bench` marker asks for."""

    bench: str
    table: str
    runs: int | None = None
    columns: tuple[str, ...] | None = None
    newest_rows: bool = False
    host: str | None = None
    pending: bool = False
    args: str = ""

    @classmethod
    def parse(cls, args: str) -> BenchBlock:
        """`'bench_text table=peers runs=2 columns="operation,peer / mmpe"'`.

        Raises:
            ValueError: no script stem, no `table=`, a bad `runs=` or an unknown key (names the
                block).
        """
        words = shlex.split(args)
        if not words or "=" in words[0]:
            raise ValueError(f"mmpe:bench block {args!r}: the first word must be a benchmark "
                             "script's stem (bench_text, ...)")
        fields: dict[str, Any] = {"bench": words[0], "args": args}
        for word in words[1:]:
            name, _, value = word.partition("=")
            if name == "table":
                fields["table"] = value
            elif name == "runs":
                if not value.isdigit() or int(value) < 1:
                    raise ValueError(f"mmpe:bench block {args!r}: runs must be a positive integer")
                fields["runs"] = int(value)
            elif name == "columns":
                fields["columns"] = tuple(c.strip() for c in value.split(",") if c.strip())
            elif name == "rows":
                if value != "newest":
                    raise ValueError(f"mmpe:bench block {args!r}: rows must be 'newest'")
                fields["newest_rows"] = True
            elif name == "pending" and not value:
                fields["pending"] = True
            elif name == "host":
                if not value:
                    raise ValueError(f"mmpe:bench block {args!r}: host must name a machine "
                                     '(host="AMD EPYC")')
                fields["host"] = value
            else:
                raise ValueError(f"mmpe:bench block {args!r}: unknown key {name!r} "
                                 "(known: table, runs, columns, rows, host, pending)")
        if not fields.get("table"):
            raise ValueError(f"mmpe:bench block {args!r}: give the table (table=ID)")
        return cls(**fields)


def read(store: str | Path, bench: str) -> list[dict[str, Any]]:
    """Every stored table of `bench` in a benchmark store, oldest first.

    Raises:
        ValueError: a line that is not a JSON object with bench, table, columns, formats and
            rows (names file and line).
    """
    path = Path(store) / f"{bench}.jsonl"
    if not path.exists():
        return []
    return _store.json_lines(path, ("bench", "table", "columns", "formats", "rows"))


def select(block: BenchBlock, records: list[dict[str, Any]], where: str = "") -> list[dict]:
    """The runs a block renders.

    The runs a block renders: its table, its `host` (else the newest run's), the newest
    run's config, the newest `runs`.

    Raises:
        ValueError: no stored run of the script or of the table, or none on the block's host
            (names the block and what is stored).
    """
    if not records:
        raise ValueError(f"mmpe:bench block {block.args!r}: no stored runs of {block.bench!r}"
                         f"{where} (run `python benchmarks/{block.bench}.py --store "
                         "results/bench`)")
    runs = [r for r in records if r["table"] == block.table]
    if not runs:
        known = sorted({r["table"] for r in records})
        raise ValueError(f"mmpe:bench block {block.args!r}: {block.bench!r} has no stored "
                         f"table {block.table!r} (stored: {', '.join(known)})")
    if block.host is not None:
        on_host = [r for r in runs if block.host in str(r.get("host", ""))]
        if not on_host:
            known = sorted({str(r.get("host", "?")) for r in runs})
            raise ValueError(f"mmpe:bench block {block.args!r}: no stored run of table "
                             f"{block.table!r} on a host containing {block.host!r} (hosts: "
                             f"{', '.join(known)})")
        runs = on_host
    else:
        runs = [r for r in runs if r.get("host") == runs[-1].get("host")]
    config = runs[-1].get("config")
    runs = [r for r in runs if r.get("config") == config]
    return runs[-block.runs:] if block.runs else runs


def _escape(text: str) -> str:
    return str(text).replace("|", "\\|")


def _fmt(fmt: str, value: float) -> str:
    return fmt.format(value)


def _cell(fmt: str | None, values: list[Any]) -> str:
    """A numeric column's cell over runs: `lo–hi`, or one value where both format alike."""
    texts = [v for v in values if isinstance(v, str)]
    if texts:  # a label in a numeric column (e.g. a size kept as text)
        return _escape(" / ".join(dict.fromkeys(texts)))
    numbers: list[float] = []
    for v in values:
        if isinstance(v, list):
            numbers += [float(x) for x in v]
        elif v is not None:
            numbers.append(float(v))
    if not numbers:
        return "—"
    fmt = fmt or "{:g}"
    lo, hi = _fmt(fmt, min(numbers)), _fmt(fmt, max(numbers))
    return lo if lo == hi else f"{lo}–{hi}"


def render_table(block: BenchBlock, runs: list[dict[str, Any]]) -> str:
    """The markdown table of `runs` (see the module doc) and its generated caption.

    Raises:
        ValueError: a column the block names that the table does not have.
    """
    newest = runs[-1]
    columns, formats = list(newest["columns"]), list(newest["formats"])
    labels = [i for i, f in enumerate(formats) if f is None]
    if block.columns:
        unknown = [c for c in block.columns if c not in columns]
        if unknown:
            raise ValueError(f"mmpe:bench block {block.args!r}: no column {unknown} "
                             f"(columns: {', '.join(columns)})")
        shown = [columns.index(c) for c in block.columns]
    else:
        shown = list(range(len(columns)))
    cells: dict[tuple, list[list[Any]]] = {}
    sources: dict[tuple, list[tuple[int, int]]] = {}  # (run, row) of each cell
    for number, run in enumerate(runs):
        index = {c: i for i, c in enumerate(run["columns"])}
        for place, row in enumerate(run["rows"]):
            by_name = {c: row[i] for c, i in index.items()}
            key = tuple(by_name.get(columns[i]) for i in labels)
            cells.setdefault(key, []).append([by_name.get(c) for c in columns])
            sources.setdefault(key, []).append((number, place))
    if block.newest_rows:
        cells, used = _newest_rows(runs, cells, sources)
        runs = [runs[i] for i in sorted(used)]
    lines = ["| " + " | ".join(_escape(columns[i]) for i in shown) + " |",
             "|" + "---|" * len(shown)]
    for rows in cells.values():
        out = []
        for i in shown:
            if formats[i] is None:
                out.append(_escape(rows[-1][i] if rows[-1][i] is not None else ""))
            else:
                out.append(_cell(formats[i], [r[i] for r in rows]))
        lines.append("| " + " | ".join(out) + " |")
    counts = sorted({len(rows) for rows in cells.values()})
    return "\n".join(lines) + "\n\n" + caption(block, runs, counts) + "\n"


def _newest_rows(runs: list[dict[str, Any]], cells: dict[tuple, list[list[Any]]],
                 sources: dict[tuple, list[tuple[int, int]]]) -> tuple[dict, set[int]]:
    """Each row from the runs of the newest commit that measured it (`rows=newest`: a row
    re-measured after a change of the code shows the new numbers only), and the runs used.
    Rows keep the order of their first label's first appearance, then their newest run's."""
    kept, used, order = {}, set(), {}
    first = {}
    for key in cells:
        first.setdefault(key[0], len(first))
    for key, rows in cells.items():
        commit = _commit(runs[sources[key][-1][0]].get("git") or {})
        picked = [i for i, (number, _) in enumerate(sources[key])
                  if _commit(runs[number].get("git") or {}) == commit]
        kept[key] = [rows[i] for i in picked]
        used.update(sources[key][i][0] for i in picked)
        order[key] = (first[key[0]], sources[key][-1][1])
    return {key: kept[key] for key in sorted(kept, key=order.__getitem__)}, used


def _join(values: Iterable[Any]) -> str:
    return ", ".join(str(v) for v in dict.fromkeys(values))


def caption(block: BenchBlock, runs: list[dict[str, Any]],
            counts: list[int] | None = None) -> str:
    """The generated line under a table: what was measured, how often, where, when.

    `counts`: the distinct numbers of runs holding a row (runs that each measured part of the
    rows, e.g. `bench_attention.py --coords --only grid`, hold a row once between them).
    """
    dates = sorted(str(r.get("date", "?"))[:10] for r in runs)
    when = dates[0] if dates[0] == dates[-1] else f"{dates[0]} – {dates[-1]}"
    counts = counts or [len(runs)]
    lo, hi = counts[0], counts[-1]
    if hi == 1:
        spread = ("one run" if len(runs) == 1
                  else f"one run per row (the rows come from {len(runs)} stored runs)")
    elif lo == hi:
        spread = f"cells are min–max over {hi} runs"
    else:
        spread = f"cells are min–max over {lo}–{hi} runs per row"
    threads = _join(r.get("threads", "?") for r in runs)
    commits = _join(_commit(r.get("git") or {}) for r in runs)
    return (f"*{_escape(runs[-1].get('title', block.table))}. Rendered from "
            f"`results/bench/{block.bench}.jsonl` (table `{block.table}`): {spread}, {when}, "
            f"on {_escape(_join(r.get('host', '?') for r in runs))}, {threads} thread"
            f"{'' if threads == '1' else 's'}, torch {_join(r.get('torch', '?') for r in runs)}, "
            f"commit {commits}.*")


def _commit(git: dict[str, Any]) -> str:
    """`abc1234`, with `+` where the run's checkout had uncommitted changes."""
    return (git.get("commit") or "?")[:7] + ("+" if git.get("dirty") else "")


def render_block(block: BenchBlock, store: str | Path) -> str:
    """The text between a block's markers, from the results store `store` (its `bench/`)."""
    path = bench_store(store)
    records = read(path, block.bench)
    try:
        runs = select(block, records, f" in {path}")
    except ValueError:
        if not block.pending:
            raise
        where = f" on a host containing {block.host!r}" if block.host else ""
        return (f"\n*Not measured yet: no stored run of `{block.bench}` table `{block.table}`"
                f"{where}. `benchmarks/gpu/run.sh` on a GPU stores one; `make report` "
                "renders it here.*\n\n")
    return render_table(block, runs)


def blocks(text: str) -> list[tuple[BenchBlock, str]]:
    """Every `(BenchBlock, current body)` in a markdown text."""
    return [(BenchBlock.parse(m.group("args")), m.group("body")) for m in BLOCK.finditer(text)]


def rewrite(text: str, store: str | Path) -> str:
    """`text` with every `mmpe:bench` block re-rendered from `store`."""
    def sub(m: re.Match) -> str:
        return m.group(1) + render_block(BenchBlock.parse(m.group("args")), store) + m.group(4)

    return BLOCK.sub(sub, text)


def stale(paths: Iterable[str | Path], store: str | Path) -> list[str]:
    """`mmpe:bench` blocks in `paths` whose text differs from what `store` renders."""
    out = []
    for path in paths:
        for m in BLOCK.finditer(Path(path).read_text(encoding="utf-8")):
            if m.group("body") != render_block(BenchBlock.parse(m.group("args")), store):
                out.append(f"{path}: mmpe:bench {m.group('args')}")
    return out
