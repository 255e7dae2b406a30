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


# The sigmoid table TFLite's int16 LOGISTIC and TANH kernels interpolate: sigmoid(i / 24) in unsigned
# Q0.16, measured from LiteRT's reference TANH kernel (bench/tflite_sigmoid_table.py; the tests measure it
# again). Its entries are no formula's (44 are one off round(65536 * sigmoid(i / 24))), so the int16
# kernels can only be reproduced with the measured table.
SIGMOID_TABLE_Q16 = np.array([
    32768, 33451, 34133, 34813, 35493, 36169, 36843, 37513, 38180, 38841, 39498, 40149, 40794, 41432, 42064, 42688,
    43304, 43912, 44511, 45102, 45683, 46255, 46817, 47369, 47911, 48443, 48964, 49475, 49975, 50464, 50942, 51409,
    51865, 52311, 52745, 53169, 53581, 53983, 54374, 54755, 55125, 55485, 55834, 56174, 56503, 56823, 57133, 57433,
    57724, 58007, 58280, 58544, 58800, 59048, 59288, 59519, 59743, 59959, 60168, 60370, 60565, 60753, 60935, 61110,
    61279, 61441, 61599, 61750, 61896, 62036, 62172, 62302, 62428, 62549, 62666, 62778, 62886, 62990, 63090, 63186,
    63279, 63368, 63454, 63536, 63615, 63691, 63765, 63835, 63903, 63968, 64030, 64090, 64148, 64204, 64257, 64308,
    64357, 64405, 64450, 64494, 64536, 64576, 64614, 64652, 64687, 64721, 64754, 64786, 64816, 64845, 64873, 64900,
    64926, 64950, 64974, 64997, 65019, 65039, 65060, 65079, 65097, 65115, 65132, 65149, 65164, 65179, 65194, 65208,
    65221, 65234, 65246, 65258, 65269, 65280, 65291, 65301, 65310, 65319, 65328, 65337, 65345, 65352, 65360, 65367,
    65374, 65381, 65387, 65393, 65399, 65404, 65410, 65415, 65420, 65425, 65429, 65433, 65438, 65442, 65445, 65449,
    65453, 65456, 65459, 65462, 65465, 65468, 65471, 65474, 65476, 65479, 65481, 65483, 65485, 65488, 65489, 65491,
    65493, 65495, 65497, 65498, 65500, 65501, 65503, 65504, 65505, 65507, 65508, 65509, 65510, 65511, 65512, 65513,
    65514, 65515, 65516, 65517, 65517, 65518, 65519, 65520, 65520, 65521, 65522, 65522, 65523, 65523, 65524, 65524,
    65525, 65525, 65526, 65526, 65526, 65527, 65527, 65528, 65528, 65528, 65529, 65529, 65529, 65529, 65530, 65530,
    65530, 65530, 65531, 65531, 65531, 65531, 65531, 65532, 65532, 65532, 65532, 65532, 65532, 65533, 65533, 65533,
    65533, 65533, 65533, 65533, 65533, 65534, 65534, 65534, 65534, 65534, 65534, 65534, 65534, 65534, 65534, 65535,
], dtype=np.int64)


def checked_log2(x: float) -> tuple[bool, int]:
    """TFLite's CheckedLog2: ``(is a power of two within 1e-3 in log2, rounded log2)``, in float32."""
    f32 = np.float32
    v = f32(np.log(f32(x))) * (f32(1.0) / f32(np.log(f32(2.0))))
    r = f32(tflite_round(v))
    return bool(abs(f32(v - r)) < f32(1e-3)), int(r)


def int16_sigmoid_params(x_scale, pot_shifts: tuple[int, ...] = (0,)) -> tuple[int, int]:
    """LOGISTIC/TANH int16 prepare: ``(input_multiplier, input_left_shift)`` that bring the input to
    steps of 1/(3*4096). A (nearly, CheckedLog2) power-of-two scale whose left shift
    ``12 + log2(scale)`` is in ``pot_shifts`` ({0} for LOGISTIC, {0, 1} for TANH) uses ``3 << shift``;
    otherwise ``x_scale * 4096 * 3`` is doubled until above 32767/2 and truncated."""
    pot, log2 = checked_log2(float(x_scale))
    shift = (15 - 3) + log2
    if pot and shift in pot_shifts:
        return 3 << shift, 0
    multiplier = float(np.float32(x_scale)) * 4096.0 * 3.0
    shift = 0
    while multiplier <= 32767.0 / 2.0 and shift <= 30:
        shift += 1
        multiplier *= 2.0
    return int(multiplier), shift


def logistic_int16(x: np.ndarray, input_multiplier: int, input_left_shift: int) -> np.ndarray:
    """TFLite's ``reference_integer_ops::Logistic`` for int16: the input rescaled to 1/(3*4096)
    steps, |x| split into a table index (>> 9) and a 9-bit fraction, linear interpolation in
    Q0.16 << 9, odd symmetry, back to Q0.15 with rounding."""
    x = np.asarray(x, np.int64)
    rnd = (1 << (input_left_shift - 1)) if input_left_shift > 0 else 0
    v = (x * input_multiplier + rnd) >> input_left_shift
    a = np.abs(v)
    uh = a >> 9
    table = SIGMOID_TABLE_Q16
    idx = np.minimum(uh, 254)
    ua, ub = table[idx], table[idx + 1]
    result = np.where(uh >= 255, 0x7FFF << 10, (ua << 9) + (a & 0x1FF) * (ub - ua))
    result = np.where(v >= 0, result + (1 << 9), (1 << (16 + 9)) - result + (1 << 9) - 1)
    return ((result & 0xFFFFFFFF) >> 10).astype(np.int64).astype(np.uint16).view(np.int16)


def logistic_table(dtype: str, x_scale, x_zero_point, y_scale, y_zero_point) -> np.ndarray:
    """LOGISTIC's table: int8 by LUTPopulateInt8 of the float32 sigmoid (output qparams 1/256,
    -128 required), int16 by the interpolated fixed-point sigmoid (zero points 0, output 2**-15)."""
    t = int_type(dtype)
    if t.name == "int8":
        if float(y_scale) != 1.0 / 256 or int(y_zero_point) != -128:
            raise QnnxError("int8 LOGISTIC needs output qparams (1/256, -128), as TFLite")
        return lut_populate_int8(sigmoid_f32, dtype, x_scale, x_zero_point, y_scale, y_zero_point)
    if t.name == "int16":
        if int(x_zero_point) or int(y_zero_point) or float(y_scale) != 2.0 ** -15:
            raise QnnxError("int16 LOGISTIC needs zero points 0 and output scale 2**-15, as TFLite")
        return logistic_int16(_inputs(dtype), *int16_sigmoid_params(x_scale, (0,)))
    raise QnnxError(f"LOGISTIC takes int8 or int16, got {dtype}")


def tanh_int16(x: np.ndarray, input_multiplier: int, input_left_shift: int) -> np.ndarray:
    """TFLite's ``reference_integer_ops::Tanh`` for int16: the sigmoid table read at twice the
    input (index ``|v| >> 8``, 8-bit fraction), ``2 * sigmoid - 1`` in Q0.15 with rounding."""
    x = np.asarray(x, np.int64)
    rnd = (1 << (input_left_shift - 1)) if input_left_shift > 0 else 0
    v = (x * input_multiplier + rnd) >> input_left_shift
    a = np.abs(v)
    uh = a >> 8
    idx = np.minimum(uh, 254)
    ua, ub = SIGMOID_TABLE_Q16[idx], SIGMOID_TABLE_Q16[idx + 1]
    result = np.where(uh >= 255, 0xFFFF << 8, (ua << 8) + (a & 0xFF) * (ub - ua))
    result = np.where(v >= 0, result - (1 << 23) + (1 << 7), -result + (1 << 23) + (1 << 7) - 1)
    return (result >> 8).astype(np.int64).astype(np.uint16).view(np.int16)


def tanh_table(dtype: str, x_scale, x_zero_point, y_scale, y_zero_point) -> np.ndarray:
    """TANH's table: int8 by LUTPopulateInt8 of the float32 tanh, int16 by the fixed-point kernel
    (zero points 0, output scale 2**-15, as TFLite requires)."""
    t = int_type(dtype)
    if t.name == "int8":
        return lut_populate_int8(tanh_f32, dtype, x_scale, x_zero_point, y_scale, y_zero_point)
    if t.name == "int16":
        pot, log2 = checked_log2(float(y_scale))
        if int(x_zero_point) or int(y_zero_point) or not pot or log2 != -15:
            raise QnnxError("int16 TANH needs zero points 0 and output scale 2**-15, as TFLite")
        return tanh_int16(_inputs(dtype), *int16_sigmoid_params(x_scale, (0, 1)))
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
