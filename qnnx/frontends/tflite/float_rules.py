"""Float32 forms of TFLite ops, for ops that are float in the source model (between its own DEQUANTIZE
and QUANTIZE) and for quantized ops no integer rule takes (the driver dequantizes their inputs and
quantizes their outputs, and lists them). Float arithmetic is not TFLite's integer kernel: only the
integer rules are bit-exact claims.

    LOGISTIC -> Sigmoid, TANH -> Tanh, RELU -> Relu, RELU6 -> Clip(0, 6), HARD_SWISH -> HardSwish,
    PRELU -> PRelu, SOFTMAX -> Softmax (beta folded in), ADD / MUL -> Add / Mul (+ fused activation)
"""

from __future__ import annotations

import numpy as np

from qnnx.frontends.tflite.registry import Context, Unsupported, arity, float_rule, options
from qnnx.frontends.tflite.reader import Operator

_UNARY = {"LOGISTIC": "Sigmoid", "TANH": "Tanh", "RELU": "Relu", "HARD_SWISH": "HardSwish"}


@float_rule(*_UNARY)
def unary(op: Operator, ctx: Context):
    arity(op, 1)
    return [ctx.b.op(_UNARY[op.opcode], [ctx.value(op.inputs[0])], hint=op.opcode.lower())]


def _clip(ctx: Context, v, lo: float, hi: float):
    return ctx.b.op("Clip", [v, ctx.b.const(np.float32(lo), "lo"), ctx.b.const(np.float32(hi), "hi")], hint="clip")


@float_rule("RELU6")
def relu6(op, ctx):
    arity(op, 1)
    return [_clip(ctx, ctx.value(op.inputs[0]), 0.0, 6.0)]


@float_rule("PRELU")
def prelu(op, ctx):
    arity(op, 2)
    return [ctx.b.op("PRelu", [ctx.value(op.inputs[0]), ctx.value(op.inputs[1])], hint="prelu")]


@float_rule("SOFTMAX")
def softmax(op, ctx):
    arity(op, 1)
    (beta,) = options(op, "beta")
    x = ctx.value(op.inputs[0])
    if beta != 1.0:
        x = ctx.b.op("Mul", [x, ctx.b.const(np.float32(beta), "beta")], hint="beta")
    return [ctx.b.op("Softmax", [x], axis=-1, hint="softmax")]


_FUSED = {"NONE": None, "RELU": (0.0, np.inf), "RELU6": (0.0, 6.0), "RELU_N1_TO_1": (-1.0, 1.0)}


@float_rule("ADD", "MUL")
def binary(op, ctx):
    arity(op, 2)
    y = ctx.b.op(op.opcode.capitalize(), [ctx.value(op.inputs[0]), ctx.value(op.inputs[1])], hint=op.opcode.lower())
    (act,) = options(op, "fusedActivationFunction")
    bounds = _FUSED.get(ctx.model.enum_name("act", act), "unsupported")
    if bounds == "unsupported":
        raise Unsupported(f"fused activation {ctx.model.enum_name('act', act)}")
    return [y if bounds is None else _clip(ctx, y, *bounds)]
