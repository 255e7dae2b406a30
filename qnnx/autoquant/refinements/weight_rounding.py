"""Output-aware rounding of conv weights, and the mean correction of their bias.

Rounding each int8 weight to its nearest grid point minimises the weight error, not the conv's
output error. With ``H = E[p p^T]`` the second moment of the input patches ``p`` a filter sees
(taken in the QDQ model, so upstream error is included), the output error of a weight error ``e`` is
``e^T H e``: correlated inputs let the errors of neighbouring weights cancel or add up.

- A depthwise conv sums only k*k products per output (9 or 25), so the per-tap errors do not average
  out, and on inputs with a large mean (hard-swish outputs) they add up to a systematic per-channel
  shift that compounds through the network. One ``H`` (k*k square) per channel.
- An ungrouped conv shares one ``H`` ((C_in*k*k) square, from im2col of its inputs) across its output
  channels; correlated input channels make nearest rounding's output error much larger than it needs
  to be.

Figures (what int8 weights cost, the error this rounding removes): docs/experiments.md, "Weight rounding".

The weights are rounded one input tap at a time, each tap's rounding error spread onto the taps not
yet rounded through ``H``'s inverse (GPTQ, Frantar et al. 2022; OBQ error feedback), then polished
by +-1 steps that lower ``e^T H e``; an output channel keeps nearest rounding where that is no worse.
What remains of the mean output error (``sum e * E[p]`` and the bias's own rounding) goes into the
int32 bias, as in bias_correction.py. The scales are not changed: only which grid point each weight
takes. Grouped convs other than depthwise, and convs with more than ``MAX_TAPS`` taps per filter, keep
nearest rounding.

MatMul and Gemm layers with a constant 2-D weight (opt-in, ``weight_rounding="gptq_all"``) are rounded the
same way, as a 1x1 conv over the rows of their input (one shared ``H``, K x K). A transformer's calibration
samples give few rows (a sentence is tens of tokens), so their ``H`` comes from every calibration
sample, not only the refinement samples the convs use, and is kept from a quarter of a row per input
channel up (GPTQ's damping keeps a thin ``H`` invertible). Gemm biases take the mean correction; a
MatMul's bias is a separate Add, which keeps its value. On a pair-limited grid (``weight_bits="pairs"``)
every pair of MatMul/Gemm weights on adjacent input channels (2j, 2j + 1) keeps ``|q_2j + q_2j+1|``
within numerics.U8S8_PAIR_LIMIT while it is rounded: GPTQ rounds the columns in input-channel order,
so the second of a pair is rounded within what its partner, rounded just before it, leaves, and its
clipping error is fed forward like any rounding error; the polish moves a weight only within it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from numpy.lib.stride_tricks import sliding_window_view

from qnnx import numerics, runtime
from qnnx.autoquant.refinements.bias_correction import bias_dequantize, fold_into_bias
from qnnx.autoquant.refinements.base import Refinement
from qnnx.autoquant.refinements.progress import ProgressLine
from qnnx.ir import const_array
from qnnx.targets import weight_grid

DAMPING = 0.01  # of the mean diagonal, added to H before inverting (GPTQ's default)
POLISH_ROUNDS = 8  # +-1 sweeps over the taps of a depthwise filter; most layers settle in a few
# Ungrouped convs have hundreds to thousands of taps per sweep: the first two sweeps take nearly all of
# what the polish gains, at a fraction of eight's time (figures: docs/experiments.md, "Weight rounding").
SHARED_POLISH_ROUNDS = 2
PATCH_BLOCK = 1 << 22  # patch values materialized at once (channel or row blocks of one sample)
MAX_PATCHES = 1 << 14  # per channel and sample; more output rows are subsampled
# An ungrouped conv's moment costs positions * taps^2 per sample: positions are subsampled to keep it
# under this many multiply-adds (a head conv with thousands of taps on a small map keeps every position).
MOMENT_FLOPS = 1 << 32
MAX_TAPS = 4096  # taps per filter of an ungrouped conv: H is taps^2 float64, its inverse taps^3
MIN_PATCHES_PER_TAP = 4  # below this many input patches per tap, H is too thin to fit: nearest rounding
GPTQ_BLOCK = 128  # columns per lazy update
MIN_ROWS_PER_TAP = 0.25  # MatMul/Gemm: fewer input rows than this per input channel, nearest rounding


@dataclass(frozen=True)
class RoundingRecord:
    """One conv: its weight-induced output error (mean square on the calibration samples) with nearest
    rounding and with the rounding chosen; ``reason`` when it was left as it was."""

    node: str
    channels: int
    taps: int
    error_nearest: float = 0.0
    error_chosen: float = 0.0
    bias_corrected: bool = False
    reason: str = ""
    depthwise: bool = True
    matmul: bool = False  # a MatMul/Gemm, not a conv

    @property
    def gain_db(self) -> float:
        if self.error_chosen <= 0:
            return 0.0 if self.error_nearest <= 0 else float("inf")
        return 10 * np.log10(self.error_nearest / self.error_chosen)


@dataclass
class _Layer:
    node: ir.Node
    w: np.ndarray  # float weights (C_out, taps), float64
    b: np.ndarray | None  # float bias
    w_dq: ir.Node  # the constant DequantizeLinear of the int8 weights
    multiplier: int  # depthwise: output channels per input channel; 0: an ungrouped conv (one shared H)
    kernel: tuple[int, int]
    pads: tuple[int, int, int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    h: np.ndarray | None = None  # depthwise (C_in, k*k, k*k), ungrouped (taps, taps): sum of p p^T
    p_sum: np.ndarray | None = None  # depthwise (C_in, k*k), ungrouped (taps,): sum of p
    count: int = 0
    thin: bool = False  # too few patches foreseen from the first sample: counted, no moments gathered
    rows: bool = False  # a MatMul/Gemm: its input's rows (..., K) are the patches of a 1x1 conv
    transposed: bool = False  # the int8 weights are stored (K, N), the transpose of ``w``
    fold: bool = True  # the mean output error may go into the int32 bias
    pair_limit: int | None = None  # the bound on |q_2j + q_2j+1| of adjacent input channels, if any

    @property
    def depthwise(self) -> bool:
        return self.multiplier > 0


def round_conv_weights(float_model: ir.Model, qdq: ir.Model, samples: list[dict], progress: bool = False,
                       limits: tuple[int, int] = (-128, 127)) -> list[RoundingRecord]:
    """Re-round the int8 weights (and correct the int32 bias) of every depthwise and ungrouped conv of
    ``qdq`` in place, from its inputs on ``samples``, within ``limits`` (the weight grid's conv range);
    one record per such conv."""
    records: list[RoundingRecord] = []
    layers = _conv_layers(float_model, qdq, records)
    if not layers or not samples:
        return records
    say = ProgressLine("weight rounding", progress)
    _gather_statistics(qdq, layers, samples, lambda k: say(f"sample {k}/{len(samples)}"))
    return records + _round_gathered(layers, limits, say)


def round_matmul_weights(float_model: ir.Model, qdq: ir.Model, samples, progress: bool = False,
                         limits: tuple[int, int] = (-128, 127), pairs=lambda op_type: False) -> list[RoundingRecord]:
    """Re-round the int8 weights of every MatMul/Gemm of ``qdq`` with a constant 2-D weight in place (and
    correct a Gemm's int32 bias), from their inputs on ``samples`` (an iterable of feeds, read once),
    within ``limits``, and for those whose op type takes a pair-limited grid (``pairs(op_type)``) with
    every pair of adjacent input channels within numerics.U8S8_PAIR_LIMIT. One record per such layer."""
    records: list[RoundingRecord] = []
    layers = _matmul_layers(float_model, qdq, records)
    for layer in layers:
        layer.pair_limit = numerics.U8S8_PAIR_LIMIT if pairs(layer.node.op_type) else None
    if not layers:
        return records
    say = ProgressLine("weight rounding (matmuls)", progress)
    _gather_statistics(qdq, layers, samples, lambda k: say(f"sample {k}"))
    return records + _round_gathered(layers, limits, say)


def _round_gathered(layers: list[_Layer], limits: tuple[int, int], say: ProgressLine) -> list[RoundingRecord]:
    """Each layer whose moments were gathered rounded (or left, with the reason), its ``H`` freed once done."""
    records = []
    for k, layer in enumerate(layers):
        c_out, taps = layer.w.shape
        what = f"{layer.count} input rows for {taps} input channels" if layer.rows else \
            f"{layer.count} input patches for {taps} taps"
        if _too_few_patches(layer.count, layer):
            records.append(RoundingRecord(layer.node.name, c_out, taps, depthwise=layer.depthwise, matmul=layer.rows,
                                          reason=f"{what}: too few to rank roundings by"))
        elif layer.h is None:  # foreseen thin from the first sample, but later inputs were larger
            records.append(RoundingRecord(layer.node.name, c_out, taps, depthwise=layer.depthwise,
                                          reason="conv input sizes varied between samples of one shape"))
        else:
            records.append(_round_layer(layer, limits))
        layer.h = None
        say(f"layer {k + 1}/{len(layers)}")
    say.end()
    return records


def _matmul_layers(float_model: ir.Model, qdq: ir.Model, records: list) -> list[_Layer]:
    """MatMul (constant B, (K, N)) and Gemm (transA 0, constant B) layers of ``qdq`` whose int8 weights
    can be re-rounded; a record with the reason for each that cannot."""
    floats = {n.name: n for n in float_model.graph if n.op_type in ("MatMul", "Gemm")}
    layers = []
    for node in qdq.graph:
        if node.op_type not in ("MatMul", "Gemm") or node.name not in floats or node.inputs[0] is None \
                or len(node.inputs) < 2 or node.inputs[1] is None:
            continue
        w_dq = node.inputs[1].producer()
        w = const_array(floats[node.name].inputs[1])
        if w_dq is None or w_dq.op_type != "DequantizeLinear" or w is None or w.ndim != 2 \
                or const_array(w_dq.inputs[0]) is None:
            continue  # not a layer with a constant quantized weight (a product of two activations)
        attrs = {k: v.value for k, v in node.attributes.items()}
        transposed = node.op_type == "MatMul" or not attrs.get("transB", 0)  # stored (K, N)
        wt = w.T if transposed else w  # (N, K): one row per output channel
        q = const_array(w_dq.inputs[0])
        zp = const_array(w_dq.inputs[2]) if len(w_dq.inputs) > 2 and w_dq.inputs[2] is not None else None
        scale = const_array(w_dq.inputs[1])
        axis = w_dq.attributes["axis"].value if "axis" in w_dq.attributes else 1
        if attrs.get("transA", 0):
            why = "Gemm with transA"
        elif wt.shape[1] > MAX_TAPS:
            why = f"{wt.shape[1]} input channels, above the {MAX_TAPS} the rounding takes"
        elif np.size(scale) not in (1, wt.shape[0]) or (np.size(scale) > 1 and axis % 2 != (1 if transposed else 0)):
            why = "weight scales are not per output channel"
        else:
            why = _int8_weights_problem(q.T if transposed and q.ndim == 2 else q, wt, scale, zp)
        if why:
            records.append(RoundingRecord(node.name, wt.shape[0], wt.shape[1], reason=why, depthwise=False,
                                          matmul=True))
            continue
        fb = floats[node.name].inputs[2] if node.op_type == "Gemm" and len(floats[node.name].inputs) > 2 else None
        b = const_array(fb) if fb is not None else None
        # the mean correction reads output = x @ w.T + b: a Gemm scaling either term keeps its bias
        unit = attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0
        layers.append(_Layer(node, wt.astype(np.float64), None if b is None else np.asarray(b, np.float64).reshape(-1),
                             w_dq, 0, (1, 1), (0, 0, 0, 0), (1, 1), (1, 1), rows=True, transposed=transposed,
                             fold=unit))
    return layers


def _conv_layers(float_model: ir.Model, qdq: ir.Model, records: list) -> list[_Layer]:
    floats = {n.name: n for n in float_model.graph if n.op_type == "Conv"}
    layers = []
    for node in qdq.graph:
        if node.op_type != "Conv" or node.name not in floats or node.inputs[0] is None:
            continue
        w_dq = node.inputs[1].producer() if len(node.inputs) > 1 and node.inputs[1] is not None else None
        w = const_array(floats[node.name].inputs[1])
        if w_dq is None or w_dq.op_type != "DequantizeLinear" or w is None or w.ndim != 4:
            continue
        attrs = {k: v.value for k, v in node.attributes.items()}
        group = int(attrs.get("group", 1))
        c_out, kernel = w.shape[0], tuple(int(k) for k in w.shape[2:])
        depthwise = group > 1 and w.shape[1] == 1 and c_out % group == 0
        taps = int(np.prod(w.shape[1:]))
        q = const_array(w_dq.inputs[0])
        zp = const_array(w_dq.inputs[2]) if len(w_dq.inputs) > 2 and w_dq.inputs[2] is not None else None
        if group > 1 and not depthwise:
            why = f"grouped conv ({group} groups): only depthwise and ungrouped convs are rounded"
        elif not depthwise and taps > MAX_TAPS:
            why = f"{taps} taps per filter, above the {MAX_TAPS} the rounding takes"
        else:
            why = _int8_weights_problem(q, w, const_array(w_dq.inputs[1]), zp) or (
                f"auto_pad {attrs['auto_pad']}" if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") else "")
        if why:
            records.append(RoundingRecord(node.name, c_out, taps, reason=why, depthwise=depthwise))
            continue
        pads = tuple(int(p) for p in attrs.get("pads", (0, 0, 0, 0))) if attrs.get("auto_pad", "NOTSET") == "NOTSET" \
            else (0, 0, 0, 0)
        fb = floats[node.name].inputs[2] if len(floats[node.name].inputs) > 2 else None
        b = const_array(fb) if fb is not None else None
        layers.append(_Layer(node, w.reshape(c_out, -1).astype(np.float64),
                             None if b is None else np.asarray(b, np.float64).reshape(-1), w_dq,
                             c_out // group if depthwise else 0, kernel, pads,
                             tuple(int(s) for s in attrs.get("strides", (1, 1))),
                             tuple(int(d) for d in attrs.get("dilations", (1, 1)))))
    return layers


def _int8_weights_problem(q: np.ndarray | None, w: np.ndarray, scale, zero_point) -> str:
    """Why the int8 weights ``q`` (laid out as the float weights ``w``, output channels first) cannot be
    re-rounded, or ""."""
    if q is None or q.dtype != np.int8 or q.shape != w.shape:
        return "weights are not a constant int8 tensor of the float weights' shape"
    if zero_point is not None and np.any(zero_point != 0):
        return "weight zero point is not 0"
    if not _rounds_to(q, w, scale):
        return "int8 weights are not the float weights rounded (a fold changed them)"
    return ""


def _rounds_to(q: np.ndarray, w: np.ndarray, scale) -> bool:
    """Whether ``q`` is ``w`` on the grid of ``scale`` (per output channel) to within a step: GPTQ re-rounds
    the float weights, so they must be what the int8 ones came from."""
    s = np.asarray(scale, np.float64).reshape((-1,) + (1,) * (w.ndim - 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        return bool(np.all(np.abs(q - np.clip(w / s, -128, 127)) <= 1.0))


def _gather_statistics(qdq: ir.Model, layers: list[_Layer], samples: list[dict], done=lambda k: None) -> None:
    # The QDQ graph as written (no fusion): each conv's input exactly as its DequantizeLinear gives it.
    names = sorted({layer.node.inputs[0].name for layer in layers})
    sess = runtime.session(qdq, outputs=names, optimize=False, purpose=" to round conv weights")
    # With every sample the same shape, the first one tells each layer's patch count: a layer that will
    # have too few (a stride-32 conv with thousands of taps on a small map) only counts, and its H, the
    # largest kind there is, is never built.
    fixed = isinstance(samples, (list, tuple)) and all(
        {n: np.shape(a) for n, a in feed.items()} == {n: np.shape(a) for n, a in samples[0].items()}
        for feed in samples)
    for k, feed in enumerate(samples):
        done(k)
        values = dict(zip(names, runtime.run(sess, names, feed)))
        shared: dict[str, tuple] = {}  # MatMuls reading one input (queries, keys, values) share its moments
        for layer in layers:
            name = layer.node.inputs[0].name
            x = values[name]
            if layer.rows:  # (..., K) -> (1, K, rows, 1): the patches of a 1x1 conv are the rows
                if name not in shared:
                    shared[name] = _im2col_moments(x.reshape(-1, x.shape[-1]).T[None, :, :, None], layer)
                h, s, n = shared[name]
            else:
                if k == 0 and fixed:  # from the shape alone: no padded copy of x
                    layer.thin = _too_few_patches(_patch_count(x.shape, layer) * len(samples), layer)
                if layer.thin:
                    layer.count += _patch_count(x.shape, layer)
                    continue
                h, s, n = _patch_moments(x, layer) if layer.depthwise else _im2col_moments(x, layer)
            layer.h = h if layer.h is None else layer.h + h
            layer.p_sum = s if layer.p_sum is None else layer.p_sum + s
            layer.count += n


def _too_few_patches(count: int, layer: _Layer) -> bool:
    """Fewer than ``MIN_PATCHES_PER_TAP`` input patches per tap (``MIN_ROWS_PER_TAP`` rows for a
    MatMul/Gemm): ``H`` too thin to rank roundings by."""
    return count < (MIN_ROWS_PER_TAP if layer.rows else MIN_PATCHES_PER_TAP) * layer.w.shape[1]


def _max_positions(layer: _Layer, channels: int) -> int:
    """Output positions per sample the moments take: ``MAX_PATCHES``, and for an ungrouped conv at most
    ``MOMENT_FLOPS / taps^2`` (its moment costs positions * taps^2 multiply-adds)."""
    if layer.depthwise:
        return MAX_PATCHES
    d = channels * layer.kernel[0] * layer.kernel[1]
    return max(1, min(MAX_PATCHES, MOMENT_FLOPS // (d * d)))


def _sampled_rows(shape: tuple[int, ...], layer: _Layer, max_positions: int) -> tuple[int, int, int]:
    """For an input of ``shape`` (N, C, H, W): the output-row step that keeps rows * OW <= ``max_positions``
    (or one row), the rows kept, and OW."""
    (kh, kw), (pt, pl, pb, pr), (sh, sw), (dh, dw) = layer.kernel, layer.pads, layer.strides, layer.dilations
    h, w = shape[2] + pt + pb, shape[3] + pl + pr
    oh, ow = (h - dh * (kh - 1) - 1) // sh + 1, (w - dw * (kw - 1) - 1) // sw + 1
    step = max(1, -(-oh * ow // max_positions))
    return step, len(range(0, oh, step)), ow


def _patch_count(shape: tuple[int, ...], layer: _Layer) -> int:
    """The number of patches the moments of an input of ``shape`` count (per channel, for a depthwise
    conv), from the shape alone."""
    _, rows, ow = _sampled_rows(shape, layer, _max_positions(layer, shape[1]))
    return shape[0] * rows * ow


def _windows(x: np.ndarray, layer: _Layer, max_positions: int) -> tuple[np.ndarray, int, int]:
    """The conv's input patches as a view (N, C, rows, OW, kh, kw) of the zero-padded ``x``, on every
    step-th output row (:func:`_sampled_rows`); and rows, OW."""
    (kh, kw), (pt, pl, pb, pr), (sh, sw), (dh, dw) = layer.kernel, layer.pads, layer.strides, layer.dilations
    step, rows, ow = _sampled_rows(x.shape, layer, max_positions)
    x = np.pad(np.asarray(x, np.float32), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    windows = sliding_window_view(x, (dh * (kh - 1) + 1, dw * (kw - 1) + 1), axis=(2, 3))
    # slices only: a view until the callers' block copies
    return windows[:, :, ::sh * step, ::sw, ::dh, ::dw][:, :, :rows, :ow], rows, ow


def _patch_moments(x: np.ndarray, layer: _Layer) -> tuple[np.ndarray, np.ndarray, int]:
    """Per input channel of ``x`` (N, C, H, W): the sum of ``p p^T`` and of ``p`` over the depthwise conv's
    input patches ``p`` (k*k taps, zero padding included), and the number of patches per channel. Large
    maps take every r-th output row (at most ``MAX_PATCHES`` per channel and sample): the moments are means
    over positions and a large map does not need all of its positions."""
    windows, rows, ow = _windows(x, layer, _max_positions(layer, x.shape[1]))
    n, c = windows.shape[:2]
    d = layer.kernel[0] * layer.kernel[1]
    hs, sums = np.zeros((c, d, d)), np.zeros((c, d))
    ones = np.ones(n * rows * ow, np.float32)
    block = max(1, PATCH_BLOCK // max(1, n * rows * ow * d))
    for c0 in range(0, c, block):
        p = windows[:, c0:c0 + block].transpose(1, 0, 2, 3, 4, 5).reshape(-1, n * rows * ow, d)
        # float32 BLAS products and sums: the moments only rank roundings, 1e-6 relative is plenty
        hs[c0:c0 + block] = np.matmul(p.transpose(0, 2, 1), p)
        sums[c0:c0 + block] = np.matmul(ones, p)
    return hs, sums, n * rows * ow


def _im2col_moments(x: np.ndarray, layer: _Layer) -> tuple[np.ndarray, np.ndarray, int]:
    """An ungrouped conv's input patches ``p`` (C*kh*kw taps, the weights' flattened order): the sum of
    ``p p^T`` and of ``p``, and the number of patches; positions subsampled by output rows to at most
    ``MAX_PATCHES`` and ``MOMENT_FLOPS / taps^2`` per sample."""
    c = x.shape[1]
    d = c * layer.kernel[0] * layer.kernel[1]
    windows, rows, ow = _windows(x, layer, _max_positions(layer, c))
    n = windows.shape[0]
    # float32 H: every conv's is held until the last sample, so float32 halves the memory float64 would take
    hs, sums = np.zeros((d, d), np.float32), np.zeros(d)
    block = max(1, PATCH_BLOCK // max(1, n * ow * d))  # output rows per copy
    for r0 in range(0, rows, block):
        p = windows[:, :, r0:r0 + block].transpose(0, 2, 3, 1, 4, 5).reshape(-1, d)
        hs += np.matmul(p.T, p)  # float32 BLAS, as above
        sums += p.sum(axis=0, dtype=np.float64)
    return hs, sums, n * rows * ow


def _round_layer(layer: _Layer, limits: tuple[int, int]) -> RoundingRecord:
    node, w = layer.node, layer.w
    c_out, d = w.shape
    q_value = layer.w_dq.inputs[0]
    q_old = const_array(q_value)
    scale = np.broadcast_to(np.asarray(const_array(layer.w_dq.inputs[1]), np.float64).reshape(-1), (c_out,))
    qmin, qmax = limits
    h = layer.h.astype(np.float64) / layer.count  # rounded in float64 (an ungrouped conv's H is summed in float32)
    mean = layer.p_sum / layer.count
    if layer.depthwise:  # output channel o reads input channel o // multiplier
        h, mean = np.repeat(h, layer.multiplier, axis=0), np.repeat(mean, layer.multiplier, axis=0)
    # else every output channel reads the same patches: one H
    nearest = np.clip(np.round(w / scale[:, None]), qmin, qmax)
    chosen = polish(gptq_round(w, scale, h, qmin, qmax, layer.pair_limit), w, scale, h, qmin, qmax,
                    POLISH_ROUNDS if layer.depthwise else SHARED_POLISH_ROUNDS, layer.pair_limit)
    err_nearest, err_chosen = _output_error(nearest, w, scale, h), _output_error(chosen, w, scale, h)
    worse = err_chosen > err_nearest
    chosen[worse], err_chosen[worse] = nearest[worse], err_nearest[worse]
    chosen_stored = chosen.T if layer.transposed else chosen.reshape(q_old.shape)
    q_value.const_value = ir.tensor(chosen_stored.astype(np.int8), name=q_value.name)
    # The mean output error left by the weights, and the bias's own rounding.
    corrected = layer.fold and bias_dequantize(node) is not None and fold_into_bias(
        node, ((w - chosen * scale[:, None]) * mean).sum(axis=1), layer.b)
    return RoundingRecord(node.name, c_out, d, float(err_nearest.mean()), float(err_chosen.mean()), corrected,
                          depthwise=layer.depthwise, matmul=layer.rows)


def _per_row(h: np.ndarray) -> np.ndarray:
    """``h`` as (C, d, d) or (1, d, d): one second moment per weight row, or one shared by all rows."""
    return h[None] if h.ndim == 2 else h


def gptq_round(w: np.ndarray, scale: np.ndarray, h: np.ndarray, qmin: int, qmax: int,
               pair_limit: int | None = None) -> np.ndarray:
    """Grid indices of ``w`` (C, d) at per-row ``scale``, rounded one column at a time with each
    column's error fed onto the columns after it through the inverse of ``h`` (C, d, d per row, or
    d, d shared): GPTQ. With ``pair_limit``, column 2j + 1 is clipped so that ``|q_2j + q_2j+1|`` stays
    within it (its partner is rounded first)."""
    h = _per_row(h)
    d = w.shape[1]
    diag = np.einsum("cii->ci", h)
    hd = h + np.eye(d) * (DAMPING * diag.mean(axis=1) + 1e-12)[:, None, None]
    dead = diag.max(axis=1) <= 0  # a row that never sees input: any rounding is exact, take nearest
    hd[dead] = np.eye(d)
    # Upper Cholesky factor U of H^-1 (H^-1 = U^T U): row i says how the error of column i moves the rest.
    u = np.linalg.cholesky(np.linalg.inv(hd)).transpose(0, 2, 1)
    rest = w.astype(np.float64).copy()
    q = np.empty_like(rest)
    # Columns in blocks (GPTQ's lazy batch updates): within a block column by column, then the block's
    # errors reach the columns after it in one product, so the Python loop touches (C, block) slices only.
    for b0 in range(0, d, GPTQ_BLOCK):
        b1 = min(d, b0 + GPTQ_BLOCK)
        errs = np.empty((len(rest), b1 - b0))
        for i in range(b0, b1):
            q[:, i] = np.clip(np.round(rest[:, i] / scale), *_column_range(q, i, qmin, qmax, pair_limit, i % 2 == 1))
            err = (rest[:, i] - q[:, i] * scale) / u[:, i, i]
            rest[:, i + 1:b1] -= err[:, None] * u[:, i, i + 1:b1]
            errs[:, i - b0] = err
        if b1 < d:
            rest[:, b1:] -= np.matmul(errs[:, None, :], u[:, b0:b1, b1:])[:, 0] if len(u) > 1 \
                else errs @ u[0, b0:b1, b1:]
    return q


def _column_range(q: np.ndarray, i: int, qmin: int, qmax: int, pair_limit: int | None, partner_rounded: bool):
    """The integers column ``i`` of ``q`` may take: ``[qmin, qmax]``, and with ``pair_limit`` (its partner,
    the other column of the pair 2j, 2j + 1, rounded) those that keep ``|q_i + q_partner|`` within it,
    per row."""
    partner = i ^ 1
    if pair_limit is None or not partner_rounded or partner >= q.shape[1]:
        return qmin, qmax
    other = q[:, partner]
    return np.maximum(qmin, -pair_limit - other), np.minimum(qmax, pair_limit - other)


def polish(q: np.ndarray, w: np.ndarray, scale: np.ndarray, h: np.ndarray, qmin: int, qmax: int,
           rounds: int = POLISH_ROUNDS, pair_limit: int | None = None) -> np.ndarray:
    """+-1 grid steps, one column at a time, wherever they lower ``e^T h e`` (``e = q * scale - w``; ``h``
    per row or shared, as in :func:`gptq_round`), within ``pair_limit`` as there."""
    q = q.copy()
    h = _per_row(h)
    he = _h_times(h, q * scale[:, None] - w)  # h e, kept up to date as q moves
    diag = np.einsum("cii->ci", h)
    for _ in range(rounds):
        moved = False
        for i in range(q.shape[1]):
            column = h[:, :, i]  # (C or 1, d)
            for step in (-1.0, 1.0):
                new = np.clip(q[:, i] + step, *_column_range(q, i, qmin, qmax, pair_limit, True))
                dq = (new - q[:, i]) * scale
                gain = 2 * dq * he[:, i] + dq * dq * diag[:, i]  # change of e^T h e
                take = gain < -1e-18 * np.maximum(1.0, np.abs(he[:, i]))
                if take.any():
                    q[take, i] = new[take]
                    he[take] += dq[take, None] * (column[take] if len(column) > 1 else column)
                    moved = True
        if not moved:
            break
    return q


def _h_times(h: np.ndarray, e: np.ndarray) -> np.ndarray:
    """``h e`` per row of ``e`` (C, d), for ``h`` (C, d, d) or (1, d, d)."""
    if len(h) == 1:  # shared: one matrix product
        return e @ h[0].T
    return np.matmul(h, e[:, :, None])[:, :, 0]


def _output_error(q: np.ndarray, w: np.ndarray, scale: np.ndarray, h: np.ndarray) -> np.ndarray:
    e = q * scale[:, None] - w
    return (e * _h_times(_per_row(h), e)).sum(axis=1)


@dataclass(frozen=True)
class WeightRoundingRecord:
    """One :class:`RoundingRecord` per depthwise or ungrouped conv, and per MatMul/Gemm with a constant weight."""

    layers: list[RoundingRecord]

    def lines(self) -> list[str]:
        rounded = [r for r in self.layers if not r.reason]
        if not rounded:
            return []
        gains, left = [r.gain_db for r in rounded], len(self.layers) - len(rounded)
        depthwise, matmuls = sum(r.depthwise for r in rounded), sum(r.matmul for r in rounded)
        what = f"{len(rounded) - matmuls} conv(s) ({depthwise} depthwise)" + (
            f" and {matmuls} matmul(s)" if matmuls else "")
        return [f"weights: {what} rounded for their output error, "
                f"weight-induced output error {min(gains):.1f}-{max(gains):.1f} dB lower than nearest rounding"
                + (f"; {left} left at nearest rounding" if left else "")]


class WeightRounding(Refinement):
    """``config.refinements.weight_rounding``: "gptq" rounds conv weights for the conv's output error,
    "gptq_all" MatMul and Gemm weights too."""

    name = "weight_rounding"
    edits_qdq = True

    def enabled(self, config) -> bool:
        return config.refinements.weight_rounding in ("gptq", "gptq_all")

    def apply(self, state):
        grid = weight_grid(state.config.target, state.config.weight_bits)
        records = round_conv_weights(state.float_model, state.qdq, list(state.samples),
                                     progress=state.config.progress, limits=grid.range("Conv"))
        if state.config.refinements.weight_rounding == "gptq_all":
            records += round_matmul_weights(state.float_model, state.qdq, state.data, progress=state.config.progress,
                                            limits=grid.range("MatMul"), pairs=grid.pairs)
        return state, WeightRoundingRecord(records)
