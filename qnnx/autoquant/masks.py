"""Additive attention masks: float values built from integer inputs with a "minus infinity" sentinel.

    attention_mask (int) -> Cast -> Sub(1, .) -> Mul(-10000)            (older BERT exports)
    attention_mask (int) -> ... -> Where(mask, 0, finfo(float32).min)    (transformers >= 4.3x)
    scores + mask -> Softmax,  or  Where(mask, scores, -inf) -> Softmax

Such a value has two kinds of entries: 0 where a token is attended and a sentinel (-1e4, -3.4e38,
-inf) where it is padding. No uint8 range serves both: an observer that covers the sentinel leaves
the attention scores one or two levels, and the model's output is ruined (docs/experiments.md,
"Patterns"). So the mask and the sum it enters stay float, and a Softmax reading a masked sum quantizes
only its output (probabilities, [0, 1]); the sentinel then does exactly what it does in float.

A value is an additive mask when it is computed, through the ops below only, from graph inputs,
shape metadata and constants, and one of those constants is a sentinel (<= -1e4). Embedding lookups
(Gather of a float table by token ids) pass the first test but have no sentinel.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from qnnx import ops
from qnnx.ir import const_array

SENTINEL = -1e4  # the largest "minus infinity" exporters use (BERT's -10000.0)
# The ops exporters build attention masks with: a recognizer's vocabulary (as a pattern's anchors), not facts
# about the ops (qnnx.ops).
_MASK_OPS = frozenset({"Cast", "Sub", "Mul", "Add", "Where", "Expand", "Unsqueeze", "Squeeze", "Reshape", "Not",
                       "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Slice",
                       "Concat", "Identity", "Transpose", "Shape", "Size", "ConstantOfShape", "Range", "Gather",
                       "Tile", "Neg", "Min", "Max"})


def _sentinel_const(v: ir.Value) -> bool:
    c = const_array(v)
    return c is not None and np.issubdtype(c.dtype, np.floating) and c.size > 0 and bool(np.min(c) <= SENTINEL)


def _constant_of_shape_sentinel(node: ir.Node) -> bool:
    if node.op_type != "ConstantOfShape" or "value" not in node.attributes:
        return False
    t = node.attributes["value"].value
    c = t.numpy() if hasattr(t, "numpy") else None
    return c is not None and np.issubdtype(c.dtype, np.floating) and c.size > 0 and bool(np.min(c) <= SENTINEL)


def is_additive_mask(v: ir.Value | None, _limit: int = 64) -> bool:
    """``v`` is built only from inputs, shapes and constants (at most ``_limit`` nodes back) and
    carries a sentinel constant: an attention mask, not data."""
    if v is None or v.dtype is None or not v.dtype.is_floating_point() or const_array(v) is not None:
        return False
    seen: set[ir.Value] = set()
    work, sentinel = [v], False
    while work:
        cur = work.pop()
        if cur in seen:
            continue
        seen.add(cur)
        if len(seen) > _limit:
            return False
        if _sentinel_const(cur):
            sentinel = True
        p = cur.producer()
        if p is None:  # a graph input or an initializer
            continue
        if p.op_type not in _MASK_OPS or p.domain not in ("", "ai.onnx"):
            return False
        sentinel |= _constant_of_shape_sentinel(p)
        if ops.shape_only(p):
            continue  # shape metadata (Shape, Size), whatever it is computed from
        work += [x for x in p.inputs if x is not None]
    return sentinel


def is_masked(v: ir.Value | None) -> bool:
    """``v`` is scores with a mask applied: ``Add/Sub(scores, mask)`` or ``Where(cond, scores, sentinel)``."""
    p = v.producer() if v is not None else None
    if p is None or p.domain not in ("", "ai.onnx"):
        return False
    if p.op_type in ("Add", "Sub"):
        return any(is_additive_mask(x) for x in p.inputs)
    if p.op_type == "Where":
        return any(_sentinel_const(x) or is_additive_mask(x) for x in p.inputs[1:])
    return False
