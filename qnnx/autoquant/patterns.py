"""Quantization patterns: which float subgraphs become integer, and which of their values
carry qparams.

A pattern is one registered class (``@register_pattern``) with

- ``kind``: the family it belongs to, as reports and the speed fallback group patterns ("conv",
  "matmul/gemm", "elementwise", "binary", "pool", "concat", "scale", "softmax", ...); ``contraction``:
  it accumulates products of weights or activations in int32 (conv, matmul: its output may stay float
  for free); ``priority``: among the patterns anchored on one op type, the higher is offered the node
  first (two patterns sharing an anchor may not share a priority);

- ``match(node, ctx)``: anchored on one op type; returns a :class:`PatternMatch` or a
  :class:`MatchFail` whose reason is recorded (why the node stays float);
- ``simulate(match, rewriter)``: the pattern in affine space — ``qnnx.simulated_quantize`` /
  ``simulated_dequantize`` around it with qparams as graph inputs (:mod:`qnnx.autoquant.simulate`),
  what calibration runs when it observes the quantized model;
- ``realize(match, rewriter)``: QuantizeLinear/DequantizeLinear with the chosen qparams
  (:mod:`qnnx.autoquant.qdq`); both default to the shared walk over the match's targets; the
  integer ``qnnx`` ops then come from fake-quantization-to-integer (``qnnx.from_qdq``), which
  also expands affine regions through the allow-list (relu, maxpool, reshape, ...) and
  consolidates dequantize -> quantize into requantize.

Built-ins:

    Conv(x, W[, b]) [-> Relu | Clip]          x: activation, W: per-channel axis 0, out after the activation
    ConvTranspose(x, W[, b]) [-> Relu | Clip] W per-channel on axis 1
    MatMul(x, W) [-> Add(b)] / Gemm(x, W[, b]) W: per-column, b: int32 in the accumulator; act x act MatMul too
    erf GELU (x/sqrt2 -> Erf -> +1 -> *x -> *0.5) input and output, like Gelu (one table once integer)
    Mul / Div by a positive scalar constant   a type change: the input's integers, scale times the factor
    Add / Sub / Mul (residuals included)      both inputs and the output [-> Relu | Clip]; x +- c -> Clip
                                              (a hard sigmoid) outputs the clip's whole range
    AveragePool / GlobalAveragePool, Concat   inputs and output
    Sigmoid, HardSigmoid, HardSwish, Tanh,
    LeakyRelu, Exp, Erf, Gelu, Elu, Softplus  input and output (a lookup table once integer); the bounded
                                              ones (sigmoid, hard sigmoid, tanh) output their full range
    Softmax                                   input; output fixed to [0, 1] (the full activation range)
                                              (a masked input, scores + attention mask, stays float)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern as orp

from qnnx import ops
from qnnx.autoquant.masks import is_additive_mask, is_masked
from qnnx.ir import const_array


@dataclass(frozen=True)
class Target:
    """A float value that gets qparams: an activation (observed during calibration), a weight of
    conv/matmul (int8 symmetric, per-channel on ``axis`` when set) or a constant operand of an
    elementwise op (the activation type, from its own range)."""

    value: ir.Value
    role: str  # "activation" | "weight" | "constant"
    axis: int | None = None
    fixed_range: tuple[float, float] | None = None  # known output range (softmax), no observation
    # Output = source * factor with factor > 0 (Mul/Div by a positive constant): the same integers under
    # a scale multiplied by ``factor``, so no observation and no requantization (a pure type change).
    scaled_from: tuple[ir.Value, float] | None = None
    # Data-movement nodes between ``value`` and the pattern (a target that quantizes before them:
    # ``plan.hoist_quantizers``); they read the quantized value too.
    through: tuple[ir.Node, ...] = ()
    # Quantized with zero point 0: uint8 when it never goes negative, else int8 symmetric (a target's kernel
    # needs it: plan.zero_point_zero).
    zero_point_zero: bool = False
    # Quantized per channel (axis 1): the input of a depthwise conv on a target whose kernels take per-channel
    # input qparams there (plan.per_channel_depthwise_inputs); such a value's observer is per-channel min-max.
    per_channel: bool = False


@dataclass(frozen=True)
class PatternMatch:
    pattern: str
    nodes: tuple[ir.Node, ...]  # anchor first
    inputs: tuple[Target, ...]
    outputs: tuple[Target, ...]
    bias: ir.Value | None = None  # float bias quantized to int32 with scale x_scale * w_scale


@dataclass(frozen=True)
class MatchFail:
    reason: str


class Pattern:
    name: str = ""
    anchors: tuple[str, ...] = ()
    kind: str = ""  # defaults to the name
    contraction: bool = False
    priority: int = 0
    # The output's qparams are every input's too (a concatenation holds the inputs' values unchanged):
    # inputs may take them, and an input left float would be quantized by them unobserved.
    inputs_share_output_qparams: bool = False

    def match(self, node: ir.Node) -> PatternMatch | MatchFail:
        raise NotImplementedError

    def check(self, match: PatternMatch, qparams: dict) -> MatchFail | None:
        """Second look once calibration chose ``qparams`` (by value name): a reason to keep the match
        float, or None. Most patterns have none."""
        return None

    def simulate(self, match: PatternMatch, rewriter) -> None:
        """The match in affine space for calibration: ``qnnx.simulated_quantize`` ->
        ``simulated_dequantize`` on each activation with its qparams as graph inputs, weights and bias
        quantized as :meth:`realize` does (``rewriter``: :class:`qnnx.autoquant.simulate.SimulatedRewriter`)."""
        rewriter.quantize_targets(match)

    def realize(self, match: PatternMatch, rewriter) -> None:
        """The match with the chosen qparams: Q/DQ around it, int8 weights, int32 bias
        (``rewriter``: :class:`qnnx.autoquant.qdq.QDQRewriter`)."""
        rewriter.quantize_targets(match)


PATTERNS: list[Pattern] = []


def register_pattern(cls: type[Pattern]) -> type[Pattern]:
    """Register ``cls`` (one instance). Patterns sharing an anchor need distinct priorities: the order
    they are offered a node is stated, never the order of registration."""
    pattern = cls()
    if not pattern.kind:
        pattern.kind = pattern.name
    for other in PATTERNS:
        if other.name == pattern.name:
            raise ValueError(f"a pattern named {pattern.name!r} is registered already")
        shared = set(other.anchors) & set(pattern.anchors)
        if shared and other.priority == pattern.priority:
            raise ValueError(f"patterns {other.name!r} and {pattern.name!r} share anchors {sorted(shared)} and "
                             f"priority {pattern.priority}: give one a higher priority")
    PATTERNS.append(pattern)
    return cls


def patterns_for(op_type: str) -> list[Pattern]:
    """The patterns anchored on ``op_type``, the highest priority first."""
    return sorted((p for p in PATTERNS if op_type in p.anchors), key=lambda p: -p.priority)


def pattern_named(name: str) -> Pattern:
    for p in PATTERNS:
        if p.name == name:
            return p
    raise KeyError(f"no pattern named {name!r}")


# --------------------------------------------------------------------------- helpers


def _activation(v: ir.Value) -> Target:
    return Target(v, "activation")


def is_float_activation(v: ir.Value | None) -> bool:
    """``v`` is computed at run time (not a constant) and of a floating-point type."""
    return v is not None and const_array(v) is None and (v.dtype is None or v.dtype.is_floating_point())


def _sole_consumer(v: ir.Value) -> ir.Node | None:
    users = v.uses()
    if len(users) != 1 or v.is_graph_output():
        return None
    return users[0].node


def _fused_activation(out: ir.Value) -> ir.Node | None:
    """A Relu, or a Clip with constant bounds, that alone consumes ``out``: quantizing after it keeps
    the whole output range for real values (ORT and TFLite fuse the same way)."""
    nxt = _sole_consumer(out)
    if nxt is None or not ops.clamps(nxt):  # Relu, Clip
        return None
    if all(v is None or const_array(v) is not None for v in nxt.inputs[1:]):  # constant bounds (Relu has none)
        return nxt
    return None


# --------------------------------------------------------------------------- built-ins


class _WeightedPattern(Pattern):
    weight_axis = 0
    contraction = True

    def match(self, node):
        x, w = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
        if not is_float_activation(x):
            return MatchFail("input is not a float activation")
        if w is None or const_array(w) is None:
            return MatchFail("weights are not constant")
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        if bias is not None and const_array(bias) is None:
            return MatchFail("bias is not constant")
        nodes = [node]
        out = node.outputs[0]
        act = _fused_activation(out)
        if act is not None:
            nodes.append(act)
            out = act.outputs[0]
        return PatternMatch(self.name, tuple(nodes), (_activation(x), Target(w, "weight", self.weight_axis)),
                            (_activation(out),), bias)


@register_pattern
class ConvPattern(_WeightedPattern):
    name = "conv"
    anchors = ("Conv",)
    kind = "conv"  # the speed fallback splits it further: depthwise, pointwise (speed.match_kind)


@register_pattern
class ConvTransposePattern(_WeightedPattern):
    name = "conv_transpose"
    anchors = ("ConvTranspose",)
    kind = "conv transpose"
    weight_axis = 1  # ConvTranspose weights are C_in x C_out/group x k: output channels on axis 1

    def match(self, node):
        group = node.attributes["group"].value if "group" in node.attributes else 1
        m = super().match(node)
        if isinstance(m, PatternMatch) and group != 1:
            m = PatternMatch(m.pattern, m.nodes, (m.inputs[0], Target(m.inputs[1].value, "weight", None)),
                             m.outputs, m.bias)
        return m


@register_pattern
class MatMulPattern(Pattern):
    name = "matmul"
    anchors = ("MatMul",)
    kind = "matmul/gemm"
    contraction = True

    def match(self, node):
        a, b = node.inputs
        if not is_float_activation(a):
            return MatchFail("input A is not a float activation")
        w = const_array(b)
        if w is not None:
            if w.ndim != 2:
                return MatchFail(f"constant B of rank {w.ndim}; per-column weights need rank 2")
            add, bias = _bias_add(node.outputs[0], w.shape[1])
            if add is None:
                return PatternMatch(self.name, (node,), (_activation(a), Target(b, "weight", 1)),
                                    (_activation(node.outputs[0]),))
            # A linear layer: the bias joins the int32 accumulator (scale sa * sw), one quantize after the Add.
            return PatternMatch(self.name, (node, add), (_activation(a), Target(b, "weight", 1)),
                                (_activation(add.outputs[0]),), bias)
        if not is_float_activation(b):
            return MatchFail("input B is neither constant nor a float activation")
        return PatternMatch(self.name, (node,), (_activation(a), _activation(b)), (_activation(node.outputs[0]),))


def _bias_add(out: ir.Value, columns: int) -> tuple[ir.Node | None, ir.Value | None]:
    """The ``Add(out, b)`` alone consuming a MatMul output, with ``b`` a constant vector of one value
    per output column (what exporters write for ``nn.Linear``), and that ``b``; (None, None) otherwise."""
    add = _sole_consumer(out)
    if add is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx"):
        return None, None
    bias = add.inputs[1] if add.inputs[0] is out else add.inputs[0]
    c = const_array(bias)
    if c is None or c.ndim != 1 or c.shape[0] != columns or not np.issubdtype(c.dtype, np.floating):
        return None, None
    return add, bias


@register_pattern
class GemmPattern(Pattern):
    name = "gemm"
    anchors = ("Gemm",)
    kind = "matmul/gemm"
    contraction = True

    def match(self, node):
        at = {k: v.value for k, v in node.attributes.items()}
        if at.get("alpha", 1.0) != 1.0 or at.get("beta", 1.0) != 1.0 or at.get("transA", 0):
            return MatchFail("Gemm with alpha/beta != 1 or transA")
        a, b = node.inputs[0], node.inputs[1]
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        if not is_float_activation(a) or const_array(b) is None:
            return MatchFail("Gemm needs a float activation A and constant B")
        if bias is not None and (const_array(bias) is None or const_array(bias).ndim != 1):
            return MatchFail("Gemm bias must be a constant vector")
        axis = 0 if at.get("transB", 0) else 1  # the output-column axis of B
        return PatternMatch(self.name, (node,), (_activation(a), Target(b, "weight", axis)),
                            (_activation(node.outputs[0]),), bias)


class _AllActivationsPattern(Pattern):
    """Every float input (activation or constant) and the output carry qparams."""

    def match(self, node):
        targets = []
        for v in node.inputs:
            if v is None:
                continue
            if const_array(v) is not None:
                targets.append(Target(v, "constant", None))
            elif is_float_activation(v):
                targets.append(_activation(v))
            else:
                return MatchFail("an input is not a float tensor")
        if not any(t.role == "activation" for t in targets):
            return MatchFail("no activation input (constant subgraph)")
        return PatternMatch(self.name, (node,), tuple(targets), (_activation(node.outputs[0]),))


def _positive_scalar(v: ir.Value | None) -> float | None:
    c = _scalar(v)
    return c if c is not None and np.isfinite(c) and c > 0 else None


_SQRT2 = float(np.sqrt(2.0))


def _scalar(v: ir.Value | None) -> float | None:
    c = const_array(v) if v is not None else None
    return float(c.reshape(())) if c is not None and c.size == 1 and np.issubdtype(c.dtype, np.floating) else None


def _other_input(node: ir.Node, v: ir.Value) -> ir.Value | None:
    if len(node.inputs) != 2:
        return None
    return node.inputs[1] if node.inputs[0] is v else node.inputs[0] if node.inputs[1] is v else None


def _gelu_graph_patterns() -> list[orp.Pattern]:
    """The erf GELU ``0.5 * x * (1 + erf(x / sqrt2))`` as exporters write it, as onnxscript graph
    patterns: ``x / sqrt2`` or ``x * (1/sqrt2)``, then ``Mul(x, 1 + erf) * 0.5`` or
    ``(x * 0.5) * (1 + erf)``, every Mul in either operand order (the matcher does not commute)."""

    def mul(op, a, b, swap):
        return op.Mul(b, a) if swap else op.Mul(a, b)

    def variant(scaled_by_div: bool, half_first: bool, s1: bool, s2: bool):
        # Only (op, x, k, one, half) may be parameters: onnxscript turns every parameter into a pattern input.
        def target(op, x, k, one, half):
            erf1 = op.Add(op.Erf(op.Div(x, k) if scaled_by_div else op.Mul(x, k)), one)
            if half_first:
                return mul(op, mul(op, x, half, s1), erf1, s2)
            return mul(op, mul(op, x, erf1, s1), half, s2)
        return target

    flags = (False, True)
    return [orp.Pattern(variant(d, h, s1, s2), name=f"erf_gelu_{d:d}{h:d}{s1:d}{s2:d}")
            for d in flags for h in flags for s1 in flags for s2 in flags]


_GELU_GRAPHS = _gelu_graph_patterns()


@register_pattern
class GeluPattern(Pattern):
    """The exact GELU as exporters write it without a Gelu op (torch before opset 20), one
    elementwise unit like ``Gelu``: quantized input and output, a lookup table once integer.
    The structure is matched with onnxscript's pattern matcher (``_GELU_GRAPHS``) from the chain's
    last node; the anchor is its first node in graph order (plan claims nodes in that order), so
    the candidates are the anchor's consumers up to four steps on.

    Quantizing each of its five ops requantizes four times inside one activation function, and the
    rounding errors add up (figures: docs/experiments.md, "Patterns")."""

    name = "gelu"
    anchors = ("Div", "Mul")
    kind = "gelu"
    priority = 30  # above "scale" and "binary": they would claim the Div / Mul that starts the chain

    def match(self, node):
        graph = node.graph
        seen, frontier = [], [node]
        for _ in range(4):  # x/sqrt2 -> Erf -> Add -> Mul -> Mul: the last node is 4 steps on
            frontier = [u.node for v in frontier for o in v.outputs for u in o.uses() if u.node not in seen]
            seen += frontier
        for end in [node, *seen]:
            for graph_pattern in _GELU_GRAPHS:
                found = graph_pattern.match(None, graph, end, check_nodes_are_removable=True)
                if not found or node not in found.nodes:
                    continue
                b = found.bindings
                k, one, half = _scalar(b["k"]), _scalar(b["one"]), _scalar(b["half"])
                scale = None if k is None else (1.0 / k if "Div" in {n.op_type for n in found.nodes} else k)
                if scale is None or not np.isclose(scale, 1.0 / _SQRT2, rtol=1e-5) or one != 1.0 or half != 0.5:
                    continue
                x = b["x"]
                if not is_float_activation(x):
                    return MatchFail("the erf GELU's input is not a float activation")
                order = {n: i for i, n in enumerate(graph)}
                nodes = tuple(sorted(found.nodes, key=order.__getitem__))
                nodes = (node, *[n for n in nodes if n is not node])
                return PatternMatch(self.name, nodes, (_activation(x),), (_activation(end.outputs[0]),))
        return MatchFail("not an erf GELU (x / sqrt2 -> Erf -> +1 -> * x -> * 0.5)")


@register_pattern
class ScalePattern(Pattern):
    """``x * c`` or ``x / c`` with a positive scalar constant ``c``: the output is the input's integers
    with scale ``s * c`` (``s / c``). Realized as a DequantizeLinear with the scaled scale and no float op
    (hard-swish's ``/ 6`` costs a DequantizeLinear, a float Div and a QuantizeLinear otherwise)."""

    name = "scale"
    anchors = ("Mul", "Div")
    kind = "scale"
    priority = 20  # above "binary": Mul by a positive constant is a type change, not a QLinearMul

    def match(self, node):
        x, c = node.inputs[0], node.inputs[1]
        factor = _positive_scalar(c)
        if factor is None and node.op_type == "Mul":
            x, c = c, x
            factor = _positive_scalar(c)
        if factor is None:
            return MatchFail("no positive scalar constant operand")
        if not is_float_activation(x):
            return MatchFail("the other operand is not a float activation")
        rank = const_array(c).ndim
        if rank > 1 and (x.shape is None or rank > len(x.shape)):
            return MatchFail("the constant broadcasts the activation to another shape")
        if node.op_type == "Div":
            factor = 1.0 / factor
        return PatternMatch(self.name, (node,), (_activation(x),),
                            (Target(node.outputs[0], "activation", scaled_from=(x, factor)),))

    def realize(self, match, rewriter):
        super().realize(match, rewriter)
        rewriter.fold_scale(match)  # simulate keeps the float op: requantizing to s * c gives the same integers


@register_pattern
class BinaryPattern(_AllActivationsPattern):
    name = "binary"
    anchors = ("Add", "Sub", "Mul")
    kind = "binary"
    priority = 10

    def match(self, node):
        if any(is_additive_mask(v) for v in node.inputs):
            return MatchFail("an operand is an additive attention mask (its -inf-like sentinel has no quantized "
                             "range; see masks.py)")
        m = super().match(node)
        act = _fused_activation(node.outputs[0]) if isinstance(m, PatternMatch) else None
        if act is None:
            return m
        # Quantize after the Relu/Clip: ONNX Runtime then drops the activation into the QuantizeLinear's
        # range and fuses QLinearAdd/QLinearMul, as it does for Conv.
        bounds = _shifted_clip_bounds(node, act)
        out = Target(act.outputs[0], "activation", fixed_range=bounds) if bounds else _activation(act.outputs[0])
        return PatternMatch(m.pattern, (node, act), m.inputs, (out,))


def _shifted_clip_bounds(node: ir.Node, act: ir.Node) -> tuple[float, float] | None:
    """``(lo, hi)`` when ``Clip(x +- c, lo, hi)`` (one activation, a scalar constant, finite bounds) spells
    a hard sigmoid: hard-swish's gate ``Clip(x + 3, 0, 6)`` is ``6 * HardSigmoid(x)``. A bounded function
    gets its whole range (ElementwisePattern), whichever way it is written; it is not observed (an
    observed range comes out close to the whole one anyway: docs/experiments.md, "Patterns")."""
    if node.op_type not in ("Add", "Sub") or act.op_type != "Clip" or len(act.inputs) < 3:
        return None
    if sum(_scalar(v) is not None for v in node.inputs) != 1 or any(
            _scalar(v) is None and not is_float_activation(v) for v in node.inputs):
        return None
    lo, hi = _scalar(act.inputs[1]), _scalar(act.inputs[2])
    if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
        return None
    return lo, hi


@register_pattern
class PoolPattern(_AllActivationsPattern):
    name = "pool"
    anchors = ("AveragePool", "GlobalAveragePool")
    kind = "pool"


# An input whose range is this many times smaller than the Concat output's keeps fewer than
# 256 / 16 = 16 levels once requantized to the output's scale (YOLOv8's head concatenates box
# coordinates in pixels with class probabilities in [0, 1]: quantized together, every score was 0).
CONCAT_MAX_SCALE_RATIO = 16.0


@register_pattern
class ConcatPattern(_AllActivationsPattern):
    name = "concat"
    anchors = ("Concat",)
    kind = "concat"
    inputs_share_output_qparams = True

    def check(self, match, qparams):
        out = qparams.get(match.outputs[0].value.name)
        if out is None or np.asarray(out.scale).size != 1:
            return None
        for t in match.inputs:
            qp = qparams.get(t.value.name)
            if qp is None or np.asarray(qp.scale).size != 1:
                continue
            ratio = float(out.scale) / float(qp.scale)
            if ratio > CONCAT_MAX_SCALE_RATIO:
                return MatchFail(f"input {t.value.name!r} has a {ratio:.0f}x smaller range than the output: "
                                 f"one shared scale would leave it {256 / ratio:.0f} levels")
        return None


@register_pattern
class ElementwisePattern(_AllActivationsPattern):
    name = "elementwise"
    anchors = ops.op_types(lambda f: f.function is not None)  # Sigmoid, HardSwish, Tanh, Exp, Gelu, ...
    kind = "elementwise"

    def match(self, node):
        m = super().match(node)
        # Bounded functions (sigmoid, hard sigmoid, tanh: ElementwiseFunction.output_range) get their whole
        # range, as softmax does: their outputs are often scores (detection classes, gates) whose rare large
        # values matter most, and an observed range would clip exactly those (docs/experiments.md,
        # "Patterns").
        function = ops.elementwise_function(node)
        bounds = function.output_range if function is not None else None
        if not isinstance(m, PatternMatch) or bounds is None:
            return m
        return PatternMatch(m.pattern, m.nodes, m.inputs,
                            (Target(m.outputs[0].value, "activation", fixed_range=bounds),))


@register_pattern
class SoftmaxPattern(Pattern):
    name = "softmax"
    anchors = ("Softmax",)
    kind = "softmax"

    def match(self, node):
        x = node.inputs[0]
        if not is_float_activation(x):
            return MatchFail("input is not a float activation")
        out = (Target(node.outputs[0], "activation", None, fixed_range=(0.0, 1.0)),)
        if is_masked(x):  # scores + mask: the float input keeps its sentinels, only probabilities are quantized
            return PatternMatch(self.name, (node,), (), out)
        return PatternMatch(self.name, (node,), (_activation(x),), out)
