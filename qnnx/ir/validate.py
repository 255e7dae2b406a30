"""Is this a model qnnx can work on? Checked once, on the ModelProto, when a model enters qnnx.

A model from a file or a ``ModelProto`` must have a graph (an empty file parses as an empty
ModelProto), every node's domain imported (ONNX Runtime refuses the model otherwise), every node input defined by a graph input, an initializer or another node (in a
subgraph: also by the enclosing scopes), no value produced twice, no cycle, its graph outputs
defined, and initializers whose data match their dims and element type, external data included.
A violation is a :class:`QnnxError` naming the node or tensor and the rule. Checking the proto,
before onnx-ir builds its graph, keeps onnx-ir from inventing inputs for undefined names.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from qnnx.errors import QnnxError

# Bits per element of the fixed-size element types (STRING and UNDEFINED have none).
_BITS = {TensorProto.FLOAT: 32, TensorProto.UINT8: 8, TensorProto.INT8: 8, TensorProto.UINT16: 16,
         TensorProto.INT16: 16, TensorProto.INT32: 32, TensorProto.INT64: 64, TensorProto.BOOL: 8,
         TensorProto.FLOAT16: 16, TensorProto.DOUBLE: 64, TensorProto.UINT32: 32, TensorProto.UINT64: 64,
         TensorProto.COMPLEX64: 64, TensorProto.COMPLEX128: 128, TensorProto.BFLOAT16: 16}
for _name, _bits in (("FLOAT8E4M3FN", 8), ("FLOAT8E4M3FNUZ", 8), ("FLOAT8E5M2", 8), ("FLOAT8E5M2FNUZ", 8),
                     ("UINT4", 4), ("INT4", 4), ("FLOAT4E2M1", 4), ("FLOAT8E8M0", 8), ("UINT2", 2), ("INT2", 2)):
    if hasattr(TensorProto, _name):
        _BITS[getattr(TensorProto, _name)] = _bits

# The typed repeated field that holds each element type's values when raw_data is not used, and how
# many values of the type one entry packs (sub-byte types pack several into one int32_data entry).
_FIELD = {TensorProto.FLOAT: "float_data", TensorProto.COMPLEX64: "float_data", TensorProto.DOUBLE: "double_data",
          TensorProto.COMPLEX128: "double_data", TensorProto.INT64: "int64_data", TensorProto.UINT32: "uint64_data",
          TensorProto.UINT64: "uint64_data", TensorProto.STRING: "string_data"}


def _type_name(data_type: int) -> str:
    try:
        return TensorProto.DataType.Name(data_type)
    except ValueError:
        return str(data_type)


def _expected_entries(t: TensorProto, n: int) -> int:
    """How many entries of the typed field ``n`` elements take."""
    if t.data_type in (TensorProto.COMPLEX64, TensorProto.COMPLEX128):
        return 2 * n
    bits = _BITS.get(t.data_type, 32)
    if bits < 8:
        return -(-n * bits // 8)  # packed into bytes, one byte per int32_data entry
    return n


def check_tensor(t: TensorProto, base_dir: str | None, where: str | None) -> None:
    """The tensor's data (inline, raw or external) hold exactly what its dims and type declare."""
    if t.data_type == TensorProto.UNDEFINED or _type_name(t.data_type) == str(t.data_type):
        raise QnnxError(f"tensor {t.name!r} has no valid element type ({t.data_type})", where=where)
    if any(d < 0 for d in t.dims):
        raise QnnxError(f"tensor {t.name!r} has a negative dim {list(t.dims)}", where=where)
    n = int(np.prod(t.dims, dtype=np.int64)) if t.dims else 1
    bits = _BITS.get(t.data_type)
    if t.data_location == TensorProto.EXTERNAL:
        _check_external(t, n, bits, base_dir, where)
        return
    if t.data_type == TensorProto.STRING:
        have, unit = len(t.string_data), "strings"
        want = n
    elif t.HasField("raw_data") or bits is None:
        have, unit = len(t.raw_data), "bytes"
        want = -(-n * bits // 8) if bits is not None else len(t.raw_data)
    else:
        field = _FIELD.get(t.data_type, "int32_data")
        have, unit = len(getattr(t, field)), f"{field} entries"
        want = _expected_entries(t, n)
    if have != want:
        raise QnnxError(f"tensor {t.name!r} ({_type_name(t.data_type)}, dims {list(t.dims)}) holds {have} {unit}, "
                        f"its dims need {want}", where=where)


def _check_external(t: TensorProto, n: int, bits: int | None, base_dir: str | None, where: str | None) -> None:
    info = {e.key: e.value for e in t.external_data}
    location = info.get("location")
    if not location:
        raise QnnxError(f"tensor {t.name!r} is stored externally but names no file", where=where)
    path = Path(base_dir or ".") / location
    if not path.is_file():
        raise QnnxError(f"external data file {location!r} of tensor {t.name!r} is missing (looked in {path})",
                        where=where)
    try:
        offset, length = int(info.get("offset", 0)), info.get("length")
        length = int(length) if length is not None else None
    except ValueError:
        raise QnnxError(f"tensor {t.name!r} has a non-integer external data offset or length", where=where) from None
    size = os.path.getsize(path)
    available = size - offset if length is None else length
    if offset < 0 or (length is not None and (length < 0 or offset + length > size)):
        raise QnnxError(f"external data of tensor {t.name!r} ({location}, offset {offset}, length {length}) lies "
                        f"outside the file ({size} bytes)", where=where)
    if bits is not None and available != -(-n * bits // 8):
        raise QnnxError(f"tensor {t.name!r} ({_type_name(t.data_type)}, dims {list(t.dims)}) has {available} bytes "
                        f"of external data in {location}, its dims need {-(-n * bits // 8)}", where=where)


def _node_label(node: onnx.NodeProto, index: int) -> str:
    return f"node {node.name or f'#{index}'!r} ({node.op_type})"


def _check_graph(g: onnx.GraphProto, outer: set[str], base_dir: str | None, where: str | None,
                 domains: set[str]) -> bool:
    """Checks ``g`` (and its subgraphs); returns whether its nodes are in topological order."""
    defined = set(outer)
    for v in g.input:
        defined.add(v.name)
    for t in g.initializer:
        check_tensor(t, base_dir, where)
        defined.add(t.name)
    for st in g.sparse_initializer:
        defined.add(st.values.name)
    producer: dict[str, int] = {}
    for i, node in enumerate(g.node):
        for o in node.output:
            if not o:
                continue
            if o in producer:
                raise QnnxError(f"value {o!r} is produced twice ({_node_label(g.node[producer[o]], producer[o])} and "
                                f"{_node_label(node, i)})", where=where)
            if o in defined - outer:
                raise QnnxError(f"{_node_label(node, i)} writes {o!r}, already a graph input or initializer",
                                where=where)
            producer[o] = i
    ordered = True
    seen = set(defined)
    for i, node in enumerate(g.node):
        if (node.domain if node.domain != "ai.onnx" else "") not in domains:
            raise QnnxError(f"{_node_label(node, i)} is in domain {node.domain!r}, which the model does not import "
                            "(no opset_import entry for it)", where=where)
        for name in node.input:
            if not name or name in seen:
                continue
            if name not in producer:
                raise QnnxError(f"{_node_label(node, i)} reads {name!r}, which no graph input, initializer or node "
                                "defines", where=where)
            ordered = False
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                check_tensor(a.t, base_dir, where)
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                inner = f"{_node_label(node, i)} subgraph {a.name!r}"
                _check_graph(sub, seen | set(producer), base_dir, f"{where}: {inner}" if where else inner, domains)
        seen.update(o for o in node.output if o)
    if not ordered:
        _check_acyclic(g, producer, where)
    for v in g.output:
        if v.name not in seen:
            raise QnnxError(f"graph output {v.name!r} is not defined by any input, initializer or node", where=where)
    return ordered


def _check_acyclic(g: onnx.GraphProto, producer: dict[str, int], where: str | None) -> None:
    """A node reading a value made later is fine unless that value depends on the node itself."""
    deps = [[producer[n] for n in node.input if n in producer] for node in g.node]
    state = [0] * len(g.node)  # 0 new, 1 on the stack, 2 done
    for start in range(len(g.node)):
        if state[start]:
            continue
        stack = [(start, iter(deps[start]))]
        state[start] = 1
        while stack:
            i, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[i] = 2
                stack.pop()
            elif state[nxt] == 1:
                path = [j for j, _ in stack]
                cycle = path[path.index(nxt):]
                names = " -> ".join(repr(g.node[j].name or f"#{j}") for j in reversed(cycle))
                raise QnnxError(f"the graph has a cycle through nodes {names}", where=where)
            elif state[nxt] == 0:
                state[nxt] = 1
                stack.append((nxt, iter(deps[nxt])))


def check_model(proto: onnx.ModelProto, *, base_dir: str | None = None, where: str | None = None) -> bool:
    """:class:`QnnxError` unless ``proto`` is a well-formed model (module docstring); returns whether
    its nodes are already in topological order (else the caller sorts them)."""
    if not proto.HasField("graph"):
        raise QnnxError("not an ONNX model: it has no graph (an empty or non-ONNX file?)", where=where)
    domains = {o.domain if o.domain != "ai.onnx" else "" for o in proto.opset_import}
    domains |= {f.domain for f in proto.functions}  # nodes calling the model's own functions
    return _check_graph(proto.graph, set(), base_dir, where, domains)
