"""Stored runs: one JSON line per (recipe, setting, encoding, seed), written as each run ends.

A results store is a folder of JSON Lines files, `<store>/<recipe>.jsonl`. Every line is one
finished training run::

    {"recipe": "text", "setting": "default", "encoding": "rope", "seed": 0,
     "metrics": {"1x": 2.44, ...}, "wall_s": 101.3, "cli_args": [...],
     "config": {"lightning_logs/version_0/config.yaml": {...resolved LightningCLI config...}},
     "versions": {"mmpe": ..., "torch": ..., "lightning": ..., "python": ...},
     "git": {"commit": ..., "dirty": ...}, "device": "cpu (...)", "threads": 2,
     "routes": {"0 MultiHeadAttention": ["sdpa"], ...},
     "finished": "2026-11-26T03:10:00+00:00"}

`routes` is the attention route each layer took (`mmpe.attention.log_routes`), so a stored
run says which path it timed (a GPU run: dense, flex or SDPA per layer).

`pandas.read_json(path, lines=True)` reads a store; a table is a groupby over `encoding`.
A line is appended (under a file lock) as soon as its run finishes, so a comparison stopped
part-way keeps what it finished, and [`done`][mmpe.results.store.done] lets a re-run skip those
runs. [`append_lines`][mmpe.results.store.append_lines] is the one writer of every store: the
runs here, the benchmark tables (`benchmarks/_store.py`) and the GPU cost rounds
(`benchmarks/gpu/gpu_cost.py`).

Runs are tied to code: every record stores `git.commit` and `git.dirty` (uncommitted changes to
tracked files when the run started). A store that git would commit (inside a checkout and not
ignored: the repository's `results/`) refuses a run from a dirty tree unless the writer asks
for it (`allow_dirty`, `mmpe compare --allow-dirty`), and every table rendered from a store
flags a row with a dirty-tree seed ([`mmpe.results.report`][mmpe.results.report]). Scratch
stores (`runs/`, ignored by git; temporary folders) take any run, so development and the
tests write there without the flag.

`setting` names the configuration a run used: `"default"` is the recipe's default config
without extra arguments; runs with extra LightningCLI arguments get `custom-<hash of the
arguments>` unless the caller names the setting (`mmpe compare --setting NAME`).
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import json
import os
import platform
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

#: The fields that identify a run; a store holds at most one record per key.
KEY_FIELDS = ("recipe", "setting", "encoding", "seed")


def setting_name(cli_args: Sequence[str], setting: str | None = None) -> str:
    """`setting` if given, `"default"` without extra arguments, else `custom-<hash>`."""
    if setting:
        return setting
    if not cli_args:
        return "default"
    digest = hashlib.sha1("\0".join(cli_args).encode()).hexdigest()[:8]
    return f"custom-{digest}"


def store_file(store: str | Path, recipe: str) -> Path:
    """The JSON Lines file of `recipe` in `store`."""
    return Path(store) / f"{recipe}.jsonl"


def read(store: str | Path, recipe: str) -> list[dict[str, Any]]:
    """Every record of `recipe` in `store` (an empty list when there is none).

    A later record with the same key replaces an earlier one (`mmpe compare --rerun` appends).

    Raises:
        ValueError: a line that is not a JSON object with the key fields (names file and line).
    """
    path = store_file(store, recipe)
    if not path.exists():
        return []
    by_key: dict[tuple, dict[str, Any]] = {}
    for record in json_lines(path, (*KEY_FIELDS, "metrics")):
        by_key[key(record)] = record
    return list(by_key.values())


def json_lines(path: Path, need: Iterable[str]) -> list[dict[str, Any]]:
    """The JSON objects of a JSON Lines file, in order (blank lines skipped).

    Raises:
        ValueError: a line that is not JSON, or not an object with every field of `need`
            (names the file and line).
    """
    need = tuple(need)
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not JSON ({err})") from err
        missing = [f for f in need if not isinstance(record, dict) or f not in record]
        if missing:
            raise ValueError(f"{path}:{number}: record lacks {missing}")
        out.append(record)
    return out


def key(record: dict[str, Any]) -> tuple:
    """`(recipe, setting, encoding, seed)` of a record."""
    return tuple(record[f] for f in KEY_FIELDS)


def done(store: str | Path, recipe: str, setting: str) -> set[tuple[str, int]]:
    """`(encoding, seed)` pairs of `recipe`/`setting` already stored."""
    return {(r["encoding"], int(r["seed"])) for r in read(store, recipe) if r["setting"] == setting}


def append(store: str | Path, record: dict[str, Any], *, allow_dirty: bool = False) -> Path:
    """Append one run's record (a JSON line) to its recipe's file; returns the file.

    Raises:
        ValueError: the record lacks a key field or `metrics`.
        DirtyTreeError: the record's `git.dirty` is true, `store` is a committed store
            ([`committed_store`][mmpe.results.store.committed_store]) and `allow_dirty` is
            false.
    """
    missing = [f for f in (*KEY_FIELDS, "metrics") if f not in record]
    if missing:
        raise ValueError(f"store.append: record lacks {missing}")
    check_clean(store, record.get("git"), allow_dirty=allow_dirty)
    return append_lines(store_file(store, record["recipe"]), [record])


class DirtyTreeError(RuntimeError):
    """A run from a working tree with uncommitted changes, for a store that git commits."""


def committed_store(store: str | Path) -> bool:
    """Whether git would commit `store`.

    Whether git would commit `store`: it lies in a git working tree and is not ignored (the
    repository's `results/`; not `runs/` nor a folder outside a checkout)."""
    here = Path(store).resolve()
    while not here.exists() and here != here.parent:
        here = here.parent
    probe = here if here.is_dir() else here.parent
    try:
        inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=probe,
                                capture_output=True, text=True, timeout=10)
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return False
        ignored = subprocess.run(["git", "check-ignore", "-q", str(Path(store).resolve())],
                                 cwd=probe, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return ignored.returncode != 0


def check_clean(store: str | Path, git: dict[str, Any] | None = None, *,
                allow_dirty: bool = False) -> None:
    """Refuse a dirty-tree run for a committed store, before it trains or when it is written.

    Args:
        store: the results store.
        git: `{"commit", "dirty"}` of the run (default: [`git_state`][mmpe.results.store.git_state]
            now).
        allow_dirty: write anyway (the record keeps `git.dirty: true`; tables flag its row).

    Raises:
        DirtyTreeError: `git.dirty` is true and `store` is committed (names the store, the
            commit and the two ways out).
    """
    if allow_dirty:
        return
    git = git_state() if git is None else git
    if not git or not git.get("dirty"):
        return
    if committed_store(store):
        raise DirtyTreeError(
            f"store {store} is committed with the repository and the working tree has uncommitted "
            f"changes (HEAD {str(git.get('commit'))[:10]}): commit them first so the run is tied "
            "to its code, or pass --allow-dirty (allow_dirty=True) to store it flagged as dirty")


def append_lines(path: str | Path, records: Iterable[dict[str, Any]]) -> Path:
    """Append `records` to the JSON Lines file `path`, one line each, under an exclusive lock.

    One write of all the lines, flushed to disk before the lock is released: runs that finish
    at once in parallel processes never interleave their lines, and a line is complete or
    absent after a crash. Keys are sorted; paths and numpy scalars are written as JSON values.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, sort_keys=True, default=_jsonable) + "\n" for r in records)
    with open(path, "a", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
    return path


def _jsonable(value: Any) -> Any:
    """Paths, numpy scalars and other leftovers of a resolved config as JSON values."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def environment() -> dict[str, Any]:
    """Versions, git commit and device of this process.

    Versions, git commit and device of this process (stored with every run; the threads are
    read by [`make_record`][mmpe.results.store.make_record], after the recipe set them)."""
    import torch

    import mmpe

    versions = {"mmpe": mmpe.__version__, "torch": torch.__version__,
                "python": platform.python_version()}
    try:
        import lightning

        versions["lightning"] = lightning.__version__
    except ImportError:  # the recipes need it; a bare store read does not
        pass
    env = {"versions": versions, "git": git_state(), "device": device_name()}
    # Settings that change what a run measures (FlexAttention's compilation) travel with it.
    flags = {k: v for k, v in os.environ.items() if k in RECORDED_FLAGS}
    if flags:
        env["flags"] = flags
    return env


#: Environment variables stored with a run when set (they change the compiled attention path).
RECORDED_FLAGS = ("MMPE_FLEX_DYNAMIC", "MMPE_FLEX_STRICT", "MMPE_ATTN_BLOCK_BYTES")


def device_name() -> str:
    """`cuda:<name>` when a GPU is visible, else `cpu (<processor>, <n> cores)`."""
    import torch

    if torch.cuda.is_available():
        return f"cuda ({torch.cuda.get_device_name(0)})"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"cpu ({cpu_model() or platform.machine()}, {cores} cores)"


def cpu_model() -> str | None:
    """The CPU's model name (`/proc/cpuinfo`), None where it cannot be read."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def git_state(cwd: str | Path | None = None) -> dict[str, Any]:
    """`{"commit", "dirty"}` of the repository mmpe runs from (None outside a checkout).

    Without `cwd`, the recipes and configs mmpe imports count too: where they resolve to
    another checkout than the package (an editable install of one clone, `PYTHONPATH` at a
    worktree of another commit), the run's code is not that of one commit and the state is
    dirty."""
    if cwd is not None:
        return _checkout(Path(cwd))[0]
    state, top = _checkout(Path(__file__).resolve().parent)
    for other in _companions():
        theirs, their_top = _checkout(other)
        if state["commit"] is not None and (their_top != top or theirs != state):
            return {"commit": state["commit"], "dirty": True}
    return state


def _checkout(here: Path) -> tuple[dict[str, Any], str | None]:
    """The state of the checkout holding `here`, and its top-level folder."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=here, capture_output=True, text=True,
                              timeout=10, check=True).stdout

    try:
        commit, top = git("rev-parse", "HEAD").strip(), git("rev-parse", "--show-toplevel").strip()
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}, None
    return {"commit": commit, "dirty": bool(status.strip())}, top


def _companions() -> list[Path]:
    """Where `mmpe.recipes` and `mmpe.configs` are imported from (those installed)."""
    import importlib.util

    out = []
    for name in ("mmpe.recipes", "mmpe.configs"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for place in (spec.submodule_search_locations or []) if spec else []:
            out.append(Path(place).resolve())
    return out


def resolved_configs(out_dir: str | Path) -> dict[str, Any]:
    """Every `config.yaml` LightningCLI saved under `out_dir` (relative path -> content)."""
    import yaml

    out = Path(out_dir)
    return {str(p.relative_to(out)): yaml.safe_load(p.read_text())
            for p in sorted(out.rglob("config.yaml"))}


def _finite_or_none(value: float | None) -> float | None:
    """A metric as a JSON number; None (shown "n/a") for a missing or non-finite one."""
    if value is None:
        return None
    value = float(value)
    return value if value == value and abs(value) != float("inf") else None


def make_record(recipe: str, setting: str, encoding: str, seed: int,
                metrics: dict[str, float | None], *, wall_s: float, cli_args: Iterable[str],
                out_dir: str | Path, env: dict[str, Any] | None = None,
                routes: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """A complete record of one finished run.

    A complete record of one finished run; `routes` is the attention route each layer took
    (`mmpe.attention.log_routes`: layer → distinct routes of its calls; stored where given);
    `env` is
    [`environment`][mmpe.results.store.environment] taken when the run started (the code that trained it), read now if not given. `threads` is read now: the
    recipe sets the process's threads when it builds its trainer."""
    import torch

    return {"recipe": recipe, "setting": setting, "encoding": encoding, "seed": int(seed),
            "metrics": {k: _finite_or_none(v) for k, v in metrics.items()},
            "wall_s": round(float(wall_s), 2), "cli_args": list(cli_args),
            "config": resolved_configs(out_dir), **(env or environment()),
            "threads": torch.get_num_threads(),
            **({"routes": routes} if routes is not None else {}),
            "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
