"""Tiny float models for the calibration-data tests (onnx.helper, opset 17): only their inputs matter,
and a few are quantized end to end. A plain module, not a conftest (see tests/float_graphs.py)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def _model(nodes, inputs, inits=()) -> onnx.ModelProto:
    """A checked model whose graph output ``y`` gets its type from shape inference."""
    g = helper.make_graph(nodes, "data_test", [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(
        np.dtype(dtype)), list(shape)) for name, shape, dtype in inputs], [helper.make_empty_tensor_value_info("y")],
        [numpy_helper.from_array(np.asarray(a), name) for name, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    m.graph.output[0].CopyFrom(onnx.shape_inference.infer_shapes(m).graph.output[0])
    onnx.checker.check_model(m)
    return m


def conv_sigmoid(rng, dims=(1, 3, 4, 4)) -> onnx.ModelProto:
    """x -> Conv "conv" (2 filters, 3x3, pads 1) -> Sigmoid "sig" -> y."""
    w = (rng.standard_normal((2, dims[1], 3, 3)) * 0.3).astype(np.float32)
    return _model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                   helper.make_node("Sigmoid", ["c"], ["y"], name="sig")], [("x", dims, np.float32)], [("w", w)])


def add_tanh() -> onnx.ModelProto:
    """a [1, 4] + b [N, 4] -> Add "add" -> Tanh "tanh" -> y: two inputs, one with a dynamic dim."""
    return _model([helper.make_node("Add", ["a", "b"], ["s"], name="add"),
                   helper.make_node("Tanh", ["s"], ["y"], name="tanh")],
                  [("a", (1, 4), np.float32), ("b", ("N", 4), np.float32)])


def add(shape) -> onnx.ModelProto:
    """a + b -> y, both of ``shape``."""
    return _model([helper.make_node("Add", ["a", "b"], ["y"], name="add")],
                  [("a", shape, np.float32), ("b", shape, np.float32)])


def embedding(rng, ids_dtype=np.int64, ids_shape=(1, "S"), rows=10) -> onnx.ModelProto:
    """int token ids -> embedding rows (Gather "embed") -> Tanh "tanh" -> y: the input is an index, not a float."""
    table = rng.standard_normal((rows, 4)).astype(np.float32)
    return _model([helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
                   helper.make_node("Tanh", ["e"], ["y"], name="tanh")], [("ids", ids_shape, ids_dtype)],
                  [("table", table)])
