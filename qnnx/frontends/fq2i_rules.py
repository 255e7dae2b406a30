"""One rule per float op for fake-quantization-to-integer (see :mod:`qnnx.frontends.fq2i`).

    Reshape/Transpose/Flatten/Squeeze/Unsqueeze/Slice/Split/Gather/Expand/Tile/Identity,
    MaxPool, Resize(nearest), Pad                -> same op on the integers, same affine type (16-bit
                                                 MaxPool/Resize between Casts through float32)
    Relu, Clip                                   -> integer Clip to the quantized bounds
    Sigmoid, Tanh, HardSigmoid, HardSwish, LeakyRelu, Exp, Erf, Gelu, Elu, Softplus
                                                 -> qnnx.lut (table built offline, 8- or 16-bit input),
                                                 consumer's type
    Conv (+bias)                                 -> qnnx.conv, int32 accumulator, scale sx*sw
    ConvTranspose (+bias)                        -> qnnx.conv_transpose (weights per-channel on axis 1)
    BatchNormalization (inference)               -> per-channel qnnx.lut (8-bit, ORT's float recipe), else
                                                 depthwise 1x1 qnnx.conv (exact per-channel factor)
    MatMul, Gemm (+bias)                         -> qnnx.matmul, int32 accumulator, scale sa*sb
    Add(MatMul accumulator, constant bias vector) -> the same qnnx.matmul with the int32 bias
    Add, Sub, Mul                                -> qnnx.add/sub/mul, consumer's type (Add/Mul with ORT's
                                                 QLinearAdd/Mul recipe, compute="mlas", where ORT fuses)
    Mul/Div by a positive scalar constant        -> no op: the affine type's scale changes
    Concat                                       -> Concat (equal types) or qnnx.concat
    AveragePool, GlobalAveragePool               -> qnnx.avg_pool / qnnx.global_avg_pool
    Softmax                                      -> qnnx.softmax, consumer's type

Each rule raises ``Unsupported(reason)`` when its preconditions fail.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from qnnx import numerics, ops
from qnnx.dialect import DOMAIN
from qnnx.dialect.elementwise_ops import LUT_MAX_BITS
from qnnx.frontends.affine import Affine, AffineType, requantize_to
from qnnx.frontends.fq2i_registry import Context, Unsupported, fq2i_rule
from qnnx.frontends.tables import batch_norm_table, lookup_table
from qnnx.dtypes import int_type
from qnnx.ir import const_array

INT32 = int_type("int32")

_FLOAT_ROUNDING = dict(rounding="half_even", compute="float")  # ORT's QLinear arithmetic
_MLAS = dict(rounding="half_even", compute="mlas")  # ORT's own fused-kernel recipe (numerics_mlas)


def _ort_recipe(ctx: Context, *types: AffineType) -> bool:
    """Take ORT's own kernel recipe here: the conversion reproduces ORT (``numerics="onnxruntime"``)
    and every type is what ORT's QLinear kernels take, 8-bit and per-tensor."""
    return ctx.numerics == "onnxruntime" and all(t.dtype.bits == 8 and t.per_tensor for t in types)


def _attrs(node: ir.Node, *names: str) -> dict:
    return {n: node.attributes[n].value for n in names if n in node.attributes}


def _per_tensor(a: Affine, what: str = "input") -> Affine:
    if not a.type.per_tensor:
        raise Unsupported(f"{what} is quantized per-axis; this rule needs per-tensor qparams")
    return a


def _const_i32(ctx: Context, arr, hint: str) -> ir.Value:
    return ctx.b.const(np.asarray(arr).astype(np.int32), hint)


def _qparam_inputs(ctx: Context, t: AffineType, hint: str) -> list[ir.Value]:
    return [ctx.b.const(t.scale, f"{hint}_scale"), _const_i32(ctx, t.zero_point, f"{hint}_zero_point")]


# --------------------------------------------------------------------------- identity on the affine type


@fq2i_rule(*ops.op_types(lambda f: f.moves_data))  # Reshape, Transpose, Slice, Gather, Expand, ...
def _data_movement(node, ctx):
    x = _per_tensor(ctx.affine(node.inputs[0]))
    if any(ctx.has_affine(v) for v in node.inputs[1:]):
        raise Unsupported("only the data input may be quantized")
    new = ctx.b.op(node.op_type, [x.value, *node.inputs[1:]], outputs=len(node.outputs),
                   **_attrs(node, *node.attributes))
    outs = new if isinstance(new, tuple) else (new,)
    return [Affine(v, x.type) for v in outs]


def _value_op(ctx: Context, op_type: str, x: Affine, rest: list, attrs: dict,
              kernel_types: tuple[str, ...]) -> Affine:
    """``op_type``, which only selects or copies values, on the integers of ``x``. For an integer type
    outside ``kernel_types`` (ONNX's MaxPool takes 8-bit integers only; ONNX Runtime's Resize 8-bit and
    int32) it runs through float32, which holds every integer up to 2**24 exactly; Cast keeps the
    order, so the result is the same integers."""
    if x.type.dtype.name in kernel_types:
        return Affine(ctx.b.op(op_type, [x.value, *rest], **attrs), x.type)
    if x.type.dtype.bits > 24:
        raise Unsupported(f"{x.type.dtype.name} input: {op_type} takes {'/'.join(kernel_types)} integers, and "
                          "float32 holds at most 24-bit ones exactly")
    y = ctx.b.op(op_type, [ctx.b.op("Cast", [x.value], to=ir.DataType.FLOAT), *rest], **attrs)
    return Affine(ctx.b.op("Cast", [y], to=ir.DataType(x.value.dtype)), x.type)


@fq2i_rule("MaxPool")
def _max_pool(node, ctx):
    x = ctx.affine(node.inputs[0])
    if len(node.outputs) > 1 and node.outputs[1].uses():
        raise Unsupported("MaxPool indices output is used")
    if x.type.axis not in (None, 1):
        raise Unsupported("per-axis qparams not on the channel axis")
    return [_value_op(ctx, "MaxPool", x, [], _attrs(node, *node.attributes), ("int8", "uint8"))]


@fq2i_rule("Resize")
def _resize(node, ctx):
    x = _per_tensor(ctx.affine(node.inputs[0]))
    mode = node.attributes["mode"].value if "mode" in node.attributes else "nearest"
    if mode != "nearest":
        raise Unsupported(f"Resize mode {mode!r} interpolates; only nearest is exact on integers")
    return [_value_op(ctx, "Resize", x, list(node.inputs[1:]), _attrs(node, *node.attributes),
                      ("int8", "uint8", "int32"))]


@fq2i_rule("Pad")
def _pad(node, ctx):
    x = _per_tensor(ctx.affine(node.inputs[0]))
    mode = node.attributes["mode"].value if "mode" in node.attributes else "constant"
    inputs = [x.value, *node.inputs[1:2]]
    if mode == "constant":
        c = ctx.real_const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else np.float32(0)
        if c is None:
            raise Unsupported("pad value is not a constant")
        q = numerics.quantize(np.asarray(c, np.float32), x.type.scale, x.type.zero_point,
                              out_dtype=x.type.dtype.name)
        if not np.allclose(x.type.real(q), c):
            raise Unsupported(f"pad value {float(c)} is not representable in the input's affine type")
        inputs.append(ctx.b.const(np.asarray(q).reshape(()), "pad_value"))
    if len(node.inputs) > 3:
        inputs.append(node.inputs[3])
    return [Affine(ctx.b.op("Pad", inputs, **_attrs(node, *node.attributes)), x.type)]


# --------------------------------------------------------------------------- clamps


def _integer_clip(ctx: Context, x: Affine, lo: float | None, hi: float | None) -> Affine:
    """Clamp to the quantized bounds: a Clip with scalar bounds for per-tensor types, Max/Min with
    per-channel bound vectors for per-axis types (an accumulator behind per-channel weights)."""
    t = x.type
    dt = t.dtype

    def q(v, default):
        if v is None:
            return None if not t.per_tensor else np.asarray(default)
        # one bound per channel: a 1-D array quantized along its only axis
        return numerics.quantize(np.full(t.scale.shape, v, np.float32), t.scale, t.zero_point,
                                 axis=0 if not t.per_tensor else -1, out_dtype=dt.name)

    lo_q, hi_q = q(lo, dt.qmin), q(hi, dt.qmax)
    if t.per_tensor:
        bounds = [ctx.b.const(np.asarray(lo_q, dtype=dt.numpy).reshape(()), "clip_min"),
                  ctx.b.const(np.asarray(hi_q, dtype=dt.numpy).reshape(()), "clip_max")]
        return Affine(ctx.b.op("Clip", [x.value, *bounds]), t)
    rank = ctx.rank(x.value)
    if rank is None:
        raise Unsupported("per-axis clamp needs the input rank")
    shape = [1] * rank
    shape[t.axis % rank] = t.scale.size
    y = x.value
    if lo_q is not None:
        y = ctx.b.op("Max", [y, ctx.b.const(np.asarray(lo_q, dtype=dt.numpy).reshape(shape), "clip_min")])
    if hi_q is not None:
        y = ctx.b.op("Min", [y, ctx.b.const(np.asarray(hi_q, dtype=dt.numpy).reshape(shape), "clip_max")])
    return Affine(y, t)


@fq2i_rule("Relu")
def _relu(node, ctx):
    return [_integer_clip(ctx, ctx.affine(node.inputs[0]), 0.0, None)]


@fq2i_rule("Clip")
def _clip(node, ctx):
    x = ctx.affine(node.inputs[0])
    if "min" in node.attributes or "max" in node.attributes:  # opset < 11
        lo, hi = _attrs(node, "min").get("min"), _attrs(node, "max").get("max")
    else:
        bounds = []
        for i in (1, 2):
            v = node.inputs[i] if len(node.inputs) > i else None
            c = ctx.real_const(v) if v is not None else None
            if v is not None and c is None:
                raise Unsupported("clip bounds are not constants")
            bounds.append(None if c is None else float(np.asarray(c).reshape(-1)[0]))
        lo, hi = bounds
    return [_integer_clip(ctx, x, lo, hi)]


# --------------------------------------------------------------------------- lookup tables


def lut_input(x: Affine) -> Affine:
    """The input of a qnnx.lut: per-tensor, with a table of 2**bits entries that can be built."""
    x = _per_tensor(x)
    if x.type.dtype.bits > LUT_MAX_BITS:
        raise Unsupported(f"{x.type.dtype.name} input: lookup tables take inputs of {LUT_MAX_BITS} bits or fewer")
    return x


@fq2i_rule(*ops.op_types(lambda f: f.function is not None))  # Sigmoid, HardSwish, Tanh, Exp, Gelu, ...
def _elementwise(node, ctx):
    x = lut_input(ctx.affine(node.inputs[0]))
    out = ctx.output_type(node.outputs[0])
    if not out.per_tensor:
        raise Unsupported("per-axis output qparams")
    table = lookup_table(ops.elementwise_function(node).numpy, x.type, out, _attrs(node, *node.attributes))
    y = ctx.b.op("lut", [x.value, ctx.b.const(table, "table")], domain=DOMAIN)
    return [Affine(y, out)]


# --------------------------------------------------------------------------- conv / matmul


def _bias_int32(ctx: Context, bias: ir.Value | None, acc_type: AffineType, axis: int) -> ir.Value | None:
    """The bias in the accumulator's affine space (scale sx*sw, zero point 0).

    A quantized bias with another scale is requantized — to a per-channel output scale
    when the weights are per-channel (the case TVM's FQ2I could not express)."""
    if bias is None:
        return None
    target = AffineType(acc_type.scale, np.zeros_like(acc_type.zero_point), INT32, 0 if
                        acc_type.scale.size > 1 else None)
    if ctx.has_affine(bias):
        b = ctx.affine(bias, "bias")
        if b.type.dtype.name == "int32" and b.type.scale.size in (1, target.scale.size) and \
                np.allclose(b.type.scale, target.scale, rtol=1e-6, atol=0) and not np.any(b.type.zero_point):
            return b.value
        src = Affine(b.value, AffineType(b.type.scale, b.type.zero_point, b.type.dtype, 0 if b.type.scale.size > 1
                                         else None))
        return requantize_to(ctx.b, src, target)
    real = ctx.const(bias)
    if real is None:
        raise Unsupported("bias is neither quantized nor a constant")
    q = numerics.quantize(np.asarray(real, np.float32), target.scale, 0, axis=0, out_dtype="int32")
    return ctx.b.const(q, "bias_int32")


def _accumulator_type(x: AffineType, w_scale: np.ndarray, channel_axis: int, n_out: int | None = None) -> AffineType:
    """The int32 accumulator of an int8 x int8 product: scale x_scale * w_scale (per output
    channel on ``channel_axis`` when the weights are per-channel), zero point 0. A per-channel ``x`` (a
    depthwise conv's input) gives each of the ``n_out`` output channels its input channel's scale."""
    xs = x.scale if x.per_tensor else numerics.depthwise_per_output(x.scale, n_out)
    scale = (xs * np.asarray(w_scale, np.float32)).astype(np.float32)
    return AffineType(scale, np.zeros(scale.shape, np.int64), INT32, channel_axis if scale.size > 1 else None)


def _weight(ctx: Context, v: ir.Value, axis: int, what: str) -> Affine:
    w = ctx.affine(v, what)
    if w.type.dtype.bits > 8:
        raise Unsupported(f"{what} is {w.type.dtype.name}; integer conv/matmul take 8-bit or narrower weights")
    if not w.type.per_tensor and w.type.axis != axis:
        raise Unsupported(f"{what} is per-axis along axis {w.type.axis}, expected {axis}")
    return w


@fq2i_rule("Conv")
def _conv(node, ctx):
    x = ctx.affine(node.inputs[0])
    w = _weight(ctx, node.inputs[1], 0, "weight")
    channels = ops.depthwise_channels(node)
    if not x.type.per_tensor and (x.type.axis != 1 or channels is None or x.type.scale.size != channels):
        raise Unsupported("input is quantized per-axis; only a depthwise conv takes per-channel (axis 1) inputs")
    n_out = node.inputs[1].shape[0] if node.inputs[1].shape is not None else None
    acc_type = _accumulator_type(x.type, w.type.scale, 1, n_out)
    bias = _bias_int32(ctx, node.inputs[2] if len(node.inputs) > 2 else None, acc_type, 0)
    inputs = [x.value, w.value, *_qparam_inputs(ctx, x.type, "x"), *_qparam_inputs(ctx, w.type, "w")]
    if bias is not None:
        inputs.append(bias)
    acc = ctx.b.op("conv", inputs, domain=DOMAIN,
                   **_attrs(node, "auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"))
    return [Affine(acc, acc_type)]


@fq2i_rule("ConvTranspose")
def _conv_transpose(node, ctx):
    x = _per_tensor(ctx.affine(node.inputs[0]))
    w = _weight(ctx, node.inputs[1], 1, "weight")  # ConvTranspose weights are C x M: per-channel on axis 1
    at = _attrs(node, "auto_pad", "output_shape", "dilations", "group", "kernel_shape", "pads", "strides",
                "output_padding")
    if at.pop("auto_pad", "NOTSET") not in ("NOTSET", "VALID") or "output_shape" in at:
        raise Unsupported("ConvTranspose with auto_pad SAME_* or output_shape")
    if not w.type.per_tensor and at.get("group", 1) != 1:
        raise Unsupported("per-channel ConvTranspose weights with groups")
    acc_type = _accumulator_type(x.type, w.type.scale, 1)
    bias = _bias_int32(ctx, node.inputs[2] if len(node.inputs) > 2 else None, acc_type, 0)
    inputs = [x.value, w.value, *_qparam_inputs(ctx, x.type, "x"), *_qparam_inputs(ctx, w.type, "w")]
    if bias is not None:
        inputs.append(bias)
    return [Affine(ctx.b.op("conv_transpose", inputs, domain=DOMAIN, **at), acc_type)]


@fq2i_rule("BatchNormalization")
def _batch_norm(node, ctx):
    """Inference BatchNormalization is a per-channel function of one input value. Between 8-bit
    per-tensor types it is a per-channel lookup table of ORT's float recipe (exact: what ORT runs, as it
    does not fuse BatchNormalization in QDQ graphs). Otherwise it is ``a * x + b`` as a depthwise 1x1
    qnnx.conv whose int8 weights are +-127 with per-channel scale ``|a| / 127`` and an int32 bias."""
    x = _per_tensor(ctx.affine(node.inputs[0]))
    if _attrs(node, "training_mode").get("training_mode", 0) or len(node.outputs) > 1:
        raise Unsupported("training-mode BatchNormalization")
    params = [ctx.real_const(v) for v in node.inputs[1:5]]
    if any(p is None for p in params):
        raise Unsupported("BatchNormalization parameters are not constants")
    gamma, beta, mean, var = (np.asarray(p, np.float32) for p in params)
    eps = np.float32(_attrs(node, "epsilon").get("epsilon", 1e-5))
    try:
        out = ctx.output_type(node.outputs[0]) if ctx.numerics == "onnxruntime" else None
    except Unsupported:  # not quantized right after: the accumulator form below still converts
        out = None
    if out is not None and _ort_recipe(ctx, x.type, out) and gamma.ndim == 1:
        table = batch_norm_table(x.type, out, gamma, beta, mean, var, eps)
        return [Affine(ctx.b.op("lut", [x.value, ctx.b.const(table, "bn_table")], domain=DOMAIN, axis=1), out)]
    a = (gamma / np.sqrt(var + eps)).astype(np.float32)
    shift = (beta - mean * a).astype(np.float32)
    rank = ctx.rank(node.inputs[0])
    if rank is None:
        raise Unsupported("input rank unknown")
    channels = a.size
    w = np.where(a > 0, 127, np.where(a < 0, -127, 0)).astype(np.int8).reshape(channels, 1, *([1] * (rank - 2)))
    w_scale = np.where(a != 0, np.abs(a) / np.float32(127), np.float32(1)).astype(np.float32)
    acc_type = _accumulator_type(x.type, w_scale, 1)
    bias = numerics.quantize(shift, acc_type.scale, 0, axis=0, out_dtype="int32")
    inputs = [x.value, ctx.b.const(w, "bn_weight"), *_qparam_inputs(ctx, x.type, "x"),
              ctx.b.const(w_scale, "bn_weight_scale"), ctx.b.const(np.zeros(channels, np.int32), "bn_weight_zp"),
              ctx.b.const(bias, "bn_bias")]
    acc = ctx.b.op("conv", inputs, domain=DOMAIN, group=channels)
    acc.shape = ir.Shape([None] * rank)  # per-channel on axis 1: later passes need the rank
    return [Affine(acc, acc_type)]


def _matmul_acc(ctx: Context, a: Affine, w: Affine, bias: ir.Value | None) -> Affine:
    acc_type = _accumulator_type(a.type, w.type.scale, -1)
    bias_v = _bias_int32(ctx, bias, acc_type, 0)
    inputs = [a.value, *_qparam_inputs(ctx, a.type, "a"), w.value, *_qparam_inputs(ctx, w.type, "b")]
    if bias_v is not None:
        inputs.append(bias_v)
    return Affine(ctx.b.op("matmul", inputs, domain=DOMAIN), acc_type)


def _column_axis(w: Affine, rank: int | None) -> int:
    if w.type.per_tensor:
        return -1
    if rank is None:
        raise Unsupported("per-column weight needs a known weight rank")
    if w.type.axis % rank != rank - 1:
        raise Unsupported(f"weight is per-axis along axis {w.type.axis}; matmul needs per-column (last axis)")
    return -1


@fq2i_rule("MatMul")
def _matmul(node, ctx):
    a = _per_tensor(ctx.affine(node.inputs[0]))
    w = ctx.affine(node.inputs[1], "B")
    _column_axis(w, len(w.value.shape) if w.value.shape is not None else None)
    return [_matmul_acc(ctx, a, w, None)]


@fq2i_rule("Gemm")
def _gemm(node, ctx):
    at = _attrs(node, "alpha", "beta", "transA", "transB")
    if at.get("alpha", 1.0) != 1.0 or at.get("beta", 1.0) != 1.0 or at.get("transA", 0):
        raise Unsupported("Gemm with alpha/beta != 1 or transA")
    a = _per_tensor(ctx.affine(node.inputs[0]))
    w = ctx.affine(node.inputs[1], "B")
    if at.get("transB", 0):
        q = const_array(w.value)
        if q is None:
            raise Unsupported("transposed B must be a constant")
        w_axis = None if w.type.per_tensor else (1 - w.type.axis % 2)
        w = Affine(ctx.b.const(np.ascontiguousarray(np.asarray(q).T), "B_transposed"),
                   AffineType(w.type.scale, w.type.zero_point, w.type.dtype, w_axis))
    _column_axis(w, 2)
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if bias is not None and (bias.shape is not None and len(bias.shape) != 1 and not ctx.has_affine(bias)):
        raise Unsupported("Gemm bias must be 1-D")
    return [_matmul_acc(ctx, a, w, bias)]


# --------------------------------------------------------------------------- elementwise arithmetic


def _positive_scalar(ctx: Context, v: ir.Value) -> float | None:
    c = ctx.real_const(v)
    if c is None or np.asarray(c).size != 1:
        return None
    c = float(np.asarray(c).reshape(-1)[0])
    return c if c > 0 and math.isfinite(c) else None


_NARROW = ("int8", "uint8", "int16", "uint16")


def _narrow(x: Affine, op: str) -> Affine:
    """``x`` when it is 8/16-bit: an int32 accumulator (a conv/matmul whose output the plan left float, for a
    target that fuses the next op into it) keeps the op reading it float."""
    if x.type.dtype.name not in _NARROW:
        raise Unsupported(f"an operand is {x.type.dtype.name} (an accumulator); qnnx.{op} takes 8/16-bit operands")
    return x


def _binary(node, ctx, op: str):
    a, b = _narrow(ctx.affine(node.inputs[0], "A"), op), _narrow(ctx.affine(node.inputs[1], "B"), op)
    out = ctx.output_type(node.outputs[0])
    axes = {t.axis for t in (a.type, b.type, out) if t.axis is not None}
    if len(axes) > 1:
        raise Unsupported("per-axis qparams on different axes")
    inputs = [a.value, *_qparam_inputs(ctx, a.type, "a"), b.value, *_qparam_inputs(ctx, b.type, "b"),
              *_qparam_inputs(ctx, out, "y")]
    y = ctx.b.op(op, inputs, domain=DOMAIN, axis=axes.pop() if axes else 1, out_dtype=out.dtype.name,
                 **_binary_arithmetic(ctx, node, op, a, b, out))
    return [Affine(y, out)]


def _known_shape(canonical: ir.Value, original: ir.Value) -> bool:
    """Give ``canonical`` the float value's shape when it has none (FQ2I changes types, not shapes)."""
    if canonical.shape is None and original.shape is not None:
        canonical.shape = original.shape
    return canonical.shape is not None


def _binary_arithmetic(ctx: Context, node, op: str, a: Affine, b: Affine, out: AffineType) -> dict:
    """ORT's own QLinearAdd/QLinearMul recipe (``compute="mlas"``) where ORT fuses this op: 8-bit,
    per-tensor, and input ranks known (the lowering tells ORT's scalar-span and vector kernels apart
    from the shapes, at run time if need be); otherwise a float32 multiplier per input."""
    if op in ("add", "mul") and _ort_recipe(ctx, a.type, b.type, out) and \
            _known_shape(a.value, node.inputs[0]) and _known_shape(b.value, node.inputs[1]):
        return _MLAS
    return _FLOAT_ROUNDING


def _bias_into_accumulator(node, ctx) -> Affine | None:
    """``Add(matmul accumulator, bias)`` (a linear layer: autoquant's matmul pattern, ORT's MatMul + Add)
    -> the same ``qnnx.matmul`` with the bias as its int32 input: no requantize of the accumulator.
    None when the Add is anything else (the bias must be a constant vector, one value per column)."""
    for acc_in, bias_in in ((0, 1), (1, 0)):
        acc_v, bias = node.inputs[acc_in], node.inputs[bias_in]
        if acc_v is None or bias is None or not ctx.has_affine(acc_v):
            continue
        acc = ctx.affine(acc_v)
        mm = acc.value.producer()
        if mm is None or mm.domain != DOMAIN or mm.op_type != "matmul" or len(mm.inputs) != 6 or \
                len(acc.value.uses()) != 0 or acc.type.dtype.name != "int32":
            continue
        columns = acc.type.scale.size
        real = ctx.real_const(bias)
        if real is None or np.asarray(real).ndim != 1 or (columns > 1 and np.asarray(real).shape[0] != columns):
            continue
        try:
            bias_v = _bias_int32(ctx, bias, acc.type, 0)
        except Unsupported:
            continue
        return Affine(ctx.b.op("matmul", [*mm.inputs, bias_v], domain=DOMAIN), acc.type)
    return None


@fq2i_rule("Add")
def _add(node, ctx):
    fused = _bias_into_accumulator(node, ctx)
    if fused is not None:
        return [fused]
    return _binary(node, ctx, "add")


@fq2i_rule("Sub")
def _sub(node, ctx):
    return _binary(node, ctx, "sub")


@fq2i_rule("Mul")
def _mul(node, ctx):
    for i in (0, 1):  # x * c, c > 0: only the scale changes (no integer op at all)
        c = _positive_scalar(ctx, node.inputs[1 - i])
        if c is not None and ctx.has_affine(node.inputs[i]):
            x = ctx.affine(node.inputs[i])
            return [Affine(x.value, x.type.with_scale(np.float32(x.type.scale * np.float32(c))))]
    return _binary(node, ctx, "mul")


@fq2i_rule("Div")
def _div(node, ctx):
    c = _positive_scalar(ctx, node.inputs[1])
    if c is None:
        raise Unsupported("only division by a positive scalar constant has an integer rule")
    x = ctx.affine(node.inputs[0])
    return [Affine(x.value, x.type.with_scale(np.float32(x.type.scale / np.float32(c))))]


# --------------------------------------------------------------------------- concat and pooling


@fq2i_rule("Concat")
def _concat(node, ctx):
    xs = [ctx.affine(v, f"input {i}") for i, v in enumerate(node.inputs)]
    axis = node.attributes["axis"].value
    try:
        out = ctx.output_type(node.outputs[0])
    except Unsupported:
        if all(x.type.per_tensor and x.type.same_as(xs[0].type) for x in xs):
            return [Affine(ctx.b.op("Concat", [x.value for x in xs], axis=axis), xs[0].type)]
        raise
    if all(x.type.same_as(out) for x in xs):
        return [Affine(ctx.b.op("Concat", [x.value for x in xs], axis=axis), out)]
    if any(not x.type.per_tensor for x in xs) or not out.per_tensor:
        raise Unsupported("per-axis concat inputs")
    inputs = [*_qparam_inputs(ctx, out, "y")]
    for i, x in enumerate([_narrow(x, "concat") for x in xs]):
        inputs += [x.value, *_qparam_inputs(ctx, x.type, f"x{i}")]
    return [Affine(ctx.b.op("concat", inputs, domain=DOMAIN, axis=axis, out_dtype=out.dtype.name,
                            rounding="half_even", compute="qdq"), out)]  # what the QDQ graph computes: each
    # input dequantized, the concatenation quantized by the output's QuantizeLinear


def _pool(node, ctx, op: str, **attrs):
    x = _narrow(ctx.affine(node.inputs[0]), op)
    if x.type.axis not in (None, 1):
        raise Unsupported("per-axis qparams not on the channel axis")
    out = ctx.output_type(node.outputs[0])
    if out.axis not in (None, 1) or out.dtype != x.type.dtype:
        raise Unsupported("pooling output must have the input's dtype and per-tensor/per-channel qparams")
    # ORT's QLinearAveragePool recipe where it applies (8-bit, per-tensor; padding needs static spatial dims)
    mlas = op == "avg_pool" and _ort_recipe(ctx, x.type, out) and \
        _known_shape(x.value, node.inputs[0]) and (not any(attrs.get("pads") or ()) and
                                                   attrs.get("auto_pad", "NOTSET") in ("NOTSET", "VALID") or
                                                   all(isinstance(d, int) for d in x.value.shape[2:]))
    y = ctx.b.op(op, [x.value, *_qparam_inputs(ctx, x.type, "x"), *_qparam_inputs(ctx, out, "y")], domain=DOMAIN,
                 **attrs, **(_MLAS if mlas else _FLOAT_ROUNDING))
    return [Affine(y, out)]


@fq2i_rule("GlobalAveragePool")
def _global_avg_pool(node, ctx):
    return _pool(node, ctx, "global_avg_pool")


@fq2i_rule("AveragePool")
def _avg_pool(node, ctx):
    at = _attrs(node, "auto_pad", "kernel_shape", "pads", "strides", "count_include_pad", "ceil_mode")
    if at.get("ceil_mode", 0):
        raise Unsupported("ceil_mode=1")
    return _pool(node, ctx, "avg_pool", **at)


@fq2i_rule("Softmax")
def _softmax(node, ctx):
    x = _per_tensor(_narrow(ctx.affine(node.inputs[0]), "softmax"))
    opset = node.version or (node.graph.opset_imports.get("", 13) if node.graph is not None else 13)
    rank = len(x.value.shape) if x.value.shape is not None else (
        len(node.inputs[0].shape) if node.inputs[0].shape is not None else None)
    axis = node.attributes["axis"].value if "axis" in node.attributes else (-1 if opset >= 13 else 1)
    if opset < 13 and not (axis == -1 or (rank is not None and axis % rank == rank - 1)):
        raise Unsupported("opset < 13 Softmax flattens from a non-last axis")
    out = _per_tensor(Affine(node.outputs[0], ctx.output_type(node.outputs[0])), "output").type
    # ORT's QLinearSoftmax recipe where it applies (8-bit); its table depends on the axis length,
    # which the lowering reads at run time when the shape does not say
    shape = x.value.shape if _known_shape(x.value, node.inputs[0]) else None
    mlas = _ort_recipe(ctx, x.type, out) and (shape is not None or axis < 0)
    y = ctx.b.op("softmax", [x.value, *_qparam_inputs(ctx, x.type, "x"), *_qparam_inputs(ctx, out, "y")],
                 domain=DOMAIN, axis=axis, out_dtype=out.dtype.name, rounding="half_even",
                 compute="mlas" if mlas else "exact")
    return [Affine(y, out)]
