"""Empirical bias correction: fold each integer layer's mean output error back into its int32 bias.

Two ways (``QuantConfig.bias_correction``):

- "sequential" (the default, :func:`correct_biases_sequentially`): each conv's whole mean output shift
  against the float model, upstream error included, one topological stage at a time, so every layer
  is measured after the layers before it were corrected.
- "own" (:func:`correct_biases`): each layer's own error only, from one pass.

Why it matters: a per-tensor uint8 scale set by a few loud channels leaves the quiet ones a handful
of levels, and rounding a narrow distribution on a coarse grid shifts its mean; convs turn those
shifts into per-channel offsets that compound with depth (figures: docs/experiments.md, "Bias
correction").

Quantizing a layer's input and weights shifts the *mean* of its output per channel (rounding of
a skewed distribution, clipped tails, a weight grid that is coarse next to near-dead channels).
Depthwise convolutions sum only a few products, so the shift does not average out, and it
compounds through the network (Nagel et al., "Data-Free Quantization", 2019, section 4.2). The
correction uses the measured mean of each layer's input in the quantized model (a few calibration
samples, one pass) and the exact weight and bias errors, and adds the resulting per-channel mean
output error to that layer's int32 bias.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from qnnx import numerics, runtime
from qnnx.autoquant.refinements.progress import ProgressLine
from qnnx.autoquant.qdq import int32_bias_scale, quantized_constant
from qnnx.autoquant.refinements.base import Refinement
from qnnx.autoquant.stages import output_agreement, reference_outputs
from qnnx.ir import const_array

INT32 = np.iinfo(np.int32)


def _session(model: ir.Model, names: list[str]) -> ort.InferenceSession:
    # The QDQ graph as written (no fusion), so the tensors fetched are exactly the QDQ meaning.
    return runtime.session(model, outputs=names, optimize=False)


def bias_dequantize(node: ir.Node) -> ir.Node | None:
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
    from one pass; a whole-output comparison would count upstream shifts again at every layer and
    over-correct (docs/experiments.md, "Bias correction")."""
    float_weights = {n.name: n for n in float_model.graph if n.op_type in ("Conv", "Gemm")}
    layers = []
    for node in qdq.graph:
        if node.op_type not in ("Conv", "Gemm") or node.name not in float_weights or not bias_dequantize(node):
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
    fetch = sorted(set(names))
    means = _mean_over_samples(_session(qdq, fetch), fetch, samples)
    changed = 0
    for (node, w, b, w_dq), name in zip(layers, names):
        delta = _weight_error(node, w - dequantized(w_dq), means[name])
        if delta is not None:
            changed += fold_into_bias(node, delta, b)
    return changed


def fold_into_bias(node: ir.Node, delta: np.ndarray, float_bias: np.ndarray | None) -> bool:
    """Add a layer's mean output error ``delta`` and its int32 bias's own rounding error (against
    ``float_bias``, the float model's) to that bias; whether it changed."""
    b_hat = dequantized(bias_dequantize(node))
    if float_bias is not None and float_bias.shape == b_hat.shape:
        delta = delta + (float_bias - b_hat)
    return add_to_bias(node, delta) is not None


def dequantized(dq: ir.Node) -> np.ndarray:
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


def add_to_bias(node: ir.Node, delta: np.ndarray) -> np.ndarray | None:
    """Add ``delta`` (float, per output channel) to ``node``'s int32 bias, rounded to its grid; the float
    change made, or None when nothing changed."""
    dq = bias_dequantize(node)
    q = const_array(dq.inputs[0]).astype(np.int64)
    scale = np.broadcast_to(np.asarray(const_array(dq.inputs[1]), np.float64), q.shape)
    if delta.shape != q.shape or not np.all(np.isfinite(delta)):
        return None
    new = np.clip(q + np.round(delta / scale), INT32.min, INT32.max).astype(np.int32)
    if np.array_equal(new, q):
        return None
    value = dq.inputs[0]
    value.const_value = ir.tensor(new, name=value.name)
    step = np.asarray(const_array(dq.inputs[1]), np.float32)
    return (new.astype(np.float32) * step - q.astype(np.float32) * step).astype(np.float32)


# --------------------------------------------------------------------------- sequential correction


@dataclass(frozen=True)
class CorrectionRecord:
    """One layer's correction: the rms over channels of the mean output shift taken out, against the rms
    of its float output (both on the correction samples), and the topological stage it was measured in."""

    node: str
    stage: int
    shift_rms: float
    output_rms: float

    @property
    def relative(self) -> float:
        return self.shift_rms / self.output_rms if self.output_rms > 0 else 0.0


@dataclass(frozen=True)
class CorrectionCheck:
    """The model's outputs against float on the correction samples, before and after the correction: the
    mean over outputs of each output's mean per-channel cosine (``compare.LayerError.channel_cosine``).

    Why it is checked: a mean shift at a conv's output is not always a constant offset. Where upstream
    ranges clip a few large values (a detector's class branch, with calibration choices other than the
    default), the mean moves with those few pixels, and folding it into the bias moves every pixel:
    detections can collapse (every class score zero). The per-channel cosine falls with them, and rises
    where the correction pays. Whole-tensor figures miss it: a detector's box coordinates rule its SQNR.
    A per-channel SQNR would too: a class-score channel gone all zero scores 0 dB, above a noisy but
    useful one.

    Undone when the distance ``1 - cosine`` grows by more than :data:`UNDO_GROWTH`: the harmful cases
    grew it far more than that, the helpful ones shrank it, and a lone conv whose output is quantized
    itself (its int8 step rules the error) grew it a little while its mean error fell. Figures:
    docs/experiments.md, "Bias correction"."""

    layers: int  # convs the correction changed
    before: float
    after: float

    @property
    def kept(self) -> bool:
        return not (1 - self.after) > UNDO_GROWTH * (1 - self.before)


UNDO_GROWTH = 1.1


def _new_bias_scale(node: ir.Node) -> np.ndarray | None:
    """The int32 bias scale (qdq.int32_bias_scale) of a bias-less integer conv: input scale (per-tensor, or per
    channel before a depthwise conv) from the DequantizeLinear before it, weight scales from its constant weight
    DequantizeLinear; or None."""
    x_dq = node.inputs[0].producer() if node.inputs[0] is not None else None
    w_dq = node.inputs[1].producer() if len(node.inputs) > 1 and node.inputs[1] is not None else None
    if x_dq is None or w_dq is None or x_dq.op_type != "DequantizeLinear" or w_dq.op_type != "DequantizeLinear":
        return None
    x_scale, w_scale, w_q = const_array(x_dq.inputs[1]), const_array(w_dq.inputs[1]), const_array(w_dq.inputs[0])
    if x_scale is None or w_scale is None or w_q is None or w_q.ndim < 3 or w_q.shape[0] % np.size(x_scale):
        return None
    channels = (w_q.shape[0],)
    if np.size(w_scale) not in (1, channels[0]):
        return None
    return np.broadcast_to(int32_bias_scale(x_scale, w_scale.reshape(-1), channels), channels).copy()


def _with_bias(graph: ir.Graph, node: ir.Node) -> ir.Node | None:
    """``node``'s int32 bias DequantizeLinear, a zero one added first if it has none (the correction of a
    bias-less conv: prepare drops all-zero biases)."""
    dq = bias_dequantize(node)
    if dq is not None or (len(node.inputs) > 2 and node.inputs[2] is not None):
        return dq
    scale = _new_bias_scale(node)
    if scale is None:
        return None
    zeros = np.zeros(scale.shape, np.int32)
    if len(node.inputs) < 3:
        node.resize_inputs(3)
    quantized_constant(graph, node, 2, zeros, scale, zeros, 0, "bias")
    return bias_dequantize(node)


def correctable_layers(float_model: ir.Model, qdq: ir.Model) -> dict[ir.Node, str]:
    """Convs of ``qdq`` with a constant int32 bias (or none, but integer input and weights), each with the
    float model's value to compare its output with: the value of the same name (folds keep the name of
    the value they end in: a Conv -> Mul -> Add folded into the conv ends in the Add's output), or the
    graph output that the QDQ model renamed to ``{name}_float`` when it quantized it (qdq._insert_qdq)."""
    float_values = {v.name for n in float_model.graph for v in n.outputs}
    float_outputs = {v.name for v in float_model.graph.outputs}
    layers = {}
    for n in qdq.graph:
        if n.op_type != "Conv" or (bias_dequantize(n) is None and _new_bias_scale(n) is None):
            continue
        name = n.outputs[0].name
        if name in float_values:
            layers[n] = name
        elif name.endswith("_float") and name[:-len("_float")] in float_outputs:
            layers[n] = name[:-len("_float")]
    return layers


def stages(layers: list[ir.Node], graph: ir.Graph) -> list[list[ir.Node]]:
    """``layers`` grouped so that no layer is upstream of another in its group, in topological order:
    a layer's stage is one more than the deepest stage among the layers it depends on."""
    wanted = {id(n) for n in layers}
    depth: dict[int, int] = {}  # node -> number of layers on its deepest path from the inputs, itself included
    stage_of: dict[int, int] = {}
    for node in graph:  # graph order is topological
        d = max((depth.get(id(v.producer()), 0) for v in node.inputs if v is not None and v.producer() is not None),
                default=0)
        if id(node) in wanted:
            stage_of[id(node)] = d
            d += 1
        depth[id(node)] = d
    out: dict[int, list[ir.Node]] = {}
    for n in layers:
        out.setdefault(stage_of[id(n)], []).append(n)
    return [out[k] for k in sorted(out)]


def _has_subgraphs(graph: ir.Graph) -> bool:
    subgraph = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
    return any(a.type in subgraph for n in graph for a in n.attributes.values())


def _mean_over_samples(sess: ort.InferenceSession, names: list[str], samples: list[dict],
                       squares: dict[str, float] | None = None) -> dict[str, np.ndarray]:
    """Per-channel means of ``names`` over ``samples`` (channels on axis 1, the last of a 2-D value); the
    mean square of each into ``squares`` when given."""
    means: dict[str, np.ndarray] = {}
    for feed in samples:
        for name, y in zip(names, runtime.run(sess, names, feed)):
            means[name] = means.get(name, 0) + _channel_means(y, 1 if y.ndim > 2 else y.ndim - 1) / len(samples)
            if squares is not None:
                squares[name] = squares.get(name, 0.0) + float(np.mean(np.square(y, dtype=np.float64))) / len(samples)
    return means


class _Segments:
    """The QDQ graph run stage by stage, each run only the nodes no earlier stage ran: stage ``k``'s segment
    is what its layers' outputs depend on minus the earlier segments. The values a later segment reads
    are cached per sample between runs (and dropped after their last reader), so the whole model runs
    about once per sample, not once per stage."""

    def __init__(self, proto: onnx.ModelProto, stage_outputs: list[list[str]]):
        graph = proto.graph
        self.proto = proto
        producer = {o: i for i, n in enumerate(graph.node) for o in n.output}
        done: set[int] = set()
        self.nodes: list[list[int]] = []
        for names in stage_outputs:
            seg, todo = set(), list(names)
            while todo:
                i = producer.get(todo.pop())
                if i is not None and i not in done and i not in seg:
                    seg.add(i)
                    todo.extend(x for x in graph.node[i].input if x)
            done |= seg
            self.nodes.append(sorted(seg))
        produced = [{o for i in seg for o in graph.node[i].output if o} for seg in self.nodes]
        read = [{x for i in seg for x in graph.node[i].input if x} for seg in self.nodes]
        self.inputs = [sorted(r - p) for r, p in zip(read, produced)]  # graph inputs, initializers, cache
        last_read: dict[str, int] = {}
        for k, r in enumerate(read):
            for name in r:
                last_read[name] = k
        # what each segment must hand on: values it produces that a later segment reads
        self.keep = [sorted(v for v in p if last_read.get(v, -1) > k) for k, p in enumerate(produced)]
        self.last_read = last_read
        self.initializers = {t.name for t in graph.initializer}
        self.graph_inputs = {v.name for v in graph.input}

    def session(self, k: int, outputs: list[str], cached: dict[str, np.ndarray]) -> ort.InferenceSession:
        graph = self.proto.graph
        model = onnx.ModelProto()
        model.CopyFrom(self.proto)
        del model.graph.node[:]
        model.graph.node.extend(graph.node[i] for i in self.nodes[k])
        del model.graph.input[:]
        model.graph.input.extend(v for v in graph.input)
        for name in self.inputs[k]:
            if name not in self.initializers and name not in self.graph_inputs:
                elem = onnx.helper.np_dtype_to_tensor_dtype(cached[name].dtype)
                model.graph.input.append(onnx.helper.make_tensor_value_info(name, elem, None))
        del model.graph.output[:]
        model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in outputs)
        return runtime.session(model, optimize=False, purpose=" (bias correction)")


def correct_biases_sequentially(float_model: ir.Model, qdq: ir.Model, samples: list[dict],
                                progress: bool = False) -> list[CorrectionRecord]:
    """Correct the int32 biases of ``qdq``'s convs in place, stage by stage, for their whole mean output
    shift against ``float_model`` on ``samples``; one record per layer changed.

    ``E[y_float] - E[y_qdq]`` per output channel at each conv's output (before its QuantizeLinear),
    measured on the QDQ graph as written (no fusion) with every earlier stage already corrected, is
    added to the int32 bias: the conv's output is linear in its bias, so that mean shift is gone
    exactly on these samples, and the cached output is shifted by the same amount for the stages
    after it. Correcting every layer from one pass instead counts an upstream shift again at each
    layer below it, and the corrections add up until they ruin the model; so does correcting a few
    layers per stage. Layer by layer they do not (figures: docs/experiments.md, "Bias correction")."""
    float_name = correctable_layers(float_model, qdq)
    if not float_name or not samples or _has_subgraphs(qdq.graph):
        return []  # subgraphs read outer values implicitly: segments cut from the graph would miss them
    names = list(dict.fromkeys(float_name.values()))
    squares: dict[str, float] = {}
    float_means = _mean_over_samples(runtime.session(float_model, outputs=names, optimize=False,
                                                     purpose=" (bias correction, float model)"), names, samples,
                                     squares)
    groups = stages(list(float_name), qdq.graph)
    segments = _Segments(ir.to_proto(qdq), [[n.outputs[0].name for n in g] for g in groups])
    caches: list[dict[str, np.ndarray]] = [{} for _ in samples]
    records, say = [], ProgressLine("bias correction", progress)
    for k, group in enumerate(groups):
        wanted = [n.outputs[0].name for n in group]
        outputs = list(dict.fromkeys(wanted + segments.keep[k]))
        sess = segments.session(k, outputs, caches[0])
        feeds_of = [x.name for x in sess.get_inputs()]
        means: dict[str, np.ndarray] = {}
        for feed, cache in zip(samples, caches):
            values = runtime.run(sess, outputs, {name: cache[name] if name in cache else feed[name]
                                                for name in feeds_of})
            for name, y in zip(outputs, values):
                if name in wanted:
                    means[name] = means.get(name, 0) + _channel_means(y, 1) / len(samples)
                cache[name] = y
            for name in [n for n in cache if segments.last_read.get(n, -1) <= k]:
                del cache[name]  # no later segment reads it
        for node in group:
            name = node.outputs[0].name
            target, got = float_means[float_name[node]], means[name]
            if target.shape != got.shape:
                continue
            delta = target - got
            if _with_bias(qdq.graph, node) is None:
                continue
            applied = add_to_bias(node, delta)
            if applied is None:
                continue
            records.append(CorrectionRecord(node.name, k, float(np.sqrt(np.mean(delta ** 2))),
                                            float(np.sqrt(squares[float_name[node]]))))
            for cache in caches:  # the conv's output moves by exactly the bias change
                if name in cache:
                    y = cache[name]
                    cache[name] = y + applied.reshape((1, -1) + (1,) * (y.ndim - 2)).astype(y.dtype)
        say(f"stage {k + 1}/{len(groups)}")
    say.end()
    return records


@dataclass(frozen=True)
class BiasCorrectionRecord:
    """What the bias correction did: the layers corrected and the check that kept or undid it."""

    mode: str
    corrections: list[CorrectionRecord]
    check: CorrectionCheck | None

    def lines(self) -> list[str]:
        check, out = self.check, []
        if check is not None and not check.kept:
            out.append(f"biases: correction of {check.layers} conv(s) undone: the outputs' mean per-channel cosine "
                       f"to float fell {check.before:.4f} -> {check.after:.4f} with it")
        if self.corrections and (check is None or check.kept):
            rel = sorted(c.relative for c in self.corrections)
            n_stages = max(c.stage for c in self.corrections) + 1
            out.append(f"biases: {len(rel)} conv(s) corrected for their mean output shift against float in {n_stages} "
                       f"sequential stage(s) (median {100 * rel[len(rel) // 2]:.1f}%, max {100 * rel[-1]:.1f}% of "
                       "the output's rms)" + (f"; outputs' mean per-channel cosine {check.before:.4f} -> "
                                              f"{check.after:.4f}" if check is not None else ""))
        return out


class BiasCorrection(Refinement):
    """``config.refinements.bias_correction``: "sequential" or "own"; undone when the outputs' distance
    from float grows with it (:class:`CorrectionCheck`)."""

    name = "bias_correction"
    edits_qdq = True

    def enabled(self, config) -> bool:
        return config.refinements.bias_correction != "off"

    def apply(self, state):
        mode, samples = state.config.refinements.bias_correction, list(state.samples)
        reference = reference_outputs(state.float_model, samples)
        before = output_agreement(state.float_model, state.qdq, samples, reference)
        if mode == "own":
            corrections, changed = [], correct_biases(state.float_model, state.qdq, samples)
        else:
            corrections = correct_biases_sequentially(state.float_model, state.qdq, samples,
                                                      progress=state.config.progress)
            changed = len(corrections)
        after = output_agreement(state.float_model, state.qdq, samples, reference)
        if not before or not changed or len(after) != len(before):
            # nothing to compare with (no samples, or a model ONNX Runtime cannot run), or nothing done
            return state, BiasCorrectionRecord(mode, corrections, None)
        check = CorrectionCheck(changed, mean_channel_cosine(before), mean_channel_cosine(after))
        record = BiasCorrectionRecord(mode, corrections if check.kept else [], check)
        return (state if check.kept else None), record


def mean_channel_cosine(outputs) -> float:
    known = [o.channel_cosine for o in outputs if np.isfinite(o.channel_cosine)]
    return float(np.mean(known)) if known else float("nan")  # nan: not comparable, the correction stays
