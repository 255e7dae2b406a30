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
    """``model`` (an ONNX file or an ``ir.Model``, written to a temporary file; or an OpenVINO IR file)
    compiled for the CPU plugin: ``threads`` inference threads (None: the plugin's), one stream, latency
    hint; ``precision``: the inference precision hint of the float layers (``PRECISIONS``); ``profile``:
    per-layer counters on. An ONNX model goes through ``openvino.convert_model``, as a deployment converts it
    (and NNCF's models are): compiled from the ONNX file directly, the plugin keeps some layers apart that
    the converter's transformations fuse (docs/benchmarks.md)."""
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

    def read(path: str):
        return core.read_model(path) if path.endswith(".xml") else ov.convert_model(path)

    try:
        if isinstance(model, ir.Model):
            with tempfile.TemporaryDirectory(prefix="qnnx_ov_") as tmp:
                path = os.path.join(tmp, "model.onnx")
                save_model(model, path)
                return core.compile_model(read(path), "CPU", config)
        return core.compile_model(read(str(model)), "CPU", config)
    except Exception as e:  # noqa: BLE001 - the plugin's RuntimeError, the converter's own types: one line
        raise QnnxError(f"OpenVINO cannot compile the model: {_reason(e)[:300]}",
                        where=None if isinstance(model, ir.Model) else str(model)) from None


def _reason(e: Exception) -> str:
    """The line of an OpenVINO error that says what failed (its last one that is not a source location or
    a frontend's preamble: "No conversion rule found for operations: X", "Cannot recognize input model.")."""
    lines = [line.strip(" -") for line in str(e).splitlines() if line.strip(" -")]
    said = [line for line in lines if not line.startswith(("Exception from ", "Check '", "FrontEnd API failed"))]
    return (said or lines or [type(e).__name__])[-1]


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
