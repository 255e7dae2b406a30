"""Preparation must not change what a float model computes (issue: an audio front-end's
``Add(x * x, 1e-10)`` was rewritten to Identity, and a silent input then gave log(0))."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from float_graphs import Graph

from qnnx.autoquant.prepare import prepare, prepared
from qnnx.autoquant.stages import _output_mismatch
from qnnx.ir import to_proto


def _log_energy(eps: float):
    g = Graph()
    x = g.input("x", [1, 4])
    return g.model(g.node("Log", [g.node("Add", [g.node("Mul", [x, x]), g.const(np.array(eps, np.float32))])]))


def _run(model, x):
    proto = model if hasattr(model, "SerializeToString") else to_proto(model)
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("eps", [1e-10, 1e-12, 1e-30])
def test_a_tiny_epsilon_is_kept(eps):
    m = _log_energy(eps)
    p = prepare(m)
    assert [n.op_type for n in p.graph] == ["Mul", "Add", "Log"]
    silent = np.zeros((1, 4), np.float32)
    np.testing.assert_array_equal(_run(p, silent), _run(m, silent))
    assert np.isfinite(_run(p, silent)).all()


def test_exact_no_ops_still_go():
    p = prepare(_log_energy(0.0))
    assert [n.op_type for n in p.graph] == ["Mul", "Identity", "Log"] or [n.op_type for n in p.graph] == ["Mul", "Log"]


@pytest.mark.parametrize("op, value", [("Add", 0.0), ("Sub", 0.0), ("Mul", 1.0), ("Div", 1.0)])
@pytest.mark.parametrize("shape", [(), (1,), (1, 1)])
def test_a_one_element_no_op_goes(op, value, shape):
    # Paddle exports write x * sigmoid(x * [1.0]) and x + [0.0]
    g = Graph()
    x = g.input("x", [1, 4])
    m = g.model(g.node("Log", [g.node(op, [g.node("Mul", [x, x]), g.const(np.full(shape, value, np.float32))])]))
    assert [n.op_type for n in prepare(m).graph if n.op_type != "Identity"] == ["Mul", "Log"]


@pytest.mark.parametrize("shape", [(1, 1, 1), (2,)])
def test_a_constant_that_broadcasts_or_holds_more_values_is_kept(shape):
    # [[[0.0]]] turns a 1 x 4 value into 1 x 1 x 4; [0.0, 0.0] is not one element (x + it is x, but only
    # one-element constants are matched)
    g = Graph()
    x = g.input("x", [1, 4] if shape == (1, 1, 1) else [1, 2])
    m = g.model(g.node("Log", [g.node("Add", [g.node("Mul", [x, x]), g.const(np.zeros(shape, np.float32))])]))
    assert [n.op_type for n in prepare(m).graph] == ["Mul", "Add", "Log"]


def test_a_skipped_rewrite_is_not_applied():
    g = Graph()
    x = g.input("x", [1, 2, 4, 4])
    w = g.const(np.ones((2, 2, 1, 1), np.float32))
    y = g.node("Add", [g.node("Conv", [x, w]), g.const(np.full((1, 2, 1, 1), 0.5, np.float32))])
    m = g.model(g.node("Relu", [y]))
    assert [n.op_type for n in prepare(m).graph] == ["Conv", "Relu"]
    skipped = prepared(m, skip=frozenset({"fold_affine_into_conv"})).model
    assert [n.op_type for n in skipped.graph] == ["Conv", "Add", "Relu"]
    with pytest.raises(ValueError, match="unknown prepare rewrites"):
        prepared(m, skip=frozenset({"no_such_rewrite"}))


def test_output_mismatch_tells_float_rounding_from_a_changed_model():
    a = np.array([[1.0, 2.0, -3.0]], np.float32)
    assert _output_mismatch([[a]], [[a * (1 + 1e-6)]])[1] == ""
    assert "range" in _output_mismatch([[a]], [[a + 0.1]])[1]
    assert "inf/NaN" in _output_mismatch([[np.array([-23.0])]], [[np.array([-np.inf])]])[1]
    assert _output_mismatch([[np.array([np.nan, 1.0])]], [[np.array([np.nan, 1.0])]]) == (0.0, "")


def test_an_input_that_is_also_an_output_keeps_its_name():
    """(onnx-ir's OutputFixPass renamed such an input to x_orig: the model's interface changed.)"""
    import qnnx

    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((2, 2, 1, 1)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4]), x], [w])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert [v.name for v in prepare(m).graph.inputs] == ["x"]
    data = [np.random.default_rng(i).standard_normal((1, 2, 4, 4)).astype(np.float32) for i in range(6)]
    qm = qnnx.quantize(m, data, qnnx.QuantConfig(progress=False))
    written = qm.export("qdq")
    assert [v.name for v in written.graph.inputs] == ["x"] and [v.name for v in written.graph.outputs][1] == "x"
    session = ort.InferenceSession(to_proto(written).SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"x": data[0]})[1], data[0])
