"""Which quantized convs and matmuls ONNX Runtime would still run in float.

A QDQ group ``DQ -> Conv/Gemm/MatMul -> Q`` pays off only when the runtime fuses it into an integer
kernel (QLinearConv, QGemm, QLinearMatMul). ONNX Runtime keeps the float op, silently, when one of its
selector rules fails: the model still runs and gives the QDQ graph's numbers, only slowly, and
nothing says so (it has happened: a zero-point shift had left some convs' bias scale off
``x_scale * w_scale``; docs/experiments.md, "ONNX Runtime kernels"). So the written model is put
through ORT's optimizer once and every such group still there is reported.

ORT's QDQ fusions are level-2 ("extended") rewrites; the level-3 layout passes would rename the float
nodes, so the check stops at level 2. Int8 activations are not fused on x86-64 by default and 16-bit
ones never: the report then lists every group, which is what runs.
"""

from __future__ import annotations

import os
import tempfile

import onnx
import onnx_ir as ir

from qnnx import runtime
from qnnx.errors import QnnxError

FUSABLE = ("Conv", "Gemm", "MatMul")


def quantized_groups(graph: ir.Graph) -> list[str]:
    """Names of the Conv/Gemm/MatMul nodes reading a DequantizeLinear activation and weight and
    written only to QuantizeLinear (through a Relu or Clip the runtime fuses too): the groups a
    runtime is meant to fuse."""
    names = []
    for node in graph:
        if node.op_type not in FUSABLE or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
            continue
        reads = [node.inputs[0], node.inputs[1]]
        uses = list(node.outputs[0].uses())
        if len(uses) == 1 and uses[0].node.op_type in ("Relu", "Clip") and not node.outputs[0].is_graph_output():
            uses = list(uses[0].node.outputs[0].uses())
        if (all(v is not None and v.producer() is not None and v.producer().op_type == "DequantizeLinear" for v in reads)
                and uses and all(u.node.op_type == "QuantizeLinear" for u in uses)
                and not node.outputs[0].is_graph_output()):
            names.append(node.name)
    return names


def unfused(model: ir.Model) -> tuple[list[str], int]:
    """(the quantized groups ONNX Runtime's CPU optimizer leaves float, the number of groups).
    Empty when ORT cannot load the model (that is reported where the model is run)."""
    groups = quantized_groups(model.graph)
    if not groups:
        return [], 0
    with tempfile.TemporaryDirectory(prefix="qnnx_fusion_") as tmp:
        path = os.path.join(tmp, "optimized.onnx")
        try:
            runtime.session(model, optimized_to=path)
        except QnnxError:  # output_agreement says the model does not load
            return [], len(groups)
        left = {n.name for n in onnx.load(path, load_external_data=False).graph.node
                if n.op_type in FUSABLE and n.domain in ("", "ai.onnx")}
    return [g for g in groups if g in left], len(groups)
