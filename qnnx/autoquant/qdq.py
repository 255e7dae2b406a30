"""Realize a quantization plan as a QDQ model: QuantizeLinear -> DequantizeLinear on every
quantized activation (qparams chosen by calibration), weights quantized offline to int8
(per-channel) behind a DequantizeLinear, biases to int32 with scale ``x_scale * w_scale``.

This is the format ONNX Runtime (and other QDQ consumers) run natively, and the input of
fake-quantization-to-integer, which produces the canonical qnnx integer model from it.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from qnnx import numerics, ops
from qnnx.autoquant.patterns import pattern_named
from qnnx.calibrate import ObserverConfig, QParams, make_observer
from qnnx.dtypes import int_type
from qnnx.ir import Builder, const_array, drop_unused_initializers, replace_value
from qnnx.targets import weight_grid
from qnnx.targets.execution import WeightGrid


def _model_copy(model: ir.Model) -> ir.Model:
    copy = model.clone()
    copy.producer_name = "qnnx"
    return copy


def _values_by_name(graph: ir.Graph) -> dict[str, ir.Value]:
    values = {v.name: v for v in graph.inputs}
    values.update(graph.initializers)
    for node in graph:
        for o in node.outputs:
            values[o.name] = o
    return values


def _qparam_consts(b: Builder, qp: QParams, hint: str) -> tuple[ir.Value, ir.Value]:
    t = int_type(qp.dtype)
    return (b.const(np.asarray(qp.scale, np.float32), f"{hint}_scale"),
            b.const(np.asarray(qp.zero_point).astype(t.numpy), f"{hint}_zero_point"))


def _insert_qdq(graph: ir.Graph, v: ir.Value, qp: QParams, readers: set[str] | None = None) -> None:
    """Q -> DQ after ``v``; every reader of ``v`` reads the DQ, or only the nodes named in ``readers``
    (``v`` comes from a float op: its other readers keep the exact float value, which exists anyway)."""
    b = Builder(graph, v.name)
    scale, zp = _qparam_consts(b, qp, "q")
    axis = {"axis": qp.axis} if qp.axis is not None else {}
    q = b.op("QuantizeLinear", [v, scale, zp], hint="QuantizeLinear", **axis)
    q.type = ir.TensorType(int_type(qp.dtype).onnx)
    q.shape = v.shape
    dq = b.op("DequantizeLinear", [q, scale, zp], hint="DequantizeLinear", **axis)
    dq.type, dq.shape = v.type, v.shape
    insert_after(graph, v, b.nodes, dq, readers)


def insert_after(graph: ir.Graph, v: ir.Value, nodes: list[ir.Node], out: ir.Value,
                  readers: set[str] | None) -> None:
    """Insert ``nodes`` (computing ``out`` from ``v``) right after ``v`` is made; the readers of ``v``
    (all, or the nodes named in ``readers``) read ``out``; a graph output ``v`` hands its name to ``out``."""
    uses = [u for u in v.uses() if readers is None or u.node.name in readers]
    producer = v.producer()
    if producer is not None:
        graph.insert_after(producer, nodes)
    else:
        first = next(iter(graph), None)
        if first is None:
            graph.extend(nodes)
        else:
            graph.insert_before(first, nodes)
    for use in uses:
        if use.node not in nodes:
            use.node.replace_input_with(use.idx, out)
    if v.is_graph_output() and readers is None:  # the output keeps its name and now carries the quantized values
        idx = list(graph.outputs).index(v)
        name = v.name
        v.name = f"{name}_float"
        out.name = name
        graph.outputs[idx] = out


def quantized_constant(graph: ir.Graph, node: ir.Node, index: int, q: np.ndarray, qp_scale, qp_zp, axis,
                        hint: str) -> None:
    b = Builder(graph, node.name or node.op_type)
    w_q = b.const(q, f"{hint}_quantized")
    scale = b.const(np.asarray(qp_scale, np.float32), f"{hint}_scale")
    zp = b.const(np.asarray(qp_zp).astype(q.dtype), f"{hint}_zero_point")
    attrs = {"axis": axis} if axis is not None and np.asarray(qp_scale).size > 1 else {}
    dq = b.op("DequantizeLinear", [w_q, scale, zp], hint=f"{hint}_DequantizeLinear", **attrs)
    dq.type = ir.TensorType(ir.DataType.FLOAT)
    dq.shape = ir.Shape(q.shape)
    graph.insert_before(node, b.nodes)
    node.replace_input_with(index, dq)


def _drop_if_dead(graph: ir.Graph, node: ir.Node) -> None:
    """Remove ``node`` (still in ``graph``) once nothing reads its output: runtimes do not always drop
    dead nodes (ORT 1.31 runs them)."""
    if node.graph is graph and not node.outputs[0].uses() and not node.outputs[0].is_graph_output():
        graph.remove(node, safe=True)


def _fold_scale(graph: ir.Graph, node: ir.Node, qp: QParams) -> None:
    """``DQ(x_q) -> Mul/Div(c) -> Q -> DQ`` becomes ``DQ(x_q, scale * factor)``: the same integers,
    reinterpreted, so no float op, no requantization and nothing for a runtime to leave unfused."""
    dq_x = next((v.producer() for v in node.inputs if v is not None and v.producer() is not None
                 and v.producer().op_type == "DequantizeLinear"), None)
    y = node.outputs[0]
    q_y = next((u.node for u in y.uses() if u.node.op_type == "QuantizeLinear"), None)
    dq_y = next((u.node for u in q_y.outputs[0].uses()), None) if q_y is not None else None
    if dq_x is None or dq_y is None or len(q_y.outputs[0].uses()) != 1:
        raise AssertionError(f"scale pattern at {node.name!r} was not realized as DQ -> op -> Q -> DQ")
    b = Builder(graph, node.name)
    scale = b.const(np.asarray(qp.scale, np.float32), "scaled_scale")
    axis = {"axis": qp.axis} if qp.axis is not None else {}
    out = b.op("DequantizeLinear", [dq_x.inputs[0], scale, dq_x.inputs[2]], hint="DequantizeLinear", **axis)
    out.type, out.shape = dq_y.outputs[0].type, dq_y.outputs[0].shape
    graph.insert_after(node, b.nodes)
    replace_value(graph, dq_y.outputs[0], out)
    replace_value(graph, y, out)  # float readers of y (none but the Q in practice)
    for n in (dq_y, q_y, node):
        graph.remove(n, safe=True)
    _drop_if_dead(graph, dq_x)


# The int32 bias must leave the accumulator headroom: |bias / (x_scale * w_scale)| <= 2**30.
BIAS_LIMIT = float(2**30)


def per_output_channel(x_scale, n_out: int) -> np.ndarray:
    """The input scale in the accumulator of each of ``n_out`` output channels: ``x_scale`` itself (float32
    scalar) when per-tensor; per channel (a depthwise conv's input, C channels) channel ``o // (n_out / C)``'s."""
    xs = np.asarray(x_scale, np.float32)
    return np.float32(xs.reshape(())) if xs.size == 1 else numerics.depthwise_per_output(xs, n_out)


def int32_bias_scale(x_scale, w_scale, shape) -> np.ndarray:
    """The scale of an int32 bias that runtimes fuse into an integer conv/gemm: ``x_scale * w_scale`` in
    float32 (:func:`per_output_channel` for a per-channel input), broadcast to the bias ``shape`` when
    per-channel (a scalar when both are per-tensor)."""
    scale = (per_output_channel(x_scale, int(np.prod(shape))) * np.asarray(w_scale, np.float32)).astype(np.float32)
    return np.broadcast_to(scale, shape).astype(np.float32) if scale.size > 1 else scale


def _fit_bias(w_qp: QParams, bias: np.ndarray, x_scale) -> QParams:
    """Raise weight scales where the bias would not fit int32 at ``x_scale * w_scale`` (a near-dead
    channel has a tiny weight scale but may keep a large bias from BatchNorm or a folded affine op;
    clipping that bias to int32 ruined those channels outright). Coarser weights there cost little:
    such channels are close to constant anyway."""
    xs = per_output_channel(x_scale, bias.size).astype(np.float64)
    need = (np.abs(bias.reshape(-1)) / (xs * BIAS_LIMIT)).astype(np.float32)
    scale = np.asarray(w_qp.scale, np.float32)
    if scale.ndim == 0:
        need = np.float32(need.max(initial=0.0))
    elif need.shape != scale.shape:
        return w_qp
    if np.all(need <= scale):
        return w_qp
    return QParams(np.maximum(scale, need), w_qp.zero_point, w_qp.dtype, w_qp.axis)


def _normal_bias_scale(w_qp: QParams, x_scale) -> QParams:
    """Raise weight scales where ``x_scale * w_scale`` (the int32 bias scale) would be subnormal: a channel
    of near-zero weights (scale near the float32 floor) under a small input scale. Subnormal scales are
    invalid qparams (1/scale overflows); such weights quantize to 0 either way."""
    tiny = np.float32(np.finfo(np.float32).tiny)
    scale = np.asarray(w_qp.scale, np.float32)
    xs = per_output_channel(x_scale, scale.size) if scale.size > 1 else \
        np.float32(np.min(np.asarray(x_scale, np.float32)))
    if np.all(scale * xs >= tiny):
        return w_qp
    need = (tiny / xs).astype(np.float32)
    return QParams(np.maximum(scale, need * np.float32(1 + 2 ** -20)).astype(np.float32), w_qp.zero_point, w_qp.dtype,
                   w_qp.axis)


def _weight_qparams(w: np.ndarray, axis: int | None, config, grid: WeightGrid, pair_axis: int | None) -> QParams:
    """Symmetric int8 qparams of conv/matmul weights: min-max over the grid's 7 or 8 bits, or (``pair_axis``,
    the input channels of weights the grid pairs) over 8 bits with each scale widened to keep the same-sign
    pairs along it within numerics.U8S8_PAIR_LIMIT."""
    qp = _constant_qparams(w, axis, config, config.weight_dtype, True, grid.bits == 7 and pair_axis is None)
    if pair_axis is None:
        return qp
    scale = np.maximum(np.asarray(qp.scale, np.float32), numerics.pair_limited_scale(w, axis, pair_axis))
    return QParams(scale.reshape(np.shape(qp.scale)), qp.zero_point, qp.dtype, qp.axis)


def _constant_qparams(w: np.ndarray, axis: int | None, config, role_dtype: str, symmetric: bool,
                      reduce_range: bool = False) -> QParams:
    obs = make_observer(ObserverConfig(method="minmax", dtype=role_dtype, symmetric=symmetric, axis=axis,
                                       reduce_range=reduce_range))
    obs.observe(np.asarray(w, np.float32))
    return obs.compute_qparams()


class AffineRewriter:
    """Puts a plan's targets in affine space in a copy of the float model, one match at a time
    (``Pattern.realize`` / ``Pattern.simulate`` call :meth:`quantize_targets`). The walk is shared;
    a subclass says how an activation enters affine space and how a weight and a bias are quantized
    (constants here: :class:`QDQRewriter`; qparams as graph inputs: ``simulate.SimulatedRewriter``)."""

    def __init__(self, float_model: ir.Model, plan, config):
        self.model = _model_copy(float_model)
        self.graph = self.model.graph
        self.config = config
        self.values = _values_by_name(self.graph)
        self.nodes = {n.name: n for n in self.graph if n.name}
        self.grid = weight_grid(config.target, config.weight_bits)
        self.handles: dict[str, object] = {}  # activation name -> its qparams (or their graph inputs), once in
        # Activations quantized per channel (axis 1): depthwise conv inputs (plan.per_channel_depthwise_inputs).
        self.per_channel = {v.name for v in plan.per_channel_roots()}
        # Values quantized as pattern inputs but computed by a float op: only the pattern nodes read the DQ.
        produced = {t.value.name for match in plan.matches for t in match.outputs}
        self.readers: dict[str, set[str]] = {}
        for match in plan.matches:
            for t in match.inputs:
                if t.role == "activation" and t.value.name not in produced:
                    self.readers.setdefault(t.value.name, set()).update(n.name for n in (*match.nodes, *t.through))

    # hooks
    def activation(self, v: ir.Value, readers: set[str] | None):
        """Put ``v`` in affine space for ``readers`` (all when None); returns its qparams handle."""
        raise NotImplementedError

    def weight(self, anchor: ir.Node, idx: list[int], w: np.ndarray, qp: QParams, axis: int | None, x,
               bias: np.ndarray | None):
        """Quantize the weight inputs ``idx`` of ``anchor`` (``qp`` before fitting ``bias`` at input ``x``)."""
        raise NotImplementedError

    def bias(self, holder: ir.Node, idx: list[int], bias: np.ndarray, x, w) -> None:
        raise NotImplementedError

    def _pair_axis(self, anchor: ir.Node, idx: list[int], w: np.ndarray) -> int | None:
        """The input-channel axis of ``anchor``'s weights when the grid limits their int16 pairs, else None."""
        if not idx or not self.grid.pairs(anchor.op_type):
            return None
        return ops.reduction_axis(anchor, idx[0], w.ndim)

    # the walk
    def _activation(self, name: str, readers: set[str] | None):
        if name not in self.handles:
            self.handles[name] = self.activation(self.values[name], readers)
        return self.handles[name]

    def quantize_targets(self, match) -> None:
        """Activations in affine space, weights int8 (per-channel), constants in the activation type,
        the bias int32 at ``x_scale * w_scale``."""
        anchor = self.nodes.get(match.nodes[0].name) if match.nodes[0].name else None
        if anchor is None:
            raise AssertionError("pattern anchors must be named (prepare names every node)")
        config = self.config
        bias = np.asarray(const_array(self.values[match.bias.name]), np.float32) if match.bias is not None else None
        x, w_handle = None, None
        for t in match.inputs:
            if t.role == "activation":
                handle = self._activation(t.value.name, self.readers.get(t.value.name))
                x = handle if x is None else x
                continue
            idx = [i for i, v in enumerate(anchor.inputs) if v is not None and v.name == t.value.name]
            w = np.asarray(const_array(self.values[t.value.name]), np.float32)
            if t.role == "weight":  # int8 symmetric, per-channel when configured and possible
                axis = t.axis if config.per_channel else None
                qp = _weight_qparams(w, axis, config, self.grid, self._pair_axis(anchor, idx, w))
                w_handle = self.weight(anchor, idx, w, qp, axis, x, bias)
            else:  # a constant operand of an elementwise op: the activation type, from its own range
                qp = _constant_qparams(w, None, config, config.activation_dtype, config.activation_symmetric)
                q = numerics.quantize(w, qp.scale, qp.zero_point, axis=-1, out_dtype=qp.dtype)
                for i in idx:
                    quantized_constant(self.graph, anchor, i, q, qp.scale, qp.zero_point, None, f"in{i}")
        if bias is not None and x is not None and w_handle is not None:
            # The bias is an input of the anchor (Conv, Gemm) or of a fused Add after it (MatMul).
            holder = next(self.nodes[n.name] for n in match.nodes if any(v is match.bias for v in n.inputs))
            idx = [i for i, v in enumerate(holder.inputs) if v is not None and v.name == match.bias.name]
            self.bias(holder, idx, bias, x, w_handle)
        for t in match.outputs:
            self._activation(t.value.name, None)

    def finish(self) -> ir.Model:
        drop_unused_initializers(self.graph)  # the float weights the int8 copies replaced
        return self.model


class QDQRewriter(AffineRewriter):
    """Realize: QuantizeLinear -> DequantizeLinear with the chosen qparams, weights and bias constant."""

    def __init__(self, float_model: ir.Model, plan, value_qparams: dict[str, QParams], config):
        super().__init__(float_model, plan, config)
        self.qparams = value_qparams

    def activation(self, v, readers):
        qp = self.qparams[v.name]
        _insert_qdq(self.graph, v, qp, readers)
        return qp

    def weight(self, anchor, idx, w, qp, axis, x, bias):
        if x is not None:
            qp = _normal_bias_scale(qp, x.scale)
        if bias is not None and x is not None:
            qp = _fit_bias(qp, bias, x.scale)
        q = numerics.quantize(w, qp.scale, qp.zero_point, axis=axis if axis is not None else -1, out_dtype=qp.dtype)
        for i in idx:
            quantized_constant(self.graph, anchor, i, q, qp.scale, qp.zero_point, axis, f"in{i}")
        return qp

    def bias(self, holder, idx, bias, x, w):
        bias_scale = int32_bias_scale(x.scale, w.scale, bias.shape)
        q = numerics.quantize(bias, bias_scale, 0, axis=0, out_dtype="int32")
        for i in idx:
            quantized_constant(self.graph, holder, i, q, bias_scale, np.zeros(np.shape(bias_scale), np.int32), 0,
                                "bias")

    def fold_scale(self, match) -> None:
        """The ``scale`` pattern's float Mul/Div folded into the output DequantizeLinear's scale."""
        _fold_scale(self.graph, self.nodes[match.nodes[0].name], self.qparams[match.outputs[0].value.name])


def _dequantized_constant(v: ir.Value | None) -> tuple[np.ndarray, np.ndarray] | None:
    """``(real values in float64, stored integers)`` of a DequantizeLinear of constants (scalar or
    same-shape per-axis qparams), else None."""
    dq = v.producer() if v is not None else None
    if dq is None or dq.op_type != "DequantizeLinear":
        return None
    q, scale = const_array(dq.inputs[0]), const_array(dq.inputs[1])
    zp = const_array(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2] is not None else np.zeros((), np.int64)
    if q is None or scale is None or zp is None:
        return None
    return (q.astype(np.float64) - zp.astype(np.float64)) * scale.astype(np.float64), q


def _scalar_constant(v: ir.Value) -> float | None:
    """The real value of a scalar constant operand: an initializer, or a DequantizeLinear of one."""
    c = const_array(v)
    if c is None:
        dequantized = _dequantized_constant(v)
        c = dequantized[0] if dequantized is not None and dequantized[1].size == 1 else None
    if c is None or np.size(c) != 1 or not np.issubdtype(np.asarray(c).dtype, np.floating):
        return None
    return float(np.asarray(c).reshape(()))


def _biases_at(readers: list[ir.Node], x_scale: float) -> list[tuple] | None:
    """The int32 biases of ``readers`` requantized for a new input scale ``x_scale``: (node, input index,
    int32 values, scale ``x_scale * w_scale``) each, or None when one cannot be (a bias that no longer
    fits, a MatMul whose bias sits in a fused Add, a bias that is not a DequantizeLinear of constants).
    A runtime fuses DQ -> Conv -> Q into an integer conv only when the bias scale is the input scale
    times the weight scale (ONNX Runtime 1.31 otherwise leaves the conv float, at a large cost in
    speed: docs/experiments.md, "ONNX Runtime kernels")."""
    out = []
    for node in readers:
        if node.op_type == "MatMul":
            adds = [u.node for u in node.outputs[0].uses() if u.node.op_type == "Add"]
            if any(_int32_dequantized(v) is not None for a in adds for v in a.inputs):
                return None
            continue
        i = ops.bias_input(node)  # Conv, ConvTranspose, Gemm: input 2
        if i is None or len(node.inputs) <= i or node.inputs[i] is None:
            continue
        real = _int32_dequantized(node.inputs[i])
        w = node.inputs[1].producer()
        w_scale = const_array(w.inputs[1]) if w is not None and w.op_type == "DequantizeLinear" else None
        if real is None or w_scale is None:
            return None
        bias_scale = int32_bias_scale(x_scale, w_scale, real.shape)
        if np.any(np.abs(real) / bias_scale.astype(np.float64) > BIAS_LIMIT):
            return None
        out.append((node, i, numerics.quantize(real.astype(np.float32), bias_scale, 0, axis=0, out_dtype="int32"),
                    bias_scale))
    return out


def _int32_dequantized(v: ir.Value | None) -> np.ndarray | None:
    """The real values of an int32 DequantizeLinear of constants (a quantized bias), else None."""
    dequantized = _dequantized_constant(v)
    return dequantized[0] if dequantized is not None and dequantized[1].dtype == np.int32 else None


def shifts_as_zero_points(graph: ir.Graph) -> int:
    """``DQ(x_q; s, z) -> Add(c) -> Q -> DQ`` with a scalar constant ``c`` becomes ``DQ(x_q; s, z - k)``,
    ``k = round(c / s)``: the same integers read as ``x + k*s``, with no integer add at run time (a
    QLinearAdd over the whole map in ONNX Runtime). Exactly what a requantizing add to the input's own
    scale computes (``round(q + c/s) = q + round(c/s)``); the add's calibrated output qparams are not
    used. These are the shifts ``prepare`` cannot fold: Paddle's affine-block shifts before padded
    convs (figures: docs/experiments.md, "Realize rewrites"). The readers' int32 biases are
    requantized to the new input scale (:func:`_biases_at`). Skipped when the shifted zero point leaves
    its type's range or a bias cannot follow. Returns the number of adds removed."""
    removed = 0
    for add in list(graph):
        if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.inputs) != 2:
            continue
        for i in (0, 1):
            dq_x, c = add.inputs[i].producer(), _scalar_constant(add.inputs[1 - i])
            if dq_x is not None and dq_x.op_type == "DequantizeLinear" and const_array(dq_x.inputs[0]) is None:
                break
        else:
            continue
        y = add.outputs[0]
        uses = list(y.uses())
        if c is None or y.is_graph_output() or len(uses) != 1 or uses[0].node.op_type != "QuantizeLinear":
            continue
        q = uses[0].node
        dq_ys = [u.node for u in q.outputs[0].uses()]
        if (q.outputs[0].is_graph_output() or not dq_ys or any(d.op_type != "DequantizeLinear" for d in dq_ys)
                or len(dq_x.inputs) < 3 or dq_x.inputs[2] is None):
            continue
        scale, zp = const_array(dq_x.inputs[1]), const_array(dq_x.inputs[2])
        if scale is None or zp is None or scale.size != 1 or zp.size != 1:
            continue
        k = int(np.rint(c / float(scale.reshape(()))))
        shifted = int(zp.reshape(())) - k
        info = np.iinfo(zp.dtype)
        if not info.min <= shifted <= info.max:
            continue
        readers = [u.node for d in dq_ys for u in d.outputs[0].uses()]
        biases = _biases_at(readers, float(scale.reshape(())))
        if biases is None:
            continue
        b = Builder(graph, add.name or "Add")
        out = b.op("DequantizeLinear", [dq_x.inputs[0], dq_x.inputs[1], b.const(np.asarray(shifted, zp.dtype),
                                                                               "shifted_zero_point")],
                   hint="DequantizeLinear")
        out.type, out.shape = dq_ys[0].outputs[0].type, dq_ys[0].outputs[0].shape
        graph.insert_after(dq_x, b.nodes)
        for d in dq_ys:
            replace_value(graph, d.outputs[0], out)
        for holder, index, q_bias, bias_scale in biases:
            old = holder.inputs[index].producer()
            quantized_constant(graph, holder, index, q_bias, bias_scale, np.zeros(np.shape(bias_scale), np.int32), 0,
                                "rescaled_bias")
            _drop_if_dead(graph, old)
        constant_dq = add.inputs[1 - i].producer()
        graph.remove([*dq_ys, q, add], safe=True)
        for n in (constant_dq, dq_x):
            if n is not None:
                _drop_if_dead(graph, n)
        removed += 1
    return removed


def realize_qdq(float_model: ir.Model, plan, value_qparams: dict[str, QParams], config) -> ir.Model:
    """A copy of ``float_model`` with Q/DQ for every target of ``plan``'s matches (each match's
    pattern realizes it: :meth:`qnnx.autoquant.patterns.Pattern.realize`), shaped for ONNX Runtime's
    kernels: :func:`shifts_as_zero_points` (a constant add
    becomes a zero point, rounded to the input's scale)."""
    rewriter = QDQRewriter(float_model, plan, value_qparams, config)
    for match in plan.matches:
        pattern_named(match.pattern).realize(match, rewriter)
    shifts_as_zero_points(rewriter.graph)
    return rewriter.finish()
