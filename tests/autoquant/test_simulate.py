"""The simulated model (qnnx.autoquant.simulate) and the calibrations that run it.

What equal means here: fed the qparams a calibration chose, the lowered simulated model gives
the QDQ model's outputs bit for bit on ONNX Runtime without graph optimizations (same float ops
on the same dequantized values: simulated_quantize lowers to the exact quantize steps, and
requantizing a scaled value to ``s * c`` recovers the same integers realize reinterprets).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from float_graphs import Graph, conv_weight, main_model, run_ort, samples

import qnnx
from qnnx import QuantConfig, numerics
from qnnx.autoquant.calibration import calibrate_float, calibrate_sequential
from qnnx.autoquant.plan import activation_qparams, concat_inputs_take_output_qparams, plan, zero_point_zero
from qnnx.autoquant.prepare import prepare
from qnnx.autoquant.qdq import realize_qdq
from qnnx.autoquant.simulate import qparam_feed, simulate_model
from qnnx.calibrate import quant_range
from qnnx.data import CalibrationData, input_specs

RNG = np.random.default_rng(11)
CFG = QuantConfig(progress=False)


def _conv(relu: bool, bias: bool = True):
    g = Graph()
    x = g.input("x", [1, 3, 6, 6])
    ins = [x, g.const(conv_weight(RNG, 4, 3), "w")] + ([g.const(RNG.normal(0, .2, 4).astype(np.float32), "b")]
                                                       if bias else [])
    c = g.node("Conv", ins, name="conv", pads=[1, 1, 1, 1], out="c")
    if relu:
        g.node("Relu", [c], name="relu", out="y")
        return g.model("y"), (1, 3, 6, 6)
    return g.model("c"), (1, 3, 6, 6)


def _matmul():
    g = Graph()
    m = g.node("MatMul", [g.input("x", [2, 6]), g.const(RNG.normal(0, .3, (6, 4)).astype(np.float32), "w")],
               name="mm", out="m")
    g.node("Add", [m, g.const(RNG.normal(0, .1, 4).astype(np.float32), "b")], name="add", out="y")
    return g.model("y"), (2, 6)


def _gemm():
    g = Graph()
    g.node("Gemm", [g.input("x", [2, 6]), g.const(RNG.normal(0, .3, (4, 6)).astype(np.float32), "w"),
                    g.const(RNG.normal(0, .1, 4).astype(np.float32), "b")], name="gemm", transB=1, out="y")
    return g.model("y"), (2, 6)


def _unary(op: str, **attrs):
    def build():
        g = Graph()
        x = g.input("x", [1, 3, 4, 4])
        r = g.node("Relu", [g.node("Conv", [x, g.const(conv_weight(RNG, 3, 3, k=1), "w")], name="conv")], name="r")
        g.node(op, [r] + attrs.pop("extra", []), name="op", out="y", **attrs)
        return g.model("y"), (1, 3, 4, 4)
    return build


def _binary():
    g = Graph()
    x = g.input("x", [1, 3, 4, 4])
    c = g.node("Conv", [x, g.const(conv_weight(RNG, 3, 3, k=1), "w")], name="conv", out="c")
    g.node("Add", [c, x], name="add", out="y")
    return g.model("y"), (1, 3, 4, 4)


def _scale():
    g = Graph()
    x = g.input("x", [1, 3, 4, 4])
    c = g.node("Conv", [x, g.const(conv_weight(RNG, 3, 3, k=1), "w")], name="conv", out="c")
    d = g.node("Div", [c, g.const(np.float32(6.0), "six")], name="div", out="d")
    g.node("Conv", [d, g.const(conv_weight(RNG, 2, 3, k=1), "w2")], name="conv2", out="y")
    return g.model("y"), (1, 3, 4, 4)


def _concat():
    g = Graph()
    x = g.input("x", [1, 3, 4, 4])
    c = g.node("Conv", [x, g.const(conv_weight(RNG, 3, 3, k=1), "w")], name="conv", out="c")
    g.node("Concat", [c, x], name="cat", axis=1, out="y")
    return g.model("y"), (1, 3, 4, 4)


def _softmax():
    g = Graph()
    m = g.node("MatMul", [g.input("x", [2, 6]), g.const(RNG.normal(0, .5, (6, 5)).astype(np.float32), "w")],
               name="mm", out="m")
    g.node("Softmax", [m], name="sm", axis=-1, out="y")
    return g.model("y"), (2, 6)


CASES = {
    "conv": lambda: _conv(False), "conv_no_bias": lambda: _conv(False, bias=False), "conv_relu": lambda: _conv(True),
    "matmul": _matmul, "gemm": _gemm, "binary": _binary, "scale": _scale, "pool": _unary("GlobalAveragePool"),
    "avg_pool": _unary("AveragePool", kernel_shape=[2, 2]), "concat": _concat, "elementwise": _unary("Sigmoid"),
    "elementwise_hardswish": _unary("HardSwish"), "softmax": _softmax, "main": lambda: (main_model(), (1, 3, 8, 8)),
}


def _chosen(float_model, the_plan, data, config=CFG):
    """The activation qparams quantize() realizes (calibration, then Concat inputs take the output's)."""
    roots = calibrate_float(float_model, the_plan, _bound(data, float_model), config).qparams
    return concat_inputs_take_output_qparams(the_plan, activation_qparams(the_plan, roots, config))


def _bound(source, float_model):
    return CalibrationData.from_source(source).bind(input_specs(float_model))


@pytest.mark.parametrize("standard", [False, True], ids=["dialect", "standard"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_simulated_model_fed_the_chosen_qparams_gives_the_qdq_outputs_bit_for_bit(case, standard):
    proto, shape = CASES[case]()
    fm = prepare(proto)
    the_plan = plan(fm, CFG)
    assert the_plan.matches
    act = _chosen(fm, the_plan, samples(6, shape))
    qdq = realize_qdq(fm, the_plan, act, CFG)
    sim, inputs = simulate_model(fm, the_plan, CFG, standard=standard)
    assert set(inputs) == set(act)
    if not standard:
        assert {n.op_type for n in sim.graph if n.domain == "qnnx"} == {"simulated_quantize", "simulated_dequantize"}
    lowered = qnnx.lower(sim)
    for x in samples(4, shape, seed=5, scale=1.5):  # beyond the calibrated ranges too: clipping agrees
        want = run_ort(qdq, {"x": x}, optimize=False)
        got = run_ort(lowered, {"x": x, **qparam_feed(inputs, act)}, optimize=False)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("standard", [False, True], ids=["dialect", "standard"])
def test_weights_of_a_layer_whose_bias_does_not_fit_are_rescaled_at_run_time_like_realize(standard):
    g = Graph()
    w = conv_weight(RNG, 4, 3)
    w[1] *= 1e-6  # a near-dead channel with a large bias: realize raises its weight scale
    g.node("Conv", [g.input("x", [1, 3, 6, 6]), g.const(w, "w"), g.const(np.array([0.1, 40.0, -.2, .3], np.float32))],
           name="conv", pads=[1, 1, 1, 1], out="y")
    fm = prepare(g.model("y"))
    the_plan = plan(fm, CFG)
    act = _chosen(fm, the_plan, samples(4, (1, 3, 6, 6)))
    act["x"] = qnnx.calibrate.QParams(np.float32(1e-7), np.uint8(128), "uint8")  # 40 / (1e-7 * w_scale) > 2**30
    qdq = realize_qdq(fm, the_plan, act, CFG)
    sim, inputs = simulate_model(fm, the_plan, CFG, standard=standard)
    lowered = qnnx.lower(sim)
    x = samples(1, (1, 3, 6, 6))[0] * 1e-5
    np.testing.assert_array_equal(run_ort(lowered, {"x": x, **qparam_feed(inputs, act)}, optimize=False)[0],
                                  run_ort(qdq, {"x": x}, optimize=False)[0])


@pytest.mark.parametrize("standard", [False, True], ids=["dialect", "standard"])
@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
def test_pair_limited_weights_at_the_bound_simulate_like_realize(op, standard):
    # every pair of input channels at the channel's largest pair sum, split into two half steps (j + 1/2 and
    # 127.5 - j steps): ties at the bound, where a float rounding of the scale tips a pair over it
    config = QuantConfig(progress=False, target="openvino", weight_bits="pairs")
    k = 16
    column = np.float32(0.37) * (1 + np.arange(8, dtype=np.float32))  # each output channel's pair sum
    j = np.arange(40, 40 + k // 2, dtype=np.float32)[:, None]
    w = np.empty((k, 8), np.float32)  # (K, N)
    w[0::2], w[1::2] = (j + 0.5) * column / 128, (127.5 - j) * column / 128
    g = Graph()
    b = g.const(RNG.normal(0, .1, 8).astype(np.float32), "b")
    if op == "MatMul":
        m = g.node("MatMul", [g.input("x", [2, k]), g.const(w, "w")], name="mm", out="m")
        g.node("Add", [m, b], name="add", out="y")
    else:
        g.node("Gemm", [g.input("x", [2, k]), g.const(w.T.copy(), "w"), b], name="gemm", transB=1, out="y")
    fm = prepare(g.model("y"))
    the_plan = plan(fm, config)
    act = _chosen(fm, the_plan, samples(6, (2, k)), config)
    qdq = realize_qdq(fm, the_plan, act, config)
    q = next(n for n in qdq.graph if n.op_type in ("MatMul", "Gemm")).inputs[1].producer().inputs[0].const_value.numpy()
    assert numerics.same_sign_pair_sums(q, 0 if op == "MatMul" else 1).max() <= numerics.U8S8_PAIR_LIMIT
    sim, inputs = simulate_model(fm, the_plan, config, standard=standard)
    lowered = qnnx.lower(sim)
    for x in samples(3, (2, k), seed=7):
        np.testing.assert_array_equal(run_ort(lowered, {"x": x, **qparam_feed(inputs, act)}, optimize=False)[0],
                                      run_ort(qdq, {"x": x}, optimize=False)[0])


def _session(model):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(ir.to_proto(model).SerializeToString(), so, providers=["CPUExecutionProvider"])


def test_disabled_values_pass_through_in_float():
    g = Graph()
    x = g.input("x", [1, 3, 4, 4])
    m = g.node("Mul", [x, g.node("Sigmoid", [x], name="sig")], name="mul")  # no weights: all float when disabled
    g.node("GlobalAveragePool", [m], name="gap", out="y")
    fm = prepare(g.model("y"))
    the_plan = plan(fm, CFG)
    act = _chosen(fm, the_plan, samples(4, (1, 3, 4, 4)))
    sim, inputs = simulate_model(fm, the_plan, CFG)
    sess = _session(qnnx.lower(sim))
    x = samples(1, (1, 3, 4, 4), seed=9)[0]
    np.testing.assert_array_equal(sess.run(None, {"x": x, **qparam_feed(inputs, act, enabled=set())})[0],
                                  run_ort(fm, {"x": x}, optimize=False)[0])
    assert not np.array_equal(sess.run(None, {"x": x, **qparam_feed(inputs, act)})[0],
                              run_ort(fm, {"x": x}, optimize=False)[0])


def test_qparams_are_inputs_one_session_gives_other_outputs():
    fm = prepare(main_model())
    the_plan = plan(fm, CFG)
    act = _chosen(fm, the_plan, samples(6))
    sim, inputs = simulate_model(fm, the_plan, CFG)
    sess = _session(qnnx.lower(sim))
    x = samples(1, seed=9)[0]
    coarse = {k: qnnx.calibrate.QParams(np.float32(qp.scale * 4), qp.zero_point, qp.dtype) for k, qp in act.items()}
    fine = sess.run(None, {"x": x, **qparam_feed(inputs, act)})[0]
    rough = sess.run(None, {"x": x, **qparam_feed(inputs, coarse)})[0]
    assert not np.array_equal(fine, rough)
    ref = run_ort(fm, {"x": x}, optimize=False)[0].astype(np.float64)
    assert np.sum((fine - ref) ** 2) < np.sum((rough - ref) ** 2)  # 4x coarser steps: more error


def test_a_graph_output_keeps_its_name_and_its_float_value_is_observed():
    fm = prepare(main_model())
    sim, inputs = simulate_model(fm, plan(fm, CFG), CFG)
    assert [o.name for o in sim.graph.outputs] == ["y"]
    assert inputs["y"].observed == "y_float" and inputs["x"].observed == "x"


# --------------------------------------------------------------------------- sequential calibration


class _Counted:
    """A re-iterable calibration source that counts the passes reading it (an iterator made and left
    unread, as CalibrationData.from_source does to tell a one-shot iterator, is not a pass)."""

    def __init__(self, data):
        self.data, self.passes = data, 0

    def __iter__(self):
        for i, sample in enumerate(self.data):
            self.passes += i == 0
            yield sample


def _deep_model():
    """Four conv+relu layers: each range depends on the quantization of the layers before."""
    g = Graph()
    v = g.input("x", [1, 4, 6, 6])
    for i in range(4):
        v = g.node("Relu", [g.node("Conv", [v, g.const(conv_weight(RNG, 4, 4, std=0.4), f"w{i}"),
                                            g.const(RNG.normal(0, .1, 4).astype(np.float32), f"b{i}")],
                                   name=f"conv{i}", pads=[1, 1, 1, 1])], name=f"relu{i}", out=f"r{i}")
    return g.model(v)


@pytest.mark.parametrize("passes", [1, 3, 8])
def test_sequential_calibration_streams_a_bounded_number_of_passes_and_gives_valid_qparams(passes):
    fm = prepare(_deep_model())
    the_plan = plan(fm, CFG)
    config = QuantConfig(progress=False, method="minmax", calibrator="sequential", sequential_passes=passes)
    data = _Counted(samples(8, (1, 4, 6, 6)))
    result = calibrate_sequential(fm, the_plan, _bound(data, fm), config)
    roots, stages = result.qparams, min(passes, len(set(the_plan.groups.values())))
    # one pass per stage, and one more in which CalibrationData counts the samples of a re-iterable
    # source (without loading them; it remembers the count)
    assert result.samples == 8 and result.passes == stages and data.passes == stages + 1
    assert set(roots) == set(the_plan.groups.values())
    lo, hi = quant_range("uint8")
    for qp in roots.values():
        assert np.all(np.asarray(qp.scale) > 0) and lo <= int(qp.zero_point) <= hi
    floating = calibrate_float(fm, the_plan, _bound(samples(8, (1, 4, 6, 6)), fm), config).qparams
    by_name = {r.name: r for r in roots}
    # The input is observed before anything is quantized: the same range as float calibration.
    assert roots[by_name["x"]] == floating[by_name["x"]]
    for r in roots:  # downstream ranges move by the propagated rounding error only: a few percent, not more
        width = lambda qp: float(qp.scale) * (hi - lo)  # noqa: E731
        assert width(roots[r]) == pytest.approx(width(floating[r]), rel=0.05), r.name
    # Weights are int8 from the first stage on, and later stages see the quantized activations too.
    assert any(roots[r] != floating[r] for r in roots)


def test_quantize_with_sequential_calibration_runs_and_stays_close_to_float():
    data = samples(8)
    float_out = run_ort(main_model(), {"x": data[0]})[0]
    qm = qnnx.quantize(main_model(), data, QuantConfig(progress=False, calibrator="sequential"))
    out = run_ort(qm.qdq, {"x": data[0]})[0]
    cos = float(np.dot(out.ravel(), float_out.ravel()) / np.linalg.norm(out) / np.linalg.norm(float_out))
    assert cos > 0.99


def test_sequential_calibration_config_is_validated():
    # (sequential and propagate_error are values of the one ``calibrator`` option: they cannot be combined)
    with pytest.raises(qnnx.QnnxError, match="calibrator must be one of .*got 'topological'"):
        QuantConfig(calibrator="topological")
    with pytest.raises(qnnx.QnnxError, match="sequential_passes"):
        QuantConfig(calibrator="sequential", sequential_passes=0)


def test_sequential_calibration_reads_a_one_shot_iterator_through_the_kept_samples():
    # (it used to be refused: CalibrationData keeps what a one-shot iterator gave, so every pass reads it)
    config = QuantConfig(progress=False, calibrator="sequential")
    once = qnnx.quantize(main_model(), iter(samples(4)), config)
    listed = qnnx.quantize(main_model(), samples(4), config)
    assert once.report.num_samples == 4
    assert ir.to_proto(once.qdq).SerializeToString() == ir.to_proto(listed.qdq).SerializeToString()


@pytest.mark.parametrize("standard", [False, True], ids=["dialect", "standard"])
def test_int8_symmetric_qparams_in_a_uint8_pair_give_the_qdq_outputs_bit_for_bit(standard):
    """Zero-point-0 targets (plan.zero_point_zero) get int8 qparams after calibration while the simulated
    pairs are uint8: fed shifted by 128, they round and clip on the same grid."""
    proto, shape = _binary()
    fm = prepare(proto)
    the_plan = plan(fm, CFG)
    act = {k: zero_point_zero(v) for k, v in _chosen(fm, the_plan, samples(6, shape)).items()}
    assert any(qp.dtype == "int8" for qp in act.values())
    qdq = realize_qdq(fm, the_plan, act, CFG)
    sim, inputs = simulate_model(fm, the_plan, CFG, standard=standard)
    lowered = qnnx.lower(sim)
    for x in samples(4, shape, seed=5, scale=1.5):
        want = run_ort(qdq, {"x": x}, optimize=False)
        got = run_ort(lowered, {"x": x, **qparam_feed(inputs, act)}, optimize=False)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g, w)
