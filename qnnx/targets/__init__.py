"""Deployment targets: how the logical QDQ model is shaped, checked and timed for one runtime.

A target has a ``name`` and three methods, the only runtime-specific code of automatic quantization:

    export(qdq) -> ir.Model            the model as written for the runtime (a copy; same numbers)
    check(qdq)  -> record              what the runtime would do with it (a report record: ``lines()``)
    timer(models, feed, repeats)       median ms of each model on the runtime, timed interleaved

The canonical qnnx form does not depend on the target; only the QDQ file written does.
"""

from __future__ import annotations

from qnnx.errors import QnnxError
from qnnx.targets.onnxruntime import OnnxRuntimeTarget

TARGETS = {"onnxruntime": OnnxRuntimeTarget()}


def target(name: str):
    """The registered target called ``name``."""
    try:
        return TARGETS[name]
    except KeyError:
        raise QnnxError(f"unknown target {name!r}; expected one of {', '.join(TARGETS)}") from None
