"""Op schemas of the ``qnnx`` ONNX domain and their registry.

One :class:`OpSchema` per op: inputs, attributes (with defaults and allowed
values), dtype rules in words, and the reference kernel. The registry is the
only place an op is declared: the reference evaluator, the validator, the
lowering and ``docs/dialect.md`` are all derived from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from qnnx.errors import QnnxError
from qnnx.numerics import (AVG_POOL_COMPUTE_MODES, GLOBAL_POOL_COMPUTE_MODES, MUL_COMPUTE_MODES, BINARY_COMPUTE_MODES, COMPUTE_MODES, REQUANTIZE_COMPUTE_MODES, ROUNDING_MODES,
                            SOFTMAX_COMPUTE_MODES)

DOMAIN = "qnnx"
VERSION = 1

INT_DTYPES = ("int2", "uint2", "int4", "uint4", "int8", "uint8", "int16", "uint16", "int32")


@dataclass(frozen=True)
class Input:
    name: str
    doc: str
    optional: bool = False
    variadic: bool = False


@dataclass(frozen=True)
class Attribute:
    name: str
    kind: type  # int, float, str, or list (ints)
    default: Any
    doc: str
    choices: tuple | None = None
    required: bool = False


@dataclass(frozen=True)
class OpSchema:
    name: str
    doc: str
    inputs: tuple[Input, ...]
    outputs: tuple[Input, ...]
    attributes: tuple[Attribute, ...]
    types: str
    kernel: Callable[..., tuple[np.ndarray, ...]] = field(compare=False)

    def attribute(self, name: str) -> Attribute:
        for a in self.attributes:
            if a.name == name:
                return a
        raise KeyError(name)

    def resolve_attributes(self, given: dict[str, Any], where: str) -> dict[str, Any]:
        """Defaults filled in, unknown names and bad choices rejected."""
        known = {a.name for a in self.attributes}
        unknown = sorted(set(given) - known)
        if unknown:
            raise QnnxError(f"unknown attribute(s) {', '.join(unknown)} for qnnx.{self.name}", where=where)
        out = {}
        for a in self.attributes:
            if a.name in given:
                v = given[a.name]
            elif a.required:
                raise QnnxError(f"qnnx.{self.name} requires attribute {a.name!r}", where=where)
            else:
                v = a.default
            if isinstance(v, bytes):
                v = v.decode()
            if a.choices is not None and v not in a.choices:
                raise QnnxError(f"attribute {a.name}={v!r} is not one of {', '.join(map(str, a.choices))}",
                                where=where)
            out[a.name] = list(v) if a.kind is list and v is not None else v
        return out


REGISTRY: dict[str, OpSchema] = {}


def register(schema: OpSchema) -> OpSchema:
    if schema.name in REGISTRY:
        raise ValueError(f"qnnx.{schema.name} registered twice")
    REGISTRY[schema.name] = schema
    return schema


def op(name: str, *, doc: str, inputs, outputs, attributes=(), types: str):
    """Decorator: register the decorated reference kernel under ``qnnx.<name>``."""

    def wrap(kernel):
        register(OpSchema(name, doc, tuple(inputs), tuple(outputs), tuple(attributes), types, kernel))
        return kernel

    return wrap


def get_schema(name: str) -> OpSchema:
    try:
        return REGISTRY[name]
    except KeyError:
        raise QnnxError(f"unknown qnnx op {name!r}") from None


# Attributes shared by many ops, declared once.
def axis_attr(default: int = 1, doc: str = "axis of per-axis qparams (ignored for per-tensor)") -> Attribute:
    return Attribute("axis", int, default, doc)


def out_dtype_attr() -> Attribute:
    return Attribute("out_dtype", str, None, "integer type of the output", INT_DTYPES, required=True)


def rounding_attr(default: str) -> Attribute:
    return Attribute("rounding", str, default, "how ties round (see numerics)", ROUNDING_MODES)


def compute_attr() -> Attribute:
    return Attribute("compute", str, "fixed_point", "Q31 fixed point or float32 multiplier", COMPUTE_MODES)


def avg_pool_compute_attr() -> Attribute:
    return Attribute("compute", str, "fixed_point", "Q31 fixed point, float32 multiplier, `mlas`: ONNX "
                     "Runtime's QLinearAveragePool float32 recipe (8-bit, per-tensor), or `tflite`: TFLite's "
                     "AVERAGE_POOL_2D (raw window sum divided by the count in integers, ties away from zero; "
                     "equal per-tensor input and output qparams)", AVG_POOL_COMPUTE_MODES)


def global_pool_compute_attr() -> Attribute:
    return Attribute("compute", str, "fixed_point", "Q31 fixed point, float32 multiplier, or `tflite`: TFLite's "
                     "MEAN (the count divided into the Q31 multiplier of x_scale/y_scale, numerics."
                     "tflite_mean_multiplier; per-tensor)", GLOBAL_POOL_COMPUTE_MODES)


def binary_compute_attr() -> Attribute:
    return Attribute("compute", str, "fixed_point", "Q31 fixed point, float32 multipliers, or `mlas`: ONNX "
                     "Runtime's own QLinearAdd/QLinearMul float32 recipe (8-bit, per-tensor)", BINARY_COMPUTE_MODES)


def mul_compute_attr() -> Attribute:
    return Attribute("compute", str, "fixed_point", "Q31 fixed point, float32 multipliers, `mlas`: ONNX "
                     "Runtime's own QLinearMul float32 recipe (8-bit, per-tensor), or `tflite`: Q31 fixed point "
                     "of the multiplier `a_scale * b_scale / y_scale` computed in float32 (TFLite's MUL)",
                     MUL_COMPUTE_MODES)


def softmax_compute_attr() -> Attribute:
    return Attribute("compute", str, "exact", "`exact` (integer exp table), `mlas`: ONNX Runtime's "
                     "QLinearSoftmax float32 recipe (8-bit, per-tensor), or `tflite`: TFLite's int8 reference kernel "
                     "(last axis; int8 input: gemmlowp fixed point, output int8 (1/256, -128) or int16 (1/65536, -32768); "
                     "int16 input and output (1/32768, 0): interpolated exp and reciprocal tables)",
                     SOFTMAX_COMPUTE_MODES)


def requantize_compute_attr() -> Attribute:
    return Attribute("compute", str, "fixed_point", "Q31 fixed point, float32 multiplier, `qdq`: float32 "
                     "dequantize then float32 quantize (a DequantizeLinear -> QuantizeLinear pair), or "
                     "`fixed_point_q15`: the Q31 multiplier reduced to Q15 (TFLite's int64-accumulator "
                     "MultiplyByQuantizedMultiplier with rounding `upward`), or `double`: float64 product with the "
                     "float64 multiplier (TFLite's per-channel fully connected)",
                     REQUANTIZE_COMPUTE_MODES)


def qparam_inputs(prefix: str, what: str) -> tuple[Input, Input]:
    return (Input(f"{prefix}scale", f"scale of {what}: float scalar or 1-D along `axis`"),
            Input(f"{prefix}zero_point", f"zero point of {what}: int32 scalar or 1-D along `axis`"))
