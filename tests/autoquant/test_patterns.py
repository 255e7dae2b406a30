"""Quantization patterns (qnnx.autoquant.patterns): what each built-in matches, the reason it
records when it does not, activation fusion, weight axes, fixed ranges, and the registry.

Patterns are matched on small hand-built graphs (onnx.helper -> onnx_ir); the reasons are also
checked where users see them, in the decisions of ``plan``.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from float_graphs import Graph, conv_weight, samples

import qnnx
from qnnx import QuantConfig, ops
from qnnx.autoquant import patterns as P
from qnnx.autoquant.patterns import MatchFail, Pattern, PatternMatch, Target, patterns_for, register_pattern
from qnnx.autoquant.plan import plan
from qnnx.autoquant.prepare import prepare

RNG = np.random.default_rng(7)
BY_NAME = {p.name: p for p in P.PATTERNS}


def _ir(g: Graph, *outputs: str) -> ir.Model:
    return ir.from_proto(g.model(*outputs))


def _node(model: ir.Model, name: str) -> ir.Node:
    found = [n for n in model.graph if n.name == name]
    assert len(found) == 1, name
    return found[0]


def _match(model: ir.Model, name: str, pattern: str | None = None):
    node = _node(model, name)
    candidates = patterns_for(node.op_type)
    if pattern is not None:
        candidates = [p for p in candidates if p.name == pattern]
    assert len(candidates) == 1, (node.op_type, [p.name for p in candidates])
    return candidates[0].match(node)


def _names(targets) -> list[tuple[str, str, int | None]]:
    return [(t.value.name, t.role, t.axis) for t in targets]


def _decision(model, node_name: str):
    d = [d for d in plan(prepare(model), QuantConfig(progress=False)).decisions if d.node == node_name]
    assert len(d) == 1, node_name
    return d[0]


# --------------------------------------------------------------------------- Conv


def _conv_graph(*, weight_const=True, bias="const", x_const=False):
    g = Graph()
    x = g.const(np.ones((1, 3, 6, 6), np.float32), "x") if x_const else g.input("x", [1, 3, 6, 6])
    w = g.const(conv_weight(RNG, 4, 3), "w") if weight_const else g.input("w", [4, 3, 3, 3])
    ins = [x, w]
    if bias == "const":
        ins.append(g.const(np.full(4, 0.1, np.float32), "b"))  # non-zero: prepare would drop a zero bias
    elif bias == "input":
        ins.append(g.input("b", [4]))
    if x_const:  # keep a graph input so the model is valid
        g.input("unused", [1])
    g.node("Conv", ins, name="conv", out="y")
    return g


def test_conv_matches_activation_weight_axis0_and_bias():
    m = _match(_ir(_conv_graph(), "y"), "conv")
    assert isinstance(m, PatternMatch) and m.pattern == "conv"
    assert [n.name for n in m.nodes] == ["conv"]
    assert _names(m.inputs) == [("x", "activation", None), ("w", "weight", 0)]
    assert _names(m.outputs) == [("y", "activation", None)]
    assert m.bias is not None and m.bias.name == "b"


@pytest.mark.parametrize("kwargs,reason", [
    (dict(weight_const=False), "weights are not constant"),
    (dict(bias="input"), "bias is not constant"),
    (dict(x_const=True), "input is not a float activation"),
])
def test_conv_refusals_record_the_reason(kwargs, reason):
    g = _conv_graph(**kwargs)
    m = _match(_ir(g, "y"), "conv")
    assert m == MatchFail(reason)
    if not kwargs.get("x_const"):  # a constant input is folded away by prepare
        d = _decision(g.model("y"), "conv")
        assert not d.quantized and d.reason == f"conv: {reason}"


def _conv_then(act: str, *, two_consumers=False, bound_input=False, conv_is_output=False):
    g = Graph()
    x = g.input("x", [1, 3, 6, 6])
    c = g.node("Conv", [x, g.const(conv_weight(RNG, 4, 3), "w")], name="conv", out="c")
    if act == "Relu":
        a = g.node("Relu", [c], name="act", out="a")
    else:
        lo = g.input("lo", []) if bound_input else g.const(np.float32(0.0), "lo")
        a = g.node("Clip", [c, lo, g.const(np.float32(6.0), "hi")], name="act", out="a")
    outs = [a]
    if two_consumers:
        outs.append(g.node("Sigmoid", [c], name="other", out="o"))
    if conv_is_output:
        outs.append(c)
    return _ir(g, *outs)


@pytest.mark.parametrize("act", ["Relu", "Clip"])
def test_conv_fuses_a_sole_relu_or_constant_clip_and_quantizes_after_it(act):
    m = _match(_conv_then(act), "conv")
    assert [n.name for n in m.nodes] == ["conv", "act"]
    assert _names(m.outputs) == [("a", "activation", None)]


@pytest.mark.parametrize("case", ["two_consumers", "bound_input", "conv_is_output"])
def test_conv_does_not_fuse_when_the_activation_is_not_alone_or_bounds_vary(case):
    m = _match(_conv_then("Clip" if case == "bound_input" else "Relu", **{case: True}), "conv")
    assert isinstance(m, PatternMatch)
    assert [n.name for n in m.nodes] == ["conv"]
    assert _names(m.outputs) == [("c", "activation", None)]


def test_conv_transpose_weights_are_per_channel_on_axis_1_and_fuse_relu():
    g = Graph()
    x = g.input("x", [1, 4, 5, 5])
    c = g.node("ConvTranspose", [x, g.const(conv_weight(RNG, 4, 6), "w"), g.const(np.zeros(6, np.float32), "b")],
               name="ct", strides=[2, 2], out="c")
    g.node("Relu", [c], name="act", out="a")
    m = _match(_ir(g, "a"), "ct")
    assert m.pattern == "conv_transpose"
    assert _names(m.inputs) == [("x", "activation", None), ("w", "weight", 1)]
    assert [n.name for n in m.nodes] == ["ct", "act"] and _names(m.outputs) == [("a", "activation", None)]
    assert m.bias.name == "b"


# --------------------------------------------------------------------------- MatMul / Gemm


def _matmul(b_kind: str):
    g = Graph()
    a = g.input("a", [2, 4, 8])
    if b_kind == "rank2":
        b = g.const(RNG.standard_normal((8, 3)).astype(np.float32), "B")
    else:
        b = g.input("B", [2, 8, 3])
    g.node("MatMul", [a, b], name="mm", out="y")
    return _ir(g, "y")


def test_matmul_constant_rank2_b_is_a_per_column_weight():
    m = _match(_matmul("rank2"), "mm")
    assert _names(m.inputs) == [("a", "activation", None), ("B", "weight", 1)]
    assert _names(m.outputs) == [("y", "activation", None)]


def test_matmul_constant_rank3_b_is_refused_with_its_rank():
    g = Graph()
    g.node("MatMul", [g.input("a", [2, 4, 8]), g.const(RNG.standard_normal((2, 8, 3)).astype(np.float32), "B")],
           name="mm", out="y")
    assert _match(_ir(g, "y"), "mm") == MatchFail("constant B of rank 3; per-column weights need rank 2")
    d = _decision(g.model("y"), "mm")
    assert not d.quantized and "rank 3" in d.reason


def test_matmul_of_two_activations_quantizes_both():
    m = _match(_matmul("activation"), "mm")
    assert _names(m.inputs) == [("a", "activation", None), ("B", "activation", None)]


def test_matmul_with_constant_a_is_refused():
    g = Graph()
    g.node("MatMul", [g.const(np.ones((4, 8), np.float32), "A"), g.input("b", [8, 3])], name="mm", out="y")
    assert _match(_ir(g, "y"), "mm") == MatchFail("input A is not a float activation")


def _gemm(**attrs):
    g = Graph()
    trans_b = attrs.get("transB", 0)
    w = RNG.standard_normal((3, 8) if trans_b else (8, 3)).astype(np.float32)
    a = g.input("a", [8, 4] if attrs.get("transA", 0) else [4, 8])
    g.node("Gemm", [a, g.const(w, "B"), g.const(np.full(3, 0.1, np.float32), "c")], name="gemm", out="y", **attrs)
    return g


@pytest.mark.parametrize("trans_b,axis", [(0, 1), (1, 0)])
def test_gemm_weight_axis_is_the_output_column(trans_b, axis):
    m = _match(_ir(_gemm(transB=trans_b), "y"), "gemm")
    assert _names(m.inputs) == [("a", "activation", None), ("B", "weight", axis)]
    assert m.bias.name == "c"


@pytest.mark.parametrize("attrs", [dict(alpha=2.0), dict(beta=0.5), dict(transA=1)])
def test_gemm_with_alpha_beta_or_trans_a_is_refused(attrs):
    g = _gemm(**attrs)
    assert _match(_ir(g, "y"), "gemm") == MatchFail("Gemm with alpha/beta != 1 or transA")
    d = _decision(g.model("y"), "gemm")
    assert not d.quantized and "alpha/beta != 1" in d.reason


def test_gemm_with_non_constant_b_is_refused():
    g = Graph()
    g.node("Gemm", [g.input("a", [4, 8]), g.input("B", [8, 3])], name="gemm", out="y")
    assert _match(_ir(g, "y"), "gemm") == MatchFail("Gemm needs a float activation A and constant B")


# --------------------------------------------------------------------------- all-activation patterns


def test_binary_quantizes_both_inputs_and_output_constants_as_per_tensor_constants():
    g = Graph()
    x = g.input("x", [1, 4])
    r = g.node("Add", [x, g.input("x2", [1, 4])], name="residual", out="r")
    g.node("Mul", [r, g.const(np.full((1, 4), 0.5, np.float32), "k")], name="scale", out="y")
    model = _ir(g, "y")
    add = _match(model, "residual")
    assert add.pattern == "binary"
    assert _names(add.inputs) == [("x", "activation", None), ("x2", "activation", None)]
    assert _names(add.outputs) == [("r", "activation", None)]
    mul = _match(model, "scale", "binary")
    assert _names(mul.inputs) == [("r", "activation", None), ("k", "constant", None)]


def test_binary_refusals():
    g = Graph()
    g.node("Add", [g.const(np.ones(4, np.float32), "k1"), g.const(np.ones(4, np.float32), "k2")], name="cst",
           out="z")
    g.node("Add", [g.input("i", [4], np.int64), g.input("j", [4], np.int64)], name="ints", out="w")
    model = _ir(g, "z", "w")
    assert _match(model, "cst") == MatchFail("no activation input (constant subgraph)")
    assert _match(model, "ints") == MatchFail("an input is not a float tensor")


@pytest.mark.parametrize("op,pattern", [
    ("Conv", "conv"), ("ConvTranspose", "conv_transpose"), ("MatMul", "matmul"), ("Gemm", "gemm"),
    ("Add", "binary"), ("Sub", "binary"), ("Mul", "binary"), ("AveragePool", "pool"),
    ("GlobalAveragePool", "pool"), ("Concat", "concat"), ("Softmax", "softmax"),
    *[(op, "elementwise") for op in ("Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "LeakyRelu", "Exp", "Erf",
                                     "Gelu", "Elu", "Softplus")],
])
def test_every_documented_op_is_anchored_by_its_pattern(op, pattern):
    names = [p.name for p in patterns_for(op)]
    # Multi-node patterns that start at the op (erf GELU at Div/Mul) and the scale type change come first.
    assert names[-1] == pattern and set(names[:-1]) <= {"gelu", "scale"}


@pytest.mark.parametrize("op", ["Relu", "MaxPool", "Reshape", "TopK"])
def test_ops_without_a_pattern_are_not_anchored(op):
    assert patterns_for(op) == []


def test_elementwise_pool_and_concat_quantize_inputs_and_output():
    g = Graph()
    x = g.input("x", [1, 2, 4, 4])
    s = g.node("Tanh", [x], name="tanh", out="s")
    p = g.node("AveragePool", [s], name="avg", kernel_shape=[2, 2], out="p")
    g.node("Concat", [p, g.const(np.zeros((1, 2, 3, 3), np.float32), "pad")], name="cat", axis=1, out="y")
    model = _ir(g, "y")
    assert _names(_match(model, "tanh").inputs) == [("x", "activation", None)]
    assert _names(_match(model, "tanh").outputs) == [("s", "activation", None)]
    assert _names(_match(model, "avg").inputs) == [("s", "activation", None)]
    cat = _match(model, "cat")
    assert _names(cat.inputs) == [("p", "activation", None), ("pad", "constant", None)]
    assert _names(cat.outputs) == [("y", "activation", None)]


def test_softmax_output_has_a_fixed_zero_one_range_and_input_is_observed():
    g = Graph()
    g.node("Softmax", [g.input("x", [2, 5])], name="sm", axis=-1, out="y")
    m = _match(_ir(g, "y"), "sm")
    assert m.inputs == (Target(m.inputs[0].value, "activation"),) and m.inputs[0].value.name == "x"
    (out,) = m.outputs
    assert out.value.name == "y" and out.role == "activation" and out.fixed_range == (0.0, 1.0)


@pytest.mark.parametrize("op,shift,lo,hi,fixed", [
    ("Add", 3.0, 0.0, 6.0, (0.0, 6.0)),  # hard-swish's gate, 6 * HardSigmoid(x)
    ("Sub", -0.5, 0.0, 1.0, (0.0, 1.0)),
    ("Add", None, 0.0, 6.0, None),  # two activations: a residual with a ReLU6, observed
    ("Add", 3.0, None, 6.0, None),  # no lower bound: not bounded on both sides
])
def test_a_shifted_clip_is_bounded_like_hard_sigmoid(op, shift, lo, hi, fixed):
    g = Graph()
    x = g.input("x", [1, 4])
    other = g.const(np.array(shift, np.float32), "c") if shift is not None else g.input("r", [1, 4])
    a = g.node(op, [x, other], name="add", out="a")
    bounds = [g.const(np.array(b, np.float32), f"b{i}") if b is not None else "" for i, b in enumerate((lo, hi))]
    g.node("Clip", [a, *bounds], name="clip", out="y")
    m = _match(_ir(g, "y"), "add")
    (out,) = m.outputs
    assert out.value.name == "y" and out.fixed_range == fixed


# --------------------------------------------------------------------------- the registry


@pytest.fixture
def toy_pattern():
    """A toy pattern registered for the test and removed afterwards (PATTERNS restored)."""
    before = list(P.PATTERNS)

    @register_pattern
    class AbsPattern(Pattern):
        name = "toy_abs"
        anchors = ("Abs",)

        def match(self, node):
            x = node.inputs[0]
            if x.const_value is not None:
                return MatchFail("toy: constant input")
            return PatternMatch(self.name, (node,), (Target(x, "activation"),),
                                (Target(node.outputs[0], "activation"),))

    try:
        yield AbsPattern
    finally:
        P.PATTERNS[:] = [p for p in P.PATTERNS if not isinstance(p, AbsPattern)]
        assert P.PATTERNS == before


def test_adding_a_pattern_is_one_registered_class(toy_pattern):
    assert patterns_for("Abs") and isinstance(patterns_for("Abs")[0], toy_pattern)
    g = Graph()
    x = g.input("x", [1, 3, 6, 6])
    c = g.node("Conv", [x, g.const(conv_weight(RNG, 4, 3), "w")], name="conv", out="c")
    g.node("Abs", [c], name="abs", out="y")
    qm = qnnx.quantize(g.model("y"), samples(4, (1, 3, 6, 6)), QuantConfig(progress=False))
    d = {d.node: d for d in qm.report.decisions}
    assert d["abs"].quantized and d["abs"].pattern == "toy_abs" and d["abs"].reason == "pattern toy_abs"
    # the toy pattern's targets got Q/DQ: the Abs reads a DequantizeLinear and its output is quantized
    abs_node = [n for n in qm.qdq.graph if n.op_type == "Abs"][0]
    assert abs_node.inputs[0].producer().op_type == "DequantizeLinear"
    assert [u.node.op_type for u in abs_node.outputs[0].uses()] == ["QuantizeLinear"]


def test_a_registered_pattern_is_simulated_and_calibrated_sequentially_with_no_other_edit(toy_pattern):
    from qnnx.autoquant.calibration import calibrate_sequential
    from qnnx.autoquant.simulate import simulate_model
    from qnnx.data import CalibrationData, input_specs

    g = Graph()
    c = g.node("Conv", [g.input("x", [1, 3, 6, 6]), g.const(conv_weight(RNG, 4, 3), "w")], name="conv", out="c")
    g.node("Abs", [c], name="abs", out="y")
    model = prepare(g.model("y"))
    the_plan = plan(model, QuantConfig(progress=False))
    assert set(simulate_model(model, the_plan)[1]) == {"x", "c", "y"}  # the default simulate covers its targets
    config = QuantConfig(progress=False, calibrator="sequential")
    data = CalibrationData.from_source(samples(4, (1, 3, 6, 6))).bind(input_specs(model))
    roots = calibrate_sequential(model, the_plan, data, config).qparams
    assert {r.name for r in roots} == {"x", "c", "y"}


def test_toy_pattern_is_gone_after_removal():
    assert patterns_for("Abs") == []
    assert all(p.name != "toy_abs" for p in P.PATTERNS)


def test_patterns_sharing_an_anchor_are_offered_a_node_by_priority():
    assert [p.name for p in patterns_for("Mul")] == ["gelu", "scale", "binary"]
    assert [p.name for p in patterns_for("Div")] == ["gelu", "scale"]
    assert [p.name for p in patterns_for("Add")] == ["binary"]
    for p in P.PATTERNS:
        for q in P.PATTERNS:
            if p is not q and set(p.anchors) & set(q.anchors):
                assert p.priority != q.priority, (p.name, q.name)


def test_a_pattern_sharing_an_anchor_and_a_priority_is_refused():
    before = list(P.PATTERNS)

    class Clash(Pattern):
        name = "toy_clash"
        anchors = ("Sub",)
        priority = P.BinaryPattern.priority

    with pytest.raises(ValueError, match="share anchors"):
        register_pattern(Clash)

    class Twin(Pattern):
        name = "binary"
        anchors = ("Abs",)

    with pytest.raises(ValueError, match="registered already"):
        register_pattern(Twin)
    assert P.PATTERNS == before


def test_pattern_kinds_and_contractions():
    from qnnx.autoquant.speed import KINDS

    kinds = {p.name: p.kind for p in P.PATTERNS}
    assert kinds == {"conv": "conv", "conv_transpose": "conv transpose", "matmul": "matmul/gemm",
                     "gemm": "matmul/gemm", "gelu": "gelu", "scale": "scale", "binary": "binary", "pool": "pool",
                     "concat": "concat", "elementwise": "elementwise", "softmax": "softmax"}
    assert set(kinds.values()) <= set(KINDS)  # the speed fallback tries every kind in a stated order
    assert {p.name for p in P.PATTERNS if p.contraction} == {"conv", "conv_transpose", "matmul", "gemm"}


def test_elementwise_pattern_anchors_every_function_of_the_op_table():
    assert set(BY_NAME["elementwise"].anchors) == set(ops.op_types(lambda f: f.function is not None))


# --------------------------------------------------------------------------- scale (type change) and fused activations


def test_mul_or_div_by_a_positive_scalar_is_a_type_change_of_its_input():
    g = Graph()
    x = g.input("x", [1, 4])
    d = g.node("Div", [x, g.const(np.array(6.0, np.float32), "six")], name="div", out="d")
    g.node("Mul", [g.const(np.array([2.0], np.float32), "two"), d], name="mul", out="y")
    model = _ir(g, "y")
    div = _match(model, "div", "scale")
    assert div.pattern == "scale" and _names(div.inputs) == [("x", "activation", None)]
    assert div.outputs[0].scaled_from[0].name == "x" and div.outputs[0].scaled_from[1] == pytest.approx(1 / 6)
    mul = _match(model, "mul", "scale")
    assert mul.outputs[0].scaled_from[0].name == "d" and mul.outputs[0].scaled_from[1] == 2.0


@pytest.mark.parametrize("const", [np.array(-2.0, np.float32), np.array([1.0, 2.0, 3.0, 4.0], np.float32),
                                   np.array(0.0, np.float32), np.array(2, np.int64)])
def test_scale_refuses_non_positive_vector_or_integer_constants(const):
    g = Graph()
    g.node("Mul", [g.input("x", [1, 4], const.dtype if const.dtype != np.float32 else np.float32),
                   g.const(const, "k")], name="mul", out="y")
    assert _match(_ir(g, "y"), "mul", "scale") == MatchFail("no positive scalar constant operand")


def test_scale_refuses_a_constant_that_broadcasts_the_activation():
    g = Graph()
    g.node("Mul", [g.input("x", [4]), g.const(np.full((1, 1), 2.0, np.float32), "k")], name="mul", out="y")
    assert _match(_ir(g, "y"), "mul", "scale") == MatchFail("the constant broadcasts the activation to another shape")


@pytest.mark.parametrize("act", ["Relu", "Clip"])
def test_binary_fuses_a_sole_relu_or_constant_clip_and_quantizes_after_it(act):
    g = Graph()
    a = g.node("Add", [g.input("x", [1, 4]), g.input("x2", [1, 4])], name="add", out="a")
    bounds = [g.const(np.array(0.0, np.float32)), g.const(np.array(6.0, np.float32))] if act == "Clip" else []
    g.node(act, [a, *bounds], name="act", out="y")
    m = _match(_ir(g, "y"), "add", "binary")
    assert [n.name for n in m.nodes] == ["add", "act"]
    assert _names(m.outputs) == [("y", "activation", None)]


def test_binary_does_not_fuse_an_activation_it_does_not_feed_alone():
    g = Graph()
    a = g.node("Add", [g.input("x", [1, 4]), g.input("x2", [1, 4])], name="add", out="a")
    r = g.node("Relu", [a], name="act", out="r")
    g.node("Mul", [a, r], name="mul", out="y")
    m = _match(_ir(g, "y"), "add", "binary")
    assert [n.name for n in m.nodes] == ["add"] and _names(m.outputs) == [("a", "activation", None)]


@pytest.mark.parametrize("by_div,swap_inner,swap_half", [(True, True, True), (False, False, True), (False, True, False)])
def test_erf_gelu_matches_with_either_operand_order_and_either_scaling(by_div, swap_inner, swap_half):
    """The structure is onnxscript's pattern matcher's (every variant is one graph pattern)."""
    g = Graph()
    x = g.input("x", [2, 4])
    k = np.float32(np.sqrt(2.0) if by_div else 1 / np.sqrt(2.0))
    s = g.node("Div" if by_div else "Mul", [x, g.const(k, "k")], name="scale_x")
    a = g.node("Add", [g.node("Erf", [s], name="erf"), g.const(np.float32(1.0), "one")], name="plus1")
    m = g.node("Mul", [a, x] if swap_inner else [x, a], name="times_x")
    h = g.const(np.float32(0.5), "half")
    g.node("Mul", [h, m] if swap_half else [m, h], name="halve", out="y")
    found = _match(_ir(g, "y"), "scale_x", "gelu")
    assert isinstance(found, PatternMatch)
    assert [n.name for n in found.nodes] == ["scale_x", "erf", "plus1", "times_x", "halve"]
    assert _names(found.inputs) == [("x", "activation", None)] and _names(found.outputs) == [("y", "activation", None)]


def test_erf_gelu_with_a_wrong_constant_is_not_matched():
    g = Graph()
    x = g.input("x", [2, 4])
    s = g.node("Div", [x, g.const(np.float32(np.sqrt(2.0)), "k")], name="scale_x")
    a = g.node("Add", [g.node("Erf", [s], name="erf"), g.const(np.float32(1.0), "one")], name="plus1")
    m = g.node("Mul", [x, a], name="times_x")
    g.node("Mul", [m, g.const(np.float32(0.25), "quarter")], name="halve", out="y")
    assert isinstance(_match(_ir(g, "y"), "scale_x", "gelu"), MatchFail)
