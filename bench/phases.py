"""The calibration phase of a quantizer, timed inside its own process (bench/calibration.py).

Whole-quantization times carry fixed costs that do not grow with the samples: imports (onnx_ir
imports sympy, about 0.7 s), ORT's ``quant_pre_process``, qnnx's graph cleanup, writing the model.
The calibration phase is what the samples cost: for ORT, ``create_calibrator`` (augmented model
and its session), ``collect_data`` and ``compute_data``; for qnnx, ``pipeline.calibrate`` (its
session, the runs, the observers and their qparams). Both are wrapped where the quantizer looks
them up, so the quantizer itself runs unchanged.
"""

from __future__ import annotations

import importlib
import time
from typing import Callable


def _timed(fn: Callable, total: list[float]) -> Callable:
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            total[0] += time.perf_counter() - t

    return wrapper


def time_calibration() -> Callable[[], float]:
    """Wrap both quantizers' calibration entry points; returns a function giving the seconds spent."""
    total = [0.0]
    # the module, not the function of the same name that onnxruntime.quantization exports
    ort_quantize = importlib.import_module("onnxruntime.quantization.quantize")

    import qnnx.autoquant.pipeline as pipeline

    create = ort_quantize.create_calibrator

    def create_timed(*args, **kwargs):
        calibrator = _timed(create, total)(*args, **kwargs)
        for method in ("collect_data", "compute_data"):
            setattr(calibrator, method, _timed(getattr(calibrator, method), total))
        return calibrator

    ort_quantize.create_calibrator = create_timed
    pipeline.calibrate = _timed(pipeline.calibrate, total)
    return lambda: total[0]
