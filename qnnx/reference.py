"""``qnnx.ReferenceEvaluator``: runs graphs mixing standard ONNX and ``qnnx`` ops.

Built on onnx.reference's custom-op mechanism: every registered qnnx op becomes
an ``OpRun`` subclass calling its reference kernel. Standard quantization ops
are imported into the dialect first (``import_onnx``), so a QLinearConv runs on
exactly the numerics the rest of qnnx is tested against.
"""

from __future__ import annotations

import numpy as np
import onnx.reference
import onnx_ir as ir
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
    """Same call shape as ``onnx.reference.ReferenceEvaluator``: ``run(output_names, feeds)``.
    Bad input (an invalid model, feeds that do not match the model's inputs) is a :class:`QnnxError`."""

    def __init__(self, model, *, verbose: int = 0):
        self.model = import_onnx(model)
        ir.external_data.load_to_model(self.model)  # onnx.reference reads no external data files
        proto = to_proto(self.model)
        try:
            self._impl = onnx.reference.ReferenceEvaluator(proto, new_ops=OP_CLASSES, verbose=verbose)
        except Exception as e:  # an op onnx.reference does not implement, an attribute it refuses
            raise _as_qnnx_error(e, "the reference evaluator cannot run the model") from None

    @property
    def input_names(self) -> list[str]:
        return list(self._impl.input_names)

    @property
    def output_names(self) -> list[str]:
        return list(self._impl.output_names)

    def run(self, output_names, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        self._check_feeds(feeds)
        unknown = [n for n in (output_names or ()) if n not in self.output_names]
        if unknown:
            raise QnnxError(f"unknown output(s) {', '.join(map(repr, unknown))}; the model's outputs are "
                            f"{', '.join(self.output_names)}")
        try:
            return self._impl.run(output_names, feeds)
        except Exception as e:
            root = _root_qnnx_error(e)
            if root is not None:
                raise root from None
            raise

    def _check_feeds(self, feeds: dict) -> None:
        """Every graph input fed (names, element type, rank and static dims as declared), nothing else."""
        graph = self.model.graph
        declared = {v.name: v for v in graph.inputs if v.name not in graph.initializers}
        extra = sorted(set(feeds) - {v.name for v in graph.inputs})
        missing = sorted(set(declared) - set(feeds))
        if extra or missing:
            detail = "; ".join(x for x in (f"missing {', '.join(missing)}" if missing else "",
                                           f"unknown {', '.join(extra)}" if extra else "") if x)
            raise QnnxError(f"feeds do not match the model inputs ({detail}); expected {', '.join(declared)}")
        for name, value in feeds.items():
            v = graph.inputs[[i.name for i in graph.inputs].index(name)]
            arr = np.asarray(value)
            if v.dtype is not None:
                want = v.dtype.numpy()
                if arr.dtype != want:
                    raise QnnxError(f"input {name!r} is {v.dtype.name}, fed {arr.dtype}")
            if v.shape is not None:
                dims = tuple(v.shape)
                if arr.ndim != len(dims) or any(isinstance(d, int) and d > 0 and d != n for d, n in zip(dims, arr.shape)):
                    shown = [d if isinstance(d, int) else "?" for d in dims]
                    raise QnnxError(f"input {name!r} has shape {shown}, fed {list(arr.shape)}")


def _as_qnnx_error(e: BaseException, what: str) -> QnnxError:
    root = _root_qnnx_error(e)
    if root is not None:
        return root
    return QnnxError(f"{what}: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
