"""numerics.layer_norm / numerics.variance against literal per-row transcriptions (Python ints and
IEEE doubles, one element at a time) and against exact real arithmetic (Fraction, 60-digit Decimal sqrt).

Equal means: bit-identical to the transcription of the documented steps; against exact real
arithmetic, identical except within 1e-9 of a rounding tie (the double steps round 4-5 times,
relative error < 1e-15), where 1 LSB is allowed.
"""

from __future__ import annotations

import math
from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pytest
from conftest import ROUNDING_MODES, ref_round

from qnnx import QnnxError, numerics

getcontext().prec = 60


def _rows(q, axis):
    """(lead shape, rows of python ints) over the trailing axes from ``axis``."""
    ax = axis % q.ndim
    lead = q.shape[:ax]
    return lead, [[int(v) for v in r] for r in q.reshape(int(np.prod(lead)), -1)]


def _round_double(v: float, mode: str) -> int:
    return ref_round(Fraction(v), mode)


def literal_layer_norm(q, sx, zx, sy, zy, lo, hi, gamma=None, beta=None, eps=1e-5, axis=-1, mode="half_even"):
    """The docstring of numerics.layer_norm, transcribed: Python ints, then Python floats (IEEE double)."""
    _, rows = _rows(q, axis)
    sx, sy = float(np.float32(sx)), float(np.float32(sy))
    g = None if gamma is None else np.broadcast_to(gamma, q.shape[axis % q.ndim:]).ravel().astype(float)
    bt = None if beta is None else np.broadcast_to(beta, q.shape[axis % q.ndim:]).ravel().astype(float)
    out = []
    for row in rows:
        c = [v - zx for v in row]
        n = len(c)
        s1, s2 = sum(c), sum(v * v for v in c)
        var = float(n * s2 - s1 * s1) * ((sx * sx) / float(n * n))
        den = math.sqrt(var + float(np.float32(eps)))
        for i, ci in enumerate(c):
            z = 0.0 if den == 0 else float(n * ci - s1) * (sx / float(n)) / den
            if g is not None:
                z = z * g[i]
            if bt is not None:
                z = z + bt[i]
            out.append(min(max(_round_double(z / sy, mode) + zy, lo), hi))
    return np.array(out).reshape(q.shape)


def exact_layer_norm(q, sx, zx, sy, eps=1e-5, axis=-1):
    """The real-number layer norm of the dequantized input divided by y_scale (Decimal, 60 digits)."""
    _, rows = _rows(q, axis)
    sx, sy, eps = Fraction(float(np.float32(sx))), Fraction(float(np.float32(sy))), Fraction(float(np.float32(eps)))
    out = []
    for row in rows:
        r = [(v - zx) * sx for v in row]
        mean = sum(r, Fraction(0)) / len(r)
        var = sum(((v - mean) ** 2 for v in r), Fraction(0)) / len(r)
        den = (Decimal(var.numerator) / Decimal(var.denominator) + Decimal(eps.numerator) / Decimal(eps.denominator)).sqrt()
        for v in r:
            d = v - mean
            out.append(Decimal(d.numerator) / Decimal(d.denominator) / den / (Decimal(sy.numerator) / Decimal(sy.denominator)))
    return out


CASES = [  # dtype, out dtype, shape, axis, x zero point
    (np.int8, "int8", (3, 16), -1, 0),
    (np.uint8, "uint8", (2, 3, 40), -1, 131),
    (np.uint8, "int8", (2, 4, 5), 1, 7),
    (np.int16, "int16", (2, 50), -1, 0),
]


@pytest.mark.parametrize("mode", ROUNDING_MODES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("affine", [False, True])
def test_layer_norm_is_the_documented_steps(mode, case, affine):
    dtype, out_dtype, shape, axis, zx = case
    rng = np.random.default_rng(hash((mode, str(case), affine)) % 2**32)
    info = np.iinfo(dtype)
    q = rng.integers(info.min, int(info.max) + 1, size=shape).astype(dtype)
    q.reshape(-1, shape[-1])[0] = q.reshape(-1, shape[-1])[0] // 16 + zx // 2  # a narrow row
    oi = np.iinfo(out_dtype)
    norm = shape[axis % len(shape):]
    gamma = rng.uniform(-2, 2, norm).astype(np.float32) if affine else None
    beta = rng.uniform(-1, 1, norm[-1:]).astype(np.float32) if affine else None
    sx, sy, zy = np.float32(0.05 if dtype != np.int16 else 3e-4), np.float32(0.031), (oi.min + oi.max + 1) // 2
    got = numerics.layer_norm(q, sx, zx, sy, zy, gamma, beta, axis=axis, out_dtype=out_dtype, rounding=mode)
    want = literal_layer_norm(q, sx, zx, sy, zy, oi.min, oi.max, gamma, beta, axis=axis, mode=mode)
    np.testing.assert_array_equal(got.astype(np.int64), want)


@pytest.mark.parametrize("case", CASES)
def test_layer_norm_is_the_real_layer_norm_rounded(case):
    dtype, _, shape, axis, zx = case
    rng = np.random.default_rng(3)
    info = np.iinfo(dtype)
    q = rng.integers(info.min, int(info.max) + 1, size=shape).astype(dtype)
    sx, sy = np.float32(0.05 if dtype != np.int16 else 3e-4), np.float32(0.0125)
    got = numerics.layer_norm(q, sx, zx, sy, 0, axis=axis, out_dtype="int16")
    exact = exact_layer_norm(q, sx, zx, sy, axis=axis)
    for g, e in zip(got.ravel().tolist(), exact):
        frac = e - e.to_integral_value(rounding="ROUND_FLOOR")
        if abs(frac - Decimal("0.5")) > Decimal("1e-9"):
            assert g == int(e.to_integral_value(rounding="ROUND_HALF_EVEN")), (g, e)
        else:
            assert abs(g - e) <= 1


def test_layer_norm_matches_float32_qdq_within_one_lsb():
    """What a QDQ graph computes (dequantize, float32 mean/var/sqrt/div, quantize) differs by at most
    1 LSB: float32 steps carry ~1e-7 relative error, which moves a value across a rounding boundary
    only when it lies that close to it."""
    rng = np.random.default_rng(5)
    q = rng.integers(0, 256, size=(64, 96)).astype(np.uint8)
    sx, zx, sy, zy = np.float32(0.04), 128, np.float32(0.02), 128
    r = numerics.dequantize(q, sx, zx)
    mean = r.mean(-1, keepdims=True, dtype=np.float32)
    d = r - mean
    var = (d * d).mean(-1, keepdims=True, dtype=np.float32)
    f32 = d / np.sqrt(var + np.float32(1e-5))
    want = numerics.quantize(f32.astype(np.float32), sy, zy, out_dtype="uint8")
    got = numerics.layer_norm(q, sx, zx, sy, zy, out_dtype="uint8")
    diff = np.abs(got.astype(int) - want.astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01


def test_constant_row_without_epsilon_normalizes_to_zero():
    q = np.full((2, 8), 17, np.int8)
    y = numerics.layer_norm(q, 0.1, 3, 0.05, -4, beta=np.full(8, 0.5, np.float32), epsilon=0.0, out_dtype="int8")
    assert (y == -4 + 10).all()


def test_per_channel_output_along_last_axis():
    rng = np.random.default_rng(7)
    q = rng.integers(-128, 128, size=(3, 6)).astype(np.int8)
    sy, zy = np.linspace(0.01, 0.06, 6).astype(np.float32), np.arange(6).astype(np.int32)
    got = numerics.layer_norm(q, 0.1, 0, sy, zy, out_dtype="int8")
    for k in range(6):
        col = numerics.layer_norm(q, 0.1, 0, sy[k], zy[k], out_dtype="int8")[:, k]
        np.testing.assert_array_equal(got[:, k], col)


def test_quantized_variance_replaces_the_exact_one():
    rng = np.random.default_rng(9)
    q = rng.integers(0, 256, size=(4, 32)).astype(np.uint8)
    sx = np.float32(0.05)
    exact_var = numerics.dequantize(q, sx, 100).astype(np.float64).var(-1, keepdims=True)
    sv = np.float32(exact_var.max() / 255)
    vq = numerics.quantize(exact_var.astype(np.float32), sv, 0, out_dtype="uint8")
    got = numerics.layer_norm(q, sx, 100, 0.03, 0, variance=vq, variance_scale=sv, variance_zero_point=0,
                              epsilon=0.0, out_dtype="int16")
    real_var = (vq.astype(np.float64)) * np.float64(sv)
    d = numerics.dequantize(q, sx, 100).astype(np.float64)
    want = np.rint((d - d.mean(-1, keepdims=True)) / np.sqrt(real_var) / np.float64(np.float32(0.03)))
    assert np.abs(got - want).max() <= 1
    # a quantized variance below its zero point counts as 0: the row normalizes to zero
    neg = numerics.layer_norm(q, sx, 100, 0.03, 5, variance=np.zeros((4, 1), np.int8), variance_scale=sv,
                              variance_zero_point=3, epsilon=0.0, out_dtype="int8")
    assert (neg == 5).all()


@pytest.mark.parametrize("mode", ROUNDING_MODES)
def test_variance_is_exact(mode):
    rng = np.random.default_rng(11)
    q = rng.integers(-128, 128, size=(5, 3, 20)).astype(np.int8)
    sx, sy = np.float32(0.07), np.float32(0.01)
    got = numerics.variance(q, sx, -3, sy, 0, axis=1, out_dtype="uint16", rounding=mode)
    assert got.shape == (5, 1, 1)
    for i, row in enumerate(q.reshape(5, -1)):
        c = [int(v) + 3 for v in row]
        n = len(c)
        v_int = n * sum(x * x for x in c) - sum(c) ** 2
        var = float(v_int) * ((float(sx) * float(sx)) / float(n * n))
        want = min(max(_round_double(var / float(sy), mode), 0), 65535)
        assert int(got[i, 0, 0]) == want
        exact = Fraction(v_int) * Fraction(float(sx)) ** 2 / n ** 2 / Fraction(float(sy))
        assert abs(int(got[i, 0, 0]) - exact) <= Fraction(1, 2) + Fraction(1, 10**6)


@pytest.mark.parametrize("kwargs,match", [
    (dict(gamma=np.ones(5, np.float32)), "gamma of shape"),
    (dict(beta=np.ones(8, np.int32)), "beta must be a float tensor"),
    (dict(x_scale=np.ones(2, np.float32)), "x_scale must be per-tensor"),
    (dict(y_scale=np.ones(3, np.float32)), "y_scale has 3 values"),
    (dict(variance=np.zeros((2, 1), np.uint8)), "needs variance_scale"),
    (dict(variance=np.zeros((3, 1), np.uint8), variance_scale=1.0, variance_zero_point=0), "does not match"),
])
def test_layer_norm_errors(kwargs, match):
    args = dict(x=np.zeros((2, 8), np.int8), x_scale=0.1, x_zero_point=0, y_scale=0.1, y_zero_point=0)
    args.update(kwargs)
    with pytest.raises(QnnxError, match=match):
        numerics.layer_norm(**args, out_dtype="int8")


def test_moments_that_would_overflow_int64_are_refused():
    q = np.zeros((1, 100000), np.int16)  # 1e10 * 2**30 > 2**62
    with pytest.raises(QnnxError, match="does not fit exact int64 moments"):
        numerics.layer_norm(q, 0.1, 0, 0.1, 0, out_dtype="int16")
