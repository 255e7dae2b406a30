"""save_model: atomic, the user's umask, and a clear error for a path it cannot write."""

from __future__ import annotations

import os
import stat

import numpy as np
import onnx
import pytest
from onnx import helper

from qnnx.errors import QnnxError
from qnnx.ir import load_model, save_model
from qnnx.ir.io import umask


def _model():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    return load_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_saved_files_follow_the_umask(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        path = save_model(_model(), tmp_path / "m.onnx")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # no temporary file left


def test_umask_reads_without_changing_it():
    old = os.umask(0o027)
    try:
        assert umask() == 0o027 and umask() == 0o027
    finally:
        os.umask(old)


def test_an_unwritable_path_is_a_qnnx_error_and_leaves_nothing(tmp_path):
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(QnnxError, match="cannot write the model"):
        save_model(_model(), tmp_path / "file" / "m.onnx")
    with pytest.raises(QnnxError, match="/sys/qnnx-test.onnx: cannot write the model"):
        save_model(_model(), "/sys/qnnx-test.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_replaced_file_is_whole(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"old")
    save_model(_model(), path)
    assert onnx.load(path).graph.node[0].op_type == "Relu"
    np.testing.assert_equal(len(list(tmp_path.iterdir())), 1)


def test_external_data_is_read_on_load_so_a_session_from_memory_finds_it(tmp_path):
    """ONNX Runtime sessions take the model serialized in memory, where w.bin no longer resolves."""
    from qnnx import runtime

    w = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[2, 2], data_location=onnx.TensorProto.EXTERNAL)
    entry = w.external_data.add()
    entry.key, entry.value = "location", "w.bin"
    (tmp_path / "w.bin").write_bytes(np.array([[1, 2], [3, 4]], np.float32).tobytes())
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2])], [w])
    (tmp_path / "m.onnx").write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    m = load_model(tmp_path / "m.onnx")
    y = runtime.session(m).run(None, {"x": np.array([[1, 1]], np.float32)})[0]
    np.testing.assert_array_equal(y, [[4, 6]])
