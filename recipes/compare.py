"""Train one recipe with several encodings and compare them: a markdown table and a plot.

A recipe module ``mmpe.recipes.<modality>`` takes part by defining

* ``COMPARE``: a :class:`CompareSpec` (metric name, evaluation columns, defaults), and
* ``run_one(encoding, *, seed, out_dir, cli_args) -> dict[str, float | None]``: train with one
  encoding (a registry name) and return the metric per column; ``None`` means the encoding
  cannot be evaluated there (shown as "n/a").

``mmpe compare <modality> --encodings a,b,c`` then trains each, writes ``results.md``,
``results.json`` and ``<metric>.png`` to the output folder and prints the table.
"""

from __future__ import annotations

import importlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mmpe import registry


@dataclass(frozen=True)
class CompareSpec:
    """How a recipe reports a comparison.

    Attributes:
        metric: metric name (e.g. ``"bpc"``, ``"accuracy"``).
        columns: evaluation settings, in order (e.g. ``["64", "128", …]``).
        xlabel: plot x-axis label (the meaning of a column, with units).
        lower_is_better: direction of the metric.
        default_encodings: the encodings compared when none are given.
        coords: coordinate type used to resolve ``all`` and ``--family``.
        title: plot title.
        fmt: number format of the table.
        notes: lines printed under the table.
        check_encoding: validates one ``--encodings`` name before any training (raises on an
            unknown one); defaults to the registry lookup. A recipe that accepts its own
            names (aliases, ``a+b`` combinations) passes its parser.
    """

    metric: str
    columns: list[str]
    xlabel: str
    lower_is_better: bool
    default_encodings: list[str]
    coords: str = "sequence"
    title: str = ""
    fmt: str = "{:.3f}"
    notes: list[str] = field(default_factory=list)
    check_encoding: Callable[[str], object] | None = None


def load_recipe(modality: str):
    """Import the recipe ``modality`` named in :data:`mmpe.recipes.RECIPES`.

    Raises:
        ValueError: ``modality`` is not a known recipe (names the known ones).
    """
    from mmpe.recipes import RECIPES

    if modality not in RECIPES:
        raise ValueError(f"unknown recipe {modality!r}; known recipes: {', '.join(sorted(RECIPES))}")
    return importlib.import_module(RECIPES[modality][0])


def resolve_encodings(spec: CompareSpec, encodings: str | None, family: str | None) -> list[str]:
    """Names from ``--encodings`` (comma list or ``all``) and/or ``--family``."""
    if family:
        names = [e.name for e in registry.available(coords=spec.coords, family=family)]
        if not names:
            families = sorted({e.family for e in registry.available(coords=spec.coords)})
            raise ValueError(f"no encoding of family {family!r} for {spec.coords}; families: {families}")
        return names
    if not encodings:
        return list(spec.default_encodings)
    if encodings == "all":
        return [e.name for e in registry.available(coords=spec.coords)]
    names = [n.strip() for n in encodings.split(",") if n.strip()]
    for name in names:
        # Unknown names fail before any training starts.
        (spec.check_encoding or registry.get)(name)
    return names


def format_table(spec: CompareSpec, rows: dict[str, dict[str, float | None]],
                 seconds: dict[str, float]) -> str:
    """Markdown table: one row per encoding, one column per evaluation setting."""
    head = f"| encoding | {' | '.join(spec.columns)} | train s |"
    sep = "|" + "---|" * (len(spec.columns) + 2)
    lines = [head, sep]
    for name, metrics in rows.items():
        cells = [_cell(spec, metrics.get(col)) for col in spec.columns]
        lines.append(f"| {name} | {' | '.join(cells)} | {seconds.get(name, 0):.0f} |")
    return "\n".join(lines)


def _cell(spec: CompareSpec, value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return spec.fmt.format(value)


def plot(spec: CompareSpec, rows: dict[str, dict[str, float | None]], path: Path) -> None:
    """One line per encoding: metric against the evaluation columns."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    xs = list(range(len(spec.columns)))
    for name, metrics in rows.items():
        ys = [metrics.get(c) for c in spec.columns]
        pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=name)
    ax.set_xticks(xs, spec.columns)
    ax.set_xlabel(spec.xlabel)
    ax.set_ylabel(spec.metric + (" (lower is better)" if spec.lower_is_better else ""))
    ax.set_title(spec.title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def compare(modality: str, encodings: str | None = None, family: str | None = None,
            out_dir: str | Path | None = None, seed: int = 0,
            cli_args: Sequence[str] = ()) -> str:
    """Run the comparison; return the markdown table (also written to ``out_dir``)."""
    recipe = load_recipe(modality)
    spec: CompareSpec = recipe.COMPARE
    names = resolve_encodings(spec, encodings, family)
    out = Path(out_dir or f"runs/compare/{modality}")
    out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, dict[str, float | None]] = {}
    seconds: dict[str, float] = {}
    for name in names:
        print(f"[mmpe compare {modality}] training with {name!r}", flush=True)
        start = time.perf_counter()
        rows[name] = recipe.run_one(name, seed=seed, out_dir=out / name, cli_args=list(cli_args))
        seconds[name] = time.perf_counter() - start
        print(f"[mmpe compare {modality}] {name}: {rows[name]} ({seconds[name]:.0f} s)", flush=True)
    table = format_table(spec, rows, seconds)
    notes = "\n".join(f"- {n}" for n in spec.notes)
    (out / "results.md").write_text(f"{spec.title}\n\n{table}\n\n{notes}\n")
    (out / "results.json").write_text(json.dumps(
        {"modality": modality, "metric": spec.metric, "columns": spec.columns,
         "results": rows, "train_seconds": seconds, "seed": seed}, indent=2))
    plot(spec, rows, out / f"{spec.metric}.png")
    return table
