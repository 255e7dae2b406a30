"""Fake-quantization-to-integer rules for layer normalization, decomposed or as one op.

    LayerNormalization(x, scale, bias)                               -> qnnx.layer_norm
    ReduceMean(x) -> Sub(x, .) = d -> Pow(d, 2) -> ReduceMean -> Add(eps) -> Sqrt -> Div(d, .)
        [-> Mul(gamma)] [-> Add(beta)] -> quantize                   -> qnnx.layer_norm
    the same with d transposed before Pow/Div (ONNX Runtime's transpose optimizer moves the
    Transpose in front of a layer norm there)                        -> Transpose on the integers,
                                                                        then as above
    the same chain with the variance quantized, as ONNX Runtime's QDQ quantizer emits it:
        ReduceMean -> Sub -> Pow -> ReduceMean -> quantize           -> qnnx.variance
        ... Add(eps) on the integers (qnnx.add) ...
        Sqrt(dequantize) -> Div(d, .) [-> Mul(gamma)] [-> Add(beta)] -> quantize
                                                                     -> qnnx.layer_norm(variance=...)

The decomposed chain is matched from its first ReduceMean (the first of its nodes the
topological walk reaches), while every node is still the original float op: the rule checks the
whole chain is a layer norm (both ReduceMeans over the same trailing axes with keepdims, the mean
subtracted from the very input it was taken of, exponent 2, epsilon and gamma/beta constants),
raises ``Unsupported`` with the first violated condition otherwise, and registers the integer
value for the chain's quantized end (the driver turns that quantize into a requantize or
nothing; the float chain becomes dead). When the variance is quantized, the Sqrt is marked with
the matched chain and the normalization is emitted when the walk reaches it, from the
already-integer ``variance + epsilon``.

Tolerance against the QDQ graph: it computes mean, variance and the division in float32 and
qnnx.layer_norm from exact sums in double, so results differ by at most one output quantum,
where a value lies within float32 rounding of a quantization boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from qnnx import numerics
from qnnx.dialect import DOMAIN
from qnnx.frontends.affine import Affine, AffineType
from qnnx.frontends.fq2i_registry import Context, Unsupported, fq2i_rule
from qnnx.ir import const_array

_MARK = "qnnx.fq2i.layer_norm"  # Sqrt.meta key: the chain matched from its first ReduceMean


@dataclass(frozen=True)
class _Chain:
    x: Affine  # the normalized input (per-tensor)
    axis: int  # first normalized axis, negative (-k: the last k axes; the rank may be unknown)
    centered: ir.Value  # d = x - mean(x), float (transposed by ``perm`` when given)
    perm: tuple[int, ...] | None = None  # x - mean is transposed before the variance (ORT's transpose optimizer)

    def input(self, ctx: Context) -> ir.Value:
        """The integer input in the layout the chain normalizes (a Transpose on the integers if needed)."""
        if self.perm is None:
            return self.x.value
        t = ctx.b.op("Transpose", [self.x.value], perm=list(self.perm))
        t.type, t.shape = ir.TensorType(self.x.type.dtype.onnx), self.shape
        return t

    @property
    def shape(self):
        s = self.x.value.shape
        if s is None or self.perm is None:
            return s
        return ir.Shape([s[i] for i in self.perm]) if len(s) == len(self.perm) else None


def _consumers(v: ir.Value, op_type: str) -> list[ir.Node]:
    return [u.node for u in v.uses() if u.node.op_type == op_type and u.node.domain in ("", "ai.onnx")]


def _only(nodes: list[ir.Node], what: str) -> ir.Node:
    if len(nodes) != 1:
        raise Unsupported(f"{what}: found {len(nodes)}")
    return nodes[0]


def _reduce_axes(ctx: Context, node: ir.Node, rank: int | None) -> list[int]:
    """Sorted negative axes of a keepdims ReduceMean (attribute before opset 18, input after)."""
    a = node.attributes
    if "keepdims" in a and not a["keepdims"].value:
        raise Unsupported(f"{node.name}: ReduceMean with keepdims=0")
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = ctx.const(node.inputs[1])
        if axes is None:
            raise Unsupported(f"{node.name}: ReduceMean axes are computed at run time")
        axes = np.asarray(axes).reshape(-1).tolist()
    elif "axes" in a:
        axes = list(a["axes"].value)
    else:
        raise Unsupported(f"{node.name}: ReduceMean over all axes")
    if rank is None and any(int(i) >= 0 for i in axes):
        raise Unsupported(f"{node.name}: ReduceMean over axes {axes} of a tensor of unknown rank")
    return sorted({int(i) - rank if rank is not None and int(i) >= 0 else int(i) for i in axes})


def _real_const(ctx: Context, v: ir.Value | None) -> np.ndarray | None:
    """A float constant, or a dequantized constant — also one the walk has not reached yet (the chain
    is matched from its first node, before the dequantize of a later gamma or epsilon is visited)."""
    c = ctx.real_const(v)
    p = v.producer() if v is not None and c is None else None
    if p is None or p.domain != DOMAIN or p.op_type != "dequantize":
        return c
    q, scale = const_array(p.inputs[0]), const_array(p.inputs[1])
    zp = const_array(p.inputs[2]) if len(p.inputs) > 2 and p.inputs[2] is not None else np.int32(0)
    if q is None or scale is None or zp is None:
        return None
    axis = p.attributes["axis"].value if "axis" in p.attributes else 1
    return numerics.dequantize(np.asarray(q), np.asarray(scale), np.asarray(zp),
                               axis=axis if np.asarray(scale).size > 1 else -1)


def _scalar_const(ctx: Context, v: ir.Value | None) -> float | None:
    c = _real_const(ctx, v)
    return None if c is None or np.asarray(c).size != 1 else float(np.asarray(c).reshape(-1)[0])


def _other_input(node: ir.Node, v: ir.Value) -> ir.Value | None:
    if len(node.inputs) != 2 or v not in node.inputs:
        return None
    return node.inputs[1] if node.inputs[0] is v else node.inputs[0]


def _match_head(node: ir.Node, ctx: Context) -> tuple[_Chain, ir.Node]:
    """ReduceMean(x) -> Sub(x, mean) = d -> Pow(d, 2) -> ReduceMean: the chain and the second ReduceMean."""
    x = ctx.affine(node.inputs[0])
    if not x.type.per_tensor:
        raise Unsupported("layer norm input is quantized per-axis; qnnx.layer_norm needs per-tensor qparams")
    rank = ctx.rank(node.inputs[0])
    mean = node.outputs[0]
    sub = _only([s for s in _consumers(mean, "Sub") if s.inputs[1] is mean],
                "not a layer norm: expected one Sub of the mean")
    if sub.inputs[0] is not node.inputs[0]:
        raise Unsupported("not a layer norm: the mean is subtracted from another tensor than its input")
    d = sub.outputs[0]
    perm = None
    users = [u.node for u in d.uses()]
    if len(users) == 1 and users[0].op_type == "Transpose" and "perm" in users[0].attributes:
        perm = tuple(int(i) for i in users[0].attributes["perm"].value)
        if rank is not None and rank != len(perm):
            raise Unsupported("Transpose perm does not match the input rank")
        rank = len(perm)
        d = users[0].outputs[0]
    axes = _reduce_axes(ctx, node, rank)
    if perm is not None:  # the mean's axes, in the layout the variance is taken in
        axes = sorted(perm.index(a % rank) - rank for a in axes)
    if axes != list(range(axes[0], 0)):
        raise Unsupported(f"mean over axes {axes}: a layer norm reduces trailing axes")
    pows = _consumers(d, "Pow")
    if len(pows) != 1:
        raise Unsupported(f"not a layer norm: expected one Pow of x - mean, found {len(pows)}")
    exponent = _scalar_const(ctx, pows[0].inputs[1])
    if pows[0].inputs[0] is not d or exponent != 2.0:
        raise Unsupported(f"not a layer norm: Pow exponent {exponent} (expected 2)")
    var_node = _only(_consumers(pows[0].outputs[0], "ReduceMean"), "not a layer norm: expected one ReduceMean of "
                                                                    "the squares")
    if _reduce_axes(ctx, var_node, rank) != axes:
        raise Unsupported(f"not a layer norm: the variance reduces axes {_reduce_axes(ctx, var_node, rank)}, "
                          f"the mean {axes}")
    return _Chain(x, axes[0], d, perm), var_node


def _normalized(chain: _Chain, sqrt: ir.Node) -> ir.Value:
    """The Div(d, sqrt) output."""
    div = _only([n for n in _consumers(sqrt.outputs[0], "Div") if n.inputs[1] is sqrt.outputs[0]],
                "not a layer norm: expected one Div by the square root")
    if div.inputs[0] is not chain.centered:
        raise Unsupported("not a layer norm: the Div numerator is not x - mean")
    return div.outputs[0]


def _through_quantize(v: ir.Value) -> ir.Value | None:
    """quantize(v) -> dequantize: the dequantized value (one quantize with one dequantize), else None."""
    qs = [u.node for u in v.uses() if u.node.domain == DOMAIN and u.node.op_type == "quantize"]
    if len(qs) != 1:
        return None
    dqs = [u.node for u in qs[0].outputs[0].uses() if u.node.domain == DOMAIN and u.node.op_type == "dequantize"]
    return dqs[0].outputs[0] if len(dqs) == 1 else None


def _quantized_type(ctx: Context, v: ir.Value) -> AffineType | None:
    try:
        return ctx.output_type(v)
    except Unsupported:
        return None


def _affine_param(chain: _Chain, c: np.ndarray, name: str) -> np.ndarray:
    """gamma/beta as a float32 tensor over the normalized axes only (leading size-1 dims dropped)."""
    c = np.asarray(c, np.float32)
    k = -chain.axis
    if c.ndim > k and all(s == 1 for s in c.shape[:c.ndim - k]):
        c = c.reshape(c.shape[c.ndim - k:])
    shape = chain.shape
    norm = tuple(shape)[chain.axis:] if shape is not None and len(shape) >= k else None
    ok = c.ndim <= k
    if ok and norm is not None and all(isinstance(d, int) for d in norm):
        try:
            ok = np.broadcast_shapes(c.shape, norm) == norm
        except ValueError:
            ok = False
    if not ok:
        raise Unsupported(f"layer norm {name} of shape {c.shape} does not broadcast over the normalized axes only")
    return c


def _check_output_axis(ctx: Context, v: ir.Value, out: AffineType) -> None:
    rank = ctx.rank(v)
    if not out.per_tensor and out.axis != -1 and (rank is None or out.axis % rank != rank - 1):
        raise Unsupported(f"layer norm output is quantized per-axis along axis {out.axis}, not the last")


def _gamma_beta_and_end(ctx: Context, chain: _Chain, z: ir.Value):
    """Optional Mul(gamma) then Add(beta) by constants, up to the first quantized value:
    (gamma, beta, end value, its affine type)."""
    params: dict[str, np.ndarray] = {}
    for op_type, name in (("Mul", "gamma"), ("Add", "beta")):
        users = [u.node for u in z.uses()]
        if _quantized_type(ctx, z) is not None or len(users) != 1 or users[0].op_type != op_type:
            continue
        c = _real_const(ctx, _other_input(users[0], z))
        if c is None:
            raise Unsupported(f"layer norm {name} ({users[0].name}) is not a constant")
        params[name] = _affine_param(chain, c, name)
        z = users[0].outputs[0]
    out = _quantized_type(ctx, z)
    if out is None:
        raise Unsupported("layer norm output is not quantized")
    _check_output_axis(ctx, chain.centered, out)
    return params.get("gamma"), params.get("beta"), z, out


def _layer_norm(ctx: Context, chain: _Chain, out: AffineType, gamma, beta, epsilon: float,
                variance: Affine | None = None) -> ir.Value:
    b = ctx.b
    inputs = [chain.input(ctx), b.const(chain.x.type.scale, "x_scale"),
              b.const(chain.x.type.zero_point.astype(np.int32), "x_zero_point"),
              b.const(out.scale, "y_scale"), b.const(out.zero_point.astype(np.int32), "y_zero_point"),
              None if gamma is None else b.const(gamma, "gamma"), None if beta is None else b.const(beta, "beta")]
    if variance is not None:
        inputs += [variance.value, b.const(variance.type.scale, "variance_scale"),
                   b.const(variance.type.zero_point.astype(np.int32), "variance_zero_point")]
    while inputs[-1] is None:
        inputs.pop()
    y = b.op("layer_norm", inputs, domain=DOMAIN, axis=chain.axis, epsilon=float(epsilon),
             out_dtype=out.dtype.name, rounding="half_even")
    y.shape = chain.shape
    return y


@fq2i_rule("ReduceMean")
def _reduce_mean(node, ctx):
    chain, var_node = _match_head(node, ctx)
    v = var_node.outputs[0]
    var_type = _quantized_type(ctx, v)
    if var_type is not None:  # ORT's QDQ: the variance is quantized; the normalization resumes at the Sqrt
        if not var_type.per_tensor:
            raise Unsupported("the variance is quantized per-axis")
        ve = _through_quantize(v)
        add = _only(_consumers(ve, "Add") if ve is not None else [], "not a layer norm: expected the quantized "
                                                                     "variance plus epsilon")
        eps = _scalar_const(ctx, _other_input(add, ve))
        if eps is None or eps < 0:
            raise Unsupported("not a layer norm: epsilon is not a non-negative scalar constant")
        se = _through_quantize(add.outputs[0])
        sqrt = _only(_consumers(se, "Sqrt") if se is not None else [], "not a layer norm: expected the square root "
                                                                       "of the quantized variance plus epsilon")
        _normalized(chain, sqrt)
        sqrt.meta[_MARK] = chain
        y = ctx.b.op("variance", [chain.input(ctx), ctx.b.const(chain.x.type.scale, "x_scale"),
                                  ctx.b.const(chain.x.type.zero_point.astype(np.int32), "x_zero_point"),
                                  ctx.b.const(var_type.scale, "y_scale"),
                                  ctx.b.const(var_type.zero_point.astype(np.int32), "y_zero_point")],
                     domain=DOMAIN, axis=chain.axis, out_dtype=var_type.dtype.name, rounding="half_even")
        ctx.env[v] = Affine(y, var_type)
        return [None]
    add = _only(_consumers(v, "Add"), "not a layer norm: expected the variance plus epsilon")
    eps = _scalar_const(ctx, _other_input(add, v))
    if eps is None or eps < 0:
        raise Unsupported("not a layer norm: epsilon is not a non-negative scalar constant")
    if _quantized_type(ctx, add.outputs[0]) is not None:
        raise Unsupported("variance + epsilon is quantized without the variance")
    sqrt = _only(_consumers(add.outputs[0], "Sqrt"), "not a layer norm: expected the square root of the variance")
    gamma, beta, end, out = _gamma_beta_and_end(ctx, chain, _normalized(chain, sqrt))
    ctx.env[end] = Affine(_layer_norm(ctx, chain, out, gamma, beta, eps), out)
    return [None]


@fq2i_rule("Sqrt")
def _sqrt(node, ctx):
    chain = node.meta.get(_MARK)
    if chain is None:
        raise Unsupported("Sqrt has an integer rule only inside a layer normalization")
    variance = _per_tensor_variance(ctx.affine(node.inputs[0], "variance"))
    gamma, beta, end, out = _gamma_beta_and_end(ctx, chain, _normalized(chain, node))
    ctx.env[end] = Affine(_layer_norm(ctx, chain, out, gamma, beta, 0.0, variance), out)
    return [None]


def _per_tensor_variance(v: Affine) -> Affine:
    if not v.type.per_tensor:
        raise Unsupported("the variance is quantized per-axis")
    return v


@fq2i_rule("LayerNormalization")
def _layer_normalization(node, ctx):
    x = ctx.affine(node.inputs[0])
    if not x.type.per_tensor:
        raise Unsupported("input is quantized per-axis; qnnx.layer_norm needs per-tensor qparams")
    if any(o is not None and o.uses() for o in node.outputs[1:]):
        raise Unsupported("the Mean / InvStdDev outputs are used")
    rank = ctx.rank(node.inputs[0])
    a = node.attributes
    axis = a["axis"].value if "axis" in a else -1
    if axis >= 0 and rank is None:
        raise Unsupported(f"axis {axis} of an input of unknown rank")
    axis = axis - rank if axis >= 0 else axis
    if "stash_type" in a and a["stash_type"].value != 1:
        raise Unsupported("stash_type other than float32")
    chain = _Chain(x, axis, node.inputs[0])
    params = []
    for i, name in ((1, "scale"), (2, "bias")):
        v = node.inputs[i] if len(node.inputs) > i else None
        c = None if v is None else _real_const(ctx, v)
        if v is not None and c is None:
            raise Unsupported(f"LayerNormalization {name} is not a constant")
        params.append(None if c is None else _affine_param(chain, c, name))
    out = _quantized_type(ctx, node.outputs[0])
    if out is None:
        raise Unsupported("output is not quantized")
    _check_output_axis(ctx, node.inputs[0], out)
    eps = a["epsilon"].value if "epsilon" in a else 1e-5
    y = _layer_norm(ctx, chain, out, params[0], params[1], eps)
    return [Affine(y, out)] + [None] * (len(node.outputs) - 1)
