"""Which quantized convs/matmuls the runtime graph executes in int8 (execution_check.py): the matching of
model nodes to the plugin's layers, on runtime graphs written out (no OpenVINO needed)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from float_graphs import Graph

from qnnx.targets.openvino.execution_check import ExecutedLayer, in_int8_kernels


def _attention():
    """scores = q k^T -> Softmax -> context = p v, and a MatMul ``other`` read by a Relu and a Sigmoid."""
    g = Graph()
    q, k, v = g.input("q", [1, 4, 8]), g.input("k", [1, 8, 4]), g.input("v", [1, 4, 8])
    s = g.node("MatMul", [q, k], name="scores", out="scores_out")
    p = g.node("Softmax", [s], name="softmax", axis=-1, out="p_out")
    g.node("MatMul", [p, v], name="context", out="y")
    o = g.node("MatMul", [q, g.const(np.ones((8, 8), np.float32))], name="other", out="other_out")
    r = g.node("Relu", [o], name="relu", out="relu_out")
    g.node("Sigmoid", [r], name="sigmoid", out="z")
    return {n.name: n for n in ir.from_proto(g.model("y", "z")).graph}


def _kernel(*names):
    return ExecutedLayer(names[0], "Subgraph", "i8", ",".join(names))


def test_queries_times_keys_is_in_the_kernel_that_lists_only_the_matmul_after_the_softmax():
    nodes = _attention()
    # the converter renamed the first MatMul and the Softmax; the kernel keeps the second MatMul's name
    layers = [_kernel("y/DequantizeLinear", "MatMul_31104", "Softmax_31108", "context")]
    assert in_int8_kernels([nodes["scores"]], layers) == ["scores"]


def test_a_layer_listed_as_a_contraction_is_not_counted_again_in_a_kernel():
    nodes = _attention()
    layers = [ExecutedLayer("y_original", "MatMul", "u8", "y_original,y"), _kernel("p_out", "softmax")]
    assert in_int8_kernels([nodes["context"]], layers) == []  # its output y names its layer


def test_a_kernel_three_ops_downstream_does_not_claim_a_matmul():
    nodes = _attention()
    assert in_int8_kernels([nodes["other"]], [_kernel("sigmoid_int8", "z")]) == []
    assert in_int8_kernels([nodes["other"]], [_kernel("sigmoid_int8", "sigmoid")]) == ["other"]
    assert in_int8_kernels([nodes["other"]], [ExecutedLayer("sig", "Subgraph", "bf16", "sigmoid")]) == []
