"""Integer rules: one TFLite builtin (int8, or int16 activations with int8 weights) -> qnnx ops with
LiteRT's reference-kernel arithmetic.

    CONV_2D / DEPTHWISE_CONV_2D   -> Transpose, qnnx.conv (int32), qnnx.requantize, Clip, Transpose
    FULLY_CONNECTED               -> Reshape, qnnx.matmul (int32), qnnx.requantize, Clip, Reshape
    ADD / SUB / MUL               -> qnnx.add / qnnx.sub / qnnx.mul (rounding tflite), Clip
    AVERAGE_POOL_2D / MEAN        -> qnnx.avg_pool / qnnx.global_avg_pool (compute tflite), Clip
    MAX_POOL_2D                   -> MaxPool on the integers (16-bit through float32), Clip
    LOGISTIC, TANH, HARD_SWISH, RELU*, LEAKY_RELU, PRELU -> qnnx.lut (tables of qnnx.numerics_tflite)
    QUANTIZE / DEQUANTIZE         -> qnnx.quantize (rounding tflite) / qnnx.requantize / qnnx.dequantize
    RESHAPE, SQUEEZE, EXPAND_DIMS, TRANSPOSE, CONCATENATION, PAD/PADV2, STRIDED_SLICE, SPLIT/SPLIT_V,
    RESIZE_NEAREST_NEIGHBOR      -> data movement on the integers (equal qparams, as TFLite requires)
    RESIZE_BILINEAR               -> Gathers and int64 weighted sums with TFLite's Q10 weights

The accumulator's scale is ``float64(x_scale) * float64(w_scale)``, exact in float64 (two float32
significands), so the requantize multiplier ``acc_scale / y_scale`` is TFLite's own double
``input_scale * filter_scale / output_scale``. Which MultiplyByQuantizedMultiplier runs depends on
the accumulator: int32 (int8 activations, or int16 with an int32 bias) rounds twice (``tflite``),
int64 (int16 activations with an int64 bias) uses the Q15-reduced multiplier (``fixed_point_q15``,
``upward``); the per-channel FULLY_CONNECTED reference kernel multiplies in double (``double``).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from qnnx import numerics, numerics_tflite
from qnnx.dtypes import int_type
from qnnx.errors import QnnxError
from qnnx.frontends.tflite.registry import Context, Unsupported, arity, options, tflite_rule
from qnnx.frontends.tflite.reader import Operator

ACTIVATION_TYPES = ("int8", "int16")


def _act_type(ctx: Context, i: int) -> str:
    t = ctx.int_type(i)
    if t not in ACTIVATION_TYPES:
        raise Unsupported(f"{ctx.tensor(i).where} is {t}; integer rules take int8 or int16 activations")
    return t


def _rank(ctx: Context, i: int, rank: int) -> tuple[int, ...]:
    shape = ctx.tensor(i).shape
    if len(shape) != rank:
        raise Unsupported(f"{ctx.tensor(i).where} has rank {len(shape)}; expected {rank}")
    return shape


def _same_qparams(ctx: Context, a: int, b: int) -> None:
    qa, qb = ctx.qparams(a), ctx.qparams(b)
    if np.float32(qa.scale[0]) != np.float32(qb.scale[0]) or qa.zero_point[0] != qb.zero_point[0]:
        raise Unsupported(f"{ctx.tensor(a).where} and {ctx.tensor(b).where} have different qparams "
                          f"({qa.scale[0]!r}, {qa.zero_point[0]}) and ({qb.scale[0]!r}, {qb.zero_point[0]}); "
                          "TFLite moves data between equal qparams only")


def _typed(v: ir.Value, dtype: str) -> ir.Value:
    v.type = ir.TensorType(int_type(dtype).onnx)
    return v


def same_padding(size: int, kernel: int, stride: int, dilation: int, padding: str) -> tuple[int, int, int]:
    """TFLite's ComputePaddingHeightWidth: ``(out, before, after)`` of one spatial dim."""
    eff = (kernel - 1) * dilation + 1
    if padding == "SAME":
        out = (size + stride - 1) // stride
    elif padding == "VALID":
        out = (size - eff + stride) // stride
    else:
        raise Unsupported(f"padding {padding} is not SAME or VALID")
    total = max((out - 1) * stride + eff - size, 0)
    return out, total // 2, total - total // 2


def _window(ctx: Context, op: Operator, x_shape, kernel, strides, dilations) -> list[int]:
    padding = ctx.model.enum_name("padding", options(op, "padding")[0])
    pads = [same_padding(x_shape[1 + k], kernel[k], strides[k], dilations[k], padding) for k in range(2)]
    return [pads[0][1], pads[1][1], pads[0][2], pads[1][2]]


def _accumulator_requantize(ctx: Context, op: Operator, acc: ir.Value, x_i: int, w_scale: np.ndarray, bias_i: int,
                            out: int, axis: int, acc_zero_point: np.ndarray | None, compute: str | None = None,
                            worst: float | None = None) -> ir.Value:
    """The requantize of an int32 accumulator to the output, with the MultiplyByQuantizedMultiplier
    TFLite's kernel uses for these types (module docstring)."""
    qx, qy = ctx.qparams(x_i), ctx.qparams(out)
    y_type = _act_type(ctx, out)
    acc_scale = np.float64(qx.scale[0]) * w_scale.astype(np.float64)
    if worst is not None and compute != "double":
        _check_left_shift(worst, acc_scale / np.float64(qy.scale[0]), op.opcode)
    if compute is None:
        bias64 = bias_i >= 0 and ctx.tensor(bias_i).dtype == "INT64"
        compute = "fixed_point_q15" if (_act_type(ctx, x_i) == "int16" and (bias64 or bias_i < 0)) else "fixed_point"
    rounding = "upward" if compute == "fixed_point_q15" else "tflite"
    y = ctx.qnnx("requantize", [acc, ctx.b.const(acc_scale if acc_scale.size > 1 else acc_scale.reshape(()), "acc_scale"),
                                ctx.b.const(np.int32(0) if acc_zero_point is None or not acc_zero_point.any()
                                            else acc_zero_point, "acc_zero_point"), ctx.scale(qy, "y_scale"),
                                ctx.zero_point(qy, "y_zero_point")],
                 out_dtype=y_type, axis=axis, rounding=rounding, compute=compute)
    y.shape = acc.shape
    return ctx.activation(op, y, out)


def _bias(ctx: Context, bias_i: int, x_i: int, w: np.ndarray) -> tuple[ir.Value | None, np.ndarray | None]:
    """The bias as qnnx.conv/matmul's int32 input, and the accumulator's zero point.

    int32 bias (int32 accumulator in TFLite too, wrapping alike): as is, zero point 0. int64 bias
    (16x8: TFLite accumulates in int64): the part that fits beside the worst-case products
    ``max|x - zx| * sum|w|`` in int32 goes into the conv, the rest ``B2`` becomes the accumulator's
    per-channel zero point ``-B2``, so the requantize's ``acc - zero_point`` is TFLite's int64 sum."""
    if bias_i < 0:
        return None, None
    t_bias = ctx.tensor(bias_i)
    bias = ctx.const(bias_i, "bias").astype(np.int64).reshape(-1)
    if t_bias.dtype == "INT32":
        if _act_type(ctx, x_i) == "int16":
            raise Unsupported("int16 activations with an int32 bias: TFLite picks that kernel by the op's "
                              "quantized_bias_type, not the tensor; only int64 biases are supported")
        return ctx.b.const(bias.astype(np.int32), "bias"), None
    if t_bias.dtype != "INT64":
        raise Unsupported(f"bias {t_bias.where} is {t_bias.dtype}, not INT32/INT64")
    t = int_type(_act_type(ctx, x_i))
    zx = int(ctx.qparams(x_i).zero_point[0])
    reach = max(t.qmax - zx, zx - t.qmin)
    products = reach * np.abs(w.astype(np.int64)).reshape(w.shape[0], -1).sum(axis=1)
    lo, hi = -(2 ** 31) + products, 2 ** 31 - 1 - products
    if (lo > hi).any():
        raise Unsupported(f"the products alone may exceed int32 (bound {int(products.max())}); TFLite's accumulator is int64")
    inner = np.clip(bias, lo, hi)
    excess = bias - inner
    if (np.abs(excess) >= 2 ** 31).any():
        raise Unsupported("the int64 bias does not fit an int32 bias and zero point")
    return ctx.b.const(inner.astype(np.int32), "bias"), (-excess).astype(np.int32)


def _worst_accumulator(ctx: Context, x_i: int, w: np.ndarray, bias_i: int) -> float:
    """``max|x - zx| * sum|w| + |bias|`` over the output channels: the largest accumulator possible."""
    t = int_type(_act_type(ctx, x_i))
    zx = int(ctx.qparams(x_i).zero_point[0])
    products = max(t.qmax - zx, zx - t.qmin) * np.abs(w.astype(np.int64)).reshape(w.shape[0], -1).sum(axis=1)
    bias = np.abs(ctx.const(bias_i, "bias").astype(np.int64).reshape(-1)) if bias_i >= 0 else 0
    return float((products + bias).max())


def _weights(ctx: Context, w_i: int, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Constant int8 weights and their scales (per output channel along ``axis``, or one);
    TFLite's per-channel kernels assume symmetric weights, so zero points must be 0."""
    t = ctx.tensor(w_i)
    if t.dtype != "INT8":
        raise Unsupported(f"weights {t.where} are {t.dtype}; int8 weights only")
    w = ctx.const(w_i, "weights")
    q = ctx.qparams(w_i, per_tensor=False)
    if np.any(q.zero_point):
        raise Unsupported(f"weights {t.where} have non-zero zero points")
    if not q.per_tensor and q.axis != axis:
        raise Unsupported(f"weights {t.where} are quantized along axis {q.axis}, expected {axis}")
    return w, q.scale.astype(np.float32)


def _contraction_operands(op: Operator, ctx: Context) -> tuple[int, int, int, int]:
    """Input, weight, bias (-1 when absent) and output tensor indices of a conv or fully connected op,
    its input checked to be an integer activation."""
    arity(op, 2)
    x_i, w_i = op.inputs[:2]
    _act_type(ctx, x_i)
    return x_i, w_i, op.inputs[2] if len(op.inputs) > 2 else -1, op.outputs[0]


@tflite_rule("CONV_2D", "DEPTHWISE_CONV_2D")
def conv_2d(op: Operator, ctx: Context) -> list[ir.Value]:
    x_i, w_i, bias_i, out = _contraction_operands(op, ctx)
    x_shape = _rank(ctx, x_i, 4)
    _rank(ctx, w_i, 4)
    _rank(ctx, out, 4)
    depthwise = op.opcode == "DEPTHWISE_CONV_2D"
    w, w_scale = _weights(ctx, w_i, 3 if depthwise else 0)
    sw, sh, dw, dh = options(op, "strideW", "strideH", "dilationWFactor", "dilationHFactor")
    if depthwise:  # [1, kh, kw, C * multiplier] -> [C * multiplier, 1, kh, kw], one group per input channel
        kernel = w.transpose(3, 0, 1, 2)
        group = x_shape[3]
    else:  # [O, kh, kw, I] -> [O, I, kh, kw]; I < C: grouped
        kernel = w.transpose(0, 3, 1, 2)
        group = x_shape[3] // w.shape[3]
    bias, acc_zp = _bias(ctx, bias_i, x_i, kernel)
    kh, kw = kernel.shape[2:]
    strides, dilations = [sh or 1, sw or 1], [dh or 1, dw or 1]
    pads = _window(ctx, op, x_shape, (kh, kw), strides, dilations)
    m = kernel.shape[0]
    w_scale_v = w_scale if w_scale.size > 1 else np.full(m, w_scale[0], np.float32)
    inputs = [ctx.nchw(ctx.value(x_i)), ctx.b.const(np.ascontiguousarray(kernel), "filter"),
              *ctx.qparam_values(x_i, "x_"), ctx.b.const(w_scale_v, "w_scale"), ctx.b.const(np.zeros(m, np.int32), "w_zero_point")]
    if bias is not None:
        inputs.append(bias)
    acc = ctx.qnnx("conv", inputs, pads=pads, strides=strides, dilations=dilations, group=group,
                   kernel_shape=[kh, kw])
    acc.type = ir.TensorType(ir.DataType.INT32)
    n, oh, ow, oc = ctx.tensor(out).shape
    acc.shape = ir.Shape([n, oc, oh, ow])
    y = _accumulator_requantize(ctx, op, acc, x_i, w_scale_v, bias_i, out, axis=1, acc_zero_point=acc_zp,
                                worst=_worst_accumulator(ctx, x_i, kernel, bias_i))
    return [ctx.nhwc(y)]


@tflite_rule("FULLY_CONNECTED")
def fully_connected(op: Operator, ctx: Context) -> list[ir.Value]:
    x_i, w_i, bias_i, out = _contraction_operands(op, ctx)
    (fmt,) = options(op, "weightsFormat")
    if fmt:
        raise Unsupported("shuffled weights formats are not supported")
    w, w_scale = _weights(ctx, w_i, 0)
    if w.ndim != 2:
        raise Unsupported(f"weights of rank {w.ndim}; FULLY_CONNECTED takes [out, in]")
    units, depth = w.shape
    bias, acc_zp = _bias(ctx, bias_i, x_i, w)
    a = ctx.b.op("Reshape", [ctx.value(x_i), ctx.b.const(np.array([-1, depth], np.int64), "rows")], hint="fc_rows")
    inputs = [a, *ctx.qparam_values(x_i, "a_"), ctx.b.const(np.ascontiguousarray(w.T), "weights_t"),
              ctx.b.const(w_scale if w_scale.size > 1 else w_scale.reshape(()), "b_scale"),
              ctx.b.const(np.zeros(units, np.int32) if w_scale.size > 1 else np.int32(0), "b_zero_point")]
    if bias is not None:
        inputs.append(bias)
    acc = ctx.qnnx("matmul", inputs)
    acc.type = ir.TensorType(ir.DataType.INT32)
    acc.shape = ir.Shape([int(np.prod(ctx.tensor(x_i).shape)) // depth, units])
    a.type, a.shape = ctx.value(x_i).type, ir.Shape([acc.shape[0], depth])
    # TFLite's reference FULLY_CONNECTED kernels multiply the accumulator by the double multiplier.
    y = _accumulator_requantize(ctx, op, acc, x_i, w_scale, bias_i, out, axis=-1, acc_zero_point=acc_zp,
                                compute="double")
    return [ctx.b.op("Reshape", [y, ctx.b.const(np.array(ctx.tensor(out).shape, np.int64), "shape")], hint="fc_out")]


def _check_left_shift(worst: float, multiplier, what: str) -> None:
    """TFLite's MultiplyByQuantizedMultiplier shifts an int32 left by the multiplier's exponent when
    it is above 1, and that shift wraps (C++ overflow) where qnnx saturates: refuse when the worst
    case could reach it."""
    _, shift = numerics.quantize_multiplier(np.max(np.asarray(multiplier, np.float64)))
    if int(shift) > 0 and worst * float(1 << int(shift)) >= 2.0 ** 31:
        raise Unsupported(f"{what}: a multiplier of {float(np.max(multiplier)):.4g} shifts the int32 value left by "
                          f"{int(shift)} bits, where TFLite's kernel would wrap around (worst case {worst:.3g})")


def _binary(op: Operator, ctx: Context, kind: str) -> list[ir.Value]:
    arity(op, 2)
    a_i, b_i = op.inputs[:2]
    out = op.outputs[0]
    types = {_act_type(ctx, i) for i in (a_i, b_i, out)}
    if len(types) != 1:
        raise Unsupported(f"operands and output of different types {sorted(types)}")
    if types == {"int16"} and kind != "mul":
        (pot,) = options(op, "potScaleInt16")
        scales = [float(ctx.qparams(i).scale[0]) for i in (a_i, b_i, out)]
        if pot and all(np.frexp(s)[0] == 0.5 for s in scales):
            raise Unsupported("int16 with power-of-two scales runs TFLite's shift-only kernel, which has no rule")
    qa, qb, qy = (ctx.qparams(i) for i in (a_i, b_i, out))
    t = int_type(next(iter(types)))
    reach = [max(t.qmax - int(q.zero_point[0]), int(q.zero_point[0]) - t.qmin) for q in (qa, qb)]
    if kind == "mul":
        _check_left_shift(float(reach[0] * reach[1]),
                          numerics.mul_multiplier(qa.scale[0], qb.scale[0], qy.scale[0], "tflite"), "MUL")
    else:  # the sum of the two rescaled, left-shifted inputs, then the output multiplier
        ls = numerics.add_left_shift(t.name, t.name)
        ma, mb, my = numerics.add_multipliers(np.float64(qa.scale[0]), np.float64(qb.scale[0]), np.float64(qy.scale[0]), ls)
        _check_left_shift(float((reach[0] * ma + reach[1] * mb) * (1 << ls)) + 2, my, op.opcode)
    # ADD/SUB derive their multipliers in double (numerics.add_multipliers); MUL in float32 (compute "tflite")
    y = ctx.qnnx(kind, [ctx.value(a_i), *ctx.qparam_values(a_i, "a_"), ctx.value(b_i), *ctx.qparam_values(b_i, "b_"),
                        *ctx.qparam_values(out, "y_")], out_dtype=types.pop(), rounding="tflite",
                 compute="tflite" if kind == "mul" else "fixed_point")
    return [ctx.activation(op, y, out)]


@tflite_rule("ADD")
def add(op, ctx):
    return _binary(op, ctx, "add")


@tflite_rule("SUB")
def sub(op, ctx):
    return _binary(op, ctx, "sub")


@tflite_rule("MUL")
def mul(op, ctx):
    return _binary(op, ctx, "mul")


def _nchw_shape(ctx: Context, i: int) -> ir.Shape:
    n, h, w, c = ctx.tensor(i).shape
    return ir.Shape([n, c, h, w])


def _pool_window(op: Operator, ctx: Context):
    arity(op, 1)
    x_i, out = op.inputs[0], op.outputs[0]
    _rank(ctx, x_i, 4)
    _rank(ctx, out, 4)
    sw, sh, fw, fh = options(op, "strideW", "strideH", "filterWidth", "filterHeight")
    pads = _window(ctx, op, ctx.tensor(x_i).shape, (fh, fw), (sh, sw), (1, 1))
    return x_i, out, dict(kernel_shape=[fh, fw], strides=[sh, sw], pads=pads)


@tflite_rule("AVERAGE_POOL_2D")
def average_pool_2d(op, ctx):
    x_i, out, win = _pool_window(op, ctx)
    dtype = _act_type(ctx, x_i)
    _same_qparams(ctx, x_i, out)
    y = ctx.qnnx("avg_pool", [ctx.nchw(ctx.value(x_i)), *ctx.qparam_values(x_i, "x_"), *ctx.qparam_values(out, "y_")],
                 count_include_pad=0, rounding="tflite", compute="tflite", **win)
    _typed(y, dtype)
    y.shape = _nchw_shape(ctx, out)
    return [ctx.nhwc(ctx.activation(op, y, out))]


@tflite_rule("MAX_POOL_2D")
def max_pool_2d(op, ctx):
    x_i, out, win = _pool_window(op, ctx)
    dtype = _act_type(ctx, x_i)
    _same_qparams(ctx, x_i, out)
    x = ctx.nchw(ctx.value(x_i))
    if dtype == "int16":  # ONNX's MaxPool has no 16-bit kernel: float32 holds every int16 exactly
        x = ctx.b.op("Cast", [x], to=ir.DataType.FLOAT)
    y = ctx.b.op("MaxPool", [x], hint="max_pool", **win)
    if dtype == "int16":
        y = ctx.b.op("Cast", [y], to=ir.DataType.INT16)
    _typed(y, dtype)
    y.shape = _nchw_shape(ctx, out)
    return [ctx.nhwc(ctx.activation(op, y, out))]


@tflite_rule("MEAN")
def mean(op, ctx):
    """TFLite's quantized MEAN over any axes: the kept axes first, the reduced ones flattened into one
    spatial dim, qnnx.global_avg_pool (compute tflite), then the output's shape."""
    x_i, axes_i = op.inputs[:2]
    out = op.outputs[0]
    dtype = _act_type(ctx, x_i)
    shape = ctx.tensor(x_i).shape
    axes = sorted({int(a) % len(shape) for a in np.asarray(ctx.const(axes_i, "axes")).reshape(-1)})
    kept = [d for d in range(len(shape)) if d not in axes]
    v = ctx.value(x_i)
    if kept + axes != list(range(len(shape))):
        v = ctx.b.op("Transpose", [v], perm=kept + axes, hint="reduced_last")
    rows = int(np.prod([shape[d] for d in kept]))
    count = int(np.prod([shape[d] for d in axes]))
    v = ctx.b.op("Reshape", [v, ctx.b.const(np.array([1, rows, count], np.int64), "n_c_spatial")], hint="mean_in")
    v.shape = ir.Shape([1, rows, count])
    y = ctx.qnnx("global_avg_pool", [v, *ctx.qparam_values(x_i, "x_"), *ctx.qparam_values(out, "y_")],
                 rounding="tflite", compute="tflite")
    _typed(y, dtype)
    y.shape = ir.Shape([1, rows, 1])
    return [ctx.b.op("Reshape", [y, ctx.b.const(np.array(ctx.tensor(out).shape, np.int64), "shape")], hint="mean_out")]


# ------------------------------------------------------------------ elementwise functions: lookup tables


def _lut(ctx: Context, x_i: int, table: np.ndarray, out: int, axis: int | None = None) -> ir.Value:
    attrs = {} if axis is None else {"axis": axis}
    return _typed(ctx.qnnx("lut", [ctx.value(x_i), ctx.b.const(table, "table")], **attrs), ctx.int_type(out))


def _unary_qparams(ctx: Context, op: Operator):
    arity(op, 1)
    x_i, out = op.inputs[0], op.outputs[0]
    dtype = _act_type(ctx, x_i)
    if _act_type(ctx, out) != dtype:
        raise Unsupported("input and output types differ")
    qx, qy = ctx.qparams(x_i), ctx.qparams(out)
    return x_i, out, dtype, qx.scale[0], int(qx.zero_point[0]), qy.scale[0], int(qy.zero_point[0])


@tflite_rule("LOGISTIC")
def logistic(op, ctx):
    return _table(numerics_tflite.logistic_table, op, ctx)


def _table(fn, op, ctx):
    x_i, out, dtype, sx, zx, sy, zy = _unary_qparams(ctx, op)
    try:
        table = fn(dtype, sx, zx, sy, zy)
    except QnnxError as e:
        raise Unsupported(e.detail) from None
    return [_lut(ctx, x_i, table, out)]


@tflite_rule("TANH")
def tanh(op, ctx):
    return _table(numerics_tflite.tanh_table, op, ctx)


@tflite_rule("HARD_SWISH")
def hard_swish(op, ctx):
    return _table(numerics_tflite.hard_swish_table, op, ctx)


@tflite_rule("RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1")
def relu(op, ctx):
    x_i, out, dtype, sx, zx, sy, zy = _unary_qparams(ctx, op)
    if dtype == "int16" and op.opcode in ("RELU_N1_TO_1", "RELU_0_TO_1"):
        raise Unsupported(f"TFLite has no int16 {op.opcode} kernel")
    name = {"RELU_0_TO_1": "NONE"}.get(op.opcode, op.opcode)
    lo, hi = numerics_tflite.activation_range(name, sy, zy, dtype)
    if op.opcode == "RELU_0_TO_1":
        lo, hi = max(lo, numerics_tflite.quantize_f32(0.0, sy, zy)), min(hi, numerics_tflite.quantize_f32(1.0, sy, zy))
    return [_lut(ctx, x_i, numerics_tflite.requantize_table(dtype, sx, zx, sy, zy, lo, hi), out)]


@tflite_rule("LEAKY_RELU")
def leaky_relu(op, ctx):
    x_i, out, dtype, sx, zx, sy, zy = _unary_qparams(ctx, op)
    (alpha,) = options(op, "alpha")
    return [_lut(ctx, x_i, numerics_tflite.leaky_relu_table(dtype, alpha, sx, zx, sy, zy), out)]


@tflite_rule("PRELU")
def prelu(op, ctx):
    """A constant alpha varying along the channels only (TFLite broadcasts it against NHWC): a
    per-channel table on the last axis."""
    x_i, alpha_i = op.inputs[:2]
    out = op.outputs[0]
    x_i, out, dtype, sx, zx, sy, zy = _unary_qparams(ctx, op)
    if ctx.int_type(alpha_i) != "int8":  # TFLite's integer PRELU reads alpha's data as int8 whatever its type
        raise Unsupported(f"alpha is {ctx.int_type(alpha_i)}; TFLite's integer PRELU takes an int8 alpha")
    alpha = np.asarray(ctx.const(alpha_i, "alpha"))
    qa = ctx.qparams(alpha_i)
    channels = ctx.tensor(x_i).shape[-1]
    flat = alpha.reshape(-1)
    if alpha.size not in (1, channels) or (alpha.size == channels and alpha.shape[-1] != channels):
        raise Unsupported(f"alpha of shape {list(alpha.shape)} varies along more than the channels")
    table = numerics_tflite.prelu_table(dtype, np.broadcast_to(flat, (channels,)), qa.scale[0], int(qa.zero_point[0]),
                                        sx, zx, sy, zy)
    return [_lut(ctx, x_i, table, out, axis=-1)]


@tflite_rule("SOFTMAX")
def softmax(op, ctx):
    """int8 input (int8 or int16 output) or int16 input and output, beta 1: qnnx.softmax with
    TFLite's kernels (gemmlowp fixed point for int8, interpolated exp and reciprocal tables for int16)."""
    arity(op, 1)
    x_i, out = op.inputs[0], op.outputs[0]
    x_type = _act_type(ctx, x_i)
    (beta,) = options(op, "beta")
    if beta != 1.0:
        raise Unsupported(f"beta {beta}: the integer rule takes beta 1")
    y_type = _act_type(ctx, out)
    try:
        q, qy = ctx.qparams(x_i), ctx.qparams(out)
        rank = len(ctx.tensor(x_i).shape)
        numerics.check_tflite_softmax(int_type(x_type), q.scale, q.zero_point, int_type(y_type), qy.scale[0],
                                      qy.zero_point[0], rank - 1, rank, "tflite")
        if x_type == "int16":
            numerics.tflite_softmax_int16_tables(float(q.scale[0]))  # refuses a scale TFLite would wrap on
    except QnnxError as e:
        raise Unsupported(e.detail) from None
    return [ctx.qnnx("softmax", [ctx.value(x_i), *ctx.qparam_values(x_i, "x_"), *ctx.qparam_values(out, "y_")],
                     out_dtype=y_type, axis=-1, rounding="tflite", compute="tflite")]


# ------------------------------------------------------------------ affine conversions


@tflite_rule("QUANTIZE")
def quantize(op, ctx):
    x_i, out = op.inputs[0], op.outputs[0]
    t = ctx.tensor(x_i)
    y_type = ctx.int_type(out)
    qy = ctx.qparams(out)
    if t.dtype == "FLOAT32":  # TFLite: zero_point + (int)TfLiteRound(x / scale) in float32
        return [ctx.qnnx("quantize", [ctx.value(x_i), ctx.scale(qy, "y_scale"), ctx.zero_point(qy, "y_zero_point")],
                         out_dtype=y_type, rounding="tflite")]
    ctx.int_type(x_i)  # requantize: MultiplyByQuantizedMultiplier of (double) sx / sy
    qx = ctx.qparams(x_i)
    return [ctx.qnnx("requantize", [ctx.value(x_i), ctx.scale(qx, "x_scale"), ctx.zero_point(qx, "x_zero_point"),
                                    ctx.scale(qy, "y_scale"), ctx.zero_point(qy, "y_zero_point")],
                     out_dtype=y_type, rounding="tflite", compute="fixed_point")]


@tflite_rule("DEQUANTIZE")
def dequantize(op, ctx):
    x_i = op.inputs[0]
    t = ctx.tensor(x_i)
    if t.dtype == "FLOAT16":  # a float16 constant (weights stored half size): folded to float32
        return [ctx.b.const(ctx.const(x_i, "float16 weights").astype(np.float32), "dequantized")]
    ctx.int_type(x_i)
    q = ctx.qparams(x_i, per_tensor=False)
    if q.per_tensor:
        return [ctx.qnnx("dequantize", [ctx.value(x_i), ctx.scale(q, "scale"), ctx.zero_point(q, "zero_point")])]
    if t.data is None:
        raise Unsupported(f"{t.where}: per-axis dequantize of a computed tensor")
    return [ctx.b.const(numerics.dequantize(t.data, q.scale, q.zero_point, axis=q.axis), "dequantized")]


# ------------------------------------------------------------------ data movement


def _reshape_to_output(op, ctx):
    x_i, out = op.inputs[0], op.outputs[0]
    if ctx.tensor(x_i).qparams is not None or ctx.tensor(out).qparams is not None:
        _same_qparams(ctx, x_i, out)
    return [ctx.b.op("Reshape", [ctx.value(x_i), ctx.b.const(np.array(ctx.tensor(out).shape, np.int64), "shape")],
                     hint="reshape")]


@tflite_rule("RESHAPE", "SQUEEZE", "EXPAND_DIMS")
def reshape(op, ctx):
    return _reshape_to_output(op, ctx)


@tflite_rule("TRANSPOSE")
def transpose(op, ctx):
    x_i, perm_i = op.inputs[:2]
    _same_qparams(ctx, x_i, op.outputs[0])
    perm = [int(p) for p in np.asarray(ctx.const(perm_i, "perm")).reshape(-1)]
    return [ctx.b.op("Transpose", [ctx.value(x_i)], perm=perm, hint="transpose")]


@tflite_rule("CONCATENATION")
def concatenation(op, ctx):
    out = op.outputs[0]
    for i in op.inputs:
        _same_qparams(ctx, i, out)
    axis, act = options(op, "axis", "fusedActivationFunction")
    if act:
        raise Unsupported("TFLite's integer CONCATENATION takes no fused activation")
    return [ctx.b.op("Concat", [ctx.value(i) for i in op.inputs], axis=int(axis), hint="concat")]


@tflite_rule("PAD", "PADV2")
def pad(op, ctx):
    """Pad with the output's zero point (PAD: real 0) or PADV2's constant, on the integers."""
    x_i, pads_i = op.inputs[:2]
    out = op.outputs[0]
    dtype = _act_type(ctx, x_i)
    _same_qparams(ctx, x_i, out)
    p = np.asarray(ctx.const(pads_i, "paddings")).astype(np.int64).reshape(-1, 2)
    if op.opcode == "PADV2" and len(op.inputs) > 2 and op.inputs[2] >= 0:
        value = np.asarray(ctx.const(op.inputs[2], "constant_values")).reshape(())
    else:
        value = ctx.qparams(out).zero_point[0]
    x, pad_type = ctx.value(x_i), int_type(dtype).numpy
    if dtype == "int16":  # ONNX Runtime's Pad has no 16-bit kernel: float32 holds every int16 exactly
        x, pad_type = ctx.b.op("Cast", [x], to=ir.DataType.FLOAT), np.float32
    y = ctx.b.op("Pad", [x, ctx.b.const(np.concatenate([p[:, 0], p[:, 1]]), "pads"),
                         ctx.b.const(np.array(value, pad_type), "pad_value")], mode="constant", hint="pad")
    if dtype == "int16":
        y = ctx.b.op("Cast", [y], to=ir.DataType.INT16)
    return [_typed(y, dtype)]


def strided_slice_ranges(shape, begin, end, strides, begin_mask, end_mask, shrink_mask) -> list[tuple[int, int, int]]:
    """TFLite's StridedSlice (no ellipsis or new axes, offset off) as python ``(start, stop, step)``
    per axis on a static shape: masked ends take the whole axis, shrunk axes one element."""
    ranges = []
    for d, size in enumerate(shape):
        s = int(strides[d]) if d < len(strides) else 1
        if d >= len(begin):
            ranges.append((0, size, 1))
            continue
        b, e = int(begin[d]), int(end[d])
        if shrink_mask >> d & 1:
            b = b + size if b < 0 else b
            ranges.append((b, b + 1, 1))
            continue
        start = None if begin_mask >> d & 1 else b
        stop = None if end_mask >> d & 1 else e
        ranges.append(slice(start, stop, s).indices(size))
    return ranges


@tflite_rule("STRIDED_SLICE")
def strided_slice(op, ctx):
    x_i, b_i, e_i, s_i = op.inputs[:4]
    out = op.outputs[0]
    if ctx.tensor(x_i).qparams is not None:
        _same_qparams(ctx, x_i, out)
    bm, em, ellipsis, new_axis, shrink, offset = options(op, "beginMask", "endMask", "ellipsisMask", "newAxisMask",
                                                         "shrinkAxisMask", "offset")
    if ellipsis or new_axis or offset:
        raise Unsupported("ellipsis_mask, new_axis_mask and offset are not supported")
    ranges = strided_slice_ranges(ctx.tensor(x_i).shape, *(np.asarray(ctx.const(i, n)).reshape(-1) for i, n in
                                                          ((b_i, "begin"), (e_i, "end"), (s_i, "strides"))), bm, em, shrink)
    starts, stops, steps = (np.array([r[k] for r in ranges], np.int64) for k in range(3))
    stops = np.where((steps < 0) & (stops < 0), np.iinfo(np.int64).min, stops)  # python's -1 stop: before index 0
    y = ctx.b.op("Slice", [ctx.value(x_i), ctx.b.const(starts, "starts"), ctx.b.const(stops, "ends"),
                           ctx.b.const(np.arange(len(ranges), dtype=np.int64), "axes"), ctx.b.const(steps, "steps")],
                 hint="strided_slice")
    return [ctx.b.op("Reshape", [y, ctx.b.const(np.array(ctx.tensor(out).shape, np.int64), "shape")], hint="shrink")]


@tflite_rule("SPLIT", "SPLIT_V")
def split(op, ctx):
    if op.opcode == "SPLIT":
        axis_i, x_i = op.inputs[:2]
    else:
        x_i, _, axis_i = op.inputs[:3]
    for o in op.outputs:
        _same_qparams(ctx, x_i, o)
    axis = int(np.asarray(ctx.const(axis_i, "axis")).reshape(()))
    axis %= len(ctx.tensor(x_i).shape)
    sizes = [ctx.tensor(o).shape[axis] for o in op.outputs]
    ys = ctx.b.op("Split", [ctx.value(x_i), ctx.b.const(np.array(sizes, np.int64), "split")], axis=axis,
                  outputs=len(sizes), hint="split")
    return list(ys) if len(sizes) > 1 else [ys]


@tflite_rule("RESIZE_BILINEAR")
def resize_bilinear(op, ctx):
    """TFLite's ResizeBilinearInteger on the integers, in int64: the four source values (Gathers of
    the indices numerics_tflite.bilinear_taps computes offline) weighted by products of 1/1024
    weights (summing to 2**20), the sum divided by 2**20 ties away from zero (C division after
    adding +-2**19). Zero points are not subtracted: the weights sum to one, and TFLite requires
    equal input and output qparams."""
    arity(op, 1)
    x_i, out = op.inputs[0], op.outputs[0]
    dtype = _act_type(ctx, x_i)
    _same_qparams(ctx, x_i, out)
    _rank(ctx, x_i, 4)
    _rank(ctx, out, 4)
    align, half = options(op, "alignCorners", "halfPixelCenters")
    if align and half:
        raise Unsupported("align_corners with half_pixel_centers (TFLite refuses the pair)")
    (_, h, w, _), (_, oh, ow, _) = ctx.tensor(x_i).shape, ctx.tensor(out).shape
    y0, y1, wy = numerics_tflite.bilinear_taps(h, oh, bool(align), bool(half))
    x0, x1, wx = numerics_tflite.bilinear_taps(w, ow, bool(align), bool(half))
    b = ctx.b
    x = b.op("Cast", [ctx.value(x_i)], to=ir.DataType.INT64, hint="as_int64")
    rows = [b.op("Gather", [x, b.const(i, "rows")], axis=1, hint="rows") for i in (y0, y1)]
    total = None
    for r, wr in zip(rows, (1024 - wy, wy)):
        for i, wc in zip((x0, x1), (1024 - wx, wx)):
            tap = b.op("Gather", [r, b.const(i, "cols")], axis=2, hint="tap")
            weight = (wr.reshape(1, -1, 1, 1) * wc.reshape(1, 1, -1, 1)).astype(np.int64)
            term = b.op("Mul", [tap, b.const(weight, "weight_q20")], hint="weighted")
            total = term if total is None else b.op("Add", [total, term], hint="sum_q20")
    half_unit, unit = b.const(np.int64(1 << 19), "half_q20"), b.const(np.int64(1 << 20), "one_q20")
    up = b.op("Div", [b.op("Add", [total, half_unit]), unit], hint="round_pos")
    down = b.op("Div", [b.op("Sub", [total, half_unit]), unit], hint="round_neg")
    y = b.op("Where", [b.op("Greater", [total, b.const(np.int64(0), "zero")]), up, down], hint="bilinear")
    return [_typed(b.op("Cast", [y], to=int_type(dtype).onnx, hint="resized"), dtype)]


def nearest_indices(in_size: int, out_size: int, align_corners: bool, half_pixel_centers: bool) -> np.ndarray:
    """TFLite's GetNearestNeighbor for every output index (float32 arithmetic)."""
    f32 = np.float32
    scale = (f32(in_size - 1) / f32(out_size - 1)) if (align_corners and out_size > 1) else f32(in_size) / f32(out_size)
    offset = f32(0.5) if half_pixel_centers else f32(0.0)
    pos = (np.arange(out_size).astype(f32) + offset) * scale
    idx = numerics_tflite.tflite_round(pos) if align_corners else np.floor(pos)
    idx = np.minimum(idx.astype(np.int64), in_size - 1)
    return np.maximum(idx, 0) if half_pixel_centers else idx


@tflite_rule("RESIZE_NEAREST_NEIGHBOR")
def resize_nearest_neighbor(op, ctx):
    """Two Gathers (rows, then columns) with TFLite's source indices computed offline."""
    arity(op, 1)
    x_i, out = op.inputs[0], op.outputs[0]
    _same_qparams(ctx, x_i, out)
    align, half = options(op, "alignCorners", "halfPixelCenters")
    (_, h, w, _), (_, oh, ow, _) = _rank(ctx, x_i, 4), _rank(ctx, out, 4)
    y = ctx.value(x_i)
    for axis, n, m in ((1, h, oh), (2, w, ow)):
        y = ctx.b.op("Gather", [y, ctx.b.const(nearest_indices(n, m, bool(align), bool(half)), "indices")], axis=axis,
                     hint="nearest")
    return [_typed(y, ctx.int_type(out))]
