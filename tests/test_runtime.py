"""qnnx.runtime.session: the one way qnnx builds ONNX Runtime sessions."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from qnnx import QnnxError, runtime


def _model() -> ir.Model:
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    return ir.from_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9))


def test_extra_outputs_are_returned_and_the_model_is_not_modified():
    m = _model()
    s = runtime.session(m, outputs=["r", "y"], optimize=False, threads=1)
    assert [o.name for o in s.get_outputs()] == ["y", "r"]
    y, r = s.run(None, {"x": np.array([-1, 0, 2], np.float32)})
    np.testing.assert_array_equal(r, [0, 0, 2])
    assert [v.name for v in m.graph.outputs] == ["y"]


def test_a_file_and_extra_outputs_do_not_mix(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(ir.to_proto(_model()), path)
    assert runtime.session(path).run(None, {"x": np.ones(3, np.float32)})[0].tolist() == [-1, -1, -1]
    with pytest.raises(TypeError):
        runtime.session(path, outputs=["r"])


def test_a_model_ort_refuses_is_one_located_line():
    m = _model()
    next(iter(m.graph)).domain = "nowhere"
    with pytest.raises(QnnxError) as e:
        runtime.session(m, purpose=" to calibrate it", where="m.onnx")
    msg = str(e.value)
    assert msg.startswith("m.onnx: ONNX Runtime cannot load the model to calibrate it: ") and "\n" not in msg


def test_optimized_to_writes_the_graph_ort_runs(tmp_path):
    path = tmp_path / "optimized.onnx"
    runtime.session(_model(), optimized_to=str(path))
    ops = [n.op_type for n in onnx.load(path).graph.node]
    assert ops and set(ops) <= {"Relu", "Neg"}  # level 2 keeps the graph's own nodes here


def test_a_run_that_fails_is_one_line():
    s = runtime.session(_model())
    with pytest.raises(QnnxError) as e:
        runtime.run(s, ["y"], {"x": np.ones(4, np.float32)})  # the model takes 3 values
    msg = str(e.value)
    assert msg.startswith("ONNX Runtime failed on a sample: ") and "\n" not in msg
    assert runtime.run(s, ["y"], {"x": np.ones(3, np.float32)})[0].tolist() == [-1, -1, -1]
