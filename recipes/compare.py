"""Train one recipe with several encodings and compare them: a markdown table and a plot.

A recipe module `mmpe.recipes.<modality>` takes part by defining

* `COMPARE`: a [`CompareSpec`][recipes.compare.CompareSpec] (metric name, evaluation columns, defaults), and
* `run_one(encoding, *, seed, out_dir, cli_args) -> dict[str, float | None]`: train with one
  encoding (a registry name) and return the metric per column; `None` means the encoding
  cannot be evaluated there (shown as "n/a").

`mmpe compare <modality> --encodings a,b,c` then trains each encoding with each seed (the
recipe's `COMPARE.seeds`, 3 unless it says otherwise), appends one record per finished run to
the results store ([`mmpe.results.store`][mmpe.results.store]; runs already stored are
skipped), and prints the mean ± sd table rendered from the store
([`mmpe.results.report`][mmpe.results.report]), also written to `results.md` with a plot in
the output folder.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmpe import registry
from mmpe.attention import log_routes
from mmpe.results import report as _report
from mmpe.results import store as _store

#: Where `mmpe compare` stores its runs unless told otherwise (`--store`).
DEFAULT_STORE = Path("runs/results")


@dataclass(frozen=True)
class CompareSpec:
    """How a recipe reports a comparison.

    Attributes:
        metric: metric name (e.g. `"bpc"`, `"accuracy"`).
        columns: evaluation settings, in order (e.g. `["64", "128", …]`).
        xlabel: plot x-axis label (the meaning of a column, with units).
        lower_is_better: direction of the metric.
        default_encodings: the encodings compared when none are given.
        coords: the coordinates `all` and `--family` are resolved for: a kind name
            (`"grid"`) or a sample object (a causal `Sequence` for a language model, so
            encodings that refuse causal masks are left out).
        title: plot title.
        fmt: number format of the table.
        notes: lines printed under the table.
        higher_is_better: columns whose direction is the opposite of `lower_is_better`'s
            (a table of RMSE and R², say).
        seeds: seeds per encoding of a comparison (`mmpe compare --seeds` overrides).
        check_encoding: validates one `--encodings` name before any training (raises on an
            unknown one); defaults to the registry lookup. A recipe that accepts its own
            names (aliases, `a+b` combinations) passes its parser.
        plot: draws the recipe's own figure from stored runs (default: the metric per column).
        command: the command that stores more runs, named under a preliminary table (default
            `mmpe compare <recipe> --store results`), or a function of the block's settings
            that returns it.
        chance: the chance level of each accuracy column: a dict or a function of the column
            name (None: no chance level). Tables mark cells at chance and never call them best
            ([`mmpe.results.report`][mmpe.results.report]).
        in_distribution: for an extrapolation column, the in-distribution column it is read
            against (a function of the column name; None: none). Where that cell is below
            `mmpe.results.report.LEARNED` the task was not learned and the extrapolation cell
            is marked and never called best.
    """

    metric: str
    columns: list[str]
    xlabel: str
    lower_is_better: bool
    default_encodings: list[str]
    coords: Any = "sequence"
    title: str = ""
    fmt: str = "{:.3f}"
    notes: list[str] = field(default_factory=list)
    check_encoding: Callable[[str], object] | None = None
    seeds: int = 3
    higher_is_better: tuple[str, ...] = ()
    plot: Callable[..., Any] | None = None
    command: str | Callable[[tuple[str, ...]], str] | None = None
    chance: dict[str, float] | Callable[[str], float | None] | None = None
    in_distribution: Callable[[str], str | None] | None = None


def load_recipe(modality: str):
    """Import the recipe `modality` named in `mmpe.recipes.RECIPES`.

    Raises:
        ValueError: `modality` is not a known recipe (names the known ones).
    """
    from mmpe.recipes import RECIPES

    if modality not in RECIPES:
        raise ValueError(f"unknown recipe {modality!r}; known recipes: {', '.join(sorted(RECIPES))}")
    return importlib.import_module(RECIPES[modality][0])


def recipe_spec(modality: str) -> CompareSpec:
    """The `CompareSpec` of a recipe of `mmpe.recipes.RECIPES`: what `mmpe report` renders its
    stored runs with (the `specs` of [`mmpe.results.report`][mmpe.results.report]).

    A measurement of `mmpe.recipes.MEASUREMENTS` (`gpu_cost`) has its spec in its script, read
    from the repository checkout this package is installed from.

    Raises:
        ValueError: `modality` is neither a known recipe nor a known measurement.
        ImportError: a measurement's script is not in the checkout (an installed wheel).
    """
    from mmpe.recipes import MEASUREMENTS

    if modality in MEASUREMENTS:
        return _measurement(modality, MEASUREMENTS[modality][0]).COMPARE
    return load_recipe(modality).COMPARE


def _measurement(name: str, script: str) -> Any:
    path = Path(__file__).resolve().parents[1] / script
    if not path.is_file():
        raise ImportError(f"the measurement {name!r} is the script {script}, not here ({path}): "
                          "render its store from a checkout of the repository")
    spec = importlib.util.spec_from_file_location(f"mmpe_measurement_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def resolve_encodings(spec: CompareSpec, encodings: str | None, family: str | None) -> list[str]:
    """Names from `--encodings` (comma list or `all`) and/or `--family`."""
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


def compare(modality: str, encodings: str | None = None, family: str | None = None,
            out_dir: str | Path | None = None, seed: int = 0, cli_args: Sequence[str] = (),
            *, seeds: int | None = None, store: str | Path = DEFAULT_STORE,
            setting: str | None = None, rerun: bool = False, jobs: int = 1,
            allow_dirty: bool = False) -> str:
    """Train every (encoding, seed) not yet stored, store each run as it ends, return the table.

    Args:
        modality: a recipe of `mmpe.recipes.RECIPES`.
        encodings, family: what to compare (see [`resolve_encodings`][recipes.compare.resolve_encodings]).
        out_dir: logs and checkpoints, `<out_dir>/<encoding>/seed<s>` (default
            `runs/compare/<modality>`); the table goes to `results.md`, the plot to
            `<metric>.png` there.
        seed: the first seed; the seeds are `seed … seed + seeds − 1`.
        cli_args: LightningCLI arguments for every run (e.g. `--trainer.max_steps 2000`).
        higher_is_better: columns whose direction is the opposite of `lower_is_better`'s
            (a table of RMSE and R², say).
        seeds: seeds per encoding (default: the recipe's `COMPARE.seeds`).
        store: the results store ([`mmpe.results.store`][mmpe.results.store]): one JSON line
            per finished run.
        setting: the name the runs are stored under (default `default` without `cli_args`,
            else `custom-<hash>`).
        rerun: train again runs already in the store (the new record replaces the old one).
        jobs: runs trained at once, each in its own process (`spawn`); each uses
            `MMPE_THREADS` threads (default: the cores divided by `jobs`). Results do not
            depend on `jobs`, only on the threads per run.
        allow_dirty: store runs from a working tree with uncommitted changes in a committed
            store (`results/`); each record keeps `git.dirty` and tables flag its row.

    Raises:
        ValueError: an unknown recipe or encoding, `seeds < 1` or `jobs < 1`.
        mmpe.results.store.DirtyTreeError: the tree is dirty, `store` is committed and
            `allow_dirty` is false (before any training).
    """
    recipe = load_recipe(modality)
    spec: CompareSpec = recipe.COMPARE
    names = resolve_encodings(spec, encodings, family)
    n_seeds = spec.seeds if seeds is None else int(seeds)
    if n_seeds < 1:
        raise ValueError(f"compare: seeds must be >= 1, got {seeds}")
    if jobs < 1:
        raise ValueError(f"compare: jobs must be >= 1, got {jobs}")
    setting = _store.setting_name(list(cli_args), setting)
    _store.check_clean(store, allow_dirty=allow_dirty)  # before any training
    out = Path(out_dir or f"runs/compare/{modality}")
    out.mkdir(parents=True, exist_ok=True)
    finished = set() if rerun else _store.done(store, modality, setting)
    todo = []
    for s in range(seed, seed + n_seeds):
        for name in names:
            if (name, s) in finished:
                print(f"[mmpe compare {modality}] {name!r} seed {s}: stored in "
                      f"{_store.store_file(store, modality)}; skipped (--rerun trains it again)",
                      flush=True)
            else:
                todo.append(_Run(modality, recipe.__name__, setting, name, s,
                                 str(out / name / f"seed{s}"), tuple(cli_args), str(store),
                                 allow_dirty))
    if jobs > 1 and len(todo) > 1:
        _run_parallel(todo, jobs)
    else:
        for run in todo:
            _run_and_store(run)
    records = [r for r in _store.read(store, modality)
               if r["setting"] == setting and r["encoding"] in names
               and seed <= r["seed"] < seed + n_seeds]
    table = _report.render_table(spec, records, settings=[setting], rows=names)
    notes = "\n".join(f"- {n}" for n in spec.notes)
    (out / "results.md").write_text(f"{spec.title}\n\n{table}\n\n{notes}\n")
    _report.plot(spec, records, out / f"{_slug(spec.metric)}.png", setting, names)
    return table


@dataclass(frozen=True)
class _Run:
    """One (encoding, seed) of a comparison, picklable for a worker process."""

    modality: str
    module: str
    setting: str
    encoding: str
    seed: int
    out_dir: str
    cli_args: tuple[str, ...]
    store: str
    allow_dirty: bool = False


def _run_and_store(run: _Run) -> dict[str, float | None]:
    """Train one run, append its record to the store, return its metrics."""
    recipe = importlib.import_module(run.module)
    from mmpe.recipes.common import lightning_info_off  # (Lightning: imported by the recipe)

    tag = f"[mmpe compare {run.modality}] {run.encoding!r} seed {run.seed}"
    print(f"{tag}: training", flush=True)
    env = _store.environment()  # the code as the run starts, not as it ends
    if Path(run.out_dir).exists():  # logs of a run that stopped before it was stored
        shutil.rmtree(run.out_dir)
    start = time.perf_counter()
    # the route each attention layer took, stored with the run; Lightning's INFO lines off (the
    # two lines of this run say what ran)
    with log_routes() as routes, lightning_info_off():
        metrics = recipe.run_one(run.encoding, seed=run.seed, out_dir=Path(run.out_dir),
                                 cli_args=list(run.cli_args))
    wall = time.perf_counter() - start
    _store.append(run.store, _store.make_record(run.modality, run.setting, run.encoding, run.seed,
                                                metrics, wall_s=wall, cli_args=run.cli_args,
                                                out_dir=run.out_dir, env=env, routes=routes),
                  allow_dirty=run.allow_dirty)
    print(f"{tag}: {_metrics_line(metrics)} ({wall:.0f} s)", flush=True)
    return metrics


def _metrics_line(metrics: dict[str, Any]) -> str:
    """`1x 2.104, 2x 2.311, 4x n/a`: a run's metrics as its line prints them (4 digits; the
    store keeps every digit)."""
    def value(v: Any) -> str:
        return "n/a" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)

    return ", ".join(f"{k} {value(v)}" for k, v in metrics.items())


def _worker_init(threads: str) -> None:
    os.environ.setdefault("MMPE_THREADS", threads)


def _run_parallel(todo: list[_Run], jobs: int) -> None:
    """Train `todo` in `jobs` processes; every finished run is stored even if another fails."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = str(max(1, cores // jobs))
    errors = []
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_worker_init, initargs=(threads,)) as pool:
        futures = {pool.submit(_run_and_store, run): run for run in todo}
        for future in as_completed(futures):
            if future.exception() is not None:
                errors.append((futures[future], future.exception()))
    if errors:
        run, err = errors[0]
        raise RuntimeError(f"compare: {len(errors)} run(s) failed, first {run.encoding!r} seed "
                           f"{run.seed}: {err}") from err


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).strip("_") or "metric"
