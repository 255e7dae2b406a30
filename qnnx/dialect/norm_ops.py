"""Normalization over the trailing axes: layer_norm and the variance reduction it is built on.

Both reduce exactly in int64 (sums of ``x - zp`` and of their squares) and finish with a few
IEEE double steps written out in ``numerics.layer_norm`` / ``numerics.variance``, so every
runtime with double Sqrt/Div/Mul reproduces them bit for bit.
"""

from __future__ import annotations

from qnnx import numerics
from qnnx.dialect.schema import Attribute, Input, op, out_dtype_attr, qparam_inputs, rounding_attr

_AXIS = Attribute("axis", int, -1, "first normalized axis: the axes axis..rank-1 are reduced (ONNX "
                  "LayerNormalization's convention)")


@op("layer_norm", doc="Quantized layer normalization over the trailing axes from `axis`: "
    "`y = quantize((real(x) - mean) / sqrt(var + epsilon) * gamma + beta)`. Mean and variance come from "
    "exact int64 sums; the normalization is IEEE double in the order numerics.layer_norm gives. With a "
    "quantized `variance` input (a source graph that quantized its variance, as ONNX Runtime's QDQ "
    "quantizer does) its real value replaces the exact variance.",
    inputs=(Input("x", "integer tensor (8 or 16 bits)"), *qparam_inputs("x_", "x (per-tensor)"),
            Input("y_scale", "scale of y: float scalar, or 1-D along the last axis"),
            Input("y_zero_point", "zero point of y: int32 scalar, or 1-D along the last axis"),
            Input("gamma", "float tensor broadcasting to the normalized dims (multiplier)", optional=True),
            Input("beta", "float tensor broadcasting to the normalized dims (offset)", optional=True),
            Input("variance", "integer tensor of the reduced shape (size-1 normalized dims)", optional=True),
            Input("variance_scale", "scale of variance (per-tensor)", optional=True),
            Input("variance_zero_point", "zero point of variance (per-tensor, int32)", optional=True)),
    outputs=(Input("y", "integer tensor of `out_dtype`"),),
    attributes=(_AXIS, Attribute("epsilon", float, 1e-5, "added to the variance before the square root"),
                out_dtype_attr(), rounding_attr("half_even")),
    types="x: int8/uint8/int16/uint16; variance: any integer; gamma, beta: float; scales float; "
          "zero points int32")
def layer_norm(x, x_scale, x_zero_point, y_scale, y_zero_point, gamma=None, beta=None, variance=None,
               variance_scale=None, variance_zero_point=None, *, axis, epsilon, out_dtype, rounding):
    return (numerics.layer_norm(x, x_scale, x_zero_point, y_scale, y_zero_point, gamma, beta, variance,
                                variance_scale, variance_zero_point, axis=axis, epsilon=epsilon,
                                out_dtype=out_dtype, rounding=rounding),)


@op("variance", doc="Quantized population variance over the trailing axes from `axis` (kept as size-1 dims): "
    "`n*sum(c**2) - sum(c)**2` exactly in int64 for `c = x - x_zero_point`, scaled and requantized in IEEE "
    "double; numerics.variance.",
    inputs=(Input("x", "integer tensor (8 or 16 bits)"), *qparam_inputs("x_", "x (per-tensor)"),
            *qparam_inputs("y_", "y (per-tensor)")),
    outputs=(Input("y", "integer tensor of `out_dtype`, the reduced shape"),),
    attributes=(_AXIS, out_dtype_attr(), rounding_attr("half_even")),
    types="x: int8/uint8/int16/uint16; scales float; zero points int32")
def variance(x, x_scale, x_zero_point, y_scale, y_zero_point, *, axis, out_dtype, rounding):
    return (numerics.variance(x, x_scale, x_zero_point, y_scale, y_zero_point, axis=axis, out_dtype=out_dtype,
                              rounding=rounding),)
