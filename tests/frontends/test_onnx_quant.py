"""import_onnx refuses ONNX quantization ops whose qparams it cannot import faithfully."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import qnnx
from qnnx.errors import QnnxError


def _qlinear_conv(x_scale=np.float32(0.1), x_zp=np.uint8(128), y_zp=np.uint8(10)):
    consts = [numpy_helper.from_array(np.asarray(x_scale), "sx"), numpy_helper.from_array(np.asarray(x_zp), "zx"),
              numpy_helper.from_array(np.ones((2, 1, 3, 3), np.int8), "w"),
              numpy_helper.from_array(np.array([0.01, 0.02], np.float32), "sw"),
              numpy_helper.from_array(np.zeros(2, np.int8), "zw"),
              numpy_helper.from_array(np.float32(0.05), "sy"), numpy_helper.from_array(np.asarray(y_zp), "zy")]
    node = helper.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"], ["y"], name="qc")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", T.UINT8, [1, 1, 5, 5])],
                          [helper.make_tensor_value_info("y", T.UINT8, [1, 2, 3, 3])], consts)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_a_float_zero_point_is_refused_not_truncated():
    with pytest.raises(QnnxError, match="node 'qc' \\(QLinearConv\\): zero point 'zx' must be an integer tensor"):
        qnnx.import_onnx(_qlinear_conv(x_zp=np.float32(128.5)))


def test_a_qlinear_output_wider_than_8_bits_is_refused():
    with pytest.raises(QnnxError, match="QLinearConv outputs int8 or uint8 .*got int32"):
        qnnx.import_onnx(_qlinear_conv(y_zp=np.int32(300)))


def test_per_axis_scales_that_cannot_multiply_are_refused():
    with pytest.raises(QnnxError, match="scales 'sx' \\(3,\\) and 'sw' \\(2,\\) do not multiply"):
        qnnx.import_onnx(_qlinear_conv(x_scale=np.full(3, 0.1, np.float32)))


def test_imported_qparams_are_checked_at_the_original_node():
    with pytest.raises(QnnxError, match="node 'qc' \\(QLinearConv\\): qnnx.requantize: output_scale must be positive"):
        m = _qlinear_conv()
        m.graph.initializer[5].CopyFrom(numpy_helper.from_array(np.float32(0), "sy"))
        qnnx.import_onnx(m)


def test_a_valid_model_imports(tmp_path):
    onnx.save(_qlinear_conv(), tmp_path / "m.onnx")
    assert sum(n.domain == "qnnx" for n in qnnx.import_onnx(tmp_path / "m.onnx").graph) == 2
