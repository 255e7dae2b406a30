"""Shared helpers for the qnnx test suite.

Everything here is written independently of qnnx's internals: integer ranges,
exact rational rounding, and a tiny model builder for one-node ONNX graphs.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("qnnx", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("qnnx")

ROUNDING_MODES = ("tflite", "upward", "tonearest", "half_even")
COMPUTE_MODES = ("fixed_point", "float")

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1

# name -> (numpy dtype, qmin, qmax)
INT_RANGES = {
    "int2": (np.dtype(ml_dtypes.int2), -2, 1),
    "uint2": (np.dtype(ml_dtypes.uint2), 0, 3),
    "int4": (np.dtype(ml_dtypes.int4), -8, 7),
    "uint4": (np.dtype(ml_dtypes.uint4), 0, 15),
    "int8": (np.dtype(np.int8), -128, 127),
    "uint8": (np.dtype(np.uint8), 0, 255),
    "int16": (np.dtype(np.int16), -32768, 32767),
    "uint16": (np.dtype(np.uint16), 0, 65535),
    "int32": (np.dtype(np.int32), INT32_MIN, INT32_MAX),
}


def qrange(name: str) -> tuple[int, int]:
    return INT_RANGES[name][1], INT_RANGES[name][2]


def clip_to(v, name: str):
    lo, hi = qrange(name)
    return max(lo, min(hi, v))


def sat32(v: int) -> int:
    return max(INT32_MIN, min(INT32_MAX, v))


def ref_round(fr: Fraction, mode: str) -> int:
    """Exact rounding of a rational to an integer; ties resolved by ``mode`` (float semantics:
    ``tflite`` in float math is TfLiteRound = std::round, ties away from zero)."""
    fr = Fraction(fr)
    if mode == "half_even":
        return round(fr)  # Fraction.__round__ rounds half to even
    if mode == "upward":
        return math.floor(fr + Fraction(1, 2))
    if mode in ("tonearest", "tflite"):
        r = math.floor(abs(fr) + Fraction(1, 2))
        return r if fr >= 0 else -r
    raise AssertionError(mode)


def ints(a) -> list[int]:
    """Any integer array (sub-byte ml_dtypes included) as a flat list of Python ints."""
    return [int(v) for v in np.asarray(a).astype(np.int64).ravel()]


@pytest.fixture
def rng():
    return np.random.default_rng(20240611)


# ONNX Runtime's u8 x s8 integer kernels depend on the CPU. On x86-64 with AVX2 but no VNNI, MLAS
# (QgemmU8X8KernelAvx2.S, QgemvU8S8KernelAvx2.S) multiplies the raw bytes with vpmaddubsw, which adds
# the products of adjacent k in pairs saturated to int16, so QLinearConv / QLinearMatMul / QGemm /
# MatMulInteger and their QDQ fusions are not the exact integer product there (microsoft/onnxruntime
# #16105; ORT's quantizer offers reduce_range against it). VNNI, AMX and Arm kernels are exact.
U8S8_SATURATION_NOTE = ("; where a uint8 x int8 product is involved: ONNX Runtime's u8 x s8 kernel saturates pairs of byte products to int16 on this "
                        "CPU (AVX2 without VNNI), so its result is not the exact integer product: see "
                        "tests/test_numerics_mlas.py::test_onnxruntime_u8s8_matmul_is_exact_or_saturates_byte_pairs")


def u8s8_pair_sums(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` of raw uint8 ``a`` (... x K) and int8 ``b`` (K x N) as MLAS's AVX2 u8 x s8 kernel sums
    it: ``sum_j sat16(a[2j] * b[2j] + a[2j+1] * b[2j+1])`` (zero points are applied afterwards, exactly,
    through row and column sums)."""
    a, b = np.asarray(a).astype(np.int64), np.asarray(b).astype(np.int64)
    if a.shape[-1] % 2:
        a = np.concatenate([a, np.zeros((*a.shape[:-1], 1), np.int64)], -1)
        b = np.concatenate([b, np.zeros((1, b.shape[1]), np.int64)], 0)
    p = a[..., :, None] * b  # ... x K x N
    return np.clip(p[..., 0::2, :] + p[..., 1::2, :], -32768, 32767).sum(-2)


def ort_matmul_integer(a: np.ndarray, b: np.ndarray, az, bz) -> np.ndarray:
    """ONNX Runtime's MatMulInteger (CPU) of ``a`` fed at run time and a constant ``b``."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    g = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])], "g",
        [helper.make_tensor_value_info("a", helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.asarray(az, a.dtype), "az"),
         numpy_helper.from_array(np.asarray(bz, b.dtype), "bz")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]


_SATURATES: list[bool] = []


def ort_u8s8_saturates() -> bool:
    """Whether the installed ONNX Runtime's u8 x s8 kernel saturates on this CPU: 255 * -128 twice is
    -65280 exactly, -32768 through vpmaddubsw."""
    if not _SATURATES:
        a, b = np.full((4, 2), 255, np.uint8), np.full((2, 4), -128, np.int8)
        _SATURATES.append(bool(ort_matmul_integer(a, b, 0, 0)[0, 0] != -65280))
    return _SATURATES[0]


def pytest_collection_modifyitems(config, items):
    """``exact_u8s8`` tests compare with ONNX Runtime's fused u8 x s8 integer kernels bit for bit; where those
    kernels clip their 16-bit pair sums (x86 without VNNI), ORT computes another function and the
    comparison has no oracle: they are skipped with that reason (the report warns users the same way)."""
    def applies(item) -> bool:  # exact_u8s8(ids=(...)): only the parameter sets whose id names one of them
        mark = item.get_closest_marker("exact_u8s8")
        ids = mark.kwargs.get("ids") if mark is not None else None
        return mark is not None and (not ids or any(i in getattr(item, "callspec", None).id for i in ids))

    marked = [item for item in items if applies(item)]
    if not marked:
        return
    if ort_u8s8_saturates():
        skip = pytest.mark.skip(reason="ONNX Runtime's u8 x s8 kernels clip 16-bit pair sums on this CPU (x86 "
                                       "without VNNI): no exact oracle here")
        for item in marked:
            item.add_marker(skip)


def one_line_error(fn) -> str:
    """The message of the QnnxError ``fn()`` raises, checked to be one line (what the CLI prints)."""
    from qnnx import QnnxError

    with pytest.raises(QnnxError) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg, msg
    return msg
