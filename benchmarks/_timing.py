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


def paired(ours: Callable[[], object], peer: Callable[[], object],
           repeat: int) -> tuple[float, float, float]:
    """``(mmpe s, peer s, peer/mmpe)``: medians over ``repeat`` rounds, each timing both calls
    back to back (alternating which goes first), after one warm-up call each."""
    ours(), peer()
    t_ours, t_peer, ratios = [], [], []
    for i in range(repeat):
        pair = []
        for fn in ((ours, peer) if i % 2 == 0 else (peer, ours)):
            start = time.perf_counter()
            fn()
            pair.append(time.perf_counter() - start)
        a, b = pair if i % 2 == 0 else pair[::-1]
        t_ours.append(a)
        t_peer.append(b)
        ratios.append(b / a)
    return statistics.median(t_ours), statistics.median(t_peer), statistics.median(ratios)
