"""Per-channel smoothing of the activations read by linear layers (SmoothQuant).

    y = P(...) -> MatMul(y, W_i) ...   ->   y' = y / s -> MatMul(y', s * W_i) ...

Why. An activation in a transformer keeps the residual stream's outlier channels: a few channels
reach values many times the median channel's, so one per-tensor uint8 scale leaves the ordinary
channels a handful of levels, and every linear layer's input carries that noise. Dividing channel j
by ``s_j`` and multiplying row j of every weight that reads it by ``s_j`` is exact in real arithmetic
and moves the outlier into the weights, which are quantized per output column and have room for it.
``s_j = max|y_j| ** alpha / max_i max|W_i[j, :]| ** (1 - alpha)`` (Xiao et al., 2023).

Who divides by ``s`` (the site's ``kind``):

- ``norm``: the LayerNormalization producing ``y`` (its scale and bias); other readers of ``y`` get
  ``Mul(y', s)``, which keeps the original name.
- ``projection``: the value projection of an attention block, when ``y`` is the attention's context
  (``Reshape(Transpose(MatMul(P, Transpose(Reshape(v)))))``): the context's channel j is a weighted
  sum of ``v``'s channel j, so the projection's weight columns and bias absorb ``1 / s``.
- ``mul``: a new ``Mul(y, 1 / s)`` read only by the MatMuls (a GELU output, for one). OpenVINO folds
  it into the quantizer that follows or into the producing layer's post-ops.

Every value that holds ``y / s`` afterwards (the norm's output; a projection's output through the attention
to the context) is renamed ``<name>_smoothed``: per-layer comparisons by name (``qnnx compare``, the
summary's worst layers, against the original float model) then never pair a scaled value with the
unscaled one.

``sites="norms"`` (the default) smooths LayerNorm outputs only; ``"matmuls"`` every activation read
by MatMuls with a constant weight (NNCF's transformer preset does the same). The alphas and site
choices measured: docs/experiments.md, "Smoothing"; docs/benchmarks.md.

The channel maxima come from the float model on the calibration samples (one streamed pass before
calibration). The stage that calls :func:`smooth` checks the smoothed model against the original.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from qnnx import ops, runtime
from qnnx.ir import Builder, const_array

_MOVES = ("Reshape", "Transpose")  # data movement the projection's channels pass through unchanged


@dataclass(frozen=True)
class SmoothingSite:
    """An activation whose channels can be rescaled: ``value``, the MatMuls reading it as input A
    with a constant rank-2 weight, how ``1 / s`` is applied (``kind``: "norm", "projection" or "mul"), the node that
    absorbs it (the LayerNormalization or the value projection's MatMul; None for "mul"), the
    projection's bias Add (or None), how many other readers ``value`` has, and the values that hold
    ``value / s`` once it is smoothed (``scaled``, ``value`` first: a norm's output; a projection's chain
    from the context back to the projection's output; none for a new Mul, after which ``value`` keeps its
    values)."""

    value: ir.Value
    matmuls: tuple[ir.Node, ...]
    kind: str
    absorber: ir.Node | None = None
    bias: ir.Node | None = None
    other_readers: int = 0
    scaled: tuple[ir.Value, ...] = ()


def _weight(node: ir.Node) -> np.ndarray | None:
    """The constant rank-2 weight of a plain MatMul (input B), else None."""
    if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
        return None
    w = const_array(node.inputs[1])
    return w if w is not None and w.ndim == 2 else None


def _norm_absorbs(node: ir.Node | None) -> bool:
    """A LayerNormalization over the last axis with a per-channel scale (and bias)."""
    if (node is None or node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx")
            or len(node.inputs) < 2):
        return False
    axis = node.attributes["axis"].value if "axis" in node.attributes else -1
    rank = node.outputs[0].shape.rank() if node.outputs[0].shape is not None else None
    if axis != -1 and (rank is None or axis != rank - 1):
        return False  # normalized over several axes: the scale/bias are not one value per channel
    gamma = const_array(node.inputs[1])
    if gamma is None or gamma.ndim != 1:
        return False
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        beta = const_array(node.inputs[2])
        return beta is not None and beta.shape == gamma.shape
    return True


def _only_reader(value: ir.Value) -> ir.Node | None:
    """The one node reading ``value``'s values (a Shape or Size reads none: scaling keeps shapes), else None."""
    uses = [u for u in value.uses() if not ops.shape_only(u.node)]
    return uses[0].node if len(uses) == 1 and not value.is_graph_output() else None


def _moved_path(value: ir.Value) -> list[ir.Value]:
    """``value`` and the values it comes from back through Reshapes and Transposes that have no other reader
    (the last one is where the data movement starts)."""
    path = [value]
    while (p := path[-1].producer()) is not None and p.op_type in _MOVES and _only_reader(p.inputs[0]) is p:
        path.append(p.inputs[0])
    return path


def _value_projection(y: ir.Value, channels: int) -> tuple[ir.Node, ir.Node | None, tuple[ir.Value, ...]] | None:
    """The value projection (MatMul, bias Add or None) whose output columns are ``y``'s channels through
    an attention's ``MatMul(P, ...)`` and data movement only, each value read once, and the values on that
    chain from ``y`` back to the projection's output; else None."""
    context = _moved_path(y)
    attention = context[-1].producer()
    if attention is None or attention.op_type != "MatMul" or len(attention.inputs) != 2:
        return None
    if _weight(attention) is not None:  # a linear layer, not probabilities times values
        return None
    if _only_reader(attention.inputs[1]) is not attention:
        return None
    values = _moved_path(attention.inputs[1])
    v = values[-1]
    if _only_reader(v) is None or (p := v.producer()) is None:
        return None
    bias = None
    if p.op_type == "Add" and len(p.inputs) == 2:
        for i in (0, 1):
            b, m = const_array(p.inputs[i]), p.inputs[1 - i].producer()
            if b is not None and b.shape == (channels,) and m is not None and _only_reader(m.outputs[0]) is p:
                bias, p = p, m
                values.append(m.outputs[0])
                break
        else:
            return None
    w = _weight(p)
    return (p, bias, (*context, *values)) if w is not None and w.shape[1] == channels else None


def smoothing_sites(graph: ir.Graph, sites: str = "norms", *, muls: bool = True,
                    projections: bool = True) -> list[SmoothingSite]:
    """Every activation of ``graph`` to smooth, in graph order (``sites``: "norms" or "matmuls", above;
    ``muls=False``: none that a new Mul would divide; ``projections=False``: no value projection divides,
    a Mul does where ``muls`` allows)."""
    found, seen = [], set()
    order = {node: i for i, node in enumerate(graph)}
    for node in graph:
        w = _weight(node)
        y = node.inputs[0] if w is not None else None
        if y is None or y in seen or y.is_graph_output():
            continue
        seen.add(y)
        channels = w.shape[0]
        matmuls, others, values_read = [], 0, False  # values_read: a reader other than a Shape/Size
        for use in y.uses():
            rw = _weight(use.node) if use.idx == 0 else None
            if rw is not None and rw.shape[0] == channels:
                matmuls.append(use.node)
            else:
                others += 1
                values_read = values_read or not ops.shape_only(use.node)
        matmuls.sort(key=order.__getitem__)  # graph order: a new Mul goes before the first
        producer = y.producer()
        if _norm_absorbs(producer) and const_array(producer.inputs[1]).shape == (channels,):
            found.append(SmoothingSite(y, tuple(matmuls), "norm", producer, other_readers=others, scaled=(y,)))
        elif (sites == "matmuls" and projections and not values_read
              and (projection := _value_projection(y, channels)) is not None):
            absorber, bias, chain = projection
            found.append(SmoothingSite(y, tuple(matmuls), "projection", absorber, bias, others, chain))
        elif sites == "matmuls" and muls:
            found.append(SmoothingSite(y, tuple(matmuls), "mul", other_readers=others))
    return found


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
    """Rescale ``site`` by ``s`` in place: ``1 / s`` where its kind says, ``s`` into its readers' weight rows;
    the values that then hold ``y / s`` are renamed (module docstring)."""
    y, absorber = site.value, site.absorber
    b = Builder(graph, (absorber.name or absorber.op_type) if absorber is not None else
                f"{site.matmuls[0].name or 'MatMul'}_smoothing")

    def inverse(value: ir.Value, hint: str) -> ir.Value:
        return b.const((const_array(value) / s).astype(np.float32), hint)

    if site.kind == "norm":
        absorber.replace_input_with(1, inverse(absorber.inputs[1], "smoothed_scale"))
        if len(absorber.inputs) > 2 and absorber.inputs[2] is not None:
            absorber.replace_input_with(2, inverse(absorber.inputs[2], "smoothed_bias"))
    elif site.kind == "projection":
        absorber.replace_input_with(1, inverse(absorber.inputs[1], "smoothed_weight"))
        if site.bias is not None:
            i = 0 if const_array(site.bias.inputs[0]) is not None else 1
            site.bias.replace_input_with(i, inverse(site.bias.inputs[i], "smoothed_bias"))
    else:
        smoothed = b.op("Mul", [y, b.const((1.0 / s).astype(np.float32), "inverse_scale")], hint="smooth")
        smoothed.type, smoothed.shape = y.type, y.shape
        graph.insert_before(site.matmuls[0], b.nodes)
        for mm in site.matmuls:
            mm.replace_input_with(0, smoothed)
    for mm in site.matmuls:
        mm.replace_input_with(1, b.const((const_array(mm.inputs[1]) * s[:, None]).astype(np.float32),
                                         "smoothed_weight"))
    name = y.name
    for v in site.scaled:
        if v.name:
            v.name = f"{v.name}_smoothed"
    if site.kind == "norm" and site.other_readers:
        restore = b.op("Mul", [y, b.const(s, "smoothing_scale")], hint="unsmooth")
        restore.type, restore.shape = y.type, y.shape
        graph.insert_after(absorber, b.nodes)
        for use in list(y.uses()):
            if use.node not in site.matmuls and use.node is not restore.producer():
                use.node.replace_input_with(use.idx, restore)
        restore.name = name


def smooth(model: ir.Model, data, alpha: float | None, sites: str = "norms", *, muls: bool = True,
           projections: bool = True) -> ir.Model:
    """Apply smoothing to every site of ``model``, in place (``alpha`` None: nothing); the channel
    maxima come from one streamed pass over ``data`` (a bound CalibrationData). ``muls=False``: no site
    a new Mul would divide; ``projections=False``: the value projections' sites are divided by a Mul
    too (or left, without ``muls``). Returns ``model``."""
    found = smoothing_sites(model.graph, sites, muls=muls, projections=projections)
    if alpha is None or not found:
        return model
    values = [site.value for site in found]
    sess = runtime.session(model, outputs=values, purpose=" to calibrate it")
    names = [v.name for v in values]
    absmax: list[np.ndarray | None] = [None] * len(found)
    for feed in data:
        for i, y in enumerate(runtime.run(sess, names, feed)):
            a = np.abs(y).reshape(-1, y.shape[-1]).max(axis=0)
            absmax[i] = a if absmax[i] is None else np.maximum(absmax[i], a)
    scales = [smoothing_scales(a, [const_array(mm.inputs[1]) for mm in site.matmuls], alpha)
              for site, a in zip(found, absmax)]  # from the original weights, before any site changes them
    for site, s in zip(found, scales):
        apply_smoothing(model.graph, site, s)
    return model
