"""TFLite's integer recipes that are fixed functions of one 8- or 16-bit input: lookup tables.

LiteRT's reference kernels compute LOGISTIC, TANH, RELU*, LEAKY_RELU and PRELU of an int8 or
int16 tensor as a function of each element alone, with constant qparams; so the canonical form
holds them as a ``qnnx.lut`` whose table is filled here by TFLite's own steps (float32
``LUTPopulate`` for int8 logistic/tanh; the 256-entry Q0.16 sigmoid table with interpolation for
int16; ``MultiplyByQuantizedMultiplier`` for the requantizing activations). Every table entry is
the kernel's output for that input value, so the lookup is exact by construction; the tests
check every input value against the interpreter.

The Q31 arithmetic itself (QuantizeMultiplier, MultiplyByQuantizedMultiplier) is
:mod:`qnnx.numerics`; this module only orders its steps as TFLite's kernels do.
"""

from __future__ import annotations

import numpy as np

from qnnx import numerics
from qnnx.dtypes import int_type
from qnnx.errors import QnnxError

ACTIVATIONS = ("NONE", "RELU", "RELU_N1_TO_1", "RELU6")


def tflite_round(v: np.ndarray) -> np.ndarray:
    """``TfLiteRound``: ``std::round``, ties away from zero, in the value's own float type."""
    return numerics.round_float(v, "tflite")


def quantize_f32(f: float, scale, zero_point) -> int:
    """``zero_point + (int)TfLiteRound(f / scale)`` in float32 (CalculateActivationRangeQuantized)."""
    return int(zero_point) + int(tflite_round(np.float32(f) / np.float32(scale)))


def activation_range(activation: str, scale, zero_point, dtype: str) -> tuple[int, int]:
    """The clamp a fused activation puts on a quantized output (TFLite's
    CalculateActivationRangeQuantized): the dtype's range cut at real 0, 6, -1 or 1."""
    t = int_type(dtype)
    lo, hi = t.qmin, t.qmax
    if activation == "NONE":
        return lo, hi
    if activation == "RELU":
        return max(lo, quantize_f32(0.0, scale, zero_point)), hi
    if activation == "RELU6":
        return max(lo, quantize_f32(0.0, scale, zero_point)), min(hi, quantize_f32(6.0, scale, zero_point))
    if activation == "RELU_N1_TO_1":
        return max(lo, quantize_f32(-1.0, scale, zero_point)), min(hi, quantize_f32(1.0, scale, zero_point))
    raise QnnxError(f"fused activation {activation} has no integer form; supported: {', '.join(ACTIVATIONS)}")


def _inputs(dtype: str) -> np.ndarray:
    t = int_type(dtype)
    return np.arange(t.qmin, t.qmax + 1, dtype=np.int64)


def sigmoid_f32(v: np.ndarray) -> np.ndarray:
    """``1.0f / (1.0f + std::exp(-v))`` in float32 (exp correctly rounded to float32)."""
    e = np.exp(-v.astype(np.float64)).astype(np.float32)
    return (np.float32(1.0) / (np.float32(1.0) + e)).astype(np.float32)


def tanh_f32(v: np.ndarray) -> np.ndarray:
    """``std::tanh`` of a float32 value, correctly rounded to float32."""
    return np.tanh(v.astype(np.float64)).astype(np.float32)


def lut_populate_int8(fn, dtype: str, x_scale, x_zero_point, y_scale, y_zero_point) -> np.ndarray:
    """TFLite's ``LUTPopulateInt8``: for every 8-bit input, dequantize in float32, apply ``fn``
    (float32), multiply by ``1 / y_scale`` (float32), TfLiteRound, add the zero point, clamp."""
    t = int_type(dtype)
    if t.bits != 8:
        raise QnnxError(f"LUTPopulateInt8 takes an 8-bit type, got {dtype}")
    x = _inputs(dtype)
    deq = np.float32(x_scale) * (x - int(x_zero_point)).astype(np.float32)
    inv = np.float32(1.0) / np.float32(y_scale)
    r = tflite_round((fn(deq.astype(np.float32)) * inv).astype(np.float32))
    q = r.astype(np.int64) + int(y_zero_point)
    return np.clip(q, t.qmin, t.qmax).astype(t.numpy)


# TFLite's int16 LOGISTIC and TANH interpolate a 256-entry sigmoid table of its own, which no formula
# reproduces (44 entries are one off the rounded sigmoid); qnnx does not copy LiteRT's source, so they
# stay float in an import until the table can be derived (e.g. measured from the interpreter).
INT16_SIGMOID_REASON = ("TFLite's int16 kernel interpolates its own tabulated sigmoid, which qnnx does not "
                        "reproduce: kept float")


def logistic_table(dtype: str, x_scale, x_zero_point, y_scale, y_zero_point) -> np.ndarray:
    """LOGISTIC's table: int8 by LUTPopulateInt8 of the float32 sigmoid (output qparams 1/256,
    -128 required). int16 is refused: INT16_SIGMOID_REASON."""
    t = int_type(dtype)
    if t.name == "int8":
        if float(y_scale) != 1.0 / 256 or int(y_zero_point) != -128:
            raise QnnxError("int8 LOGISTIC needs output qparams (1/256, -128), as TFLite")
        return lut_populate_int8(sigmoid_f32, dtype, x_scale, x_zero_point, y_scale, y_zero_point)
    if t.name == "int16":
        raise QnnxError(f"int16 LOGISTIC: {INT16_SIGMOID_REASON}")
    raise QnnxError(f"LOGISTIC takes int8 or int16, got {dtype}")


def tanh_table(dtype: str, x_scale, x_zero_point, y_scale, y_zero_point) -> np.ndarray:
    """TANH's table: int8 by LUTPopulateInt8 of the float32 tanh. int16 is refused:
    INT16_SIGMOID_REASON."""
    t = int_type(dtype)
    if t.name == "int8":
        return lut_populate_int8(tanh_f32, dtype, x_scale, x_zero_point, y_scale, y_zero_point)
    if t.name == "int16":
        raise QnnxError(f"int16 TANH: {INT16_SIGMOID_REASON}")
    raise QnnxError(f"TANH takes int8 or int16, got {dtype}")


def _srdhm16(a: np.ndarray, b) -> np.ndarray:
    """gemmlowp SaturatingRoundingDoublingHighMul on int16."""
    ab = np.asarray(a, np.int64) * np.int64(b)
    q = ab + np.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    q = np.where(q >= 0, q >> 15, -((-q) >> 15))  # C division truncates
    return np.where((np.asarray(a) == -32768) & (b == -32768), 32767, q)


def _sat_shift16(v: np.ndarray, amount: int) -> np.ndarray:
    return np.clip(np.asarray(v, np.int64) << amount, -32768, 32767)


def _downscale_q15(m: int) -> int:
    """TFLite's DownScaleInt32ToInt16Multiplier."""
    return 32767 if m >= (1 << 31) - 1 - (1 << 15) else (m + (1 << 15)) >> 16


def hard_swish_table(dtype: str, x_scale, x_zero_point, y_scale, y_zero_point) -> np.ndarray:
    """TFLite's quantized HardSwish (reference_ops::HardSwish), int16 fixed point: the input on a
    2**7 finer scale, a "reluish" factor ``relu6(x + 3) / 6`` in Q0.15 from it, their doubling high
    product rounded toward zero, then the output multiplier's shift; multipliers from float32
    scales as TFLite's prepare computes them, reduced to 16 bits."""
    t = int_type(dtype)
    if t.bits != 8:
        raise QnnxError(f"HARD_SWISH takes 8-bit input, got {dtype}")
    f32 = np.float32
    hires = f32(1.0 / 128.0) * f32(x_scale)
    om, oexp = (int(v) for v in numerics.quantize_multiplier(float(f32(hires / f32(y_scale)))))
    if oexp > 0:
        raise QnnxError("HARD_SWISH's output multiplier is above 1 (TFLite refuses it)")
    rm, rexp = (int(v) for v in numerics.quantize_multiplier(float(f32(hires / f32(3.0 / 32768.0)))))
    om16, rm16 = _downscale_q15(om), _downscale_q15(rm)
    hi = (_inputs(dtype) - int(x_zero_point)) * 128
    pre = _srdhm16(hi, om16)
    r = hi
    if rexp > 0:
        r = _sat_shift16(r, rexp - 1)
    r = _srdhm16(r, rm16)
    if rexp > 0:
        r = _sat_shift16(r, 1)
    if rexp < 0:
        r = numerics.rounding_divide_by_pot(r, -rexp)
    r = (r + (1 << 15)) >> 1
    prod = r * pre  # SaturatingDoublingHighMul: toward zero; r >= 0, so never both -32768
    po = np.where(prod >= 0, prod >> 15, -((-prod) >> 15))
    out = numerics.rounding_divide_by_pot(po, -oexp) + int(y_zero_point)
    return np.clip(out, t.qmin, t.qmax).astype(t.numpy)


def requantize_table(dtype: str, x_scale, x_zero_point, y_scale, y_zero_point, lo: int, hi: int) -> np.ndarray:
    """``clamp(MultiplyByQuantizedMultiplier(x - zx, QuantizeMultiplier(sx / sy)) + zy, lo, hi)``
    for every input, ``sx / sy`` divided in float32 as TFLite's prepare writes it: TFLite's quantized RELU / RELU6 / RELU_N1_TO_1 (``lo``/``hi`` from
    :func:`activation_range`)."""
    t = int_type(dtype)
    y = _mbqm(_inputs(dtype) - int(x_zero_point), float_ratio(x_scale, y_scale))
    return np.clip(y + int(y_zero_point), lo, hi).astype(t.numpy)


def float_ratio(a, b) -> float:
    """``a / b`` of two float32 scales in float32 (C++ ``float / float``), widened to double after."""
    return float(np.float32(a) / np.float32(b))


def _mbqm(x: np.ndarray, real) -> np.ndarray:
    m, shift = numerics.quantize_multiplier(real)
    return numerics.multiply_by_quantized_multiplier(x, m, shift, "tflite")


def leaky_relu_table(dtype: str, alpha: float, x_scale, x_zero_point, y_scale, y_zero_point) -> np.ndarray:
    """TFLite's QuantizeLeakyRelu: identity multiplier ``sx / sy`` for ``x >= zx``, alpha multiplier
    ``sx * alpha / sy`` below, both in float32 arithmetic (as TFLite's prepare writes them),
    its sign applied after the rounding; clamped to the dtype."""
    t = int_type(dtype)
    c = _inputs(dtype) - int(x_zero_point)
    f32 = np.float32
    alpha_m = float(f32(f32(x_scale) * f32(alpha)) / f32(y_scale))
    neg = _mbqm(c, abs(alpha_m)) * (-1 if alpha_m < 0 else 1)
    pos = _mbqm(c, float_ratio(x_scale, y_scale))
    return np.clip(np.where(c >= 0, pos, neg) + int(y_zero_point), t.qmin, t.qmax).astype(t.numpy)


def prelu_table(dtype: str, alpha_q: np.ndarray, alpha_scale, alpha_zero_point, x_scale, x_zero_point, y_scale,
                y_zero_point) -> np.ndarray:
    """TFLite's quantized PRELU with one constant alpha per channel: one table row per alpha value.
    ``x >= zx``: MBQM(x - zx, sx / sy); else MBQM((x - zx) * (alpha - za), sx * sa / sy), both
    multipliers in float32 arithmetic as TFLite's prepare writes them; clamped to the dtype."""
    t = int_type(dtype)
    c = _inputs(dtype) - int(x_zero_point)
    f32 = np.float32
    m2 = float(f32(f32(x_scale) * f32(alpha_scale)) / f32(y_scale))
    a = (np.asarray(alpha_q, np.int64).reshape(-1, 1) - int(alpha_zero_point))
    pos = np.broadcast_to(_mbqm(c, float_ratio(x_scale, y_scale)), (a.shape[0], c.size))
    neg = _mbqm(c[None, :] * a, m2)
    return np.clip(np.where(c[None, :] >= 0, pos, neg) + int(y_zero_point), t.qmin, t.qmax).astype(t.numpy)


def _cdiv(a: np.ndarray, b: int) -> np.ndarray:
    """C integer division (truncates toward zero) of int64 by a positive ``b``."""
    a = np.asarray(a, np.int64)
    return np.where(a >= 0, a // b, -((-a) // b))


def bilinear_taps(in_size: int, out_size: int, align_corners: bool, half_pixel_centers: bool):
    """TFLite's ResizeBilinearInteger along one axis: for every output index, the two source indices
    ``(lower, upper)`` and the upper one's weight in 1/1024 (the lower one's is ``1024 - w``), from the
    Q10 scale ``(1024 * in + out / 2) / out`` (align_corners: of ``in - 1`` over ``out - 1``)."""
    if align_corners and out_size > 1:
        scale = (1024 * (in_size - 1) + (out_size - 1) // 2) // (out_size - 1)
    else:
        scale = (1024 * in_size + out_size // 2) // out_size
    v = np.arange(out_size, dtype=np.int64) * scale
    if half_pixel_centers:
        v = v + scale // 2 - (1 << 9)
    lower = np.maximum(_cdiv(v, 1024), 0)
    upper = np.minimum(_cdiv(v + 1023, 1024), in_size - 1)
    return lower, upper, v - 1024 * lower
