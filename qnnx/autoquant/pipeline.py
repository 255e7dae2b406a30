"""Automatic static quantization: a runner over a list of stages and refinements.

    prepare -> smooth -> plan -> calibrate -> realize -> refinements -> agreement -> integerize -> target

Each stage is a :class:`~qnnx.autoquant.state.Stage` (stages.py: what it reads and writes); each
refinement a :class:`~qnnx.autoquant.refinements.base.Refinement`, run when the config enables it,
with its own record in the report. A new refinement is one module registered in ``REFINEMENTS``.
"""

from __future__ import annotations

from dataclasses import replace

import onnx_ir as ir

from qnnx.autoquant.config import QuantConfig
from qnnx.autoquant.refinements.bias_correction import BiasCorrection
from qnnx.autoquant.refinements.speed_fallback import SpeedFallback
from qnnx.autoquant.refinements.sqnr_fallback import SqnrFallback
from qnnx.autoquant.refinements.weight_rounding import WeightRounding
from qnnx.autoquant.report import QuantReport
from qnnx.autoquant.stages import AGREEMENT, CALIBRATE, INTEGERIZE, PLAN, PREPARE, REALIZE, SMOOTH, TARGET_CHECK
from qnnx.autoquant.state import QuantState
from qnnx.errors import QnnxError
from qnnx.ir import save_model
from qnnx.passes.lower import lower
from qnnx.targets import target

STAGES_BEFORE = (PREPARE, SMOOTH, PLAN, CALIBRATE, REALIZE)
# In this order: the fallbacks re-realize from nearest rounding and plain biases, so the weight
# rounding and the bias correction come after them.
REFINEMENTS = (SqnrFallback(), SpeedFallback(), WeightRounding(), BiasCorrection())
STAGES_AFTER = (AGREEMENT, INTEGERIZE, TARGET_CHECK)


def refine(state: QuantState, refinement) -> QuantState:
    """Run one refinement on a copy of what it edits; keep its result, or the state before it when it
    changed nothing. Its record goes into the report under its name."""
    given = replace(state, qdq=state.qdq.clone()) if refinement.edits_qdq else state
    after, record = refinement.apply(given)
    state.report.records[refinement.name] = record
    return state if after is None else after


def run(model, calibration, config: QuantConfig) -> QuantState:
    """The whole pipeline on ``model`` (never modified) with ``calibration`` samples."""
    state = QuantState(config=config, source=model, data=calibration, report=QuantReport())
    for stage in STAGES_BEFORE:
        state = stage(state)
    for refinement in REFINEMENTS:
        if refinement.enabled(config):
            state = refine(state, refinement)
    if not state.report.quantized() and not config.allow_float:
        raise QnnxError("nothing was quantized: " + _why_float(state) + "; the model would be written all float. "
                        "Pass allow_float=True (--allow-float) to write it anyway")
    for stage in STAGES_AFTER:
        state = stage(state)
    return state


def _why_float(state: QuantState) -> str:
    reasons = {d.reason for d in state.plan.decisions if not d.quantized}
    return "; ".join(sorted(reasons)[:3]) or "no pattern matched"


class QuantizedModel:
    """The result of :func:`quantize`: the QDQ model (what ONNX Runtime runs natively), the canonical
    qnnx integer model, and the report of every decision."""

    def __init__(self, state: QuantState):
        self.float_model = state.float_model  # the prepared float model the QDQ model was made from
        self.qdq = state.qdq
        self.canonical = state.canonical
        self.report = state.report
        self.config = state.config
        self.keep_float = state.keep_float  # node names the canonical form keeps float

    def export(self, format: str = "qdq") -> ir.Model:
        """The model as written in ``format``: "qdq" (shaped for the config's target), "qnnx" (canonical)
        or "lowered" (the canonical model in standard ONNX ops)."""
        if format == "qdq":
            return target(self.config.target).export(self.qdq)
        if format == "qnnx":
            return self.canonical
        if format == "lowered":
            return lower(self.canonical)
        raise QnnxError(f"unknown output format {format!r}; expected qdq, qnnx or lowered")

    def save(self, path, format: str = "qdq"):
        """Write ``format`` (see :meth:`export`) atomically."""
        return save_model(self.export(format), path)


def quantize(model, calibration, config: QuantConfig | None = None) -> QuantizedModel:
    """Quantize a float model with representative ``calibration`` samples (no labels): a directory of
    .npy/.npz files, an :class:`~qnnx.data.ImageFolder`, a :class:`~qnnx.data.CalibrationData`, or
    an iterable of arrays (single input) / dicts by input name."""
    return QuantizedModel(run(model, calibration, config or QuantConfig()))
