"""The stages of automatic quantization, each a :class:`~qnnx.autoquant.state.Stage` with its contract.

    prepare     source, data            -> float_model, renames, source_op_types, data (bound), samples
    hold_out    data, validation        -> data, samples, validation (held out), validation_reference
    smooth      float_model, data, samples -> float_model (SmoothQuant, checked exact in float on the samples;
                                           left out where it is not), report.records["smooth"]
    plan        float_model, config     -> exclusions, plan (as config.target executes it)
    calibrate   float_model, plan, data -> qparams, plan (patterns' checks applied), report.calibration
    realize     float_model, plan, qparams -> qdq, keep_float
    (refinements: refinements/, each state -> state)
    agreement   float_model, qdq, samples -> report.outputs
    integerize  qdq, keep_float         -> canonical, report.left_in_float
    target      qdq                     -> report.records[target name] (what the runtime will do)
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np
import onnx_ir as ir

from qnnx.autoquant.calibration import CALIBRATORS
from qnnx.autoquant.plan import NO_PATTERN, Exclusions, activation_qparams, checked, target_plan
from qnnx.autoquant.prepare import REWRITES
from qnnx.autoquant.prepare import prepared as prepare_model
from qnnx.autoquant.qdq import realize_qdq
from qnnx.autoquant.report import CalibrationRecord, OutputAgreement
from qnnx.autoquant.smoothing import smooth, smoothing_sites
from qnnx.autoquant.state import QuantState, Stage
from qnnx.data import CalibrationData, input_specs
from qnnx.errors import QnnxError
from qnnx.frontends.fq2i import convert
from qnnx.metrics import compare_models, float_outputs
from qnnx.targets import target


PREPARE_CHECK_SAMPLES = 2  # samples the prepared model is checked against the original on


@dataclass(frozen=True)
class PrepareRecord:
    """How preparation was proven to keep the model: the samples compared, the largest output error
    relative to that output's range, and each rewrite left out because it changed the outputs."""

    samples: int
    max_error: float
    not_applied: tuple[tuple[str, str], ...] = ()  # (rewrite, why)
    unchecked: str = ""  # why the comparison could not run

    def lines(self) -> list[str]:
        out = [f"prepare: rewrite {name!r} not applied: {why}" for name, why in self.not_applied]
        if self.unchecked:
            out.append(f"prepare: the prepared model was not checked against the original: {self.unchecked}")
        return out


def _output_mismatch(reference: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> tuple[float, str]:
    """The largest error relative to each output's range, and a reason when the outputs differ beyond
    float rounding (non-finite values in different places, or a relative error above 1e-3)."""
    worst = 0.0
    for k, (ref, out) in enumerate(zip(reference, got)):
        for i, (a, b) in enumerate(zip(ref, out)):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            if a.shape != b.shape:
                return math.inf, f"output {i} has shape {b.shape}, the original {a.shape} (sample {k})"
            fa, fb = np.isfinite(a), np.isfinite(b)
            same = (a == b) | (np.isnan(a) & np.isnan(b))
            if (fa != fb).any() or not same[~fa].all():
                return math.inf, f"output {i} has inf/NaN where the original has not, or the reverse (sample {k})"
            if fa.any():
                err = float(np.max(np.abs(a[fa] - b[fb]))) / max(float(np.max(np.abs(a[fa]))), 1e-30)
                worst = max(worst, err)
    return worst, (f"outputs differ from the original's by {worst:.2g} of their range" if worst > 1e-3 else "")


def run_prepare(state: QuantState) -> QuantState:
    """The cleaned float model (prepare.py), the renames it made, and the calibration data bound to its
    inputs with the first ``refinement_samples`` read. Preparation must not change what the model computes:
    the prepared model is run against the original on the first samples, and a rewrite that changes the
    outputs beyond float rounding is left out (the report names it)."""
    config = state.config
    # 16-bit QuantizeLinear/DequantizeLinear exist from opset 21 on.
    options = dict(min_opset=21 if config.activation_dtype.endswith("16") else 13,
                   exclude_nodes=config.exclude_nodes, exclude_op_types=config.exclude_op_types)
    result = prepare_model(state.source, **options)
    data = CalibrationData.from_source(state.data, num_samples=config.calibration.num_samples,
                                       seed=config.calibration.seed).bind(input_specs(result.model))
    samples = tuple(data.head(config.calibration.refinement_samples))
    probe = list(samples[:PREPARE_CHECK_SAMPLES])
    try:
        reference = _outputs(state.source, probe)
    except QnnxError as e:
        reference, unchecked = None, str(e)
    record = PrepareRecord(len(probe), 0.0, unchecked="" if reference is not None else unchecked)
    if reference is not None:
        error, why = _check(result.model, reference, probe)
        record = PrepareRecord(len(probe), error)
        if why:
            not_applied = []
            for rewrite in REWRITES:  # the first single rewrite whose absence restores the outputs
                candidate = prepare_model(state.source, skip=frozenset({rewrite}), **options)
                error, still = _check(candidate.model, reference, probe)
                if not still:
                    result, not_applied = candidate, [(rewrite, why)]
                    break
            else:
                candidate = prepare_model(state.source, skip=frozenset(REWRITES), **options)
                error, still = _check(candidate.model, reference, probe)
                if still:
                    raise QnnxError(f"preparing the model changed what it computes ({still}), with or without "
                                    "qnnx's rewrites; the model may not be runnable at a newer opset")
                result, not_applied = candidate, [(r, why) for r in REWRITES]
            record = PrepareRecord(len(probe), error, tuple(not_applied))
    state.report.records["prepare"] = record
    return replace(state, float_model=result.model, renames=result.renames,
                   source_op_types=result.source_op_types, data=data, samples=samples)


def _outputs(model, probe) -> list[list[np.ndarray]]:
    """``model``'s graph outputs on each sample of ``probe``, in graph order."""
    return [list(outputs.values()) for outputs in float_outputs(model, probe)]


def _check(model: ir.Model, reference, probe) -> tuple[float, str]:
    """``model``'s largest output error against ``reference`` and why it differs; a rewritten model ONNX
    Runtime cannot load or run differs too (a rewrite made it invalid), with the runtime's reason."""
    try:
        got = _outputs(model, probe)
    except QnnxError as e:
        return math.inf, f"the rewritten model does not run: {e}"
    return _output_mismatch(reference, got)


def run_hold_out(state: QuantState) -> QuantState:
    """Held-out validation samples: the validation data given (bound to the model's inputs), or
    ``config.calibration.validation`` of the calibration samples set apart (CalibrationData.split), which
    then neither calibrate nor fit any refinement; the float model's outputs on them."""
    config, validation, data = state.config, state.validation, state.data
    if validation is None and config.calibration.validation is None:
        return state
    if validation is None:
        data, validation = data.split(config.calibration.validation)
    else:
        validation = CalibrationData.from_source(validation).bind(data.specs)
    held = tuple(validation)
    return replace(state, data=data, samples=tuple(data.head(config.calibration.refinement_samples)),
                   validation=held, validation_reference=tuple(float_outputs(state.float_model, list(held))))


@dataclass(frozen=True)
class SmoothRecord:
    """What smoothing did: the sites rescaled by kind, and why it was left out (or its value projections
    were) when the smoothed float model computed something else on the probe samples."""

    sites: tuple[tuple[str, int], ...] = ()
    not_applied: str = ""

    def lines(self) -> list[str]:
        return [f"smooth: {self.not_applied}"] if self.not_applied else []


def run_smooth(state: QuantState) -> QuantState:
    """SmoothQuant (smoothing.py), new Muls only on a target that folds them into its quantizers; checked on
    the first samples against the float model as preparation is: if the smoothed model computes something
    else, the value projections' sites give way to Muls (or are left), then smoothing is left out; the
    report says which."""
    r = state.config.refinements
    muls = target(state.config.target).folds_scales_into_quantizers
    sites = smoothing_sites(state.float_model.graph, r.smoothing_sites, muls=muls)
    if r.smoothing_alpha is None or not sites:
        return state
    probe = list(state.samples[:PREPARE_CHECK_SAMPLES])
    reference = _outputs(state.float_model, probe)
    original = ir.from_proto(ir.to_proto(state.float_model))  # smoothing works in place
    kinds = tuple(sorted(Counter(site.kind for site in sites).items()))
    model = smooth(state.float_model, state.data, r.smoothing_alpha, r.smoothing_sites, muls=muls)
    _, why = _check(model, reference, probe)
    if why and any(site.kind == "projection" for site in sites):
        retry = ir.from_proto(ir.to_proto(original))
        model = smooth(retry, state.data, r.smoothing_alpha, r.smoothing_sites, muls=muls, projections=False)
        _, still = _check(model, reference, probe)
        if not still:
            state.report.records["smooth"] = SmoothRecord(kinds, f"value projections not used ({why})")
            return replace(state, float_model=model)
    if why:
        state.report.records["smooth"] = SmoothRecord(kinds, f"not applied: the smoothed model's {why}")
        return replace(state, float_model=original)
    state.report.records["smooth"] = SmoothRecord(kinds)
    return replace(state, float_model=model)


def run_plan(state: QuantState) -> QuantState:
    exclusions = Exclusions.resolve(state.float_model, state.config, state.renames, state.source_op_types)
    # what the target executes in integer: ONNX Runtime every match whole, OpenVINO the inputs of contractions,
    # pools and residual adds, quantized above data movement
    config = state.config
    the_plan = target_plan(state.float_model, config, exclusions)
    if not the_plan.matches and not config.allow_float:
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
    if not state.plan.matches:  # allow_float: nothing to observe
        state.report.calibration = CalibrationRecord(name, 0, 0.0, state.data.describe())
        return replace(state, qparams={})
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
    only in the user's own evaluation. Empty when ONNX Runtime cannot run the QDQ model
    (:func:`measured_agreement` says why)."""
    return measured_agreement(float_model, qdq, samples, reference)[0]


def measured_agreement(float_model: ir.Model, qdq: ir.Model, samples,
                       reference=None) -> tuple[list[OutputAgreement], str]:
    """:func:`output_agreement`, and why the outputs could not be compared ("" when they were or there are
    no samples): ONNX Runtime cannot load or run the QDQ model (16-bit types on an old opset...), which
    leaves the model a valid result."""
    if not samples:
        return [], ""
    try:
        errors = compare_models(float_model, qdq, list(samples), outputs_only=True, reference=reference)
    except QnnxError as e:
        return [], str(e)
    order = {v.name: i for i, v in enumerate(float_model.graph.outputs)}
    return [OutputAgreement(e.name, e.sqnr_db, e.cosine, len(samples), e.channel_cosine)
            for e in sorted(errors, key=lambda e: order.get(e.name, len(order)))], ""


@dataclass(frozen=True)
class AgreementRecord:
    """The agreement stage's record when the outputs could not be compared with float, and why."""

    unmeasured: str

    def lines(self) -> list[str]:
        return [f"WARNING: the outputs were not compared with float (so not checked by the accuracy guard): "
                f"{self.unmeasured}"]


def reference_outputs(float_model: ir.Model, samples) -> list | None:
    """The float model's outputs on ``samples`` (None when it cannot run them)."""
    try:
        return float_outputs(float_model, list(samples)) if samples else None
    except QnnxError:
        return None


def run_agreement(state: QuantState) -> QuantState:
    """Each output against float, on the held-out samples when there are (else the refinement samples); a
    model whose outputs could not be compared gets a record saying why."""
    if state.validation is not None:
        outputs, why = measured_agreement(state.float_model, state.qdq, state.validation,
                                          list(state.validation_reference))
        state.report.outputs = [replace(o, held_out=True) for o in outputs]
    else:
        state.report.outputs, why = measured_agreement(state.float_model, state.qdq, state.samples)
    if why:
        state.report.records["agreement"] = AgreementRecord(why)
    return state


def run_integerize(state: QuantState) -> QuantState:
    canonical, fq = convert(state.qdq, keep_float=state.keep_float)
    state.report.left_in_float = fq.left_in_float
    return replace(state, canonical=canonical)


def run_target_check(state: QuantState) -> QuantState:
    t = target(state.config.target)
    state.report.records[t.name] = t.check(state.qdq)
    return state


PREPARE = Stage("prepare", run_prepare, ("source", "data", "config"),  # (+ report.records["prepare"])
                ("float_model", "renames", "source_op_types", "data", "samples"))
HOLD_OUT = Stage("hold_out", run_hold_out, ("data", "validation", "float_model", "config"),
                 ("data", "samples", "validation", "validation_reference"))
SMOOTH = Stage("smooth", run_smooth, ("float_model", "data", "samples", "config"), ("float_model",))
PLAN = Stage("plan", run_plan, ("float_model", "renames", "source_op_types", "config"), ("exclusions", "plan"))
CALIBRATE = Stage("calibrate", run_calibrate, ("float_model", "plan", "data", "config"), ("plan", "qparams"))
REALIZE = Stage("realize", run_realize, ("float_model", "plan", "qparams", "exclusions", "config"),
                ("qdq", "keep_float"))
AGREEMENT = Stage("agreement", run_agreement, ("float_model", "qdq", "samples", "validation"), ())
INTEGERIZE = Stage("integerize", run_integerize, ("qdq", "keep_float"), ("canonical",))
TARGET_CHECK = Stage("target", run_target_check, ("qdq", "config"), ())
