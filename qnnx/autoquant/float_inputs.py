"""Values that must reach their reader in float: a planning rule applied after pattern matching.

Three kinds of readers:

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
- **normalizations written out** (a fragile input computed from a statistic, ``ops.statistic``:
  ``x / sqrt(E[x^2] - E[x]^2 + eps)`` as TensorFlow/JAX exporters write LayerNorm, a softmax's sum):
  the cascade of a normalization, through the float ops between the patterns and into what the
  statistic summarizes. A variance from two uint8 terms cancels most of their digits, and one from
  quantized inputs whose spread is small next to their step is mostly rounding noise: ``1 / sqrt``
  of it then scales every channel of a position by a wrong factor.

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


NORMALIZATION, WRITTEN_OUT, FRAGILE = "normalization", "written out", "fragile"
_WHY = {
    NORMALIZATION: "(a normalization scales up the rounding noise of small channels under an outlier-set "
                   "per-tensor scale)",
    WRITTEN_OUT: "(a normalization written out: its statistic is a difference or sum of terms whose rounding "
                 "errors the fragile op scales up)",
    FRAGILE: "(quantized, a value near 0 there could round onto the singular point)",
}
STATISTIC_DEPTH = 12  # ops walked up from a fragile input looking for the statistic it is computed from


def _from_statistic(v: ir.Value, statistic: ir.Node | None = None) -> bool:
    """Whether ``v`` is computed from a statistic (a sum or mean over axes; ``statistic`` when given)
    through elementwise and data-movement ops only: the denominator of a normalization written out,
    ``sqrt(E[x^2] - E[x]^2 + eps)``, or its mean."""
    todo, seen = [(v, 0)], set()
    while todo:
        v, depth = todo.pop()
        p = v.producer()
        if p is None or p in seen or depth > STATISTIC_DEPTH:
            continue
        seen.add(p)
        if ops.statistic(p) and (statistic is None or p is statistic):
            return True
        if ops.elementwise(p) or ops.moves_data(p):
            todo += [(x, depth + 1) for x in _operands(p)]
    return False


def _operands(node: ir.Node) -> list[ir.Value]:
    """The inputs whose values an elementwise op computes on, or a data-movement op hands on."""
    return ops.data_inputs(node) if ops.moves_data(node) else [x for x in node.inputs if x is not None]


def _sites(graph: ir.Graph) -> list[tuple[ir.Value, ir.Node, str]]:
    """(value, the node reading it, which kind of rule) of every input that must be float."""
    out = []
    for node in graph:
        if node.domain not in ("", "ai.onnx"):
            continue
        if ops.normalization(node) and node.inputs and node.inputs[0] is not None:
            out.append((node.inputs[0], node, NORMALIZATION))
        for i in ops.fragile_inputs(node):
            v = node.inputs[i] if i < len(node.inputs) else None
            if v is None or v.const_value is not None or (v.producer() is not None
                                                          and v.producer().op_type == "Constant"):
                continue
            if node.op_type == "Pow" and not _pow_is_fragile(node):
                continue
            out.append((v, node, WRITTEN_OUT if _from_statistic(v) else FRAGILE))
    return out


def _computed_inputs(node: ir.Node) -> list[ir.Value]:
    """The operands of a float elementwise or data-movement op that are computed, not constants."""
    return [x for x in _operands(node) if x.const_value is None
            and (x.producer() is None or x.producer().op_type != "Constant")]


def keep_inputs_float(graph: ir.Graph, matches: list[PatternMatch], decisions: list[Decision]) -> list[PatternMatch]:
    """``matches`` with the rule applied; the decisions of dropped or changed patterns say why."""
    by_output = {}
    for i, m in enumerate(matches):
        for t in m.outputs:
            by_output[t.value] = i
    by_node = {n: i for i, m in enumerate(matches) for n in m.nodes}
    dropped: dict[int, str] = {}
    float_output: dict[int, str] = {}
    work = _sites(graph)
    seen: set[ir.Value] = set()
    while work:
        v, reader, kind = work.pop()
        # through ops that only rearrange values (the value is the same numbers)
        while v is not None and v not in by_output and (p := v.producer()) is not None \
                and ops.permutes_values(p):
            v = p.inputs[0]
        if v is None or v in seen:
            continue
        seen.add(v)
        i = by_output.get(v)
        if i is None and kind == WRITTEN_OUT and (p := v.producer()) is not None:
            # a normalization written out goes on through the float ops between its patterns (a
            # Max(variance, 0) clamp, an Expand), and what its statistic summarizes is its input
            if ops.statistic(p) and p.inputs and p.inputs[0] is not None:
                work.append((p.inputs[0], reader, WRITTEN_OUT))
                # the centring x - mean reads the statistic's input beside the statistic: float too
                for r, _ in p.inputs[0].uses():
                    k = by_node.get(r)
                    if k is not None and k not in dropped and not pattern_named(matches[k].pattern).contraction \
                            and any(x is not None and x is not p.inputs[0] and _from_statistic(x, p) for x in r.inputs):
                        dropped[k] = (f"reads {p.op_type} {p.name!r} of a normalization written out beside its "
                                      f"input: kept float {_WHY[WRITTEN_OUT]}")
            elif ops.elementwise(p) or ops.moves_data(p):
                work += [(x, reader, WRITTEN_OUT) for x in _computed_inputs(p)]
            continue
        if i is None or i in dropped:
            continue
        m = matches[i]
        why = (f"feeds a numerically fragile input of {reader.op_type} {reader.name!r}" if kind != NORMALIZATION
               else f"feeds {reader.op_type} {reader.name!r}")
        if pattern_named(m.pattern).contraction:  # an int32 accumulator: its output can be float for free
            float_output[i] = why
            continue
        dropped[i] = f"{why}: kept float {_WHY[kind]}"
        if kind != FRAGILE:
            work += [(t.value, reader, kind) for t in m.inputs if t.role == "activation"]
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
