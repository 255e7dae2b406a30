"""Lower every ``qnnx`` op to standard ONNX ops, bit-identical to ``qnnx.numerics``.

One rule per op (``@lower_rule``), each building the numerics steps with the
emitters of :mod:`qnnx.passes.lower_arith`:

    quantize / simulated_quantize   -> Div, exact rounding, Add zp, clamp, Cast
    dequantize / simulated_dequantize -> Sub zp, Cast, Mul
    requantize                      -> Sub zp (int64), fixed-point or float rescale, Add zp, clamp, Cast
    conv                            -> ConvInteger (int16 inputs as two byte planes; per-channel
                                       weight zero points by a window-sum correction) + Add bias
    matmul                          -> MatMulInteger (uint8 x int8 as uint8 x uint8: exact on every CPU),
                                       or int64 MatMul where ORT has no integer kernel
    add / sub / mul                 -> int64 arithmetic with the numerics multipliers
    concat                          -> requantize each input, Concat
    avg_pool / global_avg_pool      -> window sums (ConvInteger with a ones kernel / ReduceSum) + rescale
    lut                             -> Gather
    softmax                         -> ReduceMax, Gather (exp table), ReduceSum, double Div
    variance / layer_norm           -> int64 ReduceSum moments, double Mul/Sqrt/Div, rounding

Scales and zero points must be constants (the fixed-point multipliers are
computed offline) — except quantize/dequantize, whose per-tensor scale may be
computed at run time (DynamicQuantizeLinear).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx_ir as ir

from qnnx import numerics, numerics_mlas
from qnnx.dialect import DOMAIN
from qnnx.dialect.elementwise_ops import concat_output_qparams
from qnnx.dialect.qparams import check_node
from qnnx.dialect.windows import window
from qnnx.dtypes import int_type
from qnnx.errors import QnnxError
from qnnx.ir import Builder, const_array, load_model, replace_node
from qnnx.passes import lower_arith as la

LowerRule = Callable[[ir.Node, dict, Builder], "list[ir.Value]"]
LOWER_RULES: dict[str, LowerRule] = {}


def lower_rule(op_type: str):
    def wrap(fn: LowerRule) -> LowerRule:
        LOWER_RULES[op_type] = fn
        return fn

    return wrap


# --------------------------------------------------------------------------- qparam helpers


def _const(node: ir.Node, i: int, what: str) -> np.ndarray:
    v = node.inputs[i] if i < len(node.inputs) else None
    arr = const_array(v)
    if arr is None:
        raise QnnxError(f"{what} must be a constant to lower this op (it is computed at run time)")
    return np.asarray(arr)


def _rank(v: ir.Value, what: str, like: ir.Value | None = None) -> int:
    """Rank of ``v`` (or of ``like``, a value known to have the same rank)."""
    if v.shape is None and like is not None and like.shape is not None:
        return len(like.shape)
    if v.shape is None:
        raise QnnxError(f"the rank of {what} is unknown; per-axis qparams need it (run shape inference)")
    return len(v.shape)


def _along(p: np.ndarray, rank: int | None, axis: int, what: str) -> np.ndarray:
    """A scalar stays a scalar; a 1-D per-axis qparam is reshaped to broadcast on ``axis``."""
    p = np.asarray(p)
    if p.size == 1 and p.ndim <= 1:
        return p.reshape(())
    if p.ndim == 1 and rank is None and axis < 0:  # trailing-aligned broadcasting needs no rank
        return p.reshape([p.size] + [1] * (-axis - 1))
    if p.ndim != 1 or rank is None:
        raise QnnxError(f"{what} must be a scalar or 1-D per-axis (rank known), got shape {p.shape}")
    ax = numerics.normalize_axis(axis, rank)
    dims = [1] * rank
    dims[ax] = p.size
    return p.reshape(dims)


def _dtype(v: ir.Value, what: str):
    if v.dtype is None:
        raise QnnxError(f"the dtype of {what} is unknown")
    return int_type(v.dtype)


def _sub_zero_point(b: Builder, x: ir.Value, zp: np.ndarray) -> ir.Value:
    x64 = la.to_i64(b, x)
    if not np.any(zp):
        return x64
    return b.op("Sub", [x64, la.i64(b, zp, "zero_point")], hint="centered")


def _add_zero_point_and_cast(b: Builder, r: ir.Value, zp: np.ndarray, dtype) -> ir.Value:
    if np.any(zp):
        r = b.op("Add", [r, la.i64(b, zp, "out_zero_point")], hint="plus_zp")
    return la.saturate_cast(b, r, dtype)


def _requantize_value(b: Builder, x: ir.Value, in_dtype, si, zi, so, zo, out_dtype, *, rank, axis, rounding,
                      compute) -> ir.Value:
    """numerics.requantize with constant qparams (shared by requantize and concat)."""
    numerics.check_scale(si, "input_scale")
    numerics.check_scale(so, "output_scale")
    numerics.check_zero_point(zi, in_dtype, "input_zero_point")
    numerics.check_zero_point(zo, out_dtype, "output_zero_point")
    si, so = _along(si, rank, axis, "input_scale"), _along(so, rank, axis, "output_scale")
    zi, zo = _along(zi, rank, axis, "input_zero_point"), _along(zo, rank, axis, "output_zero_point")
    centered = _sub_zero_point(b, x, zi.astype(np.int64))
    if compute == "qdq":  # numerics.requantize: float32 dequantize, then float32 quantize
        real = b.op("Mul", [la.to_f32(b, centered), la.f32(b, si, "input_scale")], hint="dequantized")
        q = b.op("Div", [real, la.f32(b, so, "output_scale")], hint="quotient")
        r = la.float_to_i64(b, la.round_float(b, q, rounding))
    else:
        r = la.scale_and_round(b, centered, numerics.requantize_multiplier(si, so), rounding=rounding,
                               compute=compute, acc_bits=numerics.requantize_acc_bits(compute))
    return _add_zero_point_and_cast(b, r, zo.astype(np.int64), out_dtype)


# --------------------------------------------------------------------------- affine ops


def _scale_input(b: Builder, node: ir.Node, i: int, rank: int | None, axis: int, block_size: int,
                 x: ir.Value) -> ir.Value:
    """The scale as a broadcastable float value: a reshaped/expanded constant, or a per-tensor run-time value."""
    arr = const_array(node.inputs[i])
    if arr is None:
        return _runtime_along(b, node.inputs[i], rank, axis, block_size, "scale")
    numerics.check_scale(arr)
    if block_size:
        if x.shape is None or not all(isinstance(d, int) for d in x.shape):
            raise QnnxError("blocked qparams need a static input shape to lower")
        arr = numerics.broadcast_param(arr, tuple(x.shape), axis, block_size)
        return b.const(arr, "scale")
    return b.const(_along(arr, rank, axis, "scale"), "scale")


def _runtime_along(b: Builder, v: ir.Value, rank: int | None, axis: int, block_size: int, what: str) -> ir.Value:
    """A qparam computed at run time, reshaped so a per-axis vector broadcasts on ``axis``."""
    if block_size:
        raise QnnxError(f"blocked {what} must be a constant to lower")
    per_tensor = v.shape is not None and (len(v.shape) == 0 or tuple(v.shape) == (1,))
    if rank is None or not -rank <= axis < rank or per_tensor:
        return v  # per-tensor (an axis that cannot exist means the qparam is a scalar)
    dims = [1] * rank
    dims[numerics.normalize_axis(axis, rank)] = -1
    out = b.op("Reshape", [v, la.i64(b, dims, f"{what}_shape")], hint=f"{what}_along_axis")
    out.type = v.type
    return out


def _zero_point_param(b: Builder, node: ir.Node, i: int, rank, axis, block_size,
                      x: ir.Value) -> np.ndarray | ir.Value:
    arr = const_array(node.inputs[i])
    if arr is None:
        return _runtime_along(b, node.inputs[i], rank, axis, block_size, "zero_point")
    arr = np.asarray(arr).astype(np.int64)
    if block_size:
        return numerics.broadcast_param(arr, tuple(x.shape), axis, block_size)
    return _along(arr, rank, axis, "zero_point")


def _rank_if_needed(node: ir.Node, x: ir.Value) -> int | None:
    return len(x.shape) if x.shape is not None else None


def _quantize_to_i64(b: Builder, node: ir.Node, a: dict) -> tuple[ir.Value, object]:
    x = node.inputs[0]
    rank = _rank_if_needed(node, x)
    dtype = int_type(a["out_dtype"])
    scale = _scale_input(b, node, 1, rank, a["axis"], a["block_size"], x)
    if x.dtype != scale.dtype and scale.dtype is not None and x.dtype is not None:
        wider = x.dtype if x.dtype.itemsize >= scale.dtype.itemsize else scale.dtype
        x = b.op("Cast", [x], to=wider) if x.dtype != wider else x
        scale = b.op("Cast", [scale], to=wider) if scale.dtype != wider else scale
    v = la.round_float(b, b.op("Div", [x, scale], hint="quotient"), a["rounding"])
    if x.dtype not in (None, la.F32):
        v = la.to_f32(b, v)  # exact: an integral float16 is representable in float32
    v = b.op("Where", [b.op("IsNaN", [v]), la.f32(b, 0.0, "zero_f"), v], hint="nan_to_zero")
    r = la.float_to_i64(b, v)
    zp = _zero_point_param(b, node, 2, rank, a["axis"], a["block_size"], node.inputs[0])
    if isinstance(zp, ir.Value):
        r = b.op("Add", [r, la.to_i64(b, zp)], hint="plus_zp")
    elif np.any(zp):
        numerics.check_zero_point(zp, dtype)
        r = b.op("Add", [r, la.i64(b, zp, "zero_point")], hint="plus_zp")
    return la.clamp_i64(b, r, dtype.qmin, dtype.qmax, f"sat_{dtype.name}"), dtype


@lower_rule("quantize")
def _quantize(node, a, b):
    r, dtype = _quantize_to_i64(b, node, a)
    return [b.op("Cast", [r], to=dtype.onnx, hint=f"to_{dtype.name}")]


@lower_rule("simulated_quantize")
def _simulated_quantize(node, a, b):
    r, _ = _quantize_to_i64(b, node, a)
    return [la.to_f32(b, r)]


def _dequantize_common(node, a, b, *, simulated: bool) -> list[ir.Value]:
    x = node.inputs[0]
    rank = _rank_if_needed(node, x)
    scale = _scale_input(b, node, 1, rank, a["axis"], a["block_size"], x)
    zp = _zero_point_param(b, node, 2, rank, a["axis"], a["block_size"], x)
    if simulated:
        zf = la.to_f32(b, zp) if isinstance(zp, ir.Value) else la.f32(b, zp, "zero_point")
        return [b.op("Mul", [b.op("Sub", [la.to_f32(b, x), zf]), la.to_f32(b, scale)], hint="dequantized")]
    centered = la.to_i64(b, x)
    if isinstance(zp, ir.Value):
        centered = b.op("Sub", [centered, la.to_i64(b, zp)])
    elif np.any(zp):
        centered = b.op("Sub", [centered, la.i64(b, zp, "zero_point")])
    y = b.op("Mul", [la.to_f32(b, centered), la.to_f32(b, scale)], hint="dequantized")
    if scale.dtype is not None and scale.dtype != la.F32:
        y = b.op("Cast", [y], to=scale.dtype)
    return [y]


@lower_rule("dequantize")
def _dequantize(node, a, b):
    return _dequantize_common(node, a, b, simulated=False)


@lower_rule("simulated_dequantize")
def _simulated_dequantize(node, a, b):
    return _dequantize_common(node, a, b, simulated=True)


@lower_rule("requantize")
def _requantize(node, a, b):
    x = node.inputs[0]
    si, zi, so, zo = (_const(node, i, n) for i, n in
                      ((1, "input_scale"), (2, "input_zero_point"), (3, "output_scale"), (4, "output_zero_point")))
    per_axis = max(p.size for p in (si, zi, so, zo)) > 1
    rank = _rank(x, "x", like=node.outputs[0]) if per_axis and a["axis"] >= 0 else None
    return [_requantize_value(b, x, _dtype(x, "x"), si, zi, so, zo, int_type(a["out_dtype"]), rank=rank,
                              axis=a["axis"], rounding=a["rounding"], compute=a["compute"])]


# --------------------------------------------------------------------------- conv / matmul


_U8_OFFSET = 128  # int8 -> uint8 by adding 128 (a zero point moves with it)


def _byte_planes(b: Builder, x: ir.Value, zp: int, dtype) -> list[tuple[int, ir.Value, int, type]]:
    """Split an int16/uint16 tensor into (weight, 8-bit plane, plane zero point, plane numpy type)
    with ``x - zp == sum(weight * (plane - plane_zp))`` exactly, so ConvInteger can do the work."""
    if dtype.bits <= 8:
        return [(1, x, zp, np.int8 if dtype.signed else np.uint8)]
    x32 = b.op("Cast", [x], to=ir.DataType.INT32)
    offset = 32768 if dtype.signed else 0
    hi = b.op("Div", [b.op("Add", [x32, b.const(np.int32(offset), "offset")]), b.const(np.int32(256), "b256")],
              hint="hi_byte")  # non-negative numerator: truncation == floor
    lo = b.op("Sub", [x32, b.op("Mul", [b.op("Sub", [hi, b.const(np.int32(offset // 256), "hi_off")]),
                                        b.const(np.int32(256), "b256")])], hint="lo_byte")
    zh, zl = divmod(zp + offset, 256)
    u8 = ir.DataType.UINT8
    return [(256, b.op("Cast", [hi], to=u8, hint="hi_u8"), zh, np.uint8),
            (1, b.op("Cast", [lo], to=u8, hint="lo_u8"), zl, np.uint8)]


def _conv_integer(b: Builder, x: ir.Value, xz: int, xtype, w: ir.Value, wz_scalar: int, wtype_np, attrs) -> ir.Value:
    """Exact int32 ``conv(x - xz, w - wz)`` for int8/uint8/int16/uint16 ``x``."""
    total = None
    for weight, plane, pz, plane_np in _byte_planes(b, x, xz, xtype):
        pzv = b.const(np.asarray(pz, dtype=plane_np), "x_zero_point")
        part = b.op("ConvInteger", [plane, w, pzv, b.const(np.asarray(wz_scalar, dtype=wtype_np), "w_zero_point")],
                    hint="conv_integer", **attrs)
        if weight != 1:
            part = b.op("Mul", [part, b.const(np.int32(weight), "plane_weight")])
        total = part if total is None else b.op("Add", [total, part], hint="planes_sum")
    return total


def _minus_channel_zero_points(b: Builder, x: ir.Value, xz: np.ndarray, w: ir.Value, w_np, wz: int | None, attrs,
                               acc: ir.Value) -> ir.Value:
    """``acc`` (the conv of ``x`` with zero point 0) minus the conv of each input channel's zero point over
    the valid taps: a depthwise conv's per-channel ``x`` zero points, which ConvInteger (one zero point)
    cannot take. The taps that read padding add nothing on either side (padding is the zero point, real 0)."""
    if wz is None:
        raise QnnxError("a conv with per-channel x and per-channel w zero points cannot be lowered")
    ones = b.op("ConstantOfShape", [b.op("Shape", [x], hint="x_shape")],
                value=ir.tensor(np.ones(1, np.uint8)), hint="ones_like_x")
    taps = _conv_integer(b, ones, 0, int_type("uint8"), w, wz, w_np, attrs)  # sum of (w - wz) over valid taps
    n_out = w.shape[0] if w.shape is not None else None
    if not isinstance(n_out, int):
        raise QnnxError("per-channel x zero points need a known weight shape to lower")
    per_out = numerics.depthwise_per_output(xz, n_out).astype(np.int32).reshape(1, -1, *([1] * (len(w.shape) - 2)))
    return b.op("Sub", [acc, b.op("Mul", [taps, b.const(per_out, "x_zero_points")])], hint="xz_corrected")


def _window_attrs(a: dict) -> dict:
    return {k: a[k] for k in ("auto_pad", "pads", "strides", "dilations", "group", "kernel_shape")
            if k in a and a[k] is not None and not (k == "auto_pad" and a[k] == "NOTSET")}


@lower_rule("conv")
def _conv(node, a, b):
    x, w = node.inputs[0], node.inputs[1]
    xtype, wtype = _dtype(x, "x"), _dtype(w, "w")
    xzs = np.asarray(_const(node, 3, "x_zero_point")).astype(np.int64).reshape(-1)
    per_channel_xz = not np.all(xzs == xzs[0])
    xz = 0 if per_channel_xz else int(xzs[0])  # per channel: subtracted after the conv (below)
    wz = np.asarray(_const(node, 5, "w_zero_point")).astype(np.int64).reshape(-1)
    numerics.check_zero_point(xzs, xtype, "x_zero_point")
    numerics.check_zero_point(wz, wtype, "w_zero_point")
    w_arr = const_array(w)
    if wtype.bits < 8:  # ConvInteger has no 4-bit weights: widen offline (exact)
        if w_arr is None:
            raise QnnxError("4-bit weights must be constant to lower")
        w = b.const(np.asarray(w_arr).astype(np.int8 if wtype.signed else np.uint8), "w_8bit")
        wtype = int_type("int8" if wtype.signed else "uint8")
    w_np = np.int8 if wtype.signed else np.uint8
    attrs = _window_attrs(a)
    if attrs.get("auto_pad") in ("SAME_UPPER", "SAME_LOWER"):
        # ORT's ConvInteger rejects SAME_* with dilations: resolve to explicit pads (needs static dims).

        if x.shape is None or w.shape is None or not all(isinstance(d, int) for d in (*x.shape, *w.shape)):
            raise QnnxError("auto_pad SAME_* needs static input and weight shapes to lower")
        win = window(tuple(x.shape)[2:], tuple(w.shape)[2:], a["strides"], a["dilations"], None, attrs.pop("auto_pad"))
        attrs["pads"] = list(win.pads)
    uniform = bool(np.all(wz == wz[0]))
    acc = _conv_integer(b, x, xz, xtype, w, int(wz[0]) if uniform else 0, w_np, attrs)
    if not uniform:
        # sum (x-xz)(w-wz[m]) = sum (x-xz) w - wz[m] * window_sum(x-xz): ConvInteger has no per-channel wz.
        if w.shape is None:
            raise QnnxError("per-channel weight zero points need a known weight shape to lower")
        ones = b.const(np.ones(tuple(w.shape), dtype=np.uint8), "ones_kernel")
        window_sum = _conv_integer(b, x, xz, xtype, ones, 0, np.uint8, attrs)
        corr = b.op("Mul", [window_sum, b.const(wz.astype(np.int32).reshape(1, -1, *([1] * (len(w.shape) - 2))),
                                                "w_zero_points")])
        acc = b.op("Sub", [acc, corr], hint="wz_corrected")
    if per_channel_xz:
        acc = _minus_channel_zero_points(b, x, xzs, w, w_np, int(wz[0]) if uniform else None, attrs, acc)
    if len(node.inputs) > 6 and node.inputs[6] is not None:
        bias = node.inputs[6]
        rank = len(w.shape) if w.shape is not None else _rank(x, "x")
        bias_b = b.op("Reshape", [bias, la.i64(b, [1, -1] + [1] * (rank - 2), "bias_shape")], hint="bias_nc")
        acc = b.op("Add", [acc, bias_b], hint="plus_bias")
    return [acc]


@lower_rule("conv_transpose")
def _conv_transpose(node, a, b):
    """Zero-insertion upsampling (exact: a float ConvTranspose with a one-hot kernel on the centered
    values), then an ordinary integer conv with the flipped, regrouped kernel."""
    x, w = node.inputs[0], node.inputs[1]
    xtype = _dtype(x, "x")
    w_arr = const_array(w)
    if w_arr is None:
        raise QnnxError("conv_transpose weights must be constant to lower")
    w_arr = np.asarray(w_arr)
    nsp, group = w_arr.ndim - 2, a["group"]
    kernel = w_arr.shape[2:]
    strides = list(a["strides"] or [1] * nsp)
    dilations = list(a["dilations"] or [1] * nsp)
    pads = list(a["pads"] or [0] * (2 * nsp))
    output_padding = list(a["output_padding"] or [0] * nsp)
    xz = int(np.asarray(_const(node, 3, "x_zero_point")).reshape(-1)[0])
    conv_pads = [d * (k - 1) - p for d, k, p in zip(dilations, kernel, pads[:nsp])] + \
                [d * (k - 1) - p + op for d, k, p, op in zip(dilations, kernel, pads[nsp:], output_padding)]
    if min(conv_pads) < 0:
        raise QnnxError("conv_transpose pads larger than the dilated kernel are not supported by the lowering")
    channels = w_arr.shape[0]
    if any(s > 1 for s in strides):
        centered = b.op("Sub", [la.to_f32(b, x), la.f32(b, xz, "x_zero_point_f")], hint="centered_f")
        one_hot = b.const(np.ones((channels, 1, *([1] * nsp)), np.float32), "one_hot_kernel")
        spread = b.op("ConvTranspose", [centered, one_hot], group=channels, strides=strides, hint="zero_insert")
        spread = b.op("Add", [spread, la.f32(b, xz, "x_zero_point_f")], hint="affine_again")
        x = b.op("Cast", [spread], to=xtype.onnx, hint="upsampled")
        x.type = ir.TensorType(xtype.onnx)
    cg, mg = channels // group, w_arr.shape[1]
    flipped = w_arr[(slice(None), slice(None), *[slice(None, None, -1)] * nsp)]
    w_conv = flipped.reshape(group, cg, mg, *kernel).swapaxes(1, 2).reshape(group * mg, cg, *kernel)
    wz = np.asarray(_const(node, 5, "w_zero_point")).astype(np.int32).reshape(-1)
    wz_conv = np.tile(wz, group) if wz.size > 1 else wz.reshape(())
    ws = np.asarray(_const(node, 4, "w_scale"))
    inputs = [x, b.const(w_conv, "w_flipped"), node.inputs[2], node.inputs[3], b.const(ws, "w_scale"),
              b.const(wz_conv, "w_zero_point"), node.inputs[6] if len(node.inputs) > 6 else None]
    conv_node = ir.Node(DOMAIN, "conv", inputs)
    try:
        attrs = dict(auto_pad="NOTSET", kernel_shape=None, pads=conv_pads, strides=None, dilations=dilations,
                     group=group)
        return _conv(conv_node, attrs, b)
    finally:
        for i in range(len(conv_node.inputs)):
            conv_node.replace_input_with(i, None)  # the helper node was never in the graph


_MMI_TYPES = ("int8", "uint8")


@lower_rule("matmul")
def _matmul(node, a, b):
    x, w = node.inputs[0], node.inputs[3]
    xt, wt = _dtype(x, "a"), _dtype(w, "b")
    az = np.asarray(_const(node, 2, "a_zero_point")).astype(np.int64).reshape(-1)
    bz = np.asarray(_const(node, 5, "b_zero_point")).astype(np.int64).reshape(-1)
    numerics.check_zero_point(az, xt, "a_zero_point")
    numerics.check_zero_point(bz, wt, "b_zero_point")
    b_2d = w.shape is not None and len(w.shape) == 2
    if xt.name in _MMI_TYPES and wt.name in _MMI_TYPES and az.size == 1 and (bz.size == 1 or b_2d):
        if xt.name == "uint8" and wt.name == "int8":
            w, wt, bz = _as_uint8(b, w), int_type("uint8"), bz + _U8_OFFSET

        def zp_const(z, t, hint):
            return b.const(np.asarray(z if z.size > 1 else z[0], dtype=t.numpy), hint)

        acc = b.op("MatMulInteger", [x, w, zp_const(az, xt, "a_zero_point"), zp_const(bz, wt, "b_zero_point")],
                   hint="matmul_integer")
        return [_plus_bias(b, node, acc, 6)]
    # Exact int64 product for what ORT's MatMulInteger lacks (16-bit, 4-bit, per-row a zero point,
    # per-column b zero point on a batched b).
    a64 = _sub_zero_point(b, x, az.reshape(-1, 1) if az.size > 1 else az.reshape(()))
    b64 = _sub_zero_point(b, w, bz if bz.size > 1 else bz.reshape(()))
    acc = b.op("MatMul", [a64, b64], hint="matmul_i64")
    return [_plus_bias(b, node, b.op("Cast", [acc], to=ir.DataType.INT32, hint="wrap_int32"), 6)]


def _as_uint8(b: Builder, w: ir.Value) -> ir.Value:
    """int8 ``w`` + 128 as uint8 (its zero point moves by the same 128: ``w - wz`` is unchanged).

    MatMulInteger gets uint8 x uint8 instead of uint8 x int8: ONNX Runtime's x86-64 AVX2 kernel for
    u8 x s8 without VNNI (MLAS ``QgemmU8X8KernelAvx2.S``, ``vpmaddubsw``) adds the products of the
    raw bytes in pairs saturated to int16, so its int32 result is not the exact product on such a
    CPU; every u8 x u8 kernel widens to int16 first and is exact.
    """
    arr = const_array(w)
    if arr is not None:
        return b.const((np.asarray(arr).astype(np.int16) + _U8_OFFSET).astype(np.uint8), "b_uint8")
    shifted = b.op("Add", [b.op("Cast", [w], to=ir.DataType.INT32), b.const(np.int32(_U8_OFFSET), "u8_offset")])
    return b.op("Cast", [shifted], to=ir.DataType.UINT8, hint="b_uint8")


def _plus_bias(b: Builder, node: ir.Node, acc: ir.Value, index: int) -> ir.Value:
    """int32 accumulator + the optional int32 bias along the last axis (wrapping, like the kernels)."""
    if len(node.inputs) <= index or node.inputs[index] is None:
        return acc
    return b.op("Add", [acc, node.inputs[index]], hint="plus_bias")


# --------------------------------------------------------------------------- elementwise


def _binary_params(node: ir.Node, a: dict):
    xa, xb = node.inputs[0], node.inputs[3]
    ta, tb, ty = _dtype(xa, "a"), _dtype(xb, "b"), int_type(a["out_dtype"])
    names = ("a_scale", "a_zero_point", None, "b_scale", "b_zero_point", "y_scale", "y_zero_point")
    p = {n: _const(node, i + 1, n) for i, n in enumerate(names) if n}
    for n in ("a_scale", "b_scale", "y_scale"):
        numerics.check_scale(p[n], n)
    for n, t in (("a_zero_point", ta), ("b_zero_point", tb), ("y_zero_point", ty)):
        numerics.check_zero_point(p[n], t, n)
    per_axis = max(v.size for v in p.values()) > 1
    rank = max(_rank(xa, "a"), _rank(xb, "b")) if per_axis else None
    p = {n: _along(v, rank, a["axis"], n) for n, v in p.items()}
    return xa, xb, ta, tb, ty, p


def _mlas_pair_table(node, a, op: str, kind: str, ta, tb, ty) -> np.ndarray:
    """numerics.mlas_pair_table with this node's constant qparams."""
    numerics.check_mlas_rounding(a["rounding"])
    names = ("a_scale", "a_zero_point", None, "b_scale", "b_zero_point", "y_scale", "y_zero_point")
    p = {n: _const(node, i + 1, n) for i, n in enumerate(names) if n}
    return numerics.mlas_pair_table(op, kind, ta.name, p["a_scale"], p["a_zero_point"], tb.name, p["b_scale"],
                                    p["b_zero_point"], p["y_scale"], p["y_zero_point"], ty.name)


def _runtime_span_kind(b: Builder, xa: ir.Value, xb: ir.Value, rank: int) -> ir.Value:
    """numerics_mlas.span_kind on the run-time shapes (0 vector, 1 scalar a, 2 scalar b), for ranks
    known statically and sizes that are not: the innermost dim not 1 on both sides decides."""
    def dims(v):
        shape = b.op("Shape", [v])
        pad = rank - len(v.shape)
        return b.op("Concat", [la.i64(b, [1] * pad, "ones"), shape], axis=0) if pad else shape

    da, db = dims(xa), dims(xb)
    one = la.i64(b, [1] * rank, "ones")
    a1, b1 = b.op("Equal", [da, one]), b.op("Equal", [db, one])
    per_dim = b.op("Where", [a1, la.i64(b, [1] * rank, "kind_a"),
                             b.op("Where", [b1, la.i64(b, [2] * rank, "kind_b"), la.i64(b, [0] * rank, "kind_v")])])
    kind = la.i64(b, 0, "vector")
    for d in range(rank):  # outer to inner: the innermost deciding dim wins
        at = la.i64(b, [d], "dim")
        both = b.op("Squeeze", [b.op("And", [b.op("Gather", [a1, at], axis=0), b.op("Gather", [b1, at], axis=0)])])
        kind = b.op("Where", [both, kind, b.op("Squeeze", [b.op("Gather", [per_dim, at], axis=0)])])
    return kind


def _mlas_binary_table(node, a, b, op: str) -> ir.Value:
    """compute="mlas" add/mul as a lookup in the 256 x 256 table of every (a, b) byte pair, filled
    by numerics itself: ORT's float32 recipe uses fused multiply-adds that ONNX float ops cannot
    express one rounding at a time, and a table is exact by construction. Add has a second recipe
    when one input is a scalar per broadcast span; when the shapes do not tell which applies, all
    three tables go in and the run-time shapes pick one."""
    xa, xb = node.inputs[0], node.inputs[3]
    ta, tb, ty = _dtype(xa, "a"), _dtype(xb, "b"), int_type(a["out_dtype"])
    if ta.bits != 8 or tb.bits != 8:
        raise QnnxError("compute='mlas' takes 8-bit a and b (as ONNX Runtime's QLinearAdd/QLinearMul)")
    if xa.shape is None or xb.shape is None:
        raise QnnxError("compute='mlas' needs the input ranks to tell which ORT kernel runs (scalar or vector span)")
    ia = b.op("Sub", [b.op("Cast", [xa], to=ir.DataType.INT32), b.const(np.int32(ta.qmin), "a_min")])
    ib = b.op("Sub", [b.op("Cast", [xb], to=ir.DataType.INT32), b.const(np.int32(tb.qmin), "b_min")])
    index = b.op("Add", [b.op("Mul", [ia, b.const(np.int32(256), "row")]), ib], hint="pair_index")
    try:
        kind = "vector" if op == "mul" else numerics_mlas.span_kind(
            *([d if isinstance(d, int) else str(d) for d in v.shape] for v in (xa, xb)))
        table = _mlas_pair_table(node, a, op, kind, ta, tb, ty).reshape(-1)
    except ValueError:
        kinds = ("vector", "scalar_a", "scalar_b")  # in _runtime_span_kind's numbering
        table = np.concatenate([_mlas_pair_table(node, a, op, k, ta, tb, ty).reshape(-1) for k in kinds])
        offset = b.op("Cast", [b.op("Mul", [_runtime_span_kind(b, xa, xb, max(len(xa.shape), len(xb.shape))),
                                            la.i64(b, 256 * 256, "table_size")])], to=ir.DataType.INT32)
        index = b.op("Add", [index, offset], hint="pair_index_for_kernel")
    return b.op("Gather", [b.const(table.astype(ty.numpy), f"{op}_table"), index], axis=0, hint=f"{op}_mlas")


def _lower_add(node, a, b, *, subtract: bool):
    if a["compute"] == "mlas":
        return [_mlas_binary_table(node, a, b, "add")]
    xa, xb, ta, tb, ty, p = _binary_params(node, a)
    ca = _sub_zero_point(b, xa, p["a_zero_point"].astype(np.int64))
    cb = _sub_zero_point(b, xb, p["b_zero_point"].astype(np.int64))
    sa, sb, sy = (p[n].astype(np.float64) for n in ("a_scale", "b_scale", "y_scale"))
    combine = "Sub" if subtract else "Add"
    if a["compute"] == "float":
        numerics.check_rounding(a["rounding"])
        fa = b.op("Mul", [la.to_f32(b, la.saturate_int32(b, ca)),
                          la.f32(b, numerics.requantize_multiplier(sa, sy), "a_multiplier")])
        fb = b.op("Mul", [la.to_f32(b, la.saturate_int32(b, cb)),
                          la.f32(b, numerics.requantize_multiplier(sb, sy), "b_multiplier")])
        r = la.float_to_i64(b, la.round_float(b, b.op(combine, [fa, fb]), a["rounding"]))
    else:
        ls = numerics.add_left_shift(ta.name, tb.name)
        ma, mb, my = numerics.add_multipliers(sa, sb, sy, ls)
        shift = la.i64(b, 1 << ls, "headroom")
        kw = dict(rounding=a["rounding"], compute=a["compute"])
        xa_s = la.scale_and_round(b, b.op("Mul", [ca, shift]), ma, **kw)
        xb_s = la.scale_and_round(b, b.op("Mul", [cb, shift]), mb, **kw)
        r = la.scale_and_round(b, b.op(combine, [xa_s, xb_s]), my, **kw)
    return [_add_zero_point_and_cast(b, r, p["y_zero_point"].astype(np.int64), ty)]


@lower_rule("add")
def _add(node, a, b):
    return _lower_add(node, a, b, subtract=False)


@lower_rule("sub")
def _sub(node, a, b):
    return _lower_add(node, a, b, subtract=True)


@lower_rule("mul")
def _mul(node, a, b):
    if a["compute"] == "mlas":
        return [_mlas_binary_table(node, a, b, "mul")]
    xa, xb, ta, tb, ty, p = _binary_params(node, a)
    ca = _sub_zero_point(b, xa, p["a_zero_point"].astype(np.int64))
    cb = _sub_zero_point(b, xb, p["b_zero_point"].astype(np.int64))
    mult = numerics.mul_multiplier(p["a_scale"], p["b_scale"], p["y_scale"], a["compute"])
    r = la.scale_and_round(b, b.op("Mul", [ca, cb], hint="product"), mult, rounding=a["rounding"],
                           compute="fixed_point" if a["compute"] == "tflite" else a["compute"],
                           acc_bits=numerics.MUL_ACC_BITS)
    return [_add_zero_point_and_cast(b, r, p["y_zero_point"].astype(np.int64), ty)]


@lower_rule("concat")
def _concat(node, a, b):

    ys, yz = _const(node, 0, "y_scale"), _const(node, 1, "y_zero_point")
    xs = node.inputs[2::3]
    rank = _rank(xs[0], "inputs", like=node.outputs[0])
    ax = numerics.normalize_axis(a["axis"], rank)
    qax = numerics.normalize_axis(a["quant_axis"], rank, "quant_axis")
    along = qax == ax and np.asarray(ys).size * np.asarray(yz).size > 1
    sizes = []
    for x in xs:
        if along and (x.shape is None or not isinstance(x.shape[ax], int)):
            raise QnnxError("per-axis concat qparams need static sizes along the concat axis")
        sizes.append(x.shape[ax] if x.shape is not None else 0)
    targets = concat_output_qparams(ys, yz, sizes, along)
    out_t = int_type(a["out_dtype"])
    parts = []
    for k, (x, (ts, tz)) in enumerate(zip(xs, targets)):
        s, z = _const(node, 2 + 3 * k + 1, f"scale of input {k}"), _const(node, 2 + 3 * k + 2, f"zero point of input {k}")
        parts.append(_requantize_value(b, x, _dtype(x, f"input {k}"), s, z, np.asarray(ts), np.asarray(tz), out_t,
                                       rank=rank, axis=qax, rounding=a["rounding"], compute=a["compute"]))
    return [b.op("Concat", parts, axis=ax, hint="concat")]


@lower_rule("lut")
def _lut(node, a, b):
    x, table = node.inputs
    t = _dtype(x, "x")
    idx = b.op("Sub", [b.op("Cast", [x], to=ir.DataType.INT32), b.const(np.int32(t.qmin), "dtype_min")], hint="index")
    rows = const_array(table)
    if rows is not None and rows.ndim == 2:  # one row per channel: index the flattened table by row * width
        rank = _rank(x, "x")
        ax = numerics.normalize_axis(a["axis"], rank)
        offsets = (np.arange(rows.shape[0], dtype=np.int32) * rows.shape[1]).reshape(
            [-1 if i == ax else 1 for i in range(rank)])
        idx = b.op("Add", [idx, b.const(offsets, "row_offset")], hint="row_index")
        table = b.const(rows.reshape(-1), "flat_table")
    elif rows is None:
        raise QnnxError("lut table must be a constant to lower")
    return [b.op("Gather", [table, idx], axis=0, hint="lookup")]


@lower_rule("softmax")
def _softmax(node, a, b):
    x = node.inputs[0]
    t = _dtype(x, "x")
    sx, zx, sy, zy = (_const(node, i, n) for i, n in
                      ((1, "x_scale"), (2, "x_zero_point"), (3, "y_scale"), (4, "y_zero_point")))
    out_t = int_type(a["out_dtype"])
    for s_, n in ((sx, "x_scale"), (sy, "y_scale")):
        numerics.check_scale(s_, n)
        if s_.size != 1:
            raise QnnxError(f"softmax needs a per-tensor {n}")
    numerics.check_zero_point(zy, out_t, "y_zero_point")
    if a["compute"] == "mlas":
        return [_softmax_mlas(node, a, b, t, sx, sy, zy, out_t)]
    if a["compute"] == "tflite":
        return [_softmax_tflite(node, a, b, t, sx, zx, sy, zy, out_t)]
    f64 = ir.DataType.DOUBLE
    x32 = b.op("Cast", [x], to=ir.DataType.INT32)
    d = b.op("Sub", [la.reduce(b, "ReduceMax", x32, [a["axis"]], "max"), x32], hint="diff_to_max")
    e = b.op("Gather", [la.i64(b, numerics.softmax_exp_table(sx, t.bits), "exp_table"), d], axis=0, hint="exp")
    total = la.reduce(b, "ReduceSum", e, [a["axis"]], "exp_sum")
    p = b.op("Div", [b.op("Cast", [e], to=f64), b.op("Cast", [total], to=f64)], hint="probability")
    v = b.op("Div", [p, b.const(np.asarray(sy, np.float64).reshape(()), "y_scale_f64")], hint="scaled")
    r = la.float_to_i64(b, la.round_float(b, v, a["rounding"], f64), f64)
    return [_add_zero_point_and_cast(b, r, np.asarray(zy).astype(np.int64).reshape(()), out_t)]


def _softmax_tflite(node, a, b, t, sx, zx, sy, zy, out_t) -> ir.Value:
    """numerics.tflite_softmax: the exp of each difference from a table, the Q12.19 sum, TFLite's
    reciprocal (leading zeros by comparison with every power of two, three Newton-Raphson steps in
    SRDHM), the per-row RoundingDivideByPOT."""
    x = node.inputs[0]
    rank = _rank(x, "x")
    numerics.check_tflite_softmax(t, sx, zx, out_t, sy, zy, numerics.normalize_axis(a["axis"], rank), rank,
                                  a["rounding"])
    if t.name == "int16":
        return _softmax_tflite_int16(b, x, float(np.asarray(sx).reshape(())))
    if not isinstance(x.shape[-1], int) or x.shape[-1] > 4096:
        raise QnnxError("compute='tflite' softmax needs a static last axis of at most 4096 elements to lower")
    x64 = la.to_i64(b, x)
    d = b.op("Sub", [x64, la.reduce(b, "ReduceMax", x64, [-1], "max")], hint="diff_to_max")
    index = b.op("Add", [d, la.i64(b, 255, "offset")], hint="diff_index")
    table = numerics.tflite_softmax_exp_table(float(np.asarray(sx).reshape(())))
    e = b.op("Gather", [la.i64(b, table, "exp_table"), index], axis=0, hint="exp_q31")
    terms = la.rounding_divide_by_pot_var(b, e, la.i64(b, numerics.TFLITE_SOFTMAX_ACC_BITS, "acc_bits"))
    total = la.reduce(b, "ReduceSum", terms, [-1], "exp_sum")
    clz = b.op("Sub", [la.i64(b, 32, "thirty_two"), _bit_length(b, total)], hint="clz")
    shifted = b.op("Sub", [b.op("Mul", [total, la.pow2(b, clz)]), la.i64(b, 1 << 31, "two_p31")], hint="shifted_sum")
    recip = la.one_over_one_plus_x(b, shifted)
    exponent = b.op("Add", [clz, la.i64(b, -numerics.TFLITE_SOFTMAX_ACC_BITS - 31 + out_t.bits, "minus")], hint="neg_exp")
    exponent = b.op("Neg", [exponent], hint="exponent")
    y = la.rounding_divide_by_pot_var(b, la.srdhm_var(b, recip, e), exponent)
    return la.saturate_cast(b, b.op("Add", [y, la.i64(b, out_t.qmin, "out_min")], hint="plus_min"), out_t)


def _bit_length(b: Builder, v: ir.Value) -> ir.Value:
    """The bit length of positive int64 values below 2**32 (kept dims): comparisons with every power of two."""
    powers = la.i64(b, np.left_shift(np.int64(1), np.arange(32, dtype=np.int64)), "powers")
    at_least = b.op("GreaterOrEqual", [b.op("Unsqueeze", [v, la.i64(b, [-1], "last")]), powers], hint="at_least")
    return b.op("ReduceSum", [la.bool_to_i64(b, at_least), la.i64(b, [-1], "last")], keepdims=0, hint="bit_length")


def _softmax_tflite_int16(b: Builder, x: ir.Value, sx: float) -> ir.Value:
    """numerics.tflite_softmax_int16: the two tables of numerics.tflite_softmax_int16_tables by
    Gather, the sum's leading zeros, the rounded shift per row (non-negative: Div is the floor)."""
    exp_table, recip_table = numerics.tflite_softmax_int16_tables(sx)
    x64 = la.to_i64(b, x)
    d = b.op("Sub", [x64, la.reduce(b, "ReduceMax", x64, [-1], "max")], hint="diff_to_max")
    e = b.op("Gather", [la.i64(b, exp_table, "exp_q015"), b.op("Add", [d, la.i64(b, 65535, "offset")])], axis=0,
             hint="exp")
    total = la.reduce(b, "ReduceSum", e, [-1], "exp_sum")
    clz = b.op("Sub", [la.i64(b, 32, "thirty_two"), _bit_length(b, total)], hint="clz")
    shifted = b.op("Div", [b.op("Add", [b.op("Mul", [total, la.pow2(b, b.op("Sub", [clz, la.i64(b, 1, "one")]))]),
                                        la.i64(b, 1 << 13, "half_q14")]), la.i64(b, 1 << 14, "q14")], hint="shifted_sum")
    arg = la.clamp_i64(b, b.op("Sub", [shifted, la.i64(b, (1 << 15) + (1 << 16), "recenter")]), -32768, 32767, "sym")
    recip = b.op("Gather", [la.i64(b, recip_table, "recip_q015"), b.op("Add", [arg, la.i64(b, 32768, "offset16")])],
                 axis=0, hint="reciprocal")
    right = b.op("Sub", [la.i64(b, 31, "thirty_one"), clz], hint="right_shift")
    half = la.pow2(b, b.op("Sub", [right, la.i64(b, 1, "one")]))
    y = b.op("Div", [b.op("Add", [b.op("Mul", [e, recip]), half]), la.pow2(b, right)], hint="scaled")
    return la.saturate_cast(b, la.clamp_i64(b, y, 0, 32767, "unit"), int_type("int16"))


def _softmax_mlas(node, a, b, t, sx, sy, zy, out_t) -> ir.Value:
    """numerics_mlas.softmax in ONNX ops: the exp table gathered by the shifted byte, the float32 sum
    as a running sum in index order, then ``e * floor(1/ys) / sum``."""
    x = node.inputs[0]
    if t.bits != 8 or out_t.bits != 8 or np.asarray(zy).size != 1:
        raise QnnxError("compute='mlas' softmax takes 8-bit input and output with per-tensor qparams")
    shape = x.shape
    if shape is None and a["axis"] >= 0:
        raise QnnxError("compute='mlas' softmax with a non-negative axis needs the input rank to lower")
    ax = numerics.normalize_axis(a["axis"], len(shape)) if shape is not None else a["axis"]
    n = shape[ax] if shape is not None else None
    if isinstance(n, int):
        table = b.const(numerics_mlas.softmax_exp_table(sx, n, t.signed), "exp_table")
    else:
        table = _softmax_mlas_table_at_run_time(b, x, ax, sx, t.signed)
    x32 = b.op("Cast", [x], to=ir.DataType.INT32)
    top = la.reduce(b, "ReduceMax", x32, [ax], "max")
    if t.signed:  # uint8(127 - max + x): wraps, as ORT's byte arithmetic does
        idx = b.op("Mod", [b.op("Add", [b.op("Sub", [x32, top]), b.const(np.int32(127 + 256), "shift")]),
                           b.const(np.int32(256), "byte")], fmod=0)
    else:
        idx = b.op("Add", [b.op("Sub", [x32, top]), b.const(np.int32(255), "shift")])
    e = b.op("Gather", [table, idx], axis=0, hint="exp")
    # ORT sums in index order in float32; CumSum's running sum is that same sequence of roundings
    # (ReduceSum's order is the runtime's choice), and its last element is the total
    running = b.op("CumSum", [e, b.const(np.int64(ax), "softmax_axis")], hint="exp_running_sum")
    total = b.op("Slice", [running, la.i64(b, [-1], "last"), la.i64(b, [np.iinfo(np.int64).max], "to_end"),
                           la.i64(b, [ax], "softmax_axes")], hint="exp_sum")
    inv = np.float32(np.floor(np.float32(1.0) / np.float32(np.asarray(sy).reshape(()))))
    v = b.op("Div", [b.op("Mul", [e, b.const(inv, "inv_y_scale")]), total], hint="scaled")
    r = la.float_to_i64(b, la.round_float(b, v, "half_even"))
    return _add_zero_point_and_cast(b, r, np.asarray(zy).astype(np.int64).reshape(()), out_t)


def _softmax_mlas_table_at_run_time(b: Builder, x: ir.Value, ax: int, sx, signed: bool) -> ir.Value:
    """numerics_mlas.softmax_exp_table for an axis length known only at run time, with the same
    double-precision steps (the length sets the table's headroom, as in ORT). Exact where this
    runtime's double Log/Exp agree with numpy's to within the margin that rounding to float32 hides;
    a last-bit difference there could move one table entry by one float32 ulp."""
    f64 = ir.DataType.DOUBLE
    length = b.op("Cast", [b.op("Gather", [b.op("Shape", [x]), b.const(np.int64(ax), "axis_index")], axis=0)],
                  to=f64, hint="axis_length")
    s = np.float64(np.float32(np.asarray(sx).reshape(())))
    headroom = b.op("Sub", [b.op("Log", [b.op("Div", [b.const(np.float64(np.finfo(np.float32).max), "flt_max"),
                                                      length])]), b.const(np.float64(5.0), "reserve")])
    shift = b.op("Div", [b.op("Max", [headroom, b.const(np.float64(0.0), "zero")]), b.const(s, "x_scale_f64")],
                 hint="shift")
    exponent = b.op("Mul", [b.op("Add", [b.const(np.arange(256, dtype=np.float64) - 255.0, "index_minus_255"), shift]),
                            b.const(s, "x_scale_f64")])
    values = b.op("Cast", [b.op("Exp", [exponent])], to=ir.DataType.FLOAT, hint="exp_values")
    if not signed:
        return values
    # int8 inputs: entry i sits at byte uint8(i - 128), i.e. byte j holds entry (j + 128) % 256
    return b.op("Gather", [values, b.const((np.arange(256) + 128) % 256, "signed_order")], axis=0, hint="exp_table")


# --------------------------------------------------------------------------- normalization


def _moments(b: Builder, node: ir.Node, axis: int, what: str):
    """Lowered numerics._normalized_moments: (centered int64 x, n, S1, S2, rank). ``n`` is an int
    when the normalized dims are static, else an int64 value computed at run time (the int64
    range check of numerics then holds by assumption: it needs n > 2**23 elements to fail)."""
    x = node.inputs[0]
    t = _dtype(x, "x")
    shape = x.shape if x.shape is not None else node.outputs[0].shape
    rank = len(shape) if shape is not None else None
    if rank is None and axis >= 0:
        raise QnnxError(f"{what} with axis={axis} needs the input rank (or a negative axis) to lower")
    neg = numerics.normalize_axis(axis, rank) - rank if rank is not None else axis
    zx = np.asarray(_const(node, 2, "x_zero_point")).astype(np.int64)
    numerics.check_zero_point(zx, t, "x_zero_point")
    if t.bits > 16 or zx.size != 1:
        raise QnnxError(f"{what} takes a per-tensor x_zero_point and inputs of 16 bits or fewer")
    dims = list(shape)[neg:] if shape is not None else None
    if dims is not None and all(isinstance(d, int) for d in dims):
        n = int(np.prod(dims))
        z0 = int(zx.reshape(-1)[0])
        max_c = max(abs(t.qmax - z0), abs(t.qmin - z0))
        if n * n * max_c * max_c >= numerics.LAYER_NORM_MAX_PRODUCT:
            raise QnnxError(f"{what} over {n} elements of {t.name} does not fit exact int64 moments")
    else:
        tail = b.op("Slice", [b.op("Shape", [x]), la.i64(b, [neg], "first_axis"),
                              la.i64(b, [np.iinfo(np.int64).max], "to_end")], hint="normalized_shape")
        n = b.op("ReduceProd", [tail], keepdims=0, hint="n")
    axes = list(range(neg, 0))
    c = _sub_zero_point(b, x, zx.reshape(()))
    s1 = la.reduce(b, "ReduceSum", c, axes, "sum")
    s2 = la.reduce(b, "ReduceSum", b.op("Mul", [c, c], hint="square"), axes, "sum_of_squares")
    return c, n, s1, s2, rank


def _f64(b: Builder, v, hint: str) -> ir.Value:
    return b.const(np.asarray(v, np.float64), hint)


def _n_value(b: Builder, n) -> ir.Value:
    return la.i64(b, n, "n") if isinstance(n, int) else n


def _exact_variance(b: Builder, n, s1: ir.Value, s2: ir.Value, x_scale) -> ir.Value:
    """numerics: ``float64(n*S2 - S1**2) * variance_multiplier(x_scale, n)``."""
    nv = _n_value(b, n)
    v = b.op("Sub", [b.op("Mul", [nv, s2]), b.op("Mul", [s1, s1])], hint="n2_variance")
    if isinstance(n, int):
        mult = _f64(b, numerics.variance_multiplier(x_scale, n), "variance_multiplier")
    else:  # the same two double roundings at run time
        sx = np.float64(np.asarray(x_scale, np.float32).reshape(()))
        mult = b.op("Div", [_f64(b, sx * sx, "x_scale_squared"),
                            b.op("Cast", [b.op("Mul", [n, n])], to=ir.DataType.DOUBLE)], hint="variance_multiplier")
    return b.op("Mul", [b.op("Cast", [v], to=ir.DataType.DOUBLE), mult], hint="variance")


def _requantize_real(b: Builder, node: ir.Node, v: ir.Value, a: dict, rank: int | None) -> ir.Value:
    """Lowered numerics._requantize_real: double division by y_scale, rounding, zero point, saturate."""
    sy, zy = _const(node, 3, "y_scale"), _const(node, 4, "y_zero_point")
    out_t = int_type(a["out_dtype"])
    numerics.check_scale(sy, "y_scale")
    numerics.check_zero_point(zy, out_t, "y_zero_point")
    sy, zy = _along(sy, rank, -1, "y_scale"), _along(zy, rank, -1, "y_zero_point")
    q = b.op("Div", [v, _f64(b, sy, "y_scale_f64")], hint="scaled")
    f64 = ir.DataType.DOUBLE
    r = la.float_to_i64(b, la.round_float(b, q, a["rounding"], f64), f64)
    return _add_zero_point_and_cast(b, r, zy.astype(np.int64), out_t)


@lower_rule("variance")
def _variance(node, a, b):
    sx = _const(node, 1, "x_scale")
    numerics.check_scale(sx, "x_scale")
    if sx.size != 1 or _const(node, 3, "y_scale").size != 1:
        raise QnnxError("variance needs per-tensor x_scale and y_scale")
    _, n, s1, s2, rank = _moments(b, node, a["axis"], "variance")
    return [_requantize_real(b, node, _exact_variance(b, n, s1, s2, sx), a, rank)]


@lower_rule("layer_norm")
def _layer_norm(node, a, b):
    sx = _const(node, 1, "x_scale")
    numerics.check_scale(sx, "x_scale")
    if sx.size != 1:
        raise QnnxError("layer_norm needs a per-tensor x_scale")
    c, n, s1, s2, rank = _moments(b, node, a["axis"], "layer_norm")
    f64 = ir.DataType.DOUBLE
    opt = {i: (node.inputs[i] if i < len(node.inputs) else None) for i in range(5, 10)}
    if opt[7] is None:
        var = _exact_variance(b, n, s1, s2, sx)
    else:
        sv, zv = _const(node, 8, "variance_scale"), _const(node, 9, "variance_zero_point")
        numerics.check_scale(sv, "variance_scale")
        numerics.check_zero_point(zv, _dtype(opt[7], "variance"), "variance_zero_point")
        if sv.size != 1 or zv.size != 1:
            raise QnnxError("variance_scale and variance_zero_point must be per-tensor")
        dv = b.op("Cast", [_sub_zero_point(b, opt[7], np.asarray(zv).astype(np.int64).reshape(()))], to=f64)
        var = b.op("Max", [b.op("Mul", [dv, _f64(b, np.float64(sv.reshape(())), "variance_scale_f64")]),
                           _f64(b, 0.0, "zero_f64")], hint="variance")
    eps = np.float64(np.float32(a["epsilon"]))
    den = b.op("Sqrt", [b.op("Add", [var, _f64(b, eps, "epsilon_f64")])], hint="std")
    d = b.op("Sub", [b.op("Mul", [_n_value(b, n), c]), s1], hint="n_centered")
    sx64 = np.float64(sx.reshape(()))
    kd = (_f64(b, sx64 / np.float64(n), "x_scale_over_n") if isinstance(n, int) else
          b.op("Div", [_f64(b, sx64, "x_scale_f64"), b.op("Cast", [n], to=f64)], hint="x_scale_over_n"))
    z = b.op("Div", [b.op("Mul", [b.op("Cast", [d], to=f64), kd]), den], hint="normalized")
    zero = _f64(b, 0.0, "zero_f64")
    z = b.op("Where", [b.op("Equal", [den, zero]), zero, z], hint="normalized_or_zero")
    for i, op_type, name in ((5, "Mul", "gamma"), (6, "Add", "beta")):
        if opt[i] is None:
            continue
        p = _const(node, i, name)
        if p.dtype.kind != "f":
            raise QnnxError(f"{name} must be a float tensor, got dtype {p.dtype}")
        z = b.op(op_type, [z, _f64(b, p.astype(np.float64), f"{name}_f64")], hint=f"times_{name}")
    return [_requantize_real(b, node, z, a, rank)]


# --------------------------------------------------------------------------- pooling


def _pool_rescale(b, node, sums, count, rounding, compute):
    x = node.inputs[0]
    t = _dtype(x, "x")
    rank = _rank(x, "x")
    sx, zx, sy, zy = (_const(node, i, n) for i, n in
                      ((1, "x_scale"), (2, "x_zero_point"), (3, "y_scale"), (4, "y_zero_point")))
    numerics.check_scale(sx, "x_scale")
    numerics.check_scale(sy, "y_scale")
    numerics.check_zero_point(zy, t, "y_zero_point")
    sx, sy, zy = (_along(p, rank, 1, n) for p, n in ((sx, "x_scale"), (sy, "y_scale"), (zy, "y_zero_point")))
    if compute == "tflite":  # TFLite's MEAN: the count divided into the Q31 multiplier (global pooling only)
        if isinstance(count, ir.Value):
            raise QnnxError("global_avg_pool with compute='tflite' needs static spatial dims to lower")
        if sx.size != 1 or sy.size != 1 or zy.size != 1:
            raise QnnxError("global_avg_pool with compute='tflite' takes per-tensor qparams")
        m, shift = numerics.tflite_mean_multiplier(numerics.requantize_multiplier(sx, sy).reshape(()), int(count))
        r = la.multiply_by_quantized_multiplier(b, sums, m, shift)
        return _add_zero_point_and_cast(b, r, zy.astype(np.int64), t)
    if isinstance(count, ir.Value):  # dynamic spatial dims: the same float64 steps at run time
        f64 = ir.DataType.DOUBLE
        mult = b.op("Div", [b.const(sx.astype(np.float64), "x_scale_f64"),
                            b.op("Mul", [b.op("Cast", [count], to=f64), b.const(sy.astype(np.float64), "y_scale_f64")])],
                    hint="multiplier_f64")
    else:
        mult = sx.astype(np.float64) / (np.asarray(count, np.float64) * sy.astype(np.float64))
    r = la.scale_and_round(b, sums, mult, rounding=rounding, compute=compute)
    return _add_zero_point_and_cast(b, r, zy.astype(np.int64), t)


@lower_rule("global_avg_pool")
def _global_avg_pool(node, a, b):
    x = node.inputs[0]
    rank = _rank(x, "x")
    spatial = list(x.shape)[2:]
    if all(isinstance(d, int) for d in spatial):
        count = int(np.prod(spatial))
    else:  # element count of the spatial dims, at run time
        shape = b.op("Slice", [b.op("Shape", [x]), la.i64(b, [2], "two"), la.i64(b, [rank], "rank")],
                     hint="spatial_shape")
        count = b.op("ReduceProd", [shape], keepdims=0, hint="count")
    zx = _along(np.asarray(_const(node, 2, "x_zero_point")).astype(np.int64), rank, 1, "x_zero_point")
    centered = _sub_zero_point(b, x, zx)
    sums = la.reduce(b, "ReduceSum", centered, list(range(2, rank)), "window_sum")
    return [_pool_rescale(b, node, sums, count, a["rounding"], a["compute"])]


@lower_rule("avg_pool")
def _avg_pool(node, a, b):

    x = node.inputs[0]
    t = _dtype(x, "x")
    if x.shape is None or not isinstance(x.shape[1], int):
        raise QnnxError("avg_pool needs a static channel count to lower")
    shape = tuple(x.shape)
    channels = shape[1]
    if all(isinstance(d, int) for d in shape[2:]):
        win = window(shape[2:], a["kernel_shape"], a["strides"], None, a["pads"], a["auto_pad"])
    elif a["auto_pad"] in ("NOTSET", "VALID"):  # dynamic spatial dims: fine while divisors are constant
        n = len(a["kernel_shape"])
        pads = [0] * (2 * n) if a["auto_pad"] == "VALID" else list(a["pads"] or [0] * (2 * n))
        if any(pads) and not a["count_include_pad"]:
            raise QnnxError("avg_pool with pads and count_include_pad=0 needs static spatial dims to lower")
        win = window((1 << 20,) * n, a["kernel_shape"], a["strides"], None, pads, "NOTSET")
    else:
        raise QnnxError("avg_pool with auto_pad SAME_* needs static spatial dims to lower")
    zx = np.asarray(_const(node, 2, "x_zero_point")).astype(np.int64).reshape(-1)
    numerics.check_zero_point(zx, t, "x_zero_point")
    if a["compute"] == "mlas":
        return [_avg_pool_mlas(node, a, b, t, win, shape, zx)]
    attrs = dict(pads=list(win.pads), strides=list(win.strides), group=channels)
    ones = b.const(np.ones((channels, 1, *win.kernel), dtype=np.uint8), "ones_kernel")
    if zx.size == 1:
        # Padding ConvInteger inserts is the zero point itself: padded taps contribute 0.
        sums = _conv_integer(b, x, int(zx[0]), t, ones, 0, np.uint8, attrs)
    else:
        if not all(isinstance(d, int) for d in shape[2:]):
            raise QnnxError("avg_pool with per-channel zero points needs static spatial dims to lower")
        raw = _conv_integer(b, x, 0, t, ones, 0, np.uint8, attrs)
        valid = sum(view for _, view in win.taps(win.padded(np.ones((1, 1, *shape[2:]), dtype=np.int64))))
        sums = b.op("Sub", [raw, b.const((zx.reshape(1, -1, *([1] * len(win.kernel))) * valid).astype(np.int32),
                                         "zp_window_sum")])
    count = win.divisors(shape[2:], a["count_include_pad"])
    if a["compute"] == "tflite":  # the raw sum (zero point back in) divided by the count in integers
        if not all(isinstance(d, int) for d in shape[2:]):
            raise QnnxError("avg_pool with compute='tflite' needs static spatial dims to lower")
        zy = np.asarray(_const(node, 4, "y_zero_point")).astype(np.int64).reshape(-1)
        if zx.size != 1 or zy.size != 1 or zx[0] != zy[0]:
            raise QnnxError("avg_pool with compute='tflite' needs equal per-tensor zero points")
        count = np.broadcast_to(np.asarray(count).astype(np.int64), (1, 1, *win.out))
        raw = b.op("Add", [la.to_i64(b, sums), la.i64(b, count * zx[0], "zp_times_count")], hint="raw_sum")
        return [la.saturate_cast(b, la.tflite_average(b, raw, count), t)]
    return [_pool_rescale(b, node, la.to_i64(b, sums), count, a["rounding"], a["compute"])]


def _avg_pool_mlas(node, a, b, t, win, shape, zx) -> ir.Value:
    """numerics_mlas.average_pool in ONNX ops: dequantize in float32, zero-pad, add the strided tap
    slices one at a time in kernel order, divide by the count, then ``y / y_scale + zp``, rounded."""
    static = all(isinstance(d, int) for d in shape[2:])
    if not static and any(win.pads):
        raise QnnxError("avg_pool with compute='mlas' and pads needs static spatial dims to lower")
    sx, sy, zy = (_const(node, i, n) for i, n in ((1, "x_scale"), (3, "y_scale"), (4, "y_zero_point")))
    sx, _ = numerics.per_tensor_8bit("x", t, sx, zx)
    sy, zy = numerics.per_tensor_8bit("y", t, sy, zy)
    x = node.inputs[0]
    centered = b.op("Sub", [b.op("Cast", [x], to=ir.DataType.INT32), b.const(np.int32(zx[0]), "x_zero_point")])
    real = b.op("Mul", [b.op("Cast", [centered], to=ir.DataType.FLOAT), b.const(np.float32(sx), "x_scale")],
                hint="dequantized")
    n = len(win.kernel)
    if any(win.pads):
        pads = [0, 0, *win.pads[:n], 0, 0, *win.pads[n:]]
        real = b.op("Pad", [real, la.i64(b, pads, "pads")], mode="constant", hint="padded")
    axes = la.i64(b, list(range(2, 2 + n)), "spatial_axes")
    steps = la.i64(b, list(win.strides), "strides")
    if not static:  # the output size from the run-time input size (no pads here): (d - span) // stride + 1
        dims = b.op("Slice", [b.op("Shape", [x]), la.i64(b, [2], "from"), la.i64(b, [2 + n], "to")], hint="spatial")
        span = [(k - 1) * d + 1 for k, d in zip(win.kernel, win.dilations)]
        last = b.op("Mul", [b.op("Div", [b.op("Sub", [dims, la.i64(b, span, "span")]), steps]), steps],
                    hint="last_start")  # stride * (out - 1)
    total = None
    for idx in np.ndindex(*win.kernel):
        starts = [k * d for k, d in zip(idx, win.dilations)]
        if static:
            ends = la.i64(b, [k * d + s * (o - 1) + 1 for k, d, s, o in
                              zip(idx, win.dilations, win.strides, win.out)], "tap_end")
        else:
            ends = b.op("Add", [last, la.i64(b, [st + 1 for st in starts], "tap_end_offset")], hint="tap_end")
        tap = b.op("Slice", [real, la.i64(b, starts, "tap_start"), ends, axes, steps], hint="tap")
        total = tap if total is None else b.op("Add", [total, tap], hint="window_sum")
    count = win.divisors(shape[2:], a["count_include_pad"]).astype(np.float32)  # small integers: exact
    mean = b.op("Div", [total, b.const(count, "count")], hint="mean")
    v = b.op("Add", [b.op("Div", [mean, b.const(np.float32(sy), "y_scale")]), b.const(np.float32(zy), "y_zero_point")])
    r = la.float_to_i64(b, la.round_float(b, v, "half_even"))
    return la.saturate_cast(b, r, t)


# --------------------------------------------------------------------------- driver


def lower(model, *, copy: bool = True) -> ir.Model:
    """A model with every ``qnnx`` op replaced by standard ONNX ops of identical results."""
    m = load_model(model, copy=copy)
    graph = m.graph
    for node in list(graph):
        if node.domain != DOMAIN:
            continue
        where = f"node {node.name or node.op_type!r} (qnnx.{node.op_type})"
        try:
            rule = LOWER_RULES.get(node.op_type)
            if rule is None:
                raise QnnxError("no lowering rule for this op")
            attrs = check_node(node)  # the qparams rules import and from_qdq apply too
            b = Builder(graph, node.name or node.op_type)
            new_values = rule(node, attrs, b)
        except QnnxError as e:
            raise e.at(where) from None
        replace_node(graph, node, b.nodes, new_values)
    for name, init in list(graph.initializers.items()):
        if not init.uses() and not init.is_graph_output():  # qparams the rules folded into constants
            graph.initializers.pop(name)
    m.opset_imports.pop(DOMAIN, None)
    graph.opset_imports.pop(DOMAIN, None)
    return m
