"""ONNX Runtime's own quantized arithmetic (qnnx.numerics_mlas, numerics' compute="mlas").

The recipes are checked against the kernels they describe: com.microsoft QLinearAdd, QLinearMul
and QLinearSoftmax on the installed ONNX Runtime, over every input byte pair and every broadcast
form (vector spans, a scalar per span on either side). Tolerance: none (bit-exact).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from conftest import ort_matmul_integer, ort_u8s8_saturates, u8s8_pair_sums

from qnnx import numerics
from qnnx.errors import QnnxError
from qnnx.numerics_mlas import fma_f32, span_kind

F32 = np.float32
MS = "com.microsoft"


def _session(nodes, inputs, inits):
    g = helper.make_graph(nodes, "g", inputs, [helper.make_empty_tensor_value_info("y")], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)], ir_version=9)
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


def _qparams(rng, dtype):
    info = np.iinfo(dtype)
    s = [F32(np.exp(rng.uniform(-6, -1))) for _ in range(3)]
    z = [int(rng.integers(info.min, int(info.max) + 1)) for _ in range(3)]
    return s, z


BROADCASTS = [((256, 256), (256, 256)),  # vector spans; with the grid below, every byte pair
              ((1, 7, 5, 9), (1, 7, 1, 1)),  # one b per span (per-channel constant)
              ((1, 7, 1, 1), (1, 7, 5, 9)),  # one a per span: ORT swaps the operands
              ((), (300,)), ((300,), ()), ((3, 1), (1, 40))]


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("seed", range(4))
def test_binary_matches_onnxruntime(dtype, op, seed):
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    (sa, sb, sy), (za, zb, zy) = _qparams(rng, dtype)
    ty = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [numpy_helper.from_array(np.asarray(v, t), n) for n, v, t in
             (("sa", sa, F32), ("za", za, dtype), ("sb", sb, F32), ("zb", zb, dtype), ("sy", sy, F32), ("zy", zy, dtype))]
    node = helper.make_node(op, ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"], domain=MS)
    sess = _session([node], [helper.make_tensor_value_info(n, ty, None) for n in "ab"], inits)
    fn = numerics.add if op == "QLinearAdd" else numerics.mul
    for sha, shb in BROADCASTS:
        if sha == (256, 256):
            a, b = np.meshgrid(np.arange(info.min, int(info.max) + 1), np.arange(info.min, int(info.max) + 1),
                               indexing="ij")
            a, b = a.astype(dtype), b.astype(dtype)
        else:
            a = rng.integers(info.min, int(info.max) + 1, size=sha).astype(dtype)
            b = rng.integers(info.min, int(info.max) + 1, size=shb).astype(dtype)
        want = sess.run(None, {"a": a, "b": b})[0]
        got = fn(a, sa, za, b, sb, zb, sy, zy, out_dtype=np.dtype(dtype).name, rounding="half_even", compute="mlas")
        assert got.shape == want.shape
        assert np.array_equal(got, want.astype(np.int64)), f"{sha} x {shb}: {(got != want).sum()} differ"


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("length,axis", [(16, 1), (7, -1), (100, -1), (6625, -1)])
def test_softmax_matches_onnxruntime(dtype, length, axis):
    rng = np.random.default_rng(length)
    info = np.iinfo(dtype)
    shape = (2, length, 3) if axis == 1 else (3, 2, length)
    for sx, sy in ((F32(0.07), F32(1 / 256)), (F32(0.5), F32(1 / 255)), (F32(0.003), F32(0.004))):
        zx, zy = int(rng.integers(info.min, int(info.max) + 1)), int(info.min)
        ty = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        inits = [numpy_helper.from_array(np.asarray(v, t), n) for n, v, t in
                 (("sx", sx, F32), ("zx", zx, dtype), ("sy", sy, F32), ("zy", zy, dtype))]
        node = helper.make_node("QLinearSoftmax", ["x", "sx", "zx", "sy", "zy"], ["y"], domain=MS, opset=13, axis=axis)
        sess = _session([node], [helper.make_tensor_value_info("x", ty, list(shape))], inits)
        x = rng.integers(info.min, int(info.max) + 1, size=shape).astype(dtype)
        want = sess.run(None, {"x": x})[0]
        got = numerics.softmax(x, sx, zx, sy, zy, axis=axis, out_dtype=np.dtype(dtype).name, compute="mlas")
        assert np.array_equal(got, want.astype(np.int64)), f"{(got != want).sum()} of {x.size} differ"


def test_fma_rounds_once():
    rng = np.random.default_rng(0)
    x, y = F32(rng.normal(size=2000)), F32(rng.normal(size=2000))
    # z chosen near -x*y so cancellation exposes a second rounding
    z = (-(x.astype(np.float64) * y) * (1 + rng.normal(size=2000) * 1e-7)).astype(F32)
    got = fma_f32(x, y, z)
    for xi, yi, zi, gi in zip(x, y, z, got):
        exact = Fraction(float(xi)) * Fraction(float(yi)) + Fraction(float(zi))
        lo, hi = np.nextafter(gi, F32(-np.inf)), np.nextafter(gi, F32(np.inf))
        err = abs(Fraction(float(gi)) - exact)  # the result is the nearest float32
        assert err <= abs(Fraction(float(lo)) - exact) and err <= abs(Fraction(float(hi)) - exact)


def test_fma_differs_from_two_roundings():
    # 1 + 2**-24 rounds to 1 as a float32 product, but the fused sum keeps it
    x, y, z = F32(1 + 2 ** -12), F32(1 + 2 ** -12), F32(-1.0)
    assert fma_f32(x, y, z) == F32(2 ** -11 + 2 ** -24)
    assert F32(x * y) + z != fma_f32(x, y, z)


@pytest.mark.parametrize("a,b,kind", [((4, 5), (4, 5), "vector"), ((1, 3, 4, 4), (1, 3, 1, 1), "scalar_b"),
                                      ((3, 1, 1), (3, 8, 8), "scalar_a"), ((), (9,), "scalar_a"),
                                      ((2, 1), (2, 1), "vector"), (("n", 4), ("n", 4), "vector")])
def test_span_kind(a, b, kind):
    assert span_kind(a, b) == kind


def test_span_kind_unknown_sizes_refused():
    with pytest.raises(ValueError, match="span"):
        span_kind(("n", "h"), ("n", "w"))


@pytest.mark.parametrize("call,match", [
    (lambda: numerics.add(np.zeros(4, np.uint8), np.ones(4, F32) * 0.1, 0, np.zeros(4, np.uint8), 0.1, 0, 0.1, 0,
                          axis=0, out_dtype="uint8", rounding="half_even", compute="mlas"), "per-tensor a_scale"),
    (lambda: numerics.mul(np.zeros(4, np.int16), 0.1, 0, np.zeros(4, np.int16), 0.1, 0, 0.1, 0,
                          out_dtype="int16", rounding="half_even", compute="mlas"), "8-bit a"),
    (lambda: numerics.add(np.zeros(4, np.int8), 0.1, 0, np.zeros(4, np.int8), 0.1, 0, 0.1, 0,
                          out_dtype="int8", rounding="tflite", compute="mlas"), "half_even"),
    (lambda: numerics.add(np.zeros(4, np.int8), 0.1, 0, np.zeros(4, np.int8), 0.1, 0, 0.1, 0,
                          out_dtype="int8", rounding="half_even", compute="mlas", subtract=True), "unknown compute"),
    (lambda: numerics.softmax(np.zeros((2, 4), np.int16), 0.1, 0, 1 / 256, 0, out_dtype="uint8",
                              compute="mlas"), "8-bit x"),
])
def test_mlas_limits_are_errors(call, match):
    with pytest.raises(QnnxError, match=match):
        call()


@pytest.mark.parametrize("m,k,n", [(1, 7, 3), (5, 7, 3), (8, 6, 5), (4, 64, 16), (33, 130, 40)])
@pytest.mark.parametrize("per_column", [False, True])
def test_onnxruntime_u8s8_matmul_is_exact_or_saturates_byte_pairs(m, k, n, per_column):
    """What ORT's u8 x s8 integer product is on this CPU: exact (VNNI, AMX, Arm), or the sum of int16
    saturated pairs of raw byte products (AVX2 without VNNI), never anything else. qnnx's canonical
    form and lowering are exact, so on the second kind of CPU the comparisons of a u8 x s8 model with
    ORT differ by the saturation (conftest.U8S8_SATURATION_NOTE)."""
    rng = np.random.default_rng(m * 1000 + k + n)
    a = rng.integers(0, 256, (m, k)).astype(np.uint8)
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    az = np.uint8(rng.integers(0, 256))
    bz = rng.integers(-128, 128, n if per_column else ()).astype(np.int8)
    got = ort_matmul_integer(a, b, az, bz)
    a64, b64, bz64 = a.astype(np.int64), b.astype(np.int64), np.asarray(bz).astype(np.int64)
    exact = (a64 - int(az)) @ (b64 - bz64)
    if not ort_u8s8_saturates():
        np.testing.assert_array_equal(got, exact)
        return
    paired = u8s8_pair_sums(a, b) - int(az) * b64.sum(0) - bz64 * a64.sum(1)[:, None] + k * int(az) * bz64
    np.testing.assert_array_equal(got, paired)
    assert m == 1 or np.any(paired != exact), "degenerate test: no pair saturated"
