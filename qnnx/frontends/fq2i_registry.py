"""The contract of a fake-quantization-to-integer rule (:mod:`qnnx.frontends.fq2i` runs them).

A rule is registered for float op types with ``@fq2i_rule(...)``; it gets the node and a
:class:`Context` and returns one :class:`Affine` per output (an integer value and the affine type
it stands for), or raises :class:`Unsupported` with the reason the node stays float. The rule
modules (``fq2i_rules``, ``fq2i_layer_norm``, ``fq2i_gelu``) import this module only; the driver
imports them, which registers their rules.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx_ir as ir

from qnnx import numerics, ops
from qnnx.dialect import DOMAIN
from qnnx.dtypes import int_type
from qnnx.frontends.affine import Affine, AffineType
from qnnx.ir import Builder, const_array


class Unsupported(Exception):
    """A rule cannot convert this node; the message says why."""


FQ2IRule = Callable[[ir.Node, "Context"], "list[Affine]"]
FQ2I_RULES: dict[str, FQ2IRule] = {}


def fq2i_rule(*op_types: str):
    def wrap(fn: FQ2IRule) -> FQ2IRule:
        for t in op_types:
            FQ2I_RULES[t] = fn
        return fn

    return wrap


class Context:
    """What a rule may ask while converting one node."""

    def __init__(self, env: dict[ir.Value, Affine], b: Builder, numerics: str = "onnxruntime"):
        self.env = env
        self.b = b
        # "onnxruntime": ops ORT fuses into QLinear kernels (or runs in float, BatchNormalization) take
        # ORT's own float32 recipe, so the model computes what ORT computes; "qdq": the QDQ graph's
        # runtime-independent meaning (float32 multipliers, exact softmax, exact depthwise BatchNorm)
        self.numerics = numerics

    def affine(self, v: ir.Value | None, what: str = "input") -> Affine:
        if v is None or v not in self.env:
            raise Unsupported(f"{what} is not quantized")
        return self.env[v]

    def has_affine(self, v: ir.Value | None) -> bool:
        return v is not None and v in self.env

    def output_type(self, v: ir.Value) -> AffineType:
        """The type of the quantize(s) consuming ``v`` — directly, or through ops that only move data
        (a Reshape between an op and its quantize is common, e.g. after opset conversion). All must
        agree."""
        types = self._quantize_types(v, depth=0)
        if not types:
            raise Unsupported("output is not quantized (no quantize consumes it)")
        if any(not t.same_as(types[0]) for t in types[1:]):
            raise Unsupported("output is quantized with different qparams by its consumers")
        return types[0]

    def _quantize_types(self, v: ir.Value, depth: int) -> list[AffineType]:
        users = [u.node for u in v.uses()]
        if not users or v.is_graph_output() or depth > 8:
            return []
        types = []
        for u in users:
            t = quantize_type(u)
            # A Relu/Clip between an op and its quantize passes the type through too: quantize is monotonic,
            # so quantize(clip(v)) == integer clip of quantize(v) to the quantized bounds, exactly (the
            # Relu/Clip rule then clamps in integers). ORT's and qnnx's QDQ put activations there.
            # Ops that permute values (Reshape, Transpose, ...) pass it through: the quantize after one saw
            # exactly ``v``'s values.
            passes = ops.permutes_values(u) or ops.clamps(u)
            if t is None and passes and len(u.outputs) == 1 and u.inputs[0] is v:
                inner = self._quantize_types(u.outputs[0], depth + 1)
                if not inner:
                    return []
                types += inner
            elif t is None:
                return []
            else:
                types.append(t)
        return types

    def rank(self, v: ir.Value) -> int | None:
        """``v``'s rank, from its shape or, when inference lost it, from the producers: channel-wise ONNX ops
        (elementwise, pools, Q/DQ: :func:`qnnx.ops.channelwise`) and the dialect's elementwise and
        requantizing ops keep the rank, a conv's output has its weight's rank."""
        for _ in range(16):
            if v.shape is not None:
                return len(v.shape)
            p = v.producer()
            if p is None or not p.inputs or p.inputs[0] is None:
                return None
            if p.op_type in _WEIGHT_RANK_OPS:  # (either domain)
                w = p.inputs[1]
                return len(w.shape) if w is not None and w.shape is not None else None
            if not (ops.channelwise(p) or p.domain == DOMAIN and p.op_type in _RANK_KEEPING_OPS):
                return None
            v = p.inputs[0]
        return None

    def const(self, v: ir.Value | None) -> np.ndarray | None:
        return None if v is None else const_array(v)

    def real_const(self, v: ir.Value | None) -> np.ndarray | None:
        """A float constant, either plain or a dequantized constant."""
        arr = self.const(v)
        if arr is not None:
            return np.asarray(arr)
        if v is not None and v in self.env:
            a = self.env[v]
            q = const_array(a.value)
            if q is not None:
                return numerics.dequantize(np.asarray(q), a.type.scale, a.type.zero_point,
                                           axis=a.type.axis if a.type.axis is not None else -1)
        return None


def constant_qparams(node: ir.Node) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, zero point) of a ``qnnx.quantize`` / ``dequantize`` when both are constants (and not
    blocked), else None."""
    s, z = const_array(node.inputs[1]), const_array(node.inputs[2]) if len(node.inputs) > 2 else np.int32(0)
    if s is None or z is None:
        return None
    if "block_size" in node.attributes and node.attributes["block_size"].value:
        return None  # blocked types are not propagated (weights only; left as dequantize)
    return np.asarray(s, np.float32), np.asarray(z)


def quantize_type(node: ir.Node) -> AffineType | None:
    """The affine type a ``qnnx.quantize`` with constant qparams produces; None for any other node."""
    if node.domain != DOMAIN or node.op_type != "quantize":
        return None
    qp = constant_qparams(node)
    if qp is None:
        return None
    axis = node.attributes["axis"].value if "axis" in node.attributes else 1
    dtype = int_type(node.attributes["out_dtype"].value)
    return AffineType(qp[0], qp[1], dtype, axis if qp[0].size > 1 else None)


_WEIGHT_RANK_OPS = {"conv", "conv_transpose", "Conv", "ConvTranspose"}
# the dialect's ops whose output has their first input's rank (channel-wise ONNX ops are asked of qnnx.ops)
_RANK_KEEPING_OPS = {"requantize", "quantize", "dequantize", "simulated_quantize", "simulated_dequantize", "lut",
                     "add", "sub", "mul"}
