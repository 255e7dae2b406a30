"""The stages of automatic quantization, each a :class:`~qnnx.autoquant.state.Stage` with its contract.

    prepare     source, data            -> float_model, renames, source_op_types, data (bound), samples
    smooth      float_model, data       -> float_model (SmoothQuant: a new model, exact in float)
    plan        float_model             -> exclusions, plan
    calibrate   float_model, plan, data -> qparams, plan (patterns' checks applied), report.calibration
    realize     float_model, plan, qparams -> qdq, keep_float
    (refinements: refinements/, each state -> state)
    agreement   float_model, qdq, samples -> report.outputs
    integerize  qdq, keep_float         -> canonical, report.left_in_float
    target      qdq                     -> report.records[target name] (what the runtime will do)
"""

from __future__ import annotations

from dataclasses import replace

import onnx_ir as ir

from qnnx.autoquant.calibration import CALIBRATORS
from qnnx.autoquant.plan import NO_PATTERN, Exclusions, activation_qparams, checked, plan
from qnnx.autoquant.prepare import prepared as prepare_model
from qnnx.autoquant.qdq import realize_qdq
from qnnx.autoquant.report import CalibrationRecord, OutputAgreement
from qnnx.autoquant.smoothing import smooth
from qnnx.autoquant.state import QuantState, Stage
from qnnx.data import CalibrationData, input_specs
from qnnx.errors import QnnxError
from qnnx.frontends.fq2i import convert
from qnnx.metrics import compare_models, float_outputs
from qnnx.targets import target


def run_prepare(state: QuantState) -> QuantState:
    """The cleaned float model (prepare.py), the renames it made, and the calibration data bound to
    its inputs with the first ``refinement_samples`` read."""
    config = state.config
    # 16-bit QuantizeLinear/DequantizeLinear exist from opset 21 on.
    prepared = prepare_model(state.source, min_opset=21 if config.activation_dtype.endswith("16") else 13,
                       exclude_nodes=config.exclude_nodes, exclude_op_types=config.exclude_op_types)
    data = CalibrationData.from_source(state.data, num_samples=config.calibration.num_samples,
                                       seed=config.calibration.seed).bind(input_specs(prepared.model))
    return replace(state, float_model=prepared.model, renames=prepared.renames,
                   source_op_types=prepared.source_op_types, data=data,
                   samples=tuple(data.head(config.calibration.refinement_samples)))


def run_smooth(state: QuantState) -> QuantState:
    model = smooth(state.float_model, state.data, state.config.refinements.smoothing_alpha)
    return state if model is state.float_model else replace(state, float_model=model)


def run_plan(state: QuantState) -> QuantState:
    exclusions = Exclusions(state.float_model, state.config, state.renames, state.source_op_types)
    the_plan = plan(state.float_model, state.config, exclusions)
    if not the_plan.matches and not state.config.allow_float:
        raise nothing_quantized(the_plan)  # before calibrating: the runner would only find it out after
    state.report.decisions = the_plan.decisions
    return replace(state, exclusions=exclusions, plan=the_plan)


def nothing_quantized(the_plan) -> QnnxError:
    """The error of a run in which no node ends up quantized (unless ``allow_float``): "nothing to
    quantize" when no node matched a pattern at all, else "nothing was quantized" and why."""
    reasons = sorted({d.reason for d in the_plan.decisions if not d.quantized} - {NO_PATTERN})
    head = ("nothing was quantized: " + "; ".join(reasons[:3])) if reasons else \
        "nothing to quantize: no node matched a quantization pattern"
    return QnnxError(head + "; the model would be written all float. Pass allow_float=True (--allow-float) to "
                     "write it anyway")


def run_calibrate(state: QuantState) -> QuantState:
    config = state.config
    name = config.calibration.calibrator
    result = CALIBRATORS[name](state.float_model, state.plan, state.data, config)
    the_plan, qparams = checked(state.plan, activation_qparams(state.plan, result.qparams, config))
    state.report.calibration = CalibrationRecord(name, result.samples, result.seconds, state.data.describe())
    return replace(state, plan=the_plan, qparams=qparams)


def run_realize(state: QuantState) -> QuantState:
    keep = frozenset(n.name for n in state.float_model.graph if n in state.exclusions)
    return replace(state, qdq=realize_qdq(state.float_model, state.plan, state.qparams, state.config),
                   keep_float=keep)


def output_agreement(float_model: ir.Model, qdq: ir.Model, samples, reference=None) -> list[OutputAgreement]:
    """Each graph output of the QDQ model against the float model's on ``samples`` (or against
    ``reference``, metrics.float_outputs on them): a quantization gone wrong shows in the report, not
    only in the user's own evaluation. Empty when ONNX Runtime cannot run the QDQ model."""
    if not samples:
        return []
    try:
        errors = compare_models(float_model, qdq, list(samples), outputs_only=True, reference=reference)
    except QnnxError:  # a QDQ model ORT cannot run (16-bit types on an old opset...) is still a valid result
        return []
    order = {v.name: i for i, v in enumerate(float_model.graph.outputs)}
    return [OutputAgreement(e.name, e.sqnr_db, e.cosine, len(samples), e.channel_cosine)
            for e in sorted(errors, key=lambda e: order.get(e.name, len(order)))]


def reference_outputs(float_model: ir.Model, samples) -> list | None:
    """The float model's outputs on ``samples`` (None when it cannot run them)."""
    try:
        return float_outputs(float_model, list(samples)) if samples else None
    except QnnxError:
        return None


def run_agreement(state: QuantState) -> QuantState:
    state.report.outputs = output_agreement(state.float_model, state.qdq, state.samples)
    return state


def run_integerize(state: QuantState) -> QuantState:
    canonical, fq = convert(state.qdq, keep_float=state.keep_float)
    state.report.left_in_float = fq.left_in_float
    return replace(state, canonical=canonical)


def run_target_check(state: QuantState) -> QuantState:
    t = target(state.config.target)
    state.report.records[t.name] = t.check(state.qdq)
    return state


PREPARE = Stage("prepare", run_prepare, ("source", "data", "config"),
                ("float_model", "renames", "source_op_types", "data", "samples"))
SMOOTH = Stage("smooth", run_smooth, ("float_model", "data", "config"), ("float_model",))
PLAN = Stage("plan", run_plan, ("float_model", "renames", "source_op_types", "config"), ("exclusions", "plan"))
CALIBRATE = Stage("calibrate", run_calibrate, ("float_model", "plan", "data", "config"), ("plan", "qparams"))
REALIZE = Stage("realize", run_realize, ("float_model", "plan", "qparams", "exclusions", "config"),
                ("qdq", "keep_float"))
AGREEMENT = Stage("agreement", run_agreement, ("float_model", "qdq", "samples"), ())
INTEGERIZE = Stage("integerize", run_integerize, ("qdq", "keep_float"), ("canonical",))
TARGET_CHECK = Stage("target", run_target_check, ("qdq", "config"), ())
