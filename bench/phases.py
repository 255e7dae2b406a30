"""The calibration phase of a quantizer, timed inside its own process (bench/calibration.py).

Whole-quantization times carry fixed costs that do not grow with the samples: imports (onnx_ir
imports sympy, about 0.7 s), ORT's ``quant_pre_process``, qnnx's graph cleanup, writing the model.
The calibration phase is what the samples cost: for ORT, ``create_calibrator`` (augmented model
and its session), ``collect_data`` and ``compute_data``, wrapped where its quantizer looks them up
(ORT has no other way in); for qnnx, the ``calibrate`` stage (its session, the runs, the observers
and their qparams), timed by running qnnx's own stage and refinement lists here, each stage timed:
nothing of qnnx is patched.
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


def time_ort_calibration() -> Callable[[], float]:
    """Wrap ONNX Runtime's calibration entry points; returns a function giving the seconds spent in them."""
    total = [0.0]
    # the module, not the function of the same name that onnxruntime.quantization exports
    ort_quantize = importlib.import_module("onnxruntime.quantization.quantize")
    create = ort_quantize.create_calibrator

    def create_timed(*args, **kwargs):
        calibrator = _timed(create, total)(*args, **kwargs)
        for method in ("collect_data", "compute_data"):
            setattr(calibrator, method, _timed(getattr(calibrator, method), total))
        return calibrator

    ort_quantize.create_calibrator = create_timed
    return lambda: total[0]


def quantize_timed(model, calibration, config):
    """``qnnx.quantize(model, calibration, config)`` run stage by stage as pipeline.run runs them (its
    step lists, its refine, its nothing-quantized check): ``(QuantizedModel, {step name: seconds})``."""
    from qnnx.autoquant import pipeline
    from qnnx.autoquant.report import QuantReport
    from qnnx.autoquant.stages import nothing_quantized
    from qnnx.autoquant.state import QuantState

    seconds: dict[str, float] = {}

    def step(name: str, fn, state):
        t = time.perf_counter()
        try:
            return fn(state)
        finally:
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t

    state = QuantState(config=config, source=model, data=calibration, report=QuantReport())
    for stage in pipeline.STAGES_BEFORE:
        state = step(stage.name, stage, state)
    for refinement in pipeline.REFINEMENTS:
        if refinement.enabled(config):
            state = step(refinement.name, lambda s, r=refinement: pipeline.refine(s, r), state)
    if not state.report.quantized() and not config.allow_float:
        raise nothing_quantized(state.plan)
    for stage in pipeline.STAGES_AFTER:
        state = step(stage.name, stage, state)
    return pipeline.QuantizedModel(state), seconds
