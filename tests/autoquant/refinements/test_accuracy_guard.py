"""The accuracy guard: an output far from float is rescued (costliest patterns back to float) or refused."""

from __future__ import annotations


import numpy as np
import pytest

from float_graphs import Graph

import qnnx
from qnnx import QnnxError, QuantConfig


def _cancellation():
    """y = (x + 100) - (1.01 x + 100) = -0.01 x: each branch quantized on a range of ~10 around 100 leaves
    an error far larger than y itself."""
    g = Graph()
    x = g.input("x", [1, 8])
    a = g.node("Add", [x, g.const(np.array(100.0, np.float32))], name="a")
    b = g.node("Add", [g.node("Mul", [x, g.const(np.array(1.01, np.float32))], name="scaled"),
                       g.const(np.array(100.0, np.float32))], name="b")
    return g.model(g.node("Relu", [g.node("Sub", [a, b], name="difference")], name="out"))


def _data(n=12):
    rng = np.random.default_rng(0)
    return [rng.uniform(-5, 0, (1, 8)).astype(np.float32) for _ in range(n)]


def test_a_far_output_is_refused_by_default_and_rescued_by_a_target():
    with pytest.raises(QnnxError, match="output '.*' is far from the float model's.*not written.*--min-sqnr"):
        qnnx.quantize(_cancellation(), _data(), QuantConfig(progress=False))
    qm = qnnx.quantize(_cancellation(), _data(), QuantConfig(progress=False, min_sqnr_db=6.0, allow_float=True))
    record = qm.report.record("accuracy_guard")
    assert record is not None and record.left_float, qm.report.summary()
    assert record.worst_before[0] < 6 <= record.worst_after[0]
    assert not qm.report.far_outputs()
    assert "accuracy guard" in qm.report.summary()


def test_a_target_only_the_float_model_meets_is_refused_unless_float_is_allowed():
    with pytest.raises(QnnxError, match="nothing was quantized: accuracy guard"):
        qnnx.quantize(_cancellation(), _data(), QuantConfig(progress=False, min_sqnr_db=400.0))
    qm = qnnx.quantize(_cancellation(), _data(), QuantConfig(progress=False, min_sqnr_db=400.0, allow_float=True))
    assert not qm.report.quantized() and len(qm.report.record("accuracy_guard").left_float) == 4


def test_a_model_that_meets_the_target_is_untouched():
    g = Graph()
    x = g.input("x", [1, 8])
    model = g.model(g.node("Relu", [g.node("Add", [x, x], name="double")], name="out"))
    qm = qnnx.quantize(model, _data(), QuantConfig(progress=False, min_cosine=0.99))
    record = qm.report.record("accuracy_guard")
    assert record is not None and record.left_float == () and record.lines() == []
    assert all(d.quantized for d in qm.report.decisions if d.pattern)
