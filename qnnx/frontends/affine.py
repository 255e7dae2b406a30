"""Affine types: the qparams a value carries in affine space.

An :class:`AffineType` is what fake-quantization-to-integer propagates: the
(constant) scale and zero point, the integer dtype and, for per-axis types,
the axis in the value's own dimensions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from qnnx.dialect import DOMAIN
from qnnx.dtypes import IntType, int_type
from qnnx.ir import Builder


@dataclass(frozen=True, eq=False)
class AffineType:
    scale: np.ndarray  # float32, scalar or 1-D
    zero_point: np.ndarray  # int64, scalar or 1-D
    dtype: IntType
    axis: int | None = None  # None = per-tensor

    def __post_init__(self):
        s = np.asarray(self.scale, dtype=np.float32)
        z = np.asarray(self.zero_point).astype(np.int64)
        # One scale and zero point, or the same ones repeated along an axis (exporters write those to
        # steer a runtime's kernel choice, qnnx's own QDQ for MaxPool among them): per-tensor.
        if np.all(s == s.reshape(-1)[0]) and np.all(z == z.reshape(-1)[0]):
            s, z = s.reshape(-1)[:1].reshape(()), z.reshape(-1)[:1].reshape(())
            object.__setattr__(self, "axis", None)
        object.__setattr__(self, "scale", s)
        object.__setattr__(self, "zero_point", z)

    @property
    def per_tensor(self) -> bool:
        return self.axis is None

    def same_as(self, other: "AffineType") -> bool:
        """Exactly the same affine space (bit-equal scales, equal zero points and dtype)."""
        return (self.dtype == other.dtype and self.axis == other.axis
                and self.scale.shape == other.scale.shape and np.array_equal(self.scale, other.scale)
                and np.array_equal(self.zero_point, other.zero_point))

    def with_scale(self, scale) -> "AffineType":
        return AffineType(np.asarray(scale, np.float32), self.zero_point, self.dtype, self.axis)

    def real(self, q: np.ndarray) -> np.ndarray:
        """Dequantized values of ``q`` (per-tensor types only; used to build tables and constants)."""
        return ((np.asarray(q, np.int64) - self.zero_point).astype(np.float32) * self.scale).astype(np.float32)


@dataclass(frozen=True)
class Affine:
    """An integer value and the affine type it carries."""

    value: ir.Value
    type: AffineType


def affine_type_of_dequantize(node: ir.Node, scale: np.ndarray, zero_point: np.ndarray) -> AffineType:
    axis = node.attributes["axis"].value if "axis" in node.attributes else 1
    qtype = node.inputs[0].dtype
    return AffineType(scale, zero_point, int_type(qtype), axis if np.asarray(scale).size > 1 else None)


def requantize_to(b: Builder, src: Affine, target: AffineType) -> ir.Value:
    """``src`` moved into ``target``'s affine space; no node when the spaces are the same.

    Half-even ties, computed as the source runtime does: an int32 accumulator (conv, matmul) with
    one float32 multiplier, the arithmetic of ONNX Runtime's QLinear kernels; an 8/16-bit value,
    which the QDQ graph dequantizes and quantizes again, as exactly that (``compute="qdq"``)."""
    if src.type.same_as(target):
        return src.value
    axis = target.axis if target.axis is not None else src.type.axis
    if src.type.axis is not None and target.axis is not None and src.type.axis != target.axis:
        raise ValueError("per-axis types on different axes")
    return b.op("requantize", [src.value, b.const(src.type.scale, "in_scale"),
                               b.const(src.type.zero_point.astype(np.int32), "in_zero_point"),
                               b.const(target.scale, "out_scale"),
                               b.const(target.zero_point.astype(np.int32), "out_zero_point")],
                domain=DOMAIN, axis=axis if axis is not None else 1, out_dtype=target.dtype.name,
                rounding="half_even", compute="float" if src.type.dtype.bits > 16 else "qdq",
                hint="requantize")
