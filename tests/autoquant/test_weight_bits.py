"""weight_bits and the targets' weight grids: 7-bit weights keep ONNX Runtime's u8 x s8 kernels exact on every
CPU; pair-limited 8-bit weights (OpenVINO's MatMul/Gemm) keep each pair of adjacent input channels within what
its kernels sum exactly."""

from __future__ import annotations

import numpy as np
import pytest
from float_graphs import Graph, run_ort, run_ref

import qnnx
from qnnx import QnnxError, QuantConfig, numerics
from qnnx.targets import weight_grid
from qnnx.targets.execution import WeightGrid
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


def test_weight_bits_picks_the_grid():
    assert QuantConfig().weight_bits == 7
    assert weight_grid("onnxruntime", 7) == WeightGrid(7) and WeightGrid(7).range("Conv") == (-64, 64)
    assert weight_grid("openvino", 8) == WeightGrid(8) and WeightGrid(8).range("MatMul") == (-128, 127)
    pairs = weight_grid("openvino", "pairs")
    assert pairs.range("Conv") == (-64, 64) and pairs.range("MatMul") == (-128, 127) and not pairs.pairs("Conv")
    assert QuantConfig(weight_bits="pairs", target="openvino").weight_bits == "pairs"
    with pytest.raises(QnnxError, match="weight_bits"):
        QuantConfig(weight_bits=6)
    with pytest.raises(QnnxError, match="onnxruntime's kernels pair products was not checked"):
        QuantConfig(weight_bits="pairs")  # ONNX Runtime's pair order is its packing's, not known to be channels
    with pytest.raises(ValueError):
        WeightGrid(7, int16_pairs=("Conv",))  # conv weights are re-rounded within a box range


def _contractions():
    """Every contraction kind whose weights the pair limit applies to, with large correlated weights (a
    few loud input channels, so pairs of large same-sign weights exist) and its weights' input-channel axis."""
    rng = np.random.default_rng(8)

    def loud(shape, axis):
        w = rng.normal(0, 0.2, shape).astype(np.float32)
        idx = [slice(None)] * len(shape)
        idx[axis] = slice(0, 4)
        w[tuple(idx)] = np.abs(w[tuple(idx)]) + 1.0  # channels 0-3 large and positive: pairs (0, 1), (2, 3)
        return w

    cases = []
    g = Graph()
    g.node("Conv", [g.input("x", [1, 8, 6, 6]), g.const(loud((6, 8, 3, 3), 1), "w")], name="conv", pads=[1, 1, 1, 1],
           out="y")
    cases.append(("conv", g.model("y"), (1, 8, 6, 6), 1))
    g = Graph()
    g.node("Conv", [g.input("x", [1, 8, 6, 6]), g.const(loud((6, 4, 3, 3), 1), "w")], name="conv", group=2,
           pads=[1, 1, 1, 1], out="y")
    cases.append(("grouped conv", g.model("y"), (1, 8, 6, 6), 1))
    g = Graph()
    g.node("MatMul", [g.input("x", [2, 8]), g.const(loud((8, 5), 0), "w")], name="mm", out="y")
    cases.append(("matmul", g.model("y"), (2, 8), 0))
    g = Graph()
    g.node("Gemm", [g.input("x", [2, 8]), g.const(loud((5, 8), 1), "w")], name="gemm", transB=1, out="y")
    cases.append(("gemm transB", g.model("y"), (2, 8), 1))
    return cases


def _weights_of(qm) -> np.ndarray:
    node = next(n for n in qm.qdq.graph if n.op_type in ("Conv", "MatMul", "Gemm"))
    return node.inputs[1].producer().inputs[0].const_value.numpy()


def test_pairs_limit_matmul_and_gemm_weights_and_keep_conv_weights_7_bit():
    for kind, model, shape, axis in _contractions():
        rng = np.random.default_rng(9)
        calib = [rng.normal(0, 1, shape).astype(np.float32) for _ in range(8)]
        for rounding in ("nearest", "gptq"):
            qm = qnnx.quantize(model, calib, QuantConfig(progress=False, target="openvino", weight_bits="pairs",
                                                         weight_rounding=rounding))
            q = _weights_of(qm)
            assert numerics.same_sign_pair_sums(q, axis).max() <= numerics.U8S8_PAIR_LIMIT, kind
            widest = np.abs(q.astype(int)).max()
            assert widest <= 64 if "conv" in kind else widest > 64, kind  # finer than 7 bits where paired
            record = qm.report.record("openvino")
            assert record is None or not record.saturating, kind
        if "conv" in kind:
            continue
        # full int8 weights have pairs beyond the limit: the pair grid is what keeps them in
        full = _weights_of(qnnx.quantize(model, calib, QuantConfig(progress=False, target="openvino", weight_bits=8)))
        assert numerics.same_sign_pair_sums(full, axis).max() > numerics.U8S8_PAIR_LIMIT, kind


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
