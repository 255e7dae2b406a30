"""Ops that move values between real and affine space: quantize, dequantize, requantize,
and their simulated (float-carried) forms used during calibration."""

from __future__ import annotations

import numpy as np

from qnnx import numerics
from qnnx.dialect.schema import (Attribute, Input, axis_attr, op, out_dtype_attr, requantize_compute_attr,
                                 qparam_inputs, rounding_attr)

_BLOCK = Attribute("block_size", int, 0, "blocked quantization: scale has the input's rank, "
                   "dim `axis` holding ceil(n / block_size) blocks; 0 = per-tensor or per-axis")


@op("quantize", doc="Real to affine: `y = clip(round(x / scale) + zero_point)`.",
    inputs=(Input("x", "float tensor"), *qparam_inputs("", "the output")),
    outputs=(Input("y", "integer tensor of `out_dtype`"),),
    attributes=(axis_attr(), _BLOCK, out_dtype_attr(), rounding_attr("half_even")),
    types="x: float16/float32; scale: float16/float32 (the quotient is computed in the wider of the two); "
          "zero_point: int32 in `out_dtype` range")
def quantize(x, scale, zero_point, *, axis, block_size, out_dtype, rounding):
    return (numerics.quantize(x, scale, zero_point, axis=axis, out_dtype=out_dtype, rounding=rounding,
                              block_size=block_size),)


@op("dequantize", doc="Affine to real: `y = (x - zero_point) * scale`.",
    inputs=(Input("x", "integer tensor"), *qparam_inputs("", "the input")),
    outputs=(Input("y", "float tensor of the scale's type"),),
    attributes=(axis_attr(), _BLOCK),
    types="x: any integer type; scale: float16/float32; zero_point: int32 in x's range")
def dequantize(x, scale, zero_point, *, axis, block_size):
    return (numerics.dequantize(x, scale, zero_point, axis=axis, block_size=block_size),)


@op("requantize", doc="Affine to affine: `y = clip(round((x - in_zp) * in_scale / out_scale) + out_zp)`. "
    "Every qparam may be per-axis, the output ones included.",
    inputs=(Input("x", "integer tensor"), *qparam_inputs("input_", "x"), *qparam_inputs("output_", "y")),
    outputs=(Input("y", "integer tensor of `out_dtype`"),),
    attributes=(axis_attr(), out_dtype_attr(), rounding_attr("tflite"), requantize_compute_attr()),
    types="x: int8/uint8/int16/uint16/int32 (and sub-byte); scales float; zero points int32")
def requantize(x, input_scale, input_zero_point, output_scale, output_zero_point, *, axis, out_dtype,
               rounding, compute):
    return (numerics.requantize(x, input_scale, input_zero_point, output_scale, output_zero_point, axis=axis,
                                rounding=rounding, out_dtype=out_dtype, compute=compute),)


@op("simulated_quantize", doc="quantize, with the affine result kept in float32 (integral values "
    "clipped to `out_dtype`); qparams are inputs so calibration can change them without rebuilding.",
    inputs=(Input("x", "float tensor"), *qparam_inputs("", "the output")),
    outputs=(Input("y", "float32 tensor of integral values"),),
    attributes=(axis_attr(), _BLOCK, out_dtype_attr(), rounding_attr("half_even")),
    types="x: float; scale: float; zero_point: int32 or integral float")
def simulated_quantize(x, scale, zero_point, *, axis, block_size, out_dtype, rounding):
    return (numerics.simulated_quantize(x, scale, np.asarray(zero_point), axis=axis, out_dtype=out_dtype,
                                        rounding=rounding, block_size=block_size),)


@op("simulated_dequantize", doc="dequantize of affine values carried in float32.",
    inputs=(Input("x", "float32 tensor of integral values"), *qparam_inputs("", "x")),
    outputs=(Input("y", "float32 tensor"),),
    attributes=(axis_attr(), _BLOCK),
    types="x: float32; scale: float; zero_point: int32 or integral float")
def simulated_dequantize(x, scale, zero_point, *, axis, block_size):
    return (numerics.simulated_dequantize(x, scale, zero_point, axis=axis, block_size=block_size),)
