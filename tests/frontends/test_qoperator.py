"""Import of ONNX Runtime's QOperator ops (domain ``com.microsoft``) into the qnnx dialect.

Each test builds a one-node QOperator graph (signatures as in ORT's contrib op docs), runs it on ONNX
Runtime (CPU, the op's own kernel) and through ``qnnx.ReferenceEvaluator`` (which imports it into
the dialect) and compares the integer outputs in output quanta (LSB), with the tolerance and its
reason stated per test. ``qnnx.import_onnx`` must leave no ``com.microsoft`` node.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import U8S8_SATURATION_NOTE, ort_u8s8_saturates

import qnnx

MS = "com.microsoft"
U8, I8 = np.uint8, np.int8


def ints(rng, dtype, shape) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, size=shape).astype(dtype)


def qop_model(op_type: str, feeds: dict, consts: dict, order: list[str], out_dtype, **attrs) -> onnx.ModelProto:
    """One com.microsoft node: ``feeds`` are graph inputs, ``consts`` initializers, wired in ``order``
    ("" for an omitted optional input)."""
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
              for n, a in feeds.items()]
    inits = [numpy_helper.from_array(np.asarray(a), n) for n, a in consts.items()]
    node = helper.make_node(op_type, order, ["y"], domain=MS, name="qop", **attrs)
    out = helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype)), None)
    g = helper.make_graph([node], "qoperator_test", inputs, [out], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)],
                             ir_version=10)


def compare(model: onnx.ModelProto, feeds: dict, *, lsb: int, ops: list[str]) -> np.ndarray:
    imported = qnnx.import_onnx(model)
    types = [(n.domain, n.op_type) for n in imported.graph]
    assert not any(d == MS for d, _ in types), types
    for op in ops:
        assert ("qnnx", op) in types, types
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = sess.run(None, feeds)[0]
    got = qnnx.ReferenceEvaluator(model).run(None, feeds)[0]
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0)
    else:
        diff = int(np.abs(got.astype(np.int64) - expected.astype(np.int64)).max())
        assert diff <= lsb, f"{diff} LSB from ORT (allowed {lsb})" + \
            (U8S8_SATURATION_NOTE if ort_u8s8_saturates() else "")
        assert len(np.unique(got)) > 2, "degenerate test: output (nearly) constant"
    return got


# --------------------------------------------------------------------------- QLinearAdd / QLinearMul

BINARY_QPARAMS = {
    U8: dict(sa=np.float32(0.03), za=U8(128), sb=np.float32(0.05), zb=U8(100), sy=np.float32(0.06), zy=U8(120)),
    I8: dict(sa=np.float32(0.03), za=I8(2), sb=np.float32(0.05), zb=I8(-7), sy=np.float32(0.06), zy=I8(1)),
}


@pytest.mark.parametrize("dtype", [U8, I8])
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_add_mul(op, dtype, rng):
    # qnnx.add / qnnx.mul, float compute, ties to even. At most 1 LSB: ORT's MLAS kernels fold the
    # zero points into float offsets (add) / requantize the product with their own rounding sequence.
    qp = dict(BINARY_QPARAMS[dtype])
    if op == "QLinearMul":
        qp["sy"] = np.float32(qp["sa"] * qp["sb"] * 40)
    a, b = ints(rng, dtype, (2, 3, 4, 5)), ints(rng, dtype, (3, 1, 5))  # broadcast
    m = qop_model(op, {"a": a, "b": b}, qp, ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], dtype)
    compare(m, {"a": a, "b": b}, lsb=1, ops=["add" if op == "QLinearAdd" else "mul"])


# --------------------------------------------------------------------------- lookup tables


@pytest.mark.parametrize("dtype", [U8, I8])
@pytest.mark.parametrize("op,attrs", [("QLinearSigmoid", {}), ("QLinearLeakyRelu", dict(alpha=0.13))])
def test_qlinear_lookup_table(op, attrs, dtype):
    # qnnx.lut, table built offline in float32. Every 8-bit input value, so the whole table is
    # compared. At most 1 LSB: ORT builds its table with MLAS's float function (its own logistic
    # approximation), which can round the other way at a boundary.
    z = dtype(128) if dtype == U8 else dtype(-3)
    ys, yz = (1 / 256, dtype(0) if dtype == U8 else dtype(-128)) if op == "QLinearSigmoid" else (0.04, z)
    consts = dict(sx=np.float32(0.05), zx=z, sy=np.float32(ys), zy=yz)
    x = np.arange(np.iinfo(dtype).min, int(np.iinfo(dtype).max) + 1).astype(dtype).reshape(4, 64)
    m = qop_model(op, {"x": x}, consts, ["x", "sx", "zx", "sy", "zy"], dtype, **attrs)
    compare(m, {"x": x}, lsb=1, ops=["lut"])


@pytest.mark.parametrize("bad,match", [(dict(sx=np.float32(0)), "X_scale must be positive and finite"),
                                       (dict(sy=np.float32("nan")), "Y_scale must be positive and finite"),
                                       (dict(sx=np.full(2, 0.05, np.float32)), "X_scale must be per-tensor")])
def test_qlinear_lookup_table_qparams_are_checked_before_the_table_is_built(bad, match):
    """The lut keeps no qparams, so nothing later could see a zero scale: it must be refused here."""
    consts = {**dict(sx=np.float32(0.05), zx=U8(128), sy=np.float32(1 / 256), zy=U8(0)), **bad}
    x = np.zeros((1, 2), U8)
    m = qop_model("QLinearSigmoid", {"x": x}, consts, ["x", "sx", "zx", "sy", "zy"], U8)
    with pytest.raises(qnnx.QnnxError, match=r"node 'qop' \(QLinearSigmoid\): " + match):
        qnnx.import_onnx(m)


# --------------------------------------------------------------------------- QLinearConcat


@pytest.mark.parametrize("dtype", [U8, I8])
def test_qlinear_concat(dtype, rng):
    # qnnx.concat: each input requantized to the output's qparams (float, ties to even). At most 1 LSB:
    # ORT dequantizes then quantizes each value (two float roundings; the requantize rounds once).
    # The second input already has the output's qparams (ORT copies it; so does the requantize).
    zs = [dtype(128), dtype(100), dtype(30)] if dtype == U8 else [dtype(0), dtype(-20), dtype(5)]
    xs = [ints(rng, dtype, (2, c, 5)) for c in (2, 3, 1)]
    consts = dict(sy=np.float32(0.04), zy=zs[1], s0=np.float32(0.03), z0=zs[0], s1=np.float32(0.04), z1=zs[1],
                  s2=np.float32(0.05), z2=zs[2])
    feeds = {f"x{i}": x for i, x in enumerate(xs)}
    m = qop_model("QLinearConcat", feeds, consts, ["sy", "zy", "x0", "s0", "z0", "x1", "s1", "z1", "x2", "s2", "z2"],
                  dtype, axis=1)
    got = compare(m, feeds, lsb=1, ops=["concat"])
    np.testing.assert_array_equal(got[:, 2:5], xs[1])


# --------------------------------------------------------------------------- pooling


@pytest.mark.parametrize("dtype", [U8, I8])
def test_qlinear_global_average_pool(dtype, rng):
    # qnnx.global_avg_pool: the integer sum requantized by sx / (count * sy). At most 1 LSB: ORT
    # averages in float with its own rounding of the sum and of the zero point.
    z = dtype(128) if dtype == U8 else dtype(3)
    x = ints(rng, dtype, (2, 6, 5, 7))
    consts = dict(sx=np.float32(0.05), zx=z, sy=np.float32(0.01), zy=z)
    m = qop_model("QLinearGlobalAveragePool", {"x": x}, consts, ["x", "sx", "zx", "sy", "zy"], dtype, channels_last=0)
    compare(m, {"x": x}, lsb=1, ops=["global_avg_pool"])


@pytest.mark.parametrize("attrs", [dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                                   dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
                                   dict(kernel_shape=[2, 2], strides=[2, 2])],
                         ids=["exclude_pad", "include_pad", "no_pad"])
@pytest.mark.parametrize("dtype", [U8, I8])
def test_qlinear_average_pool(attrs, dtype, rng):
    # qnnx.avg_pool. At most 1 LSB (ORT averages in float, see above).
    z = dtype(128) if dtype == U8 else dtype(-5)
    x = ints(rng, dtype, (2, 3, 7, 8))
    consts = dict(sx=np.float32(0.05), zx=z, sy=np.float32(0.03), zy=dtype(125) if dtype == U8 else dtype(0))
    m = qop_model("QLinearAveragePool", {"x": x}, consts, ["x", "sx", "zx", "sy", "zy"], dtype, **attrs)
    compare(m, {"x": x}, lsb=1, ops=["avg_pool"])


# --------------------------------------------------------------------------- QLinearSoftmax


@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("dtype", [U8, I8])
def test_qlinear_softmax(axis, dtype, rng):
    # qnnx.softmax (integer exp table, exact normalisation). At most 1 LSB: ORT's kernel builds a float
    # exp table and normalises in float.
    z = dtype(128) if dtype == U8 else dtype(0)
    x = ints(rng, dtype, (2, 5, 7))
    consts = dict(sx=np.float32(0.08), zx=z, sy=np.float32(1 / 256), zy=dtype(0) if dtype == U8 else dtype(-128))
    m = qop_model("QLinearSoftmax", {"x": x}, consts, ["x", "sx", "zx", "sy", "zy"], dtype, axis=axis, opset=13)
    compare(m, {"x": x}, lsb=1, ops=["softmax"])


def test_qlinear_softmax_opset12_non_last_axis_is_refused(rng):
    x = ints(rng, U8, (2, 5, 7))
    consts = dict(sx=np.float32(0.08), zx=U8(128), sy=np.float32(1 / 256), zy=U8(0))
    m = qop_model("QLinearSoftmax", {"x": x}, consts, ["x", "sx", "zx", "sy", "zy"], U8, axis=1, opset=12)
    with pytest.raises(qnnx.QnnxError, match=r"qop.*QLinearSoftmax with opset < 13"):
        qnnx.import_onnx(m)


# --------------------------------------------------------------------------- QGemm


def _qgemm(rng, *, per_column: bool, trans_b: bool, bias: bool, quantized_output: bool, adtype=U8):
    m_, k, n = 6, 12, 8
    a = ints(rng, adtype, (m_, k))
    b = ints(rng, I8, (n, k) if trans_b else (k, n))
    sa = np.float32(0.04)
    sb = rng.uniform(0.005, 0.02, n).astype(np.float32) if per_column else np.float32(0.01)
    consts = dict(sa=sa, za=adtype(128) if adtype == U8 else adtype(3), b=b, sb=sb, zb=np.zeros(np.shape(sb), I8))
    order = ["a", "sa", "za", "b", "sb", "zb"]
    if bias:
        consts["c"] = rng.integers(-2000, 2000, n).astype(np.int32)  # scale sa*sb, zero point 0
    order.append("c" if bias else "")
    if quantized_output:
        consts.update(sy=np.float32(0.1), zy=adtype(110) if adtype == U8 else adtype(-4))
        order += ["sy", "zy"]
    out = adtype if quantized_output else np.float32
    model = qop_model("QGemm", {"a": a}, consts, order, out, transB=int(trans_b))
    return model, {"a": a}


@pytest.mark.exact_u8s8(ids=("uint8",))  # bit-exact with ORT's fused u8 x s8 kernels
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("adtype", [U8, I8])
def test_qgemm(per_column, trans_b, adtype, rng):
    # qnnx.matmul (+ int32 bias) + qnnx.requantize. Bit-exact: ORT's QGemm requantizes the int32
    # accumulator as float32(acc) * float32(sa*sb/sy) with ties to even, the requantize's arithmetic.
    model, feeds = _qgemm(rng, per_column=per_column, trans_b=trans_b, bias=True, quantized_output=True,
                          adtype=adtype)
    compare(model, feeds, lsb=0, ops=["matmul", "requantize"])


@pytest.mark.exact_u8s8  # bit-exact with ORT's fused u8 x s8 kernels
@pytest.mark.parametrize("bias", [False, True])
def test_qgemm_float_output(bias, rng):
    # Without y_scale QGemm returns float: the accumulator dequantized by sa*sb (float32 product, one
    # float32 multiplication per element, as ORT). Compared with rtol 1e-6.
    model, feeds = _qgemm(rng, per_column=True, trans_b=True, bias=bias, quantized_output=False)
    compare(model, feeds, lsb=0, ops=["matmul", "dequantize"])


def test_qgemm_alpha_is_refused(rng):
    model, _ = _qgemm(rng, per_column=False, trans_b=False, bias=False, quantized_output=True)
    model.graph.node[0].attribute.append(helper.make_attribute("alpha", 0.5))
    with pytest.raises(qnnx.QnnxError, match=r"qop.*QGemm with alpha != 1"):
        qnnx.import_onnx(model)


def test_qlinear_pool_channels_last_is_refused(rng):
    x = ints(rng, U8, (1, 4, 4, 3))
    consts = dict(sx=np.float32(0.05), zx=U8(128), sy=np.float32(0.05), zy=U8(128))
    m = qop_model("QLinearGlobalAveragePool", {"x": x}, consts, ["x", "sx", "zx", "sy", "zy"], U8, channels_last=1)
    with pytest.raises(qnnx.QnnxError, match="channels_last=1 is not supported"):
        qnnx.import_onnx(m)


def test_qoperator_model_through_from_qdq(rng):
    # A QOperator chain converts into the canonical form too: nothing left in float, no com.microsoft.
    a, b = ints(rng, U8, (2, 8)), ints(rng, U8, (2, 8))
    consts = dict(sa=np.float32(0.03), za=U8(128), sb=np.float32(0.05), zb=U8(100), sy=np.float32(0.06),
                  zy=U8(120), s2=np.float32(1 / 256), z2=U8(0))
    nodes = [helper.make_node("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["t"], domain=MS),
             helper.make_node("QLinearSigmoid", ["t", "sy", "zy", "s2", "z2"], ["y"], domain=MS)]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info(n, TensorProto.UINT8, [2, 8]) for n in "ab"],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
                          [numpy_helper.from_array(v, k) for k, v in consts.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)], ir_version=10)
    converted, report = qnnx.frontends.convert_qdq(m)
    assert report.left_in_float == []
    assert [(n.domain, n.op_type) for n in converted.graph] == [("qnnx", "add"), ("qnnx", "lut")]
    feeds = {"a": a, "b": b}
    got = qnnx.ReferenceEvaluator(qnnx.ir.to_proto(converted)).run(None, feeds)[0]
    expected = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.abs(got.astype(int) - expected.astype(int)).max() <= 1  # QLinearAdd: see test_qlinear_add_mul
