"""Which elementwise function reads an activation (qnnx.autoquant.consumers), and the calibration
judging that activation's range by the function's error."""

from __future__ import annotations

import re

import numpy as np
import onnx_ir as ir
import pytest
from float_graphs import Graph, conv_weight, qdq_of, qparams_of

import qnnx
from qnnx import QuantConfig
from qnnx.autoquant.consumers import RECOGNIZERS, consumer_function, reader_weight_norms, silu_output
from qnnx.ir import load_model

RNG = np.random.default_rng(17)


def _value(model, name: str):
    m = load_model(model)
    return next(v for n in m.graph for v in n.outputs if v.name == name)


def _silu(g: Graph, x: str, swap: bool = False) -> str:
    s = g.node("Sigmoid", [x], name="sig")
    return g.node("Mul", [s, x] if swap else [x, s], name="mul", out="y")


@pytest.mark.parametrize("swap", [False, True])
def test_silu_is_recognized_in_either_operand_order(swap):
    g = Graph()
    x = g.node("Relu", [g.input("a", [1, 4])], name="pre", out="x")
    _silu(g, x, swap)
    assert consumer_function(_value(g.model("y"), "x")) == "silu"


def test_silu_whose_sigmoid_has_another_reader_is_not_silu():
    g = Graph()
    x = g.node("Relu", [g.input("a", [1, 4])], name="pre", out="x")
    s = g.node("Sigmoid", [x], name="sig")
    y = g.node("Mul", [x, s], name="mul")
    g.node("Add", [y, s], name="other", out="z")  # the sigmoid's output has a second reader
    model = g.model("z")
    assert consumer_function(_value(model, "x")) == "identity"


def test_sigmoid_alone_and_a_second_reader():
    g = Graph()
    x = g.node("Relu", [g.input("a", [1, 4])], name="pre", out="x")
    g.node("Sigmoid", [x], name="sig", out="y")
    assert consumer_function(_value(g.model("y"), "x")) == "sigmoid"
    g.node("Neg", [x], name="neg", out="z")
    assert consumer_function(_value(g.model("y", "z"), "x")) == "identity"


def test_a_graph_output_is_judged_as_itself():
    g = Graph()
    x = g.node("Relu", [g.input("a", [1, 4])], name="pre", out="x")
    g.node("Sigmoid", [x], name="sig", out="y")
    assert consumer_function(_value(g.model("y", "x"), "x")) == "identity"


def _spelled_hardswish(g: Graph, x: str, shift: float = 3.0, hi: float = 6.0, divide_last: bool = False) -> str:
    a = g.node("Add", [x, g.const(np.float32(shift))], name="add3")
    c = g.node("Clip", [a, g.const(np.float32(0)), g.const(np.float32(hi))], name="relu6")
    if divide_last:  # Paddle's order: x * relu6(x + 3), then / 6
        m = g.node("Mul", [x, c], name="mul")
        return g.node("Div", [m, g.const(np.float32(6))], name="div", out="y")
    d = g.node("Div", [c, g.const(np.float32(6))], name="div")
    return g.node("Mul", [d, x], name="mul", out="y")


@pytest.mark.parametrize("divide_last", [False, True])
def test_spelled_out_hardswish_is_recognized(divide_last):
    g = Graph()
    x = g.node("Relu", [g.input("a", [1, 4])], name="pre", out="x")
    _spelled_hardswish(g, x, divide_last=divide_last)
    assert consumer_function(_value(g.model("y"), "x")) == "hardswish"


@pytest.mark.parametrize("shift, hi", [(2.0, 6.0), (3.0, 5.0)])
def test_other_shift_or_clip_is_not_hardswish(shift, hi):
    g = Graph()
    x = g.node("Relu", [g.input("a", [1, 4])], name="pre", out="x")
    _spelled_hardswish(g, x, shift=shift, hi=hi)
    assert consumer_function(_value(g.model("y"), "x")) == "identity"


def test_hardswish_op_is_recognized():
    g = Graph(opset=14)
    x = g.node("Relu", [g.input("a", [1, 4])], name="pre", out="x")
    g.node("HardSwish", [x], name="hs", out="y")
    assert consumer_function(_value(g.model("y"), "x")) == "hardswish"


def test_a_node_reading_the_value_twice_is_not_a_match():
    g = Graph()
    x = g.node("Relu", [g.input("a", [1, 4])], name="pre", out="x")
    g.node("Mul", [x, x], name="sq", out="y")
    assert consumer_function(_value(g.model("y"), "x")) == "identity"


def _conv_silu_model(second_reader: bool):
    """Conv whose output channel 1 sits far below 0 (bias -40), then SiLU: plain MSE must cover -45,
    MSE through SiLU may drop the negative tail that SiLU maps to ~0."""
    g = Graph()
    x = g.input("x", [1, 2, 8, 8])
    w = conv_weight(RNG, 2, 2)
    c = g.node("Conv", [x, g.const(w), g.const(np.float32([0, -40]))], name="conv", out="c", pads=[1, 1, 1, 1])
    y = _silu(g, c)
    if second_reader:
        g.node("Neg", [c], name="neg", out="z")
        return g.model(y, "z")
    return g.model(y)


def test_a_conv_read_by_silu_gets_a_range_judged_through_silu():
    calib = [RNG.standard_normal((1, 2, 8, 8)).astype(np.float32) for _ in range(8)]
    cfg = QuantConfig(progress=False, speed_fallback="off")
    lows = {}
    for second in (False, True):
        q = qnnx.quantize(_conv_silu_model(second), calib, cfg).qdq
        scale, zp = qparams_of(qdq_of(q, "c")[0])
        lows[second] = -float(zp) * float(scale)  # the lowest representable value of the conv output
    assert lows[True] < -38  # another reader: the far negative channel is covered
    assert -10 < lows[False] < -2  # read by SiLU alone: clipped where SiLU is flat, ~5x the resolution
    # consumer_functions=(): every activation judged by its own error again
    q = qnnx.quantize(_conv_silu_model(False), calib, QuantConfig(progress=False, speed_fallback="off",
                                                                  consumer_functions=())).qdq
    scale, zp = qparams_of(qdq_of(q, "c")[0])
    assert -float(zp) * float(scale) < -38


@pytest.mark.parametrize("value, message", [("silu", "must be a sequence of names"),
                                            (("silu", "gelu"), "unknown consumer function(s) 'gelu'")])
def test_consumer_functions_option_is_validated(value, message):
    with pytest.raises(qnnx.QnnxError, match=re.escape(message)):
        QuantConfig(consumer_functions=value)


def test_channel_balance_defaults_to_off_and_is_validated():
    # (off is 0 now, not None)
    assert QuantConfig().ranges.channel_balance == 0.0
    assert QuantConfig(method="percentile").ranges.channel_balance == 0.0
    assert QuantConfig(method="entropy", channel_balance=0.25).ranges.channel_balance == 0.25
    with pytest.raises(qnnx.QnnxError, match="channel_balance needs a histogram method"):
        QuantConfig(method="minmax", channel_balance=0.5)
    with pytest.raises(qnnx.QnnxError, match=re.escape("channel_balance must be in [0, 1], got 2")):
        QuantConfig(channel_balance=2)


def _loud_channel_conv(rng) -> Graph:
    """x[1,4,8,8] -> conv -> "c", whose output channel 1 of 8 is 60x louder than the rest."""
    g = Graph()
    x = g.input("x", [1, 4, 8, 8])
    w = conv_weight(rng, 8, 4, std=0.1)
    w[1] *= 60
    g.node("Conv", [x, g.const(w)], name="conv", out="c", pads=[1, 1, 1, 1])
    return g


def test_channel_balance_narrows_a_conv_output_range_set_by_one_loud_channel():
    """Conv output channel 1 of 8 is 60x louder than the rest (read by a Neg: no consumer function)."""
    rng = np.random.default_rng(3)
    g = _loud_channel_conv(rng)
    g.node("Neg", ["c"], name="neg", out="y")
    model = g.model("y")
    calib = [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(8)]
    widths = {}
    for balance in (0.0, 0.5):
        q = qnnx.quantize(model, calib, QuantConfig(progress=False, speed_fallback="off",
                                                    channel_balance=balance)).qdq
        widths[balance] = float(qparams_of(qdq_of(q, "c")[0])[0])
    assert widths[0.5] < 0.9 * widths[0.0]


def _readers_model(kind: str):
    """x -> conv "a" (6 channels) -> value "v" read by: "pw" (a 1x1 conv to 3), "dw" (a depthwise conv),
    "both", or "neg" (a Neg: not a conv)."""
    rng = np.random.default_rng(5)
    g = Graph()
    x = g.input("x", [1, 2, 6, 6])
    g.node("Conv", [x, g.const(conv_weight(rng, 6, 2, k=1))], name="a", out="v")
    outs = []
    if kind in ("pw", "both"):
        w = np.zeros((3, 6, 1, 1), np.float32)
        w[:, 0] = 2.0  # channel 0: sum of squares 12
        w[0, 1] = 1.0  # channel 1: 1; channels 2-5: 0
        outs.append(g.node("Conv", ["v", g.const(w)], name="pw"))
    if kind in ("dw", "both"):
        w = np.ones((6, 1, 3, 3), np.float32)  # every channel: 9
        outs.append(g.node("Conv", ["v", g.const(w)], name="dw", group=6, pads=[1, 1, 1, 1]))
    if kind == "neg":
        outs.append(g.node("Neg", ["v"]))
    return ir.from_proto(g.model(*outs))


@pytest.mark.parametrize("kind, want", [("pw", [12, 1, 0, 0, 0, 0]), ("dw", [9] * 6),
                                        ("both", [21, 10, 9, 9, 9, 9]), ("neg", None)])
def test_reader_weight_norms_sum_squared_weights_per_input_channel(kind, want):
    model = _readers_model(kind)
    v = next(o for n in model.graph for o in n.outputs if o.name == "v")
    got = reader_weight_norms(v)
    if want is None:
        assert got is None
    else:
        want = np.asarray(want, np.float64)
        np.testing.assert_allclose(got, want / want.mean())


def test_consumer_weighting_lets_a_channel_no_weight_reads_go_unrepresented():
    """Conv output channel 1 of 8 is 60x louder than the rest, and the next conv gives it tiny weights:
    with consumer weighting its range follows the channels that matter."""
    rng = np.random.default_rng(3)
    g = _loud_channel_conv(rng)
    w2 = conv_weight(rng, 4, 8, k=1)
    w2[:, 1] *= 0.01
    g.node("Conv", ["c", g.const(w2)], name="next", out="y")
    model = g.model("y")
    calib = [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(8)]
    widths = {}
    for on in (False, True):
        q = qnnx.quantize(model, calib, QuantConfig(progress=False, speed_fallback="off", consumer_weighting=on)).qdq
        widths[on] = float(qparams_of(qdq_of(q, "c")[0])[0])
    assert widths[True] < 0.5 * widths[False]


def test_consumer_weighting_is_validated():
    with pytest.raises(qnnx.QnnxError, match="consumer_weighting must be True or False"):
        QuantConfig(consumer_weighting="yes")


# --------------------------------------------------------------------------- SiLU outputs


def _silu_graph():
    g = Graph()
    a = g.input("a", [1, 4, 8, 8])
    x = g.node("Relu", [a], name="pre", out="x")
    y = _silu(g, x)
    g.node("MaxPool", [y], name="pool", out="p", kernel_shape=[2, 2])
    g.node("Concat", [y, y], name="cat", out="cat", axis=1)
    g.node("Concat", [y, x], name="mixed", out="mixed", axis=1)
    s = g.node("Sigmoid", [a], name="other_sig")
    g.node("Mul", [x, s], name="gated", out="gated")  # x times the sigmoid of another value: not SiLU
    g.node("Tile", [y, g.const(np.array([1, 2, 1, 1], np.int64))], name="tile", out="tiled")
    scales = g.const(np.array([1, 1, 2, 2], np.float32))
    for mode in ("nearest", "linear", "cubic"):
        g.node("Resize", [y, "", scales], name=mode, out=mode, mode=mode)
    g.node("AveragePool", [y], name="avg", out="avg", kernel_shape=[2, 2])
    return g.model("p", "cat", "mixed", "gated", "tiled", "nearest", "linear", "cubic", "avg")


# the ops keeping their values' range (qnnx.ops.keeps_range): selecting (MaxPool, Concat, Tile, nearest
# Resize) or interpolating between neighbours (linear Resize); not cubic Resize (it overshoots) nor averages
@pytest.mark.parametrize("name, want", [("y", True), ("p", True), ("cat", True), ("mixed", False),
                                        ("gated", False), ("x", False), ("tiled", True), ("nearest", True),
                                        ("linear", True), ("cubic", False), ("avg", False)])
def test_silu_output_follows_selecting_ops_only(name, want):
    assert silu_output(_value(_silu_graph(), name)) is want


def _conv_silu_outliers(rng):
    """conv -> SiLU whose output has a few values near 100 (channel 0 at a handful of positions) and a
    dense negative lobe: the plain mse range's step is wider than the lobe and clips it to 0."""
    g = Graph()
    x = g.input("x", [1, 2, 8, 8])
    c = g.node("Conv", [x, g.const(conv_weight(rng, 4, 2, k=1, std=1.0))], name="conv", out="c")
    y = _silu(g, c)
    g.node("Conv", [y, g.const(conv_weight(rng, 2, 4, k=1))], name="reader", out="z")
    calib = []
    for _ in range(8):
        a = rng.standard_normal((1, 2, 8, 8)).astype(np.float32)
        a[0, :, rng.integers(0, 8), rng.integers(0, 8)] = 80.0  # a rare loud pixel
        calib.append(a)
    return g.model("z"), calib


def test_silu_lobe_keeps_the_negative_side_of_a_silu_output():
    model, calib = _conv_silu_outliers(np.random.default_rng(5))
    lows = {}
    for lobe in (0.0, 0.01):
        cfg = QuantConfig(progress=False, speed_fallback="off", bias_correction="off", silu_lobe=lobe)
        scale, zp = qparams_of(qdq_of(qnnx.quantize(model, calib, cfg).qdq, "y")[0])
        lows[lobe] = -float(zp) * float(scale)
    assert lows[0.0] == 0.0  # plain mse: SiLU's lobe (down to -0.278) clipped to 0
    assert lows[0.01] < -0.2  # kept: the lowest level reaches the lobe


@pytest.mark.parametrize("value", [-0.1, 1, "0.01"])
def test_silu_lobe_is_validated(value):
    with pytest.raises(qnnx.QnnxError, match=re.escape("silu_lobe must be in [0, 1)")):
        QuantConfig(silu_lobe=value)


def test_every_recognizer_names_a_consumer_function_of_the_observers():
    from qnnx.calibrate.observers import CONSUMER_FUNCTIONS
    from qnnx.ops import facts

    assert set(RECOGNIZERS) <= set(CONSUMER_FUNCTIONS) - {"identity"}
    # an op's own function is its row in the op table, not a second definition
    assert CONSUMER_FUNCTIONS["sigmoid"] is facts("Sigmoid").function.value_and_slope
    assert CONSUMER_FUNCTIONS["hardswish"] is facts("HardSwish").function.value_and_slope
