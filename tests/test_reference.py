"""qnnx.ReferenceEvaluator and qnnx.import_onnx on the ONNX project's own node test cases, on a graph
mixing standard and qnnx ops, and on bad input."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnx.reference
import pytest
from onnx import TensorProto, helper, numpy_helper

import qnnx
from conftest import ROUNDING_MODES
from qnnx import QnnxError, numerics

QUANT_OPS = ("QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger",
             "DynamicQuantizeLinear")
_KEYS = tuple(op.lower() for op in QUANT_OPS)
_FLOAT_QTYPES = ("e4m3fn", "e5m2", "float4e2m1")  # float8 / float4 Q/DQ: deliberately left standard


def _collect():
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    return {c.name: c for c in cases if any(k in c.name for k in _KEYS)}


CASES = _collect()


def test_case_count():
    assert len(CASES) == 45


def _array(v):
    return numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v)


def _feeds(case, inputs):
    names = [i.name for i in case.model.graph.input]
    assert len(names) == len(inputs)
    return {n: _array(v) for n, v in zip(names, inputs)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_node_case_bit_exact(name):
    case = CASES[name]
    ev = qnnx.ReferenceEvaluator(case.model)
    assert case.data_sets
    for inputs, outputs in case.data_sets:
        got = ev.run(None, _feeds(case, inputs))
        assert len(got) == len(outputs)
        for g, e in zip(got, outputs):
            e = _array(e)
            g = np.asarray(g)
            assert g.dtype == e.dtype and g.shape == e.shape
            assert g.tobytes() == e.tobytes(), (g, e)


@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_node_case_import(name):
    case = CASES[name]
    original = {n.op_type for n in case.model.graph.node} & set(QUANT_OPS)
    assert original
    model = qnnx.import_onnx(case.model)
    nodes = list(model.graph)
    domains = {n.domain for n in nodes}
    remaining = {n.op_type for n in nodes if n.domain in ("", "ai.onnx")} & set(QUANT_OPS)
    if any(k in name for k in _FLOAT_QTYPES):
        assert "qnnx" not in domains and remaining == original
    else:
        assert "qnnx" in domains
        assert not remaining, remaining
        assert model.opset_imports.get("qnnx") == 1


# --------------------------------------------------------------------------- mixed graphs


def _init(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def _model(nodes, inputs, outputs, initializers):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("qnnx", 1)])


@pytest.mark.parametrize("rounding", ROUNDING_MODES)
def test_mixed_standard_and_qnnx_graph(rounding):
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("quantize", ["r", "s1", "z1"], ["q"], domain="qnnx", name="q", out_dtype="int8"),
        helper.make_node("requantize", ["q", "s1", "z1", "s2", "z2"], ["rq"], domain="qnnx", name="rq",
                         out_dtype="uint8", rounding=rounding),
        helper.make_node("dequantize", ["rq", "s2", "z2"], ["y"], domain="qnnx", name="dq"),
    ]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6]),
                    helper.make_tensor_value_info("rq", TensorProto.UINT8, [2, 6])],
                   [_init("s1", np.float32(0.05)), _init("z1", np.int32(-3)), _init("s2", np.float32(0.1)),
                    _init("z2", np.int32(5))])
    x = np.array([[-1.0, 0.0, 0.05, 0.1, 0.15, 0.25], [0.35, 1.0, 2.5, 5.0, 6.15, 100.0]], np.float32)
    y, rq = qnnx.ReferenceEvaluator(model).run(None, {"x": x})
    q = numerics.quantize(np.maximum(x, 0), np.float32(0.05), -3, out_dtype="int8")
    want_rq = numerics.requantize(q, np.float32(0.05), -3, np.float32(0.1), 5, out_dtype="uint8", rounding=rounding)
    want_y = numerics.dequantize(want_rq, np.float32(0.1), 5)
    assert rq.dtype == np.uint8 and rq.tobytes() == want_rq.tobytes()
    assert y.dtype == np.float32 and y.tobytes() == want_y.tobytes()
    assert q[1, -1] == 127 and rq[1, -1] == 70  # 100.0 saturates the int8 quantize: (127 + 3) * 0.5 + 5
    # Relu maps -1.0 to 0.0 (q = zero point); q - z1 = 1 and 5 are ties (x 0.5) that half_even rounds to even
    assert rq[0].tolist() == ([5, 5, 5, 6, 7, 7] if rounding == "half_even" else [5, 5, 6, 6, 7, 8])
    assert list(qnnx.ReferenceEvaluator(model).output_names) == ["y", "rq"]


def test_bad_qparam_raises_qnnx_error_naming_the_node():
    nodes = [helper.make_node("requantize", ["x", "s", "z", "s0", "z"], ["y"], domain="qnnx", name="rq_node",
                              out_dtype="int8")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.INT8, [3])],
                   [helper.make_tensor_value_info("y", TensorProto.INT8, [3])],
                   [_init("s", np.float32(0.5)), _init("z", np.int32(0)), _init("s0", np.float32(0.0))])
    with pytest.raises(QnnxError) as info:  # refused on entry, before any run
        qnnx.ReferenceEvaluator(model)
    assert type(info.value) is QnnxError
    msg = str(info.value)
    assert "rq_node" in msg and "output_scale" in msg and "positive and finite" in msg
    assert "\n" not in msg


def test_bad_attribute_raises_qnnx_error_naming_the_node():
    nodes = [helper.make_node("requantize", ["x", "s", "z", "s", "z"], ["y"], domain="qnnx", name="rq_bad",
                              out_dtype="int8", rounding="nearest")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.INT8, [3])],
                   [helper.make_tensor_value_info("y", TensorProto.INT8, [3])],
                   [_init("s", np.float32(0.5)), _init("z", np.int32(0))])
    with pytest.raises(QnnxError, match="rq_bad.*rounding='nearest'"):
        qnnx.ReferenceEvaluator(model).run(None, {"x": np.array([1, 2, 3], np.int8)})


def test_bad_standard_qlinear_input_raises_qnnx_error():
    """A zero scale reaching a QLinearMatMul: the imported qnnx nodes report it, not numpy."""
    nodes = [helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"], name="qmm")]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [2, 2])],
        initializer=[_init("sa", np.float32(0.1)), _init("za", np.uint8(1)), _init("b", np.ones((2, 2), np.uint8)),
                     _init("sb", np.float32(0.1)), _init("zb", np.uint8(0)), _init("sy", np.float32(0.0)),
                     _init("zy", np.uint8(0))]), opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(QnnxError, match="qmm.*output_scale must be positive and finite"):
        qnnx.ReferenceEvaluator(model).run(None, {"a": np.ones((2, 2), np.uint8)})


def test_qlinear_matmul_ties_round_half_to_even():
    """ONNX specifies round-half-to-even for QLinear*; the node cases above contain no exact ties."""
    nodes = [helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("a", TensorProto.INT8, [6, 1])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, [6, 1])],
        initializer=[_init("sa", np.float32(0.5)), _init("za", np.int8(0)), _init("b", np.ones((1, 1), np.int8)),
                     _init("sb", np.float32(1)), _init("zb", np.int8(0)), _init("sy", np.float32(1)),
                     _init("zy", np.int8(0))]), opset_imports=[helper.make_opsetid("", 21)])
    a = np.array([[1], [3], [5], [-1], [-3], [-5]], np.int8)
    (y,) = qnnx.ReferenceEvaluator(model).run(None, {"a": a})
    assert y.ravel().tolist() == [0, 2, 2, 0, -2, -2]
    (want,) = onnx.reference.ReferenceEvaluator(model).run(None, {"a": a})
    assert y.tobytes() == want.tobytes()


# --------------------------------------------------------------------------- import does not mutate


@pytest.mark.parametrize("name", ["test_qlinearconv", "test_quantizelinear_axis", "test_dequantizelinear_int4",
                                  "test_dynamicquantizelinear", "test_matmulinteger"])
def test_import_does_not_mutate_the_proto(name):
    model = CASES[name].model
    before = model.SerializeToString(deterministic=True)
    imported = qnnx.import_onnx(model)
    assert any(n.domain == "qnnx" for n in imported.graph)
    qnnx.ReferenceEvaluator(model)
    assert model.SerializeToString(deterministic=True) == before
    assert {n.op_type for n in model.graph.node} & set(QUANT_OPS)


def _relu_model(shape=(2, 3)):
    return _model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))], [])


@pytest.mark.parametrize("feeds,match", [
    ({"x": np.zeros((3, 3), np.float32)}, r"input 'x' has shape \[2, 3\], fed \[3, 3\]"),
    ({"x": np.zeros((2, 3, 1), np.float32)}, "input 'x' has shape"),
    ({"x": np.zeros((2, 3), np.float64)}, "input 'x' is FLOAT, fed float64"),
    ({}, "feeds do not match the model inputs \\(missing x\\)"),
    ({"x": np.zeros((2, 3), np.float32), "z": np.zeros(1)}, "unknown z"),
])
def test_feeds_that_do_not_match_the_inputs_are_qnnx_errors(feeds, match):
    with pytest.raises(QnnxError, match=match):
        qnnx.ReferenceEvaluator(_relu_model()).run(None, feeds)


def test_a_dynamic_dim_takes_any_size():
    model = _relu_model(("N", 3))
    x = np.ones((5, 3), np.float32)
    np.testing.assert_array_equal(qnnx.ReferenceEvaluator(model).run(None, {"x": x})[0], x)


def test_an_invalid_model_is_a_qnnx_error_on_construction():
    cyclic = _model([helper.make_node("Add", ["x", "b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2")],
                    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                    [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1])], [])
    with pytest.raises(QnnxError, match="cycle"):
        qnnx.ReferenceEvaluator(cyclic)
    conv = helper.make_node("conv", ["x", "w", "s", "zf", "s", "z"], ["y"], domain="qnnx", name="c")
    float_zp = _model([conv], [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 1, 3, 3])],
                      [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1, 1, 1])],
                      [_init("w", np.ones((1, 1, 3, 3), np.int8)), _init("s", np.float32(1)),
                       _init("zf", np.float32(2.0)), _init("z", np.int32(0))])
    with pytest.raises(QnnxError, match="node 'c' \\(qnnx.conv\\): x_zero_point must be an integer tensor"):
        qnnx.ReferenceEvaluator(float_zp)
