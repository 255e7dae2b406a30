"""Pre-quantization cleanup of a float model.

- opset below 13 is converted to 13 (per-axis QuantizeLinear needs it) with ONNX's version
  converter — at the load boundary, before any pass;
- constant folding and Constant nodes -> initializers (onnxscript's optimizer, without its rules that
  trust a file's declared shapes or match constants within a tolerance: :func:`optimize_exactly`);
- BatchNormalization folded into Conv / ConvTranspose / Gemm (onnxscript rewrite rules);
- LayerNorm spelled out in primitive ops (ReduceMean, Sub, Pow, ReduceMean, Add eps, Sqrt, Div,
  Mul, Add: exporters for opset < 17, Paddle's) fused into one ``LayerNormalization``, converting the
  opset to 17 for it: the normalization rule then keeps its input float, so the variance and
  ``var + eps`` are not quantized (8-bit steps there moved every row's scale), and ONNX Runtime runs one
  kernel instead of nine ops;
- an ``Add(c)`` of a constant per input channel (or scalar) feeding only an unpadded ``Conv`` (1x1
  pointwise convs after Paddle's learnable affine blocks) folded into that conv's bias:
  ``conv(x + c) = conv(x) + sum(W * c)`` when no padding sees the shift;
- ``MatMul(x, W) -> Add(b)`` on 2-D x with constant W and vector b fused into ``Gemm`` (one integer
  op with an int32 bias, instead of a matmul and an add each requantizing);
- ``HardSwish`` spelled out as ``x * Clip(x + 3, 0, 6) / 6`` (what ONNX Runtime runs in integer ops);
- per-output-channel affine ops after a Conv (``Mul`` / ``Add`` by a constant: bias adds, Paddle's
  learnable affine blocks) folded into its weights and bias, so they cost no integer op at all;
- ONNX shape inference, non-strict, so dynamic batch/height/width never stop it.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import numpy as np
import onnx
import onnx.version_converter
import onnx_ir as ir
import onnx_ir.passes.common as passes
import onnxscript.optimizer
import onnxscript.rewriter
from onnx_ir.passes.common import ShapeInferencePass
from onnxscript.rewriter import pattern as orp
from onnxscript.rewriter import rewrite
from onnxscript.rewriter.rules.common import (dropout_inference_rule, dropout_zero_rule, fuse_batchnorm_into_conv_rule,
                                              fuse_batchnorm_into_conv_transpose_rule, fuse_batchnorm_into_gemm_rule,
                                              materialize_reshape_shape_rule)

from qnnx.errors import QnnxError
from qnnx.ir import Builder, const_array, drop_unused_initializers, load_model, replace_value

MIN_OPSET = 13
LAYER_NORM_OPSET = 17  # LayerNormalization's first opset


@dataclass(frozen=True)
class Prepared:
    """:func:`prepared`'s result: the cleaned float model, the user's name of each node folded into
    another -> that node's name (so ``exclude_nodes`` naming a folded Add excludes the Conv that now
    computes it), and the op types of the model as given."""

    model: ir.Model
    renames: dict[str, str]
    source_op_types: frozenset[str]


def prepare(model, *, min_opset: int = MIN_OPSET, exclude_nodes=(), exclude_op_types=()) -> ir.Model:
    """The cleaned float model (:func:`prepared` without its records)."""
    return prepared(model, min_opset=min_opset, exclude_nodes=exclude_nodes, exclude_op_types=exclude_op_types).model


# The rewrites prepare applies, by name (``skip`` leaves some out: the prepare stage does when a rewrite
# changed what the model computes).
REWRITES = ("optimize", "fuse_batchnorm", "fuse_layer_norm", "fold_affine_into_conv", "fold_shift_into_conv",
            "fuse_matmul_add_into_gemm", "spell_out_hard_swish")


def prepared(model, *, min_opset: int = MIN_OPSET, exclude_nodes=(), exclude_op_types=(),
             skip: frozenset[str] = frozenset()) -> Prepared:
    """The cleaned float model and what preparing it renamed; ``min_opset`` is raised to 21 by callers
    that emit 16-bit Q/DQ. ``exclude_nodes`` (names or glob patterns) / ``exclude_op_types``: what the
    user keeps float; a HardSwish among them stays whole. ``skip``: names of :data:`REWRITES` not applied."""
    unknown = set(skip) - set(REWRITES)
    if unknown:
        raise ValueError(f"unknown prepare rewrites {sorted(unknown)}")
    m = load_model(model)
    source_op_types = frozenset(n.op_type for n in m.graph)
    opset = m.opset_imports.get("", None)
    if opset is None:
        raise QnnxError("model has no default-domain opset import")
    # Rewrites below replace nodes; the user's node names (used by exclude_nodes and reports)
    # are restored from the output values, whose names rewrites keep.
    user_names = {o.name: n.name for n in m.graph for o in n.outputs if n.name and o.name}
    if opset < min_opset:
        try:
            proto = onnx.version_converter.convert_version(ir.to_proto(m), min_opset)
        except Exception as e:  # the converter raises RuntimeError/ValueError with C++ messages
            raise QnnxError(f"cannot convert opset {opset} to {min_opset}: {str(e).splitlines()[0][:200]}") from None
        m = ir.from_proto(proto)
    if "optimize" not in skip:
        optimize_exactly(m)
    if "fuse_batchnorm" not in skip:
        m = rewrite(m, pattern_rewrite_rules=[fuse_batchnorm_into_conv_rule, fuse_batchnorm_into_conv_transpose_rule,
                                              fuse_batchnorm_into_gemm_rule])
    try:
        m = ShapeInferencePass(check_type=False, strict_mode=False, data_prop=True)(m).model
    except Exception:  # best effort: rules that need a shape say so
        pass
    if "fuse_layer_norm" not in skip:
        m = fuse_layer_norm(m)
    folded: dict[str, ir.Node] = {}  # user name of a node folded away -> the node that absorbed it
    meanings: dict[ir.Node, str] = {}  # a conv that absorbed a Mul/Add -> the value name it now computes
    if "fold_affine_into_conv" not in skip and fold_affine_into_conv(m.graph, folded, meanings):  # a bias Add folded away may have hidden a BatchNorm from its conv
        # The fusion replaces such a conv by one that makes the BatchNorm's output: follow it by that name.
        after = {key: [o.name for u in node.outputs[0].uses() for o in u.node.outputs] for key, node in folded.items()}
        m = rewrite(m, pattern_rewrite_rules=[fuse_batchnorm_into_conv_rule, fuse_batchnorm_into_conv_transpose_rule])
        producers = {o.name: n for n in m.graph for o in n.outputs}
        for key, node in list(folded.items()):
            if node.graph is not m.graph:
                found = [producers[name] for name in after[key] if name in producers]
                if found:
                    folded[key] = found[0]
        fold_affine_into_conv(m.graph, folded, meanings)
    if "fold_shift_into_conv" not in skip:
        fold_shift_into_unpadded_conv(m.graph, folded)
    if "fuse_matmul_add_into_gemm" not in skip:
        fuse_matmul_add_into_gemm(m.graph, folded)
    if "HardSwish" not in exclude_op_types and "spell_out_hard_swish" not in skip:
        spell_out_hard_swish(m.graph, frozenset(n.name for n in m.graph if n.op_type == "HardSwish"
                                                and any(fnmatch.fnmatchcase(n.name, p) for p in exclude_nodes)))
    _restore_names(m.graph, user_names)
    _name_everything(m.graph)
    _name_by_meaning(m.graph, meanings)
    renames = {user_names[name]: node.name for name, node in folded.items()
               if name in user_names and node.graph is m.graph}
    return Prepared(m, renames, source_op_types)


def _identity(op, x, **_):
    return op.Identity(x)


def _exactly(value: float):
    """A rewrite condition: the constant ``c`` holds one element equal to ``value`` exactly and broadcasting it
    leaves ``x``'s shape as it is (a scalar, or a one-element tensor of no higher rank than ``x``)."""
    def condition(context, x, c, **_) -> bool:
        a = c.const_value.numpy() if c.const_value is not None else None
        return (a is not None and a.size == 1 and a.reshape(-1)[0] == value
                and (a.ndim == 0 or (x.shape is not None and a.ndim <= len(x.shape))))
    return condition


# ``x + 0``, ``x * 1``, ``x - 0``, ``x / 1`` -> x only for an exact 0 or 1: onnxscript's own no-op rules
# match constants within a tolerance (1e-8 absolute), which turned an audio front-end's
# ``Add(x * x, 1e-10)`` into Identity and its silent input into log(0). A one-element tensor counts as
# its value (Paddle exports write x * sigmoid(x * [1.0]) and x + [0.0]).
EXACT_NO_OP_RULES = (
    *orp.RewriteRule(lambda op, x, c: op.Mul(x, c), _identity, _exactly(1)).commute(),
    *orp.RewriteRule(lambda op, x, c: op.Add(x, c), _identity, _exactly(0)).commute(),
    orp.RewriteRule(lambda op, x, c: op.Sub(x, c), _identity, _exactly(0)),
    orp.RewriteRule(lambda op, x, c: op.Div(x, c), _identity, _exactly(1)),
    dropout_zero_rule,
    dropout_inference_rule,
)


def _float_rewrite_rules() -> list:
    """onnxscript's default rewrite rules with its tolerant no-op rules replaced by exact ones (first, as
    onnxscript orders them), and without the rule that trusts declared shapes: ``materialize_reshape_shape``
    replaces a computed Reshape shape by the output's shape as the file declares it, and a declaration can
    be wrong, which changes what the model computes (an example: docs/benchmarks.md, ddddocr). onnxscript
    exposes the default list and the no-op set only under private names; this is the one place qnnx reads
    them."""
    dropped = set(onnxscript.rewriter._no_op.rules.rules) | {materialize_reshape_shape_rule}
    return [*EXACT_NO_OP_RULES, *(r for r in onnxscript.rewriter._DEFAULT_REWRITE_RULES if r not in dropped)]


def optimize_exactly(m: ir.Model) -> None:
    """onnxscript's optimizer (one pass of constant folding and its default rewrites, then its
    clean-up passes, as ``onnxscript.optimizer.optimize(m, num_iterations=1)``), in place, with rewrites
    that keep what the model computes: no-op rules match exact constants only, and no rule replaces a
    computed shape by a declared one (:func:`_float_rewrite_rules`)."""
    passes.InlinePass()(m)
    onnxscript.optimizer.fold_constants(m, onnx_shape_inference=True)
    for p in (onnxscript.rewriter.RewritePass(_float_rewrite_rules()), passes.RemoveUnusedNodesPass(),
              passes.RemoveUnusedFunctionsPass(), passes.RemoveUnusedOpsetsPass(), passes.RemoveUnusedNodesPass(),
              passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
              passes.LiftSubgraphInitializersToMainGraphPass(), passes.DeduplicateInitializersPass(),
              passes.CommonSubexpressionEliminationPass(), passes.NameFixPass()):
        p(m)


class _SpelledOutLayerNorm(orp.RewriteRuleClassBase):
    """``scale * (x - mean) / sqrt(mean((x - mean)^2) + eps) + bias`` over the last axis ->
    ``LayerNormalization(x, scale, bias, axis=-1, epsilon=eps)``. ReduceMean's axes are an attribute
    before opset 18 and an input from 18 on; both are accepted and checked to be the last axis only."""

    def pattern(self, op, x, eps, scale, bias):
        mean = op.ReduceMean(x, _allow_other_inputs=True, _outputs=["mean"])
        d = op.Sub(x, mean)
        var = op.ReduceMean(orp.OrValue([op.Pow(d, 2.0), op.Mul(d, d)]), _allow_other_inputs=True, _outputs=["var"])
        std = op.Sqrt(op.Add(var, eps))
        normalized = orp.OrValue([op.Div(d, std), op.Mul(d, op.Reciprocal(std))])
        return op.Add(op.Mul(normalized, scale), bias)

    @staticmethod
    def _over_last_axis(reduce: ir.Node, rank: int) -> bool:
        attr = reduce.attributes.get("axes")
        axes = list(attr.value) if attr is not None else None
        if axes is None and len(reduce.inputs) > 1 and reduce.inputs[1] is not None:
            c = const_array(reduce.inputs[1])
            axes = None if c is None else [int(a) for a in np.asarray(c).reshape(-1)]
        keep = reduce.attributes.get("keepdims")
        return axes is not None and len(axes) == 1 and axes[0] in (-1, rank - 1) and (keep is None or keep.value == 1)

    def check(self, context, x, eps, scale, bias, mean, var, **_):
        result = orp.MatchResult()
        if x.dtype not in (ir.DataType.FLOAT, None):
            return result.fail("input is not float32", x)
        rank = len(x.shape) if x.shape is not None else 0  # unknown rank: only axes=[-1] is the last axis
        if not all(self._over_last_axis(v.producer(), rank) for v in (mean, var)):
            return result.fail("ReduceMean is not over the last axis only", mean)
        e, s, b = const_array(eps), const_array(scale), const_array(bias)
        if e is None or e.size != 1 or s is None or b is None or s.ndim > 1 or b.ndim > 1:
            return result.fail("epsilon, scale or bias is not a constant over the last axis", eps)
        width = x.shape[-1] if x.shape is not None and isinstance(x.shape[-1], int) else max(s.size, b.size)
        if s.size not in (1, width) or b.size not in (1, width) or width == 1:
            return result.fail("scale or bias does not match the last axis", scale)
        self._eps, self._width = float(e.reshape(())), width
        return result

    def rewrite(self, op, x, scale, bias, **_):
        def vector(v: ir.Value) -> ir.Value:  # LayerNormalization wants both over the whole last axis
            c = const_array(v)
            if c.shape == (self._width,) and c.dtype == np.float32:
                return v
            full = np.broadcast_to(c.reshape(-1), (self._width,)).astype(np.float32)
            return op.initializer(ir.tensor(full), name=f"{v.name}_over_{x.name}")

        return op.LayerNormalization(x, vector(scale), vector(bias), axis=-1, epsilon=self._eps)


def fuse_layer_norm(m: ir.Model) -> ir.Model:
    """Spelled-out LayerNorms fused (:class:`_SpelledOutLayerNorm`); the opset goes to 17 first when
    there is one to fuse (ONNX's version converter), else the model comes back as it was."""
    rules = [_SpelledOutLayerNorm.rule()]
    if m.opset_imports.get("", 0) >= LAYER_NORM_OPSET:
        return rewrite(m, pattern_rewrite_rules=rules)
    probe = rewrite(ir.from_proto(ir.to_proto(m)), pattern_rewrite_rules=rules)
    if not any(n.op_type == "LayerNormalization" for n in probe.graph):
        return m
    try:
        converted = ir.from_proto(onnx.version_converter.convert_version(ir.to_proto(m), LAYER_NORM_OPSET))
    except Exception:  # the converter's C++ errors: fusing is an optimization, the model stays as it is
        return m
    return rewrite(converted, pattern_rewrite_rules=rules)


def _restore_names(graph: ir.Graph, user_names: dict[str, str]) -> None:
    taken = {n.name for n in graph if n.name}
    for node in graph:
        for o in node.outputs:
            want = user_names.get(o.name)
            if want and node.name != want and want not in taken:
                taken.discard(node.name)
                node.name = want
                taken.add(want)
                break


def _name_by_meaning(graph: ir.Graph, meanings: dict[ir.Node, str]) -> None:
    """A conv that absorbed a following Mul/Add computes that op's output: its output takes that name (after
    node names are restored from output names, so the conv keeps its own node name), and comparisons by
    name against the original model (``qnnx compare``) pair it with what it computes, not with the conv's
    output before the affine op."""
    taken = {v.name for v in graph.inputs} | {o.name for n in graph for o in n.outputs}
    for conv, name in meanings.items():
        if conv.graph is graph and name and name not in taken and not conv.outputs[0].is_graph_output():
            taken.discard(conv.outputs[0].name)
            conv.outputs[0].name = name
            taken.add(name)


def _name_everything(graph: ir.Graph) -> None:
    """Unique node and value names: decisions, reports and calibration outputs refer to them."""
    taken = {v.name for v in graph.inputs} | set(graph.initializers)
    taken |= {n.name for n in graph if n.name} | {o.name for n in graph for o in n.outputs if o.name}
    counter = 0

    def fresh(base: str) -> str:
        nonlocal counter
        while f"{base}_{counter}" in taken:
            counter += 1
        name = f"{base}_{counter}"
        taken.add(name)
        return name

    seen_nodes: set[str] = set()
    for node in graph:
        if not node.name or node.name in seen_nodes:
            node.name = fresh(node.op_type)
        seen_nodes.add(node.name)
        for o in node.outputs:
            if not o.name:
                o.name = fresh(f"{node.name}_out")


def _record_fold(folded: dict, gone: ir.Node, into: ir.Node) -> None:
    """``gone`` (keyed by its first output's name: prepare maps that back to the user's node name) now
    computes inside ``into``; what was folded into ``gone`` earlier follows it."""
    if gone.outputs and gone.outputs[0].name:
        folded[gone.outputs[0].name] = into
    for key, node in list(folded.items()):
        if node is gone:
            folded[key] = into


def _per_output_channel(c: np.ndarray, out_rank: int, channels: int) -> np.ndarray | None:
    """``c`` as a length-``channels`` vector when it broadcasts along the channel axis (1) of a rank
    ``out_rank`` output and nowhere else; None otherwise."""
    if c.ndim > out_rank or not np.issubdtype(c.dtype, np.floating):
        return None
    shape = (1,) * (out_rank - c.ndim) + c.shape
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(c.reshape(-1), (channels,)).astype(np.float32)


def fold_affine_into_conv(graph: ir.Graph, folded: dict | None = None, meanings: dict | None = None) -> int:
    """``Conv -> Mul(c)`` and ``Conv -> Add(c)`` (ConvTranspose too, group 1) with ``c`` constant per output channel (or scalar)
    become the Conv alone, with ``W * c`` / ``b * c`` or ``b + c``. Exact in real arithmetic; the Conv
    must be the Mul/Add's only producer and the Mul/Add the Conv's only consumer. ``meanings``: each Conv
    that absorbed one -> the name of the value it now computes (the last absorbed op's output), which
    :func:`prepared` gives its output once node names are settled. Returns #folded."""
    folds = {} if folded is None else folded
    n_folded = 0
    changed = True
    while changed:
        changed = False
        for conv in list(graph):
            if conv.op_type not in ("Conv", "ConvTranspose") or conv.domain not in ("", "ai.onnx") or len(conv.inputs) < 2:
                continue
            group = conv.attributes["group"].value if "group" in conv.attributes else 1
            if conv.op_type == "ConvTranspose" and group != 1:
                continue
            # Output channels: axis 0 of Conv weights, axis 1 of ConvTranspose weights (C_in x C_out x k...).
            w_axis = 1 if conv.op_type == "ConvTranspose" else 0
            w = const_array(conv.inputs[1])
            b = const_array(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] is not None else None
            out = conv.outputs[0]
            uses = list(out.uses())
            if w is None or w.dtype != np.float32 or (len(conv.inputs) > 2 and conv.inputs[2] is not None and b is None):
                continue
            if len(uses) != 1 or out.is_graph_output() or out.shape is None:
                continue
            nxt = uses[0].node
            if nxt.op_type not in ("Mul", "Add") or nxt.domain not in ("", "ai.onnx") or nxt.outputs[0].is_graph_output():
                continue
            c = const_array(nxt.inputs[1 - uses[0].idx])
            channels = w.shape[w_axis]
            vec = _per_output_channel(c, len(out.shape), channels) if c is not None else None
            if vec is None:
                continue
            bias = np.zeros(channels, np.float32) if b is None else b.astype(np.float32)
            if nxt.op_type == "Mul":
                shape = [1] * w.ndim
                shape[w_axis] = -1
                w = (w * vec.reshape(shape)).astype(np.float32)
                bias = bias * vec
            else:
                bias = bias + vec
            builder = Builder(graph, conv.name or "Conv")
            new_w = builder.const(w, "folded_weight")
            new_b = builder.const(bias.astype(np.float32), "folded_bias")
            conv.replace_input_with(1, new_w)
            _set_bias(conv, new_b)
            _record_fold(folds, nxt, conv)
            if meanings is not None:
                meanings[conv] = nxt.outputs[0].name
            replace_value(graph, nxt.outputs[0], out)
            graph.remove(nxt, safe=True)
            n_folded += 1
            changed = True
    drop_unused_initializers(graph)
    return n_folded


def _set_bias(conv: ir.Node, bias: ir.Value) -> None:
    """``bias`` as the (Conv/ConvTranspose) node's third input, added when it had none."""
    if len(conv.inputs) < 3:
        conv.resize_inputs(3)
    conv.replace_input_with(2, bias)


def _unpadded(conv: ir.Node) -> bool:
    pads = conv.attributes.get("pads")
    auto_pad = conv.attributes.get("auto_pad")
    return (pads is None or not any(pads.value)) and (auto_pad is None or auto_pad.value in ("NOTSET", "VALID"))


def fold_shift_into_unpadded_conv(graph: ir.Graph, folded: dict | None = None) -> int:
    """``Add(x, c) -> Conv`` with ``c`` constant per input channel (or scalar), the Conv unpadded and the
    Add's only reader: the Conv reads ``x`` and its bias gains ``sum_{c, k} W[o, c, k] * c[c]`` (within
    the output's group). Exact in real arithmetic: with no padding every tap reads a shifted value.
    Saves an integer add per affine block (a requantizing QLinearAdd over the whole map). Returns #folded."""
    n_folded = 0
    for conv in list(graph):
        if conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx") or len(conv.inputs) < 2 or not _unpadded(conv):
            continue
        add = conv.inputs[0].producer()
        w = const_array(conv.inputs[1])
        has_b = len(conv.inputs) > 2 and conv.inputs[2] is not None
        b = const_array(conv.inputs[2]) if has_b else None
        if (add is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx") or w is None
                or w.dtype != np.float32 or w.ndim < 3 or (has_b and b is None)):
            continue
        y = add.outputs[0]
        if len(y.uses()) != 1 or y.is_graph_output() or y.shape is None:
            continue
        for idx in (0, 1):
            c = const_array(add.inputs[1 - idx])
            x = add.inputs[idx]
            if c is not None and const_array(x) is None:
                break
        else:
            continue
        group = conv.attributes["group"].value if "group" in conv.attributes else 1
        per_group = w.shape[1]
        vec = _per_output_channel(c, len(y.shape), per_group * group)  # channel axis 1 of the conv input
        # The Add must not broadcast x (x[1,1,H,W] + c[1,C,1,1] has C channels only after the Add).
        if vec is None or x.dtype not in (ir.DataType.FLOAT, None) or x.shape is None or list(x.shape) != list(y.shape):
            continue
        # Output o of group g reads input channels g*per_group .. (g+1)*per_group - 1 through W[o, :].
        out_group = np.arange(w.shape[0]) // (w.shape[0] // group)
        shift = vec.reshape(group, per_group)[out_group]  # (C_out, per_group)
        delta = (w.astype(np.float64).sum(axis=tuple(range(2, w.ndim))) * shift).sum(axis=1)
        bias = np.zeros(w.shape[0], np.float64) if b is None else b.astype(np.float64)
        builder = Builder(graph, conv.name or "Conv")
        new_b = builder.const((bias + delta).astype(np.float32), "shifted_bias")
        conv.replace_input_with(0, x)
        _set_bias(conv, new_b)
        if folded is not None:
            _record_fold(folded, add, conv)
        graph.remove(add, safe=True)
        n_folded += 1
    drop_unused_initializers(graph)
    return n_folded


def fuse_matmul_add_into_gemm(graph: ir.Graph, folded: dict | None = None) -> int:
    """``MatMul(x, W) -> Add(b)`` -> ``Gemm(x, W, b)`` when x is 2-D, W a constant matrix and b a
    constant vector over W's columns (or a scalar). Returns #fused."""
    fused = 0
    for mm in list(graph):
        if mm.op_type != "MatMul" or mm.domain not in ("", "ai.onnx"):
            continue
        x, w_v = mm.inputs
        w = const_array(w_v)
        out = mm.outputs[0]
        uses = list(out.uses())
        if (w is None or w.ndim != 2 or x.shape is None or len(x.shape) != 2 or len(uses) != 1
                or out.is_graph_output()):
            continue
        add = uses[0].node
        b = const_array(add.inputs[1 - uses[0].idx]) if add.op_type == "Add" else None
        if b is None or add.domain not in ("", "ai.onnx") or not np.issubdtype(b.dtype, np.floating):
            continue
        if b.size not in (1, w.shape[1]) or (b.ndim == 2 and b.shape[0] != 1) or b.ndim > 2:
            continue
        builder = Builder(graph, mm.name or "MatMul")
        bias = builder.const(np.broadcast_to(b.reshape(-1), (w.shape[1],)).astype(np.float32), "gemm_bias")
        gemm = ir.Node("", "Gemm", [x, w_v, bias], name=mm.name, num_outputs=1)
        gemm.outputs[0].name = add.outputs[0].name + "_gemm"
        gemm.outputs[0].type, gemm.outputs[0].shape = add.outputs[0].type, add.outputs[0].shape
        graph.insert_before(mm, gemm)
        if folded is not None:
            _record_fold(folded, add, gemm)
            _record_fold(folded, mm, gemm)
        replace_value(graph, add.outputs[0], gemm.outputs[0])  # a graph output keeps its name, now on the Gemm
        graph.remove([add, mm], safe=True)
        fused += 1
    drop_unused_initializers(graph)
    return fused


def spell_out_hard_swish(graph: ir.Graph, keep: frozenset[str] = frozenset()) -> int:
    """``HardSwish(x)`` -> ``Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6)``, PP-OCR's own spelling, except the
    nodes named in ``keep``. ONNX Runtime has no integer HardSwish: between a DequantizeLinear and a
    QuantizeLinear it runs in float. Spelled out, the Add runs as QLinearAdd (the Clip taken into its
    QuantizeLinear's range), the Mul as QLinearMul and the ``/ 6`` as a rescaled DequantizeLinear
    (patterns.ScalePattern), so a model exported with single HardSwish ops (torch from opset 14 on)
    runs integer through them (figures: docs/experiments.md, "Prepare rewrites"). Returns #rewritten."""
    rewritten = 0
    constants = None  # 3, 0 and 6, shared by every hard-swish (as prepare's folding leaves PP-OCR's)
    for node in list(graph):
        if node.op_type != "HardSwish" or node.domain not in ("", "ai.onnx") or node.name in keep:
            continue
        x, y = node.inputs[0], node.outputs[0]
        if x is None or x.dtype not in (ir.DataType.FLOAT, None):
            continue
        if constants is None:
            shared = Builder(graph, "HardSwish")
            constants = [shared.const(np.array(c, np.float32), hint) for c, hint in ((3.0, "three"), (0.0, "zero"),
                                                                                    (6.0, "six"))]
        three, zero, six = constants
        b = Builder(graph, node.name or "HardSwish")
        gate = b.op("Clip", [b.op("Add", [x, three], hint="shift"), zero, six], hint="gate")
        out = b.op("Div", [b.op("Mul", [x, gate], hint="product"), six], hint="scaled")
        for new in b.nodes:
            for v in new.outputs:  # elementwise: x's type and shape
                v.type, v.shape = x.type, x.shape
            graph.insert_before(node, new)
        name = y.name
        replace_value(graph, y, out)
        graph.remove(node, safe=True)
        out.name = name  # readers and user names (prepare restores node names by output) follow it
        rewritten += 1
    return rewritten
