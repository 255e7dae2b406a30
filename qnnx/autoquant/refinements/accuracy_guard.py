"""Accuracy guard: the outputs must meet a target against float, or the costliest patterns go back to float.

    target   every output's SQNR >= ``min_sqnr_db`` and cosine >= ``min_cosine`` (refinement options;
             one of them given turns the guard on, the other then defaults to the report's "far from
             float" bound, report.FAR_SQNR_DB / FAR_COSINE)

Without a target, the runner only refuses a model whose final outputs are far from float (pipeline.py).

Measured on the held-out samples when there are, else on the refinement samples. When the target is
missed, each match's own output SQNR in the quantized model (sqnr_fallback.pattern_sqnr: its error
with everything before it quantized) ranks the matches, and the worst 1, 2, 4, ... return to float
(the model realized again with the same qparams) until the target is met. A model that cannot meet
it even all float in those patterns is refused: the runner never returns an output far from float
without saying so. Runs before weight rounding and bias correction, which start from its plan.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from qnnx.autoquant.plan import node_label
from qnnx.autoquant.qdq import realize_qdq
from qnnx.autoquant.refinements.base import Refinement
from qnnx.autoquant.refinements.sqnr_fallback import pattern_sqnr
from qnnx.autoquant.report import FAR_COSINE, FAR_SQNR_DB
from qnnx.autoquant.stages import output_agreement
from qnnx.errors import QnnxError


@dataclass(frozen=True)
class AccuracyGuardRecord:
    min_sqnr_db: float
    min_cosine: float
    samples: int
    worst_before: tuple[float, float]  # (SQNR dB, cosine) of the worst output before
    worst_after: tuple[float, float]
    left_float: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        if not self.left_float:
            return []
        return [f"accuracy guard: {len(self.left_float)} pattern(s) kept float so every output meets SQNR >= "
                f"{self.min_sqnr_db:g} dB and cosine >= {self.min_cosine:g} on {self.samples} sample(s) (worst output "
                f"{self.worst_before[0]:.1f} -> {self.worst_after[0]:.1f} dB): " + ", ".join(self.left_float[:10])
                + (" ..." if len(self.left_float) > 10 else "")]


def _worst(outputs) -> tuple[float, float]:
    return min(o.sqnr_db for o in outputs), min(o.cosine for o in outputs)


def _meets(outputs, min_sqnr: float, min_cosine: float) -> bool:
    return all(o.sqnr_db >= min_sqnr and o.cosine >= min_cosine for o in outputs)


class AccuracyGuard(Refinement):
    name = "accuracy_guard"
    reads = ("float_model", "plan", "qparams", "qdq", "samples", "validation", "config")
    writes = ("plan", "qdq")
    validated = False  # it is the held-out check itself

    def enabled(self, config) -> bool:
        r = config.refinements
        return r.accuracy_guard and (r.min_sqnr_db is not None or r.min_cosine is not None)

    def apply(self, state):
        options = state.config.refinements
        min_sqnr = FAR_SQNR_DB if options.min_sqnr_db is None else options.min_sqnr_db
        min_cosine = FAR_COSINE if options.min_cosine is None else options.min_cosine
        samples = list(state.validation if state.validation is not None else state.samples)
        outputs = output_agreement(state.float_model, state.qdq, samples)
        if not outputs:
            return None, None  # ONNX Runtime cannot run the model: nothing to measure
        before = _worst(outputs)
        if _meets(outputs, min_sqnr, min_cosine):
            return None, AccuracyGuardRecord(min_sqnr, min_cosine, len(samples), before, before)
        matches = state.plan.matches
        scores = pattern_sqnr(state.float_model, state.qdq, matches, samples)
        order = sorted(range(len(matches)), key=lambda i: (scores.get(i, float("inf")), i))
        k = 1
        while True:
            k = min(k, len(order))
            worst = order[:k]
            reasons = {i: f"accuracy guard: output SQNR {scores[i]:.1f} dB, among the {k} costliest patterns, "
                          f"kept float to meet the output target" for i in worst}
            kept = [m for i, m in enumerate(matches) if i not in set(worst)]
            qdq = realize_qdq(state.float_model, state.plan.keeping(kept), state.qparams, state.config)
            outputs = output_agreement(state.float_model, qdq, samples)
            if _meets(outputs, min_sqnr, min_cosine) or k == len(order):
                break
            k *= 2
        if not _meets(outputs, min_sqnr, min_cosine):
            worst_now = _worst(outputs) if outputs else before
            raise QnnxError(
                f"the quantized outputs stay far from the float model's (worst output SQNR {worst_now[0]:.1f} dB, "
                f"cosine {worst_now[1]:.3f} on {len(samples)} sample(s); target SQNR >= {min_sqnr:g} dB and cosine >= "
                f"{min_cosine:g}) even with every pattern float: check the calibration samples, or lower the "
                "target (min_sqnr_db / --min-sqnr)")
        the_plan = state.plan.mark_float(reasons)
        record = AccuracyGuardRecord(min_sqnr, min_cosine, len(samples), before, _worst(outputs),
                                     tuple(node_label(matches[i].nodes[0]) for i in worst))
        return replace(state, plan=the_plan, qdq=qdq), record
