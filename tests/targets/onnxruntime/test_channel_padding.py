"""Channel padding of quantized depthwise convs for ONNX Runtime's fast kernel
(qnnx/targets/onnxruntime/channel_padding.py, applied when the QDQ model is exported for the target).

Equal means bit-identical: the padded model's outputs on ONNX Runtime against the unpadded QDQ
model's, because the real channels compute the same integers (the new channels only ever meet zero
weights)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from float_graphs import Graph, conv_weight, run_ort, samples

import qnnx
from qnnx import QuantConfig
from qnnx.ir import Builder, load_model
from qnnx.targets import target
from qnnx.targets.onnxruntime.channel_padding import _pad_constant_input, pad_depthwise_channels


def _block(c: int = 24, *, se: bool = True, tail: str = "conv") -> onnx.ModelProto:
    """x[1,8,10,12] -> expand 1x1 (c) -> hard-swish spelled out -> depthwise 3x3 (group c) -> relu -> + 0.5
    [-> squeeze-excitation: gap -> 1x1 (c/4) -> relu -> 1x1 (c) -> hard-sigmoid -> mul]
    -> project 1x1 (8) -> y, the MobileNetV3 block. ``tail="output"`` makes the depthwise
    output the graph output, ``tail="reshape"`` puts a Reshape between it and the projection."""
    rng = np.random.default_rng(0)
    g = Graph()
    x = g.input("x", [1, 8, 10, 12])
    e = g.node("Conv", [x, g.const(conv_weight(rng, c, 8, k=1), "w_expand"),
                        g.const(rng.normal(0, .1, c).astype(np.float32), "b_expand")], name="expand")
    gate = g.node("Clip", [g.node("Add", [e, g.const(np.float32(3))]), g.const(np.float32(0)), g.const(np.float32(6))])
    hs = g.node("Div", [g.node("Mul", [e, gate]), g.const(np.float32(6))])
    dw = g.node("Conv", [hs, g.const(conv_weight(rng, c, 1, k=3), "w_dw"),
                         g.const(rng.normal(0, .1, c).astype(np.float32), "b_dw")],
                name="dw", group=c, pads=[1, 1, 1, 1])
    # + 0.5: the new channels carry a nonzero value from here on, which only zero weights may cancel
    a = g.node("Add", [g.node("Relu", [dw], name="dw_relu"), g.const(np.float32(0.5))])
    if tail == "output":
        return g.model(a)
    if se:
        s = g.node("GlobalAveragePool", [a])
        s = g.node("Relu", [g.node("Conv", [s, g.const(conv_weight(rng, c // 4, c, k=1), "w_se1")], name="se1")])
        s = g.node("HardSigmoid", [g.node("Conv", [s, g.const(conv_weight(rng, c, c // 4, k=1), "w_se2")],
                                          name="se2")])
        a = g.node("Mul", [a, s], name="se_mul")
    if tail == "reshape":
        a = g.node("Reshape", [a, g.const(np.array([1, c, 12, 10], np.int64))], name="reshape")
    g.node("Conv", [a, g.const(conv_weight(rng, 8, c, k=1), "w_project")], name="project", out="y")
    return g.model("y")


CALIB = samples(4, shape=(1, 8, 10, 12))
OFF = QuantConfig(speed_fallback="off", progress=False)


def _conv(model: ir.Model, name: str) -> ir.Node:
    return next(n for n in model.graph if n.name == name)


def for_onnx_runtime(qdq: ir.Model):
    """The model exported for ONNX Runtime and the padding records its check reports."""
    ort_target = target("onnxruntime")
    return ort_target.export(qdq), ort_target.check(qdq).padding


def _weight_shape(node: ir.Node) -> tuple:
    w = node.inputs[1]
    return tuple(w.producer().inputs[0].const_value.shape) if w.producer() is not None else tuple(w.const_value.shape)


def test_a_mobilenet_block_is_padded_to_16_channels_and_computes_the_same_bits():
    qm = qnnx.quantize(_block(24), CALIB, config=OFF)
    padded, records = for_onnx_runtime(qm.qdq)
    assert [(r.node, r.channels, r.padded) for r in records] == [("dw", 24, 32)]
    assert _conv(padded, "dw").attributes["group"].value == 32
    assert _weight_shape(_conv(padded, "dw")) == (32, 1, 3, 3)
    assert _weight_shape(_conv(padded, "expand")) == (32, 8, 1, 1)  # producer: new output rows
    assert _weight_shape(_conv(padded, "se1")) == (6, 32, 1, 1)  # the gate's branch: consumer and producer
    assert _weight_shape(_conv(padded, "se2")) == (32, 6, 1, 1)
    assert _weight_shape(_conv(padded, "project")) == (8, 32, 1, 1)  # consumer: new input columns
    assert _weight_shape(_conv(qm.qdq, "dw")) == (24, 1, 3, 3)  # the logical QDQ model is untouched
    for feed in samples(3, shape=(1, 8, 10, 12), seed=7):
        np.testing.assert_array_equal(run_ort(padded, {"x": feed})[0], run_ort(qm.qdq, {"x": feed})[0])


def test_the_written_qdq_model_is_padded_and_the_report_says_so(tmp_path):
    qm = qnnx.quantize(_block(24), CALIB, config=OFF)
    path = qm.save(tmp_path / "q.onnx")
    written = load_model(path)
    assert _conv(written, "dw").attributes["group"].value == 32
    assert "dw 24->32" in qm.report.summary()
    feed = {"x": CALIB[0]}
    np.testing.assert_array_equal(run_ort(written, feed)[0], run_ort(qm.qdq, feed)[0])


def test_the_canonical_model_keeps_the_true_channel_count(tmp_path):
    qm = qnnx.quantize(_block(24), CALIB, config=OFF)
    qm.save(tmp_path / "q.onnx")
    groups = [n.attributes["group"].value for n in qm.canonical.graph if "group" in n.attributes]
    assert 24 in groups and 32 not in groups


def test_a_multiple_of_16_is_left_as_it_is():
    qm = qnnx.quantize(_block(32), CALIB, config=OFF)
    padded, records = for_onnx_runtime(qm.qdq)
    assert records == []
    assert _conv(padded, "dw").attributes["group"].value == 32


@pytest.mark.parametrize("tail, reason", [("output", "graph input or output"), ("reshape", "Reshape is not channel-wise")])
def test_a_region_reaching_something_not_channel_wise_is_left_with_the_reason(tail, reason):
    qm = qnnx.quantize(_block(24, tail=tail), CALIB, config=OFF)
    padded, records = for_onnx_runtime(qm.qdq)
    assert len(records) == 1 and records[0].padded == 0 and reason in records[0].reason
    assert _conv(padded, "dw").attributes["group"].value == 24
    feed = {"x": CALIB[0]}
    np.testing.assert_array_equal(run_ort(padded, feed)[0], run_ort(qm.qdq, feed)[0])


def test_a_float_depthwise_conv_is_not_padded():
    qm = qnnx.quantize(_block(24), CALIB, config=QuantConfig(speed_fallback="off", progress=False,
                                                             exclude_nodes=("dw",)))
    _, records = for_onnx_runtime(qm.qdq)
    assert [r.reason for r in records] == ["weights are not quantized"]


def _conv_with_dequantized_weight(q: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> tuple[ir.Graph, ir.Node]:
    """A graph holding ``Conv(x, DequantizeLinear(q, scale, zp, axis=0))``."""
    graph = ir.Graph([], [], nodes=[], name="g")
    b = Builder(graph, "t")
    w = b.op("DequantizeLinear", [b.const(q, "q"), b.const(scale, "s"), b.const(zp, "z")], axis=0)
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, q.shape[1], 1, 1]))
    graph.inputs.append(x)
    node = ir.Node("", "Conv", [x, w], name="c")
    graph.extend([*b.nodes, node])
    return graph, node


def test_padding_a_quantized_constant_uses_each_rows_zero_point():
    """New input columns of a per-row asymmetric weight dequantize to exactly 0."""
    q = np.array([[10, 20], [30, 40], [50, 60]], np.uint8)
    zp = np.array([7, 8, 9], np.uint8)
    scale = np.array([0.5, 0.25, 2.0], np.float32)
    graph, node = _conv_with_dequantized_weight(q, scale, zp)
    _pad_constant_input(graph, node, 1, axis=1, extra=3)
    dq = node.inputs[1].producer()
    new_q = dq.inputs[0].const_value.numpy()
    np.testing.assert_array_equal(new_q[:, :2], q)
    np.testing.assert_array_equal(new_q[:, 2:], np.repeat(zp[:, None], 3, axis=1))
    np.testing.assert_array_equal(dq.inputs[1].const_value.numpy(), scale)


def test_padding_along_the_scale_axis_extends_scales_and_zero_points():
    graph, node = _conv_with_dequantized_weight(np.array([[1, 2], [3, 4]], np.int8),
                                                np.array([0.5, 0.25], np.float32), np.zeros(2, np.int8))
    _pad_constant_input(graph, node, 1, axis=0, extra=2)
    dq = node.inputs[1].producer()
    np.testing.assert_array_equal(dq.inputs[0].const_value.numpy(), [[1, 2], [3, 4], [0, 0], [0, 0]])
    assert dq.inputs[1].const_value.numpy().tolist() == [0.5, 0.25, 0.25, 0.25]
    assert dq.inputs[2].const_value.numpy().tolist() == [0, 0, 0, 0]
    assert dq.attributes["axis"].value == 0


def test_pad_depthwise_channels_on_a_model_without_depthwise_convs_changes_nothing():
    qm = qnnx.quantize(_block(24), CALIB, config=QuantConfig(speed_fallback="off", progress=False,
                                                             exclude_op_types=("Conv",)))
    before = [(n.op_type, n.name) for n in qm.qdq.graph]
    records = pad_depthwise_channels(qm.qdq.graph)
    assert [r.padded for r in records] == [0] and [(n.op_type, n.name) for n in qm.qdq.graph] == before


def test_the_written_model_is_byte_identical_run_to_run(tmp_path):
    paths = [qnnx.quantize(_block(24), CALIB, config=OFF).save(tmp_path / f"{i}.onnx") for i in range(3)]
    assert len({p.read_bytes() for p in paths}) == 1
