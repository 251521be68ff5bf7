"""Tables and plots rendered from stored runs ([`mmpe.results.store`][mmpe.results.store]): `mmpe report`.

Each table cell is the mean ± sample sd (`ddof=1`) over the seeds stored for that encoding;
the `seeds` column gives their number. A cell is **bold** only where the best encoding of its
column is separated from every other one by more than the seed noise: the difference of means
exceeds `NOISE_SDS` × the pooled sd `sqrt((sd_a² + sd_b²) / 2)`. Under the table a
generated line names the encodings within noise of the best in each column, so no winner is
claimed where seeds cannot tell.

Chance: a spec may give each accuracy column its chance level (`spec.chance(column)`, e.g. 0.5
for a one-bit answer). A cell whose mean is at most `CHANCE_MARGIN` above that level (or below
it) is marked `CHANCE_MARK` and explained under the table; such a cell is never the best of its
column, and a column where every row is at chance says so in the best-per-column line.

Learned first: a spec may name, for each extrapolation column, the in-distribution column it
is read against (`spec.in_distribution(column)`). Where that cell's mean is below `LEARNED`
the row did not learn the task in distribution: its extrapolation cell is marked
`NOT_LEARNED_MARK`, explained under the table, and never a column's best.

Runs tied to code: a row with a seed trained from a dirty working tree (`git.dirty` in its
record, [`mmpe.results.store`][mmpe.results.store]) is marked `DIRTY_MARK`, with a line under
the table.

README.md and the docs hold the tables between markers::

    <!-- mmpe:report text -->            (or: text setting=concat rows=sinusoidal,learned)
    ...rendered table...
    <!-- mmpe:end -->

`mmpe report --write FILES` rewrites every block from the store; a test renders each block
from the committed store (`results/`) and fails where a file differs, so a number can be
neither typed nor stale. The same commands render the benchmark tables (`<!-- mmpe:bench ...
-->` blocks, from `results/bench/`: [`mmpe.results.bench_report`][mmpe.results.bench_report]).

A block names a recipe; what its columns mean comes from that recipe's `CompareSpec`, which
the caller looks up (`specs`: `mmpe.recipes.compare.recipe_spec` for the recipes of
`mmpe.recipes.RECIPES`), so rendering a store never imports the recipes.
"""

from __future__ import annotations

import math
import re
import shlex
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmpe.results import bench_report
from mmpe.results import store as _store

#: A recipe's `CompareSpec` by its name: what a `mmpe:report` block is rendered with.
SpecLookup = Callable[[str], Any]

#: A column's best is marked only where it beats every other by this many pooled sds.
NOISE_SDS = 2.0
#: A cell at most this far above its column's chance level (or below it) is at chance.
CHANCE_MARGIN = 0.05
CHANCE_MARK = "°"
#: In-distribution accuracy a row needs before its extrapolation is read.
LEARNED = 0.95
NOT_LEARNED_MARK = "‡"
DIRTY_MARK = "†"

#: A marker's arguments may hold `>` inside double quotes (`columns="copy >L"`).
BLOCK = re.compile(r'(<!-- mmpe:report (?P<args>(?:[^>"]|"[^"]*")*?) -->\n)(?P<body>.*?)(<!-- mmpe:end -->)',
                   re.DOTALL)


@dataclass(frozen=True)
class Cell:
    """Mean, sample sd and number of seeds of one (encoding, column); mean None: n/a."""

    mean: float | None
    sd: float | None
    n: int


@dataclass(frozen=True)
class Block:
    """What one marker asks for: a recipe, its settings, optional rows, columns and plot."""

    recipe: str
    settings: tuple[str, ...] = ("default",)
    rows: tuple[str, ...] | None = None
    columns: tuple[str, ...] | None = None
    plot: str | None = None
    summary: bool = False
    preliminary: bool = False
    merge: bool = False

    @classmethod
    def parse(cls, args: str) -> Block:
        """Parse a block's arguments.

        `"text setting=default,concat rows=a,b columns=1x,2x plot=docs/img/x.png"`; the
        word `summary` renders only the best-per-column line (no table); `merge` makes one row
        per encoding of several settings' runs (see `render_table`). Quote a value with
        spaces: `columns="gate attn,gate mlp"`.

        Raises:
            ValueError: no recipe, or an unknown `key=value` (names the known keys).
        """
        words = shlex.split(args)
        if not words or "=" in words[0]:
            raise ValueError(f"mmpe:report block {args!r}: the first word must be a recipe name")
        fields: dict[str, Any] = {"recipe": words[0]}
        for word in words[1:]:
            if word in ("summary", "preliminary", "merge"):
                fields[word] = True
                continue
            name, _, value = word.partition("=")
            items = tuple(v for v in value.split(",") if v)
            if name == "setting":
                fields["settings"] = items
            elif name in ("rows", "columns"):
                fields[name] = items
            elif name == "plot":
                fields["plot"] = value
            else:
                raise ValueError(f"mmpe:report block {args!r}: unknown key {name!r} "
                                 "(known: setting, rows, columns, plot, summary, preliminary, merge)")
        return cls(**fields)


def lower_is_better(spec: Any, column: str) -> bool:
    """Whether lower values of one column are better.

    The direction of one column (`spec.lower_is_better` unless listed in
    `spec.higher_is_better`)."""
    return spec.lower_is_better != (column in spec.higher_is_better)


def chance_level(spec: Any, column: str) -> float | None:
    """The chance level of `column` (`spec.chance(column)`), None where the spec gives none."""
    chance = getattr(spec, "chance", None)
    if chance is None:
        return None
    level = chance.get(column) if isinstance(chance, dict) else chance(column)
    return None if level is None else float(level)


def at_chance(cell: Cell, chance: float | None) -> bool:
    """Whether `cell`'s mean is within `CHANCE_MARGIN` above `chance`, or below it."""
    return cell.mean is not None and chance is not None and cell.mean <= chance + CHANCE_MARGIN


def not_learned(spec: Any, summary_row: dict[str, Cell], column: str,
                records_row: dict[str, Cell] | None = None) -> bool:
    """Whether `column`'s in-distribution cell is stored and below `LEARNED`.

    Whether `column` is an extrapolation column whose in-distribution cell (in
    `records_row`, default `summary_row`) is stored and below `LEARNED`."""
    gate = getattr(spec, "in_distribution", None)
    if gate is None:
        return False
    base = gate(column)
    if base is None:
        return False
    cell = (records_row or summary_row).get(base)
    return cell is not None and cell.mean is not None and cell.mean < LEARNED


def summarise(records: Iterable[dict[str, Any]], columns: Iterable[str]) -> dict[str, dict[str, Cell]]:
    """`{encoding: {column: Cell}}` over the records' seeds, in first-seen encoding order."""
    values: dict[str, dict[str, list[float | None]]] = {}
    columns = list(columns)
    for r in records:
        row = values.setdefault(r["encoding"], {c: [] for c in columns})
        for c in columns:
            if c in r["metrics"]:  # absent: not stored (a merged row's missing task)
                row[c].append(r["metrics"][c])
    return {enc: {c: _cell(v) for c, v in row.items()} for enc, row in values.items()}


def _cell(values: list[float | None]) -> Cell:
    if not values:
        return Cell(None, None, 0)
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite or len(finite) < len(values):  # a seed that could not evaluate: n/a
        return Cell(None, None, len(values))
    sd = statistics.stdev(finite) if len(finite) > 1 else None
    return Cell(statistics.fmean(finite), sd, len(finite))


def separated(a: Cell, b: Cell) -> bool:
    """True where the means differ by more than `NOISE_SDS` pooled sds (needs ≥ 2 seeds)."""
    if a.mean is None or b.mean is None or a.sd is None or b.sd is None:
        return False
    pooled = math.sqrt((a.sd ** 2 + b.sd ** 2) / 2)
    return abs(a.mean - b.mean) > NOISE_SDS * pooled


def best_in_column(summary: dict[str, dict[str, Cell]], column: str,
                   lower_is_better: bool, chance: float | None = None,
                   skip: Iterable[str] = ()) -> tuple[str | None, bool, list[str]]:
    """The best encoding of a column, whether it clearly wins, and its near ties.

    `(best encoding, clear winner?, encodings within noise of the best)`; cells at chance
    ([`at_chance`][mmpe.results.report.at_chance]) and the rows in `skip` take no part."""
    skip = set(skip)
    cells = {e: row[column] for e, row in summary.items()
             if row[column].mean is not None and not at_chance(row[column], chance)
             and e not in skip}
    if not cells:
        return None, False, []
    pick = min if lower_is_better else max
    best = pick(cells, key=lambda e: cells[e].mean)
    tied = [e for e in cells if e != best and not separated(cells[best], cells[e])]
    # A row at chance is beaten by one above it: it counts as a rival.
    rivals = len(cells) - 1 + sum(1 for row in summary.values() if at_chance(row[column], chance))
    # With one seed there is no noise to beat: nothing is marked.
    return best, not tied and rivals > 0 and cells[best].sd is not None, tied


def render_table(spec: Any, records: list[dict[str, Any]], *, settings: Iterable[str] = ("default",),
                 rows: Iterable[str] | None = None, columns: Iterable[str] | None = None,
                 summary: bool = False, merge: bool = False) -> str:
    """The markdown table (mean ± sd, seeds) and its noise line for `records` of a recipe.

    With several settings, rows are `encoding (setting)`. `rows` picks and orders the
    encodings (default: as first stored).

    With `summary` only the best-per-column sentence is returned. With `merge` the settings'
    runs of one (encoding, seed) form one row (settings that store different columns, such as
    one model per task); a cell none of them stored shows `–` (not run yet), and a row or
    setting without runs is no error.

    Raises:
        LookupError: a requested row or setting has no stored run (names the command to run).
    """
    settings = list(settings)
    columns = list(columns or spec.columns)
    if merge:
        return _table(spec, _merged(records, settings, rows), columns, summary)
    label = (lambda e, s: e) if len(settings) == 1 else (lambda e, s: f"{e} ({s})")
    chosen = []
    for s in settings:
        runs = [r for r in records if r["setting"] == s]
        if not runs:
            raise LookupError(f"no stored runs of setting {s!r}: run `mmpe compare` first")
        order = list(rows) if rows else list(dict.fromkeys(r["encoding"] for r in runs))
        for enc in order:
            picked = [dict(r, encoding=label(enc, s)) for r in runs if r["encoding"] == enc]
            if not picked:
                raise LookupError(f"no stored run of {enc!r} in setting {s!r}")
            chosen += sorted(picked, key=lambda r: r["seed"])
    return _table(spec, chosen, columns, summary)


def _merged(records: list[dict[str, Any]], settings: list[str],
            rows: Iterable[str] | None) -> list[dict[str, Any]]:
    """One record per (encoding, seed): the metrics of `settings` together; a record is dirty
    where any of its parts is. An encoding of `rows` without runs keeps an empty row."""
    runs = [r for r in records if r["setting"] in settings]
    order = list(rows) if rows else list(dict.fromkeys(r["encoding"] for r in runs))
    merged: dict[tuple[str, int], dict[str, Any]] = {}
    for r in sorted(runs, key=lambda r: r["seed"]):
        if r["encoding"] not in order:
            continue
        m = merged.setdefault((r["encoding"], r["seed"]), {"encoding": r["encoding"],
                                                           "seed": r["seed"], "metrics": {}})
        m["metrics"].update(r["metrics"])
        if (r.get("git") or {}).get("dirty"):
            m["git"] = {"dirty": True}
    out = []
    for enc in order:
        mine = [m for (e, _), m in merged.items() if e == enc]
        out += mine or [{"encoding": enc, "seed": None, "metrics": {}}]
    return out


def _table(spec: Any, chosen: list[dict[str, Any]], columns: list[str], summary_only: bool) -> str:
    """The table of `chosen` (one record per row and seed) with its marks and legends."""
    # The in-distribution columns the gates read, shown or not.
    gate = getattr(spec, "in_distribution", None)
    hidden = [g for g in dict.fromkeys(gate(c) for c in columns) if gate] if gate else []
    full = summarise(chosen, [*columns, *[g for g in hidden if g and g not in columns]])
    summary = {e: {c: row[c] for c in columns} for e, row in full.items()}
    chance = {c: chance_level(spec, c) for c in columns}
    unread = {c: {e for e, row in full.items() if not_learned(spec, row, c)} for c in columns}
    marks = {c: best_in_column(summary, c, lower_is_better(spec, c), chance[c], unread[c])
             for c in columns}
    all_chance = {}  # per column: why it has no best, or why its best stands alone
    for c in columns:
        stored = [e for e, row in summary.items() if row[c].mean is not None]
        excluded = [e for e in stored if e in unread[c] or at_chance(summary[e][c], chance[c])]
        if marks[c][0] is None and stored:
            all_chance[c] = ("not learned in distribution by any row" if set(stored) <= unread[c]
                             else "no row above chance" if not unread[c]
                             else "no row learned and above chance")
        elif marks[c][0] is not None and not marks[c][2] and excluded:
            all_chance[c] = ("the only row above chance" if not unread[c]
                             else "the only row learned and above chance")
    if summary_only:
        return best_line(marks, all_chance)
    dirty = {r["encoding"] for r in chosen if (r.get("git") or {}).get("dirty")}
    used: set[str] = set()
    chance_cols: set[str] = set()
    lines = [f"| encoding | {' | '.join(columns)} | seeds |", "|" + "---|" * (len(columns) + 2)]
    for enc, row in summary.items():
        seeds = sorted({r["seed"] for r in chosen if r["encoding"] == enc and r["seed"] is not None})
        cells = []
        for c in columns:
            text = _format(spec.fmt, row[c], bold=marks[c][1] and marks[c][0] == enc)
            if row[c].n and seeds and row[c].n < len(seeds):
                text += f" ({row[c].n} seed{'s' if row[c].n > 1 else ''})"
            if enc in unread[c]:
                text, _ = text + NOT_LEARNED_MARK, used.add(NOT_LEARNED_MARK)
            elif at_chance(row[c], chance[c]):
                text, _ = text + CHANCE_MARK, used.add(CHANCE_MARK)
                chance_cols.add(c)
            cells.append(text)
        name = enc + (f" {DIRTY_MARK}" if enc in dirty else "")
        lines.append(f"| {name} | {' | '.join(cells)} | {_seed_list(seeds)} |")
    text = "\n".join(lines) + "\n\n" + noise_line(marks, {c: lower_is_better(spec, c) for c in columns},
                                                   all_chance)
    if NOT_LEARNED_MARK in used:
        text += "\n" + (f"{NOT_LEARNED_MARK}: not learned in distribution (its in-distribution "
                        f"mean, before rounding, is below {LEARNED:g}): the cell is not read as "
                        "extrapolation and "
                        "is never a column's best.")
    if CHANCE_MARK in used:
        text += "\n" + chance_line({c: v for c, v in chance.items() if c in chance_cols})
    if dirty:
        text += "\n" + dirty_line(chosen, dirty)
    return text


def chance_line(chance: dict[str, float | None]) -> str:
    """The legend of `CHANCE_MARK`.

    The legend of `CHANCE_MARK`, with the chance levels of `chance`'s columns (those with a
    marked cell)."""
    levels: dict[str, list[str]] = {}
    for c, level in chance.items():
        if level is not None:
            levels.setdefault(_level(level), []).append(c)
    named = "; ".join(f"{level} in {', '.join(cols)}" for level, cols in levels.items())
    return (f"{CHANCE_MARK}: at chance (mean at most {CHANCE_MARGIN:g} above the column's chance "
            f"level, or below it); such a cell is never a column's best. Chance: {named}.")


def _level(level: float) -> str:
    return "≈ 0" if level < 1e-3 else f"{level:g}"


def dirty_line(records: list[dict[str, Any]], dirty: set[str]) -> str:
    """The legend of `DIRTY_MARK`: how many of the rows' runs came from a dirty tree."""
    records = [r for r in records if r.get("seed") is not None]  # not a merged row's stand-in
    n = sum(1 for r in records if r["encoding"] in dirty and (r.get("git") or {}).get("dirty"))
    return (f"{DIRTY_MARK}: {n} of this table's {len(records)} runs were trained from a working "
            "tree with uncommitted changes (`git.dirty` in their records): their code is not "
            "exactly a commit.")


def _format(fmt: str, cell: Cell, bold: bool) -> str:
    if cell.n == 0:
        return "–"  # not stored yet
    if cell.mean is None:
        return "n/a"
    text = fmt.format(cell.mean) + ("" if cell.sd is None else " ± " + fmt.format(cell.sd))
    return f"**{text}**" if bold else text


def _seed_list(seeds: list[int]) -> str:
    if not seeds:
        return "0"
    if seeds == list(range(seeds[0], seeds[0] + len(seeds))) and len(seeds) > 2:
        return f"{len(seeds)} ({seeds[0]}–{seeds[-1]})"
    return f"{len(seeds)} ({', '.join(map(str, seeds))})"


def noise_line(marks: dict[str, tuple], lower: dict[str, bool],
               all_chance: dict[str, str] | None = None) -> str:
    """One generated sentence: per column, the clear winner or who is within noise of the best."""
    if len(set(lower.values())) == 1:
        direction = ("lower" if next(iter(lower.values())) else "higher") + " is better"
    else:
        higher = [c for c, low in lower.items() if not low]
        direction = f"higher is better in {', '.join(higher)}, lower in the others"
    rule = (f"Mean ± sample sd over seeds ({direction}). Bold: best beyond noise "
            f"(mean difference > {NOISE_SDS:g} × pooled sd to every other row); "
            "with one seed nothing is marked.")
    return rule + " Best per column — " + best_line(marks, all_chance)


def best_line(marks: dict[str, tuple], all_chance: dict[str, str] | None = None) -> str:
    """The line naming each column's best encoding.

    `"1x: **rope**; 2x: fire, alibi (within noise); 4x: no row above chance."`: per column
    the clear winner, or the best with every row within noise of it; `all_chance` says why a
    column with stored cells has no best."""
    parts, all_chance = [], all_chance or {}
    for col, (best, clear, tied) in marks.items():
        if best is None:
            if col in all_chance:
                parts.append(f"{col}: {all_chance[col]}")
            continue
        if not clear and not tied:
            parts.append(f"{col}: {best} ({all_chance.get(col, 'the only row')})")
        elif clear:
            parts.append(f"{col}: **{best}**")
        else:
            parts.append(f"{col}: {', '.join([best, *tied])} (within noise)")
    return "; ".join(parts) + "." if parts else "none stored yet."


def series(spec: Any, records: list[dict[str, Any]], setting: str = "default",
           rows: Iterable[str] | None = None) -> dict[str, list[tuple[float | None, float | None]]]:
    """`{encoding: [(mean, sd) per column]}` for a plot."""
    runs = [r for r in records if r["setting"] == setting]
    if rows:
        runs = [r for r in runs if r["encoding"] in set(rows)]
    summary = summarise(runs, spec.columns)
    return {enc: [(row[c].mean, row[c].sd) for c in spec.columns] for enc, row in summary.items()}


def draw_bands(ax: Any, summary: dict[str, dict[str, Cell]], columns: list[str]) -> None:
    """Draw one line per encoding over `columns`, with the seeds' sd as a band.

    On `ax`, one line per encoding over `columns` (at x = 0, 1, …) with the seeds' sd as a
    band; cells without a mean are left out. The recipes' multi-panel figures share it."""
    import numpy as np

    x = np.arange(len(columns))
    for enc, row in summary.items():
        keep = [i for i, c in enumerate(columns) if row[c].mean is not None]
        mean = np.array([row[columns[i]].mean for i in keep])
        sd = np.array([row[columns[i]].sd or 0.0 for i in keep])
        (line,) = ax.plot(x[keep], mean, marker="o", ms=3, label=enc)
        ax.fill_between(x[keep], mean - sd, mean + sd, color=line.get_color(), alpha=0.15, lw=0)


def plot(spec: Any, records: list[dict[str, Any]], path: str | Path, setting: str = "default",
         rows: Iterable[str] | None = None) -> Path:
    """The recipe's figure.

    The recipe's metric per column, one line per encoding, sd error bars (PNG); or the
    recipe's own figure (`spec.plot`)."""
    from mmpe.plot.results import metric_lines

    if getattr(spec, "plot", None) is not None:
        return spec.plot(records, Path(path), setting, rows)

    ylabel = spec.metric + (" (lower is better)" if spec.lower_is_better else " (higher is better)")
    return metric_lines(list(spec.columns), series(spec, records, setting, rows), Path(path),
                        xlabel=spec.xlabel, ylabel=ylabel, title=spec.title)


def render_block(block: Block, store: str | Path, *, specs: SpecLookup) -> str:
    """The text between a block's markers, from `store`; `specs` gives the recipe's spec."""
    return _render(block, specs(block.recipe), _store.read(store, block.recipe))


#: Seeds per row a comparison needs before its table stands on its own.
MIN_SEEDS = 3


def _render(block: Block, spec: Any, records: list[dict[str, Any]]) -> str:
    text = render_table(spec, records, settings=block.settings, rows=block.rows,
                        columns=block.columns, summary=block.summary, merge=block.merge) + "\n"
    if block.preliminary:
        text += preliminary_line(block, records, getattr(spec, "command", None)) + "\n"
    return text


def seeds_per_row(block: Block, records: list[dict[str, Any]]) -> dict[str, int]:
    """Stored seeds of each row (encoding) the block shows (0 for a listed row without runs)."""
    runs = [r for r in records if r["setting"] in block.settings
            and (not block.rows or r["encoding"] in block.rows)]
    out: dict[str, set[int]] = {enc: set() for enc in block.rows or ()}
    for r in runs:
        out.setdefault(r["encoding"], set()).add(r["seed"])
    return {enc: len(seeds) for enc, seeds in out.items()}


def preliminary_line(block: Block, records: list[dict[str, Any]],
                     command: str | None = None) -> str:
    """The visible warning under a block marked `preliminary`.

    The visible warning under a block marked `preliminary` (fewer seeds than it needs);
    `command` stores more runs (default `mmpe compare <recipe> --store results`)."""
    fewest = min(seeds_per_row(block, records).values(), default=0)
    if callable(command):  # a spec's command per block settings (one setting per task, say)
        command = command(block.settings)
    command = command or f"mmpe compare {block.recipe} --store results"
    return (f"*Preliminary: {fewest} of the {MIN_SEEDS} seeds per row stored so far; "
            f"`{command}` trains the rest (stored runs are skipped) and `make report` "
            "re-renders this.*")


def blocks(text: str) -> list[tuple[Block, str]]:
    """Every `(Block, current body)` in a markdown text."""
    return [(Block.parse(m.group("args")), m.group("body")) for m in BLOCK.finditer(text)]


def rewrite(text: str, store: str | Path, plots: bool = False, root: str | Path = ".", *,
            specs: SpecLookup) -> str:
    """`text` with every block re-rendered.

    `text` with every block re-rendered (and, with `plots`, its plot redrawn), the
    benchmark tables (`mmpe:bench`, [`mmpe.results.bench_report`][mmpe.results.bench_report])
    too."""
    def sub(m: re.Match) -> str:
        block = Block.parse(m.group("args"))
        spec, records = specs(block.recipe), _store.read(store, block.recipe)
        if plots and block.plot:
            setting = ",".join(block.settings) if block.merge else block.settings[0]
            plot(spec, records, Path(root) / block.plot, setting, block.rows)
        return m.group(1) + _render(block, spec, records) + m.group(4)

    return bench_report.rewrite(BLOCK.sub(sub, text), store)


def stale(paths: Iterable[str | Path], store: str | Path, *, specs: SpecLookup) -> list[str]:
    """Blocks in `paths` whose text differs from what `store` renders.

    Blocks in `paths` whose text differs from what `store` renders (`path: args`), the
    benchmark tables (`mmpe:bench`, from `store/bench`) included."""
    out = []
    for path in paths:
        text = Path(path).read_text()
        for m in BLOCK.finditer(text):
            block = Block.parse(m.group("args"))
            if m.group("body") != render_block(block, store, specs=specs):
                out.append(f"{path}: mmpe:report {m.group('args')}")
    return out + bench_report.stale(paths, store)
