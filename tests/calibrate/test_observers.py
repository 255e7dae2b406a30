"""Calibration observers (``qnnx.calibrate``).

What is checked, and what "equal" means in each place:

- ``qparams_from_range`` against scales and zero points worked out by hand (bit-exact float32
  scales, exact zero points), plus a property test: real 0 is exact, the range ends come back
  within half a step (+1% of a step for float32 rounding of the scale and of ``x / scale``);
- every method on known distributions: minmax exact; percentile within one histogram bin of
  ``numpy.percentile``; entropy/mse clip outliers that minmax covers, and mse's range is within 2%
  of the best actual quantization MSE found by brute force with ``qnnx.numerics``;
  ``kl_threshold_bins`` against a literal loop transcription of the algorithm;
- merge: bit-identical state and qparams (minmax, histograms: also vs. a shuffled batch order and
  vs. ``numpy.histogram`` on the same edges); moving_average within float64 rounding, as
  documented;
- fixed-size state after 1000 batches; per-channel minmax; every documented edge case and config
  error.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qnnx import QnnxError, numerics
from qnnx.calibrate import (MIN_SCALE, OBSERVERS, ZERO_RANGE_SCALE, MinMaxObserver, Observer, ObserverConfig,
                            QParams, kl_threshold_bins, make_observer, qparams_from_range, quant_range,
                            register_observer)
from qnnx.calibrate.observers import CONSUMER_FUNCTIONS, KL_EPS

METHODS = ("minmax", "moving_average", "percentile", "entropy", "mse")
HISTOGRAM_METHODS = ("percentile", "entropy", "mse")
QMIN_QMAX = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535)}


def obs(method: str, **kw) -> Observer:
    return make_observer(ObserverConfig(method=method, **kw))


def feed(o: Observer, batches) -> Observer:
    for b in batches:
        o.observe(b)
    return o


def roundtrip(qp: QParams, v) -> np.ndarray:
    """dequantize(quantize(v)) with qnnx's reference numerics (per-tensor qparams)."""
    q = numerics.quantize(np.asarray(v, np.float32), qp.scale, qp.zero_point, out_dtype=qp.dtype)
    return numerics.dequantize(q, qp.scale, qp.zero_point).astype(np.float64)


def f32(v) -> np.float32:
    return np.float32(v)


@pytest.fixture(scope="module")
def gaussian_with_outliers():
    """1e6 N(0, 1) samples and 4 outliers at |x| >= 55 (4 ppm), in 8 batches."""
    g = np.random.default_rng(7).standard_normal(1_000_000).astype(np.float32)
    x = np.concatenate([g, np.float32([60, -60, 55, -58])])
    return x, np.array_split(x, 8)


# --------------------------------------------------------------------------- qparams_from_range


@pytest.mark.parametrize("dtype, scale, zp", [
    ("int8", 2 / 127.5, 0), ("uint8", 2 / 127.5, 128),
    ("int16", 2 / 32767.5, 0), ("uint16", 2 / 32767.5, 32768),
])
def test_symmetric_qparams(dtype, scale, zp):
    qp = qparams_from_range(-1.0, 2.0, dtype, symmetric=True)
    assert qp.scale.dtype == np.float32 and qp.zero_point.dtype == np.int32
    assert qp.scale.shape == () and qp.zero_point.shape == () and qp.axis is None and qp.dtype == dtype
    assert qp.scale == f32(scale) and int(qp.zero_point) == zp
    assert roundtrip(qp, 0.0) == 0.0


@pytest.mark.parametrize("dtype, scale, zp", [
    # lo=-1, hi=3: scale = 4 / (qmax - qmin), zp = qmin + 1/scale = qmin + (qmax - qmin)/4
    ("uint8", 4 / 255, 64), ("int8", 4 / 255, -64),  # -128 + 63.75
    ("int16", 4 / 65535, -16384), ("uint16", 4 / 65535, 16384),  # -32768 + 16383.75
])
def test_asymmetric_qparams(dtype, scale, zp):
    qp = qparams_from_range(-1.0, 3.0, dtype, symmetric=False)
    assert qp.scale == f32(scale) and int(qp.zero_point) == zp
    qmin, qmax = QMIN_QMAX[dtype]
    q = numerics.quantize(np.float32([-1.0, 0.0, 3.0]), qp.scale, qp.zero_point, out_dtype=dtype)
    assert q.astype(int).tolist() == [qmin, zp, qmax]
    assert roundtrip(qp, 0.0) == 0.0


def test_range_is_widened_to_include_zero():
    qp = qparams_from_range(2.0, 5.0, "uint8", symmetric=False)
    assert qp.scale == f32(5 / 255) and int(qp.zero_point) == 0
    qp = qparams_from_range(-5.0, -2.0, "uint8", symmetric=False)
    assert qp.scale == f32(5 / 255) and int(qp.zero_point) == 255
    qp = qparams_from_range(2.0, 5.0, "int8", symmetric=True)
    assert qp.scale == f32(5 / 127.5) and int(qp.zero_point) == 0


def test_reduce_range_drops_one_bit():
    assert quant_range("int8", True) == (-64, 63) and quant_range("uint8", True) == (0, 127)
    assert quant_range("int16", True) == (-16384, 16383) and quant_range("uint16", True) == (0, 32767)
    assert quant_range("uint8") == (0, 255)
    qp = qparams_from_range(-1.0, 3.0, "int8", symmetric=False, reduce_range=True)
    assert qp.scale == f32(4 / 127) and int(qp.zero_point) == round(-64 + 127 / 4)
    qp = qparams_from_range(-1.0, 2.0, "uint8", symmetric=True, reduce_range=True)
    assert qp.scale == f32(2 / 63.5) and int(qp.zero_point) == 64


@pytest.mark.parametrize("dtype", QMIN_QMAX)
@pytest.mark.parametrize("symmetric", [True, False])
def test_all_zero_range_gets_the_documented_tiny_scale(dtype, symmetric):
    qp = qparams_from_range(0.0, 0.0, dtype, symmetric)
    assert qp.scale == f32(ZERO_RANGE_SCALE) == f32(2.0 ** -23)
    qmin, qmax = QMIN_QMAX[dtype]
    expect_zp = ((0 if qmin < 0 else (qmin + qmax + 1) // 2) if symmetric else qmin)
    assert int(qp.zero_point) == expect_zp
    assert roundtrip(qp, 0.0) == 0.0


@pytest.mark.parametrize("c", [0.37, -2.5, 1e-30, 3e38, -3e38])
def test_constant_nonzero_value_is_representable(c):
    c = float(f32(c))
    qp = qparams_from_range(c, c, "uint8", symmetric=False)
    # maps to qmax (qmin) exactly but for float32 rounding of scale and quotient: a few ulps
    assert abs(roundtrip(qp, c) - c) <= 4 * np.spacing(f32(abs(c)))
    qp = qparams_from_range(c, c, "int8", symmetric=True)
    # symmetric grid: half a step (c sits at 127.5 steps), plus 127.5 * the float32 rounding of the scale
    assert abs(roundtrip(qp, c) - c) <= 0.5001 * float(qp.scale)


def test_scale_never_zero_or_subnormal():
    for hi in (1e-45, 1e-40, 2.0 ** -126):
        qp = qparams_from_range(0.0, hi, "int16", symmetric=False)
        assert qp.scale == f32(MIN_SCALE) and np.isfinite(qp.scale) and qp.scale > 0
    qp = qparams_from_range(0.0, 1e-36, "uint8", symmetric=False)  # 1e-36/255 < 2**-126
    assert qp.scale == f32(MIN_SCALE)
    assert abs(roundtrip(qp, 1e-36) - float(f32(1e-36))) <= 0.5 * float(qp.scale)


@pytest.mark.parametrize("lo, hi, match", [
    (1.0, -1.0, "exceeds"), (float("nan"), 1.0, "non-finite"), (0.0, float("inf"), "non-finite"),
    (-1e300, 1e300, "too wide"), (np.zeros(2), np.ones(3), "same shape"), (np.zeros(2), np.ones(2), "scalars"),
])
def test_bad_ranges(lo, hi, match):
    with pytest.raises(QnnxError, match=match):
        qparams_from_range(lo, hi, "int8", symmetric=False)


@pytest.mark.parametrize("dtype", ["int4", "int32", "float32"])
def test_bad_dtype(dtype):
    with pytest.raises(QnnxError, match="dtype must be one of"):
        qparams_from_range(-1.0, 1.0, dtype, symmetric=False)


def test_per_axis_range():
    qp = qparams_from_range([-1.0, 0.0, 0.0, 2.0], [1.0, 2.0, 0.0, 3.0], "int8", symmetric=True, axis=0)
    assert qp.axis == 0 and qp.scale.shape == (4,) and qp.zero_point.tolist() == [0, 0, 0, 0]
    assert qp.scale.tolist() == [f32(1 / 127.5), f32(2 / 127.5), f32(ZERO_RANGE_SCALE), f32(3 / 127.5)]
    with pytest.raises(QnnxError, match="1-D arrays"):
        qparams_from_range(-1.0, 1.0, "int8", symmetric=True, axis=0)


@settings(max_examples=150)
@given(st.floats(-1e4, 1e4, width=32), st.floats(-1e4, 1e4, width=32), st.sampled_from(sorted(QMIN_QMAX)),
       st.booleans(), st.booleans())
def test_qparams_property(a, b, dtype, symmetric, reduce_range):
    lo, hi = min(a, b), max(a, b)
    qp = qparams_from_range(lo, hi, dtype, symmetric, reduce_range)
    qmin, qmax = quant_range(dtype, reduce_range)
    s = float(qp.scale)
    assert np.isfinite(s) and s > 0 and qmin <= int(qp.zero_point) <= qmax
    assert roundtrip(qp, 0.0) == 0.0
    for v in (min(lo, 0.0), max(hi, 0.0)):
        # half a step (zero-point rounding or the symmetric grid's clipped end), plus float32 rounding
        assert abs(roundtrip(qp, v) - v) <= 0.51 * s


# --------------------------------------------------------------------------- QParams / config / registry


def test_qparams_validation_and_equality():
    qp = QParams(np.float32(0.5), np.int32(3), "uint8")
    assert qp == QParams(np.array(0.5), 3, "uint8") and qp != QParams(np.float32(0.25), 3, "uint8")
    assert qp != QParams(np.float32(0.5), 3, "int8")
    with pytest.raises(ValueError):
        qp.scale[...] = 1.0  # read-only
    for kwargs, match in [
        (dict(scale=np.float32(0), zero_point=0, dtype="uint8"), "positive and finite"),
        (dict(scale=np.float32(np.nan), zero_point=0, dtype="uint8"), "positive and finite"),
        (dict(scale=np.float64(1e-50), zero_point=0, dtype="uint8"), "smallest normal float32"),  # flushes in f32
        (dict(scale=np.float32(1), zero_point=256, dtype="uint8"), "outside the uint8 range"),
        (dict(scale=np.float32([1, 1]), zero_point=[0], dtype="int8", axis=0), "shape"),
        (dict(scale=np.float32([1, 1]), zero_point=[0, 0], dtype="int8"), "per-tensor"),
        (dict(scale=np.float32(1), zero_point=0, dtype="int4"), "dtype"),
    ]:
        with pytest.raises(QnnxError, match=match):
            QParams(**kwargs)


def test_config_defaults_and_valid_edges():
    c = ObserverConfig()
    assert (c.method, c.dtype, c.symmetric, c.axis, c.bins) == ("minmax", "uint8", False, None, 2048)
    ObserverConfig(method="percentile", percentile=100, bins=16)
    ObserverConfig(method="moving_average", averaging_constant=1, axis=-1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.method = "mse"


@pytest.mark.parametrize("kwargs, match", [
    (dict(method="kl"), "unknown observer method"), (dict(method=None), "unknown observer method"),
    (dict(dtype="int4"), "dtype must be one of"), (dict(dtype="float32"), "dtype must be one of"),
    (dict(percentile=0), "percentile"), (dict(percentile=100.5), "percentile"),
    (dict(percentile=float("nan")), "percentile"), (dict(percentile="99"), "percentile"),
    (dict(bins=15), "bins"), (dict(bins=2048.0), "bins"), (dict(bins=True), "bins"), (dict(bins=1 << 21), "bins"),
    (dict(averaging_constant=0), "averaging_constant"), (dict(averaging_constant=1.5), "averaging_constant"),
    (dict(symmetric="yes"), "symmetric"), (dict(reduce_range=1), "reduce_range"),
    (dict(axis=1.0), "axis"), (dict(axis=True), "axis"),
    (dict(method="percentile", axis=0), "per-tensor only"), (dict(method="entropy", axis=1), "per-tensor only"),
    (dict(method="mse", axis=-1), "per-tensor only"),
])
def test_config_errors(kwargs, match):
    with pytest.raises(QnnxError, match=match):
        ObserverConfig(**kwargs)


def test_registry():
    assert set(OBSERVERS) == set(METHODS)
    for m in METHODS:
        o = obs(m)
        assert type(o) is OBSERVERS[m] and o.method == m and o.config.method == m
    with pytest.raises(QnnxError, match="use make_observer"):
        MinMaxObserver(ObserverConfig(method="mse"))
    with pytest.raises(ValueError, match="already registered"):
        register_observer("minmax")(type("Again", (Observer,), {}))


def test_adding_a_method_is_one_registered_class():
    @register_observer("unit_interval")
    class UnitIntervalObserver(Observer):
        def _update(self, x, mn, mx):
            pass

        def _range(self):
            return 0.0, 1.0

    try:
        o = make_observer(ObserverConfig(method="unit_interval"))
        o.observe(np.float32([5.0]))
        assert o.compute_qparams().scale == f32(1 / 255)
        with pytest.raises(QnnxError, match="per-tensor only"):
            ObserverConfig(method="unit_interval", axis=0)
    finally:
        del OBSERVERS["unit_interval"]


# --------------------------------------------------------------------------- edge cases, every method


@pytest.mark.parametrize("method", METHODS)
def test_no_data(method):
    o = obs(method)
    assert o.num_observed == 0
    with pytest.raises(QnnxError, match="observed no data"):
        o.compute_qparams()


@pytest.mark.parametrize("method", METHODS)
def test_empty_batch_raises(method):
    o = obs(method)
    with pytest.raises(QnnxError, match="empty batch"):
        o.observe(np.zeros((0, 3), np.float32))
    assert o.num_observed == 0
    with pytest.raises(QnnxError, match="observed no data"):
        o.compute_qparams()


@pytest.mark.parametrize("method", METHODS)
def test_non_finite_values_raise_and_leave_state_intact(method):
    good = np.linspace(-1, 2, 101, dtype=np.float32)
    bad = good.copy()
    bad[[3, 7]] = np.nan
    bad[9] = np.inf
    o = obs(method)
    o.observe(good)
    with pytest.raises(QnnxError, match=r"3 non-finite value\(s\) \(2 NaN, 1 Inf\) out of 101"):
        o.observe(bad)
    with pytest.raises(QnnxError, match=r"1 non-finite value\(s\) \(0 NaN, 1 Inf\)"):
        o.observe(np.float32([0.0, -np.inf]))
    assert o.num_observed == 1
    assert o.compute_qparams() == feed(obs(method), [good]).compute_qparams()


@pytest.mark.parametrize("method", METHODS)
def test_bad_inputs(method):
    o = obs(method)
    with pytest.raises(QnnxError, match="floating-point"):
        o.observe(np.arange(4, dtype=np.int32))
    with pytest.raises(QnnxError, match="floating-point"):
        o.observe(np.array([True]))
    with pytest.raises(QnnxError, match="beyond float32"):
        o.observe(np.array([0.0, 1e39]))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype, symmetric", [("uint8", False), ("int8", True), ("int16", False)])
def test_all_zero_tensor(method, dtype, symmetric):
    qp = feed(obs(method, dtype=dtype, symmetric=symmetric), [np.zeros((2, 8), np.float32)] * 3).compute_qparams()
    assert qp.scale == f32(ZERO_RANGE_SCALE)
    assert roundtrip(qp, 0.0) == 0.0


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("c", [0.37, -1234.5])
def test_constant_tensor(method, c):
    batch = np.full(1000, c, np.float32)
    qp = feed(obs(method), [batch] * 3).compute_qparams()
    assert float(qp.scale) > 0
    assert abs(roundtrip(qp, c) - float(f32(c))) <= 4 * np.spacing(f32(abs(c)))
    qp = feed(obs(method, dtype="int8", symmetric=True), [batch] * 3).compute_qparams()
    assert abs(roundtrip(qp, c) - float(f32(c))) <= 0.5001 * float(qp.scale)


@pytest.mark.parametrize("method", METHODS)
def test_float16_and_float64_inputs(method):
    x = np.linspace(-1, 3, 257)
    a = feed(obs(method), [x.astype(np.float16)]).compute_qparams()
    b = feed(obs(method), [x.astype(np.float64)]).compute_qparams()
    assert float(a.scale) == pytest.approx(4 / 255, rel=2e-3) and float(b.scale) == pytest.approx(4 / 255, rel=2e-3)


# --------------------------------------------------------------------------- known distributions


@pytest.mark.parametrize("dtype, symmetric, scale, zp", [
    ("int8", True, 3 / 127.5, 0), ("uint8", True, 3 / 127.5, 128), ("int16", True, 3 / 32767.5, 0),
    ("int8", False, 4 / 255, -64), ("uint8", False, 4 / 255, 64), ("int16", False, 4 / 65535, -16384),
])
def test_minmax_symmetric_and_asymmetric(dtype, symmetric, scale, zp):
    rng = np.random.default_rng(1)
    batches = [rng.uniform(-0.9, 2.9, 1000).astype(np.float32) for _ in range(5)]
    batches[2][10], batches[4][0] = -1.0, 3.0  # the exact extremes, in different batches
    o = feed(obs("minmax", dtype=dtype, symmetric=symmetric), batches)
    assert o.num_observed == 5
    lo, hi = o.compute_range()
    assert (float(lo), float(hi)) == (-1.0, 3.0)
    qp = o.compute_qparams()
    assert qp.scale == f32(scale) and int(qp.zero_point) == zp


def test_moving_average_known_sequence():
    o = feed(obs("moving_average", averaging_constant=0.5), [np.float32([-1, 1]), np.float32([-3, 0, 5]),
                                                           np.float32([-2, 2])])
    lo, hi = o.compute_range()
    # min: -1 -> -1 + 0.5*(-3 + 1) = -2 -> -2 + 0.5*(-2 + 2) = -2 ; max: 1 -> 3 -> 2.5
    assert (float(lo), float(hi)) == (-2.0, 2.5)
    o = feed(obs("moving_average", averaging_constant=0.25, axis=1),
             [np.float32([[0, 4], [-4, 0]]), np.float32([[8, 0], [0, -8]])])
    lo, hi = o.compute_range()
    # channel 0 sees min -4 then 0, max 0 then 8; channel 1 min 0 then -8, max 4 then 0
    assert lo.tolist() == [-4 + 0.25 * 4, 0 + 0.25 * -8] and hi.tolist() == [0 + 0.25 * 8, 4 + 0.25 * -4]


def test_percentile_asymmetric_matches_numpy():
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 3, 200_000).astype(np.float32)
    o = feed(obs("percentile", percentile=99.0), np.array_split(x, 5))
    width = float(np.diff(o.histogram[1])[0])
    lo, hi = o.compute_range()
    ref_lo, ref_hi = np.percentile(x.astype(np.float64), [0.5, 99.5])
    assert abs(float(lo) - ref_lo) <= width and abs(float(hi) - ref_hi) <= width
    assert width <= 4 / 2048 * 2  # the grid is at most twice as coarse as (max - min) / bins


def test_percentile_symmetric_matches_numpy():
    x = np.random.default_rng(3).standard_normal(200_000).astype(np.float32)
    o = feed(obs("percentile", percentile=99.9, symmetric=True, dtype="int8"), np.array_split(x, 4))
    width = float(np.diff(o.histogram[1])[0])
    lo, hi = o.compute_range()
    t = np.percentile(np.abs(x.astype(np.float64)), 99.9)
    assert float(hi) == -float(lo) and abs(float(hi) - t) <= width
    assert 3.2 < float(hi) < 3.4  # |N(0,1)| 99.9th percentile: 3.29


def test_percentile_interpolates_inside_a_bin_of_abs_x():
    # bins=16 over [-2.9, 7.5]: width 1 (width 0.5 would need 21 bins), grid anchored at 0.
    # |x|: 10 values in bin [2, 3) (folded from [-3, -2)), 1 in [7, 8). The 50th percentile is
    # rank 5.5 of 11: 5.5/10 of the way through bin [2, 3).
    x = np.float32([-2.9] * 5 + [-2.1] * 5 + [7.5])
    o = feed(obs("percentile", percentile=50.0, symmetric=True, dtype="int8", bins=16), [x])
    assert np.diff(o.histogram[1])[0] == 1.0
    lo, hi = o.compute_range()
    assert float(hi) == pytest.approx(2.55, abs=1e-12) and float(lo) == -float(hi)
    # asymmetric: tails of 25% each; ranks 2.75 and 8.25 both fall in bin [-3, -2) of 10 values
    o = feed(obs("percentile", percentile=50.0, bins=16), [x])
    lo, hi = o.compute_range()
    assert float(lo) == pytest.approx(-3 + 0.275, abs=1e-12) and float(hi) == pytest.approx(-3 + 0.825, abs=1e-12)


def test_percentile_100_is_minmax():
    x = np.random.default_rng(4).standard_normal(10_000).astype(np.float32)
    for symmetric in (True, False):
        p = feed(obs("percentile", percentile=100, symmetric=symmetric), [x]).compute_qparams()
        m = feed(obs("minmax", symmetric=symmetric), [x]).compute_qparams()
        assert p == m


def _actual_mse(x: np.ndarray, lo: float, hi: float, dtype: str, symmetric: bool) -> float:
    qp = qparams_from_range(lo, hi, dtype, symmetric)
    return float(np.mean((roundtrip(qp, x) - x.astype(np.float64)) ** 2))


@pytest.mark.parametrize("method", HISTOGRAM_METHODS)
@pytest.mark.parametrize("dtype, symmetric", [("int8", True), ("uint8", False)])
def test_clipping_methods_clip_outliers(gaussian_with_outliers, method, dtype, symmetric):
    x, batches = gaussian_with_outliers
    lo_mm, hi_mm = feed(obs("minmax", dtype=dtype, symmetric=symmetric), batches).compute_range()
    assert (float(lo_mm), float(hi_mm)) == (-60.0, 60.0)
    o = feed(obs(method, dtype=dtype, symmetric=symmetric, percentile=99.99), batches)
    lo, hi = (float(v) for v in o.compute_range())
    if method == "percentile":
        # 4 ppm of outliers: the 99.99th percentile of |x| is the gaussian's, ~3.9
        for v in (-lo, hi):
            assert 3.6 < v < 4.1
    elif method == "entropy":
        # default bins: the |x| grid is 1/16 wide, so the smallest threshold is 128 levels * 1/16 = 8
        assert -lo == hi == 8.0
    else:
        # optimum of 1e6 * T**2 / (12 * 127.5**2) + sum((|o| - T)**2): T ~ 25; and it is the best
        # actual MSE within 2%, against a brute-force search with the reference numerics
        assert 20 < -lo < 30 and 20 < hi < 30
        grid = [_actual_mse(x, -t, t, dtype, symmetric) for t in np.linspace(15, 40, 51)]
        assert _actual_mse(x, lo, hi, dtype, symmetric) <= 1.02 * min(grid)
    assert _actual_mse(x, lo, hi, dtype, symmetric) < _actual_mse(x, -60.0, 60.0, dtype, symmetric)


def test_entropy_resolution_grows_with_bins(gaussian_with_outliers):
    _, batches = gaussian_with_outliers
    lo, hi = feed(obs("entropy", dtype="int8", symmetric=True, bins=8192), batches).compute_range()
    assert -float(lo) == float(hi) and 4.0 < float(hi) < 5.5  # near the outlier-free threshold below


@pytest.mark.parametrize("dtype, symmetric", [("int8", True), ("uint8", False)])
def test_entropy_and_mse_on_a_pure_gaussian(dtype, symmetric):
    x = np.random.default_rng(5).standard_normal(400_000).astype(np.float32)
    lo_e, hi_e = feed(obs("entropy", dtype=dtype, symmetric=symmetric), [x]).compute_range()
    assert 4.0 < float(hi_e) < 5.5 and 4.0 < -float(lo_e) < 5.5  # TensorRT's KL clips N(0,1) near 4.5-5
    lo, hi = (float(v) for v in feed(obs("mse", dtype=dtype, symmetric=symmetric), [x]).compute_range())
    assert 3.5 < -lo < 4.3 and 3.5 < hi < 4.3  # ~3.9 sigma for 8 bits (Banner et al., ACIQ)
    grid = [_actual_mse(x, -t, t, dtype, symmetric) for t in np.linspace(3.0, 5.0, 41)]
    assert _actual_mse(x, lo, hi, dtype, symmetric) <= 1.02 * min(grid)


def test_histogram_methods_on_relu_outputs():
    x = np.abs(np.random.default_rng(6).standard_normal(300_000)).astype(np.float32)
    batches = [x, np.float32([20, 19])]
    # mse: minimum of 3e5 * T**2 / (12 * 255**2) + (20 - T)**2 + (19 - T)**2 is at T = 16.35
    for method, (t_lo, t_hi) in {"percentile": (3.6, 4.1), "entropy": (4.0, 6.0), "mse": (15.5, 17.0)}.items():
        o = feed(obs(method, dtype="uint8", percentile=99.99), batches)
        lo, hi = (float(v) for v in o.compute_range())
        qp = o.compute_qparams()
        assert lo >= 0 and int(qp.zero_point) == 0, method  # one-sided: 0 sits at qmin
        assert t_lo < hi < t_hi, (method, hi)


def test_entropy_16_bit_is_full_range():
    x = np.random.default_rng(8).standard_normal(50_000).astype(np.float32)
    x[0] = 30.0
    lo, hi = feed(obs("entropy", dtype="int16", symmetric=True), [x]).compute_range()
    # documented: the 16-bit grid is finer than the histogram, so nothing is clipped
    assert float(hi) == 30.0 and float(lo) == float(x.min())


def _kl_reference(hist, levels: int) -> tuple[int, list[float]]:
    """The algorithm as written in the docstring, one candidate at a time; returns (best i, all KLs)."""
    hist = np.asarray(hist, np.float64)
    n = hist.size
    kls = []
    for i in range(levels, n + 1):
        clipped = hist[i:].sum()
        p = hist[:i].copy()
        p[-1] += clipped
        per = i // levels
        q = np.zeros(i)
        for k in range(levels):
            s, e = k * per, (i if k == levels - 1 else (k + 1) * per)
            mass = hist[s:e].sum()
            if k == levels - 1 and mass == 0 and clipped > 0:
                mass = KL_EPS
            nz = np.count_nonzero(p[s:e])
            if nz:
                q[s:e] = np.where(p[s:e] > 0, mass / nz, 0.0)
        if hist[:i].sum() == 0:
            kls.append(math.inf)
            continue
        pn, qn = p / p.sum(), q / q.sum()
        m = pn > 0
        kls.append(float(np.sum(pn[m] * np.log(pn[m] / qn[m]))))
    return levels + int(np.argmin(kls)), kls


@pytest.mark.parametrize("seed", range(6))
def test_kl_threshold_bins_matches_a_literal_loop(seed):
    rng = np.random.default_rng(seed)
    n, levels = int(rng.integers(40, 200)), int(rng.choice([8, 16, 32]))
    centre = np.exp(-0.5 * (np.arange(n) / (n / 8)) ** 2) * 1e4
    hist = rng.poisson(centre) * (rng.random(n) > 0.2)  # gaps: zero bins inside groups
    hist[-1] += seed  # outliers at the end (none for seed 0)
    got = kl_threshold_bins(hist, levels)
    _, kls = _kl_reference(hist, levels)
    # equal up to float rounding of the two summation orders
    assert kls[got - levels] <= min(kls) + 1e-12
    assert got < n or seed == 0


def test_kl_ties_keep_the_least_clipping_threshold():
    """On a sparse histogram P equals Q for thresholds that clip most of the data (KL 0 either way): the
    float rounding of the KL sum must not pick one of those; and thresholds over an empty tail tie too,
    where the fewest bins wins (more would only coarsen the grid)."""
    h = np.zeros(1834)
    h[[227, 281, 336, 385, 504, 570, 613, 777, 1128, 1262, 1314, 1328, 1471, 1833]] = [
        507, 643, 561, 334, 578, 490, 301, 725, 217, 833, 548, 812, 974, 349]
    assert kl_threshold_bins(h, 128) == 1834
    tail = np.concatenate([np.random.default_rng(3).poisson(50.0, 600), np.zeros(300)])
    keep = kl_threshold_bins(tail, 128)
    assert keep <= 600 and keep == kl_threshold_bins(tail[:600], 128)


def test_kl_threshold_bins_simple_cases():
    assert kl_threshold_bins(np.ones(100), 128) == 100  # fewer bins than levels: no clipping
    assert kl_threshold_bins(np.full(1000, 7), 128) == 1000  # uniform: clipping only hurts
    bulk = np.round(1e4 * np.exp(-0.5 * (np.arange(1000) / 60) ** 2))  # nonzero up to bin 267
    hist = bulk.copy()
    hist[999] = 1
    assert 268 <= kl_threshold_bins(hist, 128) <= 280  # keeps the bulk, drops the lone outlier
    # a flat block and an isolated outlier are reproduced exactly by Q (mass is spread only over
    # nonzero bins): KL is 0 without clipping, so nothing is clipped. That is the algorithm, not a bug.
    hist = np.zeros(1000)
    hist[:200] = 1000
    hist[999] = 1
    assert kl_threshold_bins(hist, 128) == 1000
    hist = np.zeros(1000)
    hist[995:] = 10  # all mass at the far end: candidates that keep nothing are never chosen
    assert kl_threshold_bins(hist, 128) >= 996


# --------------------------------------------------------------------------- merge


def _split(batches, n, seed):
    owner = np.random.default_rng(seed).integers(0, n, len(batches))
    return [[b for b, w in zip(batches, owner) if w == k] for k in range(n)]


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_minmax_merge_is_exact(axis):
    rng = np.random.default_rng(10)
    batches = [rng.normal(rng.normal(0, 5), rng.uniform(0.1, 3), (3, 4, 5)).astype(np.float32) for _ in range(12)]
    single = feed(obs("minmax", axis=axis, dtype="int8"), batches)
    parts = [feed(obs("minmax", axis=axis, dtype="int8"), p) for p in _split(batches, 3, 0)]
    merged = obs("minmax", axis=axis, dtype="int8")
    for p in parts:
        merged.merge(p)
    assert merged.num_observed == 12
    assert merged.compute_qparams() == single.compute_qparams()
    for a, b in zip(merged.compute_range(), single.compute_range()):
        np.testing.assert_array_equal(a, b)


def test_moving_average_merge_equals_sequential_order():
    rng = np.random.default_rng(11)
    batches = [rng.normal(0, rng.uniform(0.5, 4), (2, 50)).astype(np.float32) for _ in range(12)]
    for axis in (None, 0):
        kw = dict(averaging_constant=0.1, axis=axis)
        seq = feed(obs("moving_average", **kw), batches)
        a, b = feed(obs("moving_average", **kw), batches[:5]), feed(obs("moving_average", **kw), batches[5:])
        a.merge(b)  # "b's batches came after a's"
        for got, want in zip(a.compute_range(), seq.compute_range()):
            np.testing.assert_allclose(got, want, rtol=1e-12)  # documented: float64 rounding only
        qa, qs = a.compute_qparams(), seq.compute_qparams()
        np.testing.assert_array_max_ulp(qa.scale, qs.scale, maxulp=1)
        np.testing.assert_array_equal(qa.zero_point, qs.zero_point)
        # the merged state keeps streaming correctly
        extra = rng.normal(0, 9, (2, 50)).astype(np.float32)
        a.observe(extra)
        seq.observe(extra)
        np.testing.assert_allclose(a.compute_range()[0], seq.compute_range()[0], rtol=1e-12)
        # the other order is a different average (order matters for an EMA)
        b2, a2 = feed(obs("moving_average", **kw), batches[5:]), feed(obs("moving_average", **kw), batches[:5])
        b2.merge(a2)
        assert not np.allclose(b2.compute_range()[0], seq.compute_range()[0], rtol=1e-6)


def _expanding_batches():
    """Batches whose ranges force the histogram grid to widen on both sides, by various factors."""
    rng = np.random.default_rng(12)
    return [
        rng.standard_normal(3000).astype(np.float32) * 0.01,
        rng.uniform(0.5, 0.6, 2000).astype(np.float32),
        rng.standard_normal(3000).astype(np.float32),
        np.float32([-1e-45, 1e-45, -0.0, 0.0]),  # float32 subnormals and signed zeros
        rng.normal(-300, 1, 1000).astype(np.float32),
        np.full(100, 7.25, np.float32),
        rng.uniform(0, 5000, 2000).astype(np.float32),  # bin width > 1 from here on
        np.float32([-1e-45, -2e-45, 3e-45]),
        rng.standard_normal(500).astype(np.float32) * 1e-3,
    ]


@pytest.mark.parametrize("method", HISTOGRAM_METHODS)
def test_histogram_merge_is_exact_and_order_free(method):
    batches = _expanding_batches()
    everything = np.concatenate(batches).astype(np.float64)
    for symmetric, dtype in ((False, "uint8"), (True, "int8")):
        kw = dict(dtype=dtype, symmetric=symmetric)
        single = feed(obs(method, **kw), batches)
        shuffled = feed(obs(method, **kw), [batches[i] for i in np.random.default_rng(1).permutation(len(batches))])
        a, b, c = (feed(obs(method, **kw), p) for p in _split(batches, 3, 5))
        left = obs(method, **kw)  # (a + b) + c
        for p in (a, b, c):
            left.merge(p)
        right = feed(obs(method, **kw), [])  # a + (c + b), via copies of the parts' states
        cb = obs(method, **kw)
        cb.merge(c)
        cb.merge(b)
        right.merge(a)
        right.merge(cb)
        counts, edges = single.histogram
        for other in (shuffled, left, right):
            c2, e2 = other.histogram
            np.testing.assert_array_equal(c2, counts)
            np.testing.assert_array_equal(e2, edges)
            assert other.compute_qparams() == single.compute_qparams()
            assert other.num_observed == len(batches)
        # independent reference: numpy's histogram of all values on the same edges
        np.testing.assert_array_equal(counts, np.histogram(everything, bins=edges)[0])


def test_histogram_expands_by_powers_of_two():
    rng = np.random.default_rng(13)
    o = obs("percentile", bins=64)
    seen = []

    def step(x):
        seen.append(x)
        o.observe(x)
        counts, edges = o.histogram
        width = edges[1] - edges[0]
        assert counts.shape == (64,) and edges.shape == (65,)
        assert math.frexp(width)[0] == 0.5  # a power of two
        assert np.all(np.diff(edges) == width) and edges[0] % width == 0  # canonical grid, anchored at 0
        everything = np.concatenate(seen).astype(np.float64)
        assert edges[0] <= everything.min() and everything.max() < edges[-1]
        np.testing.assert_array_equal(counts, np.histogram(everything, bins=edges)[0])
        return width

    w1 = step(rng.uniform(0, 1, 1000).astype(np.float32))
    assert w1 == 2.0 ** -6  # smallest power of two with [0, 1) in 64 bins
    w2 = step(rng.uniform(-5, 3, 1000).astype(np.float32))
    assert w2 == 2.0 ** -3 and (w2 / w1) == 8
    assert step(rng.uniform(-0.1, 0.1, 1000).astype(np.float32)) == w2  # inside: no re-bin
    assert step(np.float32([1000.0])) == 2.0 ** 4


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_histogram_of_a_tensor_spanning_several_blocks(dtype, monkeypatch):
    """Binning runs in blocks of BIN_BLOCK values (cache-sized temporaries): a tensor of several blocks
    plus a partial one gets the counts of numpy's histogram of all its values, edges included."""
    from qnnx.calibrate import observers as observers_module

    monkeypatch.setattr(observers_module, "BIN_BLOCK", 1000)
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.standard_normal(3500), [0.0, -0.0, 2.0 ** -20, -(2.0 ** -20)]]).astype(dtype)
    o = obs("percentile", bins=256)
    o.observe(x.reshape(8, 438, 1))
    counts, edges = o.histogram
    assert counts.sum() == x.size
    np.testing.assert_array_equal(counts, np.histogram(x.astype(np.float64), bins=edges)[0])


def test_merge_errors_and_trivial_merges():
    a = feed(obs("minmax"), [np.float32([0, 1])])
    with pytest.raises(QnnxError, match="same config"):
        a.merge(obs("minmax", dtype="int8"))
    with pytest.raises(QnnxError, match="same config"):
        a.merge(obs("moving_average"))
    with pytest.raises(QnnxError, match="into itself"):
        a.merge(a)
    before = a.compute_qparams()
    a.merge(obs("minmax"))  # empty: no-op
    assert a.compute_qparams() == before and a.num_observed == 1
    e = obs("minmax")
    e.merge(a)  # into empty: a copy, independent of a afterwards
    a.observe(np.float32([50]))
    assert e.compute_qparams() == before and e.num_observed == 1
    p, q = feed(obs("minmax", axis=0), [np.zeros((2, 3), np.float32)]), feed(obs("minmax", axis=0),
                                                                            [np.zeros((3, 3), np.float32)])
    with pytest.raises(QnnxError, match="channels"):
        p.merge(q)


# --------------------------------------------------------------------------- state size


@pytest.mark.parametrize("method, axis", [(m, None) for m in METHODS] + [("minmax", 1), ("moving_average", 1)])
def test_state_size_does_not_grow(method, axis):
    rng = np.random.default_rng(14)
    o = obs(method, axis=axis)

    def state():
        assert not any(isinstance(v, (list, dict, set, tuple)) for v in vars(o).values())
        return {k: (v.shape, v.dtype) for k, v in vars(o).items() if isinstance(v, np.ndarray)}

    o.observe(rng.standard_normal((2, 3, 4)).astype(np.float32))
    first = state()
    assert first  # the state does live in arrays
    for i in range(999):  # ranges grow and drift, so histograms keep widening
        o.observe((rng.standard_normal((2, 3, 4)) * (1 + i) + i).astype(np.float32))
    assert state() == first and o.num_observed == 1000
    o.compute_qparams()


# --------------------------------------------------------------------------- per-channel


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("method", ["minmax", "moving_average"])
def test_per_channel(axis, method):
    rng = np.random.default_rng(15)
    batches = [rng.normal(0, 1, (3, 4, 5)).astype(np.float32) * rng.uniform(0.1, 5, (3, 4, 5)).astype(np.float32)
               for _ in range(3)]
    for b in batches:
        np.moveaxis(b, axis, 0)[1] = 0.0  # channel 1 all zero
    kw = dict(axis=axis, dtype="int8", symmetric=True, averaging_constant=1.0)
    qp = feed(obs(method, **kw), batches).compute_qparams()
    channels = batches[0].shape[axis]
    assert qp.axis == axis and qp.scale.shape == (channels,) and qp.zero_point.tolist() == [0] * channels
    assert qp.scale[1] == f32(ZERO_RANGE_SCALE)
    # independent reference: reshape to (C, rest) for each batch
    flat = [np.moveaxis(b, axis, 0).reshape(channels, -1) for b in batches]
    if method == "minmax":
        lo = np.min([f.min(1) for f in flat], axis=0)
        hi = np.max([f.max(1) for f in flat], axis=0)
    else:  # averaging_constant=1: the last batch's extremes
        lo, hi = flat[-1].min(1), flat[-1].max(1)
    assert qp == qparams_from_range(lo.astype(np.float64), hi.astype(np.float64), "int8", True, axis=axis)
    np.testing.assert_array_equal(qp.scale[[0, 2]], (np.maximum(-lo, hi)[[0, 2]] / 127.5).astype(np.float32))


def test_per_channel_errors():
    o = feed(obs("minmax", axis=1), [np.zeros((2, 3), np.float32)])
    with pytest.raises(QnnxError, match="batch has 4 channels along axis 1, earlier batches had 3"):
        o.observe(np.zeros((2, 4), np.float32))
    with pytest.raises(QnnxError, match="out of range for a rank-0"):
        obs("minmax", axis=0).observe(np.float32(1.0))
    with pytest.raises(QnnxError, match="axis=2 is out of range"):
        obs("minmax", axis=2).observe(np.zeros((2, 3), np.float32))


# --------------------------------------------------------------------------- mse through a consumer function

def _actual_error_through(name: str, x: np.ndarray, lo: float, hi: float, dtype: str, symmetric: bool) -> float:
    fn = CONSUMER_FUNCTIONS[name]
    qp = qparams_from_range(lo, hi, dtype, symmetric)
    xd = x.astype(np.float64)
    return float(np.mean((fn(roundtrip(qp, x))[0] - fn(xd)[0]) ** 2))


@pytest.fixture(scope="module")
def conv_output_like():
    """A bulk N(0, 2) with a far negative tail (2%) and a sparse positive one, like a conv output
    before SiLU: minmax spends most levels on the negative side, which SiLU flattens to ~0."""
    rng = np.random.default_rng(21)
    return np.concatenate([rng.normal(0, 2, 100_000), rng.normal(-60, 20, 2_000),
                           rng.uniform(0, 100, 300)]).astype(np.float32)


@pytest.mark.parametrize("dtype, symmetric", [("uint8", False), ("int8", True)])
@pytest.mark.parametrize("name", ["silu", "hardswish", "sigmoid"])
def test_mse_through_the_consumer_beats_plain_mse_on_the_consumers_output(conv_output_like, name, dtype, symmetric):
    x = conv_output_like
    plain = [float(v) for v in feed(obs("mse", dtype=dtype, symmetric=symmetric), [x]).compute_range()]
    o = feed(obs("mse", dtype=dtype, symmetric=symmetric, consumer=name), [x])
    lo, hi = (float(v) for v in o.compute_range())
    assert lo <= 0 <= hi and hi - lo > 1.0
    if symmetric:
        assert lo == -hi
    ours, theirs = (_actual_error_through(name, x, *r, dtype, symmetric) for r in ((lo, hi), plain))
    # a symmetric range cannot drop one side, so there is less to win
    assert ours < (0.9 if symmetric else 0.5) * theirs, (name, (lo, hi), plain)
    # and within 5% of the best of a brute-force grid of ranges, measured with the reference numerics
    if symmetric:
        grid = [(-t, t) for t in np.geomspace(2, 110, 60)]
    else:
        grid = [(a, b) for a in -np.geomspace(1, 110, 25) for b in np.geomspace(2, 100, 25)]
    best = min(_actual_error_through(name, x, a, b, dtype, symmetric) for a, b in grid)
    assert ours <= 1.05 * best


def test_mse_through_silu_clips_the_flat_side_only(conv_output_like):
    lo, hi = (float(v) for v in feed(obs("mse", consumer="silu"), [conv_output_like]).compute_range())
    assert -8 < lo < -2  # SiLU is within 0.003 of 0 below -8: levels there are wasted
    assert hi > 90  # the positive side passes through SiLU unchanged: still worth covering


def test_mse_through_a_function_flat_over_all_the_data_keeps_a_range():
    x = -5 - np.random.default_rng(3).random(1_000).astype(np.float32)  # hard-swish is 0 below -3
    lo, hi = (float(v) for v in feed(obs("mse", consumer="hardswish"), [x]).compute_range())
    # the tie-breaking plain error still covers the data (0 joins the range in compute_qparams)
    assert lo <= float(x.min()) + 0.05 and hi >= float(x.max()) - 0.05


def test_consumer_identity_is_the_plain_method(conv_output_like):
    for symmetric, dtype in ((False, "uint8"), (True, "int8")):
        a = feed(obs("mse", dtype=dtype, symmetric=symmetric), [conv_output_like]).compute_qparams()
        b = feed(obs("mse", dtype=dtype, symmetric=symmetric, consumer="identity"),
                 [conv_output_like]).compute_qparams()
        assert a == b


def test_unknown_consumer_function_is_refused():
    with pytest.raises(QnnxError, match="unknown consumer function 'gelu'; expected one of identity, silu"):
        ObserverConfig(method="mse", consumer="gelu")


# --------------------------------------------------------------------------- channel balance

def _loud_channel_batch(seed: int = 0, loud: float = 50.0) -> np.ndarray:
    """NCHW, 8 channels: seven N(0, 1), channel 3 N(0, loud)."""
    x = np.random.default_rng(seed).standard_normal((4, 8, 16, 16)).astype(np.float32)
    x[:, 3] *= loud
    return x


def test_channel_balance_weighs_each_channel_by_its_loudness():
    x = _loud_channel_batch()
    o = feed(obs("mse", channel_balance=0.5), [x])
    counts, edges = o.histogram
    ms = np.mean(np.square(x.astype(np.float64)), axis=(0, 2, 3))
    w = np.minimum(1.0, np.median(ms) / ms) ** 0.5
    assert w[3] < 0.03 and np.all(w[np.arange(8) != 3] > 0.5)
    want = sum(w[c] * np.histogram(x[:, c].astype(np.float64), edges)[0] for c in range(8))
    np.testing.assert_allclose(counts, want, rtol=1e-5)  # mean squares are accumulated in float32
    assert counts.dtype == np.float64


@pytest.mark.parametrize("method", HISTOGRAM_METHODS)
def test_channel_balance_narrows_the_range_set_by_one_loud_channel(method):
    x = _loud_channel_batch()
    plain = feed(obs(method, percentile=99.9), [x]).compute_range()
    balanced = feed(obs(method, percentile=99.9, channel_balance=0.5), [x]).compute_range()
    # mse still pays the loud channel's clipping error quadratically: it narrows less
    factor = 0.85 if method == "mse" else 0.6
    assert float(balanced[1] - balanced[0]) < factor * float(plain[1] - plain[0]), (plain, balanced)


def test_channel_balance_along_another_axis_and_without_channels():
    x = np.moveaxis(_loud_channel_batch(), 1, -1)  # NHWC
    a = feed(obs("mse", channel_balance=0.5, balance_axis=-1), [x]).compute_range()
    b = feed(obs("mse", channel_balance=0.5), [_loud_channel_batch()]).compute_range()
    assert np.allclose(a, b)
    flat = _loud_channel_batch().reshape(-1)  # rank 1: nothing to balance, the plain histogram
    assert np.array_equal(feed(obs("mse", channel_balance=0.5), [flat]).histogram[0],
                          feed(obs("mse"), [flat]).histogram[0])


def test_channel_balance_depends_on_batches_and_says_so():
    o = obs("mse", channel_balance=0.5)
    assert not o.partition_invariant and o.batch_statistics
    plain = obs("mse")
    assert plain.partition_invariant and not plain.batch_statistics
    x = _loud_channel_batch()
    whole = feed(obs("mse", channel_balance=0.5), [x]).histogram[0]
    a, b = feed(obs("mse", channel_balance=0.5), [x[:2]]), feed(obs("mse", channel_balance=0.5), [x[2:]])
    a.merge(b)
    assert a.histogram[0].sum() == pytest.approx(whole.sum(), rel=0.05)  # per-batch weights: close, not equal


@pytest.mark.parametrize("kw, message", [(dict(channel_balance=1.5), "channel_balance must be in [0, 1]"),
                                         (dict(channel_balance=0.5, method="minmax"), "needs a histogram method"),
                                         (dict(balance_axis=1.0), "balance_axis must be an int")])
def test_channel_balance_config_is_validated(kw, message):
    with pytest.raises(QnnxError, match=re.escape(message)):
        ObserverConfig(**{"method": "mse", **kw})


def test_channel_weights_count_each_channel_with_its_fixed_weight():
    x = _loud_channel_batch()
    w = np.array([1.0, 2.0, 0.5, 0.01, 1.0, 1.0, 3.0, 1.0])
    o = feed(obs("mse", channel_weights=tuple(w)), [x])
    counts, edges = o.histogram
    want = sum(w[c] * np.histogram(x[:, c].astype(np.float64), edges)[0] for c in range(8))
    np.testing.assert_allclose(counts, want, rtol=1e-12)
    assert counts.dtype == np.float64


def test_channel_weights_are_fixed_so_batching_does_not_change_the_state():
    x = _loud_channel_batch()
    w = tuple(float(v) for v in np.linspace(0.1, 2.0, 8))
    whole = feed(obs("mse", channel_weights=w), [x])
    a, b = feed(obs("mse", channel_weights=w), [x[:1]]), feed(obs("mse", channel_weights=w), [x[1:]])
    a.merge(b)
    np.testing.assert_allclose(a.histogram[0], whole.histogram[0], rtol=1e-12)
    assert whole.partition_invariant and not whole.batch_statistics


@pytest.mark.parametrize("method", HISTOGRAM_METHODS)
def test_a_loud_channel_with_a_tiny_weight_no_longer_sets_the_range(method):
    x = _loud_channel_batch()
    w = tuple(0.001 if c == 3 else 1.0 for c in range(8))
    plain = feed(obs(method, percentile=99.9), [x]).compute_range()
    weighted = feed(obs(method, percentile=99.9, channel_weights=w), [x]).compute_range()
    assert float(weighted[1] - weighted[0]) < 0.5 * float(plain[1] - plain[0]), (plain, weighted)


def test_channel_weights_and_balance_multiply():
    x = _loud_channel_batch()
    w = np.array([1.0, 2.0, 0.5, 0.01, 1.0, 1.0, 3.0, 1.0])
    both = feed(obs("mse", channel_balance=0.5, channel_weights=tuple(w)), [x]).histogram
    counts, edges = both
    ms = np.mean(np.square(x.astype(np.float64)), axis=(0, 2, 3))
    bal = np.minimum(1.0, np.median(ms) / ms) ** 0.5
    want = sum(bal[c] * w[c] * np.histogram(x[:, c].astype(np.float64), edges)[0] for c in range(8))
    np.testing.assert_allclose(counts, want, rtol=1e-5)


def test_channel_weights_for_another_channel_count_is_one_clear_error():
    with pytest.raises(QnnxError, match=re.escape("channel_weights has 3 entries but the tensor of shape [4, 8, 16, 16] "
                                                  "has 8 channels along axis 1")):
        feed(obs("mse", channel_weights=(1.0, 1.0, 1.0)), [_loud_channel_batch()])


@pytest.mark.parametrize("kw, message", [(dict(channel_weights=[1.0, 2.0]), "must be a tuple"),
                                         (dict(channel_weights=(1.0, float("nan"))), "finite non-negative"),
                                         (dict(channel_weights=(0.0, 0.0)), "not all zero"),
                                         (dict(channel_weights=(1.0,), method="minmax"), "needs a histogram method")])
def test_channel_weights_config_is_validated(kw, message):
    with pytest.raises(QnnxError, match=re.escape(message)):
        ObserverConfig(**{"method": "mse", **kw})


# --------------------------------------------------------------------------- mse: a narrow negative lobe


@pytest.fixture(scope="module")
def silu_like():
    """SiLU of a wide bulk: 40% of the values in SiLU's lobe [-0.278, 0), a tail to ~100."""
    rng = np.random.default_rng(8)
    x = np.concatenate([rng.normal(0, 4, 200_000), rng.uniform(20, 100, 200)])
    return (x / (1 + np.exp(-x))).astype(np.float32)


def test_mse_negative_lobe_keeps_the_low_side_whole(silu_like):
    plain = [float(v) for v in feed(obs("mse"), [silu_like]).compute_range()]
    lo, hi = (float(v) for v in feed(obs("mse", negative_lobe=0.01), [silu_like]).compute_range())
    assert plain[0] > -0.25  # mse clips part of the lobe
    assert lo == pytest.approx(float(silu_like.min()))  # kept: starts at the data's minimum
    assert hi == pytest.approx(plain[1], rel=0.05)  # the high side is still chosen by mse


def test_mse_negative_lobe_leaves_a_wide_negative_side_to_mse(silu_like):
    x = np.concatenate([silu_like, -np.float32([5.0])])  # -min is 5% of max: beyond a 1% lobe
    a = feed(obs("mse"), [x]).compute_qparams()
    b = feed(obs("mse", negative_lobe=0.01), [x]).compute_qparams()
    assert a == b


@pytest.mark.parametrize("value", [-0.01, 1.0, None])
def test_negative_lobe_is_validated(value):
    with pytest.raises(QnnxError, match=re.escape("negative_lobe must be in [0, 1)")):
        ObserverConfig(method="mse", negative_lobe=value)
