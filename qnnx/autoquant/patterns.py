"""Quantization patterns: which float subgraphs become integer, and which of their values
carry qparams.

A pattern is one registered class (``@register_pattern``) with

- ``match(node, ctx)``: anchored on one op type; returns a :class:`PatternMatch` or a
  :class:`MatchFail` whose reason is recorded (why the node stays float);
- ``simulate(match, ...)``: the pattern in affine space — ``qnnx.simulated_quantize`` /
  ``simulated_dequantize`` around it with qparams as graph inputs (:mod:`qnnx.autoquant.qdq`);
- ``realize(match, ...)``: QuantizeLinear/DequantizeLinear with the chosen qparams; the
  integer ``qnnx`` ops then come from fake-quantization-to-integer (``qnnx.from_qdq``), which
  also expands affine regions through the allow-list (relu, maxpool, reshape, ...) and
  consolidates dequantize -> quantize into requantize.

Built-ins:

    Conv(x, W[, b]) [-> Relu | Clip]          x: activation, W: per-channel axis 0, out after the activation
    ConvTranspose(x, W[, b]) [-> Relu | Clip] W per-channel on axis 1
    MatMul(x, W) / Gemm(x, W[, b])            W: per-column; activation x activation MatMul too
    Add / Sub / Mul (residuals included)      both inputs and the output
    AveragePool / GlobalAveragePool, Concat   inputs and output
    Sigmoid, HardSigmoid, HardSwish, Tanh,
    LeakyRelu, Exp, Erf, Gelu, Elu, Softplus  input and output (a lookup table once integer)
    Softmax                                   input; output fixed to [0, 1] (the full activation range)
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

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

    def match(self, node: ir.Node) -> PatternMatch | MatchFail:
        raise NotImplementedError


PATTERNS: list[Pattern] = []


def register_pattern(cls: type[Pattern]) -> type[Pattern]:
    PATTERNS.append(cls())
    return cls


def patterns_for(op_type: str) -> list[Pattern]:
    return [p for p in PATTERNS if op_type in p.anchors]


# --------------------------------------------------------------------------- helpers


def _activation(v: ir.Value) -> Target:
    return Target(v, "activation")


def _is_float_activation(v: ir.Value | None) -> bool:
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
    if nxt is None or nxt.domain not in ("", "ai.onnx"):
        return None
    if nxt.op_type == "Relu":
        return nxt
    if nxt.op_type == "Clip" and all(v is None or const_array(v) is not None for v in nxt.inputs[1:]):
        return nxt
    return None


# --------------------------------------------------------------------------- built-ins


class _WeightedPattern(Pattern):
    weight_axis = 0

    def match(self, node):
        x, w = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
        if not _is_float_activation(x):
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


@register_pattern
class ConvTransposePattern(_WeightedPattern):
    name = "conv_transpose"
    anchors = ("ConvTranspose",)
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

    def match(self, node):
        a, b = node.inputs
        if not _is_float_activation(a):
            return MatchFail("input A is not a float activation")
        w = const_array(b)
        if w is not None:
            if w.ndim != 2:
                return MatchFail(f"constant B of rank {w.ndim}; per-column weights need rank 2")
            return PatternMatch(self.name, (node,), (_activation(a), Target(b, "weight", 1)),
                                (_activation(node.outputs[0]),))
        if not _is_float_activation(b):
            return MatchFail("input B is neither constant nor a float activation")
        return PatternMatch(self.name, (node,), (_activation(a), _activation(b)), (_activation(node.outputs[0]),))


@register_pattern
class GemmPattern(Pattern):
    name = "gemm"
    anchors = ("Gemm",)

    def match(self, node):
        at = {k: v.value for k, v in node.attributes.items()}
        if at.get("alpha", 1.0) != 1.0 or at.get("beta", 1.0) != 1.0 or at.get("transA", 0):
            return MatchFail("Gemm with alpha/beta != 1 or transA")
        a, b = node.inputs[0], node.inputs[1]
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        if not _is_float_activation(a) or const_array(b) is None:
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
            elif _is_float_activation(v):
                targets.append(_activation(v))
            else:
                return MatchFail("an input is not a float tensor")
        if not any(t.role == "activation" for t in targets):
            return MatchFail("no activation input (constant subgraph)")
        return PatternMatch(self.name, (node,), tuple(targets), (_activation(node.outputs[0]),))


@register_pattern
class BinaryPattern(_AllActivationsPattern):
    name = "binary"
    anchors = ("Add", "Sub", "Mul")


@register_pattern
class PoolPattern(_AllActivationsPattern):
    name = "pool"
    anchors = ("AveragePool", "GlobalAveragePool")


@register_pattern
class ConcatPattern(_AllActivationsPattern):
    name = "concat"
    anchors = ("Concat",)


@register_pattern
class ElementwisePattern(_AllActivationsPattern):
    name = "elementwise"
    anchors = ("Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "LeakyRelu", "Exp", "Erf", "Gelu", "Elu", "Softplus")


@register_pattern
class SoftmaxPattern(Pattern):
    name = "softmax"
    anchors = ("Softmax",)

    def match(self, node):
        x = node.inputs[0]
        if not _is_float_activation(x):
            return MatchFail("input is not a float activation")
        return PatternMatch(self.name, (node,), (_activation(x),),
                            (Target(node.outputs[0], "activation", None, fixed_range=(0.0, 1.0)),))
