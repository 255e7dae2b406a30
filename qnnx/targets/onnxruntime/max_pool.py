"""MaxPool reading a per-channel DequantizeLinear, so ONNX Runtime keeps it float (its uint8 MaxPool is slow).

An ONNX Runtime shaping of the written QDQ model: the logical QDQ model and the canonical model keep
the plain per-tensor DequantizeLinear.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from qnnx.ir import Builder, const_array


def float_max_pools(graph: ir.Graph) -> int:
    """Each MaxPool reading a per-tensor DequantizeLinear gets its own DequantizeLinear with the same
    qparams repeated along the channel axis: the same numbers, but ONNX Runtime's QDQ rules (which
    drop a DQ -> MaxPool -> Q pair only for scalar qparams) then leave the MaxPool float. ORT 1.31's
    uint8 MaxPool is a slow generic loop, slower than the float MaxPool with its DQ and Q, which gives
    a bit-identical output (figures: docs/experiments.md, "ONNX Runtime kernels"). Max commutes with
    the monotone dequantization, so nothing changes but the kernel. Needs the channel count; returns
    the number of MaxPools changed."""
    changed = 0
    for node in list(graph):
        if node.op_type != "MaxPool" or node.domain not in ("", "ai.onnx"):
            continue
        x = node.inputs[0]
        dq = x.producer()
        if dq is None or dq.op_type != "DequantizeLinear" or len(dq.inputs) < 3 or x.shape is None or len(x.shape) < 3:
            continue
        channels = x.shape[1]
        scale, zp = const_array(dq.inputs[1]), const_array(dq.inputs[2])
        if not isinstance(channels, int) or scale is None or zp is None or scale.size != 1 or zp.size != 1:
            continue
        b = Builder(graph, node.name or "MaxPool")
        per_axis = b.op("DequantizeLinear", [dq.inputs[0], b.const(np.full(channels, scale.reshape(()), scale.dtype),
                                                                   "channel_scale"),
                                             b.const(np.full(channels, zp.reshape(()), zp.dtype), "channel_zero_point")],
                        hint="DequantizeLinear", axis=1)
        per_axis.type, per_axis.shape = x.type, x.shape
        graph.insert_before(node, b.nodes)
        node.replace_input_with(0, per_axis)
        if not dq.outputs[0].uses() and not dq.outputs[0].is_graph_output():
            graph.remove(dq, safe=True)
        changed += 1
    return changed
