"""The accuracy guard: an output far from float is rescued (costliest patterns back to float) or refused."""

from __future__ import annotations


import numpy as np
import pytest

from float_graphs import Graph

import qnnx
from qnnx import QnnxError, QuantConfig


def _cancellation_branch(g: Graph, x):
    """relu((x + 100) - (1.01 x + 100)) = relu(-0.01 x): each branch quantized on a range of ~10 around 100
    leaves an error far larger than the result itself."""
    a = g.node("Add", [x, g.const(np.array(100.0, np.float32))], name="a")
    b = g.node("Add", [g.node("Mul", [x, g.const(np.array(1.01, np.float32))], name="scaled"),
                       g.const(np.array(100.0, np.float32))], name="b")
    return g.node("Relu", [g.node("Sub", [a, b], name="difference")], name="out", out="far")


def _cancellation():
    g = Graph()
    return g.model(_cancellation_branch(g, g.input("x", [1, 8])))


def _data(n=12):
    rng = np.random.default_rng(0)
    return [rng.uniform(-5, 0, (1, 8)).astype(np.float32) for _ in range(n)]


def _two_outputs():
    """The cancellation above as one output, a benign chain (relu(x + x)) as another."""
    g = Graph()
    x = g.input("x", [1, 8])
    far = _cancellation_branch(g, x)
    near = g.node("Relu", [g.node("Add", [x, x], name="double")], name="relu", out="near")
    return g.model(far, near)


def test_by_default_a_far_output_is_rescued_by_keeping_the_costliest_patterns_float():
    # the guard keeps what it must float and writes the rest quantized, alone or beside a benign output
    for model in (_cancellation(), _two_outputs()):
        qm = qnnx.quantize(model, _data(), QuantConfig(progress=False))
        record = qm.report.record("accuracy_guard")
        assert record.left_float and record.worst_before[0] < 6 <= record.worst_after[0], qm.report.summary()
        assert not qm.report.far_outputs() and qm.report.quantized()
    assert "accuracy guard" in qm.report.summary()
    # without the guard it is written as it is, far output and all (the report warns)
    qm = qnnx.quantize(_cancellation(), _data(), QuantConfig(progress=False, accuracy_guard=False))
    assert qm.report.far_outputs() and "WARNING" in qm.report.summary()


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


def _within(truth, tolerance=0.02):
    """The user's metric: the fraction of samples whose output is within ``tolerance`` of ``truth``."""
    def metric(outputs):
        return float(np.mean([np.abs(next(iter(o.values())) - t).max() <= tolerance for o, t in zip(outputs, truth)]))
    return metric


def test_a_metric_target_keeps_the_costliest_patterns_float_until_the_drop_is_met():
    model, calib, held = _cancellation(), _data(12), _data(20)[12:]
    truth = [np.maximum(0.0, -0.01 * x) for x in held]  # what the float model computes
    qm = qnnx.quantize(model, calib, QuantConfig(progress=False, max_drop=0.0, allow_float=True),
                       validation=held, metric=_within(truth))
    record = qm.report.record("accuracy_guard")
    float_value, before, after = record.metric
    assert float_value == 1.0 and before < 1.0 and after == 1.0 and record.left_float
    assert "metric 1.0000" in qm.report.summary()


def test_a_metric_the_model_meets_leaves_it_whole():
    g = Graph()
    x = g.input("x", [1, 8])
    model = g.model(g.node("Relu", [g.node("Add", [x, x], name="double")], name="out"))
    held = _data(16)[12:]
    qm = qnnx.quantize(model, _data(), QuantConfig(progress=False), validation=held,
                       metric=_within([np.maximum(0, 2 * x) for x in held], tolerance=0.1))
    record = qm.report.record("accuracy_guard")
    assert record.metric[2] == 1.0 and record.left_float == () and record.max_drop == 0.01
    assert all(d.quantized for d in qm.report.decisions if d.pattern)


@pytest.mark.parametrize("kwargs,message", [
    ({"metric": lambda outputs: 1.0}, "a metric is measured on held-out samples"),
    ({"config": QuantConfig(progress=False, max_drop=0.05)}, "max_drop needs a metric"),
    ({"metric": "accuracy", "validation": _data(4)}, "metric must be a function"),
    ({"metric": lambda outputs: "high", "validation": _data(4)}, "the metric must return a number"),
    ({"metric": lambda outputs: float("nan"), "validation": _data(4)}, "the metric returned nan"),
])
def test_a_metric_target_is_checked(kwargs, message):
    kwargs.setdefault("config", QuantConfig(progress=False))
    with pytest.raises(QnnxError, match=message):
        qnnx.quantize(_cancellation(), _data(), **kwargs)


def test_the_costliest_pattern_is_the_one_that_adds_the_most_error():
    # the difference of two ~100-sized branches adds far more relative error than any other pattern, although
    # the output after it (Relu) has the lower SQNR of the two
    from qnnx.autoquant import pipeline
    from qnnx.autoquant.refinements.sqnr_fallback import pattern_added_error

    state = pipeline.run(_cancellation(), _data(), QuantConfig(progress=False, accuracy_guard=False),
                         refinements=())
    added = pattern_added_error(state.float_model, state.qdq, state.plan.matches, state.samples)
    ranked = [state.plan.matches[i].nodes[0].name for i in sorted(added, key=lambda i: -added[i])]
    assert ranked[0] == "difference", added


def test_the_record_states_the_share_of_multiply_accumulates_left_float():
    from float_graphs import conv_weight

    from qnnx.autoquant.refinements.accuracy_guard import multiply_accumulates

    rng = np.random.default_rng(1)
    g = Graph()
    c = g.node("Conv", [g.input("x", [1, 3, 8, 8]), g.const(conv_weight(rng, 4, 3), "w")], name="conv",
               pads=[1, 1, 1, 1], out="c")
    g.node("MatMul", [g.node("Flatten", [c], name="flat"), g.const(rng.normal(size=(256, 5)).astype(np.float32))],
           name="fc", out="y")
    import onnx
    import onnx_ir as ir
    model = ir.from_proto(onnx.shape_inference.infer_shapes(g.model("y")))
    macs = {n.name: multiply_accumulates(n) for n in model.graph}
    assert macs["conv"] == 4 * 8 * 8 * 3 * 3 * 3 and macs["fc"] == 5 * 256 and macs["flat"] == 0
    qm = qnnx.quantize(_two_outputs(), _data(), QuantConfig(progress=False))
    record = qm.report.record("accuracy_guard")
    assert record.float_mac_share == 0.0  # no conv or matmul in it
    assert "0% of the model's conv/matmul multiply-accumulates" in "\n".join(record.lines())
