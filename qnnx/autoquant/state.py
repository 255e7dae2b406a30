"""The state automatic quantization's stages share, and the contract every stage declares.

A stage is ``run(state) -> state``: it returns a new :class:`QuantState` (``dataclasses.replace``)
in which only the fields it ``writes`` differ, and it reads only the fields it ``reads``. The runner
(pipeline.py) checks the writes; each stage is testable alone on a hand-made state.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable

import onnx_ir as ir

from qnnx.autoquant.config import QuantConfig
from qnnx.autoquant.report import QuantReport


@dataclass(frozen=True)
class QuantState:
    """Everything a stage may read or write. ``source`` (the user's model) is never modified."""

    config: QuantConfig
    source: object  # a path, bytes, ModelProto or ir.Model
    data: object  # qnnx.data.CalibrationData: unbound until prepare, then bound to the float model's inputs
    report: QuantReport = field(default_factory=QuantReport)  # each stage appends its own record
    float_model: ir.Model | None = None
    renames: dict[str, str] = field(default_factory=dict)  # user node name -> node computing it after prepare
    source_op_types: frozenset[str] = frozenset()  # op types of the model as given
    samples: tuple[dict, ...] = ()  # the first samples: refinements and the output check measure on them
    exclusions: object | None = None  # plan.Exclusions: what the user (and refinements) keep float
    plan: object | None = None  # plan.Plan
    qparams: dict = field(default_factory=dict)  # activation qparams by value name
    qdq: ir.Model | None = None  # the logical QDQ model (no target shaping)
    keep_float: frozenset[str] = frozenset()  # node names the canonical conversion must keep float
    canonical: ir.Model | None = None  # the canonical qnnx integer model
    validation: object | None = None  # held-out CalibrationData (bound), or None: no validation
    validation_reference: tuple | None = None  # the float model's outputs on each held-out sample
    validation_errors: object | None = None  # the current QDQ model's error per held-out sample (numpy)
    metric: Callable | None = None  # the user's metric: outputs on the held-out samples -> float (higher is better)


STATE_FIELDS = frozenset(f.name for f in fields(QuantState))


@dataclass(frozen=True)
class Stage:
    """One step of the pipeline: its contract is ``reads`` -> ``writes`` (field names of QuantState)."""

    name: str
    run: Callable[[QuantState], QuantState]
    reads: tuple[str, ...]
    writes: tuple[str, ...]

    def __post_init__(self):
        unknown = (set(self.reads) | set(self.writes)) - STATE_FIELDS
        if unknown:
            raise ValueError(f"stage {self.name!r} names unknown state fields {sorted(unknown)}")

    def __call__(self, state: QuantState) -> QuantState:
        after = self.run(state)
        changed = [f for f in STATE_FIELDS if getattr(after, f) is not getattr(state, f)]
        stray = sorted(set(changed) - set(self.writes))
        if stray:
            raise RuntimeError(f"stage {self.name!r} changed {', '.join(stray)}, which it does not declare")
        return after
