"""Import of ONNX's standard quantization ops into the qnnx dialect.

Rules, one per op (``@import_rule``):

    QuantizeLinear(x, s, z)                  -> qnnx.quantize(x, s, int32(z))
    DequantizeLinear(q, s, z)                -> qnnx.dequantize(q, s, int32(z))
    QLinearConv(x, sx, zx, w, sw, zw, sy, zy, B)
                                             -> qnnx.requantize(qnnx.conv(...), sx*sw, 0, sy, zy)
    QLinearMatMul(a, sa, za, b, sb, zb, sy, zy)
                                             -> qnnx.requantize(qnnx.matmul(...), sa*sb, 0, sy, zy)
    ConvInteger(x, w, zx, zw)                -> qnnx.conv(x, w, 1, zx, 1, zw)
    MatMulInteger(a, b, za, zb)              -> qnnx.matmul(a, 1, za, b, 1, zb)
    DynamicQuantizeLinear(x)                 -> ONNX ops computing (scale, zp) + qnnx.quantize

QLinear* requantize in ``compute="float"`` with ``rounding="half_even"``, the
arithmetic ONNX specifies. Integer types only: float8/float4 Q/DQ stay as they
are (a rule returns ``None`` to leave a node alone).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx_ir as ir

from qnnx.dialect import DOMAIN, VERSION
from qnnx.dialect.qparams import check_graph, check_node
from qnnx.dtypes import INT_TYPES, int_type, is_int_type
from qnnx.errors import QnnxError
from qnnx.ir import Builder, const_array, replace_node

ImportRule = Callable[[ir.Node, Builder], "list[ir.Value] | None"]
IMPORT_RULES: dict[tuple[str, str], ImportRule] = {}


def import_rule(op_type: str, domain: str = ""):
    def wrap(fn: ImportRule) -> ImportRule:
        IMPORT_RULES[(domain, op_type)] = fn
        return fn

    return wrap


# --------------------------------------------------------------------------- helpers


def _input(node: ir.Node, i: int) -> ir.Value | None:
    return node.inputs[i] if i < len(node.inputs) else None


def _attr(node: ir.Node, name: str, default=None):
    a = node.attributes.get(name)
    return default if a is None else a.value


def _int32_zero_point(b: Builder, zp: ir.Value | None, hint: str) -> ir.Value:
    """Zero points are int32 in the dialect; a constant is converted offline, a dynamic one by Cast."""
    if zp is None:
        return b.const(np.int32(0), hint)
    arr = const_array(zp)
    if arr is not None:
        arr = np.asarray(arr)
        if arr.dtype.kind not in "iu" and not is_int_type(arr.dtype):
            raise QnnxError(f"zero point {zp.name!r} must be an integer tensor, got dtype {arr.dtype}")
        return b.const(arr.astype(np.int64).astype(np.int32), hint)
    return b.op("Cast", [zp], to=ir.DataType.INT32, hint=hint)


def _float_one(b: Builder, hint: str) -> ir.Value:
    return b.const(np.float32(1.0), hint)


def _dtype_of(value: ir.Value | None) -> ir.DataType | None:
    if value is None:
        return None
    if value.dtype is not None:
        return value.dtype
    producer = value.producer()
    if producer is not None and producer.op_type == "Cast" and producer.domain == "":
        return ir.DataType(producer.attributes["to"].value)
    arr = const_array(value)
    return ir.tensor(arr).dtype if arr is not None else None


def _int_name(dtype: ir.DataType | None) -> str | None:
    return int_type(dtype).name if dtype is not None and is_int_type(dtype) else None


def _accumulator_like(acc: ir.Value, out: ir.Value) -> ir.Value:
    """The int32 accumulator has the op output's shape: record it for later passes."""
    acc.type = ir.TensorType(ir.DataType.INT32)
    acc.shape = out.shape
    return acc


def _product(b: Builder, s1: ir.Value, s2: ir.Value, hint: str) -> ir.Value:
    """``s1 * s2`` in float32, folded when both are constants (same arithmetic either way)."""
    a1, a2 = const_array(s1), const_array(s2)
    if a1 is not None and a2 is not None:
        a1, a2 = np.asarray(a1), np.asarray(a2)
        if a1.size > 1 and a2.size > 1 and a1.shape != a2.shape:
            raise QnnxError(f"scales {s1.name!r} {a1.shape} and {s2.name!r} {a2.shape} do not multiply: one of them "
                            "must be per-tensor")
        return b.const((a1.astype(np.float32) * a2.astype(np.float32)).astype(np.float32), hint)
    return b.op("Mul", [s1, s2], hint=hint)


# --------------------------------------------------------------------------- rules


@import_rule("QuantizeLinear")
def _quantize_linear(node: ir.Node, b: Builder):
    x, scale, zp = _input(node, 0), _input(node, 1), _input(node, 2)
    out = _int_name(_dtype_of(zp)) if zp is not None else None
    if out is None and zp is None:
        given = _attr(node, "output_dtype", 0)
        out = _int_name(ir.DataType(given)) if given else "uint8"
    if out is None:
        return None  # float8 / float4: not an affine integer type
    precision = _attr(node, "precision", 0)
    if precision:
        x = b.op("Cast", [x], to=precision, hint="x_precision")
        scale = b.op("Cast", [scale], to=precision, hint="scale_precision")
    y = b.op("quantize", [x, scale, _int32_zero_point(b, zp, "zero_point")], domain=DOMAIN,
             axis=_attr(node, "axis", 1), block_size=_attr(node, "block_size", 0) or None, out_dtype=out,
             rounding="half_even")
    y.type = ir.TensorType(int_type(out).onnx)
    return [y]


@import_rule("DequantizeLinear")
def _dequantize_linear(node: ir.Node, b: Builder):
    q, scale, zp = _input(node, 0), _input(node, 1), _input(node, 2)
    qtype = _dtype_of(q)
    if qtype is not None and not is_int_type(qtype):
        return None
    y = b.op("dequantize", [q, scale, _int32_zero_point(b, zp, "zero_point")], domain=DOMAIN,
             axis=_attr(node, "axis", 1), block_size=_attr(node, "block_size", 0) or None)
    want = _attr(node, "output_dtype", 0)
    if want and want != _dtype_of(scale):
        y = b.op("Cast", [y], to=want, hint="y_output_dtype")
    return [y]


def _output_dtype(node: ir.Node, zp: ir.Value | None, fallback: ir.Value) -> str:
    name = _int_name(_dtype_of(zp)) or _int_name(_dtype_of(fallback))
    if name is None:
        raise QnnxError(f"{node.op_type} output type is unknown (untyped zero point)")
    if name not in ("int8", "uint8"):  # QLinear* / com.microsoft QOperator outputs (the y zero point's type)
        raise QnnxError(f"{node.op_type} outputs int8 or uint8 (the type of its output zero point), got {name}")
    return name


@import_rule("QLinearConv")
def _qlinear_conv(node: ir.Node, b: Builder):
    x, sx, zx, w, sw, zw, sy, zy = (_input(node, i) for i in range(8))
    bias = _input(node, 8)
    attrs = {k: _attr(node, k) for k in ("auto_pad", "kernel_shape", "pads", "strides", "dilations", "group")}
    acc = b.op("conv", [x, w, sx, _int32_zero_point(b, zx, "x_zero_point"), sw,
                        _int32_zero_point(b, zw, "w_zero_point"), bias], domain=DOMAIN, **attrs)
    _accumulator_like(acc, node.outputs[0])
    y = b.op("requantize", [acc, _product(b, sx, sw, "acc_scale"), b.const(np.int32(0), "acc_zero_point"), sy,
                            _int32_zero_point(b, zy, "y_zero_point")], domain=DOMAIN, axis=1,
             out_dtype=_output_dtype(node, zy, x), rounding="half_even", compute="float")
    y.type = ir.TensorType(int_type(_output_dtype(node, zy, x)).onnx)
    return [y]


@import_rule("QLinearMatMul")
def _qlinear_matmul(node: ir.Node, b: Builder):
    a, sa, za, bb, sb, zb, sy, zy = (_input(node, i) for i in range(8))
    acc = b.op("matmul", [a, sa, _int32_zero_point(b, za, "a_zero_point"), bb, sb,
                          _int32_zero_point(b, zb, "b_zero_point")], domain=DOMAIN)
    _accumulator_like(acc, node.outputs[0])
    y = b.op("requantize", [acc, _product(b, sa, sb, "acc_scale"), b.const(np.int32(0), "acc_zero_point"), sy,
                            _int32_zero_point(b, zy, "y_zero_point")], domain=DOMAIN, axis=-1,
             out_dtype=_output_dtype(node, zy, a), rounding="half_even", compute="float")
    return [y]


@import_rule("ConvInteger")
def _conv_integer(node: ir.Node, b: Builder):
    x, w, zx, zw = (_input(node, i) for i in range(4))
    attrs = {k: _attr(node, k) for k in ("auto_pad", "kernel_shape", "pads", "strides", "dilations", "group")}
    acc = b.op("conv", [x, w, _float_one(b, "x_scale"), _int32_zero_point(b, zx, "x_zero_point"),
                        _float_one(b, "w_scale"), _int32_zero_point(b, zw, "w_zero_point")], domain=DOMAIN, **attrs)
    return [acc]


@import_rule("MatMulInteger")
def _matmul_integer(node: ir.Node, b: Builder):
    a, bb, za, zb = (_input(node, i) for i in range(4))
    acc = b.op("matmul", [a, _float_one(b, "a_scale"), _int32_zero_point(b, za, "a_zero_point"), bb,
                          _float_one(b, "b_scale"), _int32_zero_point(b, zb, "b_zero_point")], domain=DOMAIN)
    return [acc]


@import_rule("DynamicQuantizeLinear")
def _dynamic_quantize_linear(node: ir.Node, b: Builder):
    """ONNX's function body for the (scale, zero point); an all-zero input gets scale 1/255
    (range 1) instead of a zero scale, as the reference implementation does."""
    x = node.inputs[0]
    zero, qmax = b.const(np.float32(0), "zero"), b.const(np.float32(255), "qmax")
    lo = b.op("Min", [b.op("ReduceMin", [x], keepdims=0), zero], hint="min")
    hi = b.op("Max", [b.op("ReduceMax", [x], keepdims=0), zero], hint="max")
    span = b.op("Sub", [hi, lo], hint="range")
    span = b.op("Where", [b.op("Equal", [span, zero]), b.const(np.float32(1), "one"), span], hint="range_nz")
    scale = b.op("Div", [span, qmax], hint="y_scale")
    zp_float = b.op("Round", [b.op("Clip", [b.op("Sub", [zero, b.op("Div", [lo, scale])]), zero, qmax])],
                    hint="zp_float")
    zp32 = b.op("Cast", [zp_float], to=ir.DataType.INT32, hint="zp_int32")
    y = b.op("quantize", [x, scale, zp32], domain=DOMAIN, axis=1, out_dtype="uint8", rounding="half_even")
    zp8 = b.op("Cast", [zp_float], to=ir.DataType.UINT8, hint="y_zero_point")
    return [y, scale, zp8]


# --------------------------------------------------------------------------- driver


def import_onnx(model, *, copy: bool = True) -> ir.Model:
    """Rewrite standard ONNX quantization ops into the qnnx dialect (a new ``ir.Model``); every qnnx
    op, imported or already there, keeps the qparams rules (:mod:`qnnx.dialect.qparams`)."""
    from qnnx.ir import load_model

    m = load_model(model, copy=copy)
    graph = m.graph
    check_graph(graph)  # qnnx ops already in the file
    changed = False
    for node in list(graph):
        rule = IMPORT_RULES.get(("" if node.domain == "ai.onnx" else node.domain, node.op_type))
        if rule is None:
            continue
        b = Builder(graph, node.name or node.op_type)
        try:
            new_values = rule(node, b)
            for new in b.nodes:  # the qparams rules, on the op the ONNX one became
                if new.domain == DOMAIN:
                    try:
                        check_node(new)
                    except QnnxError as e:
                        raise e.at(f"qnnx.{new.op_type}") from None
        except QnnxError as e:
            raise e.at(f"node {node.name or node.op_type!r} ({node.op_type})") from None
        if new_values is None:
            continue
        replace_node(graph, node, b.nodes, new_values)
        changed = True
    if changed or DOMAIN not in m.opset_imports:
        m.opset_imports[DOMAIN] = VERSION
        graph.opset_imports[DOMAIN] = VERSION
    return m


__all__ = ["import_onnx", "import_rule", "IMPORT_RULES", "INT_TYPES"]

# com.microsoft QOperator rules register on import.
import qnnx.frontends.qoperator  # noqa: E402,F401
