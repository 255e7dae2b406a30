"""Quantized conv/matmul groups ONNX Runtime would leave float (qnnx/autoquant/fusion_check.py)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from float_graphs import Graph, conv_weight, nodes_by_name, samples

import qnnx
from qnnx import QuantConfig
from qnnx.targets import target
from qnnx.targets.onnxruntime.fusion_check import quantized_groups, unfused


def _model():
    """x -> conv a (biased) -> relu -> conv b (biased) -> y."""
    rng = np.random.default_rng(0)
    g = Graph()
    x = g.input("x", [1, 3, 8, 8])
    a = g.node("Conv", [x, g.const(conv_weight(rng, 8, 3), "wa"), g.const(np.full(8, 0.1, np.float32), "ba")],
               name="a", pads=[1, 1, 1, 1])
    r = g.node("Relu", [a])
    g.node("Conv", [r, g.const(conv_weight(rng, 4, 8), "wb"), g.const(np.full(4, -0.2, np.float32), "bb")],
           name="b", pads=[1, 1, 1, 1], out="y")
    return g.model("y")


def _quantized(**options):
    return qnnx.quantize(_model(), samples(4), config=QuantConfig(progress=False, speed_fallback="off", **options))


def test_a_model_ort_fuses_has_nothing_unfused_and_no_warning():
    qm = _quantized()
    record = qm.report.record("onnxruntime")
    assert record.unfused == [] and record.fusable == 2
    assert "would run" not in qm.report.summary()


def test_a_bias_scale_off_x_scale_times_w_scale_leaves_the_conv_float_and_is_reported():
    qm = _quantized()
    scale = nodes_by_name(qm.qdq)["b"].inputs[2].producer().inputs[1]
    scale.const_value = ir.tensor(scale.const_value.numpy() * np.float32(1.05))
    assert unfused(qm.qdq) == (["b"], 2)
    qm.report.records["onnxruntime"] = target("onnxruntime").check(qm.qdq)  # the target stage, run again
    assert "WARNING: ONNX Runtime (CPU) would run 1 of 2 quantized conv/matmul group(s) in float" in qm.report.summary()


def test_the_last_conv_writing_a_graph_output_is_a_group_only_through_its_quantize():
    qm = _quantized()
    assert quantized_groups(qm.qdq.graph) == ["a", "b"]


def test_excluded_convs_are_not_groups():
    qm = _quantized(exclude_nodes=("b",))
    assert quantized_groups(qm.qdq.graph) == ["a"] and qm.report.record("onnxruntime").fusable == 1
