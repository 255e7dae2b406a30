"""Automatic static quantization: a runner over a list of stages and refinements.

    prepare -> smooth -> plan -> calibrate -> realize -> refinements -> agreement -> integerize -> target

Each stage is a :class:`~qnnx.autoquant.state.Stage` (stages.py: what it reads and writes); each
refinement a :class:`~qnnx.autoquant.refinements.base.Refinement`, run when the config enables it,
with its own record in the report. A new refinement is one module registered in ``REFINEMENTS``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import onnx_ir as ir

from qnnx.autoquant.config import QuantConfig
from qnnx.autoquant.refinements.accuracy_guard import DEFAULT_MAX_DROP, AccuracyGuard
from qnnx.autoquant.refinements.bias_correction import BiasCorrection
from qnnx.autoquant.refinements.speed_fallback import SpeedFallback
from qnnx.autoquant.refinements.sqnr_fallback import SqnrFallback
from qnnx.autoquant.refinements.symmetric_activations import SymmetricActivations
from qnnx.autoquant.refinements.weight_rounding import WeightRounding
from qnnx.autoquant.plan import Plan
from qnnx.autoquant.report import OutputAgreement, QuantReport
from qnnx.autoquant.stages import (AGREEMENT, CALIBRATE, HOLD_OUT, INTEGERIZE, PLAN, PREPARE, REALIZE, SMOOTH,
                                   TARGET_CHECK, nothing_quantized, run_agreement)
from qnnx.autoquant.state import QuantState
from qnnx.autoquant.validation import Dropped, ValidationRecord, Verdict, sample_errors
from qnnx.errors import QnnxError
from qnnx.ir import save_model
from qnnx.passes.lower import lower
from qnnx.targets import target

STAGES_BEFORE = (PREPARE, HOLD_OUT, SMOOTH, PLAN, CALIBRATE, REALIZE)
# In this order: the zero points are chosen first (the fallbacks keep them); the fallbacks and the accuracy
# guard re-realize from nearest rounding and plain biases, so the weight rounding and the bias correction
# come after them.
REFINEMENTS = (SymmetricActivations(), SqnrFallback(), SpeedFallback(), AccuracyGuard(), WeightRounding(),
               BiasCorrection())
STAGES_AFTER = (AGREEMENT, INTEGERIZE, TARGET_CHECK)


def refine(state: QuantState, refinement, verdicts: list | None = None) -> QuantState:
    """Run one refinement on a copy of what it edits; keep its result, or the state before it when it
    changed nothing or (with held-out validation, for refinements that change accuracy) did not lower
    the held-out error by more than its spread. Its record goes into the report under its name."""
    given = replace(state, qdq=state.qdq.clone()) if refinement.edits_qdq else state
    after, record = refinement.apply(given)
    if record is not None:
        state.report.records[refinement.name] = record
    if after is None:
        return state
    if state.validation is not None and refinement.validated:
        after = with_errors(after)
        verdict = Verdict.of(refinement.name, state.validation_errors, after.validation_errors)
        if verdicts is not None:
            verdicts.append(verdict)
        if not verdict.kept:
            state.report.records[refinement.name] = Dropped(record, verdict)
            return state
    return after


def with_errors(state: QuantState) -> QuantState:
    """``state`` with its QDQ model's error on each held-out sample."""
    return replace(state, validation_errors=sample_errors(state.qdq, state.validation, state.validation_reference))


PLAIN_RANGES = dict(method="minmax", consumer_weighting=False, consumer_functions=(), silu_lobe=0.0,
                    channel_balance=0.0)


def plain_recipe(planned: QuantState) -> QuantState:
    """The plain recipe on the same plan: minmax ranges, nearest rounding, plain biases (the baseline every
    choice is validated against). Its decisions are its own copy; the report is a scratch one."""
    own = Plan(planned.plan.matches, planned.plan.groups, [copy.copy(d) for d in planned.plan.decisions])
    plain = replace(planned, plan=own, report=QuantReport(), config=planned.config.with_options(**PLAIN_RANGES))
    return replace(REALIZE(CALIBRATE(plain)), config=planned.config)


def _adopt(state: QuantState, other: QuantState) -> QuantState:
    """``other``'s model and plan under ``state``'s config and report (its decisions become the report's)."""
    state.report.decisions = other.plan.decisions
    return replace(other, config=state.config, report=state.report)


def run(model, calibration, config: QuantConfig, refinements=REFINEMENTS, *, validation=None,
        metric=None) -> QuantState:
    """The whole pipeline on ``model`` (never modified) with ``calibration`` samples; ``validation``:
    held-out samples (or ``config.calibration.validation`` of the calibration samples set apart);
    ``metric``: the user's accuracy metric for the accuracy guard (see :func:`quantize`);
    ``refinements``: the refinements offered, in order (each runs when the config enables it)."""
    if metric is not None and not callable(metric):
        raise QnnxError(f"metric must be a function of the model's outputs, got {type(metric).__name__}")
    if metric is not None and config.refinements.max_drop is None:
        config = config.with_options(max_drop=DEFAULT_MAX_DROP)
    if metric is None and config.refinements.max_drop is not None:
        raise QnnxError("max_drop needs a metric: quantize(..., metric=fn)")
    state = QuantState(config=config, source=model, data=calibration, report=QuantReport(), validation=validation,
                       metric=metric)
    planned = None
    for stage in STAGES_BEFORE:
        state = stage(state)
        if stage is PLAN:
            planned = state
    verdicts: list[Verdict] = []
    plain = None
    if state.validation is not None:
        state = with_errors(state)
        if any(getattr(config.ranges, k) != v for k, v in PLAIN_RANGES.items()):
            plain = with_errors(plain_recipe(planned))
            verdict = Verdict.of(f"ranges ({config.ranges.method})", plain.validation_errors, state.validation_errors)
            verdicts.append(verdict)
            if not verdict.kept:
                state = _adopt(state, plain)
        else:
            plain = state
    guarded = False
    for refinement in refinements:
        if refinement.enabled(config):
            refined = refine(state, refinement, verdicts)
            state = unless_pushed_far(state, refined, refinement.name) if guarded and refined is not state else refined
            guarded = guarded or refinement.name == AccuracyGuard.name
    if plain is not None and state is not plain:
        final = Verdict.of("the refined model against the plain recipe", plain.validation_errors,
                           state.validation_errors)
        if final.after > final.before:  # never worse on the held-out samples than the plain recipe
            verdicts.append(replace(final, kept=False))
            state = _adopt(state, plain)
    if state.validation is not None:
        state.report.records["validation"] = ValidationRecord(tuple(verdicts))
    if not state.report.quantized() and not config.allow_float:
        raise nothing_quantized(state.plan)
    for stage in STAGES_AFTER:
        state = stage(state)
        if stage is AGREEMENT and config.refinements.accuracy_guard:
            refuse_far_outputs(state)
    return state


@dataclass(frozen=True)
class PushedFar:
    """A refinement's record when it was undone: it ran after the accuracy guard and moved an output far
    from float (report.far_outputs) where the model before it had none, so the model is returned without
    it rather than refused for it."""

    record: object
    refinement: str
    output: OutputAgreement

    def lines(self) -> list[str]:
        o = self.output
        return [f"{self.refinement}: undone: it moved output {o.name!r} far from float (SQNR {o.sqnr_db:.1f} dB, "
                f"cosine {o.cosine:.3f}) after the accuracy guard"]


def _far(state: QuantState) -> list[OutputAgreement]:
    """``state``'s outputs that are far from float, measured as the agreement stage measures them."""
    scratch = replace(state, report=QuantReport())
    return run_agreement(scratch).report.far_outputs()


def unless_pushed_far(before: QuantState, after: QuantState, name: str) -> QuantState:
    """``after``, unless the refinement ``name`` that made it moved an output far from float where
    ``before`` had none: then ``before``, with the refinement's record saying so."""
    far = _far(after)
    if not far or _far(before):
        return after
    before.report.records[name] = PushedFar(before.report.records.get(name), name, far[0])
    return before


def refuse_far_outputs(state: QuantState) -> None:
    """A model whose outputs are far from float (report.far_outputs) is not returned: the error says what
    to do instead of writing it with a warning."""
    far = state.report.far_outputs()
    if far:
        o = far[0]
        kind = "held-out" if o.held_out else "calibration"
        raise QnnxError(f"output {o.name!r} is far from the float model's (SQNR {o.sqnr_db:.1f} dB, cosine {o.cosine:.3f} "
                        f"on {o.samples} {kind} sample(s)), after the accuracy guard: not written. Check the "
                        "calibration samples, keep the layers `qnnx compare` ranks worst float (--exclude-node), or "
                        "pass --no-accuracy-guard to write it anyway")


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


def quantize(model, calibration, config: QuantConfig | None = None, validation=None, metric=None) -> QuantizedModel:
    """Quantize a float model with representative ``calibration`` samples (no labels): a directory of
    .npy/.npz files, an :class:`~qnnx.data.ImageFolder`, a :class:`~qnnx.data.CalibrationData`, or
    an iterable of arrays (single input) / dicts by input name. ``validation``: held-out samples of the
    same kinds; each range method and refinement is then kept only when it lowers the error on them.
    ``metric``: ``metric(outputs) -> float``, higher is better, where ``outputs`` holds the model's outputs
    by name on each held-out sample in order (so labels can be matched by position); the costliest
    patterns stay float until the quantized model's metric is within ``max_drop`` (0.01 unless configured)
    of the float model's, else the run fails (NNCF's accuracy control, on the user's own measure)."""
    return QuantizedModel(run(model, calibration, config or QuantConfig(), validation=validation, metric=metric))
