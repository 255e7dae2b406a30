"""A short description of a model: ops by domain, what is quantized, qparams."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from qnnx.ir import const_array, load_model

QUANT_OPS = {("", "QuantizeLinear"), ("", "DequantizeLinear"), ("qnnx", "quantize"), ("qnnx", "dequantize"),
              ("qnnx", "requantize")}


@dataclass
class ModelSummary:
    path: str
    opsets: dict[str, int]
    inputs: list[str]
    outputs: list[str]
    ops: collections.Counter = field(default_factory=collections.Counter)  # (domain, op_type) -> count
    per_channel: int = 0
    per_tensor: int = 0
    scale_range: tuple[float, float] | None = None

    def format(self) -> str:
        lines = [f"model {self.path}", "  opsets: " + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in self.opsets.items()),
                 "  inputs: " + ", ".join(self.inputs), "  outputs: " + ", ".join(self.outputs)]
        integer = sum(c for (d, _), c in self.ops.items() if d == "qnnx")
        qdq = sum(c for k, c in self.ops.items() if k in QUANT_OPS)
        lines.append(f"  {sum(self.ops.values())} nodes: {integer} qnnx integer ops, {qdq} quantize/dequantize/"
                     f"requantize nodes")
        for (d, op), c in sorted(self.ops.items(), key=lambda i: (-i[1], i[0])):
            lines.append(f"    {c:5d}  {d + '.' if d else ''}{op}")
        if self.scale_range:
            lines.append(f"  qparams: {self.per_tensor} per-tensor, {self.per_channel} per-axis; scales "
                         f"{self.scale_range[0]:.3g} .. {self.scale_range[1]:.3g}")
        return "\n".join(lines)


def summarize(model) -> ModelSummary:
    m = load_model(model)
    s = ModelSummary(str(model) if isinstance(model, str) else "<in memory>", dict(m.opset_imports),
                     [v.name for v in m.graph.inputs if v.name not in m.graph.initializers],
                     [v.name for v in m.graph.outputs])
    scales = []
    for node in ir.traversal.RecursiveGraphIterator(m.graph):
        s.ops[(node.domain, node.op_type)] += 1
        if (node.domain, node.op_type) in QUANT_OPS and len(node.inputs) > 1:
            arr = const_array(node.inputs[1])
            if arr is not None:
                arr = np.asarray(arr, np.float64)
                scales.append(arr)
                if arr.size > 1:
                    s.per_channel += 1
                else:
                    s.per_tensor += 1
    if scales:
        flat = np.concatenate([a.ravel() for a in scales])
        s.scale_range = (float(flat.min()), float(flat.max()))
    return s
