"""Round trip: qnnx.quantize -> QDQ file -> qnnx.from_qdq gives back the same canonical model."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import qnnx


def _float_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    b1 = (rng.standard_normal(8) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32)
    wm = (rng.standard_normal((8, 10)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "W2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c2"], ["s2"]), helper.make_node("Mul", ["c2", "s2"], ["silu"]),
             helper.make_node("Add", ["silu", "r1"], ["res"]),
             helper.make_node("MaxPool", ["res"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["mp"], ["gap"]), helper.make_node("Flatten", ["gap"], ["f"]),
             helper.make_node("MatMul", ["f", "Wm"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                          [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(b1, "B1"),
                           numpy_helper.from_array(w2, "W2"), numpy_helper.from_array(wm, "Wm")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.mark.parametrize("per_channel", [True, False])
def test_quantize_export_qdq_then_from_qdq_is_the_same_canonical_model(tmp_path, per_channel):
    rng = np.random.default_rng(1)
    samples = [rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(8)]
    qm = qnnx.quantize(_float_model(), samples, qnnx.QuantConfig(per_channel=per_channel, progress=False))
    qm.save(tmp_path / "q.onnx")  # the QDQ export
    back = qnnx.from_qdq(str(tmp_path / "q.onnx"), strict=True)  # strict: nothing may stay float
    direct = qnnx.ir.to_proto(qm.canonical)

    def ops(m):
        return collections.Counter((n.domain, n.op_type) for n in m.graph.node)

    assert ops(back) == ops(direct)
    assert ("qnnx", "conv") in ops(back) and ("", "Conv") not in ops(back)
    x = samples[0]
    a = qnnx.ReferenceEvaluator(back).run(None, {"x": x})[0]
    b = qnnx.ReferenceEvaluator(direct).run(None, {"x": x})[0]
    np.testing.assert_array_equal(a, b)  # bit-exact: the same integer program
