"""Pre-quantization cleanup of a float model.

- opset below 13 is converted to 13 (per-axis QuantizeLinear needs it) with ONNX's version
  converter — at the load boundary, before any pass;
- constant folding and Constant nodes -> initializers (onnxscript's optimizer);
- BatchNormalization folded into Conv / ConvTranspose / Gemm (onnxscript rewrite rules);
- ONNX shape inference, non-strict, so dynamic batch/height/width never stop it.
"""

from __future__ import annotations

import onnx
import onnx.version_converter
import onnx_ir as ir
import onnxscript.optimizer
from onnx_ir.passes.common import ShapeInferencePass
from onnxscript.rewriter import rewrite
from onnxscript.rewriter.rules.common import (fuse_batchnorm_into_conv_rule, fuse_batchnorm_into_conv_transpose_rule,
                                              fuse_batchnorm_into_gemm_rule)

from qnnx.errors import QnnxError
from qnnx.ir import load_model

MIN_OPSET = 13


def prepare(model, *, min_opset: int = MIN_OPSET) -> ir.Model:
    """The cleaned float model; ``min_opset`` is raised to 21 by callers that emit 16-bit Q/DQ."""
    m = load_model(model)
    opset = m.opset_imports.get("", None)
    if opset is None:
        raise QnnxError("model has no default-domain opset import")
    # Rewrites below replace nodes; the user's node names (used by exclude_nodes and reports)
    # are restored from the output values, whose names rewrites keep.
    user_names = {o.name: n.name for n in m.graph for o in n.outputs if n.name and o.name}
    if opset < min_opset:
        try:
            proto = onnx.version_converter.convert_version(ir.to_proto(m), min_opset)
        except Exception as e:  # the converter raises RuntimeError/ValueError with C++ messages
            raise QnnxError(f"cannot convert opset {opset} to {min_opset}: {str(e).splitlines()[0][:200]}") from None
        m = ir.from_proto(proto)
    m = onnxscript.optimizer.optimize(m)
    m = rewrite(m, pattern_rewrite_rules=[fuse_batchnorm_into_conv_rule, fuse_batchnorm_into_conv_transpose_rule,
                                          fuse_batchnorm_into_gemm_rule])
    try:
        m = ShapeInferencePass(check_type=False, strict_mode=False, data_prop=True)(m).model
    except Exception:  # best effort: rules that need a shape say so
        pass
    _restore_names(m.graph, user_names)
    _name_everything(m.graph)
    return m


def _restore_names(graph: ir.Graph, user_names: dict[str, str]) -> None:
    taken = {n.name for n in graph if n.name}
    for node in graph:
        for o in node.outputs:
            want = user_names.get(o.name)
            if want and node.name != want and want not in taken:
                taken.discard(node.name)
                node.name = want
                taken.add(want)
                break


def _name_everything(graph: ir.Graph) -> None:
    """Unique node and value names: decisions, reports and calibration outputs refer to them."""
    taken = {v.name for v in graph.inputs} | set(graph.initializers)
    taken |= {n.name for n in graph if n.name} | {o.name for n in graph for o in n.outputs if o.name}
    counter = 0

    def fresh(base: str) -> str:
        nonlocal counter
        while f"{base}_{counter}" in taken:
            counter += 1
        name = f"{base}_{counter}"
        taken.add(name)
        return name

    seen_nodes: set[str] = set()
    for node in graph:
        if not node.name or node.name in seen_nodes:
            node.name = fresh(node.op_type)
        seen_nodes.add(node.name)
        for o in node.outputs:
            if not o.name:
                o.name = fresh(f"{node.name}_out")
