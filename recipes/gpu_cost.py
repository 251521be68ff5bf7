"""Deprecated: the GPU cost measurement moved to `benchmarks/gpu/gpu_cost.py` in 0.2 (it trains
nothing; run `python benchmarks/gpu/gpu_cost.py --store results`); kept until 0.3.

`mmpe.recipes.RECIPES` keeps its `gpu_cost` entry until then: `COMPARE` (how `mmpe report`
renders the stored rounds in `results/gpu_cost.jsonl`) reads without a warning, every other
name (`run_one`, so `mmpe compare gpu_cost`, too) warns (`FutureWarning`) and resolves to the
script's. The script is read from the repository checkout (`benchmarks/` is not installed).
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from typing import Any

#: The measurement's new home, in the checkout this package is installed from.
_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "gpu_cost.py"


def _load() -> Any:
    if not _SCRIPT.is_file():
        raise ImportError(f"mmpe.recipes.gpu_cost moved to benchmarks/gpu/gpu_cost.py, which is "
                          f"not here ({_SCRIPT}): run it from a checkout of the repository")
    spec = importlib.util.spec_from_file_location("mmpe_benchmarks_gpu_cost", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_moved = _load()
COMPARE = _moved.COMPARE


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    warnings.warn(f"mmpe.recipes.gpu_cost.{name} moved to benchmarks/gpu/gpu_cost.py in 0.2 "
                  "(`python benchmarks/gpu/gpu_cost.py --store results`); the old module is kept "
                  "until 0.3", FutureWarning, stacklevel=2)
    return getattr(_moved, name)
