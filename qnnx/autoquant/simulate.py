"""The simulated model: a plan's patterns in affine space with qparams as graph inputs (seed 002).

Each quantized activation ``v`` becomes

    Where(v.enabled, simulated_dequantize(simulated_quantize(v, v.scale, v.zero_point), ...), v)

with three new graph inputs: ``<v>.scale`` (float32 scalar; 1-D of C along axis 1 for a per-channel
depthwise conv input), ``<v>.zero_point`` (int32, the same shape) and
``<v>.enabled`` (bool scalar; false passes the float value through untouched, so a value whose
qparams are not chosen yet is not quantized; a layer's bias, quantized at its input's scale, stays
float with it). Weights are int8 constants as realize makes them (their qparams need no data);
a biased layer's weights are quantized at run time instead, because realize raises a weight scale
where the int32 bias would not fit at ``x_scale * w_scale`` and ``x_scale`` is now an input.

Calibration changes qparams by feeding other inputs to the same session, never rebuilding. Fed
the qparams of a calibration result, the lowered model gives the QDQ model's outputs bit for bit
on ONNX Runtime (without graph optimizations, which would turn the QDQ model into integer kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from qnnx import numerics
from qnnx.autoquant.config import QuantConfig
from qnnx.autoquant.patterns import pattern_named
from qnnx.autoquant.qdq import BIAS_LIMIT, AffineRewriter, insert_after, quantized_constant
from qnnx.calibrate import QParams
from qnnx.dialect import DOMAIN
from qnnx.dtypes import int_type
from qnnx.ir import Builder


@dataclass(frozen=True)
class QParamInputs:
    """The graph inputs that carry one activation's qparams, and the value calibration observes
    (the float value entering its simulated_quantize: a graph output's own name moves to the result)."""

    scale: str
    zero_point: str
    enabled: str
    observed: str
    zero_point_dtype: str = "int32"  # the activation type in the standard form
    dtype: str = "uint8"  # the integer type the pair rounds and clips to
    channels: int | None = None  # per-channel qparams (axis 1) of this many channels; None: per-tensor


def _qparam_input(graph: ir.Graph, name: str, dtype: ir.DataType, channels: int | None = None) -> ir.Value:
    v = ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape([] if channels is None else [channels]))
    graph.inputs.append(v)
    return v


class SimulatedRewriter(AffineRewriter):
    def __init__(self, float_model, plan, config, standard: bool = False):
        super().__init__(float_model, plan, config)
        self.inputs: dict[str, QParamInputs] = {}
        self.enabled: dict[str, ir.Value] = {}  # scale input name -> the same value's enabled input
        self.dtype = int_type(config.activation_dtype)
        self.standard = standard

    def _pair(self, b: Builder, x: ir.Value, s: ir.Value, z: ir.Value, dtype, hint: str, **attrs) -> ir.Value:
        """quantize -> dequantize of ``x``: the dialect's simulated ops, or ONNX's QuantizeLinear ->
        DequantizeLinear (one kernel each on ONNX Runtime, the same numbers: division, half-to-even)."""
        if self.standard:
            q = b.op("QuantizeLinear", [x, s, z], hint=f"{hint}_QuantizeLinear", **attrs)
            q.type = ir.TensorType(dtype.onnx)
            dq = b.op("DequantizeLinear", [q, s, z], hint=f"{hint}_DequantizeLinear", **attrs)
        else:
            q = b.op("simulated_quantize", [x, s, z], domain=DOMAIN, out_dtype=dtype.name,
                     hint=f"{hint}_simulated_quantize", **attrs)
            q.type = ir.TensorType(ir.DataType.FLOAT)
            dq = b.op("simulated_dequantize", [q, s, z], domain=DOMAIN, hint=f"{hint}_simulated_dequantize", **attrs)
        q.shape = x.shape
        dq.type, dq.shape = ir.TensorType(ir.DataType.FLOAT), x.shape
        return dq

    def activation(self, v, readers):
        graph = self.graph
        zp_type = self.dtype if self.standard else int_type("int32")
        channels = int(v.shape[1]) if v.name in self.per_channel else None
        s = _qparam_input(graph, f"{v.name}.scale", ir.DataType.FLOAT, channels)
        z = _qparam_input(graph, f"{v.name}.zero_point", zp_type.onnx, channels)
        on = _qparam_input(graph, f"{v.name}.enabled", ir.DataType.BOOL)
        b = Builder(graph, v.name)
        attrs = {"axis": 1} if channels is not None else {}
        out = b.op("Where", [on, self._pair(b, v, s, z, self.dtype, "activation", **attrs), v],
                   hint="quantized_or_float")
        out.type, out.shape = ir.TensorType(ir.DataType.FLOAT), v.shape
        name = v.name
        insert_after(graph, v, b.nodes, out, readers)  # a graph output's name moves to ``out``
        self.inputs[name] = QParamInputs(s.name, z.name, on.name, v.name, zp_type.name, self.dtype.name, channels)
        self.enabled[s.name] = on
        return s

    def _per_output(self, b: Builder, x: ir.Value, n_out: int) -> ir.Value:
        """The input scale ``x`` (a scale input: a scalar, or 1-D of C for a per-channel depthwise input) in each
        of ``n_out`` output channels' accumulator (qdq.per_output_channel)."""
        if len(x.shape) == 0:
            return x
        index = b.const(numerics.depthwise_per_output(np.arange(x.shape[0], dtype=np.int64), n_out),
                        "input_channel_of_output")
        out = b.op("Gather", [x, index], axis=0, hint="input_scale_per_output")
        out.type, out.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([n_out])
        return out

    def weight(self, anchor, idx, w, qp, axis, x, bias):
        q = numerics.quantize(w, qp.scale, qp.zero_point, axis=axis if axis is not None else -1, out_dtype=qp.dtype)
        scale = np.asarray(qp.scale, np.float32)
        need = None
        if bias is not None and x is not None:
            need = np.abs(bias.reshape(-1)) if scale.ndim else np.float32(np.abs(bias).max(initial=0.0))
        if need is None or (scale.ndim and need.shape != scale.shape):  # constant int8 weights, exactly realize's
            for i in idx:
                quantized_constant(self.graph, anchor, i, q, qp.scale, qp.zero_point, axis, f"in{i}")
            return None if need is None else Builder(self.graph, anchor.name).const(scale, "weight_scale")
        # qdq._fit_bias at run time: scale = max(scale, |bias| / (x_scale * 2**30)), then quantize the weights.
        b = Builder(self.graph, anchor.name)
        limit = b.op("Mul", [self._per_output(b, x, w.shape[0]), b.const(np.float32(BIAS_LIMIT), "bias_limit")],
                     hint="bias_limit_scale")
        need_scale = b.op("Div", [b.const(need.astype(np.float32), "bias_abs"), limit], hint="bias_needs_scale")
        scale_c = b.const(scale, "weight_scale")
        fitted = b.op("Max", [scale_c, need_scale], hint="fitted_weight_scale")
        fitted.type, fitted.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape(scale.shape)
        attrs = {"axis": axis} if axis is not None and scale.size > 1 else {}
        w_type = int_type(qp.dtype)
        zp = b.const(np.zeros(scale.shape, w_type.numpy if self.standard else np.int32), "weight_zero_point")
        wf = b.const(w, "weight_float")
        if not self.standard:
            dq = self._pair(b, wf, fitted, zp, w_type, "weight", **attrs)
        else:
            # Quantize the weights at run time only when a channel's bias does not fit (rare): doing it on
            # every run is a large share of the simulated run time. Otherwise the constant int8 weights.
            fit = b.op("Greater", [need_scale, scale_c], hint="bias_does_not_fit")
            any_fit = b.op("ReduceMax", [b.op("Cast", [fit], to=ir.DataType.INT32)], keepdims=0, hint="any_fit")
            cond = b.op("Cast", [any_fit], to=ir.DataType.BOOL, hint="refit_weights")
            then_b = Builder(self.graph, f"{anchor.name}/refit")
            then_out = self._pair(then_b, wf, fitted, zp, w_type, "weight", **attrs)
            ax = axis if axis is not None and scale.size > 1 else -1
            constant = numerics.dequantize(q, scale, np.zeros(scale.shape, np.int32), axis=ax).astype(np.float32)
            else_b = Builder(self.graph, f"{anchor.name}/constant")
            else_out = else_b.op("Identity", [b.const(constant, "weight_dequantized")], hint="weight")
            branches = {}
            for key, sub, out in (("then_branch", then_b, then_out), ("else_branch", else_b, else_out)):
                out.type, out.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape(w.shape)
                branches[key] = ir.Graph([], [out], nodes=sub.nodes, name=f"{anchor.name}_{key}")
            dq = b.op("If", [cond], hint="weight_dequantized", **branches)
        dq.type, dq.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape(w.shape)
        self.graph.insert_before(anchor, b.nodes)
        for i in idx:
            anchor.replace_input_with(i, dq)
        return fitted

    def bias(self, holder, idx, bias, x, w):
        b = Builder(self.graph, holder.name)
        scale = b.op("Mul", [self._per_output(b, x, bias.size), w], hint="bias_scale")
        per_axis = w.shape is not None and len(w.shape) > 0 and bias.size > 1
        scale.type, scale.shape = ir.TensorType(ir.DataType.FLOAT), w.shape
        attrs = {"axis": 0} if per_axis else {}
        zp = b.const(np.int32(0), "bias_zero_point")
        q = b.op("simulated_quantize", [b.const(bias, "bias_float"), scale, zp], domain=DOMAIN, out_dtype="int32",
                 hint="bias_q", **attrs)
        dq = b.op("simulated_dequantize", [q, scale, zp], domain=DOMAIN, hint="bias_dq", **attrs)
        # The bias scale needs the input's: while the input passes through in float, so does the bias.
        out = b.op("Where", [self.enabled[x.name], dq, b.const(bias, "bias_float")], hint="bias_quantized_or_float")
        for v in (q, dq, out):
            v.type, v.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape(bias.shape)
        self.graph.insert_before(holder, b.nodes)
        for i in idx:
            holder.replace_input_with(i, out)

    def fold_scale(self, match) -> None:  # pragma: no cover - simulate never folds
        raise AssertionError("simulate keeps the scale pattern's float op")


def simulate_model(float_model: ir.Model, plan, config=None, *,
                   standard: bool = False) -> tuple[ir.Model, dict[str, QParamInputs]]:
    """A copy of ``float_model`` with every match of ``plan`` simulated by its pattern
    (:meth:`qnnx.autoquant.patterns.Pattern.simulate`), in the qnnx dialect (``qnnx.lower`` it to
    run it on ONNX Runtime), and the qparam inputs of each quantized activation by value name.

    ``standard``: activations and weights through ONNX QuantizeLinear -> DequantizeLinear with the
    same run-time qparams instead (the int32 bias stays simulated: QuantizeLinear has no int32).
    The same numbers; what calibration runs, because the exact lowering of simulated_quantize is a
    dozen elementwise ops per tensor, many times slower than the float model (figures:
    docs/experiments.md, "Calibration and the simulated model")."""
    config = config or QuantConfig()
    rewriter = SimulatedRewriter(float_model, plan, config, standard)
    for match in plan.matches:
        pattern_named(match.pattern).simulate(match, rewriter)
    model = rewriter.finish()
    model.opset_imports.setdefault(DOMAIN, 1)
    model.graph.opset_imports.setdefault(DOMAIN, 1)
    return model, rewriter.inputs


def qparam_feed(inputs: dict[str, QParamInputs], qparams: dict[str, QParams],
                enabled: set[str] | None = None) -> dict[str, np.ndarray]:
    """Feeds for the qparam inputs: ``qparams`` by value name for the values in ``enabled`` (all that
    have qparams when None); every other value passes through in float."""
    feed = {}
    for name, inp in inputs.items():
        qp = qparams.get(name)
        on = qp is not None and (enabled is None or name in enabled)
        shape = () if inp.channels is None else (inp.channels,)
        if qp is not None and np.asarray(qp.scale).size != int(np.prod(shape)):
            raise AssertionError(f"{name!r}: a simulated activation takes qparams of shape {shape}")
        zp = np.zeros(shape, np.int64)
        if on:  # qparams of another 8-bit type (int8 symmetric in a uint8 pair): the same grid, shifted
            zp = np.asarray(qp.zero_point, np.int64).reshape(shape) + int_type(inp.dtype).qmin - int_type(qp.dtype).qmin
            if int_type(inp.dtype).bits != int_type(qp.dtype).bits:
                raise AssertionError(f"{name!r}: {qp.dtype} qparams in a simulated {inp.dtype} pair")
        feed[inp.scale] = np.broadcast_to(np.asarray(qp.scale if on else 1.0, np.float32), shape).reshape(shape)
        feed[inp.zero_point] = np.asarray(zp).astype(int_type(inp.zero_point_dtype).numpy)
        feed[inp.enabled] = np.asarray(on)
    return feed
