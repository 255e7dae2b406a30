"""Per-channel depthwise conv inputs (``depthwise_inputs="per_channel"``, OpenVINO): the plan, the observers,
the int32 biases, the simulated model of each calibrator, the canonical form and the runtimes' sessions."""

from __future__ import annotations

import numpy as np
import pytest
from float_graphs import Graph, conv_weight, qdq_of, qparams_of, run_ort, samples

import qnnx
from qnnx import QuantConfig
from qnnx.passes.lower import lower

CHANNELS = 6
GAINS = np.array([40.0, 1.0, 0.05, 8.0, 0.5, 0.01], np.float32)  # channel ranges 4000x apart


def _model(multiplier: int = 1, pointwise_reader: bool = False):
    """x -> 1x1 conv (its channels scaled by GAINS) -> HardSwish ("m") -> depthwise 3x3 conv (bias) -> Relu ->
    1x1 conv -> y;
    ``pointwise_reader``: a 1x1 conv reads "m" too (added to y)."""
    rng = np.random.default_rng(0)
    g = Graph()
    x = g.input("x", [1, 3, 8, 8])
    w_pw = conv_weight(rng, CHANNELS, 3, k=1) * GAINS.reshape(-1, 1, 1, 1)
    a = g.node("Conv", [x, g.const(w_pw, "w_pw")], name="pw")
    m = g.node("HardSwish", [a], name="hswish", out="m")
    c_out = CHANNELS * multiplier
    d = g.node("Conv", [m, g.const(conv_weight(rng, c_out, 1), "w_dw"),
                        g.const(rng.normal(0, 0.5, c_out).astype(np.float32), "b_dw")],
               name="dw", group=CHANNELS, pads=[1, 1, 1, 1])
    r = g.node("Relu", [d], name="relu")
    y = g.node("Conv", [r, g.const(conv_weight(rng, 4, c_out, k=1), "w_out")], name="out")
    if pointwise_reader:
        p = g.node("Conv", [m, g.const(conv_weight(rng, 4, CHANNELS, k=1), "w_side")], name="side")
        y = g.node("Add", [y, p], name="sum")
    g.node("Identity", [y], name="y", out="y")
    return g.model("y")


CALIBRATION = samples(16, shape=(1, 3, 8, 8))


def _quantized(depthwise_inputs="per_channel", calibrator="float", **options):
    return qnnx.quantize(options.pop("model", None) or _model(), CALIBRATION,
                         QuantConfig(progress=False, target="openvino", depthwise_inputs=depthwise_inputs,
                                     calibrator=calibrator, **options))


def _float_ranges(model):
    """Per-channel min and max of "m" (0 included) over the calibration samples."""
    from qnnx.runtime import run, session

    sess = session(model, outputs=["m"])
    ms = np.concatenate([run(sess, ["m"], {"x": x})[0] for x in CALIBRATION])
    return np.minimum(ms.min(axis=(0, 2, 3)), 0), np.maximum(ms.max(axis=(0, 2, 3)), 0)


def test_a_depthwise_input_gets_one_min_max_range_per_channel():
    qm = _quantized()  # whatever the method: each channel's own min and max
    q, dq = qdq_of(qm.qdq, "m")
    assert q.attributes["axis"].value == 1 and dq.attributes["axis"].value == 1
    scale, zp = qparams_of(q)
    lo, hi = _float_ranges(qm.float_model)
    np.testing.assert_allclose(scale, (hi - lo) / 255, rtol=1e-5)
    np.testing.assert_array_equal(zp, np.clip(np.round(-lo / scale), 0, 255).astype(np.uint8))
    per_tensor = qparams_of(qdq_of(_quantized("per_tensor").qdq, "m")[0])[0]
    assert per_tensor.size == 1 and scale.min() < per_tensor / 1000  # the quiet channels keep their levels


def test_a_value_read_by_another_conv_too_keeps_one_range():
    qm = _quantized(model=_model(pointwise_reader=True))
    scale, _ = qparams_of(qdq_of(qm.qdq, "m")[0])
    assert scale.size == 1


@pytest.mark.parametrize("multiplier", [1, 2])
def test_the_int32_bias_scale_is_the_input_channels_scale_times_the_weights(multiplier):
    qm = _quantized(model=_model(multiplier))
    x_scale, _ = qparams_of(qdq_of(qm.qdq, "m")[0])
    dw = next(n for n in qm.qdq.graph if n.name == "dw")
    w_scale = dw.inputs[1].producer().inputs[1].const_value.numpy()
    bias_scale = dw.inputs[2].producer().inputs[1].const_value.numpy()
    np.testing.assert_array_equal(bias_scale, (np.repeat(x_scale, multiplier) * w_scale).astype(np.float32))


@pytest.mark.parametrize("multiplier", [1, 2])
def test_the_canonical_form_converts_the_depthwise_conv_and_computes_the_qdq_models_numbers(multiplier):
    qm = _quantized(model=_model(multiplier))
    assert "dw" not in {name for name, *_ in qm.report.left_in_float}
    assert any(n.op_type == "conv" and n.inputs[2].const_value.numpy().size == CHANNELS for n in qm.canonical.graph)
    lowered = lower(qm.canonical)
    for x in samples(3, shape=(1, 3, 8, 8), seed=5):
        want = run_ort(qm.qdq, {"x": x}, optimize=False)[0]
        got = run_ort(lowered, {"x": x}, optimize=False)[0]
        np.testing.assert_allclose(got, want, atol=1e-5 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("calibrator", ["sequential", "propagate_error"])
def test_the_simulated_calibrators_give_per_channel_ranges(calibrator):
    qm = _quantized(calibrator=calibrator, model=_model(2))
    scale, _ = qparams_of(qdq_of(qm.qdq, "m")[0])
    lo, hi = _float_ranges(qm.float_model)
    assert scale.shape == (CHANNELS,)
    # "m" is made by float ops from the quantized input x: close to the float model's ranges
    np.testing.assert_allclose(scale, (hi - lo) / 255, rtol=0.2)


def test_the_outputs_are_checked_against_float():
    qm = _quantized()
    assert qm.report.outputs and qm.report.outputs[0].cosine > 0.99


def test_per_channel_inputs_need_a_target_that_takes_them_and_per_channel_weights():
    with pytest.raises(qnnx.QnnxError, match="openvino"):
        QuantConfig(depthwise_inputs="per_channel")
    with pytest.raises(qnnx.QnnxError, match="per-channel weights"):
        QuantConfig(target="openvino", depthwise_inputs="per_channel", per_channel=False)
    with pytest.raises(qnnx.QnnxError, match="depthwise_inputs"):
        QuantConfig(target="openvino", depthwise_inputs="per_axis")


def test_an_onnx_runtime_session_runs_a_per_channel_quantize_after_a_conv():
    # ORT's level-2 fusion would make "pw -> Q(per channel)" a QLinearConv that fails on every run.
    g = Graph()
    x = g.input("x", [1, 3, 8, 8])
    a = g.node("Conv", [x, g.const(conv_weight(np.random.default_rng(1), CHANNELS, 3, k=1), "w")], name="pw")
    d = g.node("Conv", [a, g.const(conv_weight(np.random.default_rng(2), CHANNELS, 1), "w_dw")], name="dw",
               group=CHANNELS, pads=[1, 1, 1, 1])
    g.node("Identity", [d], name="y", out="y")
    qm = qnnx.quantize(g.model("y"), CALIBRATION, QuantConfig(progress=False, target="openvino",
                                                             depthwise_inputs="per_channel"))
    assert qparams_of(qdq_of(qm.qdq, a)[0])[0].size == CHANNELS
    from qnnx.runtime import per_axis_activation_quantizers, run, session

    import onnx_ir as ir
    assert per_axis_activation_quantizers(ir.to_proto(qm.qdq))
    x0 = CALIBRATION[0]
    np.testing.assert_allclose(run(session(qm.qdq), None, {"x": x0})[0], run_ort(qm.qdq, {"x": x0}, optimize=False)[0],
                               rtol=1e-5, atol=1e-5)
    assert qm.report.outputs  # the agreement stage ran the model


@pytest.mark.openvino
def test_openvino_runs_the_depthwise_conv_in_int8_with_per_channel_inputs():
    pytest.importorskip("openvino")
    qm = _quantized(model=_model(2))
    record = qm.report.record("openvino")
    assert record.unchecked == "" and record.int8 == record.quantized == 3
    from qnnx.targets import target

    x = CALIBRATION[:3]
    got = target("openvino").outputs(qm.qdq, [{"x": xi} for xi in x])
    for xi, out in zip(x, got):
        want = run_ort(qm.qdq, {"x": xi}, optimize=False)[0]
        assert np.abs(out["y"] - want).max() <= 0.02 * np.abs(want).max()
