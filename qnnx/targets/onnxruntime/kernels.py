"""What ONNX Runtime's integer kernels compute on this CPU.

On x86 without VNNI, MLAS multiplies uint8 activations by int8 weights with an instruction that adds
pairs of products into saturating 16-bit sums (vpmaddubsw): 255 * 127 + 255 * 127 = 64770 does not
fit, so a sum of large products is clipped, and an integer conv or matmul of a u8 x s8 model computes
something else than its QDQ graph means. VNNI (and ARM) kernels accumulate in 32 bits. A one-node
probe tells which this process has.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import onnx
from onnx import TensorProto, helper

from qnnx import runtime


@cache
def u8s8_saturates() -> bool:
    """Whether ORT's u8 x s8 MatMulInteger clips 255 * 127 * 4 (its 16-bit pair sums saturate)."""
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 4]),
         helper.make_tensor_value_info("b", TensorProto.INT8, [4, 1])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    sess = runtime.session(onnx.ModelProto.FromString(model.SerializeToString()))
    y = sess.run(None, {"a": np.full((1, 4), 255, np.uint8), "b": np.full((4, 1), 127, np.int8)})[0]
    return int(y.reshape(())) != 4 * 255 * 127
