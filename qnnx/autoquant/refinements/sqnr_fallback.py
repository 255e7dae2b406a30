"""SQNR fallback: patterns whose output is far from float on the refinement samples stay float.

Each match's output (quantized model vs float model, every other layer quantized too) gets the SQNR
``qnnx compare`` prints (metrics.LayerError); matches below ``sqnr_threshold_db`` return to float and
the model is realized again. The decisions carry each match's SQNR, so the report lists the worst.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx_ir as ir

from qnnx import runtime
from qnnx.autoquant.patterns import PatternMatch
from qnnx.autoquant.plan import node_label
from qnnx.autoquant.qdq import realize_qdq
from qnnx.autoquant.refinements.base import Refinement
from qnnx.metrics import LayerError


def pattern_sqnr(float_model: ir.Model, qdq_model: ir.Model, matches: list[PatternMatch],
                 samples) -> dict[int, float]:
    """Output SQNR (dB) of each match (by index), quantized vs float, on ``samples``."""
    outs = [_output_name(m) for m in matches]
    errors = value_errors(float_model, qdq_model, outs, samples)
    return {i: errors[n].sqnr_db for i, n in enumerate(outs)}


def pattern_added_error(float_model: ir.Model, qdq_model: ir.Model, matches: list[PatternMatch],
                        samples) -> dict[int, float]:
    """The error each match (by index) adds: its output's relative error power (noise / signal) less the
    largest of its activation inputs', quantized vs float on ``samples``. Unlike the output SQNR, which
    only grows along the graph, this ranks a layer by what its own quantization costs."""
    outs = [_output_name(m) for m in matches]
    ins = [[t.value.name for t in m.inputs if t.role == "activation"] for m in matches]
    errors = value_errors(float_model, qdq_model, sorted({*outs, *(n for names in ins for n in names)}), samples)

    def relative(name: str) -> float:
        e = errors[name]
        return e.noise / e.signal if e.signal > 0 else (0.0 if e.noise == 0 else float("inf"))

    return {i: relative(out) - max((relative(n) for n in names), default=0.0)
            for i, (out, names) in enumerate(zip(outs, ins))}


def value_errors(float_model: ir.Model, qdq_model: ir.Model, names, samples) -> dict[str, LayerError]:
    """The error of each named value (one computed by a node in both models), quantized vs float."""
    f_vals = [v for v in (_find_value(float_model, n) for n in names) if v is not None]
    q_vals = [v for v in (_find_value(qdq_model, n) for n in names) if v is not None]
    fs, qs = runtime.session(float_model, outputs=f_vals), runtime.session(qdq_model, outputs=q_vals)
    errors = {n: LayerError(n, "", False) for n in names}
    for feed in samples:
        fr = dict(zip([v.name for v in f_vals], runtime.run(fs, [v.name for v in f_vals], feed)))
        qr = dict(zip([v.name for v in q_vals], runtime.run(qs, [v.name for v in q_vals], feed)))
        for n in names:
            if n in fr and n in qr:
                errors[n].add(np.asarray(fr[n]), np.asarray(qr[n]))
    return errors


def _output_name(m: PatternMatch) -> str:
    return (m.outputs[0].value if m.outputs else m.nodes[-1].outputs[0]).name


def _find_value(model: ir.Model, name: str) -> ir.Value | None:
    for node in model.graph:
        for o in node.outputs:
            if o.name == name:
                return o
    return None


@dataclass(frozen=True)
class SqnrFallbackRecord:
    threshold_db: float
    scored: int
    left_float: tuple[str, ...]

    def lines(self) -> list[str]:
        if not self.left_float:
            return [f"SQNR fallback: every one of {self.scored} pattern(s) at or above {self.threshold_db} dB"]
        return [f"SQNR fallback: {len(self.left_float)} of {self.scored} pattern(s) below {self.threshold_db} dB "
                "kept float: " + ", ".join(self.left_float[:8]) + (" ..." if len(self.left_float) > 8 else "")]


class SqnrFallback(Refinement):
    name = "sqnr_fallback"
    reads = ("float_model", "plan", "qparams", "qdq", "samples", "config")
    writes = ("plan", "qdq")

    def enabled(self, config) -> bool:
        return config.refinements.sqnr_threshold_db is not None

    def apply(self, state):
        threshold = state.config.refinements.sqnr_threshold_db
        matches = state.plan.matches
        scores = pattern_sqnr(state.float_model, state.qdq, matches, state.samples)
        by_anchor = {d.node: d for d in state.plan.decisions}
        for i, m in enumerate(matches):
            d = by_anchor.get(node_label(m.nodes[0]))
            if d is not None:
                d.sqnr_db = scores.get(i)
        low = {i: f"output SQNR {sq:.1f} dB below {threshold} dB: kept float"
               for i, sq in scores.items() if sq < threshold}
        record = SqnrFallbackRecord(threshold, len(scores), tuple(node_label(matches[i].nodes[0]) for i in low))
        if not low:
            return None, record
        the_plan = state.plan.mark_float(low)
        return replace(state, plan=the_plan, qdq=realize_qdq(state.float_model, the_plan, state.qparams,
                                                             state.config)), record
