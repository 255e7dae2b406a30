"""The contract of a TFLite import rule, its registry, and what the rules share.

``@tflite_rule("CONV_2D", ...)`` registers ``rule(op, ctx) -> [output values]``: it reads the
operator's tensors through ``ctx`` (values in TFLite's NHWC layout, constants, qparams), emits qnnx
and standard ONNX nodes with ``ctx.b`` and returns one value per TFLite output, in TFLite's layout
and integer type. A rule that does not apply raises :class:`Unsupported` with the reason: the
driver then keeps the op in float between dequantize and quantize when a float form exists
(``@float_rule``) and lists it, or refuses the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx_ir as ir

from qnnx import numerics_tflite
from qnnx.dialect import DOMAIN
from qnnx.dtypes import int_type
from qnnx.errors import QnnxError
from qnnx.frontends.tflite.reader import Operator, QParams, Tensor, TfliteModel
from qnnx.ir import Builder

Rule = Callable[[Operator, "Context"], "list[ir.Value]"]
RULES: dict[str, Rule] = {}
FLOAT_RULES: dict[str, Rule] = {}

INTEGER_TYPES = {"INT8": "int8", "INT16": "int16", "UINT8": "uint8", "INT32": "int32"}
NHWC_TO_NCHW = [0, 3, 1, 2]
NCHW_TO_NHWC = [0, 2, 3, 1]


class Unsupported(Exception):
    """This rule does not apply to this operator (the reason says why)."""


def tflite_rule(*opcodes: str):
    def wrap(fn: Rule) -> Rule:
        for code in opcodes:
            RULES[code] = fn
        return fn

    return wrap


def float_rule(*opcodes: str):
    """The float32 form of an op, used between dequantize and quantize when no integer rule applies."""

    def wrap(fn: Rule) -> Rule:
        for code in opcodes:
            FLOAT_RULES[code] = fn
        return fn

    return wrap


@dataclass
class Context:
    model: TfliteModel
    b: Builder
    values: dict[int, ir.Value] = field(default_factory=dict)

    # ---------------------------------------------------------------- tensors

    def tensor(self, i: int) -> Tensor:
        return self.model.tensors[i]

    def value(self, i: int) -> ir.Value:
        """The ONNX value of tensor ``i``: computed by an earlier op, a graph input, or a constant."""
        if i in self.values:
            return self.values[i]
        t = self.tensor(i)
        if t.data is None:
            raise QnnxError(f"{t.where} is read before any operator computes it")
        v = self.b.const(t.data, "const")
        self.values[i] = v
        return v

    def const(self, i: int, what: str) -> np.ndarray:
        t = self.tensor(i)
        if t.data is None:
            raise Unsupported(f"{what} ({t.where}) must be a constant")
        return t.data

    def int_type(self, i: int) -> str:
        """qnnx's name of tensor ``i``'s integer type; Unsupported for another type."""
        t = self.tensor(i)
        if t.dtype not in INTEGER_TYPES:
            raise Unsupported(f"{t.where} is {t.dtype}, not an integer type")
        return INTEGER_TYPES[t.dtype]

    def qparams(self, i: int, *, per_tensor: bool = True) -> QParams:
        t = self.tensor(i)
        if t.qparams is None:
            raise Unsupported(f"{t.where} has no quantization parameters")
        if per_tensor and not t.qparams.per_tensor:
            raise Unsupported(f"{t.where} has per-axis qparams; this op takes per-tensor ones")
        return t.qparams

    def scale(self, q: QParams, hint: str) -> ir.Value:
        return self.b.const(q.scale.reshape(()) if q.per_tensor else q.scale, hint)

    def zero_point(self, q: QParams, hint: str) -> ir.Value:
        zp = q.zero_point.astype(np.int32)
        return self.b.const(zp.reshape(()) if q.per_tensor else zp, hint)

    def qparam_values(self, i: int, prefix: str) -> list[ir.Value]:
        """``[scale, zero_point]`` constants of tensor ``i`` (per-tensor)."""
        q = self.qparams(i)
        return [self.scale(q, f"{prefix}scale"), self.zero_point(q, f"{prefix}zero_point")]

    # ---------------------------------------------------------------- emitters

    def qnnx(self, op_type: str, inputs, *, out_dtype: str | None = None, hint: str | None = None, **attrs) -> ir.Value:
        if out_dtype is not None:
            attrs["out_dtype"] = out_dtype
        v = self.b.op(op_type, inputs, domain=DOMAIN, hint=hint or op_type, **attrs)
        if out_dtype is not None:
            v.type = ir.TensorType(int_type(out_dtype).onnx)
        return v

    def nchw(self, v: ir.Value) -> ir.Value:
        return self._permuted(v, NHWC_TO_NCHW, "to_nchw")

    def nhwc(self, v: ir.Value) -> ir.Value:
        return self._permuted(v, NCHW_TO_NHWC, "to_nhwc")

    def _permuted(self, v: ir.Value, perm: list[int], hint: str) -> ir.Value:
        y = self.b.op("Transpose", [v], perm=perm, hint=hint)
        y.type = v.type
        if v.shape is not None:
            y.shape = ir.Shape([v.shape[p] for p in perm])
        return y

    def activation(self, op: Operator, v: ir.Value, out: int) -> ir.Value:
        """The op's fused activation as a Clip of its quantized output (TFLite's
        CalculateActivationRangeQuantized); nothing when the range is the whole dtype."""
        code = getattr(op.options, "fusedActivationFunction", 0) if op.options is not None else 0
        name = self.model.enum_name("act", code)
        dtype = self.int_type(out)
        q = self.qparams(out)
        try:
            lo, hi = numerics_tflite.activation_range(name, q.scale[0], q.zero_point[0], dtype)
        except QnnxError as e:
            raise Unsupported(e.detail) from None
        return clip(self, v, lo, hi, dtype)


def clip(ctx: Context, v: ir.Value, lo: int, hi: int, dtype: str) -> ir.Value:
    """Clamp integers to ``[lo, hi]``; nothing when that is the dtype's whole range."""
    t = int_type(dtype)
    if lo <= t.qmin and hi >= t.qmax:
        return v
    if t.bits == 8:
        y = ctx.b.op("Clip", [v, ctx.b.const(np.array(lo, t.numpy), "act_min"), ctx.b.const(np.array(hi, t.numpy), "act_max")],
                     hint="activation")
    else:  # ONNX Runtime's Clip has no 16-bit kernel: clamp in int32
        wide = ctx.b.op("Cast", [v], to=ir.DataType.INT32, hint="act_int32")
        wide = ctx.b.op("Clip", [wide, ctx.b.const(np.int32(lo), "act_min"), ctx.b.const(np.int32(hi), "act_max")],
                        hint="activation")
        y = ctx.b.op("Cast", [wide], to=t.onnx, hint="act_narrow")
    y.type = ir.TensorType(t.onnx)
    y.shape = v.shape
    return y


def arity(op: Operator, inputs: int, outputs: int = 1) -> None:
    """At least ``inputs`` inputs (present) and exactly ``outputs`` outputs, as the builtin has."""
    if len(op.inputs) < inputs or any(i < 0 for i in op.inputs[:inputs]) or len(op.outputs) != outputs:
        raise Unsupported(f"{op.opcode} takes {inputs} inputs and {outputs} output(s), got {len(op.inputs)} and "
                          f"{len(op.outputs)}")


def options(op: Operator, *names: str):
    """The builtin option values ``names`` of ``op`` (defaults 0 when the options are absent)."""
    o = op.options
    return [getattr(o, n, 0) if o is not None else 0 for n in names]
