"""OpenVINO's CPU plugin, used one way: a model compiled with a chosen thread count and precision hint,
run on a feed, timed (:mod:`qnnx.targets.timing`). OpenVINO is an optional dependency (``pip install
qnnx[openvino]``): a missing package is a one-line QnnxError, not an ImportError at import time."""

from __future__ import annotations

import os
import tempfile
from functools import partial
from pathlib import Path

import numpy as np
import onnx_ir as ir

from qnnx.errors import QnnxError
from qnnx.ir import save_model
from qnnx.targets.timing import mirrored_medians

PRECISIONS = ("default", "f32", "bf16", "f16")  # INFERENCE_PRECISION_HINT; default: the plugin's choice


def openvino_module():
    """The ``openvino`` package, or a QnnxError saying how to install it."""
    try:
        import openvino
    except ImportError:
        raise QnnxError("this needs OpenVINO: pip install 'qnnx[openvino]'") from None
    return openvino


def compile_model(model: ir.Model | str | Path, *, threads: int | None = 1, precision: str = "default",
                  profile: bool = False):
    """``model`` (an ONNX file or an ``ir.Model``, written to a temporary file) compiled for the CPU plugin:
    ``threads`` inference threads (None: the plugin's), one stream, latency hint; ``precision``: the
    inference precision hint of the float layers (``PRECISIONS``); ``profile``: per-layer counters on."""
    if precision not in PRECISIONS:
        raise QnnxError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    ov = openvino_module()
    core = ov.Core()
    config = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1"}
    if threads is not None:
        config["INFERENCE_NUM_THREADS"] = str(threads)
    if precision != "default":
        config["INFERENCE_PRECISION_HINT"] = precision
    if profile:
        config["PERF_COUNT"] = "YES"
    try:
        if isinstance(model, ir.Model):
            with tempfile.TemporaryDirectory(prefix="qnnx_ov_") as tmp:
                path = os.path.join(tmp, "model.onnx")
                save_model(model, path)
                return core.compile_model(core.read_model(path), "CPU", config)
        return core.compile_model(core.read_model(str(model)), "CPU", config)
    except RuntimeError as e:
        raise QnnxError(f"OpenVINO cannot compile the model: {str(e).strip().splitlines()[0][:300]}",
                        where=None if isinstance(model, ir.Model) else str(model)) from None


def run(compiled, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs of one inference, in the model's output order (copies: the request reuses its buffers)."""
    result = compiled(feed)
    return [np.array(result[o]) for o in compiled.outputs]


def median_latency_ms(models, *, feed: dict[str, np.ndarray], threads: int = 1, repeats: int = 20,
                      warmup: int = 3, precision: str = "default") -> list[float]:
    """Median milliseconds per inference of each model (file or ``ir.Model``), every model fed ``feed``,
    each compiled twice (:func:`qnnx.targets.timing.mirrored_medians`)."""
    models = list(models)

    def runner(i: int):
        return partial(compile_model(models[i], threads=threads, precision=precision).create_infer_request().infer,
                       feed)

    return mirrored_medians(len(models), runner, repeats=repeats, warmup=warmup)
