"""The contract of a refinement: an optional step after realization that may change the plan, the
QDQ model or what stays float, measured on the refinement samples.

    enabled(config) -> bool              whether the config asks for it
    apply(state) -> (state, record)      the refined state (only ``writes`` differ) and its own report
                                         record; (None, record) when it leaves the model as it was

A refinement never edits the state it is given: the runner hands it a state whose QDQ model is its
own copy when it declares ``edits_qdq``, so the state before it stays whole and the step can be
undone (dropped) by keeping that state. Records are report entries with ``lines()``.
"""

from __future__ import annotations

from qnnx.autoquant.state import STATE_FIELDS, QuantState


class Refinement:
    name: str = ""
    reads: tuple[str, ...] = ("float_model", "qdq", "samples", "config")
    writes: tuple[str, ...] = ("qdq",)
    edits_qdq: bool = False  # edits the QDQ model it is given in place (the runner gives it a copy)
    validated: bool = True  # with held-out samples, kept only when it lowers their error (speed: False)

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        unknown = (set(cls.reads) | set(cls.writes)) - STATE_FIELDS
        if unknown:
            raise TypeError(f"refinement {cls.__name__} names unknown state fields {sorted(unknown)}")

    def enabled(self, config) -> bool:
        raise NotImplementedError

    def apply(self, state: QuantState) -> tuple[QuantState, object]:
        raise NotImplementedError
