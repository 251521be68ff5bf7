"""Deprecated: `mmpe.recipes.bench_report` moved to
[`mmpe.results.bench_report`][mmpe.results.bench_report] in 0.2; kept until 0.3.

Importing it warns (`FutureWarning`); every name resolves to the new module's.
"""

from __future__ import annotations

import warnings
from typing import Any

from mmpe.results import bench_report as _moved

warnings.warn("mmpe.recipes.bench_report moved to mmpe.results.bench_report in 0.2; the old "
              "module is kept until 0.3", FutureWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)
