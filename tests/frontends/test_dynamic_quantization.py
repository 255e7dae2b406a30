"""Dynamically quantized models (ONNX Runtime's quantize_dynamic: DynamicQuantizeLinear + ConvInteger /
MatMulInteger): from_qdq says what they are, and lower says why it cannot take them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import qnnx
from qnnx import QnnxError
from qnnx.frontends.fq2i import convert


@pytest.fixture
def dynamic_model(tmp_path):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Flatten", ["r"], ["f"]), helper.make_node("MatMul", ["f", "m"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
         numpy_helper.from_array(rng.standard_normal((256, 10)).astype(np.float32), "m")])
    src, out = tmp_path / "float.onnx", tmp_path / "dynamic.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), src)
    quantize_dynamic(str(src), str(out), weight_type=QuantType.QUInt8, op_types_to_quantize=["Conv", "MatMul"])
    return out


def test_from_qdq_reports_the_imported_integer_ops_and_the_dynamic_quantizers(dynamic_model):
    canonical, report = convert(dynamic_model)
    assert report.imported == {"ConvInteger": 1, "DynamicQuantizeLinear": 2, "MatMulInteger": 1}
    assert report.dynamic == {"DynamicQuantizeLinear": 2}
    text = report.summary()
    assert "integer ops imported as they are: ConvInteger x1, DynamicQuantizeLinear x2, MatMulInteger x1" in text
    assert "dynamically quantized (DynamicQuantizeLinear x2): activation qparams are computed at run time" in text
    assert {("qnnx", "conv"), ("qnnx", "matmul")} <= {(n.domain, n.op_type) for n in canonical.graph}


def test_lower_refuses_run_time_qparams_with_the_reason_on_both_paths(dynamic_model):
    for model in (dynamic_model, qnnx.from_qdq(str(dynamic_model))):
        with pytest.raises(QnnxError, match=r"x_zero_point must be a constant to lower this op \(it is computed at run time\)"):
            qnnx.lower(qnnx.import_onnx(model))
