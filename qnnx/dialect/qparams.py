"""The qparams rules of every ``qnnx`` op, checked on the graph before anything uses it.

One check shared by import (``import_onnx``: the ONNX quantization ops it rewrites and any qnnx op
already in the file), ``from_qdq`` (the canonical model it produces) and ``lower`` (each node it
lowers), so none of them passes on what the reference kernels or ONNX Runtime would refuse:

- the attributes resolve (required ones present, choices respected) and required inputs are given;
- constant scales are positive, finite, normal floats (:func:`qnnx.numerics.check_scale`);
- constant zero points are integers inside the range of the tensor they describe
  (:func:`qnnx.numerics.check_zero_point`; ranges from :mod:`qnnx.dtypes`);
- a per-axis qparam is 1-D with one value per index of its axis, the axis within the rank; a
  per-tensor-only qparam has one value; blocked qparams match the tensor shape and block size;
- integer operands have a dtype the op takes (no int32 conv input, no int16 conv weights).

Shapes and dtypes that are not known statically are not checked here (the kernels check them
on the data). Run-time (non-constant) qparams are the kernels' business too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from qnnx import numerics
from qnnx.dialect.linear_ops import ACT_TYPES, WEIGHT_TYPES
from qnnx.dialect.schema import DOMAIN, INT_DTYPES, get_schema
from qnnx.dtypes import int_type, is_int_type
from qnnx.errors import QnnxError
from qnnx.ir import const_array

OUT = -1  # the tensor a qparam describes is the node's output (dtype: out_dtype, or like `dtype_like`)
AXIS = "axis"  # the axis comes from the node's `axis` attribute


@dataclass(frozen=True)
class QParamInputs:
    """Where one (scale, zero point) pair sits in an op's inputs and what it describes."""
    scale: int
    zero_point: int
    tensor: int  # input index of the tensor it describes, or OUT
    axis: int | str | None = AXIS  # an attribute name, a fixed axis, or None: per-tensor only
    blocked: bool = False  # the op's block_size attribute applies
    float_zero_point: bool = False  # simulated ops carry integral zero points in float
    dtype_like: int | None = None  # OUT of an op without out_dtype: the dtype of this input


def _binary_qparams() -> tuple[QParamInputs, ...]:
    return (QParamInputs(1, 2, 0), QParamInputs(4, 5, 3), QParamInputs(6, 7, OUT))


def _pool_qparams() -> tuple[QParamInputs, ...]:
    return (QParamInputs(1, 2, 0, axis=1), QParamInputs(3, 4, OUT, axis=1, dtype_like=0))


QPARAMS: dict[str, tuple[QParamInputs, ...]] = {
    "quantize": (QParamInputs(1, 2, OUT, blocked=True),),
    "dequantize": (QParamInputs(1, 2, 0, blocked=True),),
    "simulated_quantize": (QParamInputs(1, 2, OUT, blocked=True, float_zero_point=True),),
    "simulated_dequantize": (QParamInputs(1, 2, 0, blocked=True, float_zero_point=True),),
    "requantize": (QParamInputs(1, 2, 0), QParamInputs(3, 4, OUT)),
    "conv": (QParamInputs(2, 3, 0, axis=1), QParamInputs(4, 5, 1, axis=0)),  # x per channel: depthwise only
    "conv_transpose": (QParamInputs(2, 3, 0, axis=None), QParamInputs(4, 5, 1, axis=1)),  # per-axis only with group 1
    "matmul": (QParamInputs(1, 2, 0, axis=-2), QParamInputs(4, 5, 3, axis=-1)),
    "add": _binary_qparams(), "sub": _binary_qparams(), "mul": _binary_qparams(),
    "avg_pool": _pool_qparams(), "global_avg_pool": _pool_qparams(),
    "softmax": (QParamInputs(1, 2, 0, axis=None), QParamInputs(3, 4, OUT, axis=None)),
    "variance": (QParamInputs(1, 2, 0, axis=None), QParamInputs(3, 4, OUT, axis=None)),
    "layer_norm": (QParamInputs(1, 2, 0, axis=None), QParamInputs(3, 4, OUT, axis=-1), QParamInputs(8, 9, 7, axis=None)),
    "concat": (QParamInputs(0, 1, OUT, axis="quant_axis"),),  # plus one triple per input, added in check_node
    "lut": (),
}

_BITS_8_16 = ("int8", "uint8", "int16", "uint16")
# dtypes each op takes for its integer operands (input index -> names); others are not restricted here.
OPERAND_TYPES: dict[str, dict[int, tuple[str, ...]]] = {
    "conv": {0: ACT_TYPES, 1: WEIGHT_TYPES, 6: ("int32",)},
    "conv_transpose": {0: ACT_TYPES, 1: WEIGHT_TYPES, 6: ("int32",)},
    "matmul": {0: ACT_TYPES, 3: (*WEIGHT_TYPES, "int16"), 6: ("int32",)},
    "add": {0: _BITS_8_16, 3: _BITS_8_16}, "sub": {0: _BITS_8_16, 3: _BITS_8_16}, "mul": {0: _BITS_8_16, 3: _BITS_8_16},
    "avg_pool": {0: ACT_TYPES}, "global_avg_pool": {0: ACT_TYPES},
    "softmax": {0: _BITS_8_16}, "variance": {0: _BITS_8_16}, "layer_norm": {0: _BITS_8_16, 7: INT_DTYPES},
    "lut": {0: ("int4", "uint4", "int8", "uint8", "int16", "uint16")},
    "dequantize": {0: INT_DTYPES}, "requantize": {0: INT_DTYPES},
}


_BINARY = ("add", "sub", "mul")  # per-axis qparams of a, b and y all run along the broadcast output's axis
_BROADCASTING = (*_BINARY, "concat")  # output shape not that of input 0


def _input(node: ir.Node, i: int) -> ir.Value | None:
    return node.inputs[i] if 0 <= i < len(node.inputs) else None


def _name(schema, i: int) -> str:
    return schema.inputs[i].name if i < len(schema.inputs) and not schema.inputs[i].variadic else f"input {i}"


def _shape(v: ir.Value | None) -> tuple | None:
    return tuple(v.shape) if v is not None and v.shape is not None else None


def check_node(node: ir.Node) -> dict:
    """:class:`QnnxError` (unlocated: callers say which node) unless ``node``, a ``qnnx`` op,
    keeps the rules of the module docstring; returns its resolved attributes."""
    schema = get_schema(node.op_type)
    attrs = schema.resolve_attributes({k: v.value for k, v in node.attributes.items()}, None)
    fixed = [i for i, s in enumerate(schema.inputs) if not s.variadic]
    for i in fixed:
        if not schema.inputs[i].optional and _input(node, i) is None:
            raise QnnxError(f"qnnx.{node.op_type} is missing its input {schema.inputs[i].name!r}")
    for i, allowed in OPERAND_TYPES.get(node.op_type, {}).items():
        v = _input(node, i)
        if v is not None and v.dtype is not None:
            name = int_type(v.dtype).name if is_int_type(v.dtype) else str(v.dtype).lower()
            if name not in allowed:
                raise QnnxError(f"{_name(schema, i)} has dtype {name}; qnnx.{node.op_type} takes "
                                f"{'/'.join(allowed)}")
    groups = list(QPARAMS[node.op_type])
    names = {}
    if node.op_type == "conv_transpose" and attrs["group"] != 1:
        groups[1] = QParamInputs(4, 5, 1, axis=None)
    if node.op_type == "concat":
        extra = len(node.inputs) - 2
        if extra <= 0 or extra % 3:
            raise QnnxError(f"concat takes (x, scale, zero_point) triples after y_scale, y_zero_point; got {extra} "
                            "inputs")
        for k in range(extra // 3):
            x = 2 + 3 * k
            groups.append(QParamInputs(x + 1, x + 2, x, axis="quant_axis"))
            names.update({x + 1: f"x{k}_scale", x + 2: f"x{k}_zero_point"})
    for qp in groups:
        _check_qparams(node, schema, attrs, qp, names)
    if node.op_type == "conv":
        _check_conv_input_channels(node)
    return attrs


def _check_conv_input_channels(node: ir.Node) -> None:
    """Per-channel x qparams only on a depthwise conv (one input channel per group), whose every output
    channel's accumulator then has one scale."""
    per_channel = any(p is not None and np.size(p) > 1 for p in (const_array(_input(node, 2)),
                                                                 const_array(_input(node, 3))))
    w_shape = _shape(_input(node, 1))
    if per_channel and w_shape is not None and len(w_shape) > 1 and w_shape[1] != 1:
        raise QnnxError(f"per-channel x qparams need a depthwise conv (one input channel per group), but w has "
                        f"{w_shape[1]} input channels per group")


def _check_qparams(node: ir.Node, schema, attrs: dict, qp: QParamInputs, names: dict) -> None:
    s_val, z_val = _input(node, qp.scale), _input(node, qp.zero_point)
    s_name = names.get(qp.scale) or _name(schema, qp.scale)
    z_name = names.get(qp.zero_point) or _name(schema, qp.zero_point)
    tensor = node.outputs[0] if qp.tensor == OUT else _input(node, qp.tensor)
    if qp.tensor == OUT:
        dtype = int_type(attrs["out_dtype"]) if "out_dtype" in attrs else None
        like = _input(node, qp.dtype_like) if qp.dtype_like is not None else None
        if dtype is None and like is not None and like.dtype is not None and is_int_type(like.dtype):
            dtype = int_type(like.dtype)
    else:
        dtype = int_type(tensor.dtype) if tensor is not None and tensor.dtype is not None and \
            is_int_type(tensor.dtype) else None
    scale = const_array(s_val)
    zp = const_array(z_val)
    if scale is not None:
        numerics.check_scale(scale, s_name)
    if zp is not None:
        zp = np.asarray(zp)
        integral = zp.dtype.kind in "iu" or is_int_type(zp.dtype)
        if not integral and not qp.float_zero_point:
            raise QnnxError(f"{z_name} must be an integer tensor, got dtype {zp.dtype}")
        if dtype is not None:
            numerics.check_zero_point(zp, dtype, z_name)
        elif not integral:
            numerics.check_zero_point(zp, int_type("int32"), z_name)  # integral values at least
    label = "the output" if qp.tensor == OUT else _name(schema, qp.tensor)
    if node.op_type in _BINARY:
        tensor, label = node.outputs[0], "the output"
    elif qp.tensor == OUT and node.outputs[0].shape is None and node.op_type not in _BROADCASTING:
        tensor, label = _input(node, 0), _name(schema, 0)  # same rank and same size along the qparams' axis
    shape = _shape(tensor)
    block = attrs.get("block_size") or 0 if qp.blocked else 0
    if qp.blocked and block < 0:
        raise QnnxError(f"block_size must be positive, got {block}")
    axis = attrs[qp.axis] if isinstance(qp.axis, str) else qp.axis
    sizes = []
    for p, name in ((scale, s_name), (zp, z_name)):
        if p is None:
            continue
        p = np.asarray(p)
        if p.size == 1 and p.ndim <= 1 and not block:
            sizes.append(None)
            continue
        if axis is None:
            raise QnnxError(f"{name} must be per-tensor (one value), got shape {p.shape}")
        if block:
            if p.ndim == 0:
                continue  # one value for every block
            if shape is not None and p.ndim != len(shape):
                raise QnnxError(f"blocked {name} must have the input's rank, got shape {p.shape}")
            if shape is not None and all(isinstance(d, int) for d in shape):
                numerics.broadcast_param(p, shape, axis, block, name)
            sizes.append(p.shape)
            continue
        if p.ndim != 1:
            raise QnnxError(f"{name} must be a scalar or 1-D (per-axis), got shape {p.shape}")
        if shape is not None:
            ax = numerics.normalize_axis(axis, len(shape))
            dim = shape[ax]
            if isinstance(dim, int) and p.size != dim:
                shown = f"{label} {tensor.name!r}" if tensor.name else label
                raise QnnxError(f"{name} has {p.size} values but axis {axis} of {shown} (shape {list(shape)}) has {dim}")
        sizes.append(p.shape)
    if len(sizes) == 2 and None not in sizes and sizes[0] != sizes[1]:
        raise QnnxError(f"{s_name} has shape {sizes[0]} but {z_name} has shape {sizes[1]}")


def check_graph(graph: ir.Graph) -> None:
    """:func:`check_node` on every qnnx node of ``graph``, errors located at the node."""
    for node in graph:
        if node.domain != DOMAIN:
            continue
        try:
            check_node(node)
        except QnnxError as e:
            raise e.at(node_label(node)) from None


def node_label(node: ir.Node) -> str:
    return f"node {node.name or node.op_type!r} (qnnx.{node.op_type})"
