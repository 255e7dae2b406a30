"""Reference integer numerics: the single source of truth.

Every kernel, lowering and export in qnnx is tested against these functions.
They are plain numpy, vectorised, and exact: integer paths run in int64 with
explicit saturation, float paths in IEEE float32 with one rounding per step in
the order written here (so an ONNX graph doing the same steps is bit-identical).

Affine quantization: ``q = clip(round(r / scale) + zero_point)``,
``r = (q - zero_point) * scale``. ``scale``/``zero_point`` are scalars or 1-D
arrays along ``axis`` (per-axis), or full-rank arrays with ``block_size``
(blocked).

Rounding modes (how a value exactly halfway between two integers goes):

``"half_even"``  to the even neighbour (ONNX QuantizeLinear, ORT, numpy.rint).
``"upward"``     toward +inf (TVM's default ``UPWARD``).
``"tonearest"``  away from zero (TVM ``TONEAREST``, C ``round``).
``"tflite"``     TFLite/gemmlowp: in fixed point, the Q31 *double rounding* of
                 ``MultiplyByQuantizedMultiplier`` (saturating rounding
                 doubling high multiply, then rounding divide by a power of
                 two); in float math, away from zero (``TfLiteRound``).

Compute modes of a requantization by ``m = input_scale / output_scale``:

``"fixed_point"`` ``m`` becomes a Q31 multiplier and a shift (``frexp``, as
                  TFLite's ``QuantizeMultiplier``); ``x * M`` is exact in int64
                  and rounded once by the mode (twice for ``tflite``).
``"float"``       ``float32(x) * float32(m)`` in float32, then rounded by the
                  mode (the arithmetic of ORT's QLinear kernels).
``"fixed_point_q15"`` requantize and concat only: the Q31 multiplier reduced to Q15
                  (``(M + 2**15) >> 16``, 0x7FFF at most), ``x * M15`` exact in int64 and
                  rounded once by the mode: with ``upward`` this is TFLite's
                  ``MultiplyByQuantizedMultiplier`` for int64 accumulators (its 16x8 conv,
                  depthwise conv and fully connected kernels with an int64 bias).
``"double"``      requantize and concat only: ``float64(x) * m`` with the float64 multiplier, then
                  rounded by the mode: TFLite's per-channel FULLY_CONNECTED reference kernel
                  (``round(double(acc) * effective_output_scale)``, ``tflite`` rounding).
``"tflite"``      mul: the Q31 multiplier of ``sa * sb / sy`` computed in float32 (TFLite's MUL).
                  avg_pool and global_avg_pool: TFLite's AVERAGE_POOL_2D (the raw window
                  sum, zero point included, divided by the count in integers, ties away from
                  zero: :func:`tflite_average`) and MEAN (the count divided into the Q31
                  multiplier: :func:`tflite_mean_multiplier`).
``"mlas"``        add, mul, softmax and avg_pool only: ONNX Runtime's QLinearAdd /
                  QLinearMul / QLinearSoftmax / QLinearAveragePool float32 recipes on x86-64, step by step
                  (:mod:`qnnx.numerics_mlas`), so an ORT-quantized model converts to a
                  canonical model that computes what ORT computes. 8-bit, per-tensor,
                  ``half_even`` only, as in ORT.
``"qdq"``         requantize and concat only: :func:`dequantize` then :func:`quantize`,
                  ``round(float32(float32(x - zi) * si) / so)`` — what a DequantizeLinear ->
                  QuantizeLinear pair computes. It differs from ``"float"`` where the two float32
                  roundings and the one of ``si / so`` fall differently, e.g. at exact ties
                  (255 quanta of 16/255 in 32/255 are 127.5: ``"float"`` multiplies by 0.5
                  and gives 128, the pair divides 16.0 by float32(32/255) and gives 127).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from qnnx import numerics_mlas
from qnnx.dtypes import IntType, as_int64, int_type
from qnnx.errors import QnnxError

Rounding = Literal["tflite", "upward", "tonearest", "half_even"]
Compute = Literal["fixed_point", "float"]
ROUNDING_MODES: tuple[str, ...] = ("tflite", "upward", "tonearest", "half_even")
COMPUTE_MODES: tuple[str, ...] = ("fixed_point", "float")
REQUANTIZE_COMPUTE_MODES: tuple[str, ...] = (*COMPUTE_MODES, "qdq", "fixed_point_q15", "double")
BINARY_COMPUTE_MODES: tuple[str, ...] = (*COMPUTE_MODES, "mlas")  # add and mul: ORT's QLinearAdd/Mul too
MUL_COMPUTE_MODES: tuple[str, ...] = (*BINARY_COMPUTE_MODES, "tflite")  # mul: TFLite's float32 multiplier too
SOFTMAX_COMPUTE_MODES: tuple[str, ...] = ("exact", "mlas", "tflite")
AVG_POOL_COMPUTE_MODES: tuple[str, ...] = (*COMPUTE_MODES, "mlas", "tflite")
GLOBAL_POOL_COMPUTE_MODES: tuple[str, ...] = (*COMPUTE_MODES, "tflite")
SCALE_COMPUTE_MODES: tuple[str, ...] = (*COMPUTE_MODES, "fixed_point_q15", "double")  # what scale_and_round takes

MUL_ACC_BITS = 33  # |a' * b'| < 2**32 for centered 16-bit operands
INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1


# --------------------------------------------------------------------------- checks


def check_rounding(rounding: str) -> str:
    if rounding not in ROUNDING_MODES:
        raise QnnxError(f"unknown rounding {rounding!r}; expected one of {', '.join(ROUNDING_MODES)}")
    return rounding


def check_compute(compute: str, modes: tuple[str, ...] = COMPUTE_MODES) -> str:
    if compute not in modes:
        raise QnnxError(f"unknown compute {compute!r}; expected one of {', '.join(modes)}")
    return compute


def check_scale(scale, name: str = "scale") -> np.ndarray:
    """Scales must be positive, finite, normal floats: a zero, NaN or denormal scale is never silently used."""
    s = np.asarray(scale)
    if s.dtype.kind != "f":
        raise QnnxError(f"{name} must be a float tensor, got dtype {s.dtype}")
    if s.size == 0:
        raise QnnxError(f"{name} is empty")
    bad = ~(np.isfinite(s) & (s > 0))
    if bad.any():
        idx = np.argwhere(bad)[0]
        where = f" at index {tuple(int(i) for i in idx)}" if s.ndim else ""
        raise QnnxError(f"{name} must be positive and finite, got {s[tuple(idx)]!r}{where}")
    tiny = s < np.finfo(np.float32).tiny  # a float32 denormal: 1/scale overflows float32
    if tiny.any():
        idx = np.argwhere(tiny)[0]
        where = f" at index {tuple(int(i) for i in idx)}" if s.ndim else ""
        raise QnnxError(f"{name} must be at least {np.finfo(np.float32).tiny:.4g} (the smallest normal float32: "
                        f"below it 1/scale overflows), got {s[tuple(idx)]!r}{where}")
    return s


def check_zero_point(zero_point, dtype: IntType, name: str = "zero_point") -> np.ndarray:
    z = np.asarray(zero_point)
    if z.dtype.kind not in "iu" and not (z.dtype.kind == "V" and z.dtype.itemsize == 1):
        if z.dtype.kind == "f" and np.all(np.isfinite(z)) and np.all(z == np.round(z)):
            z = z.astype(np.int64)
        else:
            raise QnnxError(f"{name} must be an integer tensor, got dtype {z.dtype}")
    z = as_int64(z)
    bad = (z < dtype.qmin) | (z > dtype.qmax)
    if bad.any():
        v = int(z[tuple(np.argwhere(bad)[0])]) if z.ndim else int(z)
        raise QnnxError(f"{name} {v} is outside the {dtype.name} range [{dtype.qmin}, {dtype.qmax}]")
    return z


def depthwise_per_output(p, n_out: int) -> np.ndarray:
    """A depthwise conv's per-input-channel values ``p`` (C of them: x's scales or zero points) for each of its
    ``n_out`` output channels: output channel o reads input channel ``o // (n_out / C)``."""
    p = np.asarray(p).reshape(-1)
    if n_out % p.size:
        raise QnnxError(f"{n_out} output channels cannot read {p.size} input channels depthwise")
    return np.repeat(p, n_out // p.size)


def normalize_axis(axis: int, ndim: int, name: str = "axis") -> int:
    if not -ndim <= axis < ndim:
        raise QnnxError(f"{name}={axis} is out of range for a rank-{ndim} tensor")
    return axis % ndim


def broadcast_param(p: np.ndarray, shape: tuple[int, ...], axis: int, block_size: int = 0,
                    name: str = "scale") -> np.ndarray:
    """Reshape a scalar, per-axis (1-D) or blocked (full-rank) qparam to broadcast against ``shape``."""
    p = np.asarray(p)
    ndim = len(shape)
    if p.ndim == 0 or (p.ndim == 1 and p.size == 1 and not block_size):
        return p.reshape(())
    if ndim == 0:
        raise QnnxError(f"{name} has {p.size} values but the tensor is a scalar")
    ax = normalize_axis(axis, ndim)
    if block_size:
        if block_size < 0:
            raise QnnxError(f"block_size must be positive, got {block_size}")
        expect = tuple(-(-d // block_size) if i == ax else d for i, d in enumerate(shape))
        if p.shape != expect:
            raise QnnxError(f"blocked {name} has shape {p.shape}, expected {expect} "
                            f"for input shape {shape}, axis={axis}, block_size={block_size}")
        return np.repeat(p, block_size, axis=ax).take(np.arange(shape[ax]), axis=ax)
    if p.ndim != 1:
        raise QnnxError(f"{name} must be a scalar or 1-D (per-axis), got shape {p.shape}")
    if p.size != shape[ax]:
        raise QnnxError(f"{name} has {p.size} values but axis {axis} of shape {shape} has {shape[ax]}")
    dims = [1] * ndim
    dims[ax] = p.size
    return p.reshape(dims)


# --------------------------------------------------------------------------- rounding


def round_float(v: np.ndarray, rounding: str) -> np.ndarray:
    """Round float values to integers (still float), ties resolved by ``rounding``.

    Exact for every finite input: ``v - floor(v)`` is representable, so no
    ``+0.5`` is ever added to a value (which would round it a second time).
    """
    check_rounding(rounding)
    v = np.asarray(v)
    if rounding == "half_even":
        return np.rint(v)
    with np.errstate(invalid="ignore"):  # inf - inf = nan in the tie test; inf itself is kept
        if rounding == "upward":
            f = np.floor(v)
            return f + (v - f >= 0.5).astype(v.dtype)
        a = np.abs(v)  # tonearest and tflite: ties away from zero
        f = np.floor(a)
        return np.copysign(f + (a - f >= 0.5).astype(v.dtype), v)


def rounding_right_shift(p: np.ndarray, n: np.ndarray, rounding: str) -> np.ndarray:
    """``round(p / 2**n)`` for int64 ``p`` and ``n >= 0``, ties resolved by ``rounding``.

    ``tflite`` here means gemmlowp's RoundingDivideByPOT: ties away from zero.
    """
    p = np.asarray(p, dtype=np.int64)
    n = np.asarray(n, dtype=np.int64)
    floor = p >> n
    rem = p - (floor << n)
    half = np.where(n > 0, np.left_shift(np.int64(1), np.maximum(n - 1, 0)), 0)
    above = rem > half
    tie = (rem == half) & (n > 0)
    if rounding == "upward":
        up = above | tie
    elif rounding in ("tonearest", "tflite"):
        up = above | (tie & (p >= 0))
    elif rounding == "half_even":
        up = above | (tie & ((floor & 1) == 1))
    else:
        check_rounding(rounding)
        raise AssertionError
    return floor + up.astype(np.int64)


# --------------------------------------------------------------------------- fixed point


def quantize_multiplier(real) -> tuple[np.ndarray, np.ndarray]:
    """Q31 multiplier and power-of-two shift with ``real ~= M * 2**(shift - 31)``.

    As TFLite's ``QuantizeMultiplier``: ``frexp`` gives ``q`` in [0.5, 1);
    ``M = round(q * 2**31)`` (ties away from zero); ``M == 2**31`` renormalises;
    shifts below -31 flush to zero and above 30 saturate.
    """
    real = np.asarray(real, dtype=np.float64)
    q, shift = np.frexp(real)
    # q * 2**31 is exact in float64 and below 2**31, so adding 0.5 is exact too.
    m = np.trunc(np.abs(q) * float(1 << 31) + 0.5).astype(np.int64)
    renorm = m == (1 << 31)
    m = np.where(renorm, m >> 1, m)
    shift = shift.astype(np.int64) + renorm
    flush = shift < -31
    m = np.where(flush, 0, m)
    shift = np.where(flush, 0, shift)
    big = shift > 30
    m = np.where(big, INT32_MAX, m)
    shift = np.where(big, 30, shift)
    return m, shift


def saturate_acc(x: np.ndarray, acc_bits: int) -> np.ndarray:
    """Clamp to a signed ``acc_bits``-bit accumulator (32, or 33 for products of two 16-bit values)."""
    return np.clip(x, -(1 << (acc_bits - 1)), (1 << (acc_bits - 1)) - 1)


def _srdhm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """gemmlowp SaturatingRoundingDoublingHighMul on int32 values held in int64."""
    ab = a * b
    nudge = np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    t = ab + nudge
    # C++ integer division truncates toward zero.
    q = np.where(t >= 0, t >> 31, -((-t) >> 31))
    return np.where((a == INT32_MIN) & (b == INT32_MIN), INT32_MAX, q)


def _rounding_divide_by_pot(x: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """gemmlowp RoundingDivideByPOT (ties away from zero)."""
    mask = (np.int64(1) << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def rounding_divide_by_pot(x, exponent) -> np.ndarray:
    """gemmlowp RoundingDivideByPOT of integers (held in int64) by ``2**exponent``: ties away from zero."""
    return _rounding_divide_by_pot(np.asarray(x, np.int64), np.asarray(exponent, np.int64))


def multiply_by_quantized_multiplier(x: np.ndarray, multiplier: np.ndarray, shift: np.ndarray,
                                     rounding: str, acc_bits: int = 32) -> np.ndarray:
    """``round(x * M * 2**(shift-31))`` for ``x`` in a signed ``acc_bits``-bit accumulator.

    ``tflite``: TFLite's MultiplyByQuantizedMultiplier (the left shift saturates
    in the accumulator instead of overflowing). Other modes: the exact int64
    product rounded once by ``rounding``. ``acc_bits <= 33`` keeps every product
    below 2**63.
    """
    x = saturate_acc(np.asarray(x, dtype=np.int64), acc_bits)
    multiplier = np.asarray(multiplier, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    if rounding == "tflite":
        left = np.maximum(shift, 0)
        right = np.maximum(-shift, 0)
        return _rounding_divide_by_pot(_srdhm(saturate_acc(x << left, acc_bits), multiplier), right)
    return rounding_right_shift(x * multiplier, 31 - shift, rounding)


def requantize_multiplier(input_scale, output_scale) -> np.ndarray:
    """``input_scale / output_scale`` in float64, as TFLite computes its real multipliers.

    The float compute mode rounds it to float32, which gives the correctly
    rounded float32 quotient (float64 has more than twice float32's precision).
    """
    return np.asarray(input_scale, np.float64) / np.asarray(output_scale, np.float64)


def scale_and_round(x: np.ndarray, multiplier, *, rounding: str, compute: str, acc_bits: int = 32) -> np.ndarray:
    """``round(x * multiplier)`` for int64 ``x`` (int32 range) and a positive float64 ``multiplier``.

    The shared core of requantize, add, mul, pooling and concat; the multiplier
    broadcasts against ``x`` (per-axis, or even per-element). ``x`` saturates to
    a signed ``acc_bits``-bit accumulator first (32 everywhere but mul).
    """
    check_rounding(rounding)
    check_compute(compute, SCALE_COMPUTE_MODES)
    x = saturate_acc(np.asarray(x, dtype=np.int64), acc_bits)
    if compute == "float":
        v = x.astype(np.float32) * np.asarray(multiplier, dtype=np.float32)
        return _float_to_int64(round_float(v, rounding))
    if compute == "double":
        return _float_to_int64(round_float(x.astype(np.float64) * np.asarray(multiplier, np.float64), rounding))
    m, shift = quantize_multiplier(multiplier)
    if compute == "fixed_point_q15":
        m15, shift = q15_multiplier(m, shift)
        return rounding_right_shift(x * m15, 15 - shift, rounding)
    return multiply_by_quantized_multiplier(x, m, shift, rounding, acc_bits)


def q15_multiplier(m, shift) -> tuple[np.ndarray, np.ndarray]:
    """TFLite's Q31 -> Q15 reduction of a multiplier for int64 accumulators: ``(M + 2**15) >> 16``,
    0x7FFF from ``M >= 0x7FFF0000`` on (so the rounding never carries into bit 15). The shift must
    stay at most 14 (TFLite asserts below 8) so that at least one bit is rounded away."""
    m, shift = np.asarray(m, np.int64), np.asarray(shift, np.int64)
    if (shift > 14).any():
        raise QnnxError(f"fixed_point_q15 needs a multiplier below 2**14, got shift {int(shift.max())}")
    return np.where(m < 0x7FFF0000, (m + (1 << 15)) >> 16, 0x7FFF), shift


def tflite_average(sums: np.ndarray, count) -> np.ndarray:
    """TFLite's integer average of a window: ``sums / count`` in C integer division after adding
    ``count // 2`` away from zero (ties away from zero). ``sums`` are raw sums, zero point included."""
    s = np.asarray(sums, np.int64)
    n = np.asarray(count, np.int64)
    half = n // 2
    return np.where(s > 0, (s + half) // n, -((-s + half) // n))


def tflite_mean_multiplier(real, count: int) -> tuple[np.ndarray, np.ndarray]:
    """TFLite's MEAN: the Q31 multiplier and shift of ``real`` (``x_scale / y_scale``) with the
    element count divided into the multiplier: ``s = min(floor(log2 count), 32, 31 + shift)``,
    ``M' = (M << s) // count``, ``shift' = shift - s`` (C integer division; ``M'`` is not
    renormalized, so it is applied as is by ``multiply_by_quantized_multiplier``)."""
    m, shift = quantize_multiplier(real)
    s = np.minimum(np.minimum(int(count).bit_length() - 1, 32), 31 + shift)
    return (m << s) // int(count), shift - s


def _float_to_int64(r: np.ndarray) -> np.ndarray:
    # Clamp far outside every supported range before the cast so inf/huge values saturate.
    return np.clip(r, -(2.0 ** 62), 2.0 ** 62).astype(np.int64)


def saturate(y: np.ndarray, dtype: IntType) -> np.ndarray:
    return np.clip(y, dtype.qmin, dtype.qmax).astype(dtype.numpy)


# --------------------------------------------------------------------------- public ops


def quantize(x, scale, zero_point=0, *, axis: int = -1, out_dtype: str = "int8",
             rounding: str = "half_even", block_size: int = 0) -> np.ndarray:
    """``clip(round(x / scale) + zero_point)``.

    The quotient is computed in the float type of ``x`` and ``scale`` (float32
    for float32 inputs), one IEEE division, as ONNX QuantizeLinear specifies;
    NaN inputs map to ``zero_point``.
    """
    dtype = int_type(out_dtype)
    x = np.asarray(x)
    if x.dtype.kind != "f":
        raise QnnxError(f"quantize input must be float, got dtype {x.dtype}")
    s = broadcast_param(check_scale(scale), x.shape, axis, block_size, "scale")
    z = broadcast_param(check_zero_point(zero_point, dtype), x.shape, axis, block_size, "zero_point")
    ftype = np.result_type(x.dtype, s.dtype)
    v = round_float(x.astype(ftype) / s.astype(ftype), rounding)
    v = np.where(np.isnan(v), 0, v)
    return saturate(_float_to_int64(v) + z, dtype)


def dequantize(q, scale, zero_point=0, *, axis: int = -1, block_size: int = 0) -> np.ndarray:
    """``(q - zero_point) * scale`` in the scale's float type (float32 at least for the difference)."""
    q = np.asarray(q)
    dtype = int_type(q.dtype)
    s = broadcast_param(check_scale(scale), q.shape, axis, block_size, "scale")
    z = broadcast_param(check_zero_point(zero_point, dtype), q.shape, axis, block_size, "zero_point")
    diff = (as_int64(q) - z).astype(np.float32)
    return (diff * s.astype(np.float32)).astype(s.dtype if s.dtype.itemsize <= 4 else np.float32)


def requantize(x, input_scale, input_zero_point, output_scale, output_zero_point, *, axis: int = -1,
               rounding: str = "tflite", out_dtype: str = "int8", compute: str = "fixed_point") -> np.ndarray:
    """Move ``x`` from one affine space to another.

    ``y = clip(round((x - input_zero_point) * input_scale / output_scale) + output_zero_point)``
    with ``round`` as ``compute``/``rounding`` define (module docstring; ``compute`` may also be
    ``"qdq"`` here).
    Every qparam may be per-axis, the output ones included. ``x - input_zero_point``
    saturates to int32, the accumulator width of every backend.
    """
    x = np.asarray(x)
    in_type = int_type(x.dtype)
    dtype = int_type(out_dtype)
    shape = x.shape
    si = broadcast_param(check_scale(input_scale, "input_scale"), shape, axis, 0, "input_scale")
    zi = broadcast_param(check_zero_point(input_zero_point, in_type, "input_zero_point"), shape, axis, 0,
                         "input_zero_point")
    so = broadcast_param(check_scale(output_scale, "output_scale"), shape, axis, 0, "output_scale")
    zo = broadcast_param(check_zero_point(output_zero_point, dtype, "output_zero_point"), shape, axis, 0,
                         "output_zero_point")
    if compute == "qdq":  # literally dequantize (float32 product) then quantize (float32 quotient)
        real = (as_int64(x) - zi).astype(np.float32) * si.astype(np.float32)
        r = _float_to_int64(round_float(real / so.astype(np.float32), check_rounding(rounding)))
    else:
        r = scale_and_round(as_int64(x) - zi, requantize_multiplier(si, so), rounding=rounding, compute=compute,
                            acc_bits=requantize_acc_bits(compute))
    return saturate(r + zo, dtype)


def requantize_acc_bits(compute: str) -> int:
    """Width ``x - input_zero_point`` saturates to: 32, or 48 for ``fixed_point_q15`` (TFLite's int64
    accumulators, whose MultiplyByQuantizedMultiplier assumes ``|x| < 2**47``)."""
    return 48 if compute == "fixed_point_q15" else 32


def simulated_quantize(x, scale, zero_point=0, *, axis: int = -1, out_dtype: str = "int8",
                       rounding: str = "half_even", block_size: int = 0) -> np.ndarray:
    """:func:`quantize` with the affine values kept in float32 (integral, clipped to ``out_dtype``)."""
    return quantize(np.asarray(x, dtype=np.float32), scale, zero_point, axis=axis, out_dtype=out_dtype,
                    rounding=rounding, block_size=block_size).astype(np.float32)


def simulated_dequantize(x, scale, zero_point=0, *, axis: int = -1, block_size: int = 0) -> np.ndarray:
    """``(x - zero_point) * scale`` for affine values held in float32."""
    x = np.asarray(x, dtype=np.float32)
    s = broadcast_param(check_scale(scale), x.shape, axis, block_size, "scale")
    z = np.asarray(zero_point)
    z = broadcast_param(z, x.shape, axis, block_size, "zero_point").astype(np.float32)
    return ((x - z) * s.astype(np.float32)).astype(np.float32)


# --------------------------------------------------------------------------- int8 dot products in int16 pairs

# x86 int8 kernels without VNNI multiply uint8 by int8 with ``vpmaddubsw``: the products of each pair of
# adjacent input channels (2j, 2j + 1) are added in a *saturating int16*, and those sums in int32
# (``vpmaddwd``). 255 * 127 * 2 = 64770 > 32767, so large inputs against a pair of large same-sign weights
# clip. A pair whose magnitudes sum to at most 32767 // 255 = 128 cannot: 8-bit weights with that limit are
# exact on these kernels and nearly as fine as unlimited ones (7-bit weights, [-64, 64], are the blunt form).
U8S8_PAIR_LIMIT = 32767 // 255
# A pair scale this much above the exact bound: float32's relative rounding (2**-24) of the scale and of each
# quotient cannot then push two rounded weights of a pair at the bound one step over it.
PAIR_SCALE_MARGIN = 2.0 ** -20


def u8s8_pair_dot(x, w) -> np.ndarray:
    """``x @ w`` (int64) for uint8 ``x`` (..., K) and int8 ``w`` (K, N) as those kernels sum it: each pair
    of products of input channels 2j and 2j + 1 saturated to int16, the pairs summed exactly (an odd K
    pairs its last channel with a zero)."""
    x, w = np.asarray(x, np.int64), np.asarray(w, np.int64)
    if x.shape[-1] % 2:
        x = np.concatenate([x, np.zeros(x.shape[:-1] + (1,), np.int64)], axis=-1)
        w = np.concatenate([w, np.zeros((1,) + w.shape[1:], np.int64)], axis=0)
    k = x.shape[-1] // 2
    pairs = np.einsum("...jt,jtn->...jn", x.reshape(x.shape[:-1] + (k, 2)), w.reshape(k, 2, -1))
    return np.clip(pairs, -32768, 32767).sum(axis=-2)


def _pairs(q: np.ndarray, reduction_axis: int) -> tuple[np.ndarray, np.ndarray]:
    """The even and odd members of each adjacent pair along ``reduction_axis`` (moved first)."""
    m = np.moveaxis(np.asarray(q), reduction_axis, 0)
    k = m.shape[0] // 2 * 2
    return m[0:k:2], m[1:k:2]


def same_sign_pair_sums(w, reduction_axis: int) -> np.ndarray:
    """``|a| + |b|`` of each pair of adjacent entries along ``reduction_axis`` with the same sign (0 for a
    pair of opposite signs, whose products cannot add up), shaped like one of the pair members."""
    a, b = (np.asarray(v, np.float64) for v in _pairs(w, reduction_axis))
    return np.where(a * b > 0, np.abs(a) + np.abs(b), 0.0)


def pair_limited_scale(w, axis: int | None, reduction_axis: int, qmax: int = 127) -> np.ndarray:
    """Symmetric scale(s) of weights ``w``, one per index of ``axis`` (None: one for the tensor), at which
    their integers stay within ``qmax`` and every same-sign pair along ``reduction_axis`` within
    :data:`U8S8_PAIR_LIMIT`: ``max(max |w| / qmax, max pair sum / limit)``, the pair term raised by
    :data:`PAIR_SCALE_MARGIN` so that no float32 rounding of the scale or of ``w / scale`` puts a pair a step
    over the limit (float32; 0 for all-zero weights, which any positive scale represents)."""
    w = np.asarray(w, np.float64)
    if axis is not None and normalize_axis(axis, w.ndim) == normalize_axis(reduction_axis, w.ndim):
        raise QnnxError(f"the per-channel axis {axis} of the weights is their input-channel axis: no pairs per channel")
    absmax, pair = np.abs(w), same_sign_pair_sums(w, reduction_axis)
    if axis is None:
        big, sums = absmax.max(initial=0.0), pair.max(initial=0.0)
    else:
        axis = normalize_axis(axis, w.ndim)
        r = normalize_axis(reduction_axis, w.ndim)
        pair_axis = axis + 1 if axis < r else axis  # where ``axis`` went in ``pair`` (its axis r moved first)
        big = np.moveaxis(absmax, axis, 0).reshape(w.shape[axis], -1).max(axis=1, initial=0.0)
        sums = np.moveaxis(pair, pair_axis, 0).reshape(w.shape[axis], -1).max(axis=1, initial=0.0)
    return np.maximum(big / qmax, sums / U8S8_PAIR_LIMIT * (1 + PAIR_SCALE_MARGIN)).astype(np.float32)


# --------------------------------------------------------------------------- binary ops


def _binary_operands(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point,
                     axis, out_dtype):
    a, b = np.asarray(a), np.asarray(b)
    ta, tb, ty = int_type(a.dtype), int_type(b.dtype), int_type(out_dtype)
    for t, name in ((ta, "a"), (tb, "b")):
        if t.bits > 16:  # the fixed-point schemes' headroom shifts assume 8/16-bit operands
            raise QnnxError(f"{name} has dtype {t.name}; add/sub/mul take operands of 16 bits or fewer")
    try:
        shape = np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise QnnxError(f"inputs of shapes {a.shape} and {b.shape} do not broadcast") from None

    def param(p, name, check):
        return broadcast_param(check(p, name), shape, axis, 0, name)

    def zp(t):
        return lambda p, name: check_zero_point(p, t, name)

    ops = dict(
        a=np.broadcast_to(as_int64(a), shape) - param(a_zero_point, "a_zero_point", zp(ta)),
        b=np.broadcast_to(as_int64(b), shape) - param(b_zero_point, "b_zero_point", zp(tb)),
        sa=param(a_scale, "a_scale", check_scale).astype(np.float64),
        sb=param(b_scale, "b_scale", check_scale).astype(np.float64),
        sy=param(y_scale, "y_scale", check_scale).astype(np.float64),
        zy=param(y_zero_point, "y_zero_point", zp(ty)),
    )
    return ops, ta, tb, ty


def add_left_shift(a_dtype: str, b_dtype: str) -> int:
    """Headroom bits for fixed-point add: TFLite uses 20 for 8-bit inputs and 15 for 16-bit."""
    return 20 if max(int_type(a_dtype).bits, int_type(b_dtype).bits) <= 8 else 15


def add_multipliers(sa, sb, sy, left_shift: int):
    """The three real multipliers of fixed-point add (TFLite's scheme): inputs to a common
    scale ``2*max(sa, sb)`` with ``left_shift`` bits of headroom, then the sum to ``sy``."""
    twice_max = 2.0 * np.maximum(sa, sb)
    return sa / twice_max, sb / twice_max, twice_max / (float(1 << left_shift) * sy)


def add(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, *, axis: int = -1,
        out_dtype: str = "int8", rounding: str = "tflite", compute: str = "fixed_point",
        subtract: bool = False) -> np.ndarray:
    """Quantized ``a + b`` (or ``a - b``): every input and the output with its own qparams.

    fixed_point: TFLite's integer add generalised to every rounding mode: both
    inputs shifted left by :func:`add_left_shift` bits and rescaled to a common
    scale, summed, then rescaled to the output. float:
    ``round(f32(a') * f32(sa/sy) +- f32(b') * f32(sb/sy))`` in float32.
    """
    if check_compute(compute, COMPUTE_MODES if subtract else BINARY_COMPUTE_MODES) == "mlas":
        return _mlas_binary("add", a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point,
                            out_dtype, rounding)
    o, ta, tb, ty = _binary_operands(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
                                     y_zero_point, axis, out_dtype)
    sign = -1 if subtract else 1
    if compute == "float":
        check_rounding(rounding)
        fa = o["a"].astype(np.float32) * requantize_multiplier(o["sa"], o["sy"]).astype(np.float32)
        fb = o["b"].astype(np.float32) * requantize_multiplier(o["sb"], o["sy"]).astype(np.float32)
        r = _float_to_int64(round_float(fa + fb if not subtract else fa - fb, rounding))
    else:
        ls = add_left_shift(ta.name, tb.name)
        ma, mb, my = add_multipliers(o["sa"], o["sb"], o["sy"], ls)
        xa = scale_and_round(o["a"] << ls, ma, rounding=rounding, compute=compute)
        xb = scale_and_round(o["b"] << ls, mb, rounding=rounding, compute=compute)
        r = scale_and_round(xa + sign * xb, my, rounding=rounding, compute=compute)
    return saturate(r + o["zy"], ty)


def mul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, *, axis: int = -1,
        out_dtype: str = "int8", rounding: str = "tflite", compute: str = "fixed_point") -> np.ndarray:
    """Quantized ``a * b``: the product ``a' * b'`` requantized by ``sa * sb / sy`` (TFLite's MUL).

    The product is exact in a 33-bit accumulator (two centered 16-bit operands
    need it; for 8-bit operands this is TFLite's int32 arithmetic unchanged).
    """
    if check_compute(compute, MUL_COMPUTE_MODES) == "mlas":
        return _mlas_binary("mul", a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point,
                            out_dtype, rounding)
    o, _, _, ty = _binary_operands(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
                                   y_zero_point, axis, out_dtype)
    r = scale_and_round(o["a"] * o["b"], mul_multiplier(o["sa"], o["sb"], o["sy"], compute), rounding=rounding,
                        compute="fixed_point" if compute == "tflite" else compute, acc_bits=MUL_ACC_BITS)
    return saturate(r + o["zy"], ty)


def mul_multiplier(sa, sb, sy, compute: str) -> np.ndarray:
    """``sa * sb / sy``: in float64, or with ``compute="tflite"`` in float32 arithmetic (TFLite's MUL
    prepare multiplies and divides the float scales, then widens to double) for its Q31 multiplier."""
    if compute == "tflite":
        f32 = np.float32
        return ((np.asarray(sa, f32) * np.asarray(sb, f32)).astype(f32) / np.asarray(sy, f32)).astype(f32).astype(np.float64)
    return np.asarray(sa, np.float64) * np.asarray(sb, np.float64) / np.asarray(sy, np.float64)


def check_mlas_rounding(rounding: str) -> None:
    if check_rounding(rounding) != "half_even":
        raise QnnxError("compute='mlas' rounds half_even (as ONNX Runtime's kernels do); got rounding="
                        + repr(rounding))


def per_tensor_8bit(name: str, t: IntType, scale, zero_point) -> tuple[np.float32, int]:
    s, z = check_scale(scale, f"{name}_scale"), check_zero_point(zero_point, t, f"{name}_zero_point")
    if s.size != 1 or z.size != 1:
        raise QnnxError(f"compute='mlas' needs a per-tensor {name}_scale and {name}_zero_point (as ONNX Runtime)")
    if t.bits != 8:
        raise QnnxError(f"compute='mlas' takes 8-bit {name}, got {t.name} (ONNX Runtime's QLinear kernels do)")
    return np.float32(s.reshape(())), int(z.reshape(()))


def _mlas_binary(op: str, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point,
                 out_dtype: str, rounding: str, kind: str | None = None) -> np.ndarray:
    """ORT's QLinearAdd / QLinearMul (:mod:`qnnx.numerics_mlas`), checked and saturated. ``kind``:
    the broadcast kernel ORT runs (:func:`qnnx.numerics_mlas.span_kind`), by default from the shapes."""
    check_mlas_rounding(rounding)
    a, b = np.asarray(a), np.asarray(b)
    ty = int_type(out_dtype)
    (sa, za), (sb, zb) = (per_tensor_8bit(n, int_type(v.dtype), s, z) for n, v, s, z in
                          (("a", a, a_scale, a_zero_point), ("b", b, b_scale, b_zero_point)))
    sy, zy = per_tensor_8bit("y", ty, y_scale, y_zero_point)
    try:
        shape = np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise QnnxError(f"inputs of shapes {a.shape} and {b.shape} do not broadcast") from None
    if op == "mul":
        v = numerics_mlas.mul(a, b, sa, za, sb, zb, sy, zy)
    else:
        v = numerics_mlas.add(a, b, sa, za, sb, zb, sy, zy, kind or numerics_mlas.span_kind(a.shape, b.shape))
    return saturate(_float_to_int64(np.rint(np.broadcast_to(v, shape))), ty)


def mlas_pair_table(op: str, kind: str, a_dtype: str, a_scale, a_zero_point, b_dtype: str, b_scale, b_zero_point,
                    y_scale, y_zero_point, out_dtype: str) -> np.ndarray:
    """``add``/``mul`` with ``compute="mlas"`` for every (a, b) pair of 8-bit values, as ORT's ``kind``
    broadcast kernel computes them: shape (2**8, 2**8), row ``a - min(a)``, column ``b - min(b)``.
    (The recipes are elementwise, so one call on the full grid gives every span's values.)"""
    ta, tb = int_type(a_dtype), int_type(b_dtype)
    ga, gb = np.meshgrid(np.arange(ta.qmin, ta.qmax + 1), np.arange(tb.qmin, tb.qmax + 1), indexing="ij")
    return _mlas_binary(op, ga.astype(ta.numpy), a_scale, a_zero_point, gb.astype(tb.numpy), b_scale, b_zero_point,
                        y_scale, y_zero_point, out_dtype, "half_even", kind)


# --------------------------------------------------------------------------- softmax

SOFTMAX_FRAC_BITS = 30  # exp table precision: every entry is round(exp(-scale*k) * 2**30)


def softmax_exp_table(x_scale, bits: int) -> np.ndarray:
    """``round(exp(-x_scale * k) * 2**30)`` for every difference ``k`` an input of ``bits`` bits can have."""
    k = np.arange(1 << bits, dtype=np.float64)
    scale = np.float64(np.asarray(x_scale).reshape(()))
    return np.rint(np.exp(-scale * k) * float(1 << SOFTMAX_FRAC_BITS)).astype(np.int64)


def softmax(x, x_scale, x_zero_point, y_scale, y_zero_point, *, axis: int = -1, out_dtype: str = "uint8",
            rounding: str = "half_even", compute: str = "exact") -> np.ndarray:
    """Quantized softmax, exact and reproducible on any runtime (``compute="exact"``), ONNX
    Runtime's QLinearSoftmax recipe (``compute="mlas"``, :func:`qnnx.numerics_mlas.softmax`), or
    TFLite's int8 reference kernel (``compute="tflite"``, :func:`tflite_softmax`).

    ``d = max(x) - x`` along ``axis`` (the zero point cancels); ``e = T[d]`` with
    the integer table :func:`softmax_exp_table`; ``S = sum(e)`` exactly in int64;
    ``y = round(float64(e) / float64(S) / float64(y_scale)) + y_zero_point``
    with IEEE double division (one rounding per step).
    """
    x = np.asarray(x)
    t = int_type(x.dtype)
    dtype = int_type(out_dtype)
    s = check_scale(x_scale, "x_scale")
    if s.size != 1:
        raise QnnxError("softmax needs a per-tensor x_scale")
    check_zero_point(x_zero_point, t, "x_zero_point")
    sy = check_scale(y_scale, "y_scale")
    zy = check_zero_point(y_zero_point, dtype, "y_zero_point")
    if sy.size != 1 or zy.size != 1:
        raise QnnxError("softmax needs per-tensor output qparams")
    ax = normalize_axis(axis, x.ndim)
    if check_compute(compute, SOFTMAX_COMPUTE_MODES) == "tflite":
        check_tflite_softmax(t, s, x_zero_point, dtype, sy, zy, ax, x.ndim, rounding)
        if t.name == "int16":
            return tflite_softmax_int16(x, float(s.reshape(())))
        return tflite_softmax(x, float(s.reshape(())), dtype)
    if compute == "mlas":
        per_tensor_8bit("x", t, s, x_zero_point)
        per_tensor_8bit("y", dtype, sy, zy)
        check_mlas_rounding(rounding)
        return saturate(_float_to_int64(numerics_mlas.softmax(x, s, sy, zy, ax)), dtype)
    xi = as_int64(x)
    d = xi.max(axis=ax, keepdims=True) - xi
    e = softmax_exp_table(s, t.bits)[d]
    total = e.sum(axis=ax, keepdims=True)
    v = e.astype(np.float64) / total.astype(np.float64) / np.float64(sy.reshape(()))
    return saturate(_float_to_int64(round_float(v, rounding)) + zy.reshape(()), dtype)


# --------------------------------------------------------------------------- layer normalization

LAYER_NORM_MAX_PRODUCT = 1 << 62  # n**2 * max|x - zp|**2 must stay below this (int64 moments are exact)


def _normalized_moments(x, x_zero_point, axis: int, what: str):
    """Centered integers ``c = x - zp`` and, over the trailing axes from ``axis`` (kept as size-1
    dims), the element count ``n`` and the exact int64 sums ``S1 = sum c``, ``S2 = sum c**2``."""
    x = np.asarray(x)
    t = int_type(x.dtype)
    if t.bits > 16:
        raise QnnxError(f"{what} input has dtype {t.name}; it takes 16 bits or fewer")
    if x.ndim == 0:
        raise QnnxError(f"{what} needs an input of rank >= 1")
    zx = check_zero_point(x_zero_point, t, "x_zero_point")
    if zx.size != 1:
        raise QnnxError(f"{what} needs a per-tensor x_zero_point")
    ax = normalize_axis(axis, x.ndim)
    axes = tuple(range(ax, x.ndim))
    n = int(np.prod(x.shape[ax:]))
    c = as_int64(x) - zx.reshape(())
    max_c = max(abs(t.qmax - int(zx)), abs(t.qmin - int(zx)))
    if n == 0 or n * n * max_c * max_c >= LAYER_NORM_MAX_PRODUCT:
        raise QnnxError(f"{what} over {n} elements of {t.name} does not fit exact int64 moments")
    return c, n, c.sum(axis=axes, keepdims=True), (c * c).sum(axis=axes, keepdims=True)


def _per_tensor_scale(s, name: str) -> np.float64:
    s = check_scale(s, name)
    if s.size != 1:
        raise QnnxError(f"{name} must be per-tensor (one value), got shape {s.shape}")
    return np.float64(s.reshape(()))


def _requantize_real(v: np.ndarray, y_scale, y_zero_point, out_dtype: str, rounding: str) -> np.ndarray:
    """``saturate(round(v / y_scale) + y_zero_point)`` with float64 ``v``: one IEEE double division,
    then the rounding mode; NaN (never produced by the ops here) would saturate through 0.
    Output qparams are per-tensor or 1-D along the last axis."""
    dtype = int_type(out_dtype)
    shape = v.shape
    sy = broadcast_param(check_scale(y_scale, "y_scale"), shape, -1, 0, "y_scale").astype(np.float64)
    zy = broadcast_param(check_zero_point(y_zero_point, dtype, "y_zero_point"), shape, -1, 0, "y_zero_point")
    r = _float_to_int64(round_float(v / sy, check_rounding(rounding)))
    return saturate(r + zy, dtype)


def variance_multiplier(x_scale, n: int) -> np.float64:
    """``x_scale**2 / n**2`` in float64 (two roundings): the real variance is ``V * this`` for
    the exact integer ``V = n*S2 - S1**2``."""
    s = np.float64(np.asarray(x_scale, np.float32).reshape(()))
    return (s * s) / np.float64(n * n)


def variance(x, x_scale, x_zero_point, y_scale, y_zero_point, *, axis: int = -1, out_dtype: str = "uint8",
             rounding: str = "half_even") -> np.ndarray:
    """Quantized population variance over the trailing axes from ``axis`` (kept as size-1 dims).

    ``V = n*S2 - S1**2`` exactly in int64 (``S1``, ``S2``: sums of ``x - zp`` and of its
    squares; ``n`` elements), ``var = float64(V) * variance_multiplier(x_scale, n)``, then
    ``y = saturate(round(var / float64(y_scale)) + y_zero_point)`` (IEEE double, one rounding per step).
    """
    _, n, s1, s2 = _normalized_moments(x, x_zero_point, axis, "variance")
    _per_tensor_scale(x_scale, "x_scale")
    if np.asarray(y_scale).size != 1:
        raise QnnxError("variance needs a per-tensor y_scale")
    var = (n * s2 - s1 * s1).astype(np.float64) * variance_multiplier(x_scale, n)
    return _requantize_real(var, y_scale, y_zero_point, out_dtype, rounding)


def layer_norm(x, x_scale, x_zero_point, y_scale, y_zero_point, gamma=None, beta=None, variance=None,
               variance_scale=None, variance_zero_point=None, *, axis: int = -1, epsilon: float = 1e-5,
               out_dtype: str = "int8", rounding: str = "half_even") -> np.ndarray:
    """Quantized layer normalization over the trailing axes from ``axis``.

    Exact integer part, with ``c = x - x_zero_point`` and ``n`` normalized elements:
    ``S1 = sum c``, ``S2 = sum c**2``, ``D = n*c - S1`` (``n`` times the distance to the mean) and
    ``V = n*S2 - S1**2`` (``n**2`` times the variance), all int64.

    Then IEEE double, one rounding per step, in this order:

    1. ``var = float64(V) * variance_multiplier(x_scale, n)``; or, when a quantized ``variance``
       is given (a source graph that quantized its variance, e.g. ONNX Runtime's QDQ),
       ``var = max(float64(variance - variance_zero_point) * float64(variance_scale), 0)``.
    2. ``den = sqrt(var + float64(float32(epsilon)))``.
    3. ``z = float64(D) * (float64(x_scale) / n) / den``; ``z = 0`` where ``den == 0`` (a constant
       row with ``epsilon == 0``).
    4. ``z = z * float64(gamma)``, then ``z = z + float64(beta)`` (each when given; float
       tensors broadcasting to the normalized dims).
    5. ``y = saturate(round(z / float64(y_scale)) + y_zero_point)`` by ``rounding``; the output
       qparams are per-tensor or 1-D along the last axis.
    """
    c, n, s1, s2 = _normalized_moments(x, x_zero_point, axis, "layer_norm")
    sx = _per_tensor_scale(x_scale, "x_scale")
    if variance is None:
        var = (n * s2 - s1 * s1).astype(np.float64) * variance_multiplier(x_scale, n)
    else:
        v = np.asarray(variance)
        vt = int_type(v.dtype)
        if variance_scale is None or variance_zero_point is None:
            raise QnnxError("a quantized variance needs variance_scale and variance_zero_point")
        zv = check_zero_point(variance_zero_point, vt, "variance_zero_point")
        if zv.size != 1:
            raise QnnxError("variance_zero_point must be per-tensor")
        if v.ndim != c.ndim or any(d not in (1, e) for d, e in zip(v.shape, s1.shape)):
            raise QnnxError(f"variance of shape {v.shape} does not match the reduced shape {s1.shape}")
        dv = (as_int64(v) - zv.reshape(())).astype(np.float64)
        var = np.maximum(dv * _per_tensor_scale(variance_scale, "variance_scale"), 0.0)
    den = np.sqrt(var + np.float64(np.float32(epsilon)))
    d = (n * c - s1).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(den == 0, 0.0, d * (sx / np.float64(n)) / den)
    norm_shape = c.shape[normalize_axis(axis, c.ndim):]
    for p, name, combine in ((gamma, "gamma", np.multiply), (beta, "beta", np.add)):
        if p is None:
            continue
        p = np.asarray(p)
        if p.dtype.kind != "f":
            raise QnnxError(f"{name} must be a float tensor, got dtype {p.dtype}")
        try:
            ok = np.broadcast_shapes(p.shape, norm_shape) == tuple(norm_shape)
        except ValueError:
            ok = False
        if not ok:
            raise QnnxError(f"{name} of shape {p.shape} does not broadcast to the normalized shape {norm_shape}")
        z = combine(z, p.astype(np.float64))
    return _requantize_real(z, y_scale, y_zero_point, out_dtype, rounding)


# --------------------------------------------------------------------------- TFLite's int8 softmax
# gemmlowp fixed point as TFLite's reference Softmax uses it: values are int32 held in int64; a
# FixedPoint<k> raw r means r * 2**(k - 31). Products are SaturatingRoundingDoublingHighMul.

TFLITE_SOFTMAX_DIFF_BITS = 5  # the input difference in Q5.26
TFLITE_SOFTMAX_ACC_BITS = 12  # the sum of exps in Q12.19
# exp(-2**k) in Q0.31 for k = -2..4: the barrel shifter of exp_on_negative_values (gemmlowp's constants
# are these values rounded to nearest)
_EXP_BARREL = tuple((k, int(np.rint(np.exp(-2.0 ** k) * 2.0 ** 31))) for k in range(-2, 5))


def saturating_shift_left(x: np.ndarray, e: int) -> np.ndarray:
    """gemmlowp SaturatingRoundingMultiplyByPOT<e> for e > 0 (Rescale to fewer integer bits)."""
    threshold = (1 << (31 - e)) - 1
    return np.where(x > threshold, INT32_MAX, np.where(x < -threshold, INT32_MIN, np.asarray(x, np.int64) << e))


def _exp_quarter(a: np.ndarray) -> np.ndarray:
    """gemmlowp exp_on_interval_between_negative_one_quarter_and_0_excl (Q0.31 in and out): the
    Taylor series around -1/8 to the fourth power."""
    x = a + (1 << 28)
    x2 = _srdhm(x, x)
    x3 = _srdhm(x2, x)
    x4 = _srdhm(x2, x2)
    third = np.int64(715827883)  # 1/3 in Q0.31
    poly = _rounding_divide_by_pot(_srdhm(_rounding_divide_by_pot(x4, np.int64(2)) + x3, third) + x2, np.int64(1))
    c = np.int64(np.rint(np.exp(-1 / 8) * 2.0 ** 31))  # exp(-1/8) in Q0.31
    return c + _srdhm(c, x + poly)


def exp_on_negative_values(a: np.ndarray, integer_bits: int = TFLITE_SOFTMAX_DIFF_BITS) -> np.ndarray:
    """gemmlowp exp_on_negative_values: ``a`` (<= 0) in Q``integer_bits``, result in Q0.31."""
    frac = 31 - integer_bits
    quarter = np.int64(1) << (frac - 2)
    a_mod = (a & (quarter - 1)) - quarter
    result = _exp_quarter(saturating_shift_left(a_mod, integer_bits))
    remainder = a_mod - a
    for exponent, multiplier in _EXP_BARREL:
        if integer_bits > exponent:
            bit = np.int64(1) << (frac + exponent)
            result = np.where(remainder & bit, _srdhm(result, np.int64(multiplier)), result)
    return np.where(a == 0, INT32_MAX, result)


def one_over_one_plus_x(a: np.ndarray) -> np.ndarray:
    """gemmlowp one_over_one_plus_x_for_x_in_0_1 (Q0.31 in and out): three Newton-Raphson steps on
    the half denominator from 48/17 - 32/17 x, in Q2.29."""
    s = a + INT32_MAX
    half = np.where(s >= 0, (s + 1) // 2, -((-(s - 1)) // 2))  # RoundingHalfSum: (sum + sign) / 2 in C
    x = np.int64(1515870810) + _srdhm(half, np.int64(-1010580540))  # 48/17 and -32/17 in Q2.29
    for _ in range(3):
        x = x + saturating_shift_left(_srdhm(x, (1 << 29) - _srdhm(half, x)), 2)
    return saturating_shift_left(x, 1)


def tflite_reciprocal(total: np.ndarray, integer_bits: int = TFLITE_SOFTMAX_ACC_BITS) -> tuple[np.ndarray, np.ndarray]:
    """TFLite's GetReciprocal of a positive Q``integer_bits`` value: ``(1 / (1 + frac)`` in Q0.31,
    ``num_bits_over_unit``) with the value normalised by its leading zeros."""
    total = np.asarray(total, np.int64)
    clz = 32 - np.frompyfunc(int.bit_length, 1, 1)(total).astype(np.int64)
    shifted = (total << clz) - (np.int64(1) << 31)
    return one_over_one_plus_x(shifted), integer_bits - clz


def tflite_softmax_params(x_scale: float, beta: float = 1.0) -> tuple[int, int, int]:
    """TFLite's PreprocessSoftmaxScaling (Q5.26 differences) and CalculateInputRadius:
    ``(input_multiplier, input_left_shift, diff_min)``."""
    real = min(float(np.float32(beta)) * float(np.float32(x_scale)) * float(1 << (31 - TFLITE_SOFTMAX_DIFF_BITS)),
               float((1 << 31) - 1))
    m, shift = quantize_multiplier(real)
    radius = np.floor(31.0 * float(1 << (31 - TFLITE_SOFTMAX_DIFF_BITS)) / float(1 << int(shift)))
    return int(m), int(shift), -int(radius)


def tflite_softmax_exp_table(x_scale: float, bits: int = 8) -> np.ndarray:
    """exp of every input difference ``d = x - max(x)`` (index ``d + 2**bits - 1``) in Q0.31, as
    TFLite's kernel computes it; 0 where ``d < diff_min`` (TFLite skips those: their output is the
    minimum)."""
    m, shift, diff_min = tflite_softmax_params(x_scale)
    d = np.arange(-(1 << bits) + 1, 1, dtype=np.int64)
    valid = d >= diff_min
    rescaled = multiply_by_quantized_multiplier(np.where(valid, d, 0), m, shift, "tflite")
    return np.where(valid, exp_on_negative_values(rescaled), 0)


def tflite_softmax(x: np.ndarray, x_scale: float, out: IntType) -> np.ndarray:
    """TFLite's reference int8 Softmax along the last axis (beta 1): the exp table of the
    differences to the row maximum, their sum in Q12.19 (each term rounded by 2**12), its reciprocal
    (:func:`tflite_reciprocal`), each output ``RoundingDivideByPOT(SRDHM(1/sum, exp), num_bits + 31 -
    bits(out)) + min(out)``. Exact for rows of up to 4096 elements (the int32 sum cannot wrap)."""
    xi = as_int64(x)
    if xi.shape[-1] > 4096:
        raise QnnxError(f"compute='tflite' softmax takes rows of at most 4096 elements, got {xi.shape[-1]}")
    d = xi - xi.max(axis=-1, keepdims=True)
    table = tflite_softmax_exp_table(x_scale)
    e = table[d + 255]
    total = _rounding_divide_by_pot(e, np.int64(TFLITE_SOFTMAX_ACC_BITS)).sum(axis=-1, keepdims=True)
    recip, bits_over_unit = tflite_reciprocal(total)
    exponent = bits_over_unit + 31 - out.bits
    y = _rounding_divide_by_pot(_srdhm(recip, e), exponent) + out.qmin
    return saturate(y, out)


def lut_populate_int16(fn, input_scale: float, input_zero_point: int, output_scale: float,
                       output_zero_point: int) -> np.ndarray:
    """TFLite's LUTPopulateInt16<double>: 512 segments over the int16 input range, each sample
    ``round(f(x) * inv)`` nudged by half the error of linear interpolation at its midpoint, plus the
    last point (513 entries), all in IEEE double with ``fn`` from the C library (Python's math)."""
    import math

    input_min = input_scale * (-32768 - input_zero_point)
    input_max = input_scale * (32767 - input_zero_point)
    output_min = output_scale * (-32768 - output_zero_point)
    output_max = output_scale * (32767 - output_zero_point)
    step = (input_max - input_min) / 512
    half_step = step / 2
    inv = 65536.0 / (output_max - output_min)

    def rnd(v: float) -> float:  # TfLiteRound: std::round, ties away from zero
        return math.copysign(math.floor(abs(v) + 0.5), v) if abs(v) - math.floor(abs(v)) != 0.5 else \
            math.copysign(math.floor(abs(v)) + 1, v)

    lut = []
    for i in range(512):
        val = fn(input_min + i * step)
        val_mid = fn(input_min + i * step + half_step)
        val_next = fn(input_min + (i + 1) * step)
        sample = rnd(val * inv)
        interp = rnd((val_next * inv + rnd(val * inv)) / 2)
        bias = rnd((interp - rnd(val_mid * inv)) / 2)
        lut.append(min(max(sample - bias, -32768.0), 32767.0))
    lut.append(min(max(rnd(fn(input_max) * inv), -32768.0), 32767.0))
    return np.array(lut, np.int64)


def lut_lookup_int16(value: np.ndarray, lut: np.ndarray) -> np.ndarray:
    """TFLite's LUTLookup for int16: entry ``256 + (v >> 7)`` plus the slope to the next entry times
    the low 7 bits, rounded (``(slope * offset + 64) >> 7``)."""
    v = np.asarray(value, np.int64)
    index = 256 + (v >> 7)
    base = lut[index]
    delta = ((lut[index + 1] - base) * (v & 0x7F) + 64) >> 7
    return (base + delta).astype(np.int16).astype(np.int64)


def tflite_softmax_int16_tables(x_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """TFLite's int16 softmax as two tables: the Q0.15 exp of every input difference ``d`` in
    [-65535, 0] (index ``d + 65535``; the difference rescaled so that -65535 is -10.0, then the
    interpolated exp LUT) and the Q0.15 reciprocal of every saturated int16 ``1 + x`` argument
    (index ``v + 32768``; the interpolated 1/(1+x) LUT)."""
    import math

    exp_lut = lut_populate_int16(math.exp, 10.0 / 65535, 32767, 2.0 / 65535, 0)
    recip_lut = lut_populate_int16(lambda v: 1.0 / (1.0 + v), 1.0 / 65535, -32768, 2.0 / 65535, 0)
    real = float(np.float32(x_scale)) / (10.0 / 65535.0)  # input_scale * beta (beta 1) over the LUT's step
    m, shift = quantize_multiplier(real)
    d = np.arange(-65535, 1, dtype=np.int64)
    if int(shift) > 0 and 65535 * (1 << int(shift)) >= 1 << 31:
        raise QnnxError(f"compute='tflite' int16 softmax: x_scale {x_scale!r} makes TFLite's rescaled difference "
                        "wrap around int32")
    scaled = multiply_by_quantized_multiplier(d, m, shift, "tflite")
    exp = lut_lookup_int16(np.clip(scaled + 32767, -32768, 32767), exp_lut)
    recip = lut_lookup_int16(np.arange(-32768, 32768, dtype=np.int64), recip_lut)
    return exp, recip


def tflite_softmax_int16(x: np.ndarray, x_scale: float) -> np.ndarray:
    """TFLite's reference int16 SoftmaxInt16 along the last axis (beta 1): the exp of each difference
    to the row maximum (:func:`tflite_softmax_int16_tables`), their int32 sum normalised by its
    leading zeros to the reciprocal table's argument, each output ``(exp * 1/sum + half) >> (31 -
    clz)``, clamped to [0, 32767]. Exact for rows of up to 65536 elements."""
    xi = as_int64(x)
    if xi.shape[-1] > 65536:
        raise QnnxError(f"compute='tflite' int16 softmax takes rows of at most 65536 elements, got {xi.shape[-1]}")
    exp_table, recip_table = tflite_softmax_int16_tables(x_scale)
    e = exp_table[xi - xi.max(axis=-1, keepdims=True) + 65535]
    total = e.sum(axis=-1, keepdims=True)
    clz = 32 - np.frompyfunc(int.bit_length, 1, 1)(total).astype(np.int64)
    shifted = ((total << (clz - 1)) + (1 << 13)) >> 14
    recip = recip_table[np.clip(shifted - ((1 << 15) + (1 << 16)), -32768, 32767) + 32768]
    right = 31 - clz
    y = (e * recip + (np.int64(1) << (right - 1))) >> right
    return np.clip(y, 0, 32767).astype(np.int16)


def check_tflite_softmax(t: IntType, x_scale, x_zero_point, out: IntType, y_scale, y_zero_point, axis: int,
                         ndim: int, rounding: str) -> None:
    """compute="tflite" softmax: int8 input (per-tensor), the last axis, rounding tflite, and
    the output qparams TFLite's kernel implies: int8 (1/256, -128) or int16 (1/65536, -32768) (the
    kernel adds the type's minimum whatever the int16 output declares: other qparams are refused)."""
    if t.name not in ("int8", "int16"):
        raise QnnxError(f"compute='tflite' softmax takes int8 or int16 input, got {t.name}")
    if axis != ndim - 1:
        raise QnnxError("compute='tflite' softmax runs along the last axis")
    if rounding != "tflite":
        raise QnnxError(f"compute='tflite' softmax rounds as TFLite does (rounding='tflite'), got {rounding!r}")
    want = {"int8": (1 / 256, -128), "int16": (1 / 65536, -32768)}.get(out.name)
    if t.name == "int16":  # int16 -> int16 only, symmetric
        want = (1 / 32768, 0) if out.name == "int16" else None
        if int(np.asarray(x_zero_point).reshape(())) != 0:
            raise QnnxError("compute='tflite' int16 softmax needs x_zero_point 0, as TFLite")
    sy, zy = float(np.asarray(y_scale).reshape(())), int(np.asarray(y_zero_point).reshape(()))
    if want is None or abs(sy - want[0]) > 0.001 * want[0] or zy != want[1]:
        raise QnnxError(f"compute='tflite' softmax outputs int8 (1/256, -128) or int16 (1/65536, -32768), got {out.name} "
                        f"({sy!r}, {zy})")
