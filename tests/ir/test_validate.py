"""Models are checked once, as ModelProto, when they enter qnnx (qnnx.ir.validate via load_model)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import qnnx
from qnnx.errors import QnnxError
from qnnx.ir import load_model
from qnnx.ir.validate import check_model


def _vi(name, elem=T.FLOAT, shape=(1, 4)):
    return helper.make_tensor_value_info(name, elem, list(shape))


def _model(nodes, inputs=("x",), outputs=("y",), inits=(), domains=()):
    g = helper.make_graph(nodes, "g", [_vi(n) for n in inputs], [_vi(n) for n in outputs], list(inits))
    ops = [helper.make_opsetid("", 17)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(g, opset_imports=ops)


def _refused(model, *match):
    with pytest.raises(QnnxError) as info:
        check_model(model, where="m.onnx")
    msg = str(info.value)
    assert msg.startswith("m.onnx: ") and "\n" not in msg
    for m in match:
        assert m in msg, msg
    return msg


def test_a_model_without_graph_is_refused():
    _refused(onnx.ModelProto(), "has no graph")


def test_an_empty_file_is_refused_on_load(tmp_path):
    (tmp_path / "e.onnx").write_bytes(b"")
    with pytest.raises(QnnxError, match="e.onnx: not an ONNX model: it has no graph"):
        load_model(tmp_path / "e.onnx")


def test_an_undefined_input_names_the_node_and_the_value():
    _refused(_model([helper.make_node("Relu", ["nope"], ["y"], name="relu")]), "node 'relu' (Relu) reads 'nope'")


def test_a_cycle_names_its_nodes():
    m = _model([helper.make_node("Add", ["x", "b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2")],
               outputs=("b",))
    msg = _refused(m, "cycle")
    assert "'n1'" in msg and "'n2'" in msg


def test_nodes_out_of_order_are_sorted_not_refused():
    m = _model([helper.make_node("Relu", ["a"], ["y"], name="second"), helper.make_node("Neg", ["x"], ["a"], name="first")])
    assert check_model(m) is False
    assert [n.name for n in load_model(m).graph] == ["first", "second"]


def test_a_value_produced_twice_is_refused():
    m = _model([helper.make_node("Relu", ["x"], ["y"], name="a"), helper.make_node("Neg", ["x"], ["y"], name="b")])
    _refused(m, "'y' is produced twice", "'a'", "'b'")


def test_an_undefined_graph_output_is_refused():
    _refused(_model([helper.make_node("Relu", ["x"], ["y"])], outputs=("z",)), "graph output 'z'")


def test_an_undeclared_domain_is_refused():
    _refused(_model([helper.make_node("Foo", ["x"], ["y"], domain="custom.ops", name="foo")]),
             "node 'foo' (Foo) is in domain 'custom.ops'", "opset_import")


def test_an_initializer_with_less_data_than_its_dims_is_refused():
    w = numpy_helper.from_array(np.ones((2, 2), np.float32), "w")
    w.dims[:] = [4, 4]
    _refused(_model([helper.make_node("MatMul", ["x", "w"], ["y"])], inits=[w]), "tensor 'w'", "16 bytes", "64")
    typed = onnx.TensorProto(name="w", data_type=T.FLOAT, dims=[4, 4], float_data=[1.0] * 15)
    _refused(_model([helper.make_node("MatMul", ["x", "w"], ["y"])], inits=[typed]), "15 float_data", "16")


def test_short_int4_data_is_refused_and_packed_int4_accepted():
    w = numpy_helper.from_array(np.zeros((4, 6), np.int64).astype(qnnx.dtypes.int_type("int4").numpy), "w")
    node = helper.make_node("Identity", ["w"], ["y"])
    ok = _model([node], inputs=(), inits=[w])
    check_model(ok)  # 24 values in 12 bytes
    w.raw_data = w.raw_data[:5]
    _refused(_model([node], inputs=(), inits=[w]), "tensor 'w' (INT4", "5 bytes", "12")


def _external_model(tmp_path, data: bytes | None):
    w = onnx.TensorProto(name="w", data_type=T.FLOAT, dims=[4, 4], data_location=T.EXTERNAL)
    e = w.external_data.add()
    e.key, e.value = "location", "w.bin"
    if data is not None:
        (tmp_path / "w.bin").write_bytes(data)
    path = tmp_path / "m.onnx"
    path.write_bytes(_model([helper.make_node("MatMul", ["x", "w"], ["y"])], inits=[w]).SerializeToString())
    return path


def test_missing_or_short_external_data_is_refused_on_load(tmp_path):
    with pytest.raises(QnnxError, match="external data file 'w.bin' of tensor 'w' is missing"):
        load_model(_external_model(tmp_path, None))
    with pytest.raises(QnnxError, match="40 bytes of external data"):
        load_model(_external_model(tmp_path, b"\0" * 40))


def test_external_data_present_loads_and_runs(tmp_path):
    path = _external_model(tmp_path, np.eye(4, dtype=np.float32).tobytes())
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    np.testing.assert_array_equal(qnnx.ReferenceEvaluator(path).run(None, {"x": x})[0], x)


def test_a_subgraph_sees_the_outer_scope_and_nothing_else():
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [_vi("t")])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e")])
    cond = numpy_helper.from_array(np.array(True), "c")
    m = _model([helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)], inits=[cond])
    check_model(m)
    m.graph.node[0].attribute[0].g.node[0].input[0] = "nowhere"
    _refused(m, "node 'if' (If) subgraph", "reads 'nowhere'")
