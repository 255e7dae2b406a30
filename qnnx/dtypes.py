"""Integer element types of affine tensors.

Names follow the field ("int8", "uint4"...). Sub-byte types are carried in
numpy as ml_dtypes (the same arrays ``onnx.numpy_helper`` produces), so values
round-trip through ONNX without repacking.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx_ir as ir

from qnnx.errors import QnnxError


@dataclass(frozen=True)
class IntType:
    name: str
    bits: int
    signed: bool
    numpy: np.dtype
    onnx: ir.DataType

    @property
    def qmin(self) -> int:
        return -(1 << (self.bits - 1)) if self.signed else 0

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1


_TYPES = (
    IntType("int2", 2, True, np.dtype(ml_dtypes.int2), ir.DataType.INT2),
    IntType("uint2", 2, False, np.dtype(ml_dtypes.uint2), ir.DataType.UINT2),
    IntType("int4", 4, True, np.dtype(ml_dtypes.int4), ir.DataType.INT4),
    IntType("uint4", 4, False, np.dtype(ml_dtypes.uint4), ir.DataType.UINT4),
    IntType("int8", 8, True, np.dtype(np.int8), ir.DataType.INT8),
    IntType("uint8", 8, False, np.dtype(np.uint8), ir.DataType.UINT8),
    IntType("int16", 16, True, np.dtype(np.int16), ir.DataType.INT16),
    IntType("uint16", 16, False, np.dtype(np.uint16), ir.DataType.UINT16),
    IntType("int32", 32, True, np.dtype(np.int32), ir.DataType.INT32),
)
INT_TYPES: dict[str, IntType] = {t.name: t for t in _TYPES}
_BY_NUMPY = {t.numpy: t for t in _TYPES}
_BY_ONNX = {t.onnx: t for t in _TYPES}


def int_type(spec: str | np.dtype | ir.DataType | IntType) -> IntType:
    """Look up an integer type by name, numpy dtype or ONNX data type."""
    if isinstance(spec, IntType):
        return spec
    if isinstance(spec, str):
        found = INT_TYPES.get(spec)
    elif isinstance(spec, ir.DataType):
        found = _BY_ONNX.get(spec)
    else:
        found = _BY_NUMPY.get(np.dtype(spec))
    if found is None:
        raise QnnxError(f"unsupported integer dtype {spec!s}; expected one of {', '.join(INT_TYPES)}")
    return found


def is_int_type(spec) -> bool:
    try:
        int_type(spec)
    except (QnnxError, TypeError):
        return False
    return True


def as_int64(q: np.ndarray) -> np.ndarray:
    """Widen any integer array (ml_dtypes sub-byte types included) to int64."""
    return np.asarray(q).astype(np.int64)
