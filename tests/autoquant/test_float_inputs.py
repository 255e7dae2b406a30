"""The planning rule of float_inputs.py: values read by normalizations or numerically fragile inputs
stay float, so quantization never turns a model's output into inf/NaN."""

from __future__ import annotations

import numpy as np
import pytest
from float_graphs import Graph, run_ort

import qnnx
from qnnx import QuantConfig


def _data(n=8, zero_first=True):
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1, 4)).astype(np.float32) for _ in range(n)]
    if zero_first:
        xs[0] = np.zeros((1, 4), np.float32)
    return xs


def _decision(qm, node):
    return next(d for d in qm.report.decisions if d.node == node)


def _log_energy():
    g = Graph()
    x = g.input("x", [1, 4])
    sq = g.node("Mul", [x, x], name="square")
    a = g.node("Add", [sq, g.const(np.array(1e-10, np.float32))], name="plus_eps")
    return g.model(g.node("Log", [a], name="log"))


def _normalize():
    """x / sqrt(mean(x * x) + eps): a LayerNorm-like denominator spelled out (RMS norm)."""
    g = Graph()
    x = g.input("x", [1, 4])
    sq = g.node("Mul", [x, x], name="square")
    ms = g.node("ReduceMean", [sq], name="mean", axes=[-1], keepdims=1)
    var = g.node("Add", [ms, g.const(np.array(1e-6, np.float32))], name="plus_eps")
    rms = g.node("Sqrt", [var], name="sqrt")
    return g.model(g.node("Div", [x, rms], name="divide"))


@pytest.mark.parametrize("model_fn, fragile", [(_log_energy, "plus_eps"), (_normalize, "plus_eps")])
def test_values_read_by_fragile_inputs_stay_float_and_outputs_stay_finite(model_fn, fragile):
    model, data = model_fn(), _data()
    qm = qnnx.quantize(model, data, QuantConfig(progress=False, allow_float=True))
    d = _decision(qm, fragile)
    assert not d.quantized and "numerically fragile" in d.reason, d
    for x in data:
        assert np.isfinite(run_ort(qm.qdq, {"x": x})[0]).all()
        assert np.isfinite(qnnx.ReferenceEvaluator(qm.canonical).run(None, {"x": x})[0]).all()


def test_the_square_feeding_the_epsilon_add_stays_quantized():
    qm = qnnx.quantize(_log_energy(), _data(), QuantConfig(progress=False))
    assert _decision(qm, "square").quantized


def test_a_constant_denominator_and_an_integer_power_are_not_fragile():
    g = Graph()
    x = g.input("x", [1, 4])
    y = g.node("Div", [g.node("Relu", [x], name="relu"), g.const(np.array(4.0, np.float32))], name="quarter")
    p = g.node("Pow", [g.node("Add", [y, y], name="double"), g.const(np.array(2.0, np.float32))], name="square")
    qm = qnnx.quantize(g.model(g.node("Add", [p, x], name="out")), _data(zero_first=False),
                       QuantConfig(progress=False))
    assert _decision(qm, "double").quantized and _decision(qm, "quarter").quantized
