"""int8 -> int32 ops (conv, matmul) and integer pooling.

conv and matmul produce the int32 accumulator, whose implied qparams are
``scale = x_scale * w_scale`` (per output channel when ``w_scale`` is), zero
point 0; in canonical form a ``requantize`` always follows (docs/canonical.md).
Accumulation wraps modulo 2**32 like every int32 hardware accumulator.
"""

from __future__ import annotations

import numpy as np

from qnnx import numerics, numerics_mlas
from qnnx.dialect.schema import (Attribute, Input, avg_pool_compute_attr, global_pool_compute_attr, op,
                                 qparam_inputs, rounding_attr)
from qnnx.dialect.windows import window
from qnnx.dtypes import as_int64, int_type
from qnnx.errors import QnnxError

ACT_TYPES = ("int8", "uint8", "int16", "uint16")
WEIGHT_TYPES = ("int8", "uint8", "int4", "uint4")


def _wrap_int32(acc: np.ndarray) -> np.ndarray:
    return acc.astype(np.int64).astype(np.int32)  # two's complement wrap, like the hardware


def _typed(x, allowed, name):
    t = int_type(np.asarray(x).dtype)
    if t.name not in allowed:
        raise QnnxError(f"{name} has dtype {t.name}; supported: {', '.join(allowed)}")
    return t


def _per_tensor(p, name):
    p = np.asarray(p)
    if p.size != 1:
        raise QnnxError(f"{name} must be per-tensor (one value), got shape {p.shape}")
    return p.reshape(())


_WINDOW_ATTRS = (
    Attribute("auto_pad", str, "NOTSET", "ONNX auto_pad", ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")),
    Attribute("kernel_shape", list, None, "spatial kernel size (inferred from w for conv)"),
    Attribute("pads", list, None, "[begin..., end...] padding; padded values are the zero point (real 0)"),
    Attribute("strides", list, None, "strides per spatial dim (default 1)"),
)


@op("conv", doc="Integer convolution (1-D/2-D/N-D, groups, depthwise): "
    "`y[n,m] = sum (x[c] - x_zp[c]) * (w[m] - w_zp[m]) + bias[m]` as int32. x's qparams are per-tensor, or "
    "per input channel (axis 1) for a depthwise conv (C/group = 1), whose output channel m then has the "
    "accumulator scale `x_scale[m // (M / C)] * w_scale[m]`.",
    inputs=(Input("x", "activations N x C x spatial"), Input("w", "weights M x C/group x kernel"),
            Input("x_scale", "scale of x: float scalar, or 1-D of C for a depthwise conv"),
            Input("x_zero_point", "zero point of x: int32 scalar, or 1-D of C for a depthwise conv"),
            Input("w_scale", "scale of w: scalar or 1-D of M (per output channel)"),
            Input("w_zero_point", "zero point of w: int32 scalar or 1-D of M"),
            Input("bias", "int32 1-D of M, scale x_scale * w_scale, zero point 0", optional=True)),
    outputs=(Input("y", "int32 accumulator"),),
    attributes=(*_WINDOW_ATTRS, Attribute("dilations", list, None, "dilations per spatial dim (default 1)"),
                Attribute("group", int, 1, "number of groups (C for depthwise)")),
    types="x: int8/uint8/int16/uint16; w: int8/uint8/int4/uint4; y: int32")
def conv(x, w, x_scale, x_zero_point, w_scale, w_zero_point, bias=None, *, auto_pad, kernel_shape, pads,
         strides, dilations, group):
    tx = _typed(x, ACT_TYPES, "x")
    tw = _typed(w, WEIGHT_TYPES, "w")
    x, w = np.asarray(x), np.asarray(w)
    if x.ndim < 3 or w.ndim != x.ndim:
        raise QnnxError(f"conv expects x and w of equal rank >= 3, got {x.shape} and {w.shape}")
    n_out, c_per_group = w.shape[0], w.shape[1]
    if group < 1 or x.shape[1] != c_per_group * group or n_out % group:
        raise QnnxError(f"channels do not match: x has {x.shape[1]}, w {w.shape} with group={group}")
    xs = numerics.check_scale(x_scale, "x_scale")
    numerics.broadcast_param(numerics.check_scale(w_scale, "w_scale"), w.shape, 0, 0, "w_scale")
    xz = numerics.check_zero_point(x_zero_point, tx, "x_zero_point")
    if xs.size > 1 or xz.size > 1:
        if c_per_group != 1:
            raise QnnxError("per-channel x qparams need a depthwise conv (one input channel per group): an output "
                            "channel's accumulator has one scale")
        xz = numerics.broadcast_param(xz, x.shape, 1, 0, "x_zero_point")
        numerics.broadcast_param(xs, x.shape, 1, 0, "x_scale")
    else:
        xz = xz.reshape(())
    wz = numerics.broadcast_param(numerics.check_zero_point(w_zero_point, tw, "w_zero_point"), w.shape, 0, 0,
                                  "w_zero_point")
    if kernel_shape is not None and tuple(kernel_shape) != w.shape[2:]:
        raise QnnxError(f"kernel_shape {kernel_shape} does not match w shape {w.shape}")
    win = window(x.shape[2:], w.shape[2:], strides, dilations, pads, auto_pad)
    xp = win.padded(as_int64(x) - xz)
    wq = as_int64(w) - wz
    n = x.shape[0]
    xg = xp.reshape(n, group, c_per_group, *xp.shape[2:])
    wg = wq.reshape(group, n_out // group, c_per_group, *w.shape[2:])
    acc = np.zeros((n, group, n_out // group, *win.out), dtype=np.int64)
    for idx, view in win.taps(xg.reshape(n, group * c_per_group, *xp.shape[2:])):
        view = view.reshape(n, group, c_per_group, *win.out)
        acc += np.einsum("ngc...,gmc->ngm...", view, wg[(slice(None), slice(None), slice(None), *idx)])
    acc = acc.reshape(n, n_out, *win.out)
    if bias is not None:
        b = np.asarray(bias)
        if b.dtype != np.int32 or b.shape != (n_out,):
            raise QnnxError(f"bias must be int32 of shape ({n_out},), got {b.dtype} {b.shape}")
        acc += b.astype(np.int64).reshape(1, n_out, *([1] * len(win.out)))
    return (_wrap_int32(acc),)


@op("matmul", doc="Integer matrix product (2-D or batched, numpy broadcasting): "
    "`y = (a - a_zp) @ (b - b_zp)` as int32.",
    inputs=(Input("a", "left operand ... x M x K"),
            Input("a_scale", "scale of a: scalar or 1-D of M (per row)"),
            Input("a_zero_point", "zero point of a: int32 scalar or 1-D of M"),
            Input("b", "right operand ... x K x N"),
            Input("b_scale", "scale of b: scalar or 1-D of N (per column)"),
            Input("b_zero_point", "zero point of b: int32 scalar or 1-D of N"),
            Input("bias", "int32 1-D of N added to every row, scale a_scale * b_scale, zero point 0",
                  optional=True)),
    outputs=(Input("y", "int32 accumulator"),),
    types="a: int8/uint8/int16/uint16; b: int8/uint8/int4/uint4/int16; y: int32")
def matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, bias=None):
    ta = _typed(a, ACT_TYPES, "a")
    tb = _typed(b, WEIGHT_TYPES + ("int16",), "b")
    a, b = np.asarray(a), np.asarray(b)
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        raise QnnxError(f"matmul shapes {a.shape} and {b.shape} do not match")
    rows, cols = a.shape[-2], b.shape[-1]

    def along(p, t, n, name):
        p = numerics.check_zero_point(p, t, name)
        if p.size not in (1, n) or p.ndim > 1:
            raise QnnxError(f"{name} must be a scalar or 1-D of {n}, got shape {p.shape}")
        return p.reshape(-1)

    for s, name, n in ((a_scale, "a_scale", rows), (b_scale, "b_scale", cols)):
        s = numerics.check_scale(s, name)
        if s.size not in (1, n) or s.ndim > 1:
            raise QnnxError(f"{name} must be a scalar or 1-D of {n}, got shape {s.shape}")
    az = along(a_zero_point, ta, rows, "a_zero_point").reshape(-1, 1)
    bz = along(b_zero_point, tb, cols, "b_zero_point")
    acc = np.matmul(as_int64(a) - az, as_int64(b) - bz)
    if bias is not None:
        bias = np.asarray(bias)
        if bias.dtype != np.int32 or bias.shape != (cols,):
            raise QnnxError(f"bias must be int32 of shape ({cols},), got {bias.dtype} {bias.shape}")
        acc = acc + bias.astype(np.int64)
    return (_wrap_int32(acc),)


_POOL_QPARAMS = (Input("x", "integer activations N x C x spatial"),
                 *qparam_inputs("x_", "x (per-tensor or per channel, axis 1)"),
                 *qparam_inputs("y_", "y (per-tensor or per channel, axis 1)"))
_POOL_DOC = ("the window sum of `x - x_zp` (int32) requantized by `x_scale / (count * y_scale)`; "
             "the output has x's dtype")


def _pool_requantize(sums, count, x, x_scale, y_scale, y_zero_point, rounding, compute):
    t = int_type(x.dtype)
    shape = sums.shape
    sx = numerics.broadcast_param(numerics.check_scale(x_scale, "x_scale"), shape, 1, 0, "x_scale")
    sy = numerics.broadcast_param(numerics.check_scale(y_scale, "y_scale"), shape, 1, 0, "y_scale")
    zy = numerics.broadcast_param(numerics.check_zero_point(y_zero_point, t, "y_zero_point"), shape, 1, 0,
                                  "y_zero_point")
    mult = sx.astype(np.float64) / (np.asarray(count, np.float64) * sy.astype(np.float64))
    r = numerics.scale_and_round(sums, mult, rounding=rounding, compute=compute)
    return numerics.saturate(r + zy, t)


def tflite_same_qparams(x, x_scale, x_zero_point, y_scale, y_zero_point, rounding) -> np.ndarray:
    """compute="tflite" average pooling keeps the qparams (TFLite refuses others): per-tensor, equal;
    returns x's zero point."""
    if rounding != "tflite":
        raise QnnxError(f"compute='tflite' rounds as TFLite does (rounding='tflite'), got {rounding!r}")
    t = int_type(np.asarray(x).dtype)
    sx, sy = _per_tensor(x_scale, "x_scale"), _per_tensor(y_scale, "y_scale")
    zx = numerics.check_zero_point(_per_tensor(x_zero_point, "x_zero_point"), t, "x_zero_point")
    zy = numerics.check_zero_point(_per_tensor(y_zero_point, "y_zero_point"), t, "y_zero_point")
    if np.float32(sx) != np.float32(sy) or zx != zy:
        raise QnnxError("compute='tflite' average pooling needs equal input and output qparams, got "
                        f"({float(sx)!r}, {int(zx)}) and ({float(sy)!r}, {int(zy)})")
    return zx


def tflite_mean(sums, count, x, x_scale, y_scale, y_zero_point, rounding):
    """TFLite's MEAN on the centered sums: numerics.tflite_mean_multiplier, then
    MultiplyByQuantizedMultiplier (double rounding) and the output zero point. Per-tensor qparams."""
    if rounding != "tflite":
        raise QnnxError(f"compute='tflite' rounds as TFLite does (rounding='tflite'), got {rounding!r}")
    t = int_type(np.asarray(x).dtype)
    sx = numerics.check_scale(_per_tensor(x_scale, "x_scale"), "x_scale")
    sy = numerics.check_scale(_per_tensor(y_scale, "y_scale"), "y_scale")
    zy = numerics.check_zero_point(_per_tensor(y_zero_point, "y_zero_point"), t, "y_zero_point")
    m, shift = numerics.tflite_mean_multiplier(numerics.requantize_multiplier(sx, sy), int(count))
    r = numerics.multiply_by_quantized_multiplier(sums, m, shift, "tflite")
    return numerics.saturate(r + zy, t)


def _shifted(x, x_zero_point):
    t = _typed(x, ACT_TYPES, "x")
    x = np.asarray(x)
    if x.ndim < 3:
        raise QnnxError(f"pooling expects N x C x spatial, got shape {x.shape}")
    zx = numerics.broadcast_param(numerics.check_zero_point(x_zero_point, t, "x_zero_point"), x.shape, 1, 0,
                                  "x_zero_point")
    return x, as_int64(x) - zx


@op("avg_pool", doc="Integer average pooling: " + _POOL_DOC + ". `count` is the window size, or with "
    "`count_include_pad=0` the number of non-pad elements at each position.",
    inputs=_POOL_QPARAMS, outputs=(Input("y", "integer tensor, x's dtype"),),
    attributes=(*_WINDOW_ATTRS, Attribute("count_include_pad", int, 0, "count padding in the divisor"),
                Attribute("ceil_mode", int, 0, "only 0 (floor) is supported", (0,)),
                rounding_attr("tflite"), avg_pool_compute_attr()),
    types="x: int8/uint8/int16/uint16; scales float; zero points int32")
def avg_pool(x, x_scale, x_zero_point, y_scale, y_zero_point, *, auto_pad, kernel_shape, pads, strides,
             count_include_pad, ceil_mode, rounding, compute):
    x, xs = _shifted(x, x_zero_point)
    if kernel_shape is None:
        raise QnnxError("avg_pool requires kernel_shape")
    win = window(x.shape[2:], kernel_shape, strides, None, pads, auto_pad)
    count = win.divisors(x.shape[2:], count_include_pad)
    if numerics.check_compute(compute, numerics.AVG_POOL_COMPUTE_MODES) == "mlas":
        return (_avg_pool_mlas(win, x, xs, x_scale, y_scale, y_zero_point, count, rounding),)
    sums = sum(view for _, view in win.taps(win.padded(xs)))
    if compute == "tflite":
        zx = tflite_same_qparams(x, x_scale, x_zero_point, y_scale, y_zero_point, rounding)
        n = np.asarray(count).astype(np.int64)
        return (numerics.saturate(numerics.tflite_average(sums + zx * n, n), int_type(x.dtype)),)
    return (_pool_requantize(sums, count, x, x_scale, y_scale, y_zero_point, rounding, compute),)


def _avg_pool_mlas(win, x, xs, x_scale, y_scale, y_zero_point, count, rounding):
    """ORT's QLinearAveragePool (numerics_mlas.average_pool), 8-bit and per-tensor as ORT."""
    t = int_type(x.dtype)
    sx, _ = numerics.per_tensor_8bit("x", t, x_scale, 0)
    sy, zy = numerics.per_tensor_8bit("y", t, y_scale, y_zero_point)
    numerics.check_mlas_rounding(rounding)
    real = win.padded(xs).astype(np.float32) * sx  # ORT dequantizes the whole input first
    v = numerics_mlas.average_pool((view for _, view in win.taps(real)), count, sy, zy)
    return numerics.saturate(np.rint(v).astype(np.int64), t)


@op("global_avg_pool", doc="Integer global average pooling over all spatial dims: " + _POOL_DOC + ".",
    inputs=_POOL_QPARAMS, outputs=(Input("y", "integer tensor N x C x 1..., x's dtype"),),
    attributes=(rounding_attr("tflite"), global_pool_compute_attr()),
    types="x: int8/uint8/int16/uint16; scales float; zero points int32")
def global_avg_pool(x, x_scale, x_zero_point, y_scale, y_zero_point, *, rounding, compute):
    x, xs = _shifted(x, x_zero_point)
    axes = tuple(range(2, x.ndim))
    sums = xs.sum(axis=axes, keepdims=True)
    count = np.prod([x.shape[a] for a in axes])
    if numerics.check_compute(compute, numerics.GLOBAL_POOL_COMPUTE_MODES) == "tflite":
        return (tflite_mean(sums, count, x, x_scale, y_scale, y_zero_point, rounding),)
    return (_pool_requantize(sums, count, x, x_scale, y_scale, y_zero_point, rounding, compute),)



@op("conv_transpose", doc="Integer transposed convolution: every `(x - x_zp)[n, c, i]` scatters "
    "`(w - w_zp)[c, m]` to output position `i * stride + k * dilation - pad_begin`, summed as int32.",
    inputs=(Input("x", "activations N x C x spatial"), Input("w", "weights C x M/group x kernel"),
            *qparam_inputs("x_", "x (per-tensor)"),
            Input("w_scale", "scale of w: scalar or 1-D of M (per output channel, axis 1; group 1)"),
            Input("w_zero_point", "zero point of w: int32 scalar or 1-D of M"),
            Input("bias", "int32 1-D of M, scale x_scale * w_scale, zero point 0", optional=True)),
    outputs=(Input("y", "int32 accumulator"),),
    attributes=(Attribute("kernel_shape", list, None, "spatial kernel size (inferred from w)"),
                Attribute("pads", list, None, "[begin..., end...] cropped from the full output"),
                Attribute("strides", list, None, "strides per spatial dim (default 1)"),
                Attribute("dilations", list, None, "dilations per spatial dim (default 1)"),
                Attribute("output_padding", list, None, "extra size at the end of each spatial dim"),
                Attribute("group", int, 1, "number of groups")),
    types="x: int8/uint8/int16/uint16; w: int8/uint8/int4/uint4; y: int32")
def conv_transpose(x, w, x_scale, x_zero_point, w_scale, w_zero_point, bias=None, *, kernel_shape, pads, strides,
                   dilations, output_padding, group):
    tx = _typed(x, ACT_TYPES, "x")
    tw = _typed(w, WEIGHT_TYPES, "w")
    x, w = np.asarray(x), np.asarray(w)
    if x.ndim < 3 or w.ndim != x.ndim or x.shape[1] != w.shape[0] or x.shape[1] % group:
        raise QnnxError(f"conv_transpose shapes do not match: x {x.shape}, w {w.shape}, group={group}")
    nsp = x.ndim - 2
    n_out = w.shape[1] * group
    numerics.check_scale(x_scale, "x_scale")
    ws = numerics.check_scale(w_scale, "w_scale")
    if ws.size not in (1, n_out) or (ws.size > 1 and group != 1):
        raise QnnxError(f"w_scale must be a scalar or 1-D of {n_out} (group 1), got shape {ws.shape}")
    xz = numerics.check_zero_point(_per_tensor(x_zero_point, "x_zero_point"), tx, "x_zero_point")
    wz = numerics.check_zero_point(w_zero_point, tw, "w_zero_point").reshape(-1)
    if wz.size not in (1, w.shape[1]):
        raise QnnxError(f"w_zero_point must be a scalar or 1-D of {w.shape[1]}")
    kernel = w.shape[2:]
    if kernel_shape is not None and tuple(kernel_shape) != kernel:
        raise QnnxError(f"kernel_shape {kernel_shape} does not match w shape {w.shape}")
    strides = list(strides or [1] * nsp)
    dilations = list(dilations or [1] * nsp)
    pads = list(pads or [0] * (2 * nsp))
    output_padding = list(output_padding or [0] * nsp)
    xs = as_int64(x) - xz
    wq = as_int64(w) - wz.reshape(1, -1, *([1] * nsp))
    full = [s * (n - 1) + (k - 1) * d + 1 + op for n, k, s, d, op in
            zip(x.shape[2:], kernel, strides, dilations, output_padding)]
    cg, mg = x.shape[1] // group, w.shape[1]
    out = np.zeros((x.shape[0], group, mg, *full), dtype=np.int64)
    xg = xs.reshape(x.shape[0], group, cg, *x.shape[2:])
    wg = wq.reshape(group, cg, mg, *kernel)
    for idx in np.ndindex(*kernel):
        contrib = np.einsum("ngc...,gcm->ngm...", xg, wg[(slice(None), slice(None), slice(None), *idx)])
        sl = tuple(slice(k * d, k * d + s * (n - 1) + 1, s)
                   for k, d, s, n in zip(idx, dilations, strides, x.shape[2:]))
        out[(slice(None), slice(None), slice(None), *sl)] += contrib
    out = out.reshape(x.shape[0], n_out, *full)
    crop = tuple(slice(pads[i], full[i] - pads[i + nsp]) for i in range(nsp))
    out = out[(slice(None), slice(None), *crop)]
    if bias is not None:
        b = np.asarray(bias)
        if b.dtype != np.int32 or b.shape != (n_out,):
            raise QnnxError(f"bias must be int32 of shape ({n_out},), got {b.dtype} {b.shape}")
        out = out + b.astype(np.int64).reshape(1, n_out, *([1] * nsp))
    return (_wrap_int32(out),)
