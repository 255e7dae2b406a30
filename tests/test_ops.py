"""The table of op facts (``qnnx.ops``): the facts the stages rely on, and each checked against what
the op computes where it can be (ONNX's reference implementation, ``onnx.reference``, on small
random inputs): a value-permuting op's output is its input's multiset, a selecting op's values are
its input's, a channel-wise op leaves the other channels alone, an elementwise function's numpy
definition is ONNX's op within float32 rounding, its float64 slope the finite difference, and a
bounded function stays in its range.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from float_graphs import Graph
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from qnnx import ops

RNG = np.random.default_rng(0)


def run(op_type: str, inputs: list[np.ndarray], outputs: int = 1, opset: int = 21, **attrs) -> list[np.ndarray]:
    """``op_type`` on ``inputs`` (all graph inputs) by ONNX's reference implementation."""
    names = [f"i{k}" for k in range(len(inputs))]
    outs = [f"o{k}" for k in range(outputs)]
    node = helper.make_node(op_type, names, outs, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in zip(names, inputs)],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))


def image(shape=(1, 8, 4, 4)) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def i64(*v) -> np.ndarray:
    return np.array(v, np.int64)


# How to run each data-handling op on a (1, 8, 4, 4) image: (the other inputs, attributes, outputs).
CALLS = {
    "Reshape": ([i64(1, 8, 16)], {}, 1),
    "Flatten": ([], {"axis": 1}, 1),
    "Squeeze": ([i64(0)], {}, 1),
    "Unsqueeze": ([i64(0)], {}, 1),
    "Transpose": ([], {"perm": [0, 2, 3, 1]}, 1),
    "DepthToSpace": ([], {"blocksize": 2}, 1),
    "SpaceToDepth": ([], {"blocksize": 2}, 1),
    "Identity": ([], {}, 1),
    "Slice": ([i64(1), i64(3), i64(1)], {}, 1),
    "Split": ([i64(3, 5)], {"axis": 1}, 2),
    "Gather": ([i64(0, 2, 2, 7)], {"axis": 1}, 1),
    "Expand": ([i64(2, 8, 4, 4)], {}, 1),
    "Tile": ([i64(1, 2, 1, 3)], {}, 1),
    "MaxPool": ([], {"kernel_shape": [2, 2]}, 1),
    "GlobalMaxPool": ([], {}, 1),
    "Resize": ([np.array([], np.float32), np.array([1, 1, 2, 2], np.float32)], {"mode": "nearest"}, 1),
    "Concat": ([image()], {"axis": 1}, 1),
    "AveragePool": ([], {"kernel_shape": [2, 2]}, 1),
    "GlobalAveragePool": ([], {}, 1),
    "Relu": ([], {}, 1),
    "Clip": ([np.float32(-0.5), np.float32(0.5)], {}, 1),
    "Cast": ([], {"to": TensorProto.DOUBLE}, 1),
    "Max": ([np.float32(0.1)], {}, 1),
    "Min": ([np.float32(0.1)], {}, 1),
    "Add": ([np.float32(0.5)], {}, 1),
    "Sub": ([np.float32(0.5)], {}, 1),
    "Mul": ([np.float32(3.0)], {}, 1),
    "Div": ([np.float32(3.0)], {}, 1),
    "Pow": ([np.float32(2.0)], {}, 1),
    "QuantizeLinear": ([np.float32(0.02), np.uint8(128)], {}, 1),
    "DequantizeLinear": ([np.float32(0.02), np.uint8(128)], {}, 1),
}


CALLS.update({op: ([], {}, 1) for op in (*ops.op_types(lambda f: f.function is not None), "Sqrt", "Log",
                                          "Reciprocal")})


def outputs_of(op_type: str, x: np.ndarray) -> list[np.ndarray]:
    rest, attrs, n = CALLS[op_type]
    if op_type == "DequantizeLinear":
        x = np.clip(x * 20 + 128, 0, 255).astype(np.uint8)
    if op_type in ("Sqrt", "Log", "Reciprocal"):
        x = np.abs(x) + 0.1
    return run(op_type, [x, *rest], outputs=n, **attrs)


def ops_with(fact) -> list[str]:
    return list(ops.op_types(fact))


# --------------------------------------------------------------------------- the facts the stages rely on


def test_value_permuting_ops():
    assert set(ops_with(lambda f: f.permutes_values)) == {
        "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "DepthToSpace", "SpaceToDepth", "Identity"}


def test_data_moving_ops_are_fake_quantization_to_integer_identity_rules():
    assert set(ops_with(lambda f: f.moves_data)) == set(ops_with(lambda f: f.permutes_values)) | {
        "Slice", "Split", "Gather", "Expand", "Tile"}


def test_ops_sharing_qparams():
    assert set(ops_with(lambda f: f.shares_qparams is True)) == set(ops_with(lambda f: f.moves_data)) | {"MaxPool"}
    assert ops.shares_qparams("Resize")  # nearest is the default mode
    assert not ops.shares_qparams(_node("Resize", mode="linear"))
    assert not ops.shares_qparams("Concat")  # its pattern shares them: the share walk follows input 0 only


def test_quiet_ops():
    """Planning's "no quantization pattern" line is left out for these: data movement, clamps, shapes,
    constants, and what follows its input's type once integer."""
    assert set(ops_with(lambda f: f.quiet)) == set(ops_with(lambda f: f.shares_qparams is True)) | {
        "Shape", "Size", "Constant", "ConstantOfShape", "Range", "Cast", "Relu", "Clip", "Resize", "Pad"}


def test_the_facts_nest():
    """Each data fact implies the next: a permutation moves data, moved data shares qparams, shared
    qparams select values, selected values keep the range."""
    order = ("permutes_values", "moves_data", "shares_qparams", "selects", "keeps_range")
    for row in ops.OPS.values():
        for narrow, wide in zip(order, order[1:]):
            if getattr(row, narrow) is True:
                assert getattr(row, wide) is True, (row.op_type, narrow, wide)
        if row.shares_qparams:
            assert row.quiet, row.op_type
        if not row.computes or row.clamps:
            assert row.quiet, row.op_type
        if row.function is not None or row.elementwise:
            assert row.channelwise, row.op_type


def test_small_facts():
    assert set(ops_with(lambda f: f.clamps)) == {"Relu", "Clip"}
    assert set(ops_with(lambda f: f.shape_only)) == {"Shape", "Size"}
    assert set(ops_with(lambda f: not f.computes)) == {"Shape", "Size", "Constant", "ConstantOfShape", "Range",
                                                       "Identity", "Cast"}
    assert set(ops_with(lambda f: f.normalization)) == {"LayerNormalization", "GroupNormalization",
                                                        "InstanceNormalization", "RMSNormalization"}
    assert {op: ops.bias_input(op) for op in ops_with(lambda f: f.bias_input is not None)} == {
        "Conv": 2, "ConvTranspose": 2, "Gemm": 2}
    assert {op: ops.fragile_inputs(op) for op in ops_with(lambda f: f.fragile_inputs)} == {
        "Div": (1,), "Pow": (0,), "Sqrt": (0,), "Reciprocal": (0,), "Log": (0,)}
    assert ops.facts("Concat").data_inputs == "all"
    assert set(ops_with(lambda f: f.statistic)) == {"ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL2"}


@pytest.mark.parametrize("op_type", ops.op_types(lambda f: f.statistic))
def test_statistics_summarize_their_first_input_over_axes(op_type):
    """A statistic's output over the reduced axis is one number computed from every value of its first input
    there (a sum, mean or norm): changing any one of them changes it."""
    from onnx.reference import ReferenceEvaluator

    node = onnx.helper.make_node(op_type, ["x", "axes"], ["y"], keepdims=1)
    graph = onnx.helper.make_graph(
        [node], "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 5])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.array([-1], np.int64), "axes")])
    run = ReferenceEvaluator(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)]))
    x = np.arange(1, 11, dtype=np.float32).reshape(2, 5)
    (y,) = run.run(None, {"x": x})
    assert y.shape == (2, 1)
    for j in range(5):
        bumped = x.copy()
        bumped[0, j] += 1
        (z,) = run.run(None, {"x": bumped})
        assert z[0, 0] != y[0, 0] and z[1, 0] == y[1, 0]


def test_elementwise_functions():
    functions = {op: ops.elementwise_function(op).name for op in ops_with(lambda f: f.function is not None)}
    assert functions == {"Sigmoid": "sigmoid", "HardSigmoid": "hardsigmoid", "HardSwish": "hardswish",
                         "Tanh": "tanh", "LeakyRelu": "leakyrelu", "Exp": "exp", "Erf": "erf", "Gelu": "gelu",
                         "Elu": "elu", "Softplus": "softplus"}
    bounded = {op: ops.elementwise_function(op).output_range for op in functions
               if ops.elementwise_function(op).output_range}
    assert bounded == {"Sigmoid": (0.0, 1.0), "HardSigmoid": (0.0, 1.0), "Tanh": (-1.0, 1.0)}


# --------------------------------------------------------------------------- queries


class _Attr:
    def __init__(self, value):
        self.value = value


class _Node:
    def __init__(self, op_type, domain="", inputs=(), **attributes):
        self.op_type, self.domain, self.inputs = op_type, domain, list(inputs)
        self.attributes = {k: _Attr(v) for k, v in attributes.items()}


def _node(op_type, domain="", **attributes):
    return _Node(op_type, domain, **attributes)


def test_queries_take_op_types_and_nodes():
    assert ops.permutes_values("Transpose") and ops.permutes_values(_node("Transpose"))
    assert ops.permutes_values(_node("Transpose", domain="ai.onnx"))
    # another domain's op of the same name has no facts
    assert not ops.permutes_values(_node("Transpose", domain="com.example"))
    assert ops.facts(_node("Gelu", domain="com.microsoft")) is ops.NO_FACTS
    # an op with no row has none either, and computes
    assert ops.facts("NonMaxSuppression") is ops.NO_FACTS and ops.computes("NonMaxSuppression")
    assert not ops.quiet("NonMaxSuppression")


def test_resize_facts_follow_its_mode():
    for mode, selects, keeps in (("nearest", True, True), ("linear", False, True), ("cubic", False, False)):
        node = _node("Resize", mode=mode)
        assert (ops.selects(node), ops.shares_qparams(node), ops.keeps_range(node)) == (selects, selects, keeps)
        assert ops.quiet(node)  # quiet in every mode (unchanged): its float form is reported by fq2i
    assert ops.selects(_node("Resize", mode=b"nearest"))  # a bytes attribute value too


def test_data_inputs():
    a, b = object(), object()
    assert ops.data_inputs(_Node("Concat", inputs=[a, None, b])) == [a, b]
    assert ops.data_inputs(_Node("MaxPool", inputs=[a])) == [a]
    assert ops.data_inputs(_Node("Gather", inputs=[a, b])) == [a]
    assert ops.data_inputs(_Node("Slice", inputs=[None, b])) == []


# --------------------------------------------------------------------------- the facts against ONNX's numerics


@pytest.mark.parametrize("op_type", ops.op_types(lambda f: f.permutes_values))
def test_permuting_ops_keep_the_multiset(op_type):
    x = image()
    y, = outputs_of(op_type, x)
    assert np.array_equal(np.sort(y, axis=None), np.sort(x, axis=None))


@pytest.mark.parametrize("op_type", ops.op_types(lambda f: f.selects is not False))
def test_selecting_ops_output_input_values(op_type):
    x = image()
    rest = CALLS[op_type][0]
    data = [x, *rest] if ops.facts(op_type).data_inputs == "all" else [x]
    values = set(np.concatenate([d.ravel() for d in data]).tolist())
    for y in outputs_of(op_type, x):
        assert set(np.asarray(y).ravel().tolist()) <= values


def test_non_selecting_ops_make_new_values():
    """The ops left out of ``selects`` do: averaging, interpolating, clamping to a bound."""
    x = image()
    values = set(x.ravel().tolist())
    for op_type in ("AveragePool", "GlobalAveragePool", "Clip"):
        y, = outputs_of(op_type, x)
        assert not set(y.ravel().tolist()) <= values, op_type
    linear, = run("Resize", [x, *CALLS["Resize"][0]], mode="linear")
    assert not set(linear.ravel().tolist()) <= values


def test_resize_linear_keeps_the_range_and_cubic_overshoots():
    step = np.zeros((1, 1, 1, 8), np.float32)
    step[..., 4:] = 1.0
    scales = np.array([1, 1, 1, 4], np.float32)
    linear, = run("Resize", [step, np.array([], np.float32), scales], mode="linear")
    cubic, = run("Resize", [step, np.array([], np.float32), scales], mode="cubic")
    assert linear.min() >= 0.0 and linear.max() <= 1.0
    assert cubic.min() < 0.0 and cubic.max() > 1.0  # negative kernel lobes: not ``keeps_range``
    assert ops.keeps_range(_node("Resize", mode="linear")) and not ops.keeps_range(_node("Resize", mode="cubic"))


@pytest.mark.parametrize("op_type", [op for op in ops.op_types(lambda f: f.channelwise) if op in CALLS])
def test_channelwise_ops_leave_the_other_channels_alone(op_type):
    x = image()
    y, = outputs_of(op_type, x)
    x2 = x.copy()
    x2[:, 3] += 1.0
    y2, = outputs_of(op_type, x2)
    changed = np.any(np.asarray(y2, np.float64) != np.asarray(y, np.float64), axis=tuple(d for d in range(y.ndim)
                                                                                         if d != 1))
    assert changed[3] and not changed[np.arange(changed.size) != 3].any(), changed


def test_channel_mixing_ops_are_not_channelwise():
    assert not ops.channelwise("Conv") and not ops.channelwise("Softmax") and not ops.channelwise("Concat")
    assert not ops.channelwise("LayerNormalization") and not ops.channelwise("Transpose")


@pytest.mark.parametrize("op_type", ["Relu", "Clip"])
def test_clamps_commute_with_a_monotonic_map(op_type):
    """A clamp is monotonic: it commutes with any increasing map (quantize included) of its input and
    bounds, so a quantize after it gives the type of its input too."""
    x = image()
    y, = outputs_of(op_type, x)
    assert np.all(np.diff(y.ravel()[np.argsort(x, axis=None)]) >= 0)


ATTRIBUTES = {"LeakyRelu": {"alpha": 0.1}, "Elu": {"alpha": 0.7}, "HardSigmoid": {"alpha": 0.3, "beta": 0.4}}


@pytest.mark.parametrize("op_type, attrs", [(op, {}) for op in ops.op_types(lambda f: f.function is not None)] +
                         list(ATTRIBUTES.items()))
def test_function_definitions_are_the_ops(op_type, attrs):
    """Each function's float32 definition (what the lookup tables are built from) is ONNX's op, within
    float32 rounding (a few units in the last place)."""
    x = np.concatenate([np.linspace(-12, 12, 4001, dtype=np.float32), RNG.standard_normal(1000).astype(np.float32)])
    expected, = run(op_type, [x], **attrs)
    got = np.asarray(ops.elementwise_function(op_type).numpy(x, attrs), np.float32)
    np.testing.assert_allclose(got, expected, rtol=4e-6, atol=2e-7)


@pytest.mark.parametrize("op_type", ops.op_types(lambda f: f.function is not None and f.function.output_range))
def test_bounded_functions_stay_in_their_range(op_type):
    lo, hi = ops.elementwise_function(op_type).output_range
    x = np.linspace(-1e4, 1e4, 20001, dtype=np.float32)
    for attrs in ({}, ATTRIBUTES.get(op_type, {}), {"alpha": 5.0, "beta": -3.0}):
        y = ops.elementwise_function(op_type).numpy(x, attrs)
        assert y.min() >= lo and y.max() <= hi
    y = ops.elementwise_function(op_type).numpy(x, {})
    assert y.min() == lo and y.max() == hi  # the whole range is reached: none of it is wasted


@pytest.mark.parametrize("op_type", ops.op_types(lambda f: f.function is not None and f.function.value_and_slope))
def test_value_and_slope_are_the_function_and_its_derivative(op_type):
    function = ops.elementwise_function(op_type)
    x = np.linspace(-8, 8, 1601)
    x = x[np.abs(np.abs(x) - 3.0) > 1e-3]  # hard-swish's kinks at +-3
    value, slope = function.value_and_slope(x)
    np.testing.assert_allclose(value, function.numpy(x.astype(np.float32), {}), rtol=1e-6, atol=1e-7)
    h = 1e-6
    numeric = (function.value_and_slope(x + h)[0] - function.value_and_slope(x - h)[0]) / (2 * h)
    np.testing.assert_allclose(slope, numeric, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("op_type", ops.op_types(lambda f: f.fragile_inputs))
def test_fragile_inputs_have_an_unbounded_slope(op_type):
    """Near 0 at the fragile input the slope is unbounded: at 1e-4 (a rounding step of a small scale) it is at
    least 50 times its slope at 1 (sqrt: 100x, log: 1e4x, a reciprocal: 1e8x)."""
    (i,) = ops.fragile_inputs(op_type)
    other = {"Div": np.float32(1.0), "Pow": np.float32(0.5)}

    def f(v: float) -> float:
        inputs = [np.float32(v)]
        if op_type in other:
            inputs = [other[op_type], np.float32(v)] if i == 1 else [np.float32(v), other[op_type]]
        return float(np.float64(run(op_type, inputs)[0]))

    d = 1e-4
    near, far = abs(f(1.1 * d) - f(d)) / (0.1 * d), abs(f(1.0 + 1e-2) - f(1.0)) / 1e-2
    assert near > 50 * far, (near, far)


def test_passed_on_and_maker_follow_data_movement():
    g = Graph()
    x = g.input("x", [1, 4, 4, 4])
    r = g.node("Relu", [x], name="relu")
    p = g.node("MaxPool", [r], name="pool", kernel_shape=[1, 1])
    c = g.node("Concat", [p, x], name="cat", axis=1)
    g.node("Reshape", [c, g.const(np.array([1, -1], np.int64), "shape")], name="flat", out="y")
    model = ir.from_proto(g.model("y"))
    nodes = {n.name: n for n in model.graph}
    assert [v.name for v in ops.passed_on(nodes["cat"])] == [p, "x"]
    assert [v.name for v in ops.passed_on(nodes["flat"])] == [c]  # the data, not the shape
    assert ops.passed_on(nodes["relu"]) is None
    y = model.graph.outputs[0]
    assert ops.maker(y, lambda n: ops.passed_on(n) is not None).name == "relu"  # past Reshape, Concat, MaxPool
    assert ops.maker(y, ops.shares_qparams).name == "cat"  # a Concat does not share qparams


def test_readers_through_and_made_through_see_a_concat_past_data_movement():
    g = Graph()
    x = g.input("x", [1, 4, 4, 4])
    r = g.node("Relu", [x], name="relu", out="r")
    p = g.node("MaxPool", [r], name="pool", kernel_shape=[1, 1], out="p")
    c = g.node("Concat", [p, x], name="cat", axis=1, out="c")
    f = g.node("Reshape", [c, g.const(np.array([1, -1], np.int64), "shape")], name="flat", out="f")
    g.node("Sigmoid", [f], name="sig", out="y")
    model = ir.from_proto(g.model("y"))
    values = {o.name: o for n in model.graph for o in n.outputs}
    x_value = model.graph.inputs[0]
    assert ops.readers_through(values["r"], ("Concat",))  # through the MaxPool
    assert ops.readers_through(x_value, ("Concat",)) and not ops.readers_through(values["f"], ("Concat",))
    assert not ops.readers_through(x_value, ("Softmax",))
    assert ops.made_through(values["f"], ("Concat",)) and ops.made_through(values["c"], ("Concat",))
    assert not ops.made_through(values["p"], ("Concat",))  # a MaxPool of a Relu
    assert not ops.made_through(values["y"], ("Concat",))  # the Sigmoid computes new values


def test_reduction_axis_names_the_input_channels_of_each_contractions_operand():
    def node(op, **attrs):
        return ir.node(op, [ir.Value(name="a"), ir.Value(name="b")], attributes=attrs)

    assert ops.reduction_axis(node("Conv"), 1, 4) == 1
    assert ops.reduction_axis(node("ConvTranspose"), 1, 4) == 0  # weights C_in x C_out/group x k
    assert ops.reduction_axis(node("MatMul"), 1, 2) == 0 and ops.reduction_axis(node("MatMul"), 0, 3) == 2
    assert ops.reduction_axis(node("Gemm"), 1, 2) == 0 and ops.reduction_axis(node("Gemm", transB=1), 1, 2) == 1
    assert ops.reduction_axis(node("Gemm", transA=1), 0, 2) == 0
    assert ops.reduction_axis(node("Add"), 1, 2) is None and ops.reduction_axis(node("Conv"), 2, 1) is None


def test_depthwise_channels_are_read_from_the_weight_shape_and_group():
    def conv(w_shape, group):
        n = ir.Node("", "Conv", [ir.Value(name="x"), ir.Value(name="w", shape=ir.Shape(w_shape))], num_outputs=1,
                    attributes=[ir.AttrInt64("group", group)] if group else [])
        return n

    assert ops.depthwise_channels(conv([8, 1, 3, 3], 8)) == 8
    assert ops.depthwise_channels(conv([16, 1, 3, 3], 8)) == 8  # channel multiplier 2
    assert ops.depthwise_channels(conv([8, 2, 3, 3], 4)) is None  # grouped, two channels per group
    assert ops.depthwise_channels(conv([8, 1, 3, 3], 0)) is None  # group 1: an ordinary conv of 1 channel
    assert ops.depthwise_channels(conv(["M", 1, 3, 3], 8)) is None
