"""Read a .tflite flatbuffer into plain, typed records (tensors with numpy data and qparams, operators
with their builtin name and options).

The schema module is the one LiteRT ships (``ai_edge_litert.schema_py_generated``), imported
lazily: qnnx itself does not need it, ``pip install 'qnnx[tflite]'`` brings it. The real builtin
of an operator code is ``max(builtin_code, deprecated_builtin_code)``: files written before the
32-bit field existed fill only the deprecated byte (and leave ``builtin_code`` at 0, ADD), newer
ones keep 127 (PLACEHOLDER_FOR_GREATER_OP_CODES) in the deprecated byte for codes above it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qnnx.errors import QnnxError

# TensorType -> numpy element type, for the types a full-integer model carries.
_NUMPY = {"FLOAT32": np.float32, "FLOAT16": np.float16, "FLOAT64": np.float64, "INT8": np.int8, "UINT8": np.uint8,
          "INT16": np.int16, "UINT16": np.uint16, "INT32": np.int32, "UINT32": np.uint32, "INT64": np.int64,
          "BOOL": np.bool_}


def schema():
    """LiteRT's generated flatbuffer schema module, or a QnnxError saying what to install."""
    try:
        from ai_edge_litert import schema_py_generated
    except ImportError:
        raise QnnxError("reading TFLite models needs the ai-edge-litert package: pip install 'qnnx[tflite]'") from None
    return schema_py_generated


@dataclass(frozen=True)
class QParams:
    """Affine qparams of a tensor: scale and zero point per tensor (size 1) or along ``axis``."""

    scale: np.ndarray  # float32, 1-D
    zero_point: np.ndarray  # int64, 1-D
    axis: int

    @property
    def per_tensor(self) -> bool:
        return self.scale.size == 1


@dataclass
class Tensor:
    index: int
    name: str
    dtype: str  # TensorType name: INT8, INT16, FLOAT32...
    shape: tuple[int, ...]
    qparams: QParams | None
    data: np.ndarray | None  # constant tensors only

    @property
    def where(self) -> str:
        return f"tensor {self.index} {self.name!r}"


@dataclass
class Operator:
    index: int
    opcode: str  # BuiltinOperator name (or CUSTOM)
    inputs: list[int]  # -1: an omitted optional input
    outputs: list[int]
    options: Any  # the builtin options object (e.g. Conv2DOptionsT), None when absent
    custom_code: str | None = None

    @property
    def where(self) -> str:
        return f"operator {self.index} ({self.opcode})"


@dataclass
class TfliteModel:
    tensors: list[Tensor]
    operators: list[Operator]
    inputs: list[int]
    outputs: list[int]
    enums: dict[str, dict[int, str]] = field(default_factory=dict)

    def enum_name(self, enum: str, value: int) -> str:
        return self.enums[enum].get(value, str(value))


def _enum(cls) -> dict[int, str]:
    return {v: k for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, int)}


def read(model: str | Path | bytes) -> TfliteModel:
    """The first subgraph of a .tflite file (path) or its bytes, tensors with constant data attached."""
    s = schema()
    if isinstance(model, (bytes, bytearray, memoryview)):
        data = bytes(model)
    else:
        if not Path(model).is_file():
            raise QnnxError(f"{model}: no such .tflite file")
        try:
            data = Path(model).read_bytes()
        except OSError as e:
            raise QnnxError(f"{model}: cannot read: {e.strerror}") from None
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise QnnxError("not a TFLite flatbuffer (no TFL3 file identifier)")
    try:
        m = s.ModelT.InitFromPackedBuf(data, 0)
    except Exception as e:  # a truncated or corrupt flatbuffer
        raise QnnxError(f"cannot read the TFLite flatbuffer: {type(e).__name__}: {e}") from None
    if not m.subgraphs:
        raise QnnxError("the TFLite model has no subgraph")
    if len(m.subgraphs) > 1:
        raise QnnxError(f"the TFLite model has {len(m.subgraphs)} subgraphs; control flow is not supported")
    enums = {"op": _enum(s.BuiltinOperator), "type": _enum(s.TensorType), "act": _enum(s.ActivationFunctionType),
             "padding": _enum(s.Padding)}
    sg = m.subgraphs[0]
    tensors = [_tensor(i, t, m, data, enums) for i, t in enumerate(sg.tensors or [])]
    operators = []
    for i, op in enumerate(sg.operators or []):
        oc = m.operatorCodes[op.opcodeIndex]
        code = max(int(oc.builtinCode), int(oc.deprecatedBuiltinCode))
        name = enums["op"].get(code, f"BUILTIN_{code}")
        custom = oc.customCode.decode("utf-8", "replace") if isinstance(oc.customCode, bytes) else oc.customCode
        ids = [int(v) for v in (*(op.inputs if op.inputs is not None else []), *(op.outputs if op.outputs is not None else []))]
        if any(v < -1 or v >= len(tensors) for v in ids):
            raise QnnxError(f"operator {i} ({name}) refers to a tensor outside the {len(tensors)} of the subgraph")
        operators.append(Operator(i, name, [int(v) for v in (op.inputs if op.inputs is not None else [])],
                                  [int(v) for v in (op.outputs if op.outputs is not None else [])],
                                  op.builtinOptions, custom))
    ios = [int(v) for v in (*(sg.inputs if sg.inputs is not None else []), *(sg.outputs if sg.outputs is not None else []))]
    if any(v < 0 or v >= len(tensors) for v in ios):
        raise QnnxError(f"the subgraph's inputs or outputs refer to a tensor outside its {len(tensors)}")
    return TfliteModel(tensors, operators, [int(v) for v in (sg.inputs if sg.inputs is not None else [])],
                       [int(v) for v in (sg.outputs if sg.outputs is not None else [])], enums)


def _tensor(i: int, t, m, data: bytes, enums) -> Tensor:
    name = t.name.decode("utf-8", "replace") if isinstance(t.name, bytes) else (t.name or f"tensor_{i}")
    dtype = enums["type"].get(t.type, str(t.type))
    shape = tuple(int(d) for d in (t.shape if t.shape is not None else []))
    if any(d < 0 for d in shape):
        raise QnnxError(f"tensor {i} {name!r} has a dynamic shape {list(shape)}; static shapes only")
    # a shape_signature with -1 (a resizable batch) is read at the shape the interpreter allocates
    q = t.quantization
    qparams = None
    if q is not None and q.scale is not None and len(q.scale):
        scale = np.asarray(q.scale, np.float32).reshape(-1)
        zp = np.asarray(q.zeroPoint if q.zeroPoint is not None else np.zeros(scale.size), np.int64).reshape(-1)
        qparams = QParams(scale, zp, int(q.quantizedDimension))
    arr = None
    buf = m.buffers[t.buffer] if 0 < t.buffer < len(m.buffers) else None
    raw = None
    if buf is not None:
        if buf.data is not None and len(buf.data):
            raw = np.asarray(buf.data, np.uint8).tobytes()
        elif buf.offset and buf.offset > 1:  # large buffers appended after the flatbuffer
            raw = data[buf.offset:buf.offset + buf.size]
    if raw is not None:
        if dtype not in _NUMPY:
            raise QnnxError(f"tensor {i} {name!r} holds {dtype} data, which qnnx does not read")
        arr = np.frombuffer(raw, _NUMPY[dtype])
        if arr.size != int(np.prod(shape)):
            raise QnnxError(f"tensor {i} {name!r} has {arr.size} values for shape {list(shape)}")
        arr = arr.reshape(shape)
    return Tensor(i, name, dtype, shape, qparams, arr)
