"""Fake-quantization-to-integer of the erf GELU written out as five float ops (torch before opset 20):

    DQ(x) -> Div(sqrt2) | Mul(1/sqrt2) -> Erf -> Add(1) -> Mul(x) -> Mul(0.5) -> Q   -> qnnx.lut
    DQ(x) -> ... -> Add(1) -> Mul(Mul(x, 0.5)) -> Q                                 -> qnnx.lut

This is how autoquant's ``gelu`` pattern realizes it (quantized input and output, float inside),
and the integer form is the same 256-entry table as the ``Gelu`` op's. The chain is matched from
its first node the walk reaches, the Div (or Mul by 1/sqrt2), while it is still float: the rule
checks the whole chain, records the table lookup for the chain's quantized end (that quantize
becomes a requantize or nothing) and leaves the float chain dead. Anything else falls back to the
op's own rule (Div/Mul by a positive constant: a type change).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from qnnx import ops
from qnnx.dialect import DOMAIN
from qnnx.frontends import fq2i_rules
from qnnx.frontends.affine import Affine
from qnnx.frontends.fq2i_registry import FQ2I_RULES, Context, Unsupported, fq2i_rule
from qnnx.frontends.tables import lookup_table

_SQRT1_2 = float(1 / np.sqrt(2.0))


def _scalar(ctx: Context, v: ir.Value | None) -> float | None:
    c = ctx.real_const(v) if v is not None else None
    return float(np.asarray(c).reshape(-1)[0]) if c is not None and np.asarray(c).size == 1 else None


def _sole_user(v: ir.Value, op_type: str) -> ir.Node | None:
    users = [u.node for u in v.uses()]
    if len(users) != 1 or v.is_graph_output() or users[0].op_type != op_type:
        return None
    return users[0]


def _other(node: ir.Node, v: ir.Value) -> ir.Value | None:
    a, b = node.inputs[0], node.inputs[1]
    return b if a is v else a if b is v else None


def _gelu_end(node: ir.Node, ctx: Context) -> tuple[ir.Value, ir.Value] | None:
    """(x, the chain's last value) when ``node`` starts an erf GELU of ``x``; None otherwise."""
    x = node.inputs[0]
    k = _scalar(ctx, node.inputs[1])
    if node.op_type == "Mul" and k is None:
        x, k = node.inputs[1], _scalar(ctx, node.inputs[0])
    if k is None or not np.isclose(1.0 / k if node.op_type == "Div" else k, _SQRT1_2, rtol=1e-5):
        return None
    erf = _sole_user(node.outputs[0], "Erf")
    add = _sole_user(erf.outputs[0], "Add") if erf is not None else None
    if add is None or _scalar(ctx, _other(add, erf.outputs[0])) != 1.0:
        return None
    mul = _sole_user(add.outputs[0], "Mul")
    if mul is None:
        return None
    other = _other(mul, add.outputs[0])
    if other is x:
        half = _sole_user(mul.outputs[0], "Mul")
        ok = half is not None and _scalar(ctx, _other(half, mul.outputs[0])) == 0.5
        return (x, half.outputs[0]) if ok else None
    half = other.producer() if other is not None else None
    if half is None or half.op_type != "Mul" or _other(half, x) is None or _scalar(ctx, _other(half, x)) != 0.5:
        return None
    return x, mul.outputs[0]


def _with_gelu(fallback):
    def rule(node, ctx):
        chain = _gelu_end(node, ctx) if len(node.inputs) == 2 else None
        if chain is None or not ctx.has_affine(chain[0]):
            return fallback(node, ctx)
        x = fq2i_rules.lut_input(ctx.affine(chain[0]))
        out = ctx.output_type(chain[1])
        if not out.per_tensor:
            raise Unsupported("per-axis output qparams")
        table = lookup_table(ops.facts("Gelu").function.numpy, x.type, out, {})
        ctx.env[chain[1]] = Affine(ctx.b.op("lut", [x.value, ctx.b.const(table, "gelu_table")], domain=DOMAIN), out)
        return [None]

    rule.__doc__ = f"erf GELU chain, else {fallback.__name__}"
    return rule


# Registered over the Div / Mul rules, which the chain's first node would otherwise meet.
fq2i_rule("Div")(_with_gelu(FQ2I_RULES["Div"]))
fq2i_rule("Mul")(_with_gelu(FQ2I_RULES["Mul"]))
