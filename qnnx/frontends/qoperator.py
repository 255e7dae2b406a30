"""Import of ONNX Runtime's QOperator ops (domain ``com.microsoft``) into the qnnx dialect.

    QLinearAdd / QLinearMul (a, sa, za, b, sb, zb, sy, zy)  -> qnnx.add / qnnx.mul
    QLinearSigmoid / QLinearLeakyRelu (x, sx, zx, sy, zy)   -> qnnx.lut (table built offline)
    QLinearConcat (sy, zy, (x, sx, zx)...)                  -> qnnx.concat
    QLinearGlobalAveragePool / QLinearAveragePool           -> qnnx.global_avg_pool / qnnx.avg_pool
    QLinearSoftmax                                          -> qnnx.softmax
    QGemm (a, sa, za, b, sb, zb, c, sy, zy)                 -> qnnx.matmul (+ requantize)

The result lands in the same canonical form as a converted QDQ model, with the
arithmetic of ORT's kernels: float requantization, ties to even.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from qnnx import numerics, ops
from qnnx.dialect import DOMAIN
from qnnx.dtypes import int_type
from qnnx.errors import QnnxError
from qnnx.frontends.affine import AffineType
from qnnx.frontends.import_registry import (accumulator_like, attribute, import_rule, input_at, int32_zero_point,
                                            output_dtype, scale_product)
from qnnx.frontends.tables import lookup_table
from qnnx.ir import Builder, const_array

MS = "com.microsoft"
_FLOAT = dict(rounding="half_even", compute="float")


def _typed(v: ir.Value, dtype: str) -> ir.Value:
    v.type = ir.TensorType(int_type(dtype).onnx)
    return v


def _qparams(b: Builder, node: ir.Node, i: int, hint: str) -> list[ir.Value]:
    return [input_at(node, i), int32_zero_point(b, input_at(node, i + 1), hint)]


def _binary(node: ir.Node, b: Builder, op: str):
    out = output_dtype(node, input_at(node, 7), node.inputs[0])
    y = b.op(op, [node.inputs[0], *_qparams(b, node, 1, "a_zero_point"), node.inputs[3],
                  *_qparams(b, node, 4, "b_zero_point"), *_qparams(b, node, 6, "y_zero_point")], domain=DOMAIN,
             axis=1, out_dtype=out, **_FLOAT)
    return [_typed(y, out)]


@import_rule("QLinearAdd", MS)
def _qlinear_add(node, b):
    return _binary(node, b, "add")


@import_rule("QLinearMul", MS)
def _qlinear_mul(node, b):
    return _binary(node, b, "mul")


def _const_type(node: ir.Node, i: int, dtype_value: ir.Value) -> AffineType:
    s, z = const_array(input_at(node, i)), const_array(input_at(node, i + 1)) if input_at(node, i + 1) else 0
    if s is None or z is None:
        raise QnnxError(f"{node.op_type} needs constant qparams to build its lookup table")
    dtype = int_type(output_dtype(node, input_at(node, i + 1), dtype_value))
    names = ("X_scale", "X_zero_point") if i == 1 else ("Y_scale", "Y_zero_point")
    for p, name in ((s, names[0]), (z, names[1])):  # the table keeps no qparams to check later
        if np.asarray(p).size != 1:
            raise QnnxError(f"{name} must be per-tensor to build the lookup table, got shape {np.shape(p)}")
    numerics.check_scale(s, names[0])
    numerics.check_zero_point(z, dtype, names[1])
    return AffineType(np.asarray(s, np.float32), np.asarray(z), dtype)


def _unary_lut(node: ir.Node, b: Builder, op_type: str):
    """The lookup table of the elementwise function of ONNX op ``op_type`` (:mod:`qnnx.ops`)."""
    src = _const_type(node, 1, node.inputs[0])
    dst = _const_type(node, 3, node.inputs[0])
    attrs = {k: v.value for k, v in node.attributes.items()}
    table = lookup_table(ops.facts(op_type).function.numpy, src, dst, attrs)
    return [_typed(b.op("lut", [node.inputs[0], b.const(table, "table")], domain=DOMAIN), dst.dtype.name)]


@import_rule("QLinearSigmoid", MS)
def _qlinear_sigmoid(node, b):
    return _unary_lut(node, b, "Sigmoid")


@import_rule("QLinearLeakyRelu", MS)
def _qlinear_leaky_relu(node, b):
    return _unary_lut(node, b, "LeakyRelu")


@import_rule("QLinearConcat", MS)
def _qlinear_concat(node, b):
    out = output_dtype(node, input_at(node, 1), node.inputs[2])
    inputs = [node.inputs[0], int32_zero_point(b, input_at(node, 1), "y_zero_point")]
    for k in range(2, len(node.inputs), 3):
        inputs += [node.inputs[k], node.inputs[k + 1], int32_zero_point(b, input_at(node, k + 2), f"x{k}_zero_point")]
    y = b.op("concat", inputs, domain=DOMAIN, axis=attribute(node, "axis"), out_dtype=out, **_FLOAT)
    return [_typed(y, out)]


def _channels_first(node: ir.Node):
    if attribute(node, "channels_last", 0):
        raise QnnxError(f"{node.op_type} with channels_last=1 is not supported")


@import_rule("QLinearGlobalAveragePool", MS)
def _qlinear_global_average_pool(node, b):
    _channels_first(node)
    out = output_dtype(node, input_at(node, 4), node.inputs[0])
    y = b.op("global_avg_pool", [node.inputs[0], *_qparams(b, node, 1, "x_zero_point"),
                                 *_qparams(b, node, 3, "y_zero_point")], domain=DOMAIN, **_FLOAT)
    return [_typed(y, out)]


@import_rule("QLinearAveragePool", MS)
def _qlinear_average_pool(node, b):
    _channels_first(node)
    out = output_dtype(node, input_at(node, 4), node.inputs[0])
    attrs = {k: attribute(node, k) for k in ("auto_pad", "kernel_shape", "pads", "strides", "count_include_pad",
                                         "ceil_mode")}
    y = b.op("avg_pool", [node.inputs[0], *_qparams(b, node, 1, "x_zero_point"),
                          *_qparams(b, node, 3, "y_zero_point")], domain=DOMAIN, **attrs, **_FLOAT)
    return [_typed(y, out)]


@import_rule("QLinearSoftmax", MS)
def _qlinear_softmax(node, b):
    out = output_dtype(node, input_at(node, 4), node.inputs[0])
    axis = attribute(node, "axis", -1)
    if attribute(node, "opset", 13) < 13 and axis != -1:
        raise QnnxError("QLinearSoftmax with opset < 13 semantics (2-D coercion) on a non-last axis")
    y = b.op("softmax", [node.inputs[0], *_qparams(b, node, 1, "x_zero_point"),
                         *_qparams(b, node, 3, "y_zero_point")], domain=DOMAIN, axis=axis, out_dtype=out,
             rounding="half_even")
    return [_typed(y, out)]


@import_rule("QGemm", MS)
def _qgemm(node, b):
    if attribute(node, "alpha", 1.0) != 1.0 or attribute(node, "transA", 0):
        raise QnnxError("QGemm with alpha != 1 or transA is not supported")
    a, w = node.inputs[0], node.inputs[3]
    if attribute(node, "transB", 0):
        q = const_array(w)
        if q is None:
            raise QnnxError("QGemm with transB needs a constant B")
        w = b.const(np.ascontiguousarray(np.asarray(q).T), "B_transposed")
    bias = input_at(node, 6)
    acc = b.op("matmul", [a, *_qparams(b, node, 1, "a_zero_point"), w, *_qparams(b, node, 4, "b_zero_point"),
                          bias], domain=DOMAIN)
    accumulator_like(acc, node.outputs[0])
    if input_at(node, 7) is None:  # float output: dequantize the accumulator
        y = b.op("dequantize", [acc, scale_product(b, node.inputs[1], node.inputs[4], "acc_scale"),
                                b.const(np.int32(0), "acc_zero_point")], domain=DOMAIN, axis=-1)
        return [y]
    out = output_dtype(node, input_at(node, 8), a)
    y = b.op("requantize", [acc, scale_product(b, node.inputs[1], node.inputs[4], "acc_scale"),
                            b.const(np.int32(0), "acc_zero_point"), node.inputs[7],
                            int32_zero_point(b, input_at(node, 8), "y_zero_point")], domain=DOMAIN, axis=-1,
             out_dtype=out, **_FLOAT)
    return [_typed(y, out)]
