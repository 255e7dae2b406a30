"""Bias correction (qnnx.autoquant.bias_correction): a layer's own mean output error per channel,
from weight and bias rounding on its measured input means, folded into the int32 bias."""

from __future__ import annotations

import numpy as np
from autoquant_helpers import Graph, run_ort

import qnnx
from qnnx import QuantConfig


def _one_conv(rng):
    """A 1x1 conv whose weights all round the same way on the int8 grid, on inputs with a large mean:
    the weight rounding shifts every output channel's mean by the same sign."""
    g = Graph()
    w = np.full((4, 8, 1, 1), 0.3, np.float32)
    w[:, 0] = 1.0  # sets the per-channel scale to 1/127: 0.3 -> 38.1 steps, rounded down to 38
    g.node("Conv", [g.input("x", [1, 8, 6, 6]), g.const(w, "w"), g.const(np.zeros(4, np.float32) + 0.5, "b")],
           name="conv", out="y")
    return g.model("y")


def _mean_error(model, qdq, samples):
    errs = [run_ort(model, {"x": x})[0] - run_ort(qdq, {"x": x})[0] for x in samples]
    return np.abs(np.mean(errs, axis=(0, 1, 3, 4))).max()


def test_correction_removes_the_mean_shift_of_weight_rounding():
    rng = np.random.default_rng(0)
    model = _one_conv(rng)
    calib = [(rng.standard_normal((1, 8, 6, 6)) + 3).astype(np.float32) for _ in range(8)]
    evals = [(rng.standard_normal((1, 8, 6, 6)) + 3).astype(np.float32) for _ in range(8)]
    plain = qnnx.quantize(model, calib, QuantConfig(progress=False, bias_correction=False)).qdq
    corrected = qnnx.quantize(model, calib, QuantConfig(progress=False, bias_correction=True)).qdq
    before, after = _mean_error(model, plain, evals), _mean_error(model, corrected, evals)
    assert before > 0.01  # 7 weights x (0.3 - 38/127) x mean 3: about 0.015 per channel
    assert after < before / 3


def test_correction_changes_nothing_without_biased_layers():
    g = Graph()
    g.node("MatMul", [g.input("x", [2, 8]), g.const(np.full((8, 3), 0.3, np.float32), "w")], name="mm", out="y")
    model = g.model("y")
    rng = np.random.default_rng(1)
    calib = [rng.standard_normal((2, 8)).astype(np.float32) for _ in range(4)]
    a = qnnx.quantize(model, calib, QuantConfig(progress=False, bias_correction=False)).qdq
    b = qnnx.quantize(model, calib, QuantConfig(progress=False, bias_correction=True)).qdq
    x = calib[0]
    np.testing.assert_array_equal(run_ort(a, {"x": x})[0], run_ort(b, {"x": x})[0])
