"""ONNX Runtime's own quantized arithmetic (MLAS, x86-64), step by step in float32.

ORT's fused QLinear kernels do not compute the exact QDQ meaning: each op has its own float32
recipe (ratios of scales rounded to float32, fused multiply-adds, a float zero point added before
rounding, a float exp table). Converting an ORT-quantized model so that it reproduces what ORT
computes needs those recipes as explicit compute modes (``compute="mlas"``); this module holds
them, and :mod:`qnnx.numerics` dispatches to it. Each function states the float32 steps in the
order ORT 1.31's x86-64 kernels perform them; tests check them against ORT bit for bit.

Only what ORT supports is accepted here: 8-bit operands, per-tensor qparams, ties to even.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

F32 = np.float32
SpanKind = Literal["vector", "scalar_a", "scalar_b"]


def fma_f32(x, y, z) -> np.ndarray:
    """``x * y + z`` for float32 values with one rounding, as the FMA instruction computes it.

    The float64 product of two float32 values is exact; the float64 sum is made round-to-odd
    (its inexactness recorded in the last bit), after which rounding to float32 is correct:
    float64 has more than 24 + 2 bits of extra precision.
    """
    x64, y64, z64 = np.broadcast_arrays(*(np.asarray(v, F32).astype(np.float64) for v in (x, y, z)))
    p = x64 * y64
    s = p + z64
    bv = s - p
    err = (p - (s - bv)) + (z64 - bv)  # TwoSum: s + err == p + z exactly
    even = (s.view(np.int64) & 1) == 0
    s = np.where((err != 0) & even, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(F32)


def running_sum_f32(terms) -> np.ndarray:
    """``terms`` added one at a time in float32, in the order given: the loop order ORT's kernels sum in
    (a float32 sum depends on it)."""
    total = None
    for t in terms:
        total = np.asarray(t).astype(F32) if total is None else (total + np.asarray(t).astype(F32)).astype(F32)
    return total


def span_kind(a_shape, b_shape) -> SpanKind:
    """Which MLAS kernel ORT's broadcast loop runs for ``a (op) b``.

    ORT walks the broadcast output in spans along the innermost non-trivial dimension; an input of
    size 1 there is a scalar per span (a different float recipe). Dims are ints, or anything
    else for a size only known at run time (equal objects are equal sizes).
    """
    a, b = list(a_shape), list(b_shape)
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + a, [1] * (n - len(b)) + b
    for da, db in zip(reversed(a), reversed(b)):
        if da == 1 and db == 1:
            continue
        if da == 1:
            return "scalar_a"
        if db == 1:
            return "scalar_b"
        if da == db:
            return "vector"
        raise ValueError(f"cannot tell ORT's broadcast span for shapes {tuple(a_shape)} and {tuple(b_shape)}")
    return "vector"


def add(a, b, sa, za, sb, zb, sy, zy, kind: SpanKind) -> np.ndarray:
    """QLinearAdd before saturation: float32 values that round (ties to even) to the result.

    ``rA = f32(sa / sy)``, ``rB = f32(sb / sy)``; ``fixed = zy - fma(rA, za, rB * zb)``; then
    ``fma(a, rA, fma(b, rB, fixed))`` on the raw (not centered) inputs. An input that is one value
    per span is folded into ``fixed`` with a separate multiply and add; a scalar ``a`` swaps the
    roles of the two inputs (ORT passes the scalar as the second operand).
    """
    if kind == "scalar_a":
        return add(b, a, sb, zb, sa, za, sy, zy, "scalar_b")
    ra, rb = F32(F32(sa) / F32(sy)), F32(F32(sb) / F32(sy))
    fixed = F32(F32(zy) - fma_f32(ra, F32(za), F32(rb * F32(zb))))
    av, bv = np.asarray(a).astype(F32), np.asarray(b).astype(F32)
    if kind == "scalar_b":
        return fma_f32(av, ra, (fixed + bv * rb).astype(F32))
    return fma_f32(av, ra, fma_f32(bv, rb, fixed))


def mul(a, b, sa, za, sb, zb, sy, zy) -> np.ndarray:
    """QLinearMul before saturation: ``f32(f32(f32(a' * b') * f32(f32(sa * sb) / sy)) + zy)``
    with ``a' = a - za``, ``b' = b - zb`` (their product is exact in int32 and in float32)."""
    ratio = F32(F32(F32(sa) * F32(sb)) / F32(sy))
    prod = (np.asarray(a).astype(np.int64) - int(za)) * (np.asarray(b).astype(np.int64) - int(zb))
    return (prod.astype(F32) * ratio + F32(zy)).astype(F32)


def softmax_exp_table(x_scale, reduce_len: int, signed: bool) -> np.ndarray:
    """QLinearSoftmax's float32 exp table, indexed by the input byte after ORT's max shift.

    Entry ``i`` (0..255) is ``f32(exp((i - 255 + k) * x_scale))`` in double, with the headroom
    ``k = max(0, ln(FLT_MAX / reduce_len) - 5) / x_scale`` so that sums cannot overflow; for int8
    inputs entry ``i`` is stored at byte ``uint8(i - 128)``.
    """
    s = np.float64(F32(np.asarray(x_scale).reshape(())))
    shift = max(0.0, float(np.log(np.float64(np.finfo(F32).max) / reduce_len)) - 5.0) / s
    i = np.arange(256, dtype=np.float64)
    values = np.exp((i - 255.0 + shift) * s).astype(F32)
    if not signed:
        return values
    table = np.empty(256, F32)
    table[((np.arange(256) - 128) % 256)] = values
    return table


def softmax(x, x_scale, y_scale, y_zero_point, axis: int) -> np.ndarray:
    """QLinearSoftmax before saturation, along ``axis``.

    uint8: ``e = T[255 - max + x]``; int8: ``e = T[uint8(127 - max + x)]`` (wrapping); the sum of
    ``e`` accumulates in float32 in index order; ``y = f32(f32(e * floor(1 / y_scale)) / sum) + zy``
    — the output scale is used only through ``floor(1 / y_scale)``, computed in float32.

    One deliberate difference: over an axis of length 1 the headroom makes ``e * floor(1/ys)``
    overflow to inf; this saturates to the largest output (a softmax of one element is 1), where
    ORT's uint8 kernel converts inf to an integer (undefined in C++) and returns 0.
    """
    x = np.asarray(x)
    signed = bool(np.issubdtype(x.dtype, np.signedinteger))
    x = np.moveaxis(x, axis, -1).astype(np.int64)
    table = softmax_exp_table(x_scale, x.shape[-1], signed)
    xmax = x.max(axis=-1, keepdims=True)
    idx = ((127 - xmax + x) % 256) if signed else (255 - xmax + x)
    e = table[idx]
    total = running_sum_f32(e[..., k] for k in range(e.shape[-1]))
    inv = F32(np.floor(F32(1.0) / F32(np.asarray(y_scale).reshape(()))))
    with np.errstate(over="ignore"):  # length 1 only: e * inv overflows to inf, which saturates
        v = ((e * inv).astype(F32) / total[..., None]).astype(F32)
    return np.moveaxis(np.rint(v) + np.int64(np.asarray(y_zero_point).reshape(())), -1, axis)


def average_pool(taps, count, y_scale, y_zero_point) -> np.ndarray:
    """QLinearAveragePool before saturation, from the window's dequantized float32 taps in row-major
    kernel order (padding as 0.0, which leaves a float sum unchanged).

    The taps are summed one at a time in float32, divided by the element count, then
    ``f32(f32(y / y_scale) + y_zero_point)`` rounds (ties to even) to the result.
    """
    y = (running_sum_f32(taps) / np.asarray(count, np.float64).astype(F32)).astype(F32)
    return ((y / F32(y_scale)).astype(F32) + F32(y_zero_point)).astype(F32)
