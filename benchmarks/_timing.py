"""Timing shared by the benchmarks: the median of repeated calls after one warm-up."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def timeit(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``fn()`` over ``repeat`` calls (seconds), after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
