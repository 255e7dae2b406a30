"""Standard-ONNX emitters of the steps in ``qnnx.numerics``.

Each function builds, with a :class:`~qnnx.ir.Builder`, the ONNX ops that
compute exactly what the numerics function of the same name computes, using
only ops ONNX Runtime implements for these types (int64 Mul/Div/Mod/Where,
float32 Floor/Round...). Constants (Q31 multipliers, shifts) are computed
offline with the numerics functions themselves, so there is one definition.

ONNX integer ``Div`` truncates toward zero (C semantics); floor division is
built from it with a remainder correction, never by adding a bias that could
overflow int64.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from qnnx import numerics
from qnnx.dtypes import IntType
from qnnx.errors import QnnxError
from qnnx.ir import Builder

I64 = ir.DataType.INT64
F32 = ir.DataType.FLOAT


def i64(b: Builder, v, hint: str) -> ir.Value:
    return b.const(np.asarray(v, dtype=np.int64), hint)


def f32(b: Builder, v, hint: str) -> ir.Value:
    return b.const(np.asarray(v, dtype=np.float32), hint)


def to_i64(b: Builder, x: ir.Value) -> ir.Value:
    return b.op("Cast", [x], to=I64, hint="as_i64")


def to_f32(b: Builder, x: ir.Value) -> ir.Value:
    return b.op("Cast", [x], to=F32, hint="as_f32")


def bool_to_i64(b: Builder, cond: ir.Value) -> ir.Value:
    return b.op("Cast", [cond], to=I64, hint="bool_i64")


def clamp_i64(b: Builder, x: ir.Value, lo: int, hi: int, hint: str = "clamp") -> ir.Value:
    """``min(max(x, lo), hi)`` on int64 with Where: ONNX Runtime's int64 Clip/Min/Max
    (1.31, CPU) leave values outside the int32 range unclamped."""
    lo_v, hi_v = i64(b, lo, f"{hint}_lo"), i64(b, hi, f"{hint}_hi")
    x = b.op("Where", [b.op("Less", [x, lo_v]), lo_v, x], hint=f"{hint}_low")
    return b.op("Where", [b.op("Greater", [x, hi_v]), hi_v, x], hint=hint)


def saturate_int32(b: Builder, x: ir.Value) -> ir.Value:
    return clamp_i64(b, x, numerics.INT32_MIN, numerics.INT32_MAX, "sat_int32")


def saturate_acc(b: Builder, x: ir.Value, acc_bits: int) -> ir.Value:
    return clamp_i64(b, x, -(1 << (acc_bits - 1)), (1 << (acc_bits - 1)) - 1, f"sat_int{acc_bits}")


def saturate_cast(b: Builder, x: ir.Value, dtype: IntType) -> ir.Value:
    """int64 -> ``dtype`` with clipping to its range (numerics.saturate)."""
    y = clamp_i64(b, x, dtype.qmin, dtype.qmax, f"sat_{dtype.name}")
    return b.op("Cast", [y], to=dtype.onnx, hint=f"to_{dtype.name}")


def reduce(b: Builder, op: str, x: ir.Value, axes: list[int], hint: str) -> ir.Value:
    """ReduceSum/ReduceMax keeping dims, in the form the graph's opset wants (axes became an
    input in opset 13 for ReduceSum and 18 for the others)."""
    opset = b.graph.opset_imports.get("", 18)
    as_input = opset >= (13 if op == "ReduceSum" else 18)
    if as_input:
        return b.op(op, [x, i64(b, axes, "axes")], keepdims=1, hint=hint)
    return b.op(op, [x], axes=list(axes), keepdims=1, hint=hint)


# --------------------------------------------------------------------------- float rounding


def round_float(b: Builder, v: ir.Value, rounding: str, dtype: ir.DataType = F32) -> ir.Value:
    """numerics.round_float on a ``dtype`` (float32 or double) value: exact, no ``+0.5`` on the value."""
    numerics.check_rounding(rounding)
    if rounding == "half_even":
        return b.op("Round", [v], hint="round_half_even")
    half = b.const(np.asarray(0.5, dtype=dtype.numpy()), "half")
    if rounding == "upward":
        f = b.op("Floor", [v], hint="floor")
        up = b.op("GreaterOrEqual", [b.op("Sub", [v, f], hint="frac"), half], hint="frac_ge_half")
        return b.op("Add", [f, b.op("Cast", [up], to=dtype)], hint="round_upward")
    a = b.op("Abs", [v], hint="abs")
    f = b.op("Floor", [a], hint="floor")
    up = b.op("GreaterOrEqual", [b.op("Sub", [a, f], hint="frac"), half], hint="frac_ge_half")
    return b.op("Mul", [b.op("Add", [f, b.op("Cast", [up], to=dtype)]), b.op("Sign", [v])], hint="round_away")


def float_to_i64(b: Builder, r: ir.Value, dtype: ir.DataType = F32) -> ir.Value:
    """numerics._float_to_int64: clamp to +-2**62, then cast."""
    lim = np.asarray(2.0 ** 62, dtype=dtype.numpy())
    return to_i64(b, b.op("Clip", [r, b.const(-lim, "neg_2p62"), b.const(lim, "pos_2p62")], hint="clamp_2p62"))


# --------------------------------------------------------------------------- integer rounding


def floor_div(b: Builder, p: ir.Value, d: np.ndarray) -> tuple[ir.Value, ir.Value]:
    """``(floor(p / d), p - floor * d)`` for int64 ``p`` and positive constant ``d``."""
    dv = i64(b, d, "divisor")
    q = b.op("Div", [p, dv], hint="trunc_div")
    r = b.op("Sub", [p, b.op("Mul", [q, dv])], hint="trunc_rem")
    neg = bool_to_i64(b, b.op("Less", [r, i64(b, 0, "zero")]))
    floor = b.op("Sub", [q, neg], hint="floor_div")
    rem = b.op("Add", [r, b.op("Mul", [neg, dv])], hint="floor_rem")
    return floor, rem


def rounding_right_shift(b: Builder, p: ir.Value, n: np.ndarray, rounding: str) -> ir.Value:
    """numerics.rounding_right_shift for constant shifts ``n >= 1``."""
    n = np.asarray(n, dtype=np.int64)
    assert (n >= 1).all(), "fixed-point requantize always shifts right by at least one bit"
    floor, rem = floor_div(b, p, np.left_shift(np.int64(1), n))
    half = i64(b, np.left_shift(np.int64(1), n - 1), "half")
    above = b.op("Greater", [rem, half], hint="above_half")
    tie = b.op("Equal", [rem, half], hint="tie")
    if rounding == "upward":
        up = b.op("Or", [above, tie])
    elif rounding in ("tonearest", "tflite"):
        up = b.op("Or", [above, b.op("And", [tie, b.op("GreaterOrEqual", [p, i64(b, 0, "zero")])])])
    else:  # half_even
        odd = b.op("Equal", [b.op("Mod", [floor, i64(b, 2, "two")]), i64(b, 1, "one")], hint="odd")
        up = b.op("Or", [above, b.op("And", [tie, odd])])
    return b.op("Add", [floor, bool_to_i64(b, up)], hint="rounded")


def _srdhm(b: Builder, a: ir.Value, m: np.ndarray) -> ir.Value:
    """gemmlowp SaturatingRoundingDoublingHighMul with a positive constant multiplier
    (so the INT32_MIN * INT32_MIN saturation case cannot occur)."""
    ab = b.op("Mul", [a, i64(b, m, "q31_multiplier")], hint="ab")
    nudge = b.op("Where", [b.op("GreaterOrEqual", [ab, i64(b, 0, "zero")]), i64(b, 1 << 30, "nudge_pos"),
                           i64(b, 1 - (1 << 30), "nudge_neg")], hint="nudge")
    return b.op("Div", [b.op("Add", [ab, nudge]), i64(b, 1 << 31, "two_p31")], hint="srdhm")  # truncates


def _rounding_divide_by_pot(b: Builder, x: ir.Value, exponent: np.ndarray) -> ir.Value:
    """gemmlowp RoundingDivideByPOT for constant exponents >= 0."""
    d = np.left_shift(np.int64(1), exponent)
    floor, rem = floor_div(b, x, d)
    threshold = b.op("Add", [i64(b, (d - 1) >> 1, "threshold"),
                             bool_to_i64(b, b.op("Less", [x, i64(b, 0, "zero")]))], hint="threshold")
    return b.op("Add", [floor, bool_to_i64(b, b.op("Greater", [rem, threshold]))], hint="rdbpot")


def scale_and_round(b: Builder, x: ir.Value, multiplier: np.ndarray | ir.Value, *, rounding: str, compute: str,
                    acc_bits: int = 32) -> ir.Value:
    """numerics.scale_and_round: int64 ``x`` times a real multiplier (broadcast-shaped), rounded.

    The multiplier is a constant, or — float compute only — a float64 value computed at run
    time (the float64 -> float32 rounding numerics applies happens here in the graph too)."""
    numerics.check_rounding(rounding)
    numerics.check_compute(compute, numerics.SCALE_COMPUTE_MODES)
    x = saturate_acc(b, x, acc_bits)
    if compute == "float":
        m = (b.op("Cast", [multiplier], to=F32, hint="multiplier_f32") if isinstance(multiplier, ir.Value)
             else f32(b, np.asarray(multiplier).astype(np.float32), "multiplier"))
        v = b.op("Mul", [to_f32(b, x), m], hint="scaled")
        return float_to_i64(b, round_float(b, v, rounding))
    if compute == "double":
        if isinstance(multiplier, ir.Value):
            raise QnnxError("compute='double' needs a constant multiplier")
        f64 = ir.DataType.DOUBLE
        v = b.op("Mul", [b.op("Cast", [x], to=f64, hint="acc_f64"),
                         b.const(np.asarray(multiplier, np.float64), "multiplier_f64")], hint="scaled_f64")
        return float_to_i64(b, round_float(b, v, rounding, f64), f64)
    if isinstance(multiplier, ir.Value):
        raise QnnxError("fixed_point needs a constant multiplier (static shapes): use compute='float' "
                        "or give the model static dims")
    m, shift = numerics.quantize_multiplier(multiplier)
    if compute == "fixed_point_q15":
        m15, shift = numerics.q15_multiplier(m, shift)
        return rounding_right_shift(b, b.op("Mul", [x, i64(b, m15, "q15_multiplier")], hint="product"), 15 - shift,
                                    rounding)
    if rounding == "tflite":
        return multiply_by_quantized_multiplier(b, x, m, shift, acc_bits)
    return rounding_right_shift(b, b.op("Mul", [x, i64(b, m, "q31_multiplier")], hint="product"), 31 - shift,
                                rounding)


def multiply_by_quantized_multiplier(b: Builder, x: ir.Value, m: np.ndarray, shift: np.ndarray,
                                     acc_bits: int = 32) -> ir.Value:
    """numerics.multiply_by_quantized_multiplier with rounding "tflite" for a constant multiplier
    ``m`` (any positive int32, normalized or not) and shift."""
    left, right = np.maximum(shift, 0), np.maximum(-shift, 0)
    if left.any():
        x = saturate_acc(b, b.op("Mul", [x, i64(b, np.left_shift(np.int64(1), left), "left_shift")]), acc_bits)
    return _rounding_divide_by_pot(b, _srdhm(b, x, m), right)


def tflite_average(b: Builder, sums: ir.Value, count: np.ndarray) -> ir.Value:
    """numerics.tflite_average: int64 ``sums`` over positive constant ``count``, C division after
    adding ``count // 2`` away from zero (ONNX's integer Div truncates toward zero, as C's does)."""
    n = i64(b, count, "count")
    half = i64(b, np.asarray(count, np.int64) // 2, "half_count")
    up = b.op("Div", [b.op("Add", [sums, half]), n], hint="avg_pos")
    down = b.op("Div", [b.op("Sub", [sums, half]), n], hint="avg_neg")
    return b.op("Where", [b.op("Greater", [sums, i64(b, 0, "zero")]), up, down], hint="tflite_average")


# --------------------------------------------------------------------------- gemmlowp fixed point, both operands computed


def pow2(b: Builder, e: ir.Value) -> ir.Value:
    """``2**e`` for int64 ``e`` in [0, 62] (a Gather from the table of powers)."""
    return b.op("Gather", [i64(b, np.left_shift(np.int64(1), np.arange(63, dtype=np.int64)), "powers_of_two"), e],
                axis=0, hint="pow2")


def srdhm_var(b: Builder, x: ir.Value, y: ir.Value) -> ir.Value:
    """numerics._srdhm of two int64 values holding int32 (the INT32_MIN * INT32_MIN case, which the
    softmax never reaches: one operand is a positive reciprocal, saturates there too)."""
    ab = b.op("Mul", [x, y], hint="ab")
    nudge = b.op("Where", [b.op("GreaterOrEqual", [ab, i64(b, 0, "zero")]), i64(b, 1 << 30, "nudge_pos"),
                           i64(b, 1 - (1 << 30), "nudge_neg")], hint="nudge")
    q = b.op("Div", [b.op("Add", [ab, nudge]), i64(b, 1 << 31, "two_p31")], hint="srdhm")
    both_min = b.op("And", [b.op("Equal", [x, i64(b, numerics.INT32_MIN, "int32_min")]),
                            b.op("Equal", [y, i64(b, numerics.INT32_MIN, "int32_min")])])
    return b.op("Where", [both_min, i64(b, numerics.INT32_MAX, "int32_max"), q], hint="srdhm_sat")


def rounding_divide_by_pot_var(b: Builder, x: ir.Value, exponent: ir.Value) -> ir.Value:
    """gemmlowp RoundingDivideByPOT with a computed exponent in [0, 62]."""
    d = pow2(b, exponent)
    q = b.op("Div", [x, d], hint="trunc_div")
    r = b.op("Sub", [x, b.op("Mul", [q, d])], hint="trunc_rem")
    neg = bool_to_i64(b, b.op("Less", [r, i64(b, 0, "zero")]))
    floor = b.op("Sub", [q, neg], hint="floor_div")
    rem = b.op("Add", [r, b.op("Mul", [neg, d])], hint="floor_rem")
    threshold = b.op("Add", [b.op("Div", [b.op("Sub", [d, i64(b, 1, "one")]), i64(b, 2, "two")]),
                             bool_to_i64(b, b.op("Less", [x, i64(b, 0, "zero")]))], hint="threshold")
    return b.op("Add", [floor, bool_to_i64(b, b.op("Greater", [rem, threshold]))], hint="rdbpot")


def saturating_shift_left(b: Builder, x: ir.Value, e: int) -> ir.Value:
    """numerics.saturating_shift_left (gemmlowp SaturatingRoundingMultiplyByPOT<e>, e > 0)."""
    threshold = (1 << (31 - e)) - 1
    y = b.op("Mul", [x, i64(b, 1 << e, "shift")], hint="shifted")
    y = b.op("Where", [b.op("Greater", [x, i64(b, threshold, "threshold")]), i64(b, numerics.INT32_MAX, "int32_max"), y])
    return b.op("Where", [b.op("Less", [x, i64(b, -threshold, "neg_threshold")]), i64(b, numerics.INT32_MIN, "int32_min"), y],
                hint="sat_shift")


def one_over_one_plus_x(b: Builder, a: ir.Value) -> ir.Value:
    """numerics.one_over_one_plus_x for int64 ``a`` in [0, 2**31) (so the half sum is non-negative)."""
    half = b.op("Div", [b.op("Add", [a, i64(b, numerics.INT32_MAX + 1, "max_plus_one")]), i64(b, 2, "two")],
                hint="half_denominator")
    x = b.op("Add", [i64(b, 1515870810, "c48_17"), srdhm_var(b, half, i64(b, -1010580540, "c_neg32_17"))], hint="x0")
    for _ in range(3):
        residual = b.op("Sub", [i64(b, 1 << 29, "one_q2"), srdhm_var(b, half, x)], hint="one_minus")
        x = b.op("Add", [x, saturating_shift_left(b, srdhm_var(b, x, residual), 2)], hint="newton")
    return saturating_shift_left(b, x, 1)
