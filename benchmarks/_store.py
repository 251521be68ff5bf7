"""Stored benchmark runs: every table a benchmark prints, one JSON line per run and table.

``python benchmarks/bench_X.py --store DIR`` appends to ``DIR/bench_X.jsonl`` (``make bench``
passes ``--store results/bench``); ``mmpe report --write`` renders the README's and the docs'
``<!-- mmpe:bench bench_X table=ID -->`` blocks from those lines
(``mmpe.results.bench_report``), so no benchmark number is typed. The lines are written by the
results store's one writer (``mmpe.results.store.append_lines``). One line::

    {"bench": "bench_text", "table": "peers", "title": "1D encodings ...",
     "columns": ["operation", "peer", "mmpe ms", "peer ms", "peer / mmpe"],
     "formats": [null, null, "{:.2f}", "{:.2f}", "{:.2f}"],
     "rows": [["RoPE apply (half layout)", "HF transformers", 0.53, 1.71, 3.2], ...],
     "config": {"b": 4, ...}, "host": "AMD EPYC", "threads": 2, "torch": "2.11.0+cu130",
     "python": "3.11.7", "date": "2026-05-10T15:40:00+00:00",
     "git": {"commit": "b7aebfe...", "dirty": true}}

A cell is a string (a row label), a number (raw, unformatted: ``formats`` holds the column's
``str.format`` pattern, ``null`` for text), ``null`` (not measured), or ``[lo, hi]`` (a range
the run itself measured, e.g. over rounds). ``config`` holds the parameters that change the
numbers (sizes, repeats): the renderer combines only runs of one config.
"""

from __future__ import annotations

import datetime as _dt
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmpe.results.store import append_lines, cpu_model, git_state


@dataclass
class Table:
    """One printed table: a stable ``id``, its column names and per-column formats (``None``:
    a text column), and its rows of raw cells."""

    id: str
    title: str
    columns: list[str]
    formats: list[str | None]
    rows: list[list[Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.columns) != len(self.formats):
            raise ValueError(f"table {self.id!r}: {len(self.columns)} columns, "
                             f"{len(self.formats)} formats")

    def add(self, *cells: Any) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"table {self.id!r}: a row of {len(cells)} cells, "
                             f"{len(self.columns)} columns")
        self.rows.append([_raw(c) for c in cells])


def _raw(cell: Any) -> Any:
    if isinstance(cell, (list, tuple)):
        return [float(v) for v in cell]
    if cell is None or isinstance(cell, str):
        return cell
    return float(cell)


def host(cuda: bool = False) -> str:
    """The CUDA device's name (``cuda``), else the CPU's model name."""
    if cuda:
        import torch

        return torch.cuda.get_device_name()
    return cpu_model() or platform.processor() or platform.machine()


def git() -> dict[str, Any]:
    """The checkout's commit and whether its tracked files differ from it."""
    return git_state(Path(__file__).resolve().parents[1])


def record(table: Table, bench: str, *, threads: int | None = None,
           config: dict[str, Any] | None = None, cuda: bool = False,
           date: str | None = None) -> dict[str, Any]:
    """The JSON object of one table of one run (``threads``: default torch's)."""
    import torch

    return {"bench": bench, "table": table.id, "title": table.title,
            "columns": list(table.columns), "formats": list(table.formats),
            "rows": [list(r) for r in table.rows], "config": dict(config or {}),
            "host": host(cuda), "threads": torch.get_num_threads() if threads is None else threads,
            "torch": torch.__version__, "python": platform.python_version(),
            "date": date or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "git": git()}


def write(store: str | Path | None, bench: str, tables: Sequence[Table], **meta: Any) -> Path | None:
    """Append one line per table to ``store/<bench>.jsonl`` (nothing when ``store`` is None);
    the tables of one call share their date. ``meta``: see :func:`record`."""
    if store is None:
        return None
    date = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return append_lines(Path(store) / f"{Path(bench).stem}.jsonl",
                        [record(t, Path(bench).stem, date=date, **meta) for t in tables])
