"""Channel padding of quantized depthwise convolutions, so ONNX Runtime runs its fast kernel.

ONNX Runtime's CPU QLinearConv takes its symmetric depthwise kernel (MLAS ``ConvSymDepthwise``,
vectorized over 64 channels) only when the group count is a multiple of 16 (x86; the weights must be
int8 with zero zero points). Any other depthwise conv goes to a generic per-pixel loop that is
much slower for the same output bits (figures: docs/experiments.md, "ONNX Runtime kernels").

So each such conv's channels are padded to the next multiple, together with everything that carries
those channels, until convolutions that mix channels:

    producer Conv (C out)  -> elementwise/Q/DQ/pooling -> depthwise Conv(group=C) -> ... -> Conv (C in)
    producer Conv (C+P out, zero rows) -> ...           -> depthwise Conv(group=C+P) -> ... -> Conv (C+P in, zero columns)

The region is every value reachable from the depthwise conv through channel-wise ops (elementwise
ops, Clip/Relu/HardSigmoid..., Q/DQ, pooling, other depthwise convs of the same width, and the branch
of a squeeze-excitation gate multiplied in); it ends at convolutions that mix channels: their output
rows (producers) or input columns (consumers) get zero weights. The padded channels carry whatever a
zero channel becomes (``x + 3`` makes them 3), never read by anything but zero weights, so every real
channel computes the same integers as before: exact, not approximately equal. A region that reaches
anything else (a graph input or output, a reshape, a reduction over channels, an op not listed) is
left alone, with the reason.

This is a runtime shaping of the QDQ model written for ONNX Runtime; the logical QDQ model and the
canonical qnnx model keep the true channel counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from qnnx import ops
from qnnx.ir import Builder, const_array

# MLAS aligns depthwise groups to 16 on x86 (8 on ARM64); 16 serves both.
GROUP_MULTIPLE = 16



@dataclass(frozen=True)
class PaddingRecord:
    """One depthwise conv: padded from ``channels`` to ``padded`` (0 when left alone, with ``reason``)."""

    node: str
    channels: int
    padded: int = 0
    reason: str = ""


@dataclass
class _Region:
    channels: int
    values: set = field(default_factory=set)
    interior: set = field(default_factory=set)   # channel-wise nodes (depthwise convs included)
    consumers: set = field(default_factory=set)  # channel-mixing convs reading the region (input 0)
    producers: set = field(default_factory=set)  # channel-mixing convs writing into the region


def _group(node: ir.Node) -> int:
    attr = node.attributes.get("group")
    return int(attr.value) if attr is not None else 1


def _is_conv(node: ir.Node) -> bool:
    return node.op_type == "Conv" and node.domain in ("", "ai.onnx")


def _stored(v: ir.Value | None) -> np.ndarray | None:
    """The stored array behind ``v``: an initializer, or the integer input of a DequantizeLinear of one
    (with constant qparams)."""
    direct = const_array(v)
    if direct is not None:
        return direct
    dq = v.producer() if v is not None else None
    if dq is not None and dq.op_type == "DequantizeLinear" and all(const_array(x) is not None
                                                                  for x in dq.inputs if x is not None):
        return const_array(dq.inputs[0])
    return None


def _weight_array(node: ir.Node) -> np.ndarray | None:
    """A conv's stored weights, None unless they and its bias (if any) are constants."""
    if len(node.inputs) > 2 and node.inputs[2] is not None and _stored(node.inputs[2]) is None:
        return None
    return _stored(node.inputs[1]) if len(node.inputs) > 1 else None


def _is_depthwise(node: ir.Node, channels: int) -> bool:
    w = _weight_array(node)
    return (_is_conv(node) and _group(node) == channels and w is not None and w.ndim >= 3
            and w.shape[0] == channels and w.shape[1] == 1)


def _fast_path_eligible(conv: ir.Node) -> str:
    """Why padding ``conv`` would not reach the symmetric kernel ('' when it would)."""
    w = conv.inputs[1]
    dq = w.producer()
    if dq is None or dq.op_type != "DequantizeLinear":
        return "weights are not quantized"
    q = const_array(dq.inputs[0])
    zp = const_array(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2] is not None else np.zeros(1, np.int8)
    if q is None or q.dtype != np.int8 or zp is None or np.any(zp != 0):
        return "weights are not int8 with zero zero points"
    x = conv.inputs[0].producer()
    if x is None or x.op_type != "DequantizeLinear":
        return "input is not quantized"
    return ""


def _channels(v: ir.Value) -> int | str | None:
    if v.shape is None or len(v.shape) < 2:
        return None
    return v.shape[1]


def _grow(seed: ir.Node, channels: int) -> _Region | str:
    """The region of ``seed`` (a depthwise conv over ``channels``), or why it cannot be padded."""
    region = _Region(channels)
    region.interior.add(seed)
    work = [seed.inputs[0], seed.outputs[0]]

    def visit(node: ir.Node, via: ir.Value) -> str:
        if node in region.interior:
            return ""
        if _is_conv(node) and not _is_depthwise(node, channels):
            if _group(node) != 1 or _weight_array(node) is None:
                return f"{node.name}: grouped or non-constant conv"
            if via in node.outputs:
                region.producers.add(node)
            elif node.inputs[0] is via:
                region.consumers.add(node)
            else:
                return f"{node.name}: reads the channels as weights"
            return ""
        # ops that compute each channel from the same channel only (qnnx.ops.channelwise); their other
        # operands must be broadcast scalars or [N, 1, ...] values (checked below)
        if not ops.channelwise(node.op_type) and not _is_depthwise(node, channels):
            return f"{node.name}: {node.op_type} is not channel-wise"
        if node.domain not in ("", "ai.onnx"):
            return f"{node.name}: custom domain {node.domain}"
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            qparams = [const_array(v) for v in node.inputs[1:] if v is not None]
            if any(q is None or q.size != 1 for q in qparams):
                return f"{node.name}: qparams not per-tensor constants"
        region.interior.add(node)
        # the data operands: a conv's weights and bias, a Q/DQ's qparams were checked above
        data = node.inputs[:1] if _is_conv(node) or node.op_type in ("QuantizeLinear", "DequantizeLinear") \
            else node.inputs
        for v in [*data, *node.outputs]:
            if v is None or v in region.values:
                continue
            c = _stored(v)
            if c is not None:
                if c.size != 1:
                    return f"{node.name}: constant operand {v.name} of shape {list(c.shape)}"
            elif _channels(v) == channels:
                work.append(v)
            elif _channels(v) != 1:
                return f"{node.name}: operand {v.name} has {_channels(v)} channels"
        return ""

    while work:
        v = work.pop()
        if v in region.values:
            continue
        if v.is_graph_input() or v.is_graph_output():
            return f"{v.name}: a graph input or output carries the channels"
        if _channels(v) != channels:
            return f"{v.name}: channel count {_channels(v)} unknown or different"
        region.values.add(v)
        producer = v.producer()
        nodes = ([producer] if producer is not None else []) + [u.node for u in v.uses()]
        for node in nodes:
            why = visit(node, v)
            if why:
                return why
    return region


def _padded(array: np.ndarray, axis: int, extra: int, fill) -> np.ndarray:
    shape = list(array.shape)
    shape[axis] = extra
    pad = np.broadcast_to(np.asarray(fill, array.dtype), shape) if np.ndim(fill) == 0 else fill
    return np.concatenate([array, np.asarray(pad, array.dtype)], axis=axis)


def _pad_constant_input(graph: ir.Graph, node: ir.Node, index: int, axis: int, extra: int) -> None:
    """Input ``index`` of ``node`` (an initializer, or a DequantizeLinear of one) padded along ``axis``:
    zeros for float data, the zero point for quantized data (so it dequantizes to 0), and per-axis
    scales repeated (any positive scale serves a zero value). New constants: the old may be shared."""
    v = node.inputs[index]
    b = Builder(graph, node.name or node.op_type)
    direct = const_array(v)
    if direct is not None:
        new = b.const(_padded(direct, axis, extra, 0), "padded")
        node.replace_input_with(index, new)
        return
    dq = v.producer()
    q = const_array(dq.inputs[0])
    scale = const_array(dq.inputs[1])
    zp = const_array(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2] is not None else None
    zero = np.zeros(scale.shape, q.dtype) if zp is None else zp
    per_axis = scale.size > 1
    dq_axis = int(dq.attributes["axis"].value) % q.ndim if per_axis and "axis" in dq.attributes else 1 % q.ndim
    pad_shape = [extra if d == axis else q.shape[d] for d in range(q.ndim)]
    new_scale, new_zp = scale, zp
    if per_axis and dq_axis == axis:  # new slices of the scale's own axis: any scale, the last zero point
        new_scale = _padded(scale, 0, extra, scale.reshape(-1)[-1])
        new_zp = None if zp is None else _padded(zp, 0, extra, zp.reshape(-1)[-1])
        q_fill = np.broadcast_to(zero.reshape(-1)[-1], pad_shape)
    elif per_axis:  # each slice along the scale's axis pads with its own zero point
        q_fill = np.broadcast_to(zero.reshape([-1 if d == dq_axis else 1 for d in range(q.ndim)]), pad_shape)
    else:
        q_fill = np.broadcast_to(zero.reshape(()), pad_shape)
    inputs = [b.const(_padded(q, axis, extra, q_fill), "padded_quantized"), b.const(new_scale, "padded_scale")]
    if new_zp is not None:
        inputs.append(b.const(new_zp, "padded_zero_point"))
    attrs = {"axis": int(dq.attributes["axis"].value)} if "axis" in dq.attributes else {}
    out = b.op("DequantizeLinear", inputs, hint="padded_DequantizeLinear", **attrs)
    out.type = v.type
    out.shape = ir.Shape([extra + d if i == axis else d for i, d in enumerate(q.shape)])
    graph.insert_before(node, b.nodes)
    node.replace_input_with(index, out)


def _in_graph_order(graph: ir.Graph, nodes: set) -> list[ir.Node]:
    # sets iterate in id order; the graph order keeps the written model byte-identical run to run
    return [n for n in graph if n in nodes]


def _apply(graph: ir.Graph, region: _Region, extra: int) -> None:
    for node in _in_graph_order(graph, region.producers):  # new output rows: zero weights and bias
        _pad_constant_input(graph, node, 1, 0, extra)
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            _pad_constant_input(graph, node, 2, 0, extra)
    for node in _in_graph_order(graph, region.consumers):  # new input columns: zero weights
        _pad_constant_input(graph, node, 1, 1, extra)
    for node in _in_graph_order(graph, region.interior):
        if _is_conv(node):  # a depthwise conv: one more zero filter (and bias) per new channel
            _pad_constant_input(graph, node, 1, 0, extra)
            if len(node.inputs) > 2 and node.inputs[2] is not None:
                _pad_constant_input(graph, node, 2, 0, extra)
            node.attributes["group"] = ir.AttrInt64("group", region.channels + extra)
    for v in region.values:
        dims = list(v.shape)
        dims[1] = region.channels + extra
        v.shape = ir.Shape(dims)


def pad_depthwise_channels(graph: ir.Graph, multiple: int = GROUP_MULTIPLE) -> list[PaddingRecord]:
    """Pad every quantized depthwise conv whose channel count is not a multiple of ``multiple`` (and the
    region carrying its channels) in place; one record per such conv, padded or with the reason not."""
    records: list[PaddingRecord] = []
    done: set = set()
    for node in list(graph):
        if not _is_conv(node) or node in done:
            continue
        channels = _group(node)
        if channels == 1 or channels % multiple == 0 or not _is_depthwise(node, channels):
            continue
        why = _fast_path_eligible(node)
        region = _grow(node, channels) if not why else why
        if isinstance(region, str):
            records.append(PaddingRecord(node.name, channels, reason=region))
            continue
        extra = -channels % multiple
        _apply(graph, region, extra)
        for n in _in_graph_order(graph, region.interior):
            if _is_conv(n):
                done.add(n)
                records.append(PaddingRecord(n.name, channels, channels + extra))
    return records
