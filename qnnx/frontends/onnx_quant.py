"""Import of ONNX's standard quantization ops into the qnnx dialect.

Rules, one per op (``@import_rule``, :mod:`qnnx.frontends.import_registry`):

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

import numpy as np
import onnx_ir as ir

from qnnx.dialect import DOMAIN, VERSION
from qnnx.dialect.qparams import check_graph, check_node
from qnnx.dtypes import INT_TYPES, int_type, is_int_type
from qnnx.errors import QnnxError
# com.microsoft QOperator rules: importing the module registers them (it imports import_registry only).
from qnnx.frontends import qoperator  # noqa: F401
from qnnx.frontends.import_registry import (IMPORT_RULES, accumulator_like, attribute, dtype_of, import_rule,
                                            input_at, int32_zero_point, int_type_name, output_dtype,
                                            scale_product)
from qnnx.ir import Builder, load_model, replace_node


# --------------------------------------------------------------------------- rules


def _float_one(b: Builder, hint: str) -> ir.Value:
    return b.const(np.float32(1.0), hint)


@import_rule("QuantizeLinear")
def _quantize_linear(node: ir.Node, b: Builder):
    x, scale, zp = input_at(node, 0), input_at(node, 1), input_at(node, 2)
    out = int_type_name(dtype_of(zp)) if zp is not None else None
    if out is None and zp is None:
        given = attribute(node, "output_dtype", 0)
        out = int_type_name(ir.DataType(given)) if given else "uint8"
    if out is None:
        return None  # float8 / float4: not an affine integer type
    precision = attribute(node, "precision", 0)
    if precision:
        x = b.op("Cast", [x], to=precision, hint="x_precision")
        scale = b.op("Cast", [scale], to=precision, hint="scale_precision")
    y = b.op("quantize", [x, scale, int32_zero_point(b, zp, "zero_point")], domain=DOMAIN,
             axis=attribute(node, "axis", 1), block_size=attribute(node, "block_size", 0) or None, out_dtype=out,
             rounding="half_even")
    y.type = ir.TensorType(int_type(out).onnx)
    return [y]


@import_rule("DequantizeLinear")
def _dequantize_linear(node: ir.Node, b: Builder):
    q, scale, zp = input_at(node, 0), input_at(node, 1), input_at(node, 2)
    qtype = dtype_of(q)
    if qtype is not None and not is_int_type(qtype):
        return None
    y = b.op("dequantize", [q, scale, int32_zero_point(b, zp, "zero_point")], domain=DOMAIN,
             axis=attribute(node, "axis", 1), block_size=attribute(node, "block_size", 0) or None)
    want = attribute(node, "output_dtype", 0)
    if want and want != dtype_of(scale):
        y = b.op("Cast", [y], to=want, hint="y_output_dtype")
    return [y]


@import_rule("QLinearConv")
def _qlinear_conv(node: ir.Node, b: Builder):
    x, sx, zx, w, sw, zw, sy, zy = (input_at(node, i) for i in range(8))
    bias = input_at(node, 8)
    attrs = {k: attribute(node, k) for k in ("auto_pad", "kernel_shape", "pads", "strides", "dilations", "group")}
    acc = b.op("conv", [x, w, sx, int32_zero_point(b, zx, "x_zero_point"), sw,
                        int32_zero_point(b, zw, "w_zero_point"), bias], domain=DOMAIN, **attrs)
    accumulator_like(acc, node.outputs[0])
    y = b.op("requantize", [acc, scale_product(b, sx, sw, "acc_scale"), b.const(np.int32(0), "acc_zero_point"), sy,
                            int32_zero_point(b, zy, "y_zero_point")], domain=DOMAIN, axis=1,
             out_dtype=output_dtype(node, zy, x), rounding="half_even", compute="float")
    y.type = ir.TensorType(int_type(output_dtype(node, zy, x)).onnx)
    return [y]


@import_rule("QLinearMatMul")
def _qlinear_matmul(node: ir.Node, b: Builder):
    a, sa, za, bb, sb, zb, sy, zy = (input_at(node, i) for i in range(8))
    acc = b.op("matmul", [a, sa, int32_zero_point(b, za, "a_zero_point"), bb, sb,
                          int32_zero_point(b, zb, "b_zero_point")], domain=DOMAIN)
    accumulator_like(acc, node.outputs[0])
    y = b.op("requantize", [acc, scale_product(b, sa, sb, "acc_scale"), b.const(np.int32(0), "acc_zero_point"), sy,
                            int32_zero_point(b, zy, "y_zero_point")], domain=DOMAIN, axis=-1,
             out_dtype=output_dtype(node, zy, a), rounding="half_even", compute="float")
    return [y]


@import_rule("ConvInteger")
def _conv_integer(node: ir.Node, b: Builder):
    x, w, zx, zw = (input_at(node, i) for i in range(4))
    attrs = {k: attribute(node, k) for k in ("auto_pad", "kernel_shape", "pads", "strides", "dilations", "group")}
    acc = b.op("conv", [x, w, _float_one(b, "x_scale"), int32_zero_point(b, zx, "x_zero_point"),
                        _float_one(b, "w_scale"), int32_zero_point(b, zw, "w_zero_point")], domain=DOMAIN, **attrs)
    return [acc]


@import_rule("MatMulInteger")
def _matmul_integer(node: ir.Node, b: Builder):
    a, bb, za, zb = (input_at(node, i) for i in range(4))
    acc = b.op("matmul", [a, _float_one(b, "a_scale"), int32_zero_point(b, za, "a_zero_point"), bb,
                          _float_one(b, "b_scale"), int32_zero_point(b, zb, "b_zero_point")], domain=DOMAIN)
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
    y.type, y.shape = ir.TensorType(ir.DataType.UINT8), x.shape  # known without shape inference
    zp8 = b.op("Cast", [zp_float], to=ir.DataType.UINT8, hint="y_zero_point")
    return [y, scale, zp8]


# --------------------------------------------------------------------------- driver


def import_onnx(model, *, copy: bool = True) -> ir.Model:
    """Rewrite standard ONNX quantization ops into the qnnx dialect (a new ``ir.Model``); every qnnx
    op, imported or already there, keeps the qparams rules (:mod:`qnnx.dialect.qparams`)."""
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
