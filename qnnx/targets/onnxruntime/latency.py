"""Latency of models on ONNX Runtime, timed interleaved so a noisy machine hits every model alike, each
model in two sessions created in mirrored order."""

from __future__ import annotations

import statistics
import time

import numpy as np

from qnnx import runtime


def median_latency_ms(models: list[str], *, feed: dict[str, np.ndarray], threads: int = 1, repeats: int = 20,
                      warmup: int = 3) -> dict[str, float]:
    """Median milliseconds per run of each model file, every model fed ``feed``.

    Each model gets two sessions, created in mirrored order (A B, then B A): a session created later in a
    process runs a few percent faster than one created earlier for the same file (docs/benchmarks.md), and
    the mirror gives every model the same mean position. All sessions run interleaved, the order rotated
    each time; a model's median is over both of its sessions."""
    paths = list(dict.fromkeys(models))
    order = paths + paths[::-1]
    sessions = [(p, runtime.session(p, threads=threads, where=p)) for p in order]
    for _, s in sessions:
        for _ in range(warmup):
            s.run(None, feed)
    times: dict[str, list[float]] = {p: [] for p in paths}
    for k in range(repeats):
        for p, s in sessions[k % len(sessions):] + sessions[:k % len(sessions)]:
            t = time.perf_counter()
            s.run(None, feed)
            times[p].append((time.perf_counter() - t) * 1000)
    return {p: statistics.median(v) for p, v in times.items()}
