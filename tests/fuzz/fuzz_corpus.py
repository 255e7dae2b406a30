"""The bad-input corpus: broken and odd models, bad qparams for every quantization op and dtype,
bad calibration data, bad paths and options. Generated deterministically (no binary files in the
repository); ``test_fuzz.py`` runs every case through the commands and the Python API.

A :class:`Case` writes its files into a directory and says whether it is bad (every command must
refuse it: exit 1, one line naming the problem) or merely odd (any command may refuse it, never with
an internal error, and what it writes must run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

# ONNX element type, numpy type, qmin, qmax of every integer type qnnx quantizes to
DTYPES = {
    "int2": (T.INT2, ml_dtypes.int2, -2, 1), "uint2": (T.UINT2, ml_dtypes.uint2, 0, 3),
    "int4": (T.INT4, ml_dtypes.int4, -8, 7), "uint4": (T.UINT4, ml_dtypes.uint4, 0, 15),
    "int8": (T.INT8, np.int8, -128, 127), "uint8": (T.UINT8, np.uint8, 0, 255),
    "int16": (T.INT16, np.int16, -32768, 32767), "uint16": (T.UINT16, np.uint16, 0, 65535),
    "int32": (T.INT32, np.int32, -(1 << 31), (1 << 31) - 1),
}
QUANTIZE_DTYPES = ("int2", "uint2", "int4", "uint4", "int8", "uint8", "int16", "uint16")  # ONNX Q outputs


@dataclass(frozen=True)
class Case:
    category: str
    name: str
    bad: bool
    build: Callable[[Path], dict] = field(compare=False)  # writes files; returns {"model": path, ...}

    @property
    def id(self) -> str:
        return f"{self.category}/{self.name}"


# --------------------------------------------------------------------------- model building


def _model(nodes, inputs, outputs, inits=(), *, opset=21, qnnx_domain=False, ms=False, ir_version=10):
    g = helper.make_graph(nodes, "fuzz", inputs, outputs, list(inits))
    ops = [helper.make_opsetid("", opset)]
    if qnnx_domain:
        ops.append(helper.make_opsetid("qnnx", 1))
    if ms:
        ops.append(helper.make_opsetid("com.microsoft", 1))
    return helper.make_model(g, opset_imports=ops, ir_version=ir_version)


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def _int_init(name, dtype, values):
    """An initializer of any integer dtype (sub-byte ones included) from Python ints."""
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64).astype(DTYPES[dtype][1]), name)


def _weights(dtype, shape):
    _, _, lo, hi = DTYPES[dtype]
    n = int(np.prod(shape))
    return (np.arange(n) % (min(hi, 7) - max(lo, -8) + 1) + max(lo, -8)).reshape(shape)


def _save(model: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


def _model_case(category, name, bad, make: Callable[[], onnx.ModelProto]) -> Case:
    return Case(category, name, bad, lambda d: {"model": _save(make(), d / "model.onnx")})


# --------------------------------------------------------------------------- valid bases, by op and dtype
# Each returns a ModelProto; keyword arguments replace one qparam (scale/zp arrays, axis, block size).

def dq_weight(dtype="int8", *, scale=None, zp=None, axis=None, block=None, opset=None):
    """w (dtype, 4 x 6 constant) -> DequantizeLinear -> MatMul(x[2, 4], w): a weight-only model."""
    w = _int_init("w", dtype, _weights(dtype, (4, 6)))
    scale = np.float32(0.05) if scale is None else scale
    zp = np.asarray(0) if zp is None else zp
    inits = [w, _init("w_scale", scale), _zp_init("w_zero_point", dtype, zp)]
    attrs = {} if axis is None else {"axis": axis}
    if block is not None:
        attrs["block_size"] = block
    nodes = [helper.make_node("DequantizeLinear", ["w", "w_scale", "w_zero_point"], ["wf"], name="dq_w", **attrs),
             helper.make_node("MatMul", ["x", "wf"], ["y"], name="matmul")]
    return _model(nodes, [_vi("x", T.FLOAT, [2, 4])], [_vi("y", T.FLOAT, [2, 6])], inits,
                  opset=opset or (25 if dtype in ("int2", "uint2") else 21))


def _zp_init(name, dtype, zp):
    """A zero point initializer of ``dtype``, or of the zp array's own dtype when it cannot hold the value
    (a zero point out of range only exists as a wider type: that is the fault)."""
    zp = np.asarray(zp)
    if zp.dtype.kind == "f":
        return numpy_helper.from_array(zp.astype(np.float32), name)
    _, np_type, lo, hi = DTYPES[dtype]
    if zp.size and (zp.min() < lo or zp.max() > hi):
        return numpy_helper.from_array(zp.astype(np.int32), name)
    return numpy_helper.from_array(zp.astype(np.int64).astype(np_type), name)


def q_dq_activation(dtype="uint8", *, scale=None, zp=None, axis=None, block=None):
    """x float [1, 4, 3, 3] -> QuantizeLinear -> DequantizeLinear -> Relu -> y."""
    scale = np.float32(0.02) if scale is None else scale
    zp = np.asarray(0) if zp is None else zp
    inits = [_init("s", scale), _zp_init("z", dtype, zp)]
    attrs = {} if axis is None else {"axis": axis}
    if block is not None:
        attrs["block_size"] = block
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q", **attrs),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="dq", **attrs),
             helper.make_node("Relu", ["d"], ["y"], name="relu")]
    return _model(nodes, [_vi("x", T.FLOAT, [1, 4, 3, 3])], [_vi("y", T.FLOAT, [1, 4, 3, 3])], inits,
                  opset=25 if dtype in ("int2", "uint2") else 21)


def qlinear_conv(xdtype="uint8", *, x_scale=None, x_zp=None, w_scale=None, w_zp=None, y_scale=None, y_zp=None,
                 wdtype="int8", bias=True):
    """QLinearConv: x [1, 2, 5, 5] (xdtype), w [3, 2, 3, 3] (wdtype, per output channel), y xdtype."""
    xz = (128 if xdtype == "uint8" else 0) if x_zp is None else x_zp
    inits = [_init("x_scale", np.float32(0.1) if x_scale is None else x_scale), _zp_init("x_zero_point", xdtype, xz),
             _int_init("w", wdtype, _weights(wdtype, (3, 2, 3, 3))),
             _init("w_scale", np.array([0.01, 0.02, 0.03], np.float32) if w_scale is None else w_scale),
             _zp_init("w_zero_point", wdtype, np.zeros(3, np.int64) if w_zp is None else w_zp),
             _init("y_scale", np.float32(0.05) if y_scale is None else y_scale),
             _zp_init("y_zero_point", xdtype, xz if y_zp is None else y_zp)]
    ins = ["x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point"]
    if bias:
        inits.append(_init("b", np.array([100, -100, 5], np.int32)))
        ins.append("b")
    node = helper.make_node("QLinearConv", ins, ["y"], name="qconv", pads=[1, 1, 1, 1])
    elem = DTYPES[xdtype][0]
    return _model([node], [_vi("x", elem, [1, 2, 5, 5])], [_vi("y", elem, [1, 3, 5, 5])], inits)


def qlinear_matmul(dtype="uint8", *, a_scale=None, a_zp=None, b_scale=None, b_zp=None, y_scale=None, y_zp=None):
    """QLinearMatMul: a [2, 4] x b [4, 3] constant, per-tensor."""
    z = 128 if dtype == "uint8" else 0
    inits = [_init("a_scale", np.float32(0.1) if a_scale is None else a_scale),
             _zp_init("a_zero_point", dtype, z if a_zp is None else a_zp),
             _int_init("b", dtype, _weights(dtype, (4, 3)) + (8 if dtype == "uint8" else 0)),
             _init("b_scale", np.float32(0.02) if b_scale is None else b_scale),
             _zp_init("b_zero_point", dtype, z if b_zp is None else b_zp),
             _init("y_scale", np.float32(0.3) if y_scale is None else y_scale),
             _zp_init("y_zero_point", dtype, z if y_zp is None else y_zp)]
    node = helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point",
                                              "y_scale", "y_zero_point"], ["y"], name="qmatmul")
    elem = DTYPES[dtype][0]
    return _model([node], [_vi("a", elem, [2, 4])], [_vi("y", elem, [2, 3])], inits)


def conv_integer(dtype="uint8", *, x_zp=None, w_zp=None):
    """ConvInteger: x [1, 2, 4, 4] uint8/int8, w [2, 2, 3, 3] int8 -> int32."""
    inits = [_int_init("w", "int8", _weights("int8", (2, 2, 3, 3))),
             _zp_init("x_zero_point", dtype, 3 if x_zp is None else x_zp),
             _zp_init("w_zero_point", "int8", 0 if w_zp is None else w_zp)]
    node = helper.make_node("ConvInteger", ["x", "w", "x_zero_point", "w_zero_point"], ["y"], name="convint")
    return _model([node], [_vi("x", DTYPES[dtype][0], [1, 2, 4, 4])], [_vi("y", T.INT32, [1, 2, 2, 2])], inits)


def matmul_integer(dtype="uint8", *, a_zp=None, b_zp=None):
    inits = [_int_init("b", "int8", _weights("int8", (4, 3))),
             _zp_init("a_zero_point", dtype, 5 if a_zp is None else a_zp),
             _zp_init("b_zero_point", "int8", 0 if b_zp is None else b_zp)]
    node = helper.make_node("MatMulInteger", ["a", "b", "a_zero_point", "b_zero_point"], ["y"], name="mmint")
    return _model([node], [_vi("a", DTYPES[dtype][0], [2, 4])], [_vi("y", T.INT32, [2, 3])], inits)


def qlinear_add(dtype="uint8", *, a_scale=None, a_zp=None, b_scale=None, b_zp=None, y_scale=None, y_zp=None,
                op="QLinearAdd"):
    """com.microsoft QLinearAdd (or QLinearMul) of two [1, 4] inputs."""
    z = 128 if dtype == "uint8" else 0
    inits = [_init("a_scale", np.float32(0.1) if a_scale is None else a_scale),
             _zp_init("a_zero_point", dtype, z if a_zp is None else a_zp),
             _init("b_scale", np.float32(0.2) if b_scale is None else b_scale),
             _zp_init("b_zero_point", dtype, z if b_zp is None else b_zp),
             _init("y_scale", np.float32(0.3) if y_scale is None else y_scale),
             _zp_init("y_zero_point", dtype, z if y_zp is None else y_zp)]
    node = helper.make_node(op, ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point",
                                 "y_scale", "y_zero_point"], ["y"], name=op.lower(), domain="com.microsoft")
    elem = DTYPES[dtype][0]
    return _model([node], [_vi("a", elem, [1, 4]), _vi("b", elem, [1, 4])], [_vi("y", elem, [1, 4])], inits,
                  ms=True)


def ms_unary(op="QLinearSigmoid", dtype="uint8", *, x_scale=None, x_zp=None, y_scale=None, y_zp=None):
    """A com.microsoft QOperator with (X, X_scale, X_zero_point, Y_scale, Y_zero_point) on X [1, 2, 4, 4]."""
    z = 128 if dtype == "uint8" else 0
    inits = [_init("x_scale", np.float32(0.1) if x_scale is None else x_scale),
             _zp_init("x_zero_point", dtype, z if x_zp is None else x_zp),
             _init("y_scale", np.float32(1 / 255) if y_scale is None else y_scale),
             _zp_init("y_zero_point", dtype, (0 if dtype == "uint8" else -128) if y_zp is None else y_zp)]
    attrs = {"QLinearSoftmax": {"opset": 13, "axis": -1}, "QLinearAveragePool": {"kernel_shape": [2, 2]},
             "QLinearLeakyRelu": {"alpha": 0.1}}.get(op, {})
    out = {"QLinearGlobalAveragePool": [1, 2, 1, 1], "QLinearAveragePool": [1, 2, 3, 3]}.get(op, [1, 2, 4, 4])
    node = helper.make_node(op, ["x", "x_scale", "x_zero_point", "y_scale", "y_zero_point"], ["y"], name=op.lower(),
                            domain="com.microsoft", **attrs)
    elem = DTYPES[dtype][0]
    return _model([node], [_vi("x", elem, [1, 2, 4, 4])], [_vi("y", elem, out)], inits, ms=True)


def qgemm(*, a_scale=None, b_scale=None, y_scale=None, y_zp=None, float_output=False):
    """com.microsoft QGemm: A [2, 4] uint8, B [4, 3] int8 constant (per column scales), int32 bias."""
    inits = [_init("a_scale", np.float32(0.1) if a_scale is None else a_scale), _zp_init("a_zero_point", "uint8", 128),
             _int_init("b", "int8", _weights("int8", (4, 3))),
             _init("b_scale", np.array([0.01, 0.02, 0.03], F32) if b_scale is None else b_scale),
             _zp_init("b_zero_point", "int8", np.zeros(3, np.int64)), _init("c", np.array([1, 2, 3], np.int32))]
    ins = ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "c"]
    if not float_output:
        inits += [_init("y_scale", np.float32(0.05) if y_scale is None else y_scale),
                  _zp_init("y_zero_point", "uint8", 128 if y_zp is None else y_zp)]
        ins += ["y_scale", "y_zero_point"]
    node = helper.make_node("QGemm", ins, ["y"], name="qgemm", domain="com.microsoft")
    return _model([node], [_vi("a", T.UINT8, [2, 4])], [_vi("y", T.FLOAT if float_output else T.UINT8, [2, 3])],
                  inits, ms=True)


def qlinear_concat(*, y_scale=None, x_scale=None, x_zp=None):
    """com.microsoft QLinearConcat of a [1, 2] and b [1, 3] (uint8) along axis 1."""
    inits = [_init("y_scale", np.float32(0.1) if y_scale is None else y_scale), _zp_init("y_zero_point", "uint8", 128),
             _init("a_scale", np.float32(0.1) if x_scale is None else x_scale),
             _zp_init("a_zero_point", "uint8", 128 if x_zp is None else x_zp),
             _init("b_scale", np.float32(0.2)), _zp_init("b_zero_point", "uint8", 100)]
    node = helper.make_node("QLinearConcat", ["y_scale", "y_zero_point", "a", "a_scale", "a_zero_point", "b",
                                              "b_scale", "b_zero_point"], ["y"], name="qconcat", axis=1,
                            domain="com.microsoft")
    return _model([node], [_vi("a", T.UINT8, [1, 2]), _vi("b", T.UINT8, [1, 3])], [_vi("y", T.UINT8, [1, 5])], inits,
                  ms=True)


def qnnx_matmul(*, a_scale=None, b_scale=None, b_zp=None, adtype="uint8"):
    """qnnx.matmul: a [2, 4] (adtype) x b [4, 3] int8 constant, per-column b qparams."""
    inits = [_init("as", np.float32(0.1) if a_scale is None else a_scale), _init("az", np.int32(3)),
             _int_init("b", "int8", _weights("int8", (4, 3))),
             _init("bs", np.array([0.1, 0.2, 0.3], F32) if b_scale is None else b_scale),
             _init("bz", np.zeros(3, np.int32) if b_zp is None else b_zp)]
    node = helper.make_node("matmul", ["a", "as", "az", "b", "bs", "bz"], ["y"], name="matmul", domain="qnnx")
    return _qnnx([node], [_vi("a", DTYPES[adtype][0], [2, 4])], [_vi("y", T.INT32, [2, 3])], inits)


def qnnx_avg_pool(*, x_scale=None, y_zp=None, x_zp=None):
    inits = [_init("xs", np.float32(0.1) if x_scale is None else x_scale),
             _init("xz", np.int32(0) if x_zp is None else x_zp), _init("ys", np.float32(0.1)),
             _init("yz", np.int32(0) if y_zp is None else y_zp)]
    node = helper.make_node("avg_pool", ["x", "xs", "xz", "ys", "yz"], ["y"], name="pool", domain="qnnx",
                            kernel_shape=[2, 2])
    return _qnnx([node], [_vi("x", T.INT8, [1, 3, 4, 4])], [_vi("y", T.INT8, [1, 3, 3, 3])], inits)


def qnnx_conv_transpose(*, w_scale=None, w_zp=None, group=1):
    """qnnx.conv_transpose: x [1, 2, 3, 3] uint8, w [2, 3 / group, 2, 2] int8."""
    m = 3 if group == 1 else 1
    inits = [_int_init("w", "int8", _weights("int8", (2, m, 2, 2))), _init("xs", np.float32(0.1)),
             _init("xz", np.int32(5)), _init("ws", np.full(m * group, 0.1, F32) if w_scale is None else w_scale),
             _init("wz", np.zeros(m * group, np.int32) if w_zp is None else w_zp)]
    node = helper.make_node("conv_transpose", ["x", "w", "xs", "xz", "ws", "wz"], ["y"], name="convt", domain="qnnx",
                            group=group)
    return _qnnx([node], [_vi("x", T.UINT8, [1, 2, 3, 3])], [_vi("y", T.INT32, [1, m * group, 4, 4])], inits)


def qnnx_dequantize(dtype="int4", *, scale=None, zp=None, axis=None):
    """qnnx.dequantize of a constant x [4, 6] of dtype (a weight written directly in the dialect)."""
    inits = [_int_init("w", dtype, _weights(dtype, (4, 6))), _init("s", np.float32(0.1) if scale is None else scale),
             _init("z", np.int32(0) if zp is None else zp)]
    attrs = {} if axis is None else {"axis": axis}
    nodes = [helper.make_node("dequantize", ["w", "s", "z"], ["wf"], name="dq", domain="qnnx", **attrs),
             helper.make_node("MatMul", ["x", "wf"], ["y"], name="matmul")]
    return _qnnx(nodes, [_vi("x", T.FLOAT, [2, 4])], [_vi("y", T.FLOAT, [2, 6])], inits)


def dynamic_quantize() -> onnx.ModelProto:
    """DynamicQuantizeLinear -> MatMulInteger: run-time qparams only (nothing to break but the graph)."""
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"], name="dql"),
             helper.make_node("MatMulInteger", ["q", "b", "z", "bz"], ["y"], name="mmint")]
    inits = [_int_init("b", "uint8", _weights("uint8", (4, 3))), _zp_init("bz", "uint8", 2)]
    return _model(nodes, [_vi("x", T.FLOAT, [2, 4])], [_vi("y", T.INT32, [2, 3])], inits)


def qnnx_simulated(op="simulated_quantize", *, scale=None, zp=None):
    inits = [_init("s", np.float32(0.1) if scale is None else scale), _init("z", np.float32(3) if zp is None else zp)]
    attrs = {"out_dtype": "int8"} if op == "simulated_quantize" else {}
    node = helper.make_node(op, ["x", "s", "z"], ["y"], name="sim", domain="qnnx", **attrs)
    return _qnnx([node], [_vi("x", T.FLOAT, [2, 4])], [_vi("y", T.FLOAT, [2, 4])], inits)


# qnnx dialect ops, written as such in the file (a model `qnnx import` or `lower` reads as is)

def _qnnx(nodes, inputs, outputs, inits):
    return _model(nodes, inputs, outputs, inits, qnnx_domain=True)


def qnnx_requantize(in_dtype="int32", out_dtype="int8", *, si=None, zi=None, so=None, zo=None, axis=None,
                    drop=()):
    """qnnx.requantize of x [1, 3, 2] (in_dtype) to out_dtype; per-axis when a scale has 3 values."""
    inits = [_init("si", np.float32(0.01) if si is None else si), _init("zi", np.int32(0) if zi is None else zi),
             _init("so", np.float32(0.1) if so is None else so), _init("zo", np.int32(0) if zo is None else zo)]
    attrs = {"out_dtype": out_dtype, "axis": 1 if axis is None else axis}
    for k in drop:
        attrs.pop(k)
    node = helper.make_node("requantize", ["x", "si", "zi", "so", "zo"], ["y"], name="rq", domain="qnnx", **attrs)
    return _qnnx([node], [_vi("x", DTYPES[in_dtype][0], [1, 3, 2])], [_vi("y", DTYPES[out_dtype][0], [1, 3, 2])],
                 inits)


def qnnx_quantize(out_dtype="int8", *, scale=None, zp=None, axis=None, block=None, drop=()):
    """qnnx.quantize of x float [2, 4] to out_dtype."""
    inits = [_init("s", np.float32(0.1) if scale is None else scale), _init("z", np.int32(0) if zp is None else zp)]
    attrs = {"out_dtype": out_dtype}
    if axis is not None:
        attrs["axis"] = axis
    if block is not None:
        attrs["block_size"] = block
    for k in drop:
        attrs.pop(k)
    node = helper.make_node("quantize", ["x", "s", "z"], ["y"], name="quant", domain="qnnx", **attrs)
    return _qnnx([node], [_vi("x", T.FLOAT, [2, 4])], [_vi("y", DTYPES[out_dtype][0], [2, 4])], inits)


def qnnx_conv(xdtype="uint8", wdtype="int8", *, x_scale=None, x_zp=None, w_scale=None, w_zp=None, bias=None):
    """qnnx.conv: x [1, 2, 4, 4], w [3, 2, 3, 3] -> int32 accumulator."""
    w = _weights(wdtype, (3, 2, 3, 3))
    inits = [_int_init("w", wdtype, w), _init("xs", np.float32(0.1) if x_scale is None else x_scale),
             _init("xz", np.int32(0) if x_zp is None else x_zp),
             _init("ws", np.array([0.1, 0.2, 0.3], np.float32) if w_scale is None else w_scale),
             _init("wz", np.zeros(3, np.int32) if w_zp is None else w_zp)]
    ins = ["x", "w", "xs", "xz", "ws", "wz"]
    if bias is not None:
        inits.append(_init("b", bias))
        ins.append("b")
    node = helper.make_node("conv", ins, ["y"], name="conv", domain="qnnx")
    return _qnnx([node], [_vi("x", DTYPES[xdtype][0], [1, 2, 4, 4])], [_vi("y", T.INT32, [1, 3, 2, 2])], inits)


def qnnx_add(dtype="int8", *, a_scale=None, b_scale=None, y_scale=None, y_zp=None, axis=None, op="add"):
    """qnnx.add/sub/mul of a [1, 3, 2] and b [1, 3, 2]."""
    inits = [_init("as", np.float32(0.1) if a_scale is None else a_scale), _init("az", np.int32(0)),
             _init("bs", np.float32(0.2) if b_scale is None else b_scale), _init("bz", np.int32(0)),
             _init("ys", np.float32(0.3) if y_scale is None else y_scale),
             _init("yz", np.int32(0) if y_zp is None else y_zp)]
    attrs = {"out_dtype": dtype}
    if axis is not None:
        attrs["axis"] = axis
    node = helper.make_node(op, ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"], name=op, domain="qnnx",
                            **attrs)
    elem = DTYPES[dtype][0]
    return _qnnx([node], [_vi("a", elem, [1, 3, 2]), _vi("b", elem, [1, 3, 2])], [_vi("y", elem, [1, 3, 2])], inits)


def qnnx_unary(op, dtype="int8", *, x_scale=None, x_zp=None, y_scale=None, y_zp=None):
    """qnnx softmax / global_avg_pool / variance / layer_norm on x [1, 3, 2, 2]."""
    inits = [_init("xs", np.float32(0.1) if x_scale is None else x_scale),
             _init("xz", np.int32(0) if x_zp is None else x_zp),
             _init("ys", np.float32(1 / 256 if op == "softmax" else 0.1) if y_scale is None else y_scale),
             _init("yz", np.int32(-128 if op == "softmax" else 0) if y_zp is None else y_zp)]
    attrs = {} if op == "global_avg_pool" else {"out_dtype": dtype}
    node = helper.make_node(op, ["x", "xs", "xz", "ys", "yz"], ["y"], name=op, domain="qnnx", **attrs)
    elem = DTYPES[dtype][0]
    out = [1, 3, 1, 1] if op == "global_avg_pool" else [1, 3, 2, 1] if op == "variance" else [1, 3, 2, 2]
    return _qnnx([node], [_vi("x", elem, [1, 3, 2, 2])], [_vi("y", elem, out)], inits)


def qnnx_concat(dtype="int8", *, y_scale=None, x1_zp=None, inputs=None):
    """qnnx.concat of a [1, 2] and b [1, 3] along axis 1 (``inputs``: replace the input list)."""
    inits = [_init("ys", np.float32(0.1) if y_scale is None else y_scale), _init("yz", np.int32(0)),
             _init("s1", np.float32(0.1)), _init("z1", np.int32(0) if x1_zp is None else x1_zp),
             _init("s2", np.float32(0.2)), _init("z2", np.int32(0))]
    ins = inputs or ["ys", "yz", "a", "s1", "z1", "b", "s2", "z2"]
    node = helper.make_node("concat", ins, ["y"], name="concat", domain="qnnx", axis=1, out_dtype=dtype)
    elem = DTYPES[dtype][0]
    return _qnnx([node], [_vi("a", elem, [1, 2]), _vi("b", elem, [1, 3])], [_vi("y", elem, [1, 5])], inits)


def qnnx_lut(dtype="int8", *, entries=None):
    n = 1 << int(dtype.lstrip("uint"))
    table = np.arange(entries if entries is not None else n, dtype=np.int64) % 100
    node = helper.make_node("lut", ["x", "t"], ["y"], name="lut", domain="qnnx")
    return _qnnx([node], [_vi("x", DTYPES[dtype][0], [2, 3])], [_vi("y", T.INT8, [2, 3])],
                 [_init("t", table.astype(np.int8))])


# --------------------------------------------------------------------------- qparams faults

F32 = np.float32
SCALE_FAULTS = {"zero": F32(0.0), "negative": F32(-0.1), "nan": F32("nan"), "inf": F32("inf"),
                "denormal": F32(1e-42)}


def qparams_cases() -> list[Case]:
    cases = []

    def add(name, make, bad=True):
        cases.append(_model_case("qparams", name, bad, make))

    # every integer dtype: a valid weight model, and each scale / zero-point fault on it
    for dt in DTYPES:
        _, _, lo, hi = DTYPES[dt]
        add(f"DequantizeLinear/{dt}/valid", lambda dt=dt: dq_weight(dt), bad=False)
        for fault, v in SCALE_FAULTS.items():
            add(f"DequantizeLinear/{dt}/scale_{fault}", lambda dt=dt, v=v: dq_weight(dt, scale=v))
        if dt != "int32":
            add(f"DequantizeLinear/{dt}/zp_above", lambda dt=dt, hi=hi: dq_weight(dt, zp=np.int64(hi + 1)))
            add(f"DequantizeLinear/{dt}/zp_below", lambda dt=dt, lo=lo: dq_weight(dt, zp=np.int64(lo - 1)))
        add(f"DequantizeLinear/{dt}/per_axis_length", lambda dt=dt: dq_weight(
            dt, scale=np.full(5, 0.05, F32), zp=np.zeros(5, np.int64), axis=1))
        add(f"DequantizeLinear/{dt}/axis_out_of_range", lambda dt=dt: dq_weight(
            dt, scale=np.full(6, 0.05, F32), zp=np.zeros(6, np.int64), axis=4))
        add(f"DequantizeLinear/{dt}/zp_float", lambda dt=dt: dq_weight(dt, zp=np.float32(0.5)))
        if dt in ("int4", "uint4", "int8", "uint8", "int16", "uint16"):  # blocked: scale [2, 6], blocks of 2 rows
            blocked = dict(scale=np.full((2, 6), 0.05, F32), zp=np.zeros((2, 6), np.int64), axis=0)
            add(f"DequantizeLinear/{dt}/blocked_valid", lambda dt=dt, b=blocked: dq_weight(dt, block=2, **b),
                bad=False)
            add(f"DequantizeLinear/{dt}/block_size_0", lambda dt=dt, b=blocked: dq_weight(dt, block=0, **b))
            add(f"DequantizeLinear/{dt}/block_size_negative", lambda dt=dt, b=blocked: dq_weight(dt, block=-2, **b))
            add(f"DequantizeLinear/{dt}/block_not_matching", lambda dt=dt, b=blocked: dq_weight(dt, block=1, **b))
            add(f"DequantizeLinear/{dt}/blocked_zero_scale", lambda dt=dt: dq_weight(
                dt, block=2, scale=np.array([[0.05] * 6, [0.05] * 5 + [0.0]], F32), zp=np.zeros((2, 6), np.int64),
                axis=0))
    for dt in QUANTIZE_DTYPES:
        _, _, lo, hi = DTYPES[dt]
        add(f"QuantizeLinear/{dt}/valid", lambda dt=dt: q_dq_activation(dt), bad=False)
        for fault, v in SCALE_FAULTS.items():
            add(f"QuantizeLinear/{dt}/scale_{fault}", lambda dt=dt, v=v: q_dq_activation(dt, scale=v))
        add(f"QuantizeLinear/{dt}/per_axis_length", lambda dt=dt: q_dq_activation(
            dt, scale=np.full(3, 0.02, F32), zp=np.zeros(3, np.int64), axis=1))
        add(f"QuantizeLinear/{dt}/axis_out_of_range", lambda dt=dt: q_dq_activation(
            dt, scale=np.full(4, 0.02, F32), zp=np.zeros(4, np.int64), axis=-7))
    # int32 activations: a QuantizeLinear to int32 (ONNX's Q has no int32 output; odd, not necessarily bad)
    add("QuantizeLinear/int32/activation", lambda: q_dq_activation("int32"), bad=False)

    for xd in ("uint8", "int8"):
        _, _, lo, hi = DTYPES[xd]
        add(f"QLinearConv/{xd}/valid", lambda xd=xd: qlinear_conv(xd), bad=False)
        for q in ("x_scale", "w_scale", "y_scale"):
            for fault, v in SCALE_FAULTS.items():
                v = np.full(3, v, F32) if q == "w_scale" else v
                add(f"QLinearConv/{xd}/{q}_{fault}", lambda xd=xd, q=q, v=v: qlinear_conv(xd, **{q: v}))
        add(f"QLinearConv/{xd}/x_zp_out_of_range", lambda xd=xd, hi=hi: qlinear_conv(xd, x_zp=np.int64(hi + 72)))
        add(f"QLinearConv/{xd}/y_zp_out_of_range", lambda xd=xd, lo=lo: qlinear_conv(xd, y_zp=np.int64(lo - 1)))
        add(f"QLinearConv/{xd}/w_zp_out_of_range", lambda xd=xd: qlinear_conv(xd, w_zp=np.full(3, 200)))
        add(f"QLinearConv/{xd}/w_scale_length", lambda xd=xd: qlinear_conv(xd, w_scale=np.full(4, 0.01, F32),
                                                                          w_zp=np.zeros(4, np.int64)))
        add(f"QLinearConv/{xd}/w_scale_2d", lambda xd=xd: qlinear_conv(xd, w_scale=np.full((3, 1), 0.01, F32)))
        add(f"QLinearConv/{xd}/x_zp_float", lambda xd=xd: qlinear_conv(xd, x_zp=np.float32(3.0)))
        add(f"QLinearConv/{xd}/x_scale_per_axis", lambda xd=xd: qlinear_conv(xd, x_scale=np.full(2, 0.1, F32)))
    add("QLinearConv/int4_weights/valid", lambda: qlinear_conv("uint8", wdtype="int4"), bad=False)
    add("QLinearConv/int16_weights", lambda: qlinear_conv("uint8", wdtype="int16"))
    for dt in ("uint8", "int8"):
        _, _, lo, hi = DTYPES[dt]
        add(f"QLinearMatMul/{dt}/valid", lambda dt=dt: qlinear_matmul(dt), bad=False)
        for q in ("a_scale", "b_scale", "y_scale"):
            for fault, v in SCALE_FAULTS.items():
                add(f"QLinearMatMul/{dt}/{q}_{fault}", lambda dt=dt, q=q, v=v: qlinear_matmul(dt, **{q: v}))
        add(f"QLinearMatMul/{dt}/a_zp_out_of_range", lambda dt=dt, hi=hi: qlinear_matmul(dt, a_zp=np.int64(hi + 1)))
        add(f"QLinearMatMul/{dt}/b_scale_length", lambda dt=dt: qlinear_matmul(dt, b_scale=np.full(5, 0.02, F32)))
        add(f"ConvInteger/{dt}/valid", lambda dt=dt: conv_integer(dt), bad=False)
        add(f"ConvInteger/{dt}/x_zp_out_of_range", lambda dt=dt, hi=hi: conv_integer(dt, x_zp=np.int64(hi + 1)))
        add(f"ConvInteger/{dt}/x_zp_float", lambda dt=dt: conv_integer(dt, x_zp=np.float32(1.5)))
        add(f"MatMulInteger/{dt}/valid", lambda dt=dt: matmul_integer(dt), bad=False)
        add(f"MatMulInteger/{dt}/a_zp_out_of_range", lambda dt=dt, lo=lo: matmul_integer(dt, a_zp=np.int64(lo - 1)))
        add(f"QLinearAdd/{dt}/valid", lambda dt=dt: qlinear_add(dt), bad=False)
        for q in ("a_scale", "b_scale", "y_scale"):
            for fault in ("zero", "nan", "denormal"):
                add(f"QLinearAdd/{dt}/{q}_{fault}", lambda dt=dt, q=q, v=SCALE_FAULTS[fault]: qlinear_add(dt, **{q: v}))
        add(f"QLinearAdd/{dt}/y_zp_out_of_range", lambda dt=dt, hi=hi: qlinear_add(dt, y_zp=np.int64(hi + 1)))

    for op in ("QLinearSigmoid", "QLinearLeakyRelu", "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearSoftmax"):
        for dt in ("uint8", "int8"):
            add(f"{op}/{dt}/valid", lambda op=op, dt=dt: ms_unary(op, dt), bad=False)
            for q in ("x_scale", "y_scale"):
                for fault in ("zero", "nan", "denormal"):
                    add(f"{op}/{dt}/{q}_{fault}", lambda op=op, dt=dt, q=q, v=SCALE_FAULTS[fault]: ms_unary(
                        op, dt, **{q: v}))
            add(f"{op}/{dt}/y_zp_out_of_range", lambda op=op, dt=dt: ms_unary(op, dt, y_zp=np.int64(256)))
            add(f"{op}/{dt}/x_scale_3_values_for_2_channels",
                lambda op=op, dt=dt: ms_unary(op, dt, x_scale=np.full(3, 0.1, F32)))
    for dt in ("uint8", "int8"):
        add(f"QLinearMul/{dt}/valid", lambda dt=dt: qlinear_add(dt, op="QLinearMul"), bad=False)
        add(f"QLinearMul/{dt}/y_scale_inf", lambda dt=dt: qlinear_add(dt, op="QLinearMul", y_scale=F32("inf")))
        add(f"QLinearMul/{dt}/a_zp_out_of_range", lambda dt=dt: qlinear_add(dt, op="QLinearMul", a_zp=np.int64(-200)))
    add("QGemm/valid", lambda: qgemm(), bad=False)
    add("QGemm/float_output/valid", lambda: qgemm(float_output=True), bad=False)
    for q in ("a_scale", "y_scale"):
        for fault, v in SCALE_FAULTS.items():
            add(f"QGemm/{q}_{fault}", lambda q=q, v=v: qgemm(**{q: v}))
    add("QGemm/b_scale_length", lambda: qgemm(b_scale=np.full(4, 0.01, F32)))
    add("QGemm/b_scale_zero_float_output", lambda: qgemm(b_scale=np.array([0.01, 0, 0.03], F32), float_output=True))
    add("QGemm/y_zp_out_of_range", lambda: qgemm(y_zp=np.int64(-1)))
    add("QLinearConcat/valid", lambda: qlinear_concat(), bad=False)
    add("QLinearConcat/y_scale_zero", lambda: qlinear_concat(y_scale=F32(0)))
    add("QLinearConcat/x_scale_nan", lambda: qlinear_concat(x_scale=F32("nan")))
    add("QLinearConcat/x_zp_out_of_range", lambda: qlinear_concat(x_zp=np.int64(256)))

    # the qnnx dialect, written directly in the file
    for i, o in (("int32", "int8"), ("int32", "uint8"), ("int16", "int4"), ("int8", "uint2"), ("uint8", "int16")):
        _, _, lo, hi = DTYPES[o]
        _, _, ilo, ihi = DTYPES[i]
        add(f"qnnx.requantize/{i}-{o}/valid", lambda i=i, o=o: qnnx_requantize(i, o), bad=False)
        for fault, v in SCALE_FAULTS.items():
            add(f"qnnx.requantize/{i}-{o}/output_scale_{fault}", lambda i=i, o=o, v=v: qnnx_requantize(i, o, so=v))
        add(f"qnnx.requantize/{i}-{o}/output_zp_out_of_range",
            lambda i=i, o=o, hi=hi: qnnx_requantize(i, o, zo=np.int32(hi + 1)))
        if i != "int32":
            add(f"qnnx.requantize/{i}-{o}/input_zp_out_of_range",
                lambda i=i, o=o, ilo=ilo: qnnx_requantize(i, o, zi=np.int32(ilo - 1)))
        add(f"qnnx.requantize/{i}-{o}/per_axis_length", lambda i=i, o=o: qnnx_requantize(
            i, o, so=np.full(2, 0.1, F32), zo=np.zeros(2, np.int32)))
        add(f"qnnx.requantize/{i}-{o}/axis_out_of_range", lambda i=i, o=o: qnnx_requantize(
            i, o, so=np.full(3, 0.1, F32), zo=np.zeros(3, np.int32), axis=3))
    add("qnnx.requantize/no_out_dtype", lambda: qnnx_requantize(drop=("out_dtype",)))
    add("qnnx.requantize/scale_int", lambda: qnnx_requantize(si=np.int32(1)))
    add("qnnx.requantize/zp_float", lambda: qnnx_requantize(zi=np.float32(0.5)))
    add("qnnx.requantize/scale_zp_shapes_differ", lambda: qnnx_requantize(
        so=np.full(3, 0.1, F32), zo=np.zeros(1, np.int32).repeat(3)[:2]))
    for dt in ("int4", "int8", "uint16", "int32"):
        add(f"qnnx.quantize/{dt}/valid", lambda dt=dt: qnnx_quantize(dt), bad=False)
        add(f"qnnx.quantize/{dt}/scale_denormal", lambda dt=dt: qnnx_quantize(dt, scale=F32(1e-40)))
        add(f"qnnx.quantize/{dt}/zp_out_of_range", lambda dt=dt: qnnx_quantize(dt, zp=np.int32(DTYPES[dt][3] + 1)
                                                                             if dt != "int32" else np.int64(1 << 40)))
    add("qnnx.quantize/no_out_dtype", lambda: qnnx_quantize(drop=("out_dtype",)))
    add("qnnx.quantize/blocked_valid", lambda: qnnx_quantize(scale=np.full((1, 4), 0.1, F32),
                                                             zp=np.zeros((1, 4), np.int32), axis=0, block=2),
        bad=False)
    add("qnnx.quantize/block_negative", lambda: qnnx_quantize(scale=np.full((1, 4), 0.1, F32),
                                                              zp=np.zeros((1, 4), np.int32), axis=0, block=-1))
    add("qnnx.quantize/blocked_wrong_shape", lambda: qnnx_quantize(scale=np.full((3, 4), 0.1, F32),
                                                                   zp=np.zeros((3, 4), np.int32), axis=0, block=2))
    for xd, wd in (("uint8", "int8"), ("int8", "int4"), ("int16", "int8"), ("uint16", "uint4")):
        add(f"qnnx.conv/{xd}-{wd}/valid", lambda xd=xd, wd=wd: qnnx_conv(xd, wd), bad=False)
        add(f"qnnx.conv/{xd}-{wd}/w_scale_nan", lambda xd=xd, wd=wd: qnnx_conv(
            xd, wd, w_scale=np.array([0.1, np.nan, 0.3], F32)))
        add(f"qnnx.conv/{xd}-{wd}/w_zp_out_of_range", lambda xd=xd, wd=wd: qnnx_conv(
            xd, wd, w_zp=np.full(3, DTYPES[wd][3] + 1, np.int32)))
        add(f"qnnx.conv/{xd}-{wd}/w_scale_length", lambda xd=xd, wd=wd: qnnx_conv(
            xd, wd, w_scale=np.full(2, 0.1, F32), w_zp=np.zeros(2, np.int32)))
    add("qnnx.conv/x_zp_float", lambda: qnnx_conv(x_zp=np.float32(3.0)))
    add("qnnx.conv/x_zp_per_axis", lambda: qnnx_conv(x_zp=np.zeros(2, np.int32)))
    add("qnnx.conv/int32_activation", lambda: qnnx_conv("int32"))
    add("qnnx.conv/int16_weights", lambda: qnnx_conv("uint8", "int16"))
    add("qnnx.conv/bias_int8", lambda: qnnx_conv(bias=np.zeros(3, np.int8)))
    for op in ("add", "sub", "mul"):
        add(f"qnnx.{op}/valid", lambda op=op: qnnx_add(op=op), bad=False)
        add(f"qnnx.{op}/y_scale_inf", lambda op=op: qnnx_add(op=op, y_scale=F32("inf")))
        add(f"qnnx.{op}/y_zp_out_of_range", lambda op=op: qnnx_add(op=op, y_zp=np.int32(300)))
        add(f"qnnx.{op}/a_scale_length", lambda op=op: qnnx_add(op=op, a_scale=np.full(4, 0.1, F32)))
        add(f"qnnx.{op}/int32_operands", lambda op=op: qnnx_add("int32", op=op))
    for op in ("softmax", "global_avg_pool", "variance", "layer_norm"):
        add(f"qnnx.{op}/valid", lambda op=op: qnnx_unary(op), bad=False)
        add(f"qnnx.{op}/x_scale_zero", lambda op=op: qnnx_unary(op, x_scale=F32(0)))
        add(f"qnnx.{op}/y_zp_out_of_range", lambda op=op: qnnx_unary(op, y_zp=np.int32(-129)))
        add(f"qnnx.{op}/int32_input", lambda op=op: qnnx_unary(op, "int32"))
    add("qnnx.softmax/x_scale_per_axis", lambda: qnnx_unary("softmax", x_scale=np.full(2, 0.1, F32)))
    add("qnnx.matmul/valid", lambda: qnnx_matmul(), bad=False)
    add("qnnx.matmul/b_scale_length", lambda: qnnx_matmul(b_scale=np.full(4, 0.1, F32)))
    add("qnnx.matmul/b_zp_out_of_range", lambda: qnnx_matmul(b_zp=np.full(3, 128, np.int32)))
    add("qnnx.matmul/a_scale_negative", lambda: qnnx_matmul(a_scale=F32(-1)))
    add("qnnx.matmul/int32_a", lambda: qnnx_matmul(adtype="int32"))
    add("qnnx.avg_pool/valid", lambda: qnnx_avg_pool(), bad=False)
    add("qnnx.avg_pool/x_scale_nan", lambda: qnnx_avg_pool(x_scale=F32("nan")))
    add("qnnx.avg_pool/y_zp_out_of_range", lambda: qnnx_avg_pool(y_zp=np.int32(128)))
    add("qnnx.avg_pool/x_zp_per_axis_length", lambda: qnnx_avg_pool(x_zp=np.zeros(4, np.int32)))
    add("qnnx.conv_transpose/valid", lambda: qnnx_conv_transpose(), bad=False)
    add("qnnx.conv_transpose/w_scale_length", lambda: qnnx_conv_transpose(w_scale=np.full(2, 0.1, F32)))
    add("qnnx.conv_transpose/w_zp_out_of_range", lambda: qnnx_conv_transpose(w_zp=np.full(3, 300, np.int32)))
    add("qnnx.conv_transpose/per_channel_with_groups", lambda: qnnx_conv_transpose(
        group=2, w_scale=np.array([0.1, 0.2], F32), w_zp=np.zeros(2, np.int32)))
    for op in ("simulated_quantize", "simulated_dequantize"):
        add(f"qnnx.{op}/valid", lambda op=op: qnnx_simulated(op), bad=False)
        add(f"qnnx.{op}/scale_zero", lambda op=op: qnnx_simulated(op, scale=F32(0)))
        add(f"qnnx.{op}/zp_fractional", lambda op=op: qnnx_simulated(op, zp=F32(0.5)))
    for dt in ("int2", "uint4", "int8", "int32"):
        add(f"qnnx.dequantize/{dt}/valid", lambda dt=dt: qnnx_dequantize(dt), bad=False)
        add(f"qnnx.dequantize/{dt}/zp_out_of_range", lambda dt=dt: qnnx_dequantize(
            dt, zp=np.int64(DTYPES[dt][2] - 1) if dt != "int32" else np.int64(-(1 << 40))))
        add(f"qnnx.dequantize/{dt}/per_axis_length", lambda dt=dt: qnnx_dequantize(
            dt, scale=np.full(5, 0.1, F32), zp=np.zeros(5, np.int32), axis=1))
        add(f"qnnx.dequantize/{dt}/scale_inf", lambda dt=dt: qnnx_dequantize(dt, scale=F32("inf")))
    add("DynamicQuantizeLinear/valid", dynamic_quantize, bad=False)
    add("qnnx.concat/valid", lambda: qnnx_concat(), bad=False)
    add("qnnx.concat/y_scale_negative", lambda: qnnx_concat(y_scale=F32(-1)))
    add("qnnx.concat/input_zp_out_of_range", lambda: qnnx_concat(x1_zp=np.int32(128)))
    add("qnnx.concat/broken_triple", lambda: qnnx_concat(inputs=["ys", "yz", "a", "s1", "z1", "b", "s2"]))
    add("qnnx.lut/valid", lambda: qnnx_lut(), bad=False)
    add("qnnx.lut/int32_input", lambda: qnnx_lut("int32", entries=4))
    return cases


# --------------------------------------------------------------------------- broken and odd models


def _relu_model(**kw):
    return _model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [_vi("x", T.FLOAT, [1, 4])],
                  [_vi("y", T.FLOAT, [1, 4])], **kw)


def _matmul_with(w: onnx.TensorProto, **kw):
    return _model([helper.make_node("MatMul", ["x", w.name], ["y"], name="mm")], [_vi("x", T.FLOAT, [1, 4])],
                  [_vi("y", T.FLOAT, [1, 4])], [w], **kw)


def _external(directory: Path, *, data: bytes | None, length: int | None = None, location="w.bin") -> dict:
    """A MatMul model whose weight lives in an external file (``data`` None: the file is missing)."""
    w = onnx.TensorProto(name="w", data_type=T.FLOAT, dims=[4, 4], data_location=T.EXTERNAL)
    for k, v in (("location", location), ("offset", "0"), *((("length", str(length)),) if length is not None else ())):
        entry = w.external_data.add()
        entry.key, entry.value = k, v
    if data is not None:
        (directory / location).write_bytes(data)
    return {"model": _save(_matmul_with(w), directory / "model.onnx")}


def _short_int4() -> onnx.ModelProto:
    m = dq_weight("int4")
    w = next(t for t in m.graph.initializer if t.name == "w")
    w.raw_data = w.raw_data[:5]  # 24 int4 values need 12 bytes
    return m


def _unsorted() -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["a"], ["y"], name="second"), helper.make_node("Neg", ["x"], ["a"], name="first")]
    return _model(nodes, [_vi("x", T.FLOAT, [1, 4])], [_vi("y", T.FLOAT, [1, 4])])


def _if_model() -> onnx.ModelProto:
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [_vi("t", T.FLOAT, [1, 4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e", T.FLOAT, [1, 4])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
             helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)]
    return _model(nodes, [_vi("x", T.FLOAT, [1, 4])], [_vi("y", T.FLOAT, [1, 4])], [_init("zero", F32(0))])


def _if_undefined() -> onnx.ModelProto:
    m = _if_model()
    m.graph.node[2].attribute[0].g.node[0].input[0] = "nowhere"
    return m


def model_cases() -> list[Case]:
    rm = _relu_model()
    raw = rm.SerializeToString()

    def files(name, data: bytes, bad=True):
        return Case("model", name, bad, lambda d: {"model": _write(d / "model.onnx", data)})

    def model(name, make, bad=True):
        return _model_case("model", name, bad, make)

    dup = _model([helper.make_node("Relu", ["x"], ["y"], name="a"), helper.make_node("Neg", ["x"], ["y"], name="b")],
                 [_vi("x", T.FLOAT, [1, 4])], [_vi("y", T.FLOAT, [1, 4])])
    short = numpy_helper.from_array(np.ones((2, 2), F32), "w")
    short.dims[:] = [4, 4]
    typed_short = onnx.TensorProto(name="w", data_type=T.FLOAT, dims=[4, 4], float_data=[1.0] * 15)
    negative = numpy_helper.from_array(np.ones((4, 4), F32), "w")
    negative.dims[:] = [4, -4]
    no_type = numpy_helper.from_array(np.ones((4, 4), F32), "w")
    no_type.data_type = 0
    const_short = onnx.TensorProto(name="c", data_type=T.FLOAT, dims=[8], float_data=[1.0] * 4)
    return [
        Case("model", "missing_file", True, lambda d: {"model": d / "absent.onnx"}),
        Case("model", "directory", True, lambda d: {"model": _mkdir(d / "dir.onnx")}),
        files("empty_file", b""),
        files("garbage", b"\x00\xffnot a model at all" * 10),
        files("truncated", raw[: len(raw) // 2]),
        files("text", b"ir_version: 8\n"),
        model("no_graph", lambda: onnx.ModelProto(ir_version=8)),
        model("node_input_undefined", lambda: _model([helper.make_node("Relu", ["nope"], ["y"], name="relu")],
                                                     [_vi("x", T.FLOAT, [1, 4])], [_vi("y", T.FLOAT, [1, 4])])),
        model("graph_output_undefined", lambda: _model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                                                       [_vi("x", T.FLOAT, [1, 4])], [_vi("z", T.FLOAT, [1, 4])])),
        model("cycle", lambda: _model([helper.make_node("Add", ["x", "b"], ["a"], name="n1"),
                                       helper.make_node("Relu", ["a"], ["b"], name="n2")],
                                      [_vi("x", T.FLOAT, [1, 4])], [_vi("b", T.FLOAT, [1, 4])])),
        model("self_loop", lambda: _model([helper.make_node("Add", ["x", "y"], ["y"], name="loop")],
                                          [_vi("x", T.FLOAT, [1, 4])], [_vi("y", T.FLOAT, [1, 4])])),
        model("value_produced_twice", lambda: dup),
        model("initializer_dims_larger_than_data", lambda: _matmul_with(short)),
        model("typed_data_short", lambda: _matmul_with(typed_short)),
        model("negative_dim", lambda: _matmul_with(negative)),
        model("initializer_without_type", lambda: _matmul_with(no_type)),
        model("constant_dims_larger_than_data", lambda: _model(
            [helper.make_node("Constant", [], ["c"], value=const_short, name="const"),
             helper.make_node("Add", ["x", "c"], ["y"], name="add")],
            [_vi("x", T.FLOAT, [8])], [_vi("y", T.FLOAT, [8])])),
        model("short_int4_data", _short_int4),
        model("undeclared_domain", lambda: _model([helper.make_node("Foo", ["x"], ["y"], domain="custom.ops")],
                                                  [_vi("x", T.FLOAT, [1, 4])], [_vi("y", T.FLOAT, [1, 4])])),
        model("qnnx_op_undeclared_domain", lambda: _model(
            [helper.make_node("requantize", ["x", "s", "z", "s", "z"], ["y"], domain="qnnx", out_dtype="int8")],
            [_vi("x", T.INT32, [3])], [_vi("y", T.INT8, [3])], [_init("s", F32(0.1)), _init("z", np.int32(0))])),
        _model_case("qparams", "qnnx/unknown_qnnx_op", True, lambda: _model([helper.make_node("frobnicate", ["x"], ["y"], domain="qnnx")],
                                                [_vi("x", T.INT8, [3])], [_vi("y", T.INT8, [3])], qnnx_domain=True)),
        _model_case("qparams", "qnnx/qnnx_unknown_attribute", True, lambda: _model(
            [helper.make_node("requantize", ["x", "s", "z", "s", "z"], ["y"], domain="qnnx", out_dtype="int8",
                              colour="blue")],
            [_vi("x", T.INT32, [3])], [_vi("y", T.INT8, [3])], [_init("s", F32(0.1)), _init("z", np.int32(0))],
            qnnx_domain=True)),
        _model_case("qparams", "qnnx/qnnx_missing_input", True, lambda: _model(
            [helper.make_node("requantize", ["x", "s", "z"], ["y"], domain="qnnx", out_dtype="int8")],
            [_vi("x", T.INT32, [3])], [_vi("y", T.INT8, [3])], [_init("s", F32(0.1)), _init("z", np.int32(0))],
            qnnx_domain=True)),
        model("subgraph_input_undefined", _if_undefined),
        Case("model", "external_data_missing", True, lambda d: _external(d, data=None)),
        Case("model", "external_data_short", True, lambda d: _external(d, data=b"\0" * 40)),
        Case("model", "external_data_length_past_end", True, lambda d: _external(d, data=b"\0" * 64, length=128)),
        # odd but valid: must work, or be refused cleanly
        model("valid_relu", lambda: rm, bad=False),
        model("nodes_out_of_order", _unsorted, bad=False),
        model("if_subgraph", _if_model, bad=False),
        model("string_input", lambda: _model([helper.make_node("Identity", ["x"], ["y"], name="id")],
                                             [_vi("x", T.STRING, [1])], [_vi("y", T.STRING, [1])]), bad=False),
        model("opset_11", lambda: _relu_model(opset=11, ir_version=6), bad=False),
        model("no_nodes", lambda: _model([], [_vi("x", T.FLOAT, [1, 4])], [_vi("x", T.FLOAT, [1, 4])]), bad=False),
        model("dynamic_batch", lambda: _model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                                              [_vi("x", T.FLOAT, ["N", 4])], [_vi("y", T.FLOAT, ["N", 4])]),
              bad=False),
        Case("model", "external_data_valid", False, lambda d: _external(
            d, data=np.arange(16, dtype=F32).tobytes())),
    ]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


# --------------------------------------------------------------------------- calibration data


def float_model() -> onnx.ModelProto:
    """x [1, 3, 6, 6] -> Conv -> Relu -> GlobalAveragePool -> y: a small float model to quantize."""
    rng = np.random.default_rng(0)
    inits = [_init("w", (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(F32)), _init("b", np.full(4, 0.1, F32))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["y"], name="gap")]
    return _model(nodes, [_vi("x", T.FLOAT, [1, 3, 6, 6])], [_vi("y", T.FLOAT, [1, 4, 1, 1])], inits, opset=17,
                  ir_version=9)


def _sample(i=0, shape=(1, 3, 6, 6), dtype=F32):
    return np.random.default_rng(i).standard_normal(shape).astype(dtype)


def calibration_dir(d: Path, files: dict[str, object]) -> dict:
    """float.onnx and a calibration directory holding ``files`` (name -> array, bytes or None for a
    subdirectory)."""
    model = _save(float_model(), d / "float.onnx")
    calib = d / "calib"
    calib.mkdir()
    for name, v in files.items():
        if v is None:
            (calib / name).mkdir()
        elif isinstance(v, bytes):
            (calib / name).write_bytes(v)
        elif isinstance(v, dict):
            np.savez(calib / name, **v)
        else:
            np.save(calib / name, v, allow_pickle=True)
    return {"model": model, "calib": calib}


def calibration_cases() -> list[Case]:
    good = {f"{i}.npy": _sample(i) for i in range(2)}

    def case(name, files, bad=True):
        return Case("calibration", name, bad, lambda d, f=files: calibration_dir(d, f))

    return [
        case("empty_directory", {}),
        case("only_subdirectories", {"sub": None}),
        case("wrong_shape", {"0.npy": _sample(0, (1, 3, 5, 6))}),
        case("wrong_rank", {"0.npy": _sample(0, (3, 6, 6))}),
        case("int_samples", {"0.npy": np.ones((1, 3, 6, 6), np.int64)}),
        case("nan_values", {"0.npy": np.full((1, 3, 6, 6), np.nan, F32)}),
        case("inf_values", {"0.npy": np.full((1, 3, 6, 6), np.inf, F32)}),
        case("garbage_npy", {"0.npy": b"\x93NUMPY garbage"}),
        case("truncated_npy", {"0.npy": _npy_bytes(_sample(0))[:100]}),
        case("pickled_objects", {"0.npy": np.array([{"x": 1}], dtype=object)}),
        case("npz_wrong_key", {"0.npz": {"not_x": _sample(0)}}),
        case("npz_extra_key", {"0.npz": {"x": _sample(0), "extra": _sample(1)}}),
        case("empty_array", {"0.npy": np.zeros((0,), F32)}),
        case("one_bad_among_good", {**good, "2.npy": _sample(2, (2, 2))}),
        case("images_without_preprocessing", {"0.png": _png()}),
        Case("calibration", "calib_is_a_file", True, lambda d: {
            "model": _save(float_model(), d / "float.onnx"), "calib": _write(d / "calib.npy", _npy_bytes(_sample()))}),
        Case("calibration", "calib_missing", True, lambda d: {
            "model": _save(float_model(), d / "float.onnx"), "calib": d / "absent"}),
        case("npy_that_is_a_directory", {"0.npy": None}),
        case("header_claims_a_huge_array", {"0.npy": _huge_header()}),
        case("scalar_sample", {"0.npy": np.float32(1.0)}),
        case("complex_samples", {"0.npy": _sample(0).astype(np.complex64)}),
        case("bool_samples", {"0.npy": np.ones((1, 3, 6, 6), bool)}),
        case("string_samples", {"0.npy": np.full((1, 3, 6, 6), "a")}),
        case("float16_samples", {"0.npy": _sample(0).astype(np.float16)}, bad=False),  # odd: cast or refused
        case("float64_samples", {"0.npy": _sample(0).astype(np.float64)}, bad=False),
        case("valid", good, bad=False),
    ]


def _huge_header() -> bytes:
    """A .npy whose header declares 40 GB of float32 and holds 16 bytes."""
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3, 100000, 33334), }"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + b"\0" * 16


def _npy_bytes(a) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def _png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(buf, format="PNG")
    return buf.getvalue()


# --------------------------------------------------------------------------- paths and options
# Each case is (name, argv builder): the builder gets the case directory (holding float.onnx, a QDQ
# model qdq.onnx and calib/) and returns the argv. All are bad: exit 1 and nothing written.


def _qdq_model() -> onnx.ModelProto:
    return q_dq_activation("uint8")


def _big_input_model() -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [_vi("x", T.FLOAT, [64, 3, 4096, 4096])],
                  [_vi("y", T.FLOAT, [64, 3, 4096, 4096])])


def _other_inputs_model() -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["z"], ["y"], name="relu")], [_vi("z", T.FLOAT, [1, 3, 6, 6])],
                  [_vi("y", T.FLOAT, [1, 3, 6, 6])])


def _string_model() -> onnx.ModelProto:
    return _model([helper.make_node("Identity", ["x"], ["y"], name="id")], [_vi("x", T.STRING, [1])],
                  [_vi("y", T.STRING, [1])])


def workspace(d: Path) -> dict:
    files = calibration_dir(d, {f"{i}.npy": _sample(i) for i in range(2)})
    _save(_qdq_model(), d / "qdq.onnx")
    _save(_big_input_model(), d / "big.onnx")
    _save(_other_inputs_model(), d / "other.onnx")
    _save(_string_model(), d / "string.onnx")
    (d / "a_file").write_bytes(b"x")
    (d / "existing_dir").mkdir()
    (d / "ext").mkdir()
    _external(d / "ext", data=np.arange(16, dtype=F32).tobytes())
    return files


QUICK = ["-q", "--speed-fallback", "off", "--weight-rounding", "nearest", "--bias-correction", "off"]


def _quantize(*extra):
    return lambda d: ["quantize", str(d / "float.onnx"), "--calib", str(d / "calib"), *extra]


def _out(path):
    return lambda d: ["quantize", str(d / "float.onnx"), "--calib", str(d / "calib"), "-o",
                      str(path(d)) if callable(path) else path, *QUICK]


PATH_CASES: dict[str, Callable[[Path], list[str]]] = {
    "o_empty": _out(""),
    "o_existing_directory": _out(lambda d: d / "existing_dir"),
    "o_is_the_model": _out(lambda d: d / "float.onnx"),
    "o_is_the_model_other_spelling": _out(lambda d: d / "calib" / ".." / "float.onnx"),
    "o_is_a_calibration_sample": _out(lambda d: d / "calib" / "0.npy"),
    "o_inside_the_calibration_directory": _out(lambda d: d / "calib" / "new.onnx"),
    "o_is_the_calibration_directory": _out(lambda d: d / "calib"),
    "o_is_dev_null": _out("/dev/null"),
    "o_is_the_root_directory": _out("/"),
    "o_under_a_file": _out(lambda d: d / "a_file" / "q.onnx"),
    "o_in_sys": _out("/sys/qnnx-fuzz.onnx"),
    "o_in_proc": _out("/proc/qnnx-fuzz/q.onnx"),
    "report_is_the_calibration_directory": _quantize("-o", "OUT", "--report", "CALIB", *QUICK),
    "report_is_the_model": _quantize("-o", "OUT", "--report", "MODEL", *QUICK),
    "report_in_sys": _quantize("-o", "OUT", "--report", "/sys/qnnx-fuzz-report", *QUICK),
    "report_under_a_file": lambda d: ["quantize", str(d / "float.onnx"), "--calib", str(d / "calib"), "-o",
                                      str(d / "q.onnx"), "--report", str(d / "a_file" / "report"), *QUICK],
    "import_o_is_the_model": lambda d: ["import", str(d / "qdq.onnx"), "-o", str(d / "qdq.onnx")],
    "import_o_existing_directory": lambda d: ["import", str(d / "qdq.onnx"), "-o", str(d / "existing_dir")],
    "from_qdq_o_empty": lambda d: ["from-qdq", str(d / "qdq.onnx"), "-o", ""],
    "from_qdq_o_in_sys": lambda d: ["from-qdq", str(d / "qdq.onnx"), "-o", "/sys/qnnx-fuzz.onnx"],
    "lower_o_under_a_file": lambda d: ["lower", str(d / "qdq.onnx"), "-o", str(d / "a_file" / "x.onnx")],
    "lower_o_is_the_model": lambda d: ["lower", str(d / "qdq.onnx"), "-o", str(d / "." / "qdq.onnx")],
    "import_o_is_the_external_data": lambda d: ["import", str(d / "ext" / "model.onnx"), "-o",
                                                str(d / "ext" / "w.bin")],
}

OPTION_CASES: dict[str, Callable[[Path], list[str]]] = {
    "unknown_option": _quantize("-o", "OUT", "--frobnicate", *QUICK),
    "missing_option_value": lambda d: ["quantize", str(d / "float.onnx"), "-o", str(d / "q.onnx"), "--calib"],
    "no_calibration": lambda d: ["quantize", str(d / "float.onnx"), "-o", str(d / "q.onnx")],
    "calib_and_random": _quantize("-o", "OUT", "--random-calibration", *QUICK),
    "bad_method": _quantize("-o", "OUT", "--method", "magic", *QUICK),
    "bad_activation_dtype": _quantize("-o", "OUT", "--activation-dtype", "int3", *QUICK),
    "num_samples_zero": _quantize("-o", "OUT", "--num-samples", "0", *QUICK),
    "num_samples_text": _quantize("-o", "OUT", "--num-samples", "many", *QUICK),
    "percentile_out_of_range": _quantize("-o", "OUT", "--method", "percentile", "--percentile", "120", *QUICK),
    "percentile_nan": _quantize("-o", "OUT", "--method", "percentile", "--percentile", "nan", *QUICK),
    "sequential_zero": _quantize("-o", "OUT", "--sequential", "0", *QUICK),
    "silu_lobe_negative": _quantize("-o", "OUT", "--silu-lobe", "-1", *QUICK),
    "sqnr_threshold_nan": _quantize("-o", "OUT", "--sqnr-threshold", "nan", *QUICK),
    "bad_resize": _quantize("-o", "OUT", "--resize", "0x-3", *QUICK),
    "bad_mean": _quantize("-o", "OUT", "--resize", "8", "--mean", "a,b", *QUICK),
    "bad_format": _quantize("-o", "OUT", "--format", "tflite", *QUICK),
    "bad_symmetric_activations": _quantize("-o", "OUT", "--target", "openvino", "--symmetric-activations", "always",
                                           *QUICK),
    "unknown_consumer_function": _quantize("-o", "OUT", "--consumer-function", "relu6", *QUICK),
    "random_calibration_huge_input": lambda d: ["quantize", str(d / "big.onnx"), "-o", str(d / "q.onnx"),
                                                "--random-calibration", *QUICK],
    "random_calibration_string_input": lambda d: ["quantize", str(d / "string.onnx"), "-o", str(d / "q.onnx"),
                                                  "--random-calibration", *QUICK],
    "from_qdq_bad_numerics": lambda d: ["from-qdq", str(d / "qdq.onnx"), "-o", str(d / "q.onnx"), "--numerics",
                                        "fast"],
    "bench_different_inputs": lambda d: ["bench", str(d / "float.onnx"), str(d / "other.onnx"), "--repeats", "1"],
    "bench_string_input": lambda d: ["bench", str(d / "string.onnx"), "--repeats", "1"],
    "bench_missing_model": lambda d: ["bench", str(d / "float.onnx"), str(d / "absent.onnx"), "--repeats", "1"],
    "bench_directory_as_model": lambda d: ["bench", str(d / "existing_dir"), "--repeats", "1"],
    "bench_repeats_zero": lambda d: ["bench", str(d / "float.onnx"), "--repeats", "0"],
    "bench_bad_data": lambda d: ["bench", str(d / "float.onnx"), "--data", str(d / "a_file"), "--repeats", "1"],
    "compare_missing_data": lambda d: ["compare", str(d / "float.onnx"), str(d / "qdq.onnx"), "--data",
                                       str(d / "absent")],
    "compare_models_of_different_inputs": lambda d: ["compare", str(d / "float.onnx"), str(d / "other.onnx"),
                                                     "--data", str(d / "calib")],
    "compare_missing_quantized_model": lambda d: ["compare", str(d / "float.onnx"), str(d / "absent.onnx"),
                                                  "--data", str(d / "calib")],
    "inspect_directory": lambda d: ["inspect", str(d / "existing_dir")],
    "unknown_command": lambda d: ["frobnicate"],
}


def usage_cases() -> list[Case]:
    cases = []
    for category, table in (("paths", PATH_CASES), ("options", OPTION_CASES)):
        for name, argv in table.items():
            cases.append(Case(category, name, True, lambda d, argv=argv: {**workspace(d), "argv": _fill(argv(d), d)}))
    return cases


def _fill(argv: list[str], d: Path) -> list[str]:
    names = {"OUT": str(d / "q.onnx"), "CALIB": str(d / "calib"), "MODEL": str(d / "float.onnx")}
    return [names.get(a, a) for a in argv]


def all_cases() -> list[Case]:
    return model_cases() + qparams_cases() + calibration_cases() + usage_cases()


def counts() -> dict[str, dict[str, int]]:
    """Cases per category, bad and valid (the size of the corpus, for the record)."""
    out: dict[str, dict[str, int]] = {}
    for c in all_cases():
        row = out.setdefault(c.category, {"bad": 0, "valid": 0})
        row["bad" if c.bad else "valid"] += 1
    return out


if __name__ == "__main__":  # python tests/fuzz/fuzz_corpus.py: the corpus size by category
    total = 0
    for cat, row in counts().items():
        print(f"{cat:12s} {row['bad']:4d} bad {row['valid']:4d} valid")
        total += row["bad"] + row["valid"]
    print(f"{'total':12s} {total:4d} cases")
