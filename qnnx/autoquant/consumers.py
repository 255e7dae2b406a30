"""Which elementwise function reads an activation, so its range is judged by that function's error.

A conv output read only by a SiLU (``x * Sigmoid(x)``), a hard-swish or a sigmoid matters through
that function: its flat tails (SiLU's and hard-swish's negative side, both sides of a sigmoid) can
be clipped to buy resolution where the function is steep. :func:`consumer_function` names the
function for the "mse" observer (``ObserverConfig.consumer``); ``"identity"`` when the value has any
other reader, is a graph output, or the pattern does not match exactly.

Recognizers, one narrow contract each (:data:`RECOGNIZERS`): ``(value, readers) -> bool``, where
``readers`` are the nodes reading ``value``, each once. Which ones apply is
``QuantConfig.consumer_functions`` (its comment has the measurements behind the default).

An activation read only by convolutions is judged at their outputs instead: :func:`reader_weight_norms`
weighs each channel's rounding error by the weights that read it (``QuantConfig.consumer_weighting``).

The producing side has one question: :func:`silu_output`, whether an activation holds SiLU outputs
only (the "mse" observer's ``negative_lobe``, ``QuantConfig.silu_lobe``).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

import onnx_ir as ir

from qnnx import ops
from qnnx.ir import const_array


def _scalar(v: ir.Value | None) -> float | None:
    c = const_array(v)
    return float(c.reshape(-1)[0]) if c is not None and c.size == 1 else None


def _only_reader(v: ir.Value) -> ir.Node | None:
    users = v.uses()
    return users[0].node if len(users) == 1 and not v.is_graph_output() else None


def _sigmoid(x: ir.Value, readers: list[ir.Node]) -> bool:
    return len(readers) == 1 and readers[0].op_type == "Sigmoid"


def _times_gate(x: ir.Value, readers: list[ir.Node], gate_op: str, gate_value) -> bool:
    """``x`` read by exactly a ``gate_op`` node and a Mul of ``x`` with ``gate_value(that node)`` (either
    operand order), that value read by the Mul alone: the shape of SiLU and of spelled-out hard-swish."""
    if len(readers) != 2:
        return False
    gate = next((n for n in readers if n.op_type == gate_op), None)
    mul = next((n for n in readers if n.op_type == "Mul"), None)
    if gate is None or mul is None:
        return False
    inner = gate_value(gate)
    return inner is not None and _only_reader(inner) is mul and {id(v) for v in mul.inputs} == {id(x), id(inner)}


def _silu(x: ir.Value, readers: list[ir.Node]) -> bool:
    """``Mul(x, Sigmoid(x))`` (either operand order), the sigmoid read by that Mul alone."""
    return _times_gate(x, readers, "Sigmoid", lambda sig: sig.outputs[0])


def _scales_by_constant(node: ir.Node, v: ir.Value) -> bool:
    """``node`` multiplies or divides ``v`` by a positive scalar constant."""
    if node.op_type not in ("Mul", "Div") or len(node.inputs) != 2:
        return False
    other = node.inputs[1] if node.inputs[0] is v else node.inputs[0]
    if node.op_type == "Div" and node.inputs[0] is not v:
        return False
    c = _scalar(other)
    return c is not None and c > 0


def _relu6_of_shift(a: ir.Node, x: ir.Value) -> ir.Value | None:
    """``Clip(Add(x, 3), 0, 6)``, optionally scaled by positive constants: the value it ends in."""
    if a.op_type != "Add" or len(a.inputs) != 2 or x not in a.inputs:
        return None
    if _scalar(a.inputs[1] if a.inputs[0] is x else a.inputs[0]) != 3.0:
        return None
    clip = _only_reader(a.outputs[0])
    if clip is None or clip.op_type != "Clip" or len(clip.inputs) != 3:
        return None
    if _scalar(clip.inputs[1]) != 0.0 or _scalar(clip.inputs[2]) != 6.0:
        return None
    v = clip.outputs[0]
    while (nxt := _only_reader(v)) is not None and _scales_by_constant(nxt, v):
        v = nxt.outputs[0]
    return v


def _hardswish(x: ir.Value, readers: list[ir.Node]) -> bool:
    """``HardSwish(x)``, or spelled out: ``x * Clip(x + 3, 0, 6)`` with positive constant factors."""
    if len(readers) == 1:
        return readers[0].op_type == "HardSwish"
    return _times_gate(x, readers, "Add", lambda add: _relu6_of_shift(add, x))


RECOGNIZERS: dict[str, Callable[[ir.Value, list[ir.Node]], bool]] = {
    "sigmoid": _sigmoid,
    "silu": _silu,
    "hardswish": _hardswish,
}


def consumer_function(value: ir.Value, names=tuple(RECOGNIZERS)) -> str:
    """The :data:`qnnx.calibrate.observers.CONSUMER_FUNCTIONS` key of the function reading ``value``,
    among the recognizers ``names`` (``QuantConfig.consumer_functions``); else ``"identity"``."""
    if value.is_graph_output():
        return "identity"
    readers = [u.node for u in value.uses()]
    if len({id(n) for n in readers}) != len(readers):  # a node reading it twice (x * x): not a match
        return "identity"
    for name in names:
        if RECOGNIZERS[name](value, readers):
            return name
    return "identity"


def silu_output(value: ir.Value, _depth: int = 0) -> bool:
    """``value`` is a SiLU's output (``Mul(x, Sigmoid(x))``, either operand order) or passed on from
    SiLU outputs only by ops that keep their values' range (:func:`qnnx.ops.keeps_range`: MaxPool,
    Split, Concat, nearest or linear Resize...), so it keeps SiLU's negative lobe."""
    node = value.producer()
    if node is None or _depth > 32:
        return False
    if node.op_type == "Mul" and len(node.inputs) == 2:
        a, b = node.inputs
        for x, gate in ((a, b), (b, a)):
            sig = gate.producer() if gate is not None else None
            if x is not None and sig is not None and sig.op_type == "Sigmoid" and sig.inputs[0] is x:
                return True
        return False
    if not ops.keeps_range(node):
        return False
    data = ops.data_inputs(node)
    return bool(data) and all(silu_output(v, _depth + 1) for v in data)


__all__ = ["RECOGNIZERS", "consumer_function", "silu_output"]


def reader_weight_norms(value: ir.Value) -> tuple[float, ...] | None:
    """Per-channel weights of ``value``'s rounding error for a value read only by convolutions (as
    their input, constant weights): channel c's squared weight norm summed over the readers,
    ``sum_o,k W[o, c, k]^2`` (a depthwise conv: its filter c), normalized to mean 1. A conv's output
    error from input rounding ``e`` is ``W e``; with independent per-channel errors its expected square
    is ``sum_c |W[:, c]|^2 E[e_c^2]``, so this makes the histogram methods minimise the readers' output
    error rather than the input's own. None when any reader is not such a conv, or the value is a
    graph output. Where a few loud channels (hard-swish outputs) meet small weights, their tails are
    clipped for the bulk's resolution (figures: docs/experiments.md, "Ranges and observers")."""
    uses = list(value.uses())
    if not uses or value.is_graph_output():
        return None
    total = None
    for use in uses:
        node = use.node
        if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or use.idx != 0:
            return None
        w = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
        if w is None or w.ndim < 3:
            return None
        group = node.attributes.get("group")
        group = int(group.value) if group is not None else 1
        w = np.asarray(w, np.float64)
        if group == 1:
            norms = np.sum(w * w, axis=tuple(d for d in range(w.ndim) if d != 1))
        elif w.shape[1] == 1 and w.shape[0] == group:  # depthwise: channel c meets filter c only
            norms = np.sum(w * w, axis=tuple(range(1, w.ndim)))
        else:
            return None
        if total is not None and norms.shape != total.shape:
            return None
        total = norms if total is None else total + norms
    if total is None or not np.all(np.isfinite(total)) or total.mean() <= 0:
        return None
    return tuple(float(t) for t in total / total.mean())
