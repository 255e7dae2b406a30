"""``qnnx.ReferenceEvaluator``: runs graphs mixing standard ONNX and ``qnnx`` ops.

Built on onnx.reference's custom-op mechanism: every registered qnnx op becomes
an ``OpRun`` subclass calling its reference kernel. Standard quantization ops
are imported into the dialect first (``import_onnx``), so a QLinearConv runs on
exactly the numerics the rest of qnnx is tested against.
"""

from __future__ import annotations

import numpy as np
import onnx.reference
from onnx.reference.op_run import OpRun

from qnnx.dialect import DOMAIN, REGISTRY, OpSchema
from qnnx.errors import QnnxError
from qnnx.frontends import import_onnx
from qnnx.ir import to_proto


class _QnnxOpRun(OpRun):
    op_domain = DOMAIN
    schema: OpSchema

    def _run(self, *inputs, **attributes):
        where = f"node {self.onnx_node.name or self.onnx_node.op_type!r} (qnnx.{self.schema.name})"
        try:
            attrs = self.schema.resolve_attributes(attributes, where)
            return self.schema.kernel(*inputs, **attrs)
        except QnnxError as e:
            raise e if e.where and e.where.startswith("node ") else e.at(where) from None


def _op_class(schema: OpSchema) -> type[OpRun]:
    return type(schema.name, (_QnnxOpRun,), {"schema": schema, "op_domain": DOMAIN})


OP_CLASSES: list[type[OpRun]] = [_op_class(s) for s in REGISTRY.values()]


def _root_qnnx_error(exc: BaseException) -> QnnxError | None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, QnnxError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class ReferenceEvaluator:
    """Same call shape as ``onnx.reference.ReferenceEvaluator``: ``run(output_names, feeds)``."""

    def __init__(self, model, *, verbose: int = 0):
        self.model = import_onnx(model)
        proto = to_proto(self.model)
        self._impl = onnx.reference.ReferenceEvaluator(proto, new_ops=OP_CLASSES, verbose=verbose)

    @property
    def input_names(self) -> list[str]:
        return list(self._impl.input_names)

    @property
    def output_names(self) -> list[str]:
        return list(self._impl.output_names)

    def run(self, output_names, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        try:
            return self._impl.run(output_names, feeds)
        except Exception as e:
            root = _root_qnnx_error(e)
            if root is not None:
                raise root from None
            raise
