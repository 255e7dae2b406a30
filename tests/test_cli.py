"""The qnnx command: exit codes and one-line errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import qnnx
from qnnx.cli import main


def _qlinear_model() -> onnx.ModelProto:
    consts = [numpy_helper.from_array(np.float32(0.1), "sx"), numpy_helper.from_array(np.uint8(128), "zx"),
              numpy_helper.from_array(np.arange(-8, 10, dtype=np.int8).reshape(2, 1, 3, 3), "w"),
              numpy_helper.from_array(np.array([0.01, 0.02], np.float32), "sw"),
              numpy_helper.from_array(np.zeros(2, np.int8), "zw"),
              numpy_helper.from_array(np.float32(0.05), "sy"), numpy_helper.from_array(np.uint8(10), "zy")]
    node = helper.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"], ["y"], pads=[1, 1, 1, 1])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.UINT8, [1, 1, 5, 5])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.UINT8, [1, 2, 5, 5])], consts)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_lower_writes_a_plain_onnx_model_with_reference_results(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(_qlinear_model(), src)
    before = src.read_bytes()
    out = tmp_path / "m.lowered.onnx"
    assert main(["lower", str(src), "-o", str(out)]) == 0
    assert src.read_bytes() == before
    lowered = onnx.load(out)
    assert all(n.domain == "" for n in lowered.graph.node)
    x = np.random.default_rng(0).integers(0, 256, (1, 1, 5, 5)).astype(np.uint8)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, qnnx.ReferenceEvaluator(str(src)).run(None, {"x": x})[0])
    assert "wrote" in capsys.readouterr().out


def test_import_counts_qnnx_ops(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(_qlinear_model(), src)
    assert main(["import", str(src), "-o", str(tmp_path / "q.onnx")]) == 0
    assert "(2 qnnx ops)" in capsys.readouterr().out  # conv + requantize


@pytest.mark.parametrize("content,message", [(None, "file not found"), (b"not a model", "not a readable ONNX model"),
                                             ("truncated", "not a readable ONNX model")])
def test_bad_input_files_get_one_line_and_exit_1(tmp_path, capsys, content, message):
    src = tmp_path / "in.onnx"
    if content == "truncated":
        src.write_bytes(_qlinear_model().SerializeToString()[:40])
    elif content is not None:
        src.write_bytes(content)
    assert main(["lower", str(src), "-o", str(tmp_path / "o.onnx")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "in.onnx" in err
    assert not (tmp_path / "o.onnx").exists()


def test_output_equal_to_input_is_refused(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(_qlinear_model(), src)
    before = src.read_bytes()
    assert main(["lower", str(src), "-o", str(src)]) == 1
    assert "refusing to overwrite the input" in capsys.readouterr().err
    assert src.read_bytes() == before


def test_zero_scale_is_reported_with_the_node(tmp_path, capsys):
    m = _qlinear_model()
    m.graph.initializer[5].CopyFrom(numpy_helper.from_array(np.float32(0.0), "sy"))
    src = tmp_path / "m.onnx"
    onnx.save(m, src)
    assert main(["lower", str(src), "-o", str(tmp_path / "o.onnx")]) == 1
    err = capsys.readouterr().err
    assert "requantize" in err and "output_scale must be positive and finite" in err


def test_console_script_version_and_help():
    out = subprocess.run([sys.executable, "-m", "qnnx.cli", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"qnnx {qnnx.__version__}"
    helptext = subprocess.run([sys.executable, "-m", "qnnx.cli", "--help"], capture_output=True, text=True).stdout
    for cmd in ("import", "lower", "ops"):
        assert cmd in helptext
