"""Symmetric activations: zero point 0 on the quantized inputs, for a target whose kernels run them faster,
kept only when the target's own outputs stay as close to float.

OpenVINO's CPU plugin runs a conv or matmul reading int8 values with zero point 0 faster than one reading
uint8 values with a zero point (NNCF's default quantizes every activation so). It costs levels: a range
``[lo, hi]`` with ``lo < 0`` quantized symmetric spans ``max(|lo|, |hi|)`` on both sides, so a value with a
short negative tail (a SiLU or HardSwish output) keeps about half its resolution. Some models feel that,
others do not, so the candidate (every activation input with zero point 0, but for values an op of the
target's ``unsigned_readers`` reads) is realized and both models are run by the target's own runtime
(``outputs``) on the refinement samples: the int8 paths of that runtime are what is at stake, and some
compute wrongly on some CPUs. The candidate is kept when its mean error against the float model
(validation.output_errors) is at most a tenth above the model's, or below ``NEGLIGIBLE`` (cosine distance
1e-4, about 37 dB: far below what a task metric shows). Nothing is timed: the choice follows the outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from qnnx import ops
from qnnx.autoquant.plan import with_zero_point_zero, zero_point_zero_qparams
from qnnx.autoquant.qdq import realize_qdq
from qnnx.autoquant.refinements.base import Refinement
from qnnx.autoquant.validation import output_errors
from qnnx.errors import QnnxError
from qnnx.metrics import float_outputs
from qnnx.targets import target

RELATIVE_GROWTH = 0.1  # the candidate's mean error may be this fraction above the model's
NEGLIGIBLE = 1e-3  # or stay below this mean error (1 - cosine: cosine 0.999 to float) whatever the model's


@dataclass(frozen=True)
class SymmetricRecord:
    """Values given zero point 0 (share groups), both models' mean error on the target, and the choice."""

    values: int
    before: float | None = None
    after: float | None = None
    kept: bool = False
    why: str = ""  # why it was not tried

    def lines(self) -> list[str]:
        if self.why:
            return [f"symmetric activations: not tried: {self.why}"]
        verdict = "kept" if self.kept else "not kept (the outputs moved further from float)"
        return [f"symmetric activations (zero point 0 on {self.values} value(s)): {verdict}: mean error on the "
                f"target {self.before:.3g} -> {self.after:.3g}"]


def accepted(before: float, after: float) -> bool:
    """Whether a candidate with mean error ``after`` may replace a model with ``before`` (module docstring)."""
    return after <= before * (1 + RELATIVE_GROWTH) or after <= NEGLIGIBLE


class SymmetricActivations(Refinement):
    name = "symmetric_activations"
    reads = ("float_model", "plan", "qparams", "qdq", "samples", "config")
    writes = ("plan", "qparams", "qdq")
    validated = False  # a speed choice: its own check bounds the error it may add

    def enabled(self, config) -> bool:
        return config.refinements.symmetric_activations == "auto" and target(config.target).zero_point_zero_faster

    def apply(self, state):
        runtime = target(state.config.target)
        unsigned = runtime.unsigned_readers
        the_plan, roots = with_zero_point_zero(
            state.plan, lambda t: not any(n.op_type in unsigned for n in t.through)
            and not ops.readers_through(t.value, unsigned))
        if not roots:
            return None, SymmetricRecord(0, why="no quantized input can take zero point 0 here")
        if not state.samples:
            return None, SymmetricRecord(len(roots), why="no samples to check it on")
        qparams = zero_point_zero_qparams(the_plan, state.qparams, roots)
        candidate = realize_qdq(state.float_model, the_plan, qparams, state.config)
        samples = list(state.samples)
        reference = float_outputs(state.float_model, samples)
        try:
            before = float(output_errors(runtime.outputs(state.qdq, samples), reference).mean())
            after = float(output_errors(runtime.outputs(candidate, samples), reference).mean())
        except QnnxError as e:  # the runtime is not installed: the candidate cannot be checked where it runs
            return None, SymmetricRecord(len(roots), why=str(e))
        record = SymmetricRecord(len(roots), before, after, accepted(before, after))
        if not record.kept:
            return None, record
        return replace(state, plan=the_plan, qparams=qparams, qdq=candidate), record


__all__ = ["NEGLIGIBLE", "RELATIVE_GROWTH", "SymmetricActivations", "SymmetricRecord", "accepted"]
