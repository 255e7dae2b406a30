"""Symmetric activations (opt-in): zero point 0 on the quantized inputs, for a target whose kernels run them
faster, kept only when the target's own outputs stay as close to float.

OpenVINO's CPU plugin runs a conv or matmul reading int8 values with zero point 0 faster than one reading
uint8 values with a zero point (NNCF's default quantizes every activation so). It costs levels: a range
``[lo, hi]`` with ``lo < 0`` quantized symmetric spans ``max(|lo|, |hi|)`` on both sides, so a value with a
short negative tail (a SiLU or HardSwish output) keeps about half its resolution. Some models feel that,
others do not. Two candidates, in order: every activation input with zero point 0 (but values an op of the
target's ``unsigned_readers`` reads or makes, through data movement: OpenVINO moves a quantize up through a
Concat), then only those whose zero-point-0 step is at most ``COARSER`` times their own (near-symmetric
ranges: LayerNorm outputs, not SiLU's). Each is realized and run by the target's own runtime (``outputs``)
on the refinement samples, since the int8 paths of that runtime are what is at stake (some compute wrongly
on some CPUs); the first whose mean error against the float model (validation.output_errors) is at most a
tenth above the model's is kept. Nothing is timed: the choice follows the outputs. Not tried on a model
already further than ``FAR`` from float there: that far, the error on a few samples does not tell what a
coarser grid costs.

Off by default: on the confirmation set the proxy missed real losses (docs/benchmarks.md, OpenVINO).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from qnnx.autoquant.plan import keeps_unsigned, with_zero_point_zero, zero_point_zero, zero_point_zero_qparams
from qnnx.autoquant.qdq import realize_qdq
from qnnx.autoquant.refinements.base import Refinement
from qnnx.autoquant.validation import output_errors
from qnnx.errors import QnnxError
from qnnx.metrics import float_outputs
from qnnx.targets import target

RELATIVE_GROWTH = 0.1  # a candidate's mean error may be this fraction above the model's
FAR = 0.05  # not tried on a model whose own mean error (1 - cosine) on the target is above this
COARSER = 1.5  # the second candidate: values whose zero-point-0 step is at most this many times their own


@dataclass(frozen=True)
class Try:
    """One candidate: how many values (share groups) it gives zero point 0 and its mean error on the target."""

    values: int
    error: float
    kept: bool


@dataclass(frozen=True)
class SymmetricRecord:
    """The model's mean error on the target, each candidate tried, or why none was."""

    before: float | None = None
    tries: tuple[Try, ...] = ()
    why: str = ""  # why it was not tried

    @property
    def kept(self) -> Try | None:
        return next((t for t in self.tries if t.kept), None)

    def lines(self) -> list[str]:
        if self.why:
            return [f"symmetric activations: not tried: {self.why}"]
        kept = self.kept
        head = (f"symmetric activations: zero point 0 on {kept.values} value(s), kept: mean error on the target "
                f"{self.before:.3g} -> {kept.error:.3g}" if kept else
                f"symmetric activations: not kept (the outputs moved further from float; mean error on the "
                f"target {self.before:.3g})")
        return [head] + [f"  tried zero point 0 on {t.values} value(s): {t.error:.3g}"
                         for t in self.tries if not t.kept]


def accepted(before: float, after: float) -> bool:
    """Whether a candidate with mean error ``after`` may replace a model with ``before`` (module docstring)."""
    return after <= before * (1 + RELATIVE_GROWTH)


def coarsening(qp) -> float:
    """How many times coarser the step of :func:`~qnnx.autoquant.plan.zero_point_zero`'s qparams is than
    ``qp``'s (1 for a value that never goes negative; about 2 for a short negative tail)."""
    return float(np.max(np.asarray(zero_point_zero(qp).scale)) / np.max(np.asarray(qp.scale)))


class SymmetricActivations(Refinement):
    name = "symmetric_activations"
    reads = ("float_model", "plan", "qparams", "qdq", "samples", "config")
    writes = ("plan", "qparams", "qdq")
    validated = False  # a speed choice: its own check bounds the error it may add

    def enabled(self, config) -> bool:
        return config.refinements.symmetric_activations == "auto" and target(config.target).zero_point_zero_faster

    def apply(self, state):
        runtime = target(state.config.target)
        groups, qparams = state.plan.groups, state.qparams

        def step(t) -> float | None:
            """How many times coarser zero point 0 makes ``t``'s grid; None when its qparams would not move
            or an op the runtime gets wrong on int8 reads or makes it (through data movement, which covers
            the nodes a hoisted quantize sits above, ``t.through``)."""
            qp = qparams.get(groups.get(t.value, t.value).name)
            if qp is None or zero_point_zero(qp) == qp or keeps_unsigned(t.value, runtime.unsigned_readers):
                return None
            return coarsening(qp)

        steps = {t: step(t) for m in state.plan.matches for t in (*m.inputs, *m.outputs) if t.role == "activation"}
        candidates, seen = [], set()
        for bound in (float("inf"), COARSER):
            plan, roots = with_zero_point_zero(state.plan, lambda t: steps[t] is not None and steps[t] <= bound)
            if roots and frozenset(roots) not in seen:
                seen.add(frozenset(roots))
                candidates.append((plan, roots))
        if not candidates:
            return None, SymmetricRecord(why="no quantized input can take zero point 0 here")
        if not state.samples:
            return None, SymmetricRecord(why="no samples to check it on")
        samples = list(state.samples)
        reference = float_outputs(state.float_model, samples)
        try:
            before = float(output_errors(runtime.outputs(state.qdq, samples), reference).mean())
            if before > FAR:
                return None, SymmetricRecord(before, why=f"the model is already far from float on the target (mean "
                                                         f"error {before:.3g} > {FAR})")
            tries = []
            for plan, roots in candidates:
                new_qparams = zero_point_zero_qparams(plan, qparams, roots)
                candidate = realize_qdq(state.float_model, plan, new_qparams, state.config)
                error = float(output_errors(runtime.outputs(candidate, samples), reference).mean())
                tries.append(Try(len(roots), error, accepted(before, error)))
                if tries[-1].kept:
                    record = SymmetricRecord(before, tuple(tries))
                    return replace(state, plan=plan, qparams=new_qparams, qdq=candidate), record
        except QnnxError as e:  # the runtime is not installed: a candidate cannot be checked where it runs
            return None, SymmetricRecord(why=str(e))
        return None, SymmetricRecord(before, tuple(tries))


__all__ = ["COARSER", "FAR", "RELATIVE_GROWTH", "SymmetricActivations", "SymmetricRecord", "Try", "accepted",
           "coarsening"]
