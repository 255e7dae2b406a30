"""Accuracy guard: the model must meet the user's target against float, or the costliest patterns go back to float.

    targets  every output's SQNR >= ``min_sqnr_db`` and cosine >= ``min_cosine`` (each defaults to the
             report's "far from float" bound, so without a target the guard rescues only a model that
             would otherwise be refused); and the user's metric (``quantize(metric=...)``) on the
             held-out samples within ``max_drop`` of the float model's, when given

The runner still refuses a model whose final outputs are far from float (pipeline.py): the refinements
after the guard can move them again.

Measured on the held-out samples when there are (a metric needs them), else on the refinement samples.
When a target is missed, the matches are ranked by the error each adds (sqnr_fallback.pattern_added_error:
its output's relative error less its inputs', with everything quantized), and the worst 1, 2, 4, ...
return to float (the model realized again with the same qparams) until the targets are met, then the
fewest that meet them between the last two counts (bisection). A model that
cannot meet them even with every pattern float is refused: the runner never returns a model that misses
the user's target without saying so. Runs before weight rounding and bias correction, which start from
its plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np


from qnnx import runtime
from qnnx.autoquant.plan import node_label
from qnnx.autoquant.qdq import realize_qdq
from qnnx.autoquant.refinements.base import Refinement
from qnnx.autoquant.refinements.sqnr_fallback import pattern_added_error
from qnnx.autoquant.report import FAR_COSINE, FAR_SQNR_DB
from qnnx.autoquant.stages import output_agreement
from qnnx.errors import QnnxError

DEFAULT_MAX_DROP = 0.01


@dataclass(frozen=True)
class AccuracyGuardRecord:
    min_sqnr_db: float
    min_cosine: float
    samples: int
    worst_before: tuple[float, float]  # (SQNR dB, cosine) of the worst output before
    worst_after: tuple[float, float]
    left_float: tuple[str, ...] = ()
    metric: tuple[float, float, float] | None = None  # float model's, before, after
    max_drop: float | None = None
    float_mac_share: float = 0.0  # of the model's conv/matmul multiply-accumulates, the share left float

    def lines(self) -> list[str]:
        out = []
        if self.metric is not None:
            f, before, after = self.metric
            out.append(f"accuracy guard: metric {after:.4f} on {self.samples} held-out sample(s) (float {f:.4f}, "
                       f"all quantized {before:.4f}; allowed drop {self.max_drop:g})")
        if self.left_float:
            out.append(f"accuracy guard: {len(self.left_float)} pattern(s) kept float to meet the target (worst output "
                       f"SQNR {self.worst_before[0]:.1f} -> {self.worst_after[0]:.1f} dB; their cost in speed: "
                       f"{100 * self.float_mac_share:.0f}% of the model's conv/matmul multiply-accumulates, dynamic "
                       "dimensions counted as 1, now run in float): " + ", ".join(self.left_float[:10]) + (" ..." if len(self.left_float) > 10 else ""))
        return out


def multiply_accumulates(node) -> int:
    """Multiply-accumulates of one Conv/ConvTranspose/MatMul/Gemm from its shapes, a dynamic dimension
    counted as 1 (0 when a shape is missing): the measure of what returning it to float costs, without
    timing anything."""
    if node.op_type not in ("Conv", "ConvTranspose", "MatMul", "Gemm") or len(node.inputs) < 2:
        return 0
    x, w, y = (list(v.shape) if v is not None and v.shape is not None else None
               for v in (node.inputs[0], node.inputs[1], node.outputs[0]))
    if x is None or w is None or y is None:
        return 0
    x, w, y = ([d if isinstance(d, int) else 1 for d in sh] for sh in (x, w, y))
    if node.op_type == "Conv":  # each output element reads C_in/groups x kernel taps
        return int(np.prod(y)) * int(np.prod(w[1:]))
    if node.op_type == "ConvTranspose":  # each input element writes C_out/groups x kernel taps
        return int(np.prod(x)) * int(np.prod(w[1:]))
    k = w[0] if node.op_type == "MatMul" or not node.attributes.get_int("transB", 0) else w[-1]
    return int(np.prod(y)) * int(k)


def _float_share(matches, left: set[int]) -> float:
    macs = [sum(multiply_accumulates(n) for n in m.nodes) for m in matches]
    total = sum(macs)
    return sum(macs[i] for i in left) / total if total else 0.0


def _worst(outputs) -> tuple[float, float]:
    return min(o.sqnr_db for o in outputs), min(o.cosine for o in outputs)


def evaluate_metric(metric, model, samples) -> float:
    """``metric`` of ``model``'s outputs (by name, one dict per sample, in order) on ``samples``."""
    names = [v.name for v in model.graph.outputs]
    sess = runtime.session(model, outputs=names)
    value = metric([dict(zip(names, runtime.run(sess, names, feed))) for feed in samples])
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise QnnxError(f"the metric must return a number, got {type(value).__name__}") from None
    if not math.isfinite(value):
        raise QnnxError(f"the metric returned {value}")
    return value


class _Targets:
    """The configured targets, measured on one QDQ model at a time."""

    def __init__(self, state):
        options = state.config.refinements
        self.min_sqnr = FAR_SQNR_DB if options.min_sqnr_db is None else options.min_sqnr_db
        self.min_cosine = FAR_COSINE if options.min_cosine is None else options.min_cosine
        self.metric = state.metric
        self.max_drop = DEFAULT_MAX_DROP if options.max_drop is None else options.max_drop
        if self.metric is not None and state.validation is None:
            raise QnnxError("a metric is measured on held-out samples: pass validation= (held-out samples) or set "
                            "the validation option (a count or fraction of the calibration samples)")
        self.samples = list(state.validation if state.validation is not None else state.samples)
        self.float_metric = (evaluate_metric(self.metric, state.float_model, self.samples)
                             if self.metric is not None else None)

    def measure(self, float_model, qdq) -> tuple[list, float | None]:
        outputs = output_agreement(float_model, qdq, self.samples)
        value = evaluate_metric(self.metric, qdq, self.samples) if self.metric is not None else None
        return outputs, value

    def met(self, outputs, value) -> bool:
        if not all(o.sqnr_db >= self.min_sqnr and o.cosine >= self.min_cosine for o in outputs):
            return False
        return value is None or value >= self.float_metric - self.max_drop

    def missed(self, outputs, value) -> str:
        parts = []
        if value is not None:
            parts.append(f"metric {value:.4f} vs float {self.float_metric:.4f}, allowed drop {self.max_drop:g}")
        if outputs:
            sq, cos = _worst(outputs)
            parts.append(f"worst output SQNR {sq:.1f} dB, cosine {cos:.3f}; target SQNR >= {self.min_sqnr:g} dB "
                         f"and cosine >= {self.min_cosine:g}")
        return "; ".join(parts)


class AccuracyGuard(Refinement):
    name = "accuracy_guard"
    reads = ("float_model", "plan", "qparams", "qdq", "samples", "validation", "metric", "config")
    writes = ("plan", "qdq")
    validated = False  # it is the held-out check itself

    def enabled(self, config) -> bool:
        return config.refinements.accuracy_guard

    def apply(self, state):
        targets = _Targets(state)
        outputs, value = targets.measure(state.float_model, state.qdq)
        if not outputs and value is None:
            return None, None  # ONNX Runtime cannot run the model: nothing to measure
        before = _worst(outputs) if outputs else (float("nan"), float("nan"))
        metric = (targets.float_metric, value, value) if value is not None else None
        if targets.met(outputs, value):
            return None, AccuracyGuardRecord(targets.min_sqnr, targets.min_cosine, len(targets.samples), before,
                                             before, metric=metric, max_drop=targets.max_drop if metric else None)
        matches = state.plan.matches
        added = pattern_added_error(state.float_model, state.qdq, matches, targets.samples)
        order = sorted(range(len(matches)), key=lambda i: (-added.get(i, 0.0), i))

        def trial(k: int):
            left = set(order[:k])
            kept = [m for i, m in enumerate(matches) if i not in left]
            qdq = realize_qdq(state.float_model, state.plan.keeping(kept), state.qparams, state.config)
            return (qdq, *targets.measure(state.float_model, qdq))

        # the worst 1, 2, 4, ... float until the target is met, then the fewest between the last two counts
        low, k = 0, 1
        while True:
            k = min(k, len(order))
            qdq, outputs, after = trial(k)
            if targets.met(outputs, after) or k == len(order):
                break
            low, k = k, k * 2
        while targets.met(outputs, after) and k - low > 1:
            mid = (low + k) // 2
            tried = trial(mid)
            if targets.met(*tried[1:]):
                k, (qdq, outputs, after) = mid, tried
            else:
                low = mid
        worst = set(order[:k])
        if not targets.met(outputs, after):
            raise QnnxError(f"the quantized model misses the accuracy target even with every pattern float "
                            f"({targets.missed(outputs, after)}; on {len(targets.samples)} sample(s)): check the "
                            "calibration samples, or lower the target (--min-sqnr / --min-cosine, max_drop)")
        reasons = {i: f"accuracy guard: among the {k} patterns adding the most error, kept float to meet the "
                      "target" for i in worst}
        record = AccuracyGuardRecord(targets.min_sqnr, targets.min_cosine, len(targets.samples), before,
                                     _worst(outputs) if outputs else before,
                                     tuple(node_label(matches[i].nodes[0]) for i in sorted(worst)),
                                     metric=(targets.float_metric, value, after) if value is not None else None,
                                     max_drop=targets.max_drop if value is not None else None,
                                     float_mac_share=_float_share(matches, worst))
        return replace(state, plan=state.plan.mark_float(reasons), qdq=qdq), record
