"""depthwise_inputs="auto": per value, a depthwise conv input per channel only where its readers' rounding
noise drops to NOISE_RATIO of the per-tensor one or less (autoquant.depthwise_axes)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from float_graphs import Graph, conv_weight, qdq_of, qparams_of, samples

import qnnx
from qnnx import QuantConfig
from qnnx.autoquant.depthwise_axes import NOISE_RATIO, noise_ratio, reader_channel_norms
from qnnx.autoquant.plan import target_plan

CHANNELS = 6
SPREAD = np.array([40.0, 1.0, 0.05, 8.0, 0.5, 0.01], np.float32)  # channel ranges 4000x apart
EVEN = np.ones(CHANNELS, np.float32)


def _model(gains: np.ndarray, multiplier: int = 1):
    """x -> 1x1 conv (channels scaled by ``gains``) -> HardSwish ("m") -> depthwise 3x3 conv -> Relu -> 1x1 conv."""
    rng = np.random.default_rng(0)
    g = Graph()
    x = g.input("x", [1, 3, 8, 8])
    a = g.node("Conv", [x, g.const(conv_weight(rng, CHANNELS, 3, k=1) * gains.reshape(-1, 1, 1, 1), "w_pw")],
               name="pw")
    m = g.node("HardSwish", [a], name="hswish", out="m")
    d = g.node("Conv", [m, g.const(conv_weight(rng, CHANNELS * multiplier, 1), "w_dw")], name="dw",
               group=CHANNELS, pads=[1, 1, 1, 1])
    r = g.node("Relu", [d], name="relu")
    y = g.node("Conv", [r, g.const(conv_weight(rng, 4, CHANNELS * multiplier, k=1), "w_out")], name="out")
    g.node("Identity", [y], name="y", out="y")
    return g.model("y")


CALIBRATION = samples(16, shape=(1, 3, 8, 8))


def _quantized(gains, depthwise_inputs="auto", target="openvino", **options):
    return qnnx.quantize(_model(gains, **options), CALIBRATION,
                         QuantConfig(progress=False, target=target, depthwise_inputs=depthwise_inputs))


def test_channels_far_apart_go_per_channel():
    qm = _quantized(SPREAD)
    (choice,) = qm.report.record("depthwise_axes").choices
    assert choice.value == "m" and choice.channels == CHANNELS and choice.per_channel
    assert choice.noise_ratio < NOISE_RATIO
    assert qparams_of(qdq_of(qm.qdq, "m")[0])[0].size == CHANNELS
    assert "depthwise inputs: 1 of 1 per channel" in qm.report.summary()


def test_channels_alike_stay_per_tensor_and_give_the_per_tensor_model():
    qm = _quantized(EVEN)
    (choice,) = qm.report.record("depthwise_axes").choices
    assert not choice.per_channel and choice.noise_ratio > NOISE_RATIO
    assert "depthwise inputs: 0 of 1 per channel" in qm.report.summary()
    flat = _quantized(EVEN, "per_tensor")
    assert flat.report.record("depthwise_axes") is None
    assert ir.to_proto(qm.qdq).SerializeToString() == ir.to_proto(flat.qdq).SerializeToString()


def test_onnx_runtime_takes_auto_as_per_tensor():
    qm = _quantized(SPREAD, target="onnxruntime")
    assert qm.report.record("depthwise_axes") is None
    activations = [n for n in qm.qdq.graph if n.op_type == "QuantizeLinear" and n.inputs[0].const_value is None]
    assert activations and all(qparams_of(q)[0].size == 1 for q in activations)


def test_the_noise_ratio_weighs_each_channels_step_by_its_filters():
    norms = np.array([1.0, 3.0])
    assert noise_ratio(2.0, np.array([2.0, 2.0]), norms) == pytest.approx(1.0)
    # channel 1 carries 3/4 of the weight: halving its step removes 3/4 of 3/4 of the noise
    assert noise_ratio(2.0, np.array([2.0, 1.0]), norms) == pytest.approx((1 * 4 + 3 * 1) / (4 * 4))


@pytest.mark.parametrize("multiplier", [1, 2])
def test_reader_norms_sum_the_filters_of_each_input_channel(multiplier):
    model = ir.from_proto(_model(SPREAD, multiplier))
    m = next(n for n in model.graph if n.name == "hswish").outputs[0]
    w = next(n for n in model.graph if n.name == "dw").inputs[1].const_value.numpy().astype(np.float64)
    want = np.sum(w.reshape(CHANNELS, multiplier, -1) ** 2, axis=(1, 2))
    np.testing.assert_allclose(reader_channel_norms(m, CHANNELS), want)


def test_a_re_plan_keeps_a_value_chosen_per_tensor():
    model = _quantized(SPREAD).float_model  # prepared: shapes known
    config = QuantConfig(progress=False, target="openvino", depthwise_inputs="auto")
    assert {v.name for v in target_plan(model, config).per_channel_roots()} == {"m"}
    assert not target_plan(model, config, per_tensor=frozenset({"m"})).per_channel_roots()


def test_auto_is_a_depthwise_inputs_choice():
    assert QuantConfig(depthwise_inputs="auto").ranges.depthwise_inputs == "auto"
    assert QuantConfig(target="openvino", depthwise_inputs="auto", per_channel=False)  # per tensor then
