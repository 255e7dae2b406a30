"""Values that must reach their reader in float: a planning rule applied after pattern matching.

Two kinds of readers:

- **normalizations** (LayerNorm, Group/InstanceNorm, RMSNorm): their input stays float, and so do the
  elementwise patterns feeding it, back through the chain

      Add(a, b) -> LayerNormalization            the Add stays float (and so do a, b)
      MatMul(x, W) -> Add(bias) -> Add(residual) -> LayerNormalization
                                                 MatMul: x and W quantized, float output; both Adds float

  A normalization divides by a statistic over many channels; in transformers the residual stream
  feeding it has a few outlier channels tens of times larger than the rest (Bondarenko et al. 2021),
  so one per-tensor scale leaves the others a handful of levels, and the normalization scales their
  rounding noise up.
- **numerically fragile inputs** (``qnnx.ops.fragile_inputs``: a Div's denominator, Log, Sqrt,
  Reciprocal, a Pow's base under a negative or fractional exponent): the value read there stays
  float when it is computed, not constant, so quantization can never round it onto the singular
  point (``Log(x * x + 1e-10)``: a quantized ``x * x + 1e-10`` is 0 for small x, and log(0) = -inf).
  Only the pattern producing the value changes; its inputs stay quantized.

How. From each such input, walk back to the pattern producing the value through ops that only
rearrange values. An elementwise pattern (Add/Mul/Concat/tables...) producing it is dropped whole
(for normalizations its activation inputs are followed in turn); a contraction (Conv, ConvTranspose,
MatMul, Gemm) keeps its quantized inputs and loses only its output quantization: the integer kernel
dequantizes its int32 accumulator straight to float, which is what the float reader needs.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from qnnx import ops
from qnnx.autoquant.patterns import PatternMatch, pattern_named
from qnnx.autoquant.report import Decision
from qnnx.ir import const_array


def _pow_is_fragile(node: ir.Node) -> bool:
    """A Pow's base is fragile unless the exponent is a constant non-negative integer (x**2 is smooth)."""
    e = const_array(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    return e is None or not (np.all(e >= 0) and np.all(e == np.round(e)))


def _sites(graph: ir.Graph) -> list[tuple[ir.Value, ir.Node, bool]]:
    """(value, the node reading it, whether the rule cascades upstream) of every input that must be float."""
    out = []
    for node in graph:
        if node.domain not in ("", "ai.onnx"):
            continue
        if ops.normalization(node) and node.inputs and node.inputs[0] is not None:
            out.append((node.inputs[0], node, True))
        for i in ops.fragile_inputs(node):
            v = node.inputs[i] if i < len(node.inputs) else None
            if v is None or v.const_value is not None or (v.producer() is not None
                                                          and v.producer().op_type == "Constant"):
                continue
            if node.op_type == "Pow" and not _pow_is_fragile(node):
                continue
            out.append((v, node, False))
    return out


def keep_inputs_float(graph: ir.Graph, matches: list[PatternMatch], decisions: list[Decision]) -> list[PatternMatch]:
    """``matches`` with the rule applied; the decisions of dropped or changed patterns say why."""
    by_output = {}
    for i, m in enumerate(matches):
        for t in m.outputs:
            by_output[t.value] = i
    dropped: dict[int, str] = {}
    float_output: dict[int, str] = {}
    work = _sites(graph)
    seen: set[ir.Value] = set()
    while work:
        v, reader, cascade = work.pop()
        # through ops that only rearrange values (the value is the same numbers)
        while v is not None and v not in by_output and (p := v.producer()) is not None \
                and ops.permutes_values(p):
            v = p.inputs[0]
        if v is None or v in seen:
            continue
        seen.add(v)
        i = by_output.get(v)
        if i is None or i in dropped:
            continue
        m = matches[i]
        why = (f"feeds {reader.op_type} {reader.name!r}" if cascade else
               f"feeds a numerically fragile input of {reader.op_type} {reader.name!r}")
        if pattern_named(m.pattern).contraction:  # an int32 accumulator: its output can be float for free
            float_output[i] = why
            continue
        dropped[i] = why + ": kept float " + (
            "(a normalization scales up the rounding noise of small channels under an outlier-set per-tensor "
            "scale)" if cascade else "(quantized, a value near 0 there could round onto the singular point)")
        if cascade:
            work += [(t.value, reader, True) for t in m.inputs if t.role == "activation"]
    out = []
    by_anchor = {d.node: d for d in decisions}
    for i, m in enumerate(matches):
        d = by_anchor.get(m.nodes[0].name)  # prepare names every node; decisions use that name
        if i in dropped:
            if d is not None:
                d.quantized, d.pattern = False, None
                d.reason = dropped[i]
            continue
        if i in float_output:
            m = PatternMatch(m.pattern, m.nodes, m.inputs, (), m.bias)
            if d is not None:
                d.reason += f"; float output ({float_output[i]})"
        out.append(m)
    return out
