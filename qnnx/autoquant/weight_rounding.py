"""Output-aware rounding of depthwise conv weights, and the mean correction of their bias.

Rounding each int8 weight to its nearest grid point minimises the weight error, not the conv's
output error. A depthwise conv sums only k*k products per output (9 or 25), so the per-tap
rounding errors do not average out, and on inputs with a large mean (PP-OCRv4's hard-swish
outputs) they add up to a systematic per-channel shift that compounds through the network.
Measured on PP-OCRv4 rec with 16-bit activations (so only weight rounding is left): int8
depthwise weights cost 1.75 points of character accuracy, every other layer's int8 weights none.

For each depthwise conv and each channel, with ``H = E[p p^T]`` the second moment of the input
patches ``p`` the channel's filter sees (taken in the QDQ model, so upstream error is included),
the output error of a weight error ``e`` is ``e^T H e``. The weights are rounded one tap at a time,
each tap's rounding error spread onto the taps not yet rounded through ``H``'s inverse (GPTQ,
Frantar et al. 2022; OBQ error feedback), then polished by +-1 steps that lower ``e^T H e``; a
channel keeps nearest rounding where that is no worse. What remains of the mean output error
(``sum e * E[p]`` and the bias's own rounding) goes into the int32 bias, as in bias_correction.py.
The scales are not changed: only which grid point each weight takes.

Only depthwise convs: a full conv's ``H`` is (C_in*k*k)^2 per layer, from im2col of every input,
and the measurement above found nothing to gain there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from numpy.lib.stride_tricks import sliding_window_view

from qnnx import runtime
from qnnx.autoquant.bias_correction import bias_dequantize, fold_into_bias
from qnnx.autoquant.progress import ProgressLine
from qnnx.ir import const_array

DAMPING = 0.01  # of the mean diagonal, added to H before inverting (GPTQ's default)
POLISH_ROUNDS = 8  # +-1 sweeps over the taps; rec's layers settle in 2-4
PATCH_BLOCK = 1 << 22  # patch values materialized at once (channel blocks of one sample)
MAX_PATCHES = 1 << 14  # per channel and sample; more output rows are subsampled


@dataclass(frozen=True)
class RoundingRecord:
    """One depthwise conv: its weight-induced output error (mean square on the calibration samples)
    with nearest rounding and with the rounding chosen; ``reason`` when it was left as it was."""

    node: str
    channels: int
    taps: int
    error_nearest: float = 0.0
    error_chosen: float = 0.0
    bias_corrected: bool = False
    reason: str = ""

    @property
    def gain_db(self) -> float:
        if self.error_chosen <= 0:
            return 0.0 if self.error_nearest <= 0 else float("inf")
        return 10 * np.log10(self.error_nearest / self.error_chosen)


@dataclass
class _Layer:
    node: ir.Node
    w: np.ndarray  # float weights (C_out, k*k), float64
    b: np.ndarray | None  # float bias
    w_dq: ir.Node  # the constant DequantizeLinear of the int8 weights
    multiplier: int  # output channels per input channel
    kernel: tuple[int, int]
    pads: tuple[int, int, int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    h: np.ndarray | None = None  # (C_in, d, d) sum of p p^T
    p_sum: np.ndarray | None = None  # (C_in, d) sum of p
    count: int = 0


def round_depthwise_weights(float_model: ir.Model, qdq: ir.Model, samples: list[dict],
                            progress: bool = False) -> list[RoundingRecord]:
    """Re-round the int8 weights (and correct the int32 bias) of every depthwise conv of ``qdq`` in place,
    from its inputs on ``samples``; one record per depthwise conv."""
    records: list[RoundingRecord] = []
    layers = _depthwise_layers(float_model, qdq, records)
    if not layers or not samples:
        return records
    say = ProgressLine("weight rounding", progress)
    _gather_statistics(qdq, layers, samples, lambda k: say(f"sample {k}/{len(samples)}"))
    for k, layer in enumerate(layers):
        records.append(_round_layer(layer))
        say(f"layer {k + 1}/{len(layers)}")
    say.end()
    return records


def _depthwise_layers(float_model: ir.Model, qdq: ir.Model, records: list) -> list[_Layer]:
    floats = {n.name: n for n in float_model.graph if n.op_type == "Conv"}
    layers = []
    for node in qdq.graph:
        if node.op_type != "Conv" or node.name not in floats or node.inputs[0] is None:
            continue
        w_dq = node.inputs[1].producer() if len(node.inputs) > 1 and node.inputs[1] is not None else None
        w = const_array(floats[node.name].inputs[1])
        if w_dq is None or w_dq.op_type != "DequantizeLinear" or w is None or w.ndim != 4 or w.shape[1] != 1:
            continue
        attrs = {k: v.value for k, v in node.attributes.items()}
        group = int(attrs.get("group", 1))
        if group < 2 or w.shape[0] % group:
            continue
        c_out, kernel = w.shape[0], tuple(int(k) for k in w.shape[2:])
        q = const_array(w_dq.inputs[0])
        zp = const_array(w_dq.inputs[2]) if len(w_dq.inputs) > 2 and w_dq.inputs[2] is not None else None
        why = ""
        if q is None or q.dtype != np.int8 or q.shape != w.shape:
            why = "weights are not a constant int8 tensor of the float weights' shape"
        elif zp is not None and np.any(zp != 0):
            why = "weight zero point is not 0"
        elif not _rounds_to(q, w, const_array(w_dq.inputs[1])):
            why = "int8 weights are not the float weights rounded (a fold changed them)"
        elif attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            why = f"auto_pad {attrs['auto_pad']}"
        if why:
            records.append(RoundingRecord(node.name, c_out, int(np.prod(kernel)), reason=why))
            continue
        pads = tuple(int(p) for p in attrs.get("pads", (0, 0, 0, 0))) if attrs.get("auto_pad", "NOTSET") == "NOTSET" \
            else (0, 0, 0, 0)
        fb = floats[node.name].inputs[2] if len(floats[node.name].inputs) > 2 else None
        b = const_array(fb) if fb is not None else None
        layers.append(_Layer(node, w.reshape(c_out, -1).astype(np.float64),
                             None if b is None else np.asarray(b, np.float64).reshape(-1), w_dq,
                             c_out // group, kernel, pads, tuple(int(s) for s in attrs.get("strides", (1, 1))),
                             tuple(int(d) for d in attrs.get("dilations", (1, 1)))))
    return layers


def _rounds_to(q: np.ndarray, w: np.ndarray, scale) -> bool:
    """Whether ``q`` is ``w`` on the grid of ``scale`` (per output channel) to within a step: GPTQ re-rounds
    the float weights, so they must be what the int8 ones came from."""
    s = np.asarray(scale, np.float64).reshape((-1,) + (1,) * (w.ndim - 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        return bool(np.all(np.abs(q - np.clip(w / s, -128, 127)) <= 1.0))


def _gather_statistics(qdq: ir.Model, layers: list[_Layer], samples: list[dict], done=lambda k: None) -> None:
    # The QDQ graph as written (no fusion): each conv's input exactly as its DequantizeLinear gives it.
    names = sorted({layer.node.inputs[0].name for layer in layers})
    sess = runtime.session(qdq, outputs=names, optimize=False, purpose=" to round depthwise weights")
    for k, feed in enumerate(samples):
        done(k)
        values = dict(zip(names, sess.run(names, feed)))
        for layer in layers:
            x = values[layer.node.inputs[0].name]
            h, s, n = _patch_moments(x, layer)
            layer.h = h if layer.h is None else layer.h + h
            layer.p_sum = s if layer.p_sum is None else layer.p_sum + s
            layer.count += n


def _patch_moments(x: np.ndarray, layer: _Layer) -> tuple[np.ndarray, np.ndarray, int]:
    """Per input channel of ``x`` (N, C, H, W): the sum of ``p p^T`` and of ``p`` over the conv's input
    patches ``p`` (k*k taps, zero padding included), and the number of patches per channel. Large maps
    take every r-th output row (at most ``MAX_PATCHES`` per channel and sample): the moments are means
    over positions and PP-OCRv4 det's 368x368 maps do not need all 135K of them."""
    (kh, kw), (pt, pl, pb, pr), (sh, sw), (dh, dw) = layer.kernel, layer.pads, layer.strides, layer.dilations
    x = np.pad(np.asarray(x, np.float32), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    n, c, h, w = x.shape
    oh, ow = (h - dh * (kh - 1) - 1) // sh + 1, (w - dw * (kw - 1) - 1) // sw + 1
    step = max(1, -(-oh * ow // MAX_PATCHES))  # every step-th output row is kept
    rows = len(range(0, oh, step))
    d = kh * kw
    hs, sums = np.zeros((c, d, d)), np.zeros((c, d))
    windows = sliding_window_view(x, (dh * (kh - 1) + 1, dw * (kw - 1) + 1), axis=(2, 3))
    # slices only: a view until the one copy per channel block below
    windows = windows[:, :, ::sh * step, ::sw, ::dh, ::dw][:, :, :rows, :ow]  # (N, C, rows, OW, kh, kw)
    ones = np.ones(n * rows * ow, np.float32)
    block = max(1, PATCH_BLOCK // max(1, n * rows * ow * d))
    for c0 in range(0, c, block):
        p = windows[:, c0:c0 + block].transpose(1, 0, 2, 3, 4, 5).reshape(-1, n * rows * ow, d)
        # float32 BLAS products and sums: the moments only rank roundings, 1e-6 relative is plenty
        hs[c0:c0 + block] = np.matmul(p.transpose(0, 2, 1), p)
        sums[c0:c0 + block] = np.matmul(ones, p)
    return hs, sums, n * rows * ow


def _round_layer(layer: _Layer) -> RoundingRecord:
    node, w = layer.node, layer.w
    c_out, d = w.shape
    q_value = layer.w_dq.inputs[0]
    q_old = const_array(q_value)
    scale = np.broadcast_to(np.asarray(const_array(layer.w_dq.inputs[1]), np.float64).reshape(-1), (c_out,))
    info = np.iinfo(np.int8)
    # Output channel o reads input channel o // multiplier.
    h = np.repeat(layer.h / layer.count, layer.multiplier, axis=0)
    mean = np.repeat(layer.p_sum / layer.count, layer.multiplier, axis=0)
    nearest = np.clip(np.round(w / scale[:, None]), info.min, info.max)
    chosen = polish(gptq_round(w, scale, h, info.min, info.max), w, scale, h, info.min, info.max)
    err_nearest, err_chosen = _output_error(nearest, w, scale, h), _output_error(chosen, w, scale, h)
    worse = err_chosen > err_nearest
    chosen[worse], err_chosen[worse] = nearest[worse], err_nearest[worse]
    q_value.const_value = ir.tensor(chosen.reshape(q_old.shape).astype(np.int8), name=q_value.name)
    # The mean output error left by the weights, and the bias's own rounding.
    corrected = bias_dequantize(node) is not None and fold_into_bias(
        node, ((w - chosen * scale[:, None]) * mean).sum(axis=1), layer.b)
    return RoundingRecord(node.name, c_out, d, float(err_nearest.mean()), float(err_chosen.mean()), corrected)


def gptq_round(w: np.ndarray, scale: np.ndarray, h: np.ndarray, qmin: int, qmax: int) -> np.ndarray:
    """Grid indices of ``w`` (C, d) at per-row ``scale``, rounded one column at a time with each
    column's error fed onto the columns after it through the inverse of ``h`` (C, d, d): GPTQ."""
    c, d = w.shape
    diag = np.einsum("cii->ci", h)
    hd = h + np.eye(d) * (DAMPING * diag.mean(axis=1) + 1e-12)[:, None, None]
    dead = diag.max(axis=1) <= 0  # a channel that never sees input: any rounding is exact, take nearest
    hd[dead] = np.eye(d)
    # Upper Cholesky factor U of H^-1 (H^-1 = U^T U): row i says how the error of column i moves the rest.
    u = np.linalg.cholesky(np.linalg.inv(hd)).transpose(0, 2, 1)
    rest = w.astype(np.float64).copy()
    q = np.empty_like(rest)
    for i in range(d):
        q[:, i] = np.clip(np.round(rest[:, i] / scale), qmin, qmax)
        err = (rest[:, i] - q[:, i] * scale) / u[:, i, i]
        rest[:, i + 1:] -= err[:, None] * u[:, i, i + 1:]
    return q


def polish(q: np.ndarray, w: np.ndarray, scale: np.ndarray, h: np.ndarray, qmin: int, qmax: int,
           rounds: int = POLISH_ROUNDS) -> np.ndarray:
    """+-1 grid steps, one column at a time, wherever they lower ``e^T h e`` (``e = q * scale - w``)."""
    q = q.copy()
    he = np.einsum("cij,cj->ci", h, q * scale[:, None] - w)  # h e, kept up to date as q moves
    rows = np.arange(len(q))
    for _ in range(rounds):
        moved = False
        for i in range(q.shape[1]):
            for step in (-1.0, 1.0):
                new = np.clip(q[:, i] + step, qmin, qmax)
                dq = (new - q[:, i]) * scale
                gain = 2 * dq * he[:, i] + dq * dq * h[rows, i, i]  # change of e^T h e
                take = gain < -1e-18 * np.maximum(1.0, np.abs(he[:, i]))
                if take.any():
                    q[take, i] = new[take]
                    he[take] += dq[take, None] * h[take, :, i]
                    moved = True
        if not moved:
            break
    return q


def _output_error(q: np.ndarray, w: np.ndarray, scale: np.ndarray, h: np.ndarray) -> np.ndarray:
    e = q * scale[:, None] - w
    return np.einsum("ci,cij,cj->c", e, h, e)
