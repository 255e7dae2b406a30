"""int8 -> int8 elementwise ops: add, sub, mul (each operand and the output with its own,
possibly per-axis, qparams), concat (inputs requantized to the output's qparams) and
lut (table lookup: the integer form of any elementwise nonlinearity)."""

from __future__ import annotations

import numpy as np

from qnnx import numerics
from qnnx.dialect.schema import (Attribute, Input, axis_attr, binary_compute_attr, compute_attr, mul_compute_attr, op,
                                 out_dtype_attr, requantize_compute_attr, softmax_compute_attr,
                                 qparam_inputs, rounding_attr)
from qnnx.dtypes import as_int64, int_type
from qnnx.errors import QnnxError

_BINARY_INPUTS = (Input("a", "integer tensor"), *qparam_inputs("a_", "a"),
                  Input("b", "integer tensor (numpy broadcasting with a)"), *qparam_inputs("b_", "b"),
                  *qparam_inputs("y_", "y"))
_BINARY_ATTRS = (axis_attr(1, "axis of the (broadcast) output that per-axis qparams run along"),
                 out_dtype_attr(), rounding_attr("tflite"), binary_compute_attr())
# ONNX Runtime has no QLinearSub, so sub has no `mlas` recipe
_SUB_ATTRS = (*_BINARY_ATTRS[:-1], compute_attr())
_BINARY_TYPES = "a, b: int8/uint8/int16/uint16; scales float; zero points int32"


@op("add", doc="`y = quantize(real(a) + real(b))`; numerics.add defines the integer steps.",
    inputs=_BINARY_INPUTS, outputs=(Input("y", "integer tensor of `out_dtype`"),),
    attributes=_BINARY_ATTRS, types=_BINARY_TYPES)
def add(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, *, axis, out_dtype,
        rounding, compute):
    return (numerics.add(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, axis=axis,
                         out_dtype=out_dtype, rounding=rounding, compute=compute),)


@op("sub", doc="`y = quantize(real(a) - real(b))`; numerics.add(subtract=True) defines the steps.",
    inputs=_BINARY_INPUTS, outputs=(Input("y", "integer tensor of `out_dtype`"),),
    attributes=_SUB_ATTRS, types=_BINARY_TYPES)
def sub(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, *, axis, out_dtype,
        rounding, compute):
    return (numerics.add(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, axis=axis,
                         out_dtype=out_dtype, rounding=rounding, compute=compute, subtract=True),)


@op("mul", doc="`y = quantize(real(a) * real(b))`: the int32 product requantized by a_scale*b_scale/y_scale.",
    inputs=_BINARY_INPUTS, outputs=(Input("y", "integer tensor of `out_dtype`"),),
    attributes=(*_BINARY_ATTRS[:-1], mul_compute_attr()), types=_BINARY_TYPES)
def mul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, *, axis, out_dtype,
        rounding, compute):
    return (numerics.mul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, axis=axis,
                         out_dtype=out_dtype, rounding=rounding, compute=compute),)


def concat_output_qparams(y_scale, y_zero_point, sizes: list[int], along_concat_axis: bool):
    """The slice of the output qparams each input is requantized to."""
    if not along_concat_axis or np.asarray(y_scale).size == 1 and np.asarray(y_zero_point).size == 1:
        return [(y_scale, y_zero_point)] * len(sizes)
    offsets = np.cumsum([0, *sizes])
    s, z = np.broadcast_to(y_scale, (offsets[-1],)), np.broadcast_to(y_zero_point, (offsets[-1],))
    return [(s[o:e], z[o:e]) for o, e in zip(offsets[:-1], offsets[1:])]


@op("concat", doc="Concatenate along `axis`, each input requantized to the output qparams. "
    "Inputs are given after the output qparams as (x, scale, zero_point) triples, like com.microsoft "
    "QLinearConcat. Per-axis qparams run along `quant_axis`; when it equals `axis`, the output's "
    "per-axis vector covers the concatenated dimension (no requantize needed at all).",
    inputs=(*qparam_inputs("y_", "y"), Input("inputs", "(x_i, x_i_scale, x_i_zero_point) triples",
                                             variadic=True)),
    outputs=(Input("y", "integer tensor of `out_dtype`"),),
    attributes=(Attribute("axis", int, None, "concatenation axis", required=True),
                Attribute("quant_axis", int, 1, "axis of per-axis qparams"),
                out_dtype_attr(), rounding_attr("tflite"), requantize_compute_attr()),
    types="x_i: integer; scales float; zero points int32")
def concat(y_scale, y_zero_point, *inputs, axis, quant_axis, out_dtype, rounding, compute):
    if not inputs or len(inputs) % 3:
        raise QnnxError(f"concat takes (x, scale, zero_point) triples after y_scale, y_zero_point; "
                        f"got {len(inputs)} inputs")
    xs = [np.asarray(v) for v in inputs[0::3]]
    ndim = xs[0].ndim
    ax = numerics.normalize_axis(axis, ndim)
    qax = numerics.normalize_axis(quant_axis, ndim, "quant_axis")
    sizes = [x.shape[ax] for x in xs]
    targets = concat_output_qparams(y_scale, y_zero_point, sizes, qax == ax)
    parts = [numerics.requantize(x, s, z, ys, yz, axis=qax, rounding=rounding, out_dtype=out_dtype,
                                 compute=compute)
             for x, s, z, (ys, yz) in zip(xs, inputs[1::3], inputs[2::3], targets)]
    return (np.concatenate(parts, axis=ax),)


# A 16-bit input's table has 65536 entries (128 KiB for a 16-bit output): the exact function of a 16-bit
# activation, where an 8-bit table would quantize the input again. Wider inputs would need 2**32 entries.
LUT_MAX_BITS = 16


@op("lut", doc="Table lookup `y = table[x - min(dtype of x)]`: the integer form of an elementwise "
    "nonlinearity (sigmoid, tanh, hardswish, gelu, silu, exp...) built offline for fixed qparams. A 2-D "
    "table holds one row per channel along `axis` (a per-channel function such as BatchNormalization): "
    "`y[.., c, ..] = table[c, x[.., c, ..] - min]`.",
    inputs=(Input("x", "8- or 16-bit (or 4-bit) integer tensor"),
            Input("table", "1-D of 2**bits(x) entries, or 2-D (channels along `axis`) x 2**bits(x)")),
    outputs=(Input("y", "tensor of the table's dtype"),),
    attributes=(Attribute("axis", int, 1, "axis of x the rows of a 2-D table run along"),),
    types="x: int16/uint16/int8/uint8/int4/uint4; table: any integer dtype, last dim 2**bits(x)")
def lut(x, table, *, axis):
    x = np.asarray(x)
    t = int_type(x.dtype)
    table = np.asarray(table)
    if t.bits > LUT_MAX_BITS:
        raise QnnxError(f"lut input must be {LUT_MAX_BITS}-bit or narrower, got {t.name}")
    if table.ndim not in (1, 2) or table.shape[-1] != 1 << t.bits:
        raise QnnxError(f"lut table must be 1-D or 2-D with {1 << t.bits} entries per row for {t.name} input, "
                        f"got shape {table.shape}")
    idx = as_int64(x) - t.qmin
    if table.ndim == 1:
        return (table[idx],)
    ax = numerics.normalize_axis(axis, x.ndim)
    if x.shape[ax] != table.shape[0]:
        raise QnnxError(f"lut table has {table.shape[0]} rows but axis {axis} of x has {x.shape[ax]} channels")
    rows = np.arange(table.shape[0]).reshape([-1 if i == ax else 1 for i in range(x.ndim)])
    return (table[rows, idx],)


@op("softmax", doc="Quantized softmax along `axis`: differences to the maximum index an integer exp table "
    "(2**30 fixed point), summed exactly in int64, normalised with IEEE double division; numerics.softmax.",
    inputs=(Input("x", "integer tensor (8 or 16 bits)"), *qparam_inputs("x_", "x (per-tensor)"),
            *qparam_inputs("y_", "y (per-tensor)")),
    outputs=(Input("y", "integer tensor of `out_dtype`"),),
    attributes=(Attribute("axis", int, -1, "softmax axis"), out_dtype_attr(), rounding_attr("half_even"),
                softmax_compute_attr()),
    types="x: int8/uint8/int16/uint16; scales float; zero points int32")
def softmax(x, x_scale, x_zero_point, y_scale, y_zero_point, *, axis, out_dtype, rounding, compute):
    return (numerics.softmax(x, x_scale, x_zero_point, y_scale, y_zero_point, axis=axis, out_dtype=out_dtype,
                             rounding=rounding, compute=compute),)
