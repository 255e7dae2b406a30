"""The timing protocol of every target's timer (``qnnx bench``, the speed fallback, the benchmarks).

Each model gets two runners (sessions, compiled models) made in mirrored order, A B then B A: on a CPU
host a runner made later in a process runs a few percent faster than one made earlier for the same
model (docs/benchmarks.md), and the mirror gives every model the same mean position. All runners run
interleaved, the order rotated each round, so a noisy machine hits every model alike; a model's time is
the median over both of its runners.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def mirrored_medians(count: int, make: Callable[[int], Callable[[], object]], *, repeats: int,
                     warmup: int) -> list[float]:
    """Median milliseconds per run of models ``0 .. count-1``; ``make(i)`` builds a runner of model ``i``
    (called in mirrored order), which runs one inference when called; ``repeats`` runs of each runner."""
    order = list(range(count)) + list(reversed(range(count)))
    runners = [make(i) for i in order]
    for run in runners:
        for _ in range(warmup):
            run()
    times: list[list[float]] = [[] for _ in range(count)]
    for i, ms in zip(order, interleaved_ms(runners, repeats)):
        times[i] += ms
    return [statistics.median(v) for v in times]


def interleaved_ms(runners: list[Callable[[], object]], repeats: int) -> list[list[float]]:
    """Milliseconds of ``repeats`` runs of each runner, all interleaved, the order rotated each round so
    that no runner always runs first."""
    times: list[list[float]] = [[] for _ in runners]
    for k in range(repeats):
        shift = k % len(runners)
        for i in list(range(shift, len(runners))) + list(range(shift)):
            t = time.perf_counter()
            runners[i]()
            times[i].append((time.perf_counter() - t) * 1000)
    return times
