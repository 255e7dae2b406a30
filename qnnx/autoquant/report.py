"""What automatic quantization decided and measured: a Decision per node, a record per stage.

Each stage and refinement writes one record of its own (``QuantReport.records[name]``); a record is
any object with ``lines() -> list[str]`` (its lines of the summary), so a new refinement adds its
record without an edit here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class Decision:
    """Why a node ended up integer or float."""

    node: str
    op_type: str
    quantized: bool
    reason: str
    pattern: str | None = None
    sqnr_db: float | None = None


class Record(Protocol):
    """A stage's or refinement's own report entry."""

    def lines(self) -> list[str]: ...


@dataclass(frozen=True)
class OutputAgreement:
    """One model output, quantized vs float, on the refinement samples."""

    name: str
    sqnr_db: float
    cosine: float
    samples: int
    channel_cosine: float = math.nan  # mean of the per-channel (axis 1) cosines (metrics.LayerError)
    held_out: bool = False  # measured on held-out samples (else on calibration samples)


# An output this far from the float model's is not a quantized version of it (docs/experiments.md,
# "Far-from-float bounds").
FAR_COSINE = 0.9
FAR_SQNR_DB = 6.0  # error power above a quarter of the signal's


@dataclass(frozen=True)
class CalibrationRecord:
    """What the calibrator read: samples, passes over them, seconds, and from where."""

    calibrator: str
    samples: int
    seconds: float
    source: str = ""

    def lines(self) -> list[str]:
        return []  # the summary's first line says it


@dataclass
class QuantReport:
    decisions: list[Decision] = field(default_factory=list)
    calibration: CalibrationRecord | None = None
    outputs: list[OutputAgreement] = field(default_factory=list)
    records: dict[str, Record] = field(default_factory=dict)  # by stage / refinement name, in run order
    left_in_float: list[tuple[str, str, str]] = field(default_factory=list)  # the canonical model's float ops

    @property
    def calibration_seconds(self) -> float:
        return self.calibration.seconds if self.calibration else 0.0

    @property
    def num_samples(self) -> int:
        return self.calibration.samples if self.calibration else 0

    def record(self, name: str):
        """The record ``name`` wrote, or None."""
        return self.records.get(name)

    def far_outputs(self) -> list[OutputAgreement]:
        return [o for o in self.outputs if not (o.cosine >= FAR_COSINE and o.sqnr_db >= FAR_SQNR_DB)]

    def quantized(self) -> list[Decision]:
        return [d for d in self.decisions if d.quantized]

    def summary(self) -> str:
        q = self.quantized()
        f = [d for d in self.decisions if not d.quantized]
        lines = [f"quantized {len(q)} pattern(s), {len(f)} node(s) kept in float; "
                 f"calibration {self.calibration_seconds:.1f}s on {self.num_samples} sample(s)"]
        if self.outputs:
            kind = "held-out" if self.outputs[0].held_out else "calibration"
            lines.append(f"outputs vs float on {self.outputs[0].samples} {kind} sample(s): " + ", ".join(
                f"{o.name} SQNR {o.sqnr_db:.1f} dB, cosine {o.cosine:.4f}" for o in self.outputs))
        for o in self.far_outputs():
            lines.append(f"WARNING: output {o.name!r} is far from the float model's (SQNR {o.sqnr_db:.1f} dB, cosine "
                         f"{o.cosine:.3f}): not a faithful quantization; try more calibration samples, or exclude "
                         "the layers `qnnx compare` lists worst")
        worst = sorted((d for d in self.decisions if d.sqnr_db is not None), key=lambda d: d.sqnr_db)[:5]
        if worst:
            lines.append("worst layers by output SQNR: " + ", ".join(f"{d.node} {d.sqnr_db:.1f} dB" for d in worst))
        for record in self.records.values():
            lines += record.lines()
        for d in f[:20]:
            lines.append(f"  float: {d.node} ({d.op_type}): {d.reason}")
        if len(f) > 20:
            lines.append(f"  ... and {len(f) - 20} more")
        for name, op, why in self.left_in_float:
            lines.append(f"  left in float in the integer model: {name} ({op}): {why}")
        return "\n".join(lines)
