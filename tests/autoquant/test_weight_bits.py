"""weight_bits: 7-bit weights keep ONNX Runtime's u8 x s8 kernels exact on every CPU."""

from __future__ import annotations

import numpy as np
import pytest
from float_graphs import Graph, run_ort, run_ref

import qnnx
from qnnx import QnnxError, QuantConfig
from qnnx.targets.onnxruntime.kernels import u8s8_saturates


def _all_positive_conv():
    """x[1, 16, 4, 4] -> 1x1 conv with every weight 1 -> y: with x at its range's top, every product of
    the integer conv is 255 * w_max, the case ORT's 16-bit pair sums clip without VNNI."""
    g = Graph()
    g.node("Conv", [g.input("x", [1, 16, 4, 4]), g.const(np.ones((4, 16, 1, 1), np.float32), "w")], name="conv",
           out="y")
    return g.model("y")


def _calibration():
    rng = np.random.default_rng(3)
    return [rng.uniform(0, 1, (1, 16, 4, 4)).astype(np.float32) for _ in range(6)] + [np.ones((1, 16, 4, 4),
                                                                                              np.float32)]


def _weights(qm) -> np.ndarray:
    conv = next(n for n in qm.qdq.graph if n.op_type == "Conv")
    return conv.inputs[1].producer().inputs[0].const_value.numpy()


def test_weight_bits_is_checked_and_gives_the_weight_range():
    assert QuantConfig().weight_range == (-64, 64)
    assert QuantConfig(weight_bits=8).weight_range == (-128, 127)
    with pytest.raises(QnnxError, match="weight_bits"):
        QuantConfig(weight_bits=6)


@pytest.mark.parametrize("rounding", ["nearest", "gptq"])
def test_seven_bit_weights_stay_within_64(rounding):
    rng = np.random.default_rng(4)
    g = Graph()
    w = rng.normal(0, 0.3, (8, 16, 3, 3)).astype(np.float32)
    g.node("Conv", [g.input("x", [1, 16, 6, 6]), g.const(w, "w")], name="conv", pads=[1, 1, 1, 1], out="y")
    calib = [rng.normal(0, 1, (1, 16, 6, 6)).astype(np.float32) for _ in range(8)]
    q = _weights(qnnx.quantize(g.model("y"), calib, QuantConfig(progress=False, weight_bits=7,
                                                                 weight_rounding=rounding)))
    assert q.dtype == np.int8 and -64 <= q.min() and q.max() <= 64
    assert np.abs(q).max(axis=(1, 2, 3)).min() >= 63  # every channel uses the 7-bit grid's full width
    full = _weights(qnnx.quantize(g.model("y"), calib, QuantConfig(progress=False, weight_bits=8,
                                                                    weight_rounding=rounding)))
    assert np.abs(full).max() >= 127


def test_seven_bit_weights_run_exactly_on_onnx_runtime():
    model, x = _all_positive_conv(), {"x": np.ones((1, 16, 4, 4), np.float32)}
    qm = qnnx.quantize(model, _calibration(), QuantConfig(progress=False, weight_bits=7))
    assert np.abs(_weights(qm)).max() == 64
    out_dq = qm.qdq.graph.outputs[0].producer()
    step = float(out_dq.inputs[1].const_value.numpy())
    # ORT's fused integer conv against the canonical model on the reference evaluator: the same integers,
    # up to ORT's float requantization (1 step)
    fused, exact = run_ort(qm.qdq, x)[0], run_ref(qm.canonical, x)[0]
    assert np.abs(fused - exact).max() <= step * 1.001
    np.testing.assert_allclose(fused, run_ort(model, x)[0], rtol=0.02)


@pytest.mark.skipif(not u8s8_saturates(), reason="ORT's u8 x s8 kernels accumulate in 32 bits on this CPU")
def test_eight_bit_weights_clip_in_onnx_runtime_where_the_probe_says_so():
    # the counterpart of the test above on a CPU without VNNI: why 7 bits exist
    model, x = _all_positive_conv(), {"x": np.ones((1, 16, 4, 4), np.float32)}
    qm = qnnx.quantize(model, _calibration(), QuantConfig(progress=False, weight_bits=8, accuracy_guard=False))
    fused, exact = run_ort(qm.qdq, x)[0], run_ref(qm.canonical, x)[0]
    assert np.abs(fused - exact).max() > 0.2 * np.abs(exact).max()
