"""Fake quantization to integer: QDQ / QOperator models -> canonical qnnx integer form.

After ``import_onnx`` every QuantizeLinear/DequantizeLinear is a ``qnnx.quantize``/
``qnnx.dequantize``. One forward walk in topological order then keeps a map
from float values to the integer value and :class:`AffineType` they stand for:

    dequantize(q)                   -> q carries the dequantize's type
    float op(affine inputs)         -> integer op, by the op's rule (``@fq2i_rule``)
    quantize(affine x)              -> requantize(x) into the quantize's type, or x itself

A rule gets the node and a :class:`Context`, and returns one :class:`Affine`
per output or raises :class:`Unsupported` with the reason (recorded: the op
stays in float); the contract and the registry are :mod:`qnnx.frontends.fq2i_registry`.
Ops whose output qparams are not implied by their inputs (add, mul, concat,
pooling, lookup tables) take them from the single quantize consuming their
output. Dead float ops are removed at the end.

Canonical form (docs/canonical.md): conv/matmul produce int32 accumulators
always followed by a requantize; every integer op carries explicit qparams.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

from qnnx import numerics, ops
from qnnx.dialect import DOMAIN
from qnnx.dialect.qparams import check_graph
from qnnx.errors import QnnxError
# The rule modules: importing them registers their rules (they import fq2i_registry only, never this module).
from qnnx.frontends import fq2i_gelu, fq2i_layer_norm, fq2i_rules  # noqa: F401
from qnnx.frontends.affine import Affine, AffineType, affine_type_of_dequantize, requantize_to
from qnnx.frontends.fq2i_registry import FQ2I_RULES, Context, Unsupported, constant_qparams, quantize_type
from qnnx.frontends.onnx_quant import import_onnx
from qnnx.ir import Builder, const_array, drop_unused_initializers, load_model, replace_value


# Ops whose activation qparams are computed at run time: a dynamically quantized model.
DYNAMIC_QUANTIZERS = ("DynamicQuantizeLinear", "DynamicQuantizeLSTM", "DynamicQuantizeMatMul", "MatMulIntegerToFloat")


@dataclass
class Report:
    """What the conversion did: integer ops the model already had (imported op for op), integer ops made
    per float op type, every float op left between quantized values with the reason, and the dynamic
    quantizers (activation qparams computed at run time, which lowering cannot take)."""

    converted: dict[str, int] = field(default_factory=dict)
    left_in_float: list[tuple[str, str, str]] = field(default_factory=list)  # (node, op_type, reason)
    imported: dict[str, int] = field(default_factory=dict)  # source op type -> count (ConvInteger, QLinearConv...)
    dynamic: dict[str, int] = field(default_factory=dict)  # source op type -> count

    def summary(self) -> str:
        conv = ", ".join(f"{k} x{v}" for k, v in sorted(self.converted.items())) or "nothing"
        lines = []
        if self.imported:
            lines.append("integer ops imported as they are: " + ", ".join(f"{k} x{v}" for k, v in
                                                                         sorted(self.imported.items())))
        lines.append(f"converted to integer: {conv}")
        if self.dynamic:
            lines.append("dynamically quantized (" + ", ".join(f"{k} x{v}" for k, v in sorted(self.dynamic.items()))
                         + "): activation qparams are computed at run time; the canonical model keeps them as "
                         "run-time inputs of the integer ops, which `qnnx lower` cannot take (it needs constant "
                         "qparams)")
        if self.left_in_float:
            lines.append(f"left in float ({len(self.left_in_float)}):")
            lines += [f"  {name} ({op}): {why}" for name, op, why in self.left_in_float]
        else:
            lines.append("left in float: none")
        return "\n".join(lines)


def _typed(a: Affine) -> Affine:
    """Record the integer dtype on values the rules created, for later rules and lowering."""
    if a.value.dtype is None:
        a.value.type = ir.TensorType(a.type.dtype.onnx)
    return a


# --------------------------------------------------------------------------- driver


NUMERICS = ("onnxruntime", "qdq")


def convert(model, *, strict: bool = False, keep_float: frozenset[str] = frozenset(),
            numerics: str = "onnxruntime") -> tuple[ir.Model, Report]:
    """The canonical integer form of a QDQ / QOperator model, and what was converted.
    Nodes named in ``keep_float`` are never integerized (the user excluded them). ``numerics``:
    ``"onnxruntime"`` reproduces ONNX Runtime's execution of the model (its fused kernels' own float32
    recipes, ``compute="mlas"``), ``"qdq"`` keeps the QDQ graph's runtime-independent meaning."""
    if numerics not in NUMERICS:
        raise QnnxError(f"unknown numerics {numerics!r}; expected one of {', '.join(NUMERICS)}")
    source = _with_shapes(load_model(model))
    report_imported = {}
    for node in source.graph:
        if node.domain in ("", "ai.onnx", "com.microsoft") and node.op_type not in ("QuantizeLinear", "DequantizeLinear") \
                and (node.op_type.startswith("QLinear") or node.op_type.endswith("Integer") or node.op_type == "QGemm"
                     or node.op_type in DYNAMIC_QUANTIZERS):
            report_imported[node.op_type] = report_imported.get(node.op_type, 0) + 1
    m = import_onnx(source, copy=False)
    graph = m.graph
    env: dict[ir.Value, Affine] = {}
    report = Report(imported=report_imported,
                    dynamic={k: v for k, v in report_imported.items() if k in DYNAMIC_QUANTIZERS})
    reasons: dict[ir.Node, str] = {}
    for node in list(graph):
        if node.domain == DOMAIN and node.op_type == "dequantize":
            qp = constant_qparams(node)
            if qp is not None and node.inputs[0].dtype is not None:
                env[node.outputs[0]] = Affine(node.inputs[0], affine_type_of_dequantize(node, *qp))
            continue
        if node.domain == DOMAIN and node.op_type == "quantize":
            target = quantize_type(node)
            if target is not None and const_array(node.inputs[0]) is not None:
                _fold_constant_quantize(graph, node, target)
                continue
            src = env.get(node.inputs[0])
            if target is None or src is None:
                continue
            b = Builder(graph, node.name or "quantize")
            try:
                new = requantize_to(b, src, target)
            except ValueError as e:
                reasons[node] = str(e)
                continue
            graph.insert_before(node, b.nodes)
            new.shape = new.shape or node.outputs[0].shape or src.value.shape
            replace_value(graph, node.outputs[0], new)
            env[node.outputs[0]] = _typed(Affine(new, target))
            continue
        rule = FQ2I_RULES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if rule is None:
            continue
        if node.name in keep_float:
            reasons[node] = "excluded by the user"
            continue
        if not any(v in env for v in node.inputs if v is not None):
            reasons[node] = "inputs are not quantized with constant qparams"
            continue
        b = Builder(graph, node.name or node.op_type)
        try:
            outs = rule(node, Context(env, b, numerics))
        except Unsupported as e:
            reasons[node] = str(e)
            continue
        except QnnxError as e:
            reasons[node] = str(e)
            continue
        graph.insert_before(node, b.nodes)
        for old, new in zip(node.outputs, outs):
            if new is not None:
                if new.value.shape is None and new.value.producer() is not None:
                    if old.shape is not None:
                        new.value.shape = old.shape
                    elif not new.type.per_tensor and (rank := Context(env, b).rank(old)) is not None:
                        new.value.shape = ir.Shape([None] * rank)  # per-axis types need the rank later
                env[old] = _typed(new)
        report.converted[node.op_type] = report.converted.get(node.op_type, 0) + 1
        reasons[node] = "converted, but a float consumer still uses its float output"
    _remove_dead_nodes(graph)
    check_graph(graph)  # the canonical model keeps the qparams rules it was imported under
    _collect_float_leftovers(graph, reasons, report)
    if strict and report.left_in_float:
        names = "; ".join(f"{n} ({op}): {why}" for n, op, why in report.left_in_float)
        raise QnnxError(f"{len(report.left_in_float)} op(s) left in float inside quantized regions: {names}")
    return m, report


def _fold_constant_quantize(graph: ir.Graph, node: ir.Node, target: AffineType) -> None:
    """quantize(constant) is a constant: exporters leave weights as Q(float) -> DQ."""
    real = np.asarray(const_array(node.inputs[0]))
    q = numerics.quantize(real, target.scale, target.zero_point, out_dtype=target.dtype.name,
                          axis=target.axis if target.axis is not None else -1)
    b = Builder(graph, node.name or "quantize")
    folded = b.const(q, "folded")
    replace_value(graph, node.outputs[0], folded)


def _with_shapes(m: ir.Model) -> ir.Model:
    """Opset >= 13 (integer Clip/MaxPool and per-axis Q/DQ need it; converted with ONNX's version
    converter at this boundary) and ONNX shape inference on the incoming standard-ops model: rules
    need ranks and dtypes that exporters often leave out. Failing inference is not fatal: rules
    then say what is missing."""
    opset = m.opset_imports.get("", 13)
    if opset < 13:
        import onnx.version_converter

        try:
            m = ir.from_proto(onnx.version_converter.convert_version(ir.to_proto(m), 13))
        except Exception as e:  # C++ converter errors
            raise QnnxError(f"cannot convert opset {opset} to 13: {str(e).splitlines()[0][:200]}") from None
    logger = logging.getLogger("onnx_ir.passes.common.shape_inference")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # it logs a traceback when inference fails; that is not an error here
    try:
        return ShapeInferencePass(check_type=False, strict_mode=False, data_prop=True)(m).model
    except Exception:  # inference is best effort; the model itself was already validated by loading
        return m
    finally:
        logger.setLevel(level)


def _remove_dead_nodes(graph: ir.Graph) -> None:
    outputs = set(graph.outputs)
    for node in reversed(list(graph)):
        if all(not o.uses() and o not in outputs for o in node.outputs):
            graph.remove(node, safe=True)
    drop_unused_initializers(graph)


def _is_dequantized(v: ir.Value | None) -> bool:
    p = v.producer() if v is not None else None
    return p is not None and p.domain == DOMAIN and p.op_type == "dequantize"


def _feeds_quantize(v: ir.Value) -> bool:
    return any(u.node.domain == DOMAIN and u.node.op_type == "quantize" for u in v.uses())


def _collect_float_leftovers(graph: ir.Graph, reasons: dict, report: Report) -> None:
    """Float compute ops inside a quantized region: reachable from a dequantize through float ops,
    and reaching a quantize through float ops."""
    def is_q(n, op):
        return n.domain == DOMAIN and n.op_type == op

    nodes = [n for n in graph if n.domain != DOMAIN]
    after_dq: set[ir.Node] = set()
    for n in nodes:  # topological order: one forward sweep
        if ops.shape_only(n):
            continue  # a tensor's shape is metadata, not quantized data: shape arithmetic is not a region
        if any(_is_dequantized(v) or (v is not None and v.producer() in after_dq) for v in n.inputs):
            after_dq.add(n)
    before_q: set[ir.Node] = set()
    for n in reversed(nodes):
        for o in n.outputs:
            if any(is_q(u.node, "quantize") or u.node in before_q for u in o.uses()):
                before_q.add(n)
                break
    for node in nodes:
        floating = any(o.dtype is None or o.dtype.is_floating_point() for o in node.outputs)
        # (not the ops that compute no real values: shapes, constants, copies, casts)
        if node in after_dq and node in before_q and ops.computes(node) and floating:
            has_rule = node.domain in ("", "ai.onnx") and node.op_type in FQ2I_RULES
            why = reasons.get(node) or ("inputs are not quantized with constant qparams" if has_rule
                                        else "no integer rule for this op")
            report.left_in_float.append((node.name or node.op_type, node.op_type, why))


def from_qdq(model, *, strict: bool = False, numerics: str = "onnxruntime") -> onnx.ModelProto:
    """``model`` (QDQ or QOperator, path/ModelProto/ir.Model) in canonical qnnx integer form.

    With ``strict=True`` any float op left inside a quantized region is an error naming
    every such op; otherwise they are listed in the model's ``qnnx.left_in_float``
    metadata (and by :func:`convert`'s report). ``numerics``: see :func:`convert`.
    """
    m, report = convert(model, strict=strict, numerics=numerics)
    m.metadata_props["qnnx.left_in_float"] = "; ".join(f"{n} ({op}): {why}" for n, op, why in report.left_in_float)
    return ir.to_proto(m)
