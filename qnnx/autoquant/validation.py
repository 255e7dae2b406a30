"""Held-out validation: each candidate model is measured on samples calibration never saw.

The error of a QDQ model on one held-out sample is the mean over the model's outputs of its cosine
distance to the float model's output: ``1 - mean per-channel cosine`` for outputs with a channel axis
and more (metrics.LayerError.channel_cosine: not ruled by the loudest channels, and a channel gone
silent counts fully), ``1 - cosine`` for vectors; inf/NaN the float model has not is an error of 1. A step (a range method, a refinement) is kept only when it lowers
the mean error by more than its spread: the standard error of the per-sample differences, so an
improvement that the held-out samples do not agree on is not taken.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from qnnx import runtime
from qnnx.errors import QnnxError
from qnnx.metrics import LayerError


def sample_errors(qdq: ir.Model, samples, reference: list[dict[str, np.ndarray]]) -> np.ndarray:
    """One error per held-out sample (module docstring) against ``reference``, the float model's outputs by
    name on each (metrics.float_outputs); 1.0 everywhere when ONNX Runtime cannot run the model (a
    candidate that does not run is never preferred)."""
    names = [v.name for v in qdq.graph.outputs]
    try:
        sess = runtime.session(qdq, outputs=names)
    except QnnxError:
        return np.ones(len(reference))
    return output_errors([dict(zip(names, runtime.run(sess, names, feed))) for feed in samples], reference)


def output_errors(outputs: list[dict[str, np.ndarray]], reference: list[dict[str, np.ndarray]]) -> np.ndarray:
    """The error (module docstring) of each sample's ``outputs`` (by name, from any runtime) against
    ``reference``, over the outputs both name."""
    out = []
    for got, ref in zip(outputs, reference):
        errors = []
        for name in [n for n in ref if n in got]:
            a, b = np.asarray(ref[name]), np.asarray(got[name])
            e = LayerError(name, "", True)
            e.add(a, b)
            if e.nonfinite:
                errors.append(1.0)
                continue
            c = e.channel_cosine if a.ndim >= 3 else e.cosine
            errors.append(1.0 - (e.cosine if math.isnan(c) else c))
        out.append(float(np.mean(errors)) if errors else 0.0)
    return np.asarray(out)


@dataclass(frozen=True)
class Verdict:
    """A step measured on the held-out samples: the mean error without and with it, the standard error
    of the per-sample difference, and whether it was kept."""

    step: str
    samples: int
    before: float
    after: float
    spread: float
    kept: bool

    @classmethod
    def of(cls, step: str, before: np.ndarray, after: np.ndarray) -> "Verdict":
        d = after - before
        spread = float(np.std(d, ddof=1) / math.sqrt(len(d))) if len(d) > 1 else 0.0
        gain = -float(np.mean(d))
        return cls(step, len(d), float(np.mean(before)), float(np.mean(after)), spread, gain > spread and gain > 0)

    def line(self) -> str:
        return (f"validation: {self.step} {'kept' if self.kept else 'dropped'}: held-out error "
                f"{self.before:.3g} -> {self.after:.3g} (spread {self.spread:.2g}, {self.samples} samples)")


@dataclass(frozen=True)
class ValidationRecord:
    verdicts: tuple[Verdict, ...]

    def lines(self) -> list[str]:
        return [v.line() for v in self.verdicts]


@dataclass(frozen=True)
class Dropped:
    """A refinement's record when held-out validation undid it: what it would have done, and why not."""

    record: object
    verdict: Verdict

    def lines(self) -> list[str]:
        return []  # the validation record's line says it
