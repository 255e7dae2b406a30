"""Latency of models on ONNX Runtime, timed interleaved so a noisy machine hits every model alike."""

from __future__ import annotations

import statistics
import time

import numpy as np

from qnnx import runtime


def median_latency_ms(models: list[str], *, feed: dict[str, np.ndarray], threads: int = 1, repeats: int = 20,
                      warmup: int = 3) -> dict[str, float]:
    """Median milliseconds per run of each model file, every model fed ``feed``."""
    sessions = {path: runtime.session(path, threads=threads, where=path) for path in models}
    for s in sessions.values():
        for _ in range(warmup):
            s.run(None, feed)
    times: dict[str, list[float]] = {p: [] for p in sessions}
    for _ in range(repeats):
        for p, s in sessions.items():
            t = time.perf_counter()
            s.run(None, feed)
            times[p].append((time.perf_counter() - t) * 1000)
    return {p: statistics.median(v) for p, v in times.items()}
