"""Train one recipe with several encodings and compare them: a markdown table and a plot.

A recipe module ``mmpe.recipes.<modality>`` takes part by defining

* ``COMPARE``: a :class:`CompareSpec` (metric name, evaluation columns, defaults), and
* ``run_one(encoding, *, seed, out_dir, cli_args) -> dict[str, float | None]``: train with one
  encoding (a registry name) and return the metric per column; ``None`` means the encoding
  cannot be evaluated there (shown as "n/a").

``mmpe compare <modality> --encodings a,b,c`` then trains each encoding with each seed (the
recipe's ``COMPARE.seeds``, 3 unless it says otherwise), appends one record per finished run to
the results store (:mod:`mmpe.recipes.store`; runs already stored are skipped), and prints the
mean ± sd table rendered from the store (:mod:`mmpe.recipes.report`), also written to
``results.md`` with a plot in the output folder.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mmpe import registry

#: Where ``mmpe compare`` stores its runs unless told otherwise (``--store``).
DEFAULT_STORE = Path("runs/results")


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
        higher_is_better: columns whose direction is the opposite of ``lower_is_better``'s
            (a table of RMSE and R², say).
        seeds: seeds per encoding of a comparison (``mmpe compare --seeds`` overrides).
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
    seeds: int = 3
    higher_is_better: tuple[str, ...] = ()


def lower_is_better(spec: CompareSpec, column: str) -> bool:
    """The direction of one column (``spec.lower_is_better`` unless listed as an exception)."""
    return spec.lower_is_better != (column in spec.higher_is_better)


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
    """Deprecated: one row per encoding from one seed's metrics (use :mod:`mmpe.recipes.report`,
    which renders mean ± sd over stored seeds). Removed in 0.3."""
    import warnings

    warnings.warn("mmpe.recipes.compare.format_table is deprecated; tables come from stored runs "
                  "(mmpe.recipes.report.render_table)", FutureWarning, stacklevel=2)
    lines = [f"| encoding | {' | '.join(spec.columns)} | train s |", "|" + "---|" * (len(spec.columns) + 2)]
    for name, metrics in rows.items():
        cells = ["n/a" if metrics.get(c) is None else spec.fmt.format(metrics[c]) for c in spec.columns]
        lines.append(f"| {name} | {' | '.join(cells)} | {seconds.get(name, 0):.0f} |")
    return "\n".join(lines)


def compare(modality: str, encodings: str | None = None, family: str | None = None,
            out_dir: str | Path | None = None, seed: int = 0, cli_args: Sequence[str] = (),
            *, seeds: int | None = None, store: str | Path = DEFAULT_STORE,
            setting: str | None = None, rerun: bool = False) -> str:
    """Train every (encoding, seed) not yet stored, store each run as it ends, return the table.

    Args:
        modality: a recipe of :data:`mmpe.recipes.RECIPES`.
        encodings, family: what to compare (see :func:`resolve_encodings`).
        out_dir: logs and checkpoints, ``<out_dir>/<encoding>/seed<s>`` (default
            ``runs/compare/<modality>``); the table goes to ``results.md``, the plot to
            ``<metric>.png`` there.
        seed: the first seed; the seeds are ``seed … seed + seeds − 1``.
        cli_args: LightningCLI arguments for every run (e.g. ``--trainer.max_steps 2000``).
        higher_is_better: columns whose direction is the opposite of ``lower_is_better``'s
            (a table of RMSE and R², say).
        seeds: seeds per encoding (default: the recipe's ``COMPARE.seeds``).
        store: the results store (:mod:`mmpe.recipes.store`): one JSON line per finished run.
        setting: the name the runs are stored under (default ``default`` without ``cli_args``,
            else ``custom-<hash>``).
        rerun: train again runs already in the store (the new record replaces the old one).

    Raises:
        ValueError: an unknown recipe or encoding, or ``seeds < 1``.
    """
    from mmpe.recipes import report as _report
    from mmpe.recipes import store as _store

    recipe = load_recipe(modality)
    spec: CompareSpec = recipe.COMPARE
    names = resolve_encodings(spec, encodings, family)
    n_seeds = spec.seeds if seeds is None else int(seeds)
    if n_seeds < 1:
        raise ValueError(f"compare: seeds must be >= 1, got {seeds}")
    setting = _store.setting_name(list(cli_args), setting)
    out = Path(out_dir or f"runs/compare/{modality}")
    out.mkdir(parents=True, exist_ok=True)
    finished = set() if rerun else _store.done(store, modality, setting)
    for s in range(seed, seed + n_seeds):
        for name in names:
            tag = f"[mmpe compare {modality}] {name!r} seed {s}"
            if (name, s) in finished:
                print(f"{tag}: stored in {_store.store_file(store, modality)}; skipped "
                      "(--rerun trains it again)", flush=True)
                continue
            print(f"{tag}: training", flush=True)
            run_dir = out / name / f"seed{s}"
            start = time.perf_counter()
            metrics = recipe.run_one(name, seed=s, out_dir=run_dir, cli_args=list(cli_args))
            wall = time.perf_counter() - start
            _store.append(store, _store.make_record(modality, setting, name, s, metrics, wall_s=wall,
                                                    cli_args=cli_args, out_dir=run_dir))
            print(f"{tag}: {metrics} ({wall:.0f} s)", flush=True)
    records = [r for r in _store.read(store, modality)
               if r["setting"] == setting and r["encoding"] in names
               and seed <= r["seed"] < seed + n_seeds]
    table = _report.render_table(spec, records, settings=[setting], rows=names)
    notes = "\n".join(f"- {n}" for n in spec.notes)
    (out / "results.md").write_text(f"{spec.title}\n\n{table}\n\n{notes}\n")
    _report.plot(spec, records, out / f"{_slug(spec.metric)}.png", setting, names)
    return table


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).strip("_") or "metric"
