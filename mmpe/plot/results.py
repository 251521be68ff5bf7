"""Figures of stored experiment results: a metric `mean ± sd` per encoding.

The functions take plain Python data, `series = {name: [(mean, sd), ...]}` with one
`(mean, sd)` cell per column (or panel), as a report builds it from stored runs; a `None`
mean leaves the point out, a `None` sd draws no error bar (NaN counts as `None`).

| function | figure |
| --- | --- |
| [`metric_lines`][mmpe.plot.results.metric_lines] | one line per series across categorical columns (e.g. training lengths, data sizes), sd error bars, a legend |
| [`metric_points`][mmpe.plot.results.metric_points] | one panel per metric, one point ± sd per series (a dot plot to compare a handful of encodings on a few metrics) |

Each writes a PNG and returns its path; [`draw_metric_lines`][mmpe.plot.results.draw_metric_lines] and
[`draw_metric_points`][mmpe.plot.results.draw_metric_points] return the `Figure` instead, unsaved.
Figures are made and written through [`mmpe.plot.style`][mmpe.plot.style].

    >>> from mmpe.plot.results import metric_lines
    >>> metric_lines(["1x", "2x", "4x"], {"rope": [(3.1, 0.1), (3.4, 0.2), (4.0, None)],
    ...                                   "alibi": [(3.0, 0.1), (3.1, 0.1), (3.2, 0.1)]},
    ...              "lengths.png", xlabel="eval length / train length",
    ...              ylabel="loss (lower is better)")       # doctest: +SKIP
    PosixPath('lengths.png')
"""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mmpe.plot.style import new_figure, save

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["RESULT_DPI", "draw_metric_lines", "draw_metric_points", "metric_lines",
           "metric_points"]

#: one result: ``(mean, sd)``, either of them ``None`` when unknown.
Cell = tuple[float | None, float | None]
#: resolution of result figures (dots per inch).
RESULT_DPI = 150
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def draw_metric_lines(columns: Sequence[str], series: Mapping[str, Sequence[Cell]], *,
                      xlabel: str, ylabel: str, title: str = "", bands: bool = False) -> Figure:
    """The figure of [`metric_lines`][mmpe.plot.results.metric_lines], not saved.

    The columns are categorical: series `i`'s points lie at `x = 0 … len(columns) − 1`, the
    ticks labelled with the columns. Each series is one `errorbar` (its `ax.containers`
    entry, labelled with its name) holding the points whose mean is known, in column order.
    With `bands`, the sd is a shaded band `mean ± sd` around each line instead of error bars
    (easier to read where many lines overlap).

    Raises:
        ValueError: no columns; a series with a cell per column missing or extra, a cell that
            is not `(mean, sd)`, or a negative sd.
    """
    fn = "metric_lines"
    cols = [str(c) for c in columns]
    if not cols:
        raise ValueError(f"{fn}: give at least one column")
    rows = _cells(fn, series, len(cols), "column")
    fig = new_figure(7, 4.5, dpi=RESULT_DPI)
    ax = fig.add_subplot()
    for i, (name, cells) in enumerate(rows.items()):
        x = [j for j, (mean, _) in enumerate(cells) if mean is not None]
        y = [cells[j][0] for j in x]
        err = [math.nan if cells[j][1] is None else cells[j][1] for j in x]
        has_sd = any(not math.isnan(e) for e in err)
        ax.errorbar(x, y, yerr=err if has_sd and not bands else None,
                    color=f"C{i % 10}", marker=_MARKERS[i % len(_MARKERS)], ms=5, lw=1.4,
                    capsize=3, label=name)
        if bands and has_sd:
            mean = np.asarray(y, dtype=float)
            sd = np.nan_to_num(np.asarray(err, dtype=float))  # no sd: a band of width 0
            ax.fill_between(x, mean - sd, mean + sd, color=f"C{i % 10}", alpha=0.15, lw=0)
    _categorical_ticks(ax, cols, 6.0)
    ax.set_xlim(-0.5, len(cols) - 0.5)
    ax.set_xlabel(textwrap.fill(xlabel or "", 90))  # a long label wraps instead of clipping
    ax.set_ylabel(ylabel or "")
    if title:
        ax.set_title(title, wrap=True)  # (a recipe's long title: on two lines, not cut off)
    ax.grid(alpha=0.3)
    if rows:
        ax.legend(fontsize=8, ncols=2 if len(rows) > 8 else 1, loc="best", frameon=False)
    return fig


def metric_lines(columns: Sequence[str], series: Mapping[str, Sequence[Cell]],
                 path: str | os.PathLike, *, xlabel: str, ylabel: str, title: str = "") -> Path:
    """A metric across columns, one line per series with sd error bars, as a PNG.

    Args:
        columns: the x ticks, in order (e.g. `["1x", "2x", "4x"]`).
        series: `{name: [(mean, sd) per column]}`, a line each, in the legend by name. A
            `None` mean leaves its point out (the line joins its neighbours); a `None` sd
            draws no error bar.
        path: the PNG (its folder is made).
        xlabel: the x axis label. ylabel: the y axis label, e.g. `"loss (lower is better)"`.
        title: the figure title (none when empty).

    Returns:
        `path` as a `Path`.

    Raises:
        ValueError: see [`draw_metric_lines`][mmpe.plot.results.draw_metric_lines].
    """
    fig = draw_metric_lines(columns, series, xlabel=xlabel, ylabel=ylabel, title=title)
    return save(fig, path, dpi=RESULT_DPI)


def draw_metric_points(panels: Sequence[str], series: Mapping[str, Sequence[Cell]], *,
                       ylabels: Sequence[str], title: str = "") -> Figure:
    """The figure of [`metric_points`][mmpe.plot.results.metric_points], not saved.

    Panel `p` is `fig.axes[p]`; in it series `i` (in the order of `series`) is one
    `errorbar` at `x = i` (its `ax.containers` entry, labelled with its name), left out
    when its mean is unknown. The x ticks are the series names.

    Raises:
        ValueError: no panels; `ylabels` not one per panel; a series with a cell per panel
            missing or extra, a cell that is not `(mean, sd)`, or a negative sd.
    """
    fn = "metric_points"
    names = [str(p) for p in panels]
    if not names:
        raise ValueError(f"{fn}: give at least one panel")
    labels = [str(y) for y in ylabels]
    if len(labels) != len(names):
        raise ValueError(f"{fn}: ylabels must give one label per panel ({len(names)}), "
                         f"got {len(labels)}")
    rows = _cells(fn, series, len(names), "panel")
    n = len(rows)
    cols = min(len(names), 4)
    grid_rows = math.ceil(len(names) / cols)
    width = max(2.8, 0.55 * n + 1.4)
    fig = new_figure(width * cols, 3.6 * grid_rows + (0.4 if title else 0.0), dpi=RESULT_DPI)
    for p, panel in enumerate(names):
        ax = fig.add_subplot(grid_rows, cols, p + 1)
        for i, (name, cells) in enumerate(rows.items()):
            mean, sd = cells[p]
            if mean is None:
                continue
            ax.errorbar([i], [mean], yerr=None if sd is None else [sd], color=f"C{i % 10}",
                        marker=_MARKERS[i % len(_MARKERS)], ms=6, capsize=4, label=name)
        _categorical_ticks(ax, list(rows), width - 1.0)
        ax.set_xlim(-0.6, max(n, 1) - 0.4)
        ax.set_title(panel, fontsize=10)
        ax.set_ylabel(labels[p])
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    return fig


def metric_points(panels: Sequence[str], series: Mapping[str, Sequence[Cell]],
                  path: str | os.PathLike, *, ylabels: Sequence[str], title: str = "") -> Path:
    """A few metrics side by side, one panel each, one point ± sd per series, as a PNG.

    Args:
        panels: the panel titles, in order (e.g. `["accuracy", "loss"]`).
        series: `{name: [(mean, sd) per panel]}`; series `i` is drawn at `x = i` in
            every panel (same colour and marker), the x ticks labelled with the names. A
            `None` mean leaves the point out of that panel; a `None` sd draws no error bar.
        path: the PNG (its folder is made).
        ylabels: the y axis label of each panel.
        title: the figure title (none when empty).

    Returns:
        `path` as a `Path`.

    Raises:
        ValueError: see [`draw_metric_points`][mmpe.plot.results.draw_metric_points].
    """
    fig = draw_metric_points(panels, series, ylabels=ylabels, title=title)
    return save(fig, path, dpi=RESULT_DPI)


def _cells(fn: str, series: Mapping[str, Sequence[Any]], n: int,
           what: str) -> dict[str, list[tuple[float | None, float | None]]]:
    """`series` checked (`n` cells each) with float means and sds, NaN read as None."""
    if not isinstance(series, Mapping):
        raise ValueError(f"{fn}: series must map names to (mean, sd) cells, "
                         f"got {type(series).__name__}")
    rows: dict[str, list[tuple[float | None, float | None]]] = {}
    for name, cells in series.items():
        cells = list(cells)
        if len(cells) != n:
            raise ValueError(f"{fn}: series {name!r} has {len(cells)} cells, one per {what} "
                             f"({n}) expected")
        row = []
        for cell in cells:
            try:
                mean, sd = cell
            except (TypeError, ValueError):
                raise ValueError(f"{fn}: series {name!r}: each cell must be (mean, sd), "
                                 f"got {cell!r}") from None
            mean, sd = _number(fn, name, mean), _number(fn, name, sd)
            if sd is not None and sd < 0:
                raise ValueError(f"{fn}: series {name!r}: sd must be >= 0, got {sd}")
            row.append((mean, sd))
        rows[str(name)] = row
    return rows


def _number(fn: str, name: str, value: Any) -> float | None:
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{fn}: series {name!r}: means and sds must be numbers or None, "
                         f"got {value!r}") from None
    return None if math.isnan(value) else value


def _categorical_ticks(ax: Axes, labels: list[str], width: float) -> None:
    """Tick `i` labelled `labels[i]`; slanted when the labels would overlap on an axis
    `width` inches wide (about 0.09 inch per character at the default font size)."""
    room = width / max(len(labels), 1)
    long = max((len(s) for s in labels), default=0) * 0.09 > 0.9 * room
    ax.set_xticks(range(len(labels)), labels, rotation=30 if long else 0,
                  ha="right" if long else "center", rotation_mode="anchor" if long else "default")
