"""Single-op full-integer .tflite models for the per-op tests, written with LiteRT's flatbuffer object
API (the same schema ai-edge-quantizer writes with), and the oracle: LiteRT's interpreter on its
reference kernels (BUILTIN_REF)."""

from __future__ import annotations

from dataclasses import dataclass

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as s
from ai_edge_litert.interpreter import Interpreter, OpResolverType

_TYPES = {np.dtype(np.int8): s.TensorType.INT8, np.dtype(np.int16): s.TensorType.INT16,
          np.dtype(np.int32): s.TensorType.INT32, np.dtype(np.int64): s.TensorType.INT64,
          np.dtype(np.float32): s.TensorType.FLOAT32, np.dtype(np.float16): s.TensorType.FLOAT16,
          np.dtype(np.bool_): s.TensorType.BOOL}


@dataclass
class T:
    """A tensor of the model: a graph input/output when ``data`` is None, else a constant."""

    shape: tuple
    dtype: type = np.int8
    scale: float | list | None = None
    zero_point: int | list = 0
    axis: int = 0
    data: np.ndarray | None = None


def model(opcode: str, inputs: list[T | None], outputs: list[T], options=None, extra_ops=()) -> bytes:
    """One operator ``opcode`` reading ``inputs`` (None: an omitted optional input) writing ``outputs``."""
    m = s.ModelT()
    m.version = 3
    m.buffers = [s.BufferT()]
    sg = s.SubGraphT()
    sg.tensors, sg.inputs, sg.outputs = [], [], []

    def add(t: T, name: str) -> int:
        tt = s.TensorT()
        tt.name = name
        tt.shape = list(t.shape)
        tt.type = _TYPES[np.dtype(t.dtype)]
        if t.scale is not None:
            q = s.QuantizationParametersT()
            q.scale = list(np.atleast_1d(np.asarray(t.scale, np.float32)).tolist())
            q.zeroPoint = list(np.broadcast_to(np.atleast_1d(t.zero_point), (len(q.scale),)).astype(np.int64).tolist())
            q.quantizedDimension = t.axis
            tt.quantization = q
        tt.buffer = 0
        if t.data is not None:
            b = s.BufferT()
            b.data = np.frombuffer(np.ascontiguousarray(np.asarray(t.data, t.dtype)).tobytes(), np.uint8)
            m.buffers.append(b)
            tt.buffer = len(m.buffers) - 1
        sg.tensors.append(tt)
        return len(sg.tensors) - 1

    idx = []
    for k, t in enumerate(inputs):
        if t is None:
            idx.append(-1)
            continue
        i = add(t, f"in{k}")
        idx.append(i)
        if t.data is None:
            sg.inputs.append(i)
    out_idx = [add(t, f"out{k}") for k, t in enumerate(outputs)]
    sg.outputs = out_idx
    oc = s.OperatorCodeT()
    code = getattr(s.BuiltinOperator, opcode)
    oc.builtinCode = code
    oc.deprecatedBuiltinCode = min(code, 127)
    oc.version = 1
    m.operatorCodes = [oc]
    op = s.OperatorT()
    op.opcodeIndex = 0
    op.inputs, op.outputs = idx, out_idx
    if options is not None:
        op.builtinOptionsType = getattr(s.BuiltinOptions, type(options).__name__[:-1])
        op.builtinOptions = options
    sg.operators = [op]
    m.subgraphs = [sg]
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def opts(kind: str, **fields):
    """A builtin options object, e.g. ``opts("Conv2DOptions", padding=0, strideW=1)``."""
    o = getattr(s, kind + "T")()
    for k, v in fields.items():
        setattr(o, k, v)
    return o


def run(data: bytes, feeds: list[np.ndarray], resolver=OpResolverType.BUILTIN_REF) -> list[np.ndarray]:
    """The interpreter's outputs on ``feeds`` (in the model's input order)."""
    it = Interpreter(model_content=data, experimental_op_resolver_type=resolver)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), feeds):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def random_input(rng, t: T) -> np.ndarray:
    if np.dtype(t.dtype).kind == "b":
        return rng.integers(0, 2, size=t.shape).astype(bool)
    if np.dtype(t.dtype).kind == "f":
        return rng.normal(0, 2, size=t.shape).astype(t.dtype)
    info = np.iinfo(t.dtype)
    return rng.integers(info.min, info.max + 1, size=t.shape).astype(t.dtype)
