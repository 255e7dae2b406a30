"""Latency of models on ONNX Runtime (the protocol: :mod:`qnnx.targets.timing`)."""

from __future__ import annotations

from functools import partial

import numpy as np

from qnnx import runtime
from qnnx.targets.timing import mirrored_medians


def median_latency_ms(models: list[str], *, feed: dict[str, np.ndarray], threads: int = 1, repeats: int = 20,
                      warmup: int = 3) -> dict[str, float]:
    """Median milliseconds per run of each model file, every model fed ``feed``, in two sessions each
    (:func:`qnnx.targets.timing.mirrored_medians`)."""
    paths = list(dict.fromkeys(models))

    def runner(i: int):
        return partial(runtime.session(paths[i], threads=threads, where=paths[i]).run, None, feed)

    return dict(zip(paths, mirrored_medians(len(paths), runner, repeats=repeats, warmup=warmup)))
