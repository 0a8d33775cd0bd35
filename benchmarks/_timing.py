"""Wall-time helpers of the speed benchmarks: run a function `repeats` times, report medians."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def timed(fn: Callable[[int], object], repeats: int) -> list[float]:
    """Seconds of ``fn(r)`` for r = 0..repeats−1 (r seeds each run differently)."""
    times = []
    for r in range(repeats):
        t0 = time.perf_counter()
        fn(r)
        times.append(time.perf_counter() - t0)
    return times


def median_line(times: list[float]) -> str:
    """'median 12.3 s (runs: 12.1, 12.3, 13.0)'."""
    runs = ", ".join(f"{t:.1f}" for t in times)
    return f"median {statistics.median(times):.1f} s (runs: {runs})"
