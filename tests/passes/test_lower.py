"""Every qnnx op, lowered to standard ONNX, is bit-identical on ONNX Runtime to the reference.

Random shapes and qparams (seeded), every rounding and compute mode. Tolerance: none (bit-exact).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import qnnx
from qnnx.numerics import COMPUTE_MODES, ROUNDING_MODES
from qnnx.passes.lower import lower

MODES = [(r, c) for r in ROUNDING_MODES for c in COMPUTE_MODES]


def _model(op_type, feeds, consts, order, attrs, out_type=None):
    """A one-node graph: ``feeds`` become graph inputs, ``consts`` initializers, in ``order``."""
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
              for n, a in feeds.items()]
    inits = [onnx.numpy_helper.from_array(np.asarray(a), n) for n, a in consts.items()]
    node = helper.make_node(op_type, order, ["y"], domain="qnnx", name="n0", **attrs)
    out = helper.make_tensor_value_info("y", out_type, None) if out_type else helper.make_empty_tensor_value_info("y")
    g = helper.make_graph([node], "g", inputs, [out], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("qnnx", 1)],
                             ir_version=10)


def _compare(model, feeds):
    expected = qnnx.ReferenceEvaluator(model).run(None, feeds)[0]
    lowered = qnnx.ir.to_proto(lower(model))
    assert not any(n.domain == "qnnx" for n in lowered.graph.node)
    sess = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)[0]
    assert got.dtype == expected.dtype and got.shape == expected.shape
    mism = np.flatnonzero(got.astype(np.float64) != expected.astype(np.float64))
    assert mism.size == 0, f"{mism.size} mismatches, first at {mism[:5]}: got {got.ravel()[mism[:5]]}, " \
                           f"expected {expected.ravel()[mism[:5]]}"
    return expected


def _rand_int(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, size=shape).astype(dtype)


def _scales(rng, n, lo=-4, hi=1):
    return (10.0 ** rng.uniform(lo, hi, size=n)).astype(np.float32)


def _zps(rng, dtype, n):
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -100), min(int(info.max), 200) + 1, size=n).astype(np.int32)


@pytest.mark.parametrize("rounding,compute", MODES)
@pytest.mark.parametrize("in_dtype,out_dtype", [(np.int32, "int8"), (np.int32, "uint8"), (np.int8, "int16"),
                                                (np.uint8, "int8"), (np.int16, "int32")])
@pytest.mark.parametrize("per_axis", [False, True])
def test_requantize(rounding, compute, in_dtype, out_dtype, per_axis):
    rng = np.random.default_rng(hash((rounding, compute, str(in_dtype), out_dtype, per_axis)) % 2**32)
    x = _rand_int(rng, in_dtype, (2, 5, 7))
    if in_dtype == np.int32:
        x = (x // rng.integers(1, 1 << 16, size=x.shape)).astype(np.int32)
    n = 5 if per_axis else 1
    out_np = np.dtype(out_dtype).type
    consts = dict(si=_scales(rng, n, -6, 0), zi=_zps(rng, in_dtype, n) if in_dtype != np.int32 else
                  np.zeros(n, np.int32), so=_scales(rng, n, -3, 0), zo=_zps(rng, out_np, n))
    if not per_axis:
        consts = {k: v.reshape(()) for k, v in consts.items()}
    m = _model("requantize", {"x": x}, consts, ["x", "si", "zi", "so", "zo"],
               dict(axis=1, out_dtype=out_dtype, rounding=rounding, compute=compute))
    _compare(m, {"x": x})


@pytest.mark.parametrize("rounding", ROUNDING_MODES)
@pytest.mark.parametrize("out_dtype", ["int8", "uint8", "int16", "uint16"])
@pytest.mark.parametrize("simulated", [False, True])
def test_quantize(rounding, out_dtype, simulated):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3, 4, 6)) * 10).astype(np.float32)
    x.ravel()[:8] = [0.5, -0.5, 1.5, -2.5, 0.0, 1e30, -1e30, np.nan]
    s, z = _scales(rng, 4, -2, 0), _zps(rng, np.dtype(out_dtype).type, 4)
    s[0] = 1.0
    op = "simulated_quantize" if simulated else "quantize"
    m = _model(op, {"x": x}, dict(s=s, z=z), ["x", "s", "z"], dict(axis=1, out_dtype=out_dtype, rounding=rounding))
    _compare(m, {"x": x})


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16])
@pytest.mark.parametrize("simulated", [False, True])
def test_dequantize(dtype, simulated):
    rng = np.random.default_rng(3)
    q = _rand_int(rng, dtype, (2, 3, 5))
    s, z = _scales(rng, 3), _zps(rng, dtype, 3)
    feed = q.astype(np.float32) if simulated else q
    m = _model("simulated_dequantize" if simulated else "dequantize", {"x": feed}, dict(s=s, z=z), ["x", "s", "z"],
               dict(axis=1))
    _compare(m, {"x": feed})


CONV_CASES = [
    dict(x=(1, 4, 9, 9), w=(6, 4, 3, 3), attrs=dict(pads=[1, 1, 1, 1])),
    dict(x=(2, 4, 8, 7), w=(4, 1, 3, 3), attrs=dict(group=4, strides=[2, 2], pads=[1, 0, 1, 2])),  # depthwise
    dict(x=(1, 6, 10, 10), w=(4, 3, 3, 2), attrs=dict(group=2, dilations=[2, 1], auto_pad="SAME_UPPER")),
    dict(x=(1, 3, 20), w=(5, 3, 4), attrs=dict(strides=[3], pads=[2, 1])),  # 1-D
]


@pytest.mark.parametrize("case", range(len(CONV_CASES)))
@pytest.mark.parametrize("xdtype,wdtype", [(np.uint8, np.int8), (np.int8, np.int8), (np.int16, np.int8),
                                           (np.uint16, np.uint8)])
@pytest.mark.parametrize("per_channel_wz", [False, True])
def test_conv(case, xdtype, wdtype, per_channel_wz):
    c = CONV_CASES[case]
    rng = np.random.default_rng(case * 31 + len(str(xdtype)))
    x = _rand_int(rng, xdtype, c["x"])
    w = _rand_int(rng, wdtype, c["w"])
    m_out = c["w"][0]
    wz = _zps(rng, wdtype, m_out) if per_channel_wz else np.array(_zps(rng, wdtype, 1)[0])
    consts = dict(w=w, xs=np.float32(0.02), xz=np.int32(_zps(rng, xdtype, 1)[0]), ws=_scales(rng, m_out), wz=wz,
                  bias=rng.integers(-5000, 5000, m_out).astype(np.int32))
    m = _model("conv", {"x": x}, consts, ["x", "w", "xs", "xz", "ws", "wz", "bias"], c["attrs"])
    _compare(m, {"x": x})


DEPTHWISE_CASES = [
    dict(x=(2, 4, 8, 7), w=(4, 1, 3, 3), attrs=dict(group=4, strides=[2, 2], pads=[1, 0, 1, 2])),
    dict(x=(1, 3, 9, 9), w=(6, 1, 5, 5), attrs=dict(group=3, pads=[2, 2, 2, 2])),  # channel multiplier 2
    dict(x=(1, 5, 6, 10), w=(5, 1, 3, 3), attrs=dict(group=5, strides=[2, 1], auto_pad="SAME_UPPER")),
]


@pytest.mark.parametrize("case", range(len(DEPTHWISE_CASES)))
@pytest.mark.parametrize("xdtype", [np.uint8, np.int8, np.int16])
def test_depthwise_conv_with_per_channel_x_qparams(case, xdtype):
    c = DEPTHWISE_CASES[case]
    rng = np.random.default_rng(case + 7)
    x = _rand_int(rng, xdtype, c["x"])
    w = _rand_int(rng, np.int8, c["w"])
    channels, m_out = c["x"][1], c["w"][0]
    consts = dict(w=w, xs=_scales(rng, channels), xz=_zps(rng, xdtype, channels), ws=_scales(rng, m_out),
                  wz=np.int32(0), bias=rng.integers(-5000, 5000, m_out).astype(np.int32))
    m = _model("conv", {"x": x}, consts, ["x", "w", "xs", "xz", "ws", "wz", "bias"], c["attrs"])
    y = _compare(m, {"x": x})
    # each channel alone through the per-tensor kernel, with that channel's zero point
    per = c["w"][0] // channels
    attrs = {k: v for k, v in c["attrs"].items() if k != "group"}
    for ch in range(channels):
        xc, out = x[:, ch:ch + 1], slice(ch * per, (ch + 1) * per)
        one = dict(consts, w=w[out], xs=consts["xs"][ch], xz=consts["xz"][ch], ws=consts["ws"][out],
                   bias=consts["bias"][out])
        single = _model("conv", {"x": xc}, one, ["x", "w", "xs", "xz", "ws", "wz", "bias"], attrs)
        assert np.array_equal(y[:, out], qnnx.ReferenceEvaluator(single).run(None, {"x": xc})[0])


def test_per_channel_x_qparams_need_a_depthwise_conv():
    rng = np.random.default_rng(0)
    x = _rand_int(rng, np.uint8, (1, 4, 6, 6))
    consts = dict(w=_rand_int(rng, np.int8, (6, 2, 3, 3)), xs=_scales(rng, 4), xz=_zps(rng, np.uint8, 4),
                  ws=_scales(rng, 6), wz=np.int32(0))
    m = _model("conv", {"x": x}, consts, ["x", "w", "xs", "xz", "ws", "wz"], dict(group=2))
    with pytest.raises(qnnx.QnnxError, match="depthwise"):
        qnnx.ReferenceEvaluator(m).run(None, {"x": x})


@pytest.mark.parametrize("adtype,bdtype", [(np.uint8, np.int8), (np.int8, np.int8), (np.int16, np.int8),
                                           (np.uint8, np.uint8)])
@pytest.mark.parametrize("a_shape,b_shape", [((5, 7), (7, 3)), ((2, 4, 6), (6, 5)), ((3, 2, 4), (3, 4, 2))])
@pytest.mark.parametrize("per_row_a", [False, True])
def test_matmul(adtype, bdtype, a_shape, b_shape, per_row_a):
    rng = np.random.default_rng(11)
    a, bm = _rand_int(rng, adtype, a_shape), _rand_int(rng, bdtype, b_shape)
    rows, cols = a_shape[-2], b_shape[-1]
    az = _zps(rng, adtype, rows) if per_row_a else np.int32(_zps(rng, adtype, 1)[0])
    consts = dict(sa=np.float32(0.1), az=az, b=bm, sb=_scales(rng, cols), bz=_zps(rng, bdtype, cols),
                  bias=rng.integers(-3000, 3000, cols).astype(np.int32))
    m = _model("matmul", {"a": a}, consts, ["a", "sa", "az", "b", "sb", "bz", "bias"], {})
    _compare(m, {"a": a})


def test_matmul_uint8_by_an_int8_graph_input_is_exact():
    """u8 x s8 is lowered as u8 x u8: ORT's AVX2 u8 x s8 kernel (no VNNI) saturates pairs of raw byte
    products to int16, which these full-range bytes trigger on such a CPU (255 * -128 * 2 < -32768)."""
    rng = np.random.default_rng(5)
    a = rng.integers(200, 256, (4, 16)).astype(np.uint8)
    bm = rng.integers(-128, -100, (16, 8)).astype(np.int8)
    consts = dict(sa=np.float32(0.1), az=np.int32(3), sb=_scales(rng, 8), bz=_zps(rng, np.int8, 8))
    m = _model("matmul", {"a": a, "b": bm}, consts, ["a", "sa", "az", "b", "sb", "bz"], {})
    _compare(m, {"a": a, "b": bm})


@pytest.mark.parametrize("rounding,compute", MODES)
@pytest.mark.parametrize("op", ["add", "sub", "mul"])
@pytest.mark.parametrize("per_axis", [False, True])
@pytest.mark.parametrize("dtypes", [(np.int8, np.int8, "int8"), (np.uint8, np.int8, "uint8"),
                                    (np.int16, np.int16, "int16"), (np.uint16, np.uint16, "uint16")])
def test_binary(rounding, compute, op, per_axis, dtypes):
    rng = np.random.default_rng(5)
    da, db, dy = dtypes
    a, bb = _rand_int(rng, da, (2, 4, 3, 3)), _rand_int(rng, db, (4, 1, 3))
    n = 4 if per_axis else 1

    def qp(dt, k):
        s, z = _scales(rng, n, -3, -1), _zps(rng, dt, n)
        if dt == np.int16:
            z[:] = 0  # 16-bit activations are symmetric in practice (and keep products in int32)
        return (s, z) if per_axis else (s.reshape(()), z.reshape(()))

    (sa, za), (sb, zb), (sy, zy) = qp(da, 0), qp(db, 1), qp(np.dtype(dy).type, 2)
    consts = dict(sa=sa, za=za, sb=sb, zb=zb, sy=sy, zy=zy)
    m = _model(op, {"a": a, "b": bb}, consts, ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"],
               dict(axis=1, out_dtype=dy, rounding=rounding, compute=compute))
    _compare(m, {"a": a, "b": bb})


@pytest.mark.parametrize("op", ["add", "mul"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("a_shape,b_shape", [((2, 4, 3, 3), (2, 4, 3, 3)), ((1, 4, 3, 5), (1, 4, 1, 1)),
                                             ((1, 4, 1, 1), (1, 4, 3, 5)), ((), (7,))])
def test_binary_mlas(op, dtype, a_shape, b_shape):
    # ORT's QLinearAdd/Mul recipe lowers to a 256 x 256 table; each broadcast form has its own table
    rng = np.random.default_rng(41)
    a, bb = _rand_int(rng, dtype, a_shape), _rand_int(rng, dtype, b_shape)
    consts = dict(sa=np.float32(0.031), za=_zps(rng, dtype, 1)[0], sb=np.float32(0.0173), zb=_zps(rng, dtype, 1)[0],
                  sy=np.float32(0.043), zy=_zps(rng, dtype, 1)[0])
    m = _model(op, {"a": a, "b": bb}, consts, ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"],
               dict(out_dtype=np.dtype(dtype).name, rounding="half_even", compute="mlas"))
    _compare(m, {"a": a, "b": bb})


@pytest.mark.parametrize("a_shape,b_shape", [((1, 4, 3, 5), (1, 4, 3, 5)), ((1, 4, 3, 5), (1, 4, 1, 1)),
                                             ((1, 4, 1, 1), (1, 4, 3, 5)), ((2, 4, 1, 5), (2, 4, 3, 1))])
def test_add_mlas_kernel_chosen_at_run_time(a_shape, b_shape):
    # symbolic sizes: which of ORT's kernels runs (scalar span or vector) is read from the run-time shapes
    from qnnx import numerics_mlas

    rng = np.random.default_rng(59)
    a, bb = _rand_int(rng, np.uint8, a_shape), _rand_int(rng, np.uint8, b_shape)
    consts = dict(sa=np.float32(0.031), za=np.int32(120), sb=np.float32(0.0173), zb=np.int32(131),
                  sy=np.float32(0.043), zy=np.int32(128))
    # plant a byte pair on which the right kernel and a wrong one disagree (a handful of 65536 do)
    grid = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    recipe = {k: np.rint(numerics_mlas.add(*grid, 0.031, 120, 0.0173, 131, 0.043, 128, k))
              for k in ("vector", "scalar_a", "scalar_b")}
    right = numerics_mlas.span_kind(a_shape, b_shape)
    wrong = [k for k in recipe if k != right]
    av, bv = np.argwhere((recipe[right] != recipe[wrong[0]]) | (recipe[right] != recipe[wrong[1]]))[0]
    a[(0,) * a.ndim], bb[(0,) * bb.ndim] = av, bv
    m = _model("add", {"a": np.zeros((1, 1, 1, 1), np.uint8), "b": np.zeros((1, 1, 1, 1), np.uint8)}, consts,
               ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], dict(out_dtype="uint8", rounding="half_even", compute="mlas"))
    for k, v in enumerate(m.graph.input):
        for i, d in enumerate(v.type.tensor_type.shape.dim):
            d.dim_param = f"d{k}{i}"
    _compare(m, {"a": a, "b": bb})


def test_binary_mlas_needs_8_bits():
    a = np.zeros((2, 3), np.int16)
    consts = dict(sa=np.float32(0.1), za=np.int32(0), sb=np.float32(0.1), zb=np.int32(0), sy=np.float32(0.1),
                  zy=np.int32(0))
    m = _model("add", {"a": a, "b": a}, consts, ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"],
               dict(out_dtype="int16", rounding="half_even", compute="mlas"))
    with pytest.raises(qnnx.QnnxError, match="8-bit"):
        lower(m)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("shape,axis", [((2, 16, 5), 1), ((3, 2, 300), -1)])
def test_softmax_mlas(dtype, shape, axis):
    # ORT's QLinearSoftmax: float32 exp table, float32 running sum (CumSum), floor(1/y_scale)
    rng = np.random.default_rng(43)
    x = _rand_int(rng, dtype, shape)
    consts = dict(xs=np.float32(0.09), xz=np.int32(_zps(rng, dtype, 1)[0]), ys=np.float32(1 / 256),
                  yz=np.int32(np.iinfo(dtype).min))
    m = _model("softmax", {"x": x}, consts, ["x", "xs", "xz", "ys", "yz"],
               dict(axis=axis, out_dtype=np.dtype(dtype).name, compute="mlas"))
    _compare(m, {"x": x})


@pytest.mark.parametrize("rounding,compute", MODES)
@pytest.mark.parametrize("along_concat_axis", [False, True])
def test_concat(rounding, compute, along_concat_axis):
    rng = np.random.default_rng(9)
    x0, x1 = _rand_int(rng, np.int8, (1, 3, 4, 4)), _rand_int(rng, np.uint8, (1, 2, 4, 4))
    consts = dict(s0=_scales(rng, 3 if along_concat_axis else 1).reshape(-1), z0=_zps(rng, np.int8, 1),
                  s1=np.float32(0.03), z1=np.int32(128),
                  ys=_scales(rng, 5 if along_concat_axis else 1).reshape(-1), yz=np.int32(3))
    m = _model("concat", {"x0": x0, "x1": x1}, consts, ["ys", "yz", "x0", "s0", "z0", "x1", "s1", "z1"],
               dict(axis=1, quant_axis=1, out_dtype="int8", rounding=rounding, compute=compute))
    _compare(m, {"x0": x0, "x1": x1})


@pytest.mark.parametrize("rounding,compute", MODES)
@pytest.mark.parametrize("attrs", [dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                                   dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
                                   dict(kernel_shape=[2, 2], strides=[2, 2])])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16])
def test_avg_pool(rounding, compute, attrs, dtype):
    rng = np.random.default_rng(13)
    x = _rand_int(rng, dtype, (1, 3, 7, 8))
    consts = dict(xs=_scales(rng, 3), xz=_zps(rng, dtype, 3) if dtype != np.int16 else np.zeros(3, np.int32),
                  ys=np.float32(0.05), yz=np.int32(_zps(rng, dtype, 1)[0]))
    m = _model("avg_pool", {"x": x}, consts, ["x", "xs", "xz", "ys", "yz"],
               dict(rounding=rounding, compute=compute, **attrs))
    _compare(m, {"x": x})


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_softmax_mlas_length_known_at_run_time(dtype):
    # ORT's exp table depends on the axis length; with no static shape the lowering builds it at run
    # time in double, as numerics does (tolerance: none; see _softmax_mlas_table_at_run_time)
    info = np.iinfo(dtype)
    m = _model("softmax", {"x": np.zeros((2, 1), dtype)}, dict(
        xs=np.float32(0.042), xz=np.int32(3), ys=np.float32(1 / 255), yz=np.int32(info.min)),
        ["x", "xs", "xz", "ys", "yz"], dict(axis=-1, out_dtype=np.dtype(dtype).name, compute="mlas"))
    m.graph.input[0].type.tensor_type.ClearField("shape")
    for length in (1, 2, 17, 300, 6625):
        _compare(m, {"x": _rand_int(np.random.default_rng(length), dtype, (2, length))})


@pytest.mark.parametrize("attrs", [dict(kernel_shape=[3, 2], strides=[3, 2]),  # PP-OCR rec's pool
                                   dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                                   dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1)])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_avg_pool_mlas(attrs, dtype):
    # ORT's QLinearAveragePool: float32 taps summed in kernel order, lowered tap by tap
    rng = np.random.default_rng(47)
    x = _rand_int(rng, dtype, (1, 3, 9, 8))
    consts = dict(xs=np.float32(0.021), xz=np.int32(_zps(rng, dtype, 1)[0]), ys=np.float32(0.017),
                  yz=np.int32(_zps(rng, dtype, 1)[0]))
    m = _model("avg_pool", {"x": x}, consts, ["x", "xs", "xz", "ys", "yz"],
               dict(rounding="half_even", compute="mlas", **attrs))
    _compare(m, {"x": x})


def test_avg_pool_mlas_dynamic_spatial_dims():
    # PP-OCR rec's pool sees run-time heights and widths: tap slices end where the output size says
    m = _model("avg_pool", {"x": np.zeros((1, 4, 1, 1), np.uint8)}, dict(
        xs=np.float32(0.021), xz=np.int32(7), ys=np.float32(0.017), yz=np.int32(100)),
        ["x", "xs", "xz", "ys", "yz"], dict(kernel_shape=[3, 2], strides=[3, 2], rounding="half_even", compute="mlas"))
    dims = m.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "H", "W"
    for h, w in ((7, 9), (9, 8), (3, 2)):
        _compare(m, {"x": _rand_int(np.random.default_rng(h), np.uint8, (1, 4, h, w))})


@pytest.mark.parametrize("rounding,compute", MODES)
def test_global_avg_pool(rounding, compute):
    rng = np.random.default_rng(17)
    x = _rand_int(rng, np.int8, (2, 4, 5, 6))
    consts = dict(xs=_scales(rng, 4), xz=_zps(rng, np.int8, 4), ys=_scales(rng, 4), yz=_zps(rng, np.int8, 4))
    m = _model("global_avg_pool", {"x": x}, consts, ["x", "xs", "xz", "ys", "yz"],
               dict(rounding=rounding, compute=compute))
    _compare(m, {"x": x})


@pytest.mark.parametrize("xdtype,tdtype", [(np.int8, np.int8), (np.uint8, np.uint8), (np.int8, np.uint8),
                                           (np.int16, np.int16), (np.uint16, np.uint16), (np.uint16, np.uint8)])
def test_lut(xdtype, tdtype):
    rng = np.random.default_rng(19)
    x = _rand_int(rng, xdtype, (3, 50))
    x.reshape(-1)[:2] = np.iinfo(xdtype).min, np.iinfo(xdtype).max  # both ends of the table
    table = _rand_int(rng, tdtype, (1 << (8 * np.dtype(xdtype).itemsize),))
    m = _model("lut", {"x": x}, dict(table=table), ["x", "table"], {})
    _compare(m, {"x": x})


@pytest.mark.parametrize("axis", [1, -1])
def test_lut_per_channel(axis):
    rng = np.random.default_rng(53)
    x = _rand_int(rng, np.uint8, (2, 3, 4, 5) if axis == 1 else (2, 4, 5, 3))
    table = _rand_int(rng, np.int8, (3, 256))
    m = _model("lut", {"x": x}, dict(table=table), ["x", "table"], dict(axis=axis))
    _compare(m, {"x": x})


def test_every_registered_op_has_a_lowering_rule():
    from qnnx.dialect import REGISTRY
    from qnnx.passes.lower import LOWER_RULES

    assert set(REGISTRY) == set(LOWER_RULES)


def test_dynamic_scale_requantize_is_refused_with_the_node_name():
    g = helper.make_graph(
        [helper.make_node("requantize", ["x", "si", "zi", "so", "zo"], ["y"], domain="qnnx", name="rq7",
                          out_dtype="int8")], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.INT32, [4]),
         helper.make_tensor_value_info("si", onnx.TensorProto.FLOAT, [])],
        [helper.make_empty_tensor_value_info("y")],
        [onnx.numpy_helper.from_array(np.int32(0), "zi"), onnx.numpy_helper.from_array(np.float32(1), "so"),
         onnx.numpy_helper.from_array(np.int32(0), "zo")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("qnnx", 1)])
    with pytest.raises(qnnx.QnnxError, match=r"rq7.*input_scale must be a constant"):
        lower(m)


@pytest.mark.parametrize("rounding", ROUNDING_MODES)
@pytest.mark.parametrize("xdtype,out_dtype,axis", [(np.uint8, "uint8", -1), (np.int8, "int8", 1),
                                                   (np.int16, "int16", -1)])
def test_softmax(rounding, xdtype, out_dtype, axis):
    rng = np.random.default_rng(23)
    x = _rand_int(rng, xdtype, (2, 7, 9))
    consts = dict(xs=np.float32(0.07 if xdtype != np.int16 else 0.0005), xz=np.int32(0), ys=np.float32(1 / 256),
                  yz=np.int32(0 if out_dtype != "int8" else -128))
    m = _model("softmax", {"x": x}, consts, ["x", "xs", "xz", "ys", "yz"],
               dict(axis=axis, out_dtype=out_dtype, rounding=rounding))
    _compare(m, {"x": x})


@pytest.mark.parametrize("xshape,wshape,attrs", [
    ((1, 4, 5, 6), (4, 3, 3, 3), dict(strides=[2, 2], pads=[1, 0, 1, 1], output_padding=[1, 0])),
    ((2, 4, 5), (4, 2, 2), dict(strides=[3], dilations=[2], group=2)),
    ((1, 8, 6, 6), (8, 4, 2, 2), dict(strides=[2, 2])),  # PP-OCR det's upsampling shape
])
@pytest.mark.parametrize("xdtype", [np.uint8, np.int8, np.int16])
@pytest.mark.parametrize("per_channel", [False, True])
def test_conv_transpose(xshape, wshape, attrs, xdtype, per_channel):
    rng = np.random.default_rng(29)
    x = _rand_int(rng, xdtype, xshape)
    w = _rand_int(rng, np.int8, wshape)
    m_out = wshape[1] * attrs.get("group", 1)
    per_channel = per_channel and attrs.get("group", 1) == 1
    consts = dict(w=w, xs=np.float32(0.02), xz=np.int32(_zps(rng, xdtype, 1)[0]),
                  ws=_scales(rng, m_out) if per_channel else np.float32(0.01),
                  wz=_zps(rng, np.int8, wshape[1]) if per_channel else np.int32(3),
                  bias=rng.integers(-5000, 5000, m_out).astype(np.int32))
    m = _model("conv_transpose", {"x": x}, consts, ["x", "w", "xs", "xz", "ws", "wz", "bias"], attrs)
    _compare(m, {"x": x})


LAYER_NORM_CASES = [  # (x dtype, out dtype, shape, axis, per-channel output)
    (np.int8, "int8", (2, 5, 16), -1, False),
    (np.uint8, "uint8", (3, 40), -1, True),
    (np.uint8, "int8", (2, 3, 4, 5), -2, False),
    (np.int8, "uint8", (1, 7, 120), 2, True),
    (np.int16, "int16", (2, 3, 33), -1, False),
]


@pytest.mark.parametrize("rounding", ROUNDING_MODES)
@pytest.mark.parametrize("case", range(len(LAYER_NORM_CASES)))
@pytest.mark.parametrize("affine", ["none", "gamma", "gamma_beta"])
def test_layer_norm(rounding, case, affine):
    xdtype, out_dtype, shape, axis, per_channel = LAYER_NORM_CASES[case]
    rng = np.random.default_rng(31 + case)
    x = _rand_int(rng, xdtype, shape)
    x[0, ...] = _rand_int(rng, xdtype, shape[1:]) // 8  # narrow rows: small variances
    x.reshape(-1, shape[-1])[1] = x.reshape(-1, shape[-1])[1, 0]  # a constant row
    norm = shape[axis:]
    last = shape[-1]
    out_np = np.dtype(out_dtype).type
    consts = dict(xs=np.float32(0.0004 if xdtype == np.int16 else 0.05),
                  xz=np.int32(0 if xdtype == np.int16 else _zps(rng, xdtype, 1)[0]),
                  ys=_scales(rng, last, -2, -1) if per_channel else np.float32(0.03),
                  yz=_zps(rng, out_np, last) if per_channel else np.int32(_zps(rng, out_np, 1)[0]))
    order = ["x", "xs", "xz", "ys", "yz"]
    if affine != "none":
        consts["g"] = rng.uniform(-2, 2, size=norm).astype(np.float32)
        order.append("g")
    if affine == "gamma_beta":
        consts["bt"] = rng.uniform(-1, 1, size=norm[-1:]).astype(np.float32)
        order.append("bt")
    m = _model("layer_norm", {"x": x}, consts, order,
               dict(axis=axis, epsilon=1e-5 if case % 2 else 0.0, out_dtype=out_dtype, rounding=rounding))
    _compare(m, {"x": x})


@pytest.mark.parametrize("rounding", ROUNDING_MODES)
@pytest.mark.parametrize("vdtype", [np.uint8, np.int8])
def test_layer_norm_with_quantized_variance(rounding, vdtype):
    rng = np.random.default_rng(37)
    x = _rand_int(rng, np.uint8, (2, 6, 24))
    var = _rand_int(rng, vdtype, (2, 6, 1))
    consts = dict(xs=np.float32(0.02), xz=np.int32(120), ys=np.float32(0.02), yz=np.int32(128),
                  vs=np.float32(0.003), vz=np.int32(0 if vdtype == np.uint8 else -100))
    m = _model("layer_norm", {"x": x, "v": var}, consts, ["x", "xs", "xz", "ys", "yz", "", "", "v", "vs", "vz"],
               dict(epsilon=0.0, out_dtype="uint8", rounding=rounding))
    _compare(m, {"x": x, "v": var})


@pytest.mark.parametrize("rounding", ROUNDING_MODES)
@pytest.mark.parametrize("xdtype,axis", [(np.int8, -1), (np.uint8, 1), (np.int16, -1)])
def test_variance(rounding, xdtype, axis):
    rng = np.random.default_rng(41)
    x = _rand_int(rng, xdtype, (2, 5, 12))
    consts = dict(xs=np.float32(0.05 if xdtype != np.int16 else 0.001),
                  xz=np.int32(0 if xdtype == np.int16 else _zps(rng, xdtype, 1)[0]),
                  ys=np.float32(0.5 if xdtype != np.int16 else 0.02), yz=np.int32(0))
    m = _model("variance", {"x": x}, consts, ["x", "xs", "xz", "ys", "yz"],
               dict(axis=axis, out_dtype="uint8", rounding=rounding))
    _compare(m, {"x": x})


@pytest.mark.parametrize("op", ["layer_norm", "variance"])
@pytest.mark.parametrize("shape", [None, ["n", "t", 24], ["n", "t", "c"]])
def test_layer_norm_dynamic_dims(op, shape):
    """The normalized element count computed at run time (Shape/ReduceProd) when the dims are not static:
    PP-OCR's recognizer after ONNX Runtime's pre-processing has no inferred shapes at all."""
    rng = np.random.default_rng(43)
    x = _rand_int(rng, np.uint8, (2, 5, 24))
    consts = dict(xs=np.float32(0.05), xz=np.int32(120), ys=np.float32(0.03 if op == "layer_norm" else 0.2),
                  yz=np.int32(128 if op == "layer_norm" else 0))
    m = _model(op, {"x": x}, consts, ["x", "xs", "xz", "ys", "yz"], dict(axis=-1, out_dtype="uint8"))
    vi = m.graph.input[0]
    if shape is None:
        vi.type.tensor_type.ClearField("shape")
    else:
        for d, v in zip(vi.type.tensor_type.shape.dim, shape):
            d.Clear()
            if isinstance(v, str):
                d.dim_param = v
            else:
                d.dim_value = v
    _compare(m, {"x": x})


@pytest.mark.parametrize("rounding", ROUNDING_MODES)
@pytest.mark.parametrize("in_dtype,out_dtype", [(np.uint8, "int8"), (np.int8, "uint8"), (np.int16, "int8")])
@pytest.mark.parametrize("per_axis", [False, True])
def test_requantize_qdq(rounding, in_dtype, out_dtype, per_axis):
    """compute="qdq" (float32 dequantize then quantize), with exact ties among the cases: scales k/255."""
    rng = np.random.default_rng(47)
    x = _rand_int(rng, in_dtype, (2, 5, 7))
    n = 5 if per_axis else 1
    si = (rng.integers(1, 64, n) / 255).astype(np.float32)
    so = (rng.integers(1, 64, n) / 255).astype(np.float32)
    consts = dict(si=si, zi=_zps(rng, in_dtype, n), so=so, zo=_zps(rng, np.dtype(out_dtype).type, n))
    if not per_axis:
        consts = {k: v.reshape(()) for k, v in consts.items()}
    m = _model("requantize", {"x": x}, consts, ["x", "si", "zi", "so", "zo"],
               dict(axis=1, out_dtype=out_dtype, rounding=rounding, compute="qdq"))
    _compare(m, {"x": x})


@pytest.mark.parametrize("rounding", ROUNDING_MODES)
def test_concat_qdq(rounding):
    rng = np.random.default_rng(53)
    x0, x1 = _rand_int(rng, np.int8, (1, 3, 4, 4)), _rand_int(rng, np.uint8, (1, 2, 4, 4))
    consts = dict(ys=np.float32(32 / 255), yz=np.int32(3), s0=np.float32(16 / 255), z0=np.int32(0),
                  s1=np.float32(8 / 255), z1=np.int32(128))
    m = _model("concat", {"x0": x0, "x1": x1}, consts, ["ys", "yz", "x0", "s0", "z0", "x1", "s1", "z1"],
               dict(axis=1, out_dtype="int8", rounding=rounding, compute="qdq"))
    _compare(m, {"x0": x0, "x1": x1})


# TFLite's recipes (qnnx.frontends.tflite): the lowering gives the reference kernels' numbers exactly
@pytest.mark.parametrize("compute", ["fixed_point_q15", "double"])
@pytest.mark.parametrize("rounding", ROUNDING_MODES)
@pytest.mark.parametrize("per_axis", [False, True])
def test_requantize_tflite_modes(compute, rounding, per_axis):
    rng = np.random.default_rng(hash((compute, rounding, per_axis)) % 2**32)
    x = _rand_int(rng, np.int32, (2, 5, 7))
    x[0, :, :3] = np.int32(-(1 << 31))  # the accumulator's extremes, with the zero point's excess beyond them
    x[1, :, :3] = np.int32((1 << 31) - 1)
    n = 5 if per_axis else 1
    zi = rng.integers(-(1 << 31), 1 << 31, size=n).astype(np.int32)
    consts = dict(si=(10.0 ** rng.uniform(-12, -8, size=n)), zi=zi, so=_scales(rng, n, -6, -4), zo=np.zeros(n, np.int32))
    if not per_axis:
        consts = {k: v.reshape(()) for k, v in consts.items()}
    m = _model("requantize", {"x": x}, consts, ["x", "si", "zi", "so", "zo"],
               dict(axis=1, out_dtype="int16", rounding=rounding, compute=compute))
    _compare(m, {"x": x})


@pytest.mark.parametrize("dtype", [np.int8, np.int16])
@pytest.mark.parametrize("attrs", [dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1]),
                                   dict(kernel_shape=[2, 2], strides=[1, 1])])
def test_avg_pool_tflite(dtype, attrs):
    rng = np.random.default_rng(17)
    x = _rand_int(rng, dtype, (2, 3, 7, 8))
    z = np.int32(0 if dtype == np.int16 else -9)
    m = _model("avg_pool", {"x": x}, dict(xs=np.float32(0.03), xz=z, ys=np.float32(0.03), yz=z),
               ["x", "xs", "xz", "ys", "yz"], dict(rounding="tflite", compute="tflite", **attrs))
    _compare(m, {"x": x})


@pytest.mark.parametrize("dtype", [np.int8, np.int16])
@pytest.mark.parametrize("ratio", [0.3, 1.0, 7.5])
def test_global_avg_pool_tflite(dtype, ratio):
    rng = np.random.default_rng(19)
    x = _rand_int(rng, dtype, (2, 4, 7, 5))
    m = _model("global_avg_pool", {"x": x}, dict(xs=np.float32(0.02), xz=np.int32(0 if dtype == np.int16 else 3),
                                                   ys=np.float32(0.02 / ratio), yz=np.int32(0 if dtype == np.int16 else -2)),
               ["x", "xs", "xz", "ys", "yz"], dict(rounding="tflite", compute="tflite"))
    _compare(m, {"x": x})


@pytest.mark.parametrize("x_scale", [0.004, 0.05, 0.3, 2.0])
def test_softmax_tflite(x_scale):
    rng = np.random.default_rng(23)
    x = _rand_int(rng, np.int8, (6, 40))
    x[0] = 5  # a constant row
    x[1] = -128
    x[1, 7] = 127  # one element far above the rest
    m = _model("softmax", {"x": x}, dict(xs=np.float32(x_scale), xz=np.int32(0), ys=np.float32(1 / 256),
                                         yz=np.int32(-128)),
               ["x", "xs", "xz", "ys", "yz"], dict(axis=-1, out_dtype="int8", rounding="tflite", compute="tflite"))
    _compare(m, {"x": x})
