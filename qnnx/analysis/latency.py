"""Latency of models on ONNX Runtime, timed interleaved so a noisy machine hits every model alike."""

from __future__ import annotations

import statistics
import time

import numpy as np

from qnnx import runtime
from qnnx.data import CalibrationData, input_specs
from qnnx.errors import QnnxError
from qnnx.ir import load_model


def _feed(model_path: str, data) -> dict[str, np.ndarray]:
    specs = input_specs(load_model(model_path))
    if data is not None:
        return next(iter(CalibrationData.from_source(data).head(1).bind(specs)))
    feed = {}
    for s in specs:
        if s.shape is None or any(d is None for d in s.shape):
            raise QnnxError(f"input {s.name!r} has dynamic dims: give --data with a sample", where=model_path)
        feed[s.name] = np.random.default_rng(0).standard_normal(s.shape).astype(np.float32)
    return feed


def median_latency_ms(models: list[str], data=None, *, feed: dict[str, np.ndarray] | None = None, threads: int = 1,
                      repeats: int = 20, warmup: int = 3) -> dict[str, float]:
    """Median milliseconds per run for each model (all models get the same input: ``feed``, the
    first sample of ``data`` (a :class:`CalibrationData` or anything it is built from), or random
    values for static shapes)."""
    feed = feed if feed is not None else _feed(models[0], data)
    sessions = {}
    for path in models:
        sessions[path] = runtime.session(path, threads=threads, where=path)
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
