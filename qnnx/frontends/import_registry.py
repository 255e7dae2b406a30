"""Import rules of quantization ops into the qnnx dialect: the registry and what the rules share.

``@import_rule(op_type, domain)`` registers ``rule(node, builder) -> [new output values] | None`` (None
leaves the node alone); :func:`qnnx.frontends.onnx_quant.import_onnx` runs them. ONNX's own rules are
in ``onnx_quant``, ONNX Runtime's com.microsoft QOperator rules in ``qoperator``; both read their
nodes' operands with the helpers below.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx_ir as ir

from qnnx.dtypes import int_type, is_int_type
from qnnx.errors import QnnxError
from qnnx.ir import Builder, const_array

ImportRule = Callable[[ir.Node, Builder], "list[ir.Value] | None"]
IMPORT_RULES: dict[tuple[str, str], ImportRule] = {}


def import_rule(op_type: str, domain: str = ""):
    """Register the decorated rule for ``op_type`` of ``domain`` ("" is ONNX's)."""

    def wrap(fn: ImportRule) -> ImportRule:
        IMPORT_RULES[(domain, op_type)] = fn
        return fn

    return wrap


def input_at(node: ir.Node, i: int) -> ir.Value | None:
    """Input ``i`` of ``node``, None when absent (optional trailing inputs)."""
    return node.inputs[i] if i < len(node.inputs) else None


def attribute(node: ir.Node, name: str, default=None):
    """The value of attribute ``name``, ``default`` when absent."""
    a = node.attributes.get(name)
    return default if a is None else a.value


def int32_zero_point(b: Builder, zp: ir.Value | None, hint: str) -> ir.Value:
    """Zero points are int32 in the dialect; a constant is converted offline, a dynamic one by Cast."""
    if zp is None:
        return b.const(np.int32(0), hint)
    arr = const_array(zp)
    if arr is not None:
        arr = np.asarray(arr)
        if arr.dtype.kind not in "iu" and not is_int_type(arr.dtype):
            raise QnnxError(f"zero point {zp.name!r} must be an integer tensor, got dtype {arr.dtype}")
        return b.const(arr.astype(np.int64).astype(np.int32), hint)
    return b.op("Cast", [zp], to=ir.DataType.INT32, hint=hint)


def dtype_of(value: ir.Value | None) -> ir.DataType | None:
    """``value``'s element type: declared, or read from a Cast producing it or a constant."""
    if value is None:
        return None
    if value.dtype is not None:
        return value.dtype
    producer = value.producer()
    if producer is not None and producer.op_type == "Cast" and producer.domain == "":
        return ir.DataType(producer.attributes["to"].value)
    arr = const_array(value)
    return ir.tensor(arr).dtype if arr is not None else None


def int_type_name(dtype: ir.DataType | None) -> str | None:
    """The qnnx name of an integer element type (``"uint8"``...), None for another type."""
    return int_type(dtype).name if dtype is not None and is_int_type(dtype) else None


def accumulator_like(acc: ir.Value, out: ir.Value) -> ir.Value:
    """The int32 accumulator has the op output's shape: record it for later passes."""
    acc.type = ir.TensorType(ir.DataType.INT32)
    acc.shape = out.shape
    return acc


def scale_product(b: Builder, s1: ir.Value, s2: ir.Value, hint: str) -> ir.Value:
    """``s1 * s2`` in float32, folded when both are constants (same arithmetic either way)."""
    a1, a2 = const_array(s1), const_array(s2)
    if a1 is not None and a2 is not None:
        a1, a2 = np.asarray(a1), np.asarray(a2)
        if a1.size > 1 and a2.size > 1 and a1.shape != a2.shape:
            raise QnnxError(f"scales {s1.name!r} {a1.shape} and {s2.name!r} {a2.shape} do not multiply: one of them "
                            "must be per-tensor")
        return b.const((a1.astype(np.float32) * a2.astype(np.float32)).astype(np.float32), hint)
    return b.op("Mul", [s1, s2], hint=hint)


def output_dtype(node: ir.Node, zp: ir.Value | None, fallback: ir.Value) -> str:
    """The integer type of a quantized output: its zero point's type, else ``fallback``'s."""
    name = int_type_name(dtype_of(zp)) or int_type_name(dtype_of(fallback))
    if name is None:
        raise QnnxError(f"{node.op_type} output type is unknown (untyped zero point)")
    if name not in ("int8", "uint8"):  # QLinear* / com.microsoft QOperator outputs (the y zero point's type)
        raise QnnxError(f"{node.op_type} outputs int8 or uint8 (the type of its output zero point), got {name}")
    return name
