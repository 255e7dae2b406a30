"""Empirical bias correction: fold each integer layer's mean output error back into its int32 bias.

Quantizing a layer's input and weights shifts the *mean* of its output per channel (rounding of
a skewed distribution, clipped tails, a weight grid that is coarse next to near-dead channels).
Depthwise convolutions sum only a few products, so the shift does not average out, and it
compounds through the network (Nagel et al., "Data-Free Quantization", 2019, section 4.2). The
correction uses the measured mean of each layer's input in the quantized model (a few calibration
samples, one pass) and the exact weight and bias errors, and adds the resulting per-channel mean
output error to that layer's int32 bias.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from qnnx import numerics, runtime
from qnnx.ir import const_array

INT32 = np.iinfo(np.int32)


def _session(model: ir.Model, names: list[str]) -> ort.InferenceSession:
    # The QDQ graph as written (no fusion), so the tensors fetched are exactly the QDQ meaning.
    return runtime.session(model, outputs=names, optimize=False)


def _bias_dequantize(node: ir.Node) -> ir.Node | None:
    if len(node.inputs) < 3 or node.inputs[2] is None:
        return None
    dq = node.inputs[2].producer()
    if dq is None or dq.op_type != "DequantizeLinear":
        return None
    q = const_array(dq.inputs[0])
    return dq if q is not None and q.dtype == np.int32 else None


def correct_biases(float_model: ir.Model, qdq: ir.Model, samples: list[dict]) -> int:
    """Correct the int32 biases of ``qdq`` in place; returns how many layers changed.

    Only each layer's own error is corrected: with ``x`` the layer's (dequantized) input in the QDQ
    model, ``E[conv(x, W) + b] - E[conv(x, W_q) + b_q]`` per output channel is, conv being linear,
    ``sum(W - W_q over input channels and taps) * E[x per input channel] + (b - b_q)`` (padding
    borders aside). Upstream error is in ``x`` on both sides and cancels, so every layer is corrected
    from one pass; a whole-output comparison would count upstream shifts again at every layer (tried:
    it over-corrected PP-OCR rec from 95% to 0% character accuracy)."""
    float_weights = {n.name: n for n in float_model.graph if n.op_type in ("Conv", "Gemm")}
    layers = []
    for node in qdq.graph:
        if node.op_type not in ("Conv", "Gemm") or node.name not in float_weights or not _bias_dequantize(node):
            continue
        f = float_weights[node.name]
        w, b = const_array(f.inputs[1]), const_array(f.inputs[2]) if len(f.inputs) > 2 and f.inputs[2] is not None else None
        w_dq = node.inputs[1].producer()
        if w is None or w_dq is None or w_dq.op_type != "DequantizeLinear" or node.inputs[0] is None:
            continue
        layers.append((node, w.astype(np.float64), None if b is None else b.astype(np.float64), w_dq))
    if not layers or not samples:
        return 0
    names = [node.inputs[0].name for node, *_ in layers]
    sess = _session(qdq, sorted(set(names)))
    fetch = sorted(set(names))
    means: dict[str, np.ndarray] = {}
    for feed in samples:
        for name, x in zip(fetch, sess.run(fetch, feed)):
            axis = 1 if x.ndim > 2 else x.ndim - 1
            means[name] = means.get(name, 0) + _channel_means(x, axis) / len(samples)
    changed = 0
    for (node, w, b, w_dq), name in zip(layers, names):
        w_hat = _dequantized(w_dq)
        delta = _weight_error(node, w - w_hat, means[name])
        if delta is None:
            continue
        dq = _bias_dequantize(node)
        b_hat = _dequantized(dq)
        if b is not None and b.shape == b_hat.shape:
            delta = delta + (b - b_hat)
        changed += _apply(node, delta)
    return changed


def _dequantized(dq: ir.Node) -> np.ndarray:
    """The float values a constant DequantizeLinear gives the runtime (ONNX's default axis is 1)."""
    zp = dq.inputs[2] if len(dq.inputs) > 2 and dq.inputs[2] is not None else None
    axis = dq.attributes["axis"].value if "axis" in dq.attributes else 1
    return numerics.dequantize(const_array(dq.inputs[0]), const_array(dq.inputs[1]),
                               0 if zp is None else const_array(zp), axis=axis).astype(np.float64)


def _weight_error(node: ir.Node, dw: np.ndarray, x_mean: np.ndarray) -> np.ndarray | None:
    """Per output channel: the mean output change the weight error ``dw`` causes on inputs whose
    per-channel mean is ``x_mean``."""
    if node.op_type == "Gemm":
        attrs = {k: v.value for k, v in node.attributes.items()}
        dw = dw.T if attrs.get("transB", 0) else dw  # -> (K, N)
        return x_mean @ dw if dw.ndim == 2 and x_mean.shape == (dw.shape[0],) else None
    group = node.attributes["group"].value if "group" in node.attributes else 1
    c_out, c_in_g = dw.shape[0], dw.shape[1]
    if x_mean.shape != (c_in_g * group,):
        return None
    per_tap = dw.reshape(c_out, c_in_g, -1).sum(axis=2)  # (C_out, C_in/group)
    x_groups = x_mean.reshape(group, c_in_g)
    out_group = np.arange(c_out) // (c_out // group)
    return (per_tap * x_groups[out_group]).sum(axis=1)


def _channel_means(out: np.ndarray, axis: int) -> np.ndarray:
    other = tuple(i for i in range(out.ndim) if i != axis)
    return out.astype(np.float64).mean(axis=other)


def _apply(node: ir.Node, delta: np.ndarray) -> bool:
    dq = _bias_dequantize(node)
    q = const_array(dq.inputs[0]).astype(np.int64)
    scale = np.broadcast_to(np.asarray(const_array(dq.inputs[1]), np.float64), q.shape)
    if delta.shape != q.shape or not np.all(np.isfinite(delta)):
        return False
    new = np.clip(q + np.round(delta / scale), INT32.min, INT32.max).astype(np.int32)
    if np.array_equal(new, q):
        return False
    value = dq.inputs[0]
    value.const_value = ir.tensor(new, name=value.name)
    return True
