"""qnnx.metrics: the per-tensor statistics, including models that produce inf/NaN."""

from __future__ import annotations

import math

import numpy as np

from qnnx.metrics import LayerError


def test_identical_tensors_are_exact():
    e = LayerError("t", "Conv", False)
    a = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
    e.add(a, a.copy())
    assert e.sqnr_db == math.inf and e.cosine == 1.0 and e.nonfinite == 0


def test_inf_or_nan_in_one_model_is_minus_infinite_sqnr_not_a_crash():
    e = LayerError("t", "Log", True)
    ref = np.array([[-23.0, 1.0]], np.float32)
    e.add(ref, np.array([[-np.inf, 1.0]], np.float32))
    assert e.nonfinite == 1 and e.sqnr_db == -math.inf and math.isnan(e.cosine) and math.isnan(e.channel_cosine)


def test_the_same_inf_in_both_models_is_no_error():
    e = LayerError("t", "Log", True)
    a = np.array([[-np.inf, 2.0]], np.float32)
    e.add(a, a.copy())
    assert e.nonfinite == 0 and e.sqnr_db == math.inf


def test_a_small_error_has_a_finite_sqnr():
    e = LayerError("t", "Conv", False)
    a = np.ones((1, 2, 8), np.float32)
    e.add(a, a + 0.01)
    assert 39 < e.sqnr_db < 41 and 0.999 < e.cosine <= 1.0
