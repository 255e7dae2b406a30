"""Reference kernels of the qnnx dialect against independent computations."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator as OnnxReference

from conftest import COMPUTE_MODES, INT32_MAX, INT32_MIN, INT_RANGES, ROUNDING_MODES, qrange
from qnnx import QnnxError, numerics
from qnnx.dialect import REGISTRY


def run_kernel(name, *inputs, **attrs):
    schema = REGISTRY[name]
    out = schema.kernel(*inputs, **schema.resolve_attributes(attrs, f"test {name}"))
    assert isinstance(out, tuple) and len(out) == 1
    return out[0]


def rand_int(rng, dtype, shape, lo=None, hi=None):
    qlo, qhi = qrange(dtype)
    lo = qlo if lo is None else lo
    hi = qhi if hi is None else hi
    return rng.integers(lo, hi + 1, size=shape).astype(INT_RANGES[dtype][0])


# --------------------------------------------------------------------------- conv


def onnx_conv_float64(xs, ws, attrs):
    """onnx.reference's Conv on already-shifted float64 operands (integers < 2**53: exact)."""
    attrs = {k: v for k, v in attrs.items() if v is not None}
    node = helper.make_node("Conv", ["X", "W"], ["Y"], **attrs)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("X", TensorProto.DOUBLE, None),
                                               helper.make_tensor_value_info("W", TensorProto.DOUBLE, None)],
                              [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return OnnxReference(model).run(None, {"X": xs, "W": ws})[0]


CONV_CASES = {
    "1d": dict(x=(2, 3, 11), w=(4, 3, 3), attrs=dict(pads=[1, 2], strides=[2], dilations=[2])),
    "1d_same_upper": dict(x=(1, 2, 10), w=(3, 2, 4), attrs=dict(auto_pad="SAME_UPPER", strides=[3])),
    "2d": dict(x=(2, 3, 7, 6), w=(5, 3, 3, 3), attrs=dict(pads=[1, 0, 2, 1])),
    "2d_stride_dilation": dict(x=(1, 2, 9, 8), w=(3, 2, 3, 2), attrs=dict(strides=[2, 3], dilations=[2, 1],
                                                                          pads=[2, 1, 0, 1])),
    "groups": dict(x=(1, 4, 6, 6), w=(6, 2, 3, 3), attrs=dict(group=2, pads=[1, 1, 1, 1])),
    "depthwise": dict(x=(2, 3, 5, 5), w=(3, 1, 3, 3), attrs=dict(group=3, pads=[1, 1, 1, 1])),
    "depthwise_multiplier": dict(x=(1, 3, 6, 5), w=(6, 1, 2, 3), attrs=dict(group=3, strides=[2, 1])),
    "same_upper": dict(x=(1, 2, 7, 8), w=(3, 2, 4, 3), attrs=dict(auto_pad="SAME_UPPER", strides=[2, 3])),
    "same_lower": dict(x=(1, 2, 7, 8), w=(3, 2, 4, 3), attrs=dict(auto_pad="SAME_LOWER", strides=[2, 3])),
    "same_lower_dilated": dict(x=(1, 2, 6, 6), w=(2, 2, 2, 2), attrs=dict(auto_pad="SAME_LOWER",
                                                                          dilations=[2, 2])),
    "same_lower_odd_total": dict(x=(1, 2, 5, 6), w=(2, 2, 4, 2), attrs=dict(auto_pad="SAME_LOWER")),
    "same_upper_odd_total": dict(x=(1, 2, 5, 6), w=(2, 2, 4, 2), attrs=dict(auto_pad="SAME_UPPER")),
    "valid": dict(x=(1, 2, 7, 8), w=(3, 2, 4, 3), attrs=dict(auto_pad="VALID", strides=[2, 2])),
}
CONV_TYPES = [("int8", "int8"), ("uint8", "uint8"), ("uint8", "int8"), ("int16", "int8"), ("uint16", "uint4"),
              ("int8", "int4")]


@pytest.mark.parametrize("xt,wt", CONV_TYPES)
@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv_matches_float64_conv(case, xt, wt, rng):
    spec = CONV_CASES[case]
    x = rand_int(rng, xt, spec["x"])
    w = rand_int(rng, wt, spec["w"])
    m = spec["w"][0]
    wlo, whi = qrange(wt)
    xz = np.int32(rng.integers(*qrange(xt)))
    wz = rng.integers(wlo, whi + 1, m).astype(np.int32)  # per output channel
    bias = rng.integers(-50000, 50000, m).astype(np.int32)
    w_scale = rng.uniform(0.001, 0.1, m).astype(np.float32)
    attrs = spec["attrs"]
    y = run_kernel("conv", x, w, np.float32(0.02), xz, w_scale, wz, bias, **attrs)
    xs = x.astype(np.float64) - float(xz)
    ws = w.astype(np.float64) - wz.astype(np.float64).reshape(m, *[1] * (w.ndim - 1))
    want = onnx_conv_float64(xs, ws, attrs)
    assert np.abs(want).max() < 2 ** 31 - 2 ** 17  # no int32 wrap in this test
    want = want + bias.reshape(1, m, *[1] * (x.ndim - 2))
    assert y.dtype == np.int32 and y.shape == want.shape
    np.testing.assert_array_equal(y.astype(np.int64), want.astype(np.int64))
    # the per-tensor w zero point path, no bias
    y0 = run_kernel("conv", x, w, np.float32(0.02), xz, np.float32(0.05), np.int32(wz[0]), **attrs)
    want0 = onnx_conv_float64(xs, w.astype(np.float64) - float(wz[0]), attrs)
    np.testing.assert_array_equal(y0.astype(np.int64), want0.astype(np.int64))


def test_conv_nested_loop_1d():
    """A hand-written loop for one case, independent of onnx.reference too."""
    x = np.array([[[3, -1, 4, 1, -5, 9, 2]]], np.int8)
    w = np.array([[[2, -7, 1]], [[0, 1, 0]]], np.int8)
    xz, wz = 1, np.array([1, -2], np.int32)
    pads, stride, dil = (2, 1), 2, 2
    xp = [0] * pads[0] + [int(v) - xz for v in x[0, 0]] + [0] * pads[1]
    want = []
    for m in range(2):
        row = []
        for o in range((len(xp) - dil * 2 - 1) // stride + 1):
            row.append(sum(xp[o * stride + k * dil] * (int(w[m, 0, k]) - int(wz[m])) for k in range(3)))
        want.append(row)
    y = run_kernel("conv", x, w, np.float32(1), np.int32(xz), np.ones(2, np.float32), wz, pads=list(pads),
                   strides=[stride], dilations=[dil])
    assert y.tolist() == [want]


def test_conv_accumulator_wraps_int32():
    x = np.full((1, 1, 1, 1), 32767, np.int16)
    w = np.full((1, 1, 1, 1), 127, np.int8)
    y = run_kernel("conv", x, w, np.float32(1), np.int32(-32768), np.float32(1), np.int32(-128),
                   np.array([INT32_MAX], np.int32))
    v = 65535 * 255 + INT32_MAX
    assert int(y.ravel()[0]) == (v - INT32_MIN) % 2 ** 32 + INT32_MIN


def test_conv_errors():
    x = np.zeros((1, 4, 5, 5), np.int8)
    w = np.zeros((6, 2, 3, 3), np.int8)
    with pytest.raises(QnnxError, match="channels do not match"):
        run_kernel("conv", x, w, np.float32(1), np.int32(0), np.float32(1), np.int32(0), group=1)
    with pytest.raises(QnnxError, match="w_zero_point has 3 values but axis 0"):
        run_kernel("conv", x, w, np.float32(1), np.int32(0), np.float32(1), np.zeros(3, np.int32), group=2)
    with pytest.raises(QnnxError, match="per-channel x qparams need a depthwise conv"):
        run_kernel("conv", x, w, np.float32(1), np.zeros(4, np.int32), np.float32(1), np.int32(0), group=2)
    dw = np.zeros((4, 1, 3, 3), np.int8)
    with pytest.raises(QnnxError, match="x_zero_point has 3 values but axis 1"):
        run_kernel("conv", x, dw, np.float32(1), np.zeros(3, np.int32), np.float32(1), np.int32(0), group=4)
    with pytest.raises(QnnxError, match="x_scale has 2 values but axis 1"):
        run_kernel("conv", x, dw, np.ones(2, np.float32), np.int32(0), np.float32(1), np.int32(0), group=4)
    with pytest.raises(QnnxError, match="bias must be int32"):
        run_kernel("conv", x, w, np.float32(1), np.int32(0), np.float32(1), np.int32(0),
                   np.zeros(6, np.int64), group=2)
    with pytest.raises(QnnxError, match="x has dtype int32"):
        run_kernel("conv", x.astype(np.int32), w, np.float32(1), np.int32(0), np.float32(1), np.int32(0), group=2)
    with pytest.raises(QnnxError, match="kernel_shape"):
        run_kernel("conv", x, w, np.float32(1), np.int32(0), np.float32(1), np.int32(0), group=2,
                   kernel_shape=[2, 2])
    with pytest.raises(QnnxError, match="x_scale must be positive and finite"):
        run_kernel("conv", x, w, np.float32(0), np.int32(0), np.float32(1), np.int32(0), group=2)


# --------------------------------------------------------------------------- matmul


def matmul_int64(a, b):
    """Broadcast product-and-sum (not np.matmul): y[..., i, j] = sum_k a[..., i, k] * b[..., k, j]."""
    return (a[..., :, :, None] * b[..., None, :, :]).sum(axis=-2)


@pytest.mark.parametrize("at,bt", [("int8", "int8"), ("uint8", "uint8"), ("uint8", "int8"), ("int16", "int16"),
                                   ("uint16", "int4")])
@pytest.mark.parametrize("a_shape,b_shape", [((3, 5), (5, 4)), ((2, 3, 5), (5, 4)), ((2, 1, 3, 5), (4, 5, 6)),
                                             ((3, 5), (2, 5, 4)), ((1, 3, 5), (2, 5, 4))])
def test_matmul_exact(a_shape, b_shape, at, bt, rng):
    a, b = rand_int(rng, at, a_shape), rand_int(rng, bt, b_shape)
    rows, cols = a_shape[-2], b_shape[-1]
    for az in (np.int32(rng.integers(*qrange(at))), rand_int(rng, at, rows).astype(np.int32)):
        for bz in (np.int32(rng.integers(*qrange(bt))), rand_int(rng, bt, cols).astype(np.int32)):
            a_scale = np.float32(0.1) if az.ndim == 0 else np.full(rows, 0.1, np.float32)
            b_scale = np.float32(0.1) if bz.ndim == 0 else np.full(cols, 0.1, np.float32)
            y = run_kernel("matmul", a, a_scale, az, b, b_scale, bz)
            a64 = a.astype(np.int64) - np.asarray(az, np.int64).reshape(-1, 1)
            b64 = b.astype(np.int64) - np.asarray(bz, np.int64).reshape(-1)
            want = matmul_int64(a64, b64)
            want = (want - INT32_MIN) % 2 ** 32 + INT32_MIN  # int32 accumulator wraps
            assert y.dtype == np.int32 and y.shape == want.shape
            np.testing.assert_array_equal(y.astype(np.int64), want)


def test_matmul_wraps_and_errors():
    a = np.full((1, 2), 32767, np.int16)
    b = np.full((2, 1), 32767, np.int16)
    y = run_kernel("matmul", a, np.float32(1), np.int32(-32768), b, np.float32(1), np.int32(-32768))
    assert int(y[0, 0]) == (2 * 65535 ** 2 - INT32_MIN) % 2 ** 32 + INT32_MIN
    with pytest.raises(QnnxError, match="do not match"):
        run_kernel("matmul", np.zeros((2, 3), np.int8), np.float32(1), 0, np.zeros((2, 3), np.int8), np.float32(1), 0)
    with pytest.raises(QnnxError, match="b_zero_point must be a scalar or 1-D of 3"):
        run_kernel("matmul", np.zeros((2, 2), np.int8), np.float32(1), 0, np.zeros((2, 3), np.int8), np.float32(1),
                   np.zeros(2, np.int32))
    with pytest.raises(QnnxError, match="a_scale must be a scalar or 1-D of 2"):
        run_kernel("matmul", np.zeros((2, 2), np.int8), np.ones(3, np.float32), 0, np.zeros((2, 3), np.int8),
                   np.float32(1), 0)


# --------------------------------------------------------------------------- pooling


def window_sums(xs, kernel, strides, pads):
    """Sum and element count of every 2-D window of already-shifted int64 ``xs`` (N, C, H, W); pads are
    [top, left, bottom, right] of zeros that are not counted."""
    n, c, h, w = xs.shape
    kh, kw = kernel
    sh, sw = strides
    oh = (h + pads[0] + pads[2] - kh) // sh + 1
    ow = (w + pads[1] + pads[3] - kw) // sw + 1
    sums = np.zeros((n, c, oh, ow), np.int64)
    counts = np.zeros((oh, ow), np.int64)
    for i in range(oh):
        for j in range(ow):
            r0, c0 = i * sh - pads[0], j * sw - pads[1]
            rows = [r for r in range(r0, r0 + kh) if 0 <= r < h]
            cols = [q for q in range(c0, c0 + kw) if 0 <= q < w]
            counts[i, j] = len(rows) * len(cols)
            if rows and cols:
                sums[:, :, i, j] = xs[:, :, rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1].sum(axis=(2, 3))
    return sums, counts


def requantize_sum(total, count, sx, sy, zy, dtype, rounding, compute):
    """numerics.requantize of one window sum: input scale x_scale, output scale count * y_scale."""
    return int(numerics.requantize(np.array([total], np.int32), np.float64(sx), 0, np.float64(count) * np.float64(sy),
                                   int(zy), rounding=rounding, compute=compute, out_dtype=dtype)[0])


@pytest.mark.parametrize("compute", COMPUTE_MODES)
@pytest.mark.parametrize("rounding", ROUNDING_MODES)
@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("dtype,per_channel,kernel,strides,pads", [
    ("int8", False, (3, 3), (1, 1), (1, 1, 1, 1)),
    ("uint8", True, (2, 3), (2, 1), (0, 1, 1, 0)),
    ("int16", True, (3, 2), (2, 2), (0, 0, 0, 0)),
    ("uint16", False, (2, 2), (1, 2), (1, 0, 0, 1)),
])
def test_avg_pool_requantizes_exact_window_sum(dtype, per_channel, kernel, strides, pads, count_include_pad,
                                               rounding, compute, rng):
    x = rand_int(rng, dtype, (2, 3, 6, 5))
    lo, hi = qrange(dtype)
    c = x.shape[1]
    if per_channel:
        sx, zx = rng.uniform(0.01, 0.1, c).astype(np.float32), rng.integers(lo, hi + 1, c).astype(np.int32)
        sy, zy = rng.uniform(0.01, 0.1, c).astype(np.float32), rng.integers(lo, hi + 1, c).astype(np.int32)
    else:
        sx, zx = np.float32(0.037), np.int32((lo + hi) // 3)
        sy, zy = np.float32(0.051), np.int32((lo + hi) // 2)
    y = run_kernel("avg_pool", x, sx, zx, sy, zy, kernel_shape=list(kernel), strides=list(strides),
                   pads=list(pads), count_include_pad=count_include_pad, rounding=rounding, compute=compute)
    ch = lambda p, i: np.asarray(p).reshape(-1)[i if np.asarray(p).size > 1 else 0]  # noqa: E731
    xs = x.astype(np.int64) - np.broadcast_to(np.asarray(zx, np.int64).reshape(1, -1, 1, 1), (1, c, 1, 1))
    sums, counts = window_sums(xs, kernel, strides, pads)
    assert y.dtype == x.dtype and y.shape == sums.shape
    want = np.empty(sums.shape, np.int64)
    for idx in np.ndindex(*sums.shape):
        n, k, i, j = idx
        count = kernel[0] * kernel[1] if count_include_pad else counts[i, j]
        want[idx] = requantize_sum(sums[idx], count, ch(sx, k), ch(sy, k), ch(zy, k), dtype, rounding, compute)
    np.testing.assert_array_equal(y.astype(np.int64), want)


@pytest.mark.parametrize("compute", COMPUTE_MODES)
@pytest.mark.parametrize("rounding", ROUNDING_MODES)
def test_avg_pool_same_upper_counts_only_real_elements(rounding, compute):
    x = np.arange(16, dtype=np.int8).reshape(1, 1, 4, 4)
    # SAME_UPPER, kernel 2, stride 1: one row/column of padding at the end.
    y = run_kernel("avg_pool", x, np.float32(1), np.int32(0), np.float32(1), np.int32(0), kernel_shape=[2, 2],
                   auto_pad="SAME_UPPER", rounding=rounding, compute=compute)
    xs = x.astype(np.int64)
    sums, counts = window_sums(xs, (2, 2), (1, 1), (0, 0, 1, 1))
    want = [[requantize_sum(sums[0, 0, i, j], counts[i, j], 1.0, 1.0, 0, "int8", rounding, compute)
             for j in range(4)] for i in range(4)]
    assert y[0, 0].tolist() == want
    assert y[0, 0, 3, 3] == 15 and counts[3, 3] == 1


@pytest.mark.parametrize("compute", COMPUTE_MODES)
@pytest.mark.parametrize("rounding", ROUNDING_MODES)
@pytest.mark.parametrize("dtype,per_channel,spatial", [("int8", False, (5, 4)), ("uint8", True, (3, 3)),
                                                        ("int16", True, (7,)), ("int8", True, (2, 2, 3))])
def test_global_avg_pool(dtype, per_channel, spatial, rounding, compute, rng):
    c = 4
    x = rand_int(rng, dtype, (2, c, *spatial))
    lo, hi = qrange(dtype)
    if per_channel:
        sx, zx = rng.uniform(0.01, 0.1, c).astype(np.float32), rng.integers(lo, hi + 1, c).astype(np.int32)
        sy, zy = rng.uniform(0.01, 0.1, c).astype(np.float32), rng.integers(lo, hi + 1, c).astype(np.int32)
    else:
        sx, zx, sy, zy = np.float32(0.02), np.int32(lo + 7), np.float32(0.03), np.int32(hi - 9)
    y = run_kernel("global_avg_pool", x, sx, zx, sy, zy, rounding=rounding, compute=compute)
    assert y.dtype == x.dtype and y.shape == (2, c, *[1] * len(spatial))
    count = int(np.prod(spatial))
    ch = lambda p, i: np.asarray(p).reshape(-1)[i if np.asarray(p).size > 1 else 0]  # noqa: E731
    for n in range(2):
        for k in range(c):
            total = int((x[n, k].astype(np.int64) - int(ch(zx, k))).sum())
            want = requantize_sum(total, count, ch(sx, k), ch(sy, k), ch(zy, k), dtype, rounding, compute)
            assert int(y[n, k].ravel()[0]) == want


@pytest.mark.parametrize("compute", COMPUTE_MODES)
@pytest.mark.parametrize("rounding", ["tflite", "half_even"])
def test_global_avg_pool_many_wide_sums(rounding, compute, rng):
    """Many int16 windows (sums up to ~1.6e6) and a non-power-of-two count: results span the int16 range,
    so the multiplier x_scale / (count * y_scale) must be computed exactly as documented (float64)."""
    n, c = 256, 32
    x = rand_int(rng, "int16", (n, c, 5, 5))
    sx = rng.uniform(0.5, 2, c).astype(np.float32)
    sy = (sx / rng.uniform(20, 60, c)).astype(np.float32)
    zx, zy = rng.integers(-300, 300, c).astype(np.int32), rng.integers(-300, 300, c).astype(np.int32)
    y = run_kernel("global_avg_pool", x, sx, zx, sy, zy, rounding=rounding, compute=compute)
    sums = (x.astype(np.int64) - zx.reshape(1, c, 1, 1)).sum(axis=(2, 3)).astype(np.int32)
    want = numerics.requantize(sums, sx.astype(np.float64), 0, 25.0 * sy.astype(np.float64), zy, axis=1,
                               rounding=rounding, compute=compute, out_dtype="int16")
    assert np.abs(want.astype(np.int64)).max() > 10000
    np.testing.assert_array_equal(y.reshape(n, c), want)


def test_pool_errors():
    x = np.zeros((1, 2, 4, 4), np.int8)
    with pytest.raises(QnnxError, match="requires kernel_shape"):
        run_kernel("avg_pool", x, np.float32(1), np.int32(0), np.float32(1), np.int32(0))
    with pytest.raises(QnnxError, match="y_scale has 3 values but axis 1"):
        run_kernel("global_avg_pool", x, np.float32(1), np.int32(0), np.ones(3, np.float32), np.int32(0))
    with pytest.raises(QnnxError, match="ceil_mode=1 is not one of"):
        run_kernel("avg_pool", x, np.float32(1), np.int32(0), np.float32(1), np.int32(0), kernel_shape=[2, 2],
                   ceil_mode=1)


# --------------------------------------------------------------------------- concat


@pytest.mark.parametrize("compute", COMPUTE_MODES)
@pytest.mark.parametrize("rounding", ROUNDING_MODES)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_per_tensor_equals_requantize_then_concatenate(axis, rounding, compute, rng):
    shapes = [(2, 3, 4), (2, 3, 4), (2, 3, 4)]
    dtypes = ["int8", "uint8", "int16"]
    shapes = [tuple(d + i if k == axis % 3 else d for k, d in enumerate(s)) for i, s in enumerate(shapes)]
    xs = [rand_int(rng, t, s) for t, s in zip(dtypes, shapes)]
    qp = [(np.float32(0.01 * (i + 1)), np.int32(rng.integers(*qrange(t)) // 2)) for i, t in enumerate(dtypes)]
    ys, yz = np.float32(0.025), np.int32(-3)
    flat = [v for x, (s, z) in zip(xs, qp) for v in (x, s, z)]
    y = run_kernel("concat", ys, yz, *flat, axis=axis, out_dtype="int8", rounding=rounding, compute=compute)
    want = np.concatenate([numerics.requantize(x, s, z, ys, yz, out_dtype="int8", rounding=rounding,
                                               compute=compute) for x, (s, z) in zip(xs, qp)], axis=axis)
    assert y.dtype == np.int8
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("rounding", ROUNDING_MODES)
def test_concat_per_axis_along_concat_axis(rounding, rng):
    a, b = rand_int(rng, "int8", (2, 3, 4)), rand_int(rng, "int8", (2, 5, 4))
    sa, za = rng.uniform(0.01, 0.1, 3).astype(np.float32), rng.integers(-10, 10, 3).astype(np.int32)
    sb, zb = rng.uniform(0.01, 0.1, 5).astype(np.float32), rng.integers(-10, 10, 5).astype(np.int32)
    # output qparams equal to the inputs': nothing to requantize, the result is the plain concatenation
    y = run_kernel("concat", np.concatenate([sa, sb]), np.concatenate([za, zb]), a, sa, za, b, sb, zb, axis=1,
                   quant_axis=1, out_dtype="int8", rounding=rounding)
    np.testing.assert_array_equal(y, np.concatenate([a, b], axis=1))
    # different per-axis output qparams: each input goes to its own slice of them
    ys, yz = rng.uniform(0.01, 0.1, 8).astype(np.float32), rng.integers(-10, 10, 8).astype(np.int32)
    y = run_kernel("concat", ys, yz, a, sa, za, b, sb, zb, axis=1, quant_axis=1, out_dtype="int8",
                   rounding=rounding)
    want = np.concatenate([numerics.requantize(a, sa, za, ys[:3], yz[:3], axis=1, rounding=rounding),
                           numerics.requantize(b, sb, zb, ys[3:], yz[3:], axis=1, rounding=rounding)], axis=1)
    np.testing.assert_array_equal(y, want)
    # per-axis along another axis (quant_axis=2 while concatenating axis 1)
    qa, qb = rng.uniform(0.01, 0.1, 4).astype(np.float32), rng.uniform(0.01, 0.1, 4).astype(np.float32)
    yq, yzq = rng.uniform(0.01, 0.1, 4).astype(np.float32), rng.integers(-10, 10, 4).astype(np.int32)
    y = run_kernel("concat", yq, yzq, a, qa, np.int32(0), b, qb, np.int32(1), axis=1, quant_axis=2,
                   out_dtype="int8", rounding=rounding)
    want = np.concatenate([numerics.requantize(a, qa, 0, yq, yzq, axis=2, rounding=rounding),
                           numerics.requantize(b, qb, 1, yq, yzq, axis=2, rounding=rounding)], axis=1)
    np.testing.assert_array_equal(y, want)


def test_concat_errors():
    a = np.zeros((2, 3), np.int8)
    with pytest.raises(QnnxError, match="triples"):
        run_kernel("concat", np.float32(1), np.int32(0), a, np.float32(1), axis=0, out_dtype="int8")
    with pytest.raises(QnnxError, match="axis=2 is out of range"):
        run_kernel("concat", np.float32(1), np.int32(0), a, np.float32(1), np.int32(0), axis=2, out_dtype="int8")


# --------------------------------------------------------------------------- lut


@pytest.mark.parametrize("xt", ["int8", "uint8", "int4", "uint4"])
@pytest.mark.parametrize("tt", ["int8", "uint8", "int16"])
def test_lut(xt, tt, rng):
    lo, hi = qrange(xt)
    x = np.array(list(range(lo, hi + 1)) * 2, INT_RANGES[xt][0]).reshape(2, -1)
    table = rand_int(rng, tt, hi - lo + 1)
    y = run_kernel("lut", x, table)
    assert y.dtype == table.dtype and y.shape == x.shape
    assert y[0].tolist() == table.tolist() == y[1].tolist()
    # the usual nonlinearity form: y = table[x - qmin]
    x2 = rand_int(rng, xt, (3, 5))
    np.testing.assert_array_equal(run_kernel("lut", x2, table), table[x2.astype(np.int64) - lo])


def test_lut_per_channel_rows():
    # a 2-D table: row c maps the values of channel c (axis 1), e.g. a BatchNormalization
    rng = np.random.default_rng(3)
    x = rand_int(rng, "uint8", (2, 3, 4, 5))
    table = rand_int(rng, "int8", (3, 256))
    y = run_kernel("lut", x, table, axis=1)
    for c in range(3):
        np.testing.assert_array_equal(y[:, c], table[c][x[:, c].astype(np.int64)])
    y_last = run_kernel("lut", x.transpose(0, 2, 3, 1), table, axis=-1)
    np.testing.assert_array_equal(y_last, y.transpose(0, 2, 3, 1))


def test_lut_errors():
    with pytest.raises(QnnxError, match="256 entries per row for int8 input, got shape \\(255,\\)"):
        run_kernel("lut", np.zeros(3, np.int8), np.zeros(255, np.int8))
    with pytest.raises(QnnxError, match="256 entries per row for uint8"):
        run_kernel("lut", np.zeros(3, np.uint8), np.zeros((2, 128), np.uint8))
    with pytest.raises(QnnxError, match="table has 2 rows but axis 1 of x has 3 channels"):
        run_kernel("lut", np.zeros((1, 3, 2), np.uint8), np.zeros((2, 256), np.uint8), axis=1)
    with pytest.raises(QnnxError, match="16-bit or narrower, got int32"):
        run_kernel("lut", np.zeros(3, np.int32), np.zeros(65536, np.int16))
    with pytest.raises(QnnxError, match="65536 entries per row for uint16 input, got shape \\(256,\\)"):
        run_kernel("lut", np.zeros(3, np.uint16), np.zeros(256, np.uint16))


@pytest.mark.parametrize("xt", ["int16", "uint16"])
def test_lut_16_bit_input(xt, rng):
    # every value of the 16-bit type indexes its own entry, offset by the type's minimum
    lo, hi = qrange(xt)
    table = rand_int(rng, "int16", hi - lo + 1)
    x = np.arange(lo, hi + 1).astype(xt)[::-1].reshape(4, -1)
    np.testing.assert_array_equal(run_kernel("lut", x, table), table[::-1].reshape(4, -1))


# --------------------------------------------------------------------------- schemas


def test_schema_defaults_and_choices():
    s = REGISTRY["requantize"]
    attrs = s.resolve_attributes({"out_dtype": b"uint8"}, "n")
    assert attrs == {"axis": 1, "out_dtype": "uint8", "rounding": "tflite", "compute": "fixed_point"}
    assert REGISTRY["quantize"].resolve_attributes({"out_dtype": "int8"}, "n")["rounding"] == "half_even"
    assert REGISTRY["conv"].resolve_attributes({"pads": (1, 1)}, "n")["pads"] == [1, 1]


@pytest.mark.parametrize("op,given,match", [
    ("requantize", {"out_dtype": "int8", "bogus": 1}, r"unknown attribute\(s\) bogus for qnnx.requantize"),
    ("requantize", {"out_dtype": "int8", "rounding": "nearest"}, "attribute rounding='nearest' is not one of"),
    ("requantize", {"out_dtype": "int8", "compute": "quad"}, "attribute compute='quad' is not one of"),
    ("requantize", {"out_dtype": "int64"}, "attribute out_dtype='int64' is not one of"),
    ("requantize", {}, "qnnx.requantize requires attribute 'out_dtype'"),
    ("quantize", {"rounding": "half_even"}, "requires attribute 'out_dtype'"),
    ("add", {"out_dtype": "int8", "rounding": "down"}, "rounding='down'"),
    ("concat", {"out_dtype": "int8"}, "requires attribute 'axis'"),
    ("conv", {"auto_pad": "SAME"}, "auto_pad='SAME' is not one of"),
])
def test_schema_rejects(op, given, match):
    with pytest.raises(QnnxError, match=match) as info:
        REGISTRY[op].resolve_attributes(given, "node 'n1'")
    assert str(info.value).startswith("node 'n1': ")


def test_registry_covers_the_dialect():
    assert {"quantize", "dequantize", "requantize", "simulated_quantize", "simulated_dequantize", "add", "sub",
            "mul", "concat", "lut", "conv", "matmul", "avg_pool", "global_avg_pool"} <= set(REGISTRY)
