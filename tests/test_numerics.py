"""qnnx.numerics against independent, literal transcriptions of the published algorithms
(gemmlowp / TFLite fixed point) and against exact rational arithmetic (fractions.Fraction)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from conftest import (COMPUTE_MODES, INT32_MAX, INT32_MIN, INT_RANGES, ROUNDING_MODES, clip_to, ints, qrange,
                      ref_round, sat32)
from qnnx import QnnxError, numerics

# --------------------------------------------------------------------------- gemmlowp / TFLite, literally
# Pure Python ints, one element at a time, transcribed from the C++ (tensorflow/lite/kernels/internal/
# quantization_util.cc, common.h; gemmlowp/fixedpoint/fixedpoint.h). No qnnx code is used here.


def tflite_round(d: float) -> int:
    """TfLiteRound(double) == std::round: half away from zero (computed exactly)."""
    f = Fraction(d)
    r = math.floor(abs(f) + Fraction(1, 2))
    return r if f >= 0 else -r


def QuantizeMultiplier(double_multiplier: float) -> tuple[int, int]:
    if double_multiplier == 0.0:
        return 0, 0
    q, shift = math.frexp(double_multiplier)
    q_fixed = tflite_round(q * (1 << 31))
    assert q_fixed <= (1 << 31)
    if q_fixed == (1 << 31):
        q_fixed //= 2
        shift += 1
    assert q_fixed <= INT32_MAX
    if shift < -31:
        shift = 0
        q_fixed = 0
    if shift > 30:
        shift = 30
        q_fixed = (1 << 31) - 1
    return q_fixed, shift


def SaturatingRoundingDoublingHighMul(a: int, b: int) -> int:
    overflow = a == b and a == INT32_MIN
    ab_64 = a * b
    nudge = (1 << 30) if ab_64 >= 0 else (1 - (1 << 30))
    t = ab_64 + nudge
    # C++ '/' on int64 truncates toward zero.
    ab_x2_high32 = abs(t) // (1 << 31) * (1 if t >= 0 else -1)
    return INT32_MAX if overflow else ab_x2_high32


def RoundingDivideByPOT(x: int, exponent: int) -> int:
    assert 0 <= exponent <= 31
    mask = (1 << exponent) - 1
    remainder = x & mask  # Python ints are two's complement for & and >>
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> exponent) + (1 if remainder > threshold else 0)


def MultiplyByQuantizedMultiplier(x: int, quantized_multiplier: int, shift: int) -> int:
    left_shift = shift if shift > 0 else 0
    right_shift = 0 if shift > 0 else -shift
    # C++ computes x * (1 << left_shift) in int32 (UB on overflow); qnnx saturates it: mirror that.
    return RoundingDivideByPOT(SaturatingRoundingDoublingHighMul(sat32(x * (1 << left_shift)),
                                                                 quantized_multiplier), right_shift)


def tflite_requantize(x: int, in_s, in_zp: int, out_s, out_zp: int, out_dtype: str) -> int:
    m, shift = QuantizeMultiplier(float(np.float64(in_s) / np.float64(out_s)))
    return clip_to(MultiplyByQuantizedMultiplier(sat32(x - in_zp), m, shift) + out_zp, out_dtype)


def test_reference_transcription_sanity():
    """Known values of the C++ functions, so the transcription above is itself checked."""
    assert QuantizeMultiplier(0.5) == (1 << 30, 0)
    assert QuantizeMultiplier(1.0) == (1 << 30, 1)
    assert QuantizeMultiplier(0.75) == (3 << 29, 0)
    assert QuantizeMultiplier(2.0 ** -40) == (0, 0)  # flushed
    assert QuantizeMultiplier(2.0 ** 40) == (INT32_MAX, 30)  # saturated
    assert QuantizeMultiplier(1 - 2.0 ** -33) == (1 << 30, 1)  # q*2^31 rounds to 2^31: renormalised
    assert SaturatingRoundingDoublingHighMul(INT32_MIN, INT32_MIN) == INT32_MAX
    assert SaturatingRoundingDoublingHighMul(-1, 1 << 30) == 0  # -0.5 -> 0
    assert SaturatingRoundingDoublingHighMul(1, 1 << 30) == 1  # 0.5 -> 1
    assert SaturatingRoundingDoublingHighMul(-3, 1 << 30) == -1  # -1.5 -> -1
    assert [RoundingDivideByPOT(v, 1) for v in (-3, -2, -1, 1, 2, 3)] == [-2, -1, -1, 1, 1, 2]
    assert RoundingDivideByPOT(-5, 2) == -1 and RoundingDivideByPOT(-6, 2) == -2 and RoundingDivideByPOT(6, 2) == 2
    assert MultiplyByQuantizedMultiplier(INT32_MAX, 1 << 30, 2) == (1 << 30)  # x << 1 saturated, * 0.5


# --------------------------------------------------------------------------- strategies

SIGNED_INPUTS = ("int32", "int32", "int8", "uint8", "int16", "uint16")
FAST = settings(max_examples=300, deadline=None)


def scales(lo=1e-6, hi=1e3):
    """float32 scales in [lo, hi]: hypothesis' own float choice, log-uniform, and exact powers of two."""
    flo, fhi = float(np.float32(lo)), float(np.float32(hi))
    log_uniform = st.floats(math.log2(lo), math.log2(hi)).map(lambda e: min(max(float(np.float32(2.0 ** e)), flo),
                                                                            fhi))
    return st.one_of(st.floats(flo, fhi, width=32, allow_subnormal=False), log_uniform,
                     st.integers(math.ceil(math.log2(lo)), math.floor(math.log2(hi))).map(lambda e: 2.0 ** e))


def values_of(dtype: str):
    lo, hi = qrange(dtype)
    return st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, lo + 1, hi - 1, 0]))


@st.composite
def requant_cases(draw, out_dtypes=("int8", "uint8", "int16", "int32", "int32")):
    in_dtype = draw(st.sampled_from(SIGNED_INPUTS))
    xs = draw(st.lists(values_of(in_dtype), min_size=1, max_size=12))
    in_zp = draw(st.one_of(st.just(0), values_of(in_dtype)))
    out_dtype = draw(st.sampled_from(out_dtypes))
    out_zp = draw(st.one_of(st.just(0), values_of(out_dtype)))
    in_s = np.float32(draw(scales()))
    if draw(st.booleans()):
        out_s = np.float32(draw(scales()))
    else:  # a moderate multiplier, so that results land inside the output range rather than saturate
        ratio = 2.0 ** draw(st.floats(-12, 12))
        out_s = np.float32(min(max(float(in_s) * ratio, float(np.float32(1e-6))), float(np.float32(1e3))))
    x = np.array(xs, dtype=INT_RANGES[in_dtype][0])
    return x, in_s, in_zp, out_s, out_zp, out_dtype


# --------------------------------------------------------------------------- tflite fixed point


@FAST
@given(requant_cases())
@example((np.array([INT32_MIN, INT32_MAX, 0, -1, 1], np.int32), np.float32(1.0), INT32_MAX, np.float32(1e-6),
          0, "int32"))
@example((np.array([INT32_MIN, INT32_MAX, 0, -1, 1], np.int32), np.float32(1e3), INT32_MIN, np.float32(1e-6),
          -5, "int8"))
@example((np.array([-7, -5, -3, -1, 1, 3, 5, 7], np.int32), np.float32(0.5), 0, np.float32(1.0), 0, "int8"))
def test_requantize_tflite_fixed_point_matches_gemmlowp(case):
    x, in_s, in_zp, out_s, out_zp, out_dtype = case
    got = numerics.requantize(x, in_s, in_zp, out_s, out_zp, rounding="tflite", compute="fixed_point",
                              out_dtype=out_dtype)
    assert got.dtype == INT_RANGES[out_dtype][0] and got.shape == x.shape
    want = [tflite_requantize(v, in_s, in_zp, out_s, out_zp, out_dtype) for v in ints(x)]
    assert ints(got) == want


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.floats(1e-15, 1e12, allow_subnormal=False), st.floats(2.0 ** -33, 2.0 ** -29),
                 st.floats(2.0 ** 29, 2.0 ** 32), st.sampled_from([1 - 2.0 ** -32, 1 - 2.0 ** -33, 0.5, 1.0, 2.0 ** 31,
                                                                   2.0 ** 30, 2.0 ** -31, 2.0 ** -32, 3 * 2.0 ** -33])))
def test_quantize_multiplier_matches_tflite(real):
    m, shift = numerics.quantize_multiplier(np.float64(real))
    assert (int(m), int(shift)) == QuantizeMultiplier(real)


def test_quantize_multiplier_vectorised():
    reals = np.array([0.5, 1.0, 0.75, 2.0 ** -40, 2.0 ** 40, 1 - 2.0 ** -33, 1e-3, 123.456])
    m, shift = numerics.quantize_multiplier(reals)
    assert list(zip(ints(m), ints(shift))) == [QuantizeMultiplier(float(r)) for r in reals]


@FAST
@given(st.lists(st.integers(INT32_MIN, INT32_MAX) | st.sampled_from([INT32_MIN, INT32_MAX, 0, -1, 1]),
                min_size=1, max_size=8),
       st.integers(1 << 30, INT32_MAX) | st.sampled_from([1 << 30, INT32_MAX, 0]), st.integers(-31, 30))
def test_multiply_by_quantized_multiplier_matches_gemmlowp(xs, m, shift):
    got = numerics.multiply_by_quantized_multiplier(np.array(xs, np.int64), m, shift, "tflite")
    assert ints(got) == [MultiplyByQuantizedMultiplier(x, m, shift) for x in xs]


@FAST
@given(st.lists(st.integers(INT32_MIN, INT32_MAX), min_size=1, max_size=8), st.integers(1 << 30, INT32_MAX),
       st.integers(-31, 30), st.sampled_from(("upward", "tonearest", "half_even")))
def test_multiply_by_quantized_multiplier_single_rounding(xs, m, shift, mode):
    """Non-tflite modes: the exact product x * M * 2**(shift-31), rounded once."""
    got = numerics.multiply_by_quantized_multiplier(np.array(xs, np.int64), m, shift, mode)
    assert ints(got) == [ref_round(Fraction(x * m) * Fraction(2) ** (shift - 31), mode) for x in xs]


# --------------------------------------------------------------------------- every mode vs exact rationals


def exact_requantize(x, in_s, in_zp, out_s, out_zp):
    """(x - zp) * in_s / out_s + out_zp as an exact rational (x - zp saturates to int32 by definition)."""
    return Fraction(sat32(x - in_zp)) * Fraction(float(in_s)) / Fraction(float(out_s)) + out_zp


@settings(max_examples=250, deadline=None)
@given(requant_cases(), st.sampled_from(ROUNDING_MODES), st.sampled_from(COMPUTE_MODES))
def test_requantize_within_one_lsb_of_exact(case, rounding, compute):
    # Bound: one rounding contributes <= 1/2; tflite's double rounding <= 1/2 + 1/4; the Q31 multiplier
    # has relative error <= 2**-31 and the float path (float32 of x, of the multiplier, of the product)
    # <= 3 * 2**-24 of |(x - zp) * m|, so outputs narrower than int32 (|y| <= 65535 where not clipped) are
    # always within 1 LSB; for int32 outputs that relative error is added explicitly.
    x, in_s, in_zp, out_s, out_zp, out_dtype = case
    got = numerics.requantize(x, in_s, in_zp, out_s, out_zp, rounding=rounding, compute=compute,
                              out_dtype=out_dtype)
    m, shift = QuantizeMultiplier(float(np.float64(in_s) / np.float64(out_s)))
    for v, g in zip(ints(x), ints(got)):
        d = sat32(v - in_zp)
        if (out_dtype == "int32" and rounding == "tflite" and compute == "fixed_point" and shift > 0
                and abs(d << shift) > INT32_MAX):
            continue  # tflite's left shift saturates in int32 (documented): not an approximation of x*m
        scaled = exact_requantize(v, in_s, in_zp, out_s, 0)
        tol = 1
        if out_dtype == "int32":
            tol += abs(scaled) * Fraction(2.0 ** -30 if compute == "fixed_point" else 2.0 ** -21)
        # clip is monotone: the clipped result lies between the clipped ends of the error interval
        # (for narrow outputs this is simply |y - clip(exact)| <= 1)
        lo_end, hi_end = scaled - tol + out_zp, scaled + tol + out_zp
        assert clip_to(lo_end, out_dtype) <= g <= clip_to(hi_end, out_dtype), (v, g, float(scaled + out_zp))


@FAST
@given(requant_cases(), st.sampled_from(("upward", "tonearest", "half_even")))
def test_requantize_fixed_point_single_rounding_is_exact(case, rounding):
    """fixed_point, non-tflite: y = round_mode(d * M * 2**(shift-31)) with (M, shift) = QuantizeMultiplier(m)."""
    x, in_s, in_zp, out_s, out_zp, out_dtype = case
    got = numerics.requantize(x, in_s, in_zp, out_s, out_zp, rounding=rounding, compute="fixed_point",
                              out_dtype=out_dtype)
    m, shift = QuantizeMultiplier(float(np.float64(in_s) / np.float64(out_s)))
    want = [clip_to(ref_round(Fraction(sat32(v - in_zp) * m) * Fraction(2) ** (shift - 31), rounding) + out_zp,
                    out_dtype) for v in ints(x)]
    assert ints(got) == want


def f32_product(d: int, m: float) -> float:
    """float32(float32(d) * float32(m)) with one rounding of the product: two 24-bit significands
    multiply exactly in float64, so the float64 -> float32 cast is the single product rounding."""
    return float(np.float32(np.float64(np.float32(d)) * np.float64(np.float32(m))))


@FAST
@given(requant_cases(), st.sampled_from(ROUNDING_MODES))
def test_requantize_float_compute_is_exact_float32(case, rounding):
    """float: y = round_mode(f32(f32(d) * f32(in_s/out_s))); for |d| < 2**24, f32(d) == d (no input rounding)."""
    x, in_s, in_zp, out_s, out_zp, out_dtype = case
    got = numerics.requantize(x, in_s, in_zp, out_s, out_zp, rounding=rounding, compute="float",
                              out_dtype=out_dtype)
    m = float(np.float64(in_s) / np.float64(out_s))
    for v, g in zip(ints(x), ints(got)):
        d = sat32(v - in_zp)
        if abs(d) < 2 ** 24:
            assert float(np.float32(d)) == d
        p = f32_product(d, m)
        assert g == clip_to(ref_round(Fraction(p), rounding) + out_zp, out_dtype), (v, g, p)


# --------------------------------------------------------------------------- ties

# (x - zp) * in_s / out_s == x / 2 for odd x: exactly k + 1/2.
TIE_X = [-7, -5, -3, -1, 1, 3, 5, 7]  # halves: -3.5 ... 3.5
TIE_EXPECTED = {
    "half_even": [-4, -2, -2, 0, 0, 2, 2, 4],
    "upward": [-3, -2, -1, 0, 1, 2, 3, 4],
    "tonearest": [-4, -3, -2, -1, 1, 2, 3, 4],
}


@pytest.mark.parametrize("compute", COMPUTE_MODES)
@pytest.mark.parametrize("rounding", ROUNDING_MODES)
@pytest.mark.parametrize("in_s", [0.5, 1.0, 2.0 ** -10, 0.1, 3.7e-3])
def test_requantize_ties_half(rounding, compute, in_s):
    in_s = np.float32(in_s)
    out_s = np.float32(2) * in_s  # exact in float32: the multiplier is exactly 1/2
    x = np.array(TIE_X, np.int32) + 3
    got = ints(numerics.requantize(x, in_s, 3, out_s, 0, rounding=rounding, compute=compute, out_dtype="int8"))
    if rounding == "tflite" and compute == "fixed_point":
        # M = 2**30, shift = 0: only SRDHM rounds, and its nudge makes negative ties go toward zero.
        assert QuantizeMultiplier(0.5) == (1 << 30, 0)
        assert got == [MultiplyByQuantizedMultiplier(v, 1 << 30, 0) for v in TIE_X]
        assert got == [-3, -2, -1, 0, 1, 2, 3, 4]
    elif rounding == "tflite":  # float math: TfLiteRound, ties away from zero
        assert got == TIE_EXPECTED["tonearest"]
    else:
        assert got == TIE_EXPECTED[rounding]


@pytest.mark.parametrize("compute", COMPUTE_MODES)
@pytest.mark.parametrize("rounding", ROUNDING_MODES)
def test_requantize_ties_quarter(rounding, compute):
    """Multiplier 1/4 (shift -1): in tflite fixed point the tie is decided by RoundingDivideByPOT."""
    x = np.array([2 * v for v in TIE_X], np.int16)  # x / 4 = -3.5 ... 3.5
    got = ints(numerics.requantize(x, np.float32(0.25), 0, np.float32(1.0), 0, rounding=rounding, compute=compute,
                                   out_dtype="int8"))
    if rounding == "tflite" and compute == "fixed_point":
        assert QuantizeMultiplier(0.25) == (1 << 30, -1)
        assert got == [MultiplyByQuantizedMultiplier(v, 1 << 30, -1) for v in ints(x)]
        assert got == TIE_EXPECTED["tonearest"]
    elif rounding == "tflite":
        assert got == TIE_EXPECTED["tonearest"]
    else:
        assert got == TIE_EXPECTED[rounding]


FLOAT_TIES = [0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.5]
FLOAT_TIE_EXPECTED = {
    "half_even": [0, 0, 2, -2, 2, -2, 4],
    "upward": [1, 0, 2, -1, 3, -2, 4],
    "tonearest": [1, -1, 2, -2, 3, -3, 4],
    "tflite": [1, -1, 2, -2, 3, -3, 4],
}


@pytest.mark.parametrize("ftype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("rounding", ROUNDING_MODES)
def test_round_float_ties(rounding, ftype):
    v = np.array(FLOAT_TIES, ftype)
    r = numerics.round_float(v, rounding)
    assert r.dtype == ftype
    assert r.tolist() == FLOAT_TIE_EXPECTED[rounding]


@pytest.mark.parametrize("ftype", [np.float32, np.float64])
@pytest.mark.parametrize("rounding", ROUNDING_MODES)
def test_round_float_is_exact_near_ties(rounding, ftype):
    def nxt(a, toward):
        return np.nextafter(ftype(a), ftype(toward))

    cases = {nxt(0.5, 0): 0, nxt(0.5, 1): 1, nxt(-0.5, 0): 0, nxt(-0.5, -1): -1, nxt(1.5, 0): 1,
             nxt(1.5, 2): 2, nxt(-2.5, 0): -2, nxt(-2.5, -3): -3}
    # Odd integers at the top of the significand: v + 0.5 is not representable there.
    big = ftype(2 ** 23 + 1) if ftype is np.float32 else ftype(2 ** 52 + 1)
    cases[big] = int(big)
    cases[-big] = -int(big)
    v = np.array(list(cases), ftype)
    assert numerics.round_float(v, rounding).tolist() == list(cases.values())
    if ftype is np.float32:
        assert numerics.round_float(np.float32(0.49999997), rounding) == 0  # floor(x + 0.5) would give 1


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_round_float_nonfinite():
    v = np.array([np.inf, -np.inf, np.nan], np.float32)
    for mode in ROUNDING_MODES:
        r = numerics.round_float(v, mode)
        assert r[0] == np.inf and r[1] == -np.inf and np.isnan(r[2])


@pytest.mark.parametrize("rounding", ROUNDING_MODES)
def test_quantize_ties_and_near_ties(rounding):
    x = np.array(FLOAT_TIES, np.float32)
    assert ints(numerics.quantize(x, np.float32(1.0), 0, rounding=rounding)) == FLOAT_TIE_EXPECTED[rounding]
    # x / scale is a tie as well when the scale is a power of two
    got = numerics.quantize(x * np.float32(0.25), np.float32(0.25), 10, rounding=rounding)
    assert ints(got) == [v + 10 for v in FLOAT_TIE_EXPECTED[rounding]]
    near = np.array([np.float32(0.49999997), np.nextafter(np.float32(0.5), np.float32(1)),
                     np.nextafter(np.float32(-0.5), np.float32(0)), np.nextafter(np.float32(-0.5), np.float32(-1))])
    assert ints(numerics.quantize(near, np.float32(1.0), 0, rounding=rounding)) == [0, 1, 0, -1]


# --------------------------------------------------------------------------- per-axis and blocked


def _param(rng, n, kind, dtype="int8"):
    if kind == "scale":
        return (rng.uniform(0.5, 2, n) * 10.0 ** rng.integers(-4, 2, n)).astype(np.float32)
    lo, hi = qrange(dtype)
    return rng.integers(lo, hi + 1, n).astype(np.int32)


@pytest.mark.parametrize("compute", COMPUTE_MODES)
@pytest.mark.parametrize("rounding", ROUNDING_MODES)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_requantize_per_axis_equals_per_slice(axis, rounding, compute, rng):
    x = rng.integers(-2 ** 20, 2 ** 20, size=(3, 4, 5)).astype(np.int32)
    n = x.shape[axis]
    in_s, in_zp = _param(rng, n, "scale"), _param(rng, n, "zp", "int32") // 4096
    out_s, out_zp = _param(rng, n, "scale"), _param(rng, n, "zp", "int16")
    kw = dict(rounding=rounding, compute=compute, out_dtype="int16")
    variants = [(in_s, in_zp, out_s, out_zp), (in_s, in_zp, out_s[:1], out_zp[:1]),
                (in_s[0], in_zp[0], out_s, out_zp)]
    for si, zi, so, zo in variants:
        y = numerics.requantize(x, si, zi, so, zo, axis=axis, **kw)
        assert y.dtype == np.int16 and y.shape == x.shape

        def pick(p, i):
            p = np.asarray(p)
            return p.reshape(-1)[i] if p.size > 1 else p.reshape(-1)[0]

        for i in range(n):
            yi = numerics.requantize(np.take(x, i, axis), pick(si, i), pick(zi, i), pick(so, i), pick(zo, i), **kw)
            np.testing.assert_array_equal(np.take(y, i, axis), yi)
    # and the per-axis result really differs per channel (the qparams were used)
    assert not np.array_equal(numerics.requantize(x, in_s, in_zp, out_s, out_zp, axis=axis, **kw),
                              numerics.requantize(x, in_s[0], in_zp[0], out_s[0], out_zp[0], axis=axis, **kw))


@pytest.mark.parametrize("out_dtype", ["int8", "uint8", "int4", "uint16"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_quantize_dequantize_per_axis_equals_per_slice(axis, out_dtype, rng):
    x = rng.normal(0, 3, size=(3, 4, 5)).astype(np.float32)
    n = x.shape[axis]
    s, z = _param(rng, n, "scale") * 10, _param(rng, n, "zp", out_dtype)
    q = numerics.quantize(x, s, z, axis=axis, out_dtype=out_dtype)
    assert q.dtype == INT_RANGES[out_dtype][0]
    d = numerics.dequantize(q, s, z, axis=axis)
    assert d.dtype == np.float32
    for i in range(n):
        qi = numerics.quantize(np.take(x, i, axis), s[i], z[i], out_dtype=out_dtype)
        assert ints(np.take(q, i, axis)) == ints(qi)
        np.testing.assert_array_equal(np.take(d, i, axis), numerics.dequantize(qi, s[i], z[i]))


@pytest.mark.parametrize("axis,block", [(0, 2), (1, 4), (1, 3), (-1, 5), (0, 1)])
def test_quantize_dequantize_blocked_equals_per_block(axis, block, rng):
    x = rng.normal(0, 5, size=(5, 11)).astype(np.float32)
    ax = axis % 2
    nblk = -(-x.shape[ax] // block)
    pshape = (nblk, 11) if ax == 0 else (5, nblk)
    s = (rng.uniform(0.01, 0.2, pshape)).astype(np.float32)
    z = rng.integers(-20, 20, pshape).astype(np.int32)
    q = numerics.quantize(x, s, z, axis=axis, block_size=block, out_dtype="int8")
    d = numerics.dequantize(q, s, z, axis=axis, block_size=block)
    for idx in np.ndindex(*x.shape):
        bidx = list(idx)
        bidx[ax] //= block
        bidx = tuple(bidx)
        assert int(q[idx]) == int(numerics.quantize(x[idx], s[bidx], z[bidx], out_dtype="int8"))
        assert d[idx] == numerics.dequantize(q[idx], s[bidx], z[bidx])
    with pytest.raises(QnnxError, match="blocked scale has shape"):
        numerics.quantize(x, s[:-1] if ax == 0 else s[:, :-1], 0, axis=axis, block_size=block)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16", "int4", "uint4"])
def test_quantize_dequantize_round_trip(dtype, rng):
    lo, hi = qrange(dtype)
    for _ in range(5):
        s = np.float32(rng.uniform(0.5, 2) * 10.0 ** rng.integers(-5, 3))
        z = int(rng.integers(lo, hi + 1))
        x = ((rng.uniform(lo, hi, 200) - z) * np.float64(s)).astype(np.float32)
        q = numerics.quantize(x, s, z, out_dtype=dtype)
        back = numerics.dequantize(q, s, z).astype(np.float64)
        err = np.abs(back - x.astype(np.float64))
        # s/2 from rounding, plus float32 rounding of x/s and of (q - z) * s
        assert np.all(err <= np.float64(s) / 2 * (1 + 1e-6) + np.abs(x) * 2.0 ** -22), err.max()


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", list(INT_RANGES))
def test_quantize_saturates_and_nan_is_zero_point(dtype):
    lo, hi = qrange(dtype)
    z = (lo + hi) // 2
    x = np.array([1e30, -1e30, np.inf, -np.inf, np.nan, 0.0], np.float32)
    q = numerics.quantize(x, np.float32(0.1), z, out_dtype=dtype)
    assert q.dtype == INT_RANGES[dtype][0]
    assert ints(q) == [hi, lo, hi, lo, z, z]


@pytest.mark.parametrize("out_dtype", ["int8", "uint8", "int16", "uint16", "int32", "int4"])
@pytest.mark.parametrize("rounding", ROUNDING_MODES)
@pytest.mark.parametrize("compute", COMPUTE_MODES)
def test_requantize_saturates(out_dtype, rounding, compute):
    lo, hi = qrange(out_dtype)
    x = np.array([INT32_MAX, INT32_MIN, 0, 2 ** 22, -2 ** 22], np.int32)
    y = numerics.requantize(x, np.float32(10.0), 0, np.float32(0.01), 1, rounding=rounding, compute=compute,
                            out_dtype=out_dtype)
    if out_dtype == "int32" and rounding == "tflite" and compute == "fixed_point":
        # multiplier 1000 = M * 2**10: x << 10 saturates in int32 first (documented), so the int32 output
        # tops out at INT32_MAX * M / 2**31 (~0.977 * 2**31) instead of INT32_MAX.
        m, shift = QuantizeMultiplier(float(np.float64(np.float32(10)) / np.float64(np.float32(0.01))))
        assert shift == 10
        want = [clip_to(MultiplyByQuantizedMultiplier(v, m, shift) + 1, "int32") for v in ints(x)]
        assert want[0] == (INT32_MAX * m + (1 << 30)) // (1 << 31) + 1 < INT32_MAX
        assert ints(y) == want
    else:
        assert ints(y) == [hi, lo, clip_to(1, out_dtype), hi, lo]


# --------------------------------------------------------------------------- add / sub / mul


@st.composite
def binary_cases(draw, op):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim)))
    b_shape = shape[draw(st.integers(0, ndim - 1)):] if draw(st.booleans()) else shape
    axis = draw(st.integers(-ndim, ndim - 1))
    n = shape[axis]
    # 16-bit operands with any zero point: mul's product a'*b' reaches 2**32 (beyond int32)
    names = ("int8", "uint8", "int16", "uint16")
    ta, tb = draw(st.sampled_from(names)), draw(st.sampled_from(names))
    ty = draw(st.sampled_from(("int8", "uint8", "int16")))

    def arr(t, shp):
        vals = draw(st.lists(values_of(t), min_size=int(np.prod(shp)), max_size=int(np.prod(shp))))
        return np.array(vals, INT_RANGES[t][0]).reshape(shp)

    def zp(t):
        if draw(st.booleans()):
            return draw(values_of(t))
        return np.array(draw(st.lists(values_of(t), min_size=n, max_size=n)), np.int32)

    base = draw(st.floats(float(np.float32(1e-4)), 10.0, width=32))

    def scale():
        # scales within a factor 2**8 of each other: the fixed-point add keeps <= 1 LSB (see below)
        if draw(st.booleans()):
            return np.float32(base * 2.0 ** draw(st.floats(-4, 4)))
        return np.array([base * 2.0 ** draw(st.floats(-4, 4)) for _ in range(n)], np.float32)

    return dict(a=arr(ta, shape), a_scale=scale(), a_zero_point=zp(ta), b=arr(tb, b_shape), b_scale=scale(),
                b_zero_point=zp(tb), y_scale=scale(), y_zero_point=zp(ty)), axis, ty


def _along(p, axis, shape):
    p = np.asarray(p)
    if p.size == 1:
        return np.broadcast_to(p.reshape(()), shape)
    dims = [1] * len(shape)
    dims[axis] = p.size
    return np.broadcast_to(p.reshape(dims), shape)


def _exact_binary(c, axis, ty, fn, rounding):
    shape = np.broadcast_shapes(c["a"].shape, c["b"].shape)
    a, b = np.broadcast_to(c["a"].astype(np.int64), shape), np.broadcast_to(c["b"].astype(np.int64), shape)
    P = {k: _along(c[k], axis, shape) for k in ("a_scale", "a_zero_point", "b_scale", "b_zero_point", "y_scale",
                                                 "y_zero_point")}
    out, mags = [], []
    for idx in np.ndindex(*shape):
        ra = (int(a[idx]) - int(P["a_zero_point"][idx])) * Fraction(float(P["a_scale"][idx]))
        rb = (int(b[idx]) - int(P["b_zero_point"][idx])) * Fraction(float(P["b_scale"][idx]))
        sy = Fraction(float(P["y_scale"][idx]))
        exact = fn(ra, rb) / sy
        q = clip_to(ref_round(exact, rounding) + int(P["y_zero_point"][idx]), ty)
        out.append(q)
        mags.append(float((abs(ra) + abs(rb)) / sy) if fn is not _MUL else float(abs(exact)))
    return out, mags


def _ADD(a, b):
    return a + b


def _SUB(a, b):
    return a - b


def _MUL(a, b):
    return a * b


# Why 1 LSB and not 0: the fixed-point scheme (TFLite's) rescales each operand to a common scale with
# 20 (8-bit) / 15 (16-bit) bits of headroom and rounds there, then rounds the sum again, and its Q31
# multipliers are rounded; the float scheme rounds float32 products and the float32 sum. Each of those
# intermediate errors is far below 1/2 LSB of the output, so only the final rounding of a value next to a
# tie can land on the other neighbour. The float path's relative error (<= 3 * 2**-24 of the operand
# magnitudes, which can cancel) is added for large 16-bit operands.
@settings(max_examples=200, deadline=None)
@given(st.data(), st.sampled_from(["add", "sub", "mul"]), st.sampled_from(ROUNDING_MODES),
       st.sampled_from(COMPUTE_MODES))
def test_binary_ops_within_one_lsb(data, op, rounding, compute):
    c, axis, ty = data.draw(binary_cases(op))
    kw = dict(axis=axis, out_dtype=ty, rounding=rounding, compute=compute)
    if op == "mul":
        got, fn = numerics.mul(**c, **kw), _MUL
    else:
        got, fn = numerics.add(**c, **kw, subtract=op == "sub"), (_SUB if op == "sub" else _ADD)
    want, mags = _exact_binary(c, axis, ty, fn, rounding)
    assert got.dtype == INT_RANGES[ty][0]
    assert got.shape == np.broadcast_shapes(c["a"].shape, c["b"].shape)
    for g, w, mag in zip(ints(got), want, mags):
        tol = 1 + (mag * 2.0 ** -21 if compute == "float" else 0)
        assert abs(g - w) <= tol, (g, w)


def tflite_add(a, za, sa, b, zb, sb, zy, sy, out_dtype, left_shift, subtract):
    """TFLite's reference integer ADD/SUB (kernels/add.cc Prepare + reference_ops Add), per element."""
    twice_max_input_scale = 2 * max(float(sa), float(sb))
    M1, s1 = QuantizeMultiplier(float(sa) / twice_max_input_scale)
    M2, s2 = QuantizeMultiplier(float(sb) / twice_max_input_scale)
    Mo, so = QuantizeMultiplier(twice_max_input_scale / ((1 << left_shift) * float(sy)))
    scaled1 = MultiplyByQuantizedMultiplier((a - za) * (1 << left_shift), M1, s1)
    scaled2 = MultiplyByQuantizedMultiplier((b - zb) * (1 << left_shift), M2, s2)
    raw = scaled1 - scaled2 if subtract else scaled1 + scaled2
    return clip_to(MultiplyByQuantizedMultiplier(raw, Mo, so) + zy, out_dtype)


def tflite_mul(a, za, sa, b, zb, sb, zy, sy, out_dtype):
    """TFLite's reference integer MUL: the int32 product requantized by double(sa) * double(sb) / double(sy)."""
    M, shift = QuantizeMultiplier(float(sa) * float(sb) / float(sy))
    return clip_to(MultiplyByQuantizedMultiplier((a - za) * (b - zb), M, shift) + zy, out_dtype)


@FAST
@given(st.data(), st.sampled_from(["add", "sub", "mul"]), st.sampled_from(["int8", "uint8", "int16"]),
       st.sampled_from(["int8", "uint8", "int16"]), st.sampled_from(["int8", "uint8", "int16"]))
def test_binary_ops_tflite_fixed_point_match_tflite_reference(data, op, ta, tb, ty):
    n = data.draw(st.integers(1, 8))
    a = data.draw(st.lists(values_of(ta), min_size=n, max_size=n))
    b = data.draw(st.lists(values_of(tb), min_size=n, max_size=n))
    # TFLite's 16-bit kernels take symmetric (zero point 0) int16 tensors
    za, zb, zy = (0 if t == "int16" else data.draw(values_of(t)) for t in (ta, tb, ty))
    sa, sb, sy = (np.float32(data.draw(scales(1e-4, 10.0))) for _ in range(3))
    args = (np.array(a, INT_RANGES[ta][0]), sa, za, np.array(b, INT_RANGES[tb][0]), sb, zb, sy, zy)
    if op == "mul":
        got = numerics.mul(*args, out_dtype=ty, rounding="tflite", compute="fixed_point")
        want = [tflite_mul(x, za, sa, y, zb, sb, zy, sy, ty) for x, y in zip(a, b)]
    else:
        left_shift = 20 if ta != "int16" and tb != "int16" else 15
        got = numerics.add(*args, out_dtype=ty, rounding="tflite", compute="fixed_point", subtract=op == "sub")
        want = [tflite_add(x, za, sa, y, zb, sb, zy, sy, ty, left_shift, op == "sub") for x, y in zip(a, b)]
    assert ints(got) == want


@pytest.mark.parametrize("compute", COMPUTE_MODES)
def test_add_sub_mul_concrete(compute):
    a = np.array([10, -20, 127, -128], np.int8)
    b = np.array([3, 5, 127, -128], np.int8)
    # real(a) = a * 0.5, real(b) = b * 0.25, y_scale 0.25: y = 2a + b (exact integers), clipped
    y = numerics.add(a, np.float32(0.5), 0, b, np.float32(0.25), 0, np.float32(0.25), 0, compute=compute)
    assert ints(y) == [23, -35, 127, -128]
    y = numerics.add(a, np.float32(0.5), 0, b, np.float32(0.25), 0, np.float32(0.25), 0, compute=compute,
                     subtract=True)
    assert ints(y) == [17, -45, 127, -128]
    y = numerics.mul(a, np.float32(0.5), 0, b, np.float32(0.25), 0, np.float32(0.125), 0, compute=compute,
                     out_dtype="int16")
    assert ints(y) == [30, -100, 16129, 16384]


@pytest.mark.parametrize("compute", COMPUTE_MODES)
def test_mul_uint16_product_beyond_int32(compute):
    a = np.array([65535], np.uint16)
    # real product 65535**2 = 4294836225 > INT32_MAX; / 2**17 = 32767.0000076 -> 32767
    y = numerics.mul(a, np.float32(1), 0, a, np.float32(1), 0, np.float32(2 ** 17), 0, out_dtype="uint16",
                     compute=compute)
    assert ints(y) == [32767]
    # int16 with nonzero zero points: a' = 65535, b' = -65535, product -4294836225 -> -32767.0000076
    y = numerics.mul(np.array([32767], np.int16), np.float32(1), -32768, np.array([-32768], np.int16),
                     np.float32(1), 32767, np.float32(2 ** 17), 0, out_dtype="int16", compute=compute)
    assert ints(y) == [-32767]


@pytest.mark.parametrize("compute", COMPUTE_MODES)
@pytest.mark.parametrize("op", ["add", "mul"])
def test_32bit_operands_are_rejected(compute, op):
    # The fixed-point schemes' headroom shifts assume 8/16-bit operands: int32 is refused, never silently saturated.
    a = np.array([100000], np.int32)
    with pytest.raises(QnnxError, match="int32; add/sub/mul take operands of 16 bits or fewer"):
        getattr(numerics, op)(a, np.float32(1), 0, a, np.float32(1), 0, np.float32(1000), 0, out_dtype="int16",
                              compute=compute)


# --------------------------------------------------------------------------- errors

X8 = np.array([1, 2, 3], np.int8)


@pytest.mark.parametrize("bad,match", [
    (0.0, "positive and finite"), (-1.0, "positive and finite"), (np.nan, "positive and finite"),
    (np.inf, "positive and finite"), (-np.inf, "positive and finite")])
def test_bad_scales(bad, match):
    s = np.float32(bad)
    for call in (lambda: numerics.quantize(np.zeros(3, np.float32), s),
                 lambda: numerics.dequantize(X8, s),
                 lambda: numerics.requantize(X8, s, 0, np.float32(1), 0),
                 lambda: numerics.add(X8, np.float32(1), 0, X8, np.float32(1), 0, s, 0),
                 lambda: numerics.mul(X8, s, 0, X8, np.float32(1), 0, np.float32(1), 0)):
        with pytest.raises(QnnxError, match=match):
            call()
    with pytest.raises(QnnxError, match=r"output_scale must be positive and finite.*at index \(1,\)"):
        numerics.requantize(X8, np.float32(1), 0, np.array([1, bad, 1], np.float32), 0, axis=0)


def test_denormal_scales_are_refused():
    """A float32 denormal scale makes 1/scale overflow: not a quantization anyone meant."""
    with pytest.raises(QnnxError, match="scale must be at least 1.175e-38 \\(the smallest normal float32"):
        numerics.quantize(np.zeros(3, np.float32), np.float32(1e-40))
    with pytest.raises(QnnxError, match=r"at index \(2,\)"):
        numerics.check_scale(np.array([1, 1, 1e-39], np.float32))
    numerics.check_scale(np.float32(np.finfo(np.float32).tiny))  # the smallest normal float32 is fine
    numerics.check_scale(np.float16(4.6e-5))  # a float16 denormal is a normal float32


def test_bad_zero_points():
    with pytest.raises(QnnxError, match=r"zero_point 300 is outside the int8 range \[-128, 127\]"):
        numerics.quantize(np.zeros(3, np.float32), np.float32(1), 300, out_dtype="int8")
    with pytest.raises(QnnxError, match="outside the uint8 range"):
        numerics.quantize(np.zeros(3, np.float32), np.float32(1), -1, out_dtype="uint8")
    with pytest.raises(QnnxError, match="output_zero_point 128 is outside the int8 range"):
        numerics.requantize(X8, np.float32(1), 0, np.float32(1), 128)
    with pytest.raises(QnnxError, match="input_zero_point -129 is outside the int8 range"):
        numerics.requantize(X8, np.float32(1), -129, np.float32(1), 0)
    with pytest.raises(QnnxError, match="outside the int4 range"):
        numerics.dequantize(np.zeros(3, INT_RANGES["int4"][0]), np.float32(1), 8)
    with pytest.raises(QnnxError, match="must be an integer tensor"):
        numerics.quantize(np.zeros(3, np.float32), np.float32(1), 0.5)


def test_bad_axis_and_per_axis_length():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(QnnxError, match="axis=2 is out of range for a rank-2 tensor"):
        numerics.quantize(x, np.ones(3, np.float32), axis=2)
    with pytest.raises(QnnxError, match="out of range"):
        numerics.requantize(np.zeros((2, 3), np.int8), np.ones(2, np.float32), 0, np.float32(1), 0, axis=-3)
    with pytest.raises(QnnxError, match="scale has 3 values but axis 0"):
        numerics.quantize(x, np.ones(3, np.float32), axis=0)
    with pytest.raises(QnnxError, match="output_scale has 3 values but axis"):
        numerics.requantize(np.zeros((2, 3), np.int8), np.float32(1), 0, np.ones(3, np.float32), 0, axis=0)
    with pytest.raises(QnnxError, match="zero_point has 2 values but axis"):
        numerics.quantize(x, np.ones(3, np.float32), np.zeros(2, np.int32), axis=1)
    with pytest.raises(QnnxError, match="y_scale has 3 values but axis"):
        numerics.add(np.zeros((2, 3), np.int8), np.float32(1), 0, np.zeros((2, 3), np.int8), np.float32(1), 0,
                     np.ones(3, np.float32), 0, axis=0)


def test_unsupported_dtypes_and_modes():
    with pytest.raises(QnnxError, match="unsupported integer dtype int64"):
        numerics.requantize(X8, np.float32(1), 0, np.float32(1), 0, out_dtype="int64")
    with pytest.raises(QnnxError, match="unsupported integer dtype float32"):
        numerics.requantize(np.zeros(3, np.float32), np.float32(1), 0, np.float32(1), 0)
    with pytest.raises(QnnxError, match="unsupported integer dtype int64"):
        numerics.requantize(np.zeros(3, np.int64), np.float32(1), 0, np.float32(1), 0)
    with pytest.raises(QnnxError, match="quantize input must be float"):
        numerics.quantize(X8, np.float32(1))
    with pytest.raises(QnnxError, match="scale must be a float tensor"):
        numerics.quantize(np.zeros(3, np.float32), 1)
    for call in (lambda r: numerics.requantize(X8, np.float32(1), 0, np.float32(1), 0, rounding=r),
                 lambda r: numerics.quantize(np.zeros(3, np.float32), np.float32(1), rounding=r),
                 lambda r: numerics.add(X8, np.float32(1), 0, X8, np.float32(1), 0, np.float32(1), 0, rounding=r,
                                        compute="float"),
                 lambda r: numerics.round_float(np.zeros(2), r)):
        with pytest.raises(QnnxError, match="unknown rounding 'nearest'"):
            call("nearest")
    with pytest.raises(QnnxError, match="unknown compute 'quad'"):  # ("double" is TFLite's FC recipe)
        numerics.requantize(X8, np.float32(1), 0, np.float32(1), 0, compute="quad")
    with pytest.raises(QnnxError, match="do not broadcast"):
        numerics.add(np.zeros(2, np.int8), np.float32(1), 0, np.zeros(3, np.int8), np.float32(1), 0,
                     np.float32(1), 0)


def test_errors_are_value_errors():
    assert issubclass(QnnxError, ValueError)
    with pytest.raises(ValueError):
        numerics.quantize(np.zeros(3, np.float32), np.float32(0))


# --------------------------------------------------------------------------- requantize compute="qdq"


@pytest.mark.parametrize("rounding", ROUNDING_MODES)
def test_requantize_qdq_is_dequantize_then_quantize(rounding):
    rng = np.random.default_rng(61)
    x = rng.integers(-128, 128, size=(3, 40)).astype(np.int8)
    si, so = (rng.integers(1, 64, 3) / 255).astype(np.float32), (rng.integers(1, 64, 3) / 255).astype(np.float32)
    zi, zo = rng.integers(-20, 20, 3), rng.integers(-20, 20, 3)
    got = numerics.requantize(x, si, zi, so, zo, axis=0, rounding=rounding, out_dtype="int8", compute="qdq")
    want = numerics.quantize(numerics.dequantize(x, si, zi, axis=0), so, zo, axis=0, out_dtype="int8",
                             rounding=rounding)
    np.testing.assert_array_equal(got, want)


def test_requantize_qdq_differs_from_float_at_an_exact_tie():
    # 255 quanta of 16/255 into 32/255 is 127.5 in real numbers. Dequantized: float32 16.0; divided by
    # float32(32/255), a little above 32/255: 127.49999 -> 127. The float multiplier is exactly 0.5: 128.
    args = (np.array([255], np.uint8), np.float32(16 / 255), 0, np.float32(32 / 255), 0)
    assert numerics.requantize(*args, rounding="half_even", out_dtype="uint8", compute="qdq")[0] == 127
    assert numerics.requantize(*args, rounding="half_even", out_dtype="uint8", compute="float")[0] == 128
    with pytest.raises(QnnxError, match="unknown compute 'qdq'"):
        numerics.scale_and_round(np.array([1]), 0.5, rounding="half_even", compute="qdq")


# --------------------------------------------------------------------------- int8 dot products in int16 pairs
# A literal transcription, one output at a time: vpmaddubsw (u8 x s8 products of bytes 2j and 2j+1, added
# in a saturating int16), then vpmaddwd / int32 adds.


def _pair_dot_literal(x: list[int], w: list[int]) -> int:
    total = 0
    for j in range(0, len(x), 2):
        pair = x[j] * w[j] + (x[j + 1] * w[j + 1] if j + 1 < len(x) else 0)
        total += max(-32768, min(32767, pair))
    return total


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(0, 2**32 - 1))
def test_u8s8_pair_dot_is_the_pairwise_saturating_sum(k, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (3, k))
    w = rng.integers(-128, 128, (k, 2))
    w[: min(k, 2)] = rng.choice([-128, 127])  # a pair at full scale, where the int16 sum clips
    got = numerics.u8s8_pair_dot(x, w)
    for r in range(3):
        for n in range(2):
            assert got[r, n] == _pair_dot_literal(list(x[r]), list(w[:, n]))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([(0, 1), (1, 0), (None, 1)]))
def test_pair_limited_scale_keeps_pairs_exact_and_is_at_most_twice_the_8_bit_scale(seed, axes):
    axis, reduction = axes
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((6, 10)) * rng.uniform(0.01, 10)).astype(np.float32)
    scale = numerics.pair_limited_scale(w, axis, reduction)
    q = numerics.quantize(w, scale, 0, axis=axis if axis is not None else -1)
    assert numerics.same_sign_pair_sums(q, reduction).max() <= numerics.U8S8_PAIR_LIMIT
    q_k = q if reduction == 0 else q.T  # (K, N)
    x = np.full((1, q_k.shape[0]), 255)  # the largest inputs: the pair sums of these weights never clip
    np.testing.assert_array_equal(numerics.u8s8_pair_dot(x, q_k), x @ q_k.astype(np.int64))
    eight = np.abs(w).max(axis=None if axis is None else 1 - axis) / 127
    assert np.all(scale >= eight.astype(np.float32) * (1 - 1e-6))
    assert np.all(scale <= 2 * eight * 127 / numerics.U8S8_PAIR_LIMIT * (1 + 1e-6))  # never coarser than 7 bits
    assert np.abs(q.astype(np.int64)).max() <= 127


def test_pair_limited_scales_round_no_pair_over_the_limit_even_at_the_bound():
    # pairs whose magnitudes sum to exactly the channel's largest pair sum, split near half steps: float32
    # roundings of the scale and of each quotient must not tip both members up (no limit_pairs afterwards)
    rng = np.random.default_rng(11)
    total = rng.uniform(0.01, 10, (1, 400)).astype(np.float32)  # one output channel per column
    frac = (np.floor(rng.uniform(1, 127, (2000, 1))) + 0.5 + rng.normal(0, 1e-6, (2000, 1))) / 128
    w = np.empty((4000, 400), np.float32)  # (K, N)
    w[0::2] = (frac * total).astype(np.float32)
    w[1::2] = total - w[0::2]
    scale = numerics.pair_limited_scale(w, 1, 0)
    q = numerics.quantize(w, scale, 0, axis=1)
    assert numerics.same_sign_pair_sums(q, 0).max() <= numerics.U8S8_PAIR_LIMIT


def test_depthwise_per_output_gives_each_output_channel_its_input_channels_value():
    np.testing.assert_array_equal(numerics.depthwise_per_output([1, 2, 3], 6), [1, 1, 2, 2, 3, 3])
    np.testing.assert_array_equal(numerics.depthwise_per_output(np.array([5]), 3), [5, 5, 5])
    with pytest.raises(QnnxError, match="cannot read 4 input channels depthwise"):
        numerics.depthwise_per_output(np.zeros(4), 6)
