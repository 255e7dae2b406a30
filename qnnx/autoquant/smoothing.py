"""Per-channel smoothing of normalization outputs into the linear layers reading them (SmoothQuant).

    y = LayerNormalization(x, g, b) -> MatMul(y, W_i) ...      (and float readers of y)
    ->  y' = LayerNormalization(x, g / s, b / s) -> MatMul(y', s * W_i) ...,  y = Mul(y', s) for the others

Why. A LayerNorm output in a transformer keeps the residual stream's outlier channels: a few
channels reach values many times the median channel's, so one per-tensor uint8 scale leaves the
ordinary channels a handful of levels, and every Q/K/V and FFN input carries that noise. Dividing
channel j by ``s_j`` and multiplying row j of every weight that reads it by ``s_j`` is exact in real
arithmetic and moves the outlier into the weights, which are quantized per output column and have
room for it. With Xiao et al.'s (2023) choice
``s_j = max|y_j| ** alpha / max_i max|W_i[j, :]| ** (1 - alpha)`` (alpha = 0.5) the activation and
weight ranges meet halfway.

The paper's 0.5 is the default (``QuantConfig.smoothing_alpha``; None turns smoothing off); the
alphas tried: docs/experiments.md, "Smoothing".

The channel maxima come from the float model on the calibration samples (one streamed pass before
calibration). The smoothed output is a new value; the original name goes to ``Mul(y', s)`` when
float readers remain, so per-layer comparisons by name (``qnnx compare``) compare like with like.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from qnnx import runtime
from qnnx.ir import Builder, const_array


@dataclass(frozen=True)
class SmoothingSite:
    """A normalization whose output channels can be rescaled: its node, the MatMuls reading the
    output as input A with a constant rank-2 weight, and how many other readers it has."""

    norm: ir.Node
    matmuls: tuple[ir.Node, ...]
    other_readers: int


def smoothing_sites(graph: ir.Graph) -> list[SmoothingSite]:
    sites = []
    for node in graph:
        if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
            continue
        axis = node.attributes["axis"].value if "axis" in node.attributes else -1
        rank = node.outputs[0].shape.rank() if node.outputs[0].shape is not None else None
        if axis != -1 and (rank is None or axis != rank - 1):
            continue  # normalized over several axes: the scale/bias are not one value per channel
        gamma = const_array(node.inputs[1])
        beta = const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
        if gamma is None or gamma.ndim != 1 or (len(node.inputs) > 2 and node.inputs[2] is not None and
                                                (beta is None or beta.shape != gamma.shape)):
            continue
        y = node.outputs[0]
        matmuls, others = [], 0
        for use in y.uses():
            n = use.node
            w = const_array(n.inputs[1]) if n.op_type == "MatMul" and use.idx == 0 else None
            if w is not None and w.ndim == 2 and w.shape[0] == gamma.shape[0]:
                matmuls.append(n)
            else:
                others += 1
        if matmuls and not y.is_graph_output():
            sites.append(SmoothingSite(node, tuple(matmuls), others))
    return sites


def smoothing_scales(channel_absmax: np.ndarray, weights: list[np.ndarray], alpha: float) -> np.ndarray:
    """``s_j = a_j ** alpha / w_j ** (1 - alpha)`` with ``a_j`` the activation channel maximum and ``w_j``
    the largest weight magnitude in row j over every reader; 1 where either is 0 (nothing to balance)."""
    a = np.asarray(channel_absmax, np.float64)
    w = np.max([np.abs(np.asarray(x, np.float64)).max(axis=1) for x in weights], axis=0)
    s = np.ones_like(a)
    ok = (a > 0) & (w > 0) & np.isfinite(a)
    s[ok] = a[ok] ** alpha / w[ok] ** (1.0 - alpha)
    return s.astype(np.float32)


def apply_smoothing(graph: ir.Graph, site: SmoothingSite, s: np.ndarray) -> None:
    """Rescale ``site`` by ``s`` in place (see the module docstring)."""
    norm = site.norm
    b = Builder(graph, norm.name or "LayerNormalization")
    norm.replace_input_with(1, b.const((const_array(norm.inputs[1]) / s).astype(np.float32), "smoothed_scale"))
    if len(norm.inputs) > 2 and norm.inputs[2] is not None:
        norm.replace_input_with(2, b.const((const_array(norm.inputs[2]) / s).astype(np.float32), "smoothed_bias"))
    for mm in site.matmuls:
        w = const_array(mm.inputs[1])
        mm.replace_input_with(1, b.const((w * s[:, None]).astype(np.float32), "smoothed_weight"))
    y = norm.outputs[0]
    if site.other_readers:
        name = y.name
        y.name = f"{name}_smoothed"
        restore = b.op("Mul", [y, b.const(s, "smoothing_scale")], hint="unsmooth")
        restore.type, restore.shape = y.type, y.shape
        graph.insert_after(norm, b.nodes)
        for use in list(y.uses()):
            if use.node not in site.matmuls and use.node is not restore.producer():
                use.node.replace_input_with(use.idx, restore)
        restore.name = name


def smooth(model: ir.Model, data, alpha: float | None) -> ir.Model:
    """Apply smoothing to every site of ``model``, in place (``alpha`` None: nothing); the channel
    maxima come from one streamed pass over ``data`` (a bound CalibrationData). Returns ``model``."""
    sites = smoothing_sites(model.graph)
    if alpha is None or not sites:
        return model
    outputs = [site.norm.outputs[0] for site in sites]
    sess = runtime.session(model, outputs=outputs, purpose=" to calibrate it")
    names = [v.name for v in outputs]
    absmax: list[np.ndarray | None] = [None] * len(sites)
    for feed in data:
        for i, y in enumerate(runtime.run(sess, names, feed)):
            a = np.abs(y).reshape(-1, y.shape[-1]).max(axis=0)
            absmax[i] = a if absmax[i] is None else np.maximum(absmax[i], a)
    for site, a in zip(sites, absmax):
        weights = [const_array(mm.inputs[1]) for mm in site.matmuls]
        apply_smoothing(model.graph, site, smoothing_scales(a, weights, alpha))
    return model
