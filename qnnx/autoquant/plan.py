"""Planning: which nodes are quantized, by which pattern, and which values share qparams.

    plan(float model, config) -> Plan           pure: the model is not changed

Every node gets a :class:`~qnnx.autoquant.report.Decision` (quantized by a pattern, or float and
why). Values that only move data (``qnnx.ops.shares_qparams``: Reshape, Transpose, MaxPool, ...) share the qparams
of the value they come from, so the integer model needs no requantize around them. After
calibration, :func:`activation_qparams` derives every activation's qparams from the observed roots,
and :func:`checked` drops the matches whose pattern rejects them.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import onnx_ir as ir

from qnnx import ops
from qnnx.autoquant.config import QuantConfig
from qnnx.autoquant.float_inputs import keep_inputs_float
from qnnx.autoquant.patterns import MatchFail, PatternMatch, Target, is_float_activation, pattern_named, patterns_for
from qnnx.autoquant.report import Decision
from qnnx.calibrate import QParams, qparams_from_range, quant_range
from qnnx.errors import QnnxError
from qnnx.targets import per_channel_depthwise, target
from qnnx.targets.execution import MatchFacts

@dataclass
class Plan:
    matches: list[PatternMatch]
    groups: dict[ir.Value, ir.Value]  # activation value -> the root value whose qparams it shares
    decisions: list[Decision] = field(default_factory=list)

    def observed_roots(self) -> set[ir.Value]:
        """The roots calibration observes: a root whose qparams follow from the plan alone (a fixed
        range, an output scaled from its input) is one too when a pattern reads it as an input, but an
        observer there would be overridden (:func:`activation_qparams`)."""
        return set(self.groups.values()) - known_outputs(self.matches)

    def per_channel_roots(self) -> set[ir.Value]:
        """The roots quantized per channel (axis 1): depthwise conv inputs (per_channel_depthwise_inputs)."""
        return {self.groups.get(t.value, t.value) for m in self.matches for t in m.inputs if t.per_channel}

    def keeping(self, matches: list[PatternMatch]) -> "Plan":
        """The same plan (and decisions) with only ``matches``, its share groups recomputed."""
        return Plan(matches, share_groups(matches), self.decisions)

    def mark_float(self, reasons: dict[int, str]) -> "Plan":
        """Each ``matches[i]`` in ``reasons`` returned to float, its decision saying why."""
        by_anchor = {d.node: d for d in self.decisions}
        for i, why in reasons.items():
            d = by_anchor.get(node_label(self.matches[i].nodes[0]))
            if d is not None:
                d.quantized, d.reason = False, why
        return self.keeping([m for i, m in enumerate(self.matches) if i not in reasons])


def node_label(node: ir.Node) -> str:
    """The name reports use for a node (and ``exclude_nodes`` accepts)."""
    return node.name or f"{node.op_type}({', '.join(v.name or '?' for v in node.outputs)})"


NO_PATTERN = "no quantization pattern for this op"  # the reason of a node no pattern is anchored on


@dataclass(frozen=True)
class Exclusions:
    """What stays float: the node names and op types (``Exclusions.resolve`` turns the user's names and
    glob patterns into them); refinements add nodes with :meth:`with_nodes`."""

    nodes: frozenset[str] = frozenset()
    op_types: frozenset[str] = frozenset()

    @classmethod
    def resolve(cls, model: ir.Model, config: QuantConfig, renames: dict[str, str] | None = None,
                source_op_types: frozenset[str] = frozenset()) -> "Exclusions":
        """``config.exclude_nodes`` (names or ``fnmatch`` glob patterns, case-sensitive) and
        ``exclude_op_types`` on ``model``. ``renames``: prepare's map from a user's node name to the node
        that now computes it; ``source_op_types``: op types of the model as the user gave it (prepare may
        have rewritten some). A name, pattern or op type that matches nothing is an error naming the
        closest candidates."""
        renames = renames or {}
        names = [n.name for n in model.graph]
        op_types = sorted({n.op_type for n in model.graph} | set(source_op_types))
        nodes: set[str] = set()
        for pattern in config.exclude_nodes:
            hits = fnmatch.filter(names, pattern) + [renames[k] for k in fnmatch.filter(renames, pattern)]
            if not hits:
                close = difflib.get_close_matches(pattern, names + list(renames), n=3)
                raise QnnxError(f"--exclude-node {pattern!r} matches no node of the model"
                                + (f"; did you mean {', '.join(map(repr, close))}?" if close else
                                   " (names are as `qnnx inspect` and the quantize report print them; "
                                   "glob patterns such as '/blocks.0/*' are accepted)"))
            nodes.update(hits)
        for op in config.exclude_op_types:
            if op not in op_types:
                close = [o for o in op_types if o.lower() == op.lower()] or difflib.get_close_matches(op, op_types, n=3)
                raise QnnxError(f"--exclude-op {op!r}: no node of that op type in the model"
                                + (f"; did you mean {', '.join(map(repr, close))}?" if close else ""))
        return cls(frozenset(nodes), frozenset(config.exclude_op_types))

    def __contains__(self, node: ir.Node) -> bool:
        return node.name in self.nodes or node.op_type in self.op_types

    def with_nodes(self, names) -> "Exclusions":
        return replace(self, nodes=self.nodes | frozenset(names))


def plan(model: ir.Model, config: QuantConfig, exclusions: Exclusions | None = None) -> Plan:
    """Offer every node to the patterns anchored on its op type, in priority order; the first match
    that does not overlap an earlier one claims its nodes."""
    excluded = exclusions if exclusions is not None else Exclusions.resolve(model, config)
    matches, decisions = [], []
    claimed: set[ir.Node] = set()
    for node in model.graph:
        if node in claimed:
            continue
        candidates = patterns_for(node.op_type) if node.domain in ("", "ai.onnx") else []
        if not candidates:
            if not ops.quiet(node):
                decisions.append(Decision(node_label(node), node.op_type, False, NO_PATTERN))
            continue
        name = node_label(node)
        if node in excluded:
            decisions.append(Decision(name, node.op_type, False, "excluded by the user"))
            continue
        reasons = []
        for pattern in candidates:
            m = pattern.match(node)
            if isinstance(m, MatchFail):
                reasons.append(f"{pattern.name}: {m.reason}")
                continue
            if any(n in claimed for n in m.nodes):
                reasons.append(f"{pattern.name}: overlaps another pattern")
                continue
            cut = [n for n in m.nodes[1:] if n in excluded]
            if cut:  # an excluded activation is not fused: the pattern ends before it
                m = PatternMatch(m.pattern, m.nodes[:1], m.inputs, (Target(m.nodes[0].outputs[0], "activation"),),
                                 m.bias)
                decisions += [Decision(node_label(n), n.op_type, False, "excluded by the user") for n in cut]
            # An excluded node computes in float: its outputs get no quantize (a quantize after it would let
            # a runtime fuse it into an integer kernel anyway), so patterns reading it keep that input float.
            kept_inputs = tuple(t for t in m.inputs if not _from_excluded(t.value, excluded))
            reads_float = len(kept_inputs) != len(m.inputs)
            if reads_float:
                m = PatternMatch(m.pattern, m.nodes, kept_inputs, m.outputs, m.bias)
            kept = {t.value for t in kept_inputs}
            if any(t.scaled_from is not None and t.scaled_from[0] not in kept for t in m.outputs):
                reasons.append(f"{m.pattern}: its input comes from a float (excluded) node, nothing to rescale")
                continue
            if pattern.inputs_share_output_qparams and reads_float:
                # The float input would be quantized by the output's shared scale with its own range
                # never observed, so the range check (ConcatPattern.check) could not protect it.
                reasons.append(f"{m.pattern}: an input comes from a float (excluded) node; one shared scale "
                               "could crush it unseen")
                continue
            claimed.update(m.nodes)
            matches.append(m)
            decisions.append(Decision(name, node.op_type, True, f"pattern {m.pattern}", m.pattern))
            break
        else:
            decisions.append(Decision(name, node.op_type, False, "; ".join(reasons)))
    matches = keep_inputs_float(model.graph, matches, decisions)
    return Plan(matches, share_groups(matches), decisions)


def target_plan(model: ir.Model, config: QuantConfig, exclusions: Exclusions | None = None) -> Plan:
    """:func:`plan` as ``config.target`` executes it (:func:`for_target` with that target's facts): what the
    plan stage and every re-planning refinement use, so both shape a model alike."""
    runtime = target(config.target)
    return for_target(plan(model, config, exclusions), runtime.execution, runtime.hoists_quantizers,
                      per_channel_depthwise(config.target, config.ranges.depthwise_inputs, config.per_channel),
                      runtime.unsigned_readers)


def for_target(the_plan: Plan, execution, hoist: bool = False, per_channel_depthwise: bool = False,
               unsigned_readers: tuple[str, ...] = ()) -> Plan:
    """The plan as a target executes it: ``execution(facts)`` (a target's
    :class:`~qnnx.targets.execution.Int8Execution` for a match's :func:`match_facts`). A match the target
    runs in float is dropped, its decision saying why; one it runs with integer inputs and a float output
    loses its output qparams (its readers quantize the value when they are integer themselves); one whose
    inputs it wants with zero point 0 gets them, but on a value an op of ``unsigned_readers`` (ops the target
    computes wrongly on int8) reads or makes through data movement. ``hoist``: the target wants quantizers
    above data movement (:func:`hoist_quantizers`); ``per_channel_depthwise``: depthwise conv inputs per
    channel (:func:`per_channel_depthwise_inputs`). ``the_plan`` itself when nothing changes."""
    by_anchor = {d.node: d for d in the_plan.decisions}
    matches, changed = [], False
    for m in the_plan.matches:
        how = execution(match_facts(m))
        if how.inputs and how.output:
            matches.append(m)
            continue
        changed = True
        d = by_anchor.get(node_label(m.nodes[0]))
        if not how.inputs or not m.inputs:
            if d is not None:
                d.quantized, d.pattern, d.reason = False, None, how.why or "the target runs it in float"
            continue
        zero = how.zero_point_inputs
        inputs = tuple(replace(t, zero_point_zero=True)
                       if zero and t.role == "activation" and not keeps_unsigned(t.value, unsigned_readers) else t
                       for t in m.inputs)
        matches.append(PatternMatch(m.pattern, m.nodes, inputs, (), m.bias))
        if d is not None and m.outputs:
            d.reason += "; float output (the target's integer kernel dequantizes it)"
    if hoist:
        hoisted = hoist_quantizers(matches)
        changed = changed or hoisted != matches
        matches = hoisted
    if per_channel_depthwise:
        marked = per_channel_depthwise_inputs(matches)
        changed = changed or marked != matches
        matches = marked
    return Plan(matches, share_groups(matches), the_plan.decisions) if changed else the_plan


def keeps_unsigned(v: ir.Value, op_types: tuple[str, ...]) -> bool:
    """Whether an op of ``op_types`` reads or makes ``v``'s values, directly or through data movement (where a
    hoisted quantize would sit): such a value keeps a uint8 grid on a target computing those ops wrongly on
    int8."""
    return bool(op_types) and (ops.readers_through(v, op_types) or ops.made_through(v, op_types))


def per_channel_depthwise_inputs(matches: list[PatternMatch]) -> list[PatternMatch]:
    """``matches`` with the activation input of each depthwise conv marked per channel (axis 1) where the
    value is read quantized by depthwise convs only, directly, and shares its qparams with no other value:
    each output channel of a depthwise conv reads one input channel, so its int32 accumulator keeps one
    scale (``x_scale[c] * w_scale[o]``). A depthwise conv often reads a hard-swish or BatchNorm-scaled map whose
    channels differ widely in range; one scale leaves the narrow ones few levels."""
    groups = share_groups(matches)
    members: dict[ir.Value, list[tuple[Target, bool]]] = {}
    for m in matches:
        dw = ops.depthwise_channels(m.nodes[0])
        for t, is_input in (*((t, True) for t in m.inputs), *((t, False) for t in m.outputs)):
            if t.role != "activation":
                continue
            shape = t.value.shape
            ok = (is_input and dw is not None and m.nodes[0].inputs[0] is t.value and not t.through
                  and shape is not None and len(shape) >= 3 and shape[1] == dw)
            members.setdefault(groups.get(t.value, t.value), []).append((t, ok))
    shared = {root for v, root in groups.items() if v is not root}
    sole = {r for r, ts in members.items() if r not in shared and all(ok for _, ok in ts)}
    if not sole:
        return matches
    return [PatternMatch(m.pattern, m.nodes,
                         tuple(replace(t, per_channel=True) if t.role == "activation" and groups.get(t.value, t.value)
                               in sole else t for t in m.inputs), m.outputs, m.bias)
            for m in matches]


def match_facts(m: PatternMatch) -> MatchFacts:
    """What a target is told about ``m``."""
    anchor = m.nodes[0]
    acts = [t.value for t in m.inputs if t.role == "activation"]
    return MatchFacts(pattern_named(m.pattern).kind, anchor.op_type, len(acts),
                      anchor.op_type == "Mul" and gates_itself(anchor),
                      tuple(_origin_op(v) for v in acts))


def _origin_op(v: ir.Value) -> str:
    """The op type computing ``v``, past the data movement after it ("" for a graph input)."""
    p = ops.maker(v, ops.shares_qparams)
    return p.op_type if p is not None else ""


def gates_itself(mul: ir.Node, depth: int = 4) -> bool:
    """``mul`` multiplies a value by an elementwise function of it (SiLU ``x * Sigmoid(x)``, hard-swish
    spelled ``x * HardSigmoid(x)``, ``x * Clip(x + 3, 0, 6)``): an activation, not a product of two
    signals."""
    if len(mul.inputs) != 2 or any(v is None for v in mul.inputs):
        return False
    for x, g in (mul.inputs, mul.inputs[::-1]):
        for _ in range(depth):
            p = g.producer()
            if p is None or not ops.elementwise(p):
                break
            acts = [v for v in p.inputs if is_float_activation(v)]
            if len(acts) != 1:
                break
            g = acts[0]
            if g is x:
                return True
    return False


def hoist_quantizers(matches: list[PatternMatch]) -> list[PatternMatch]:
    """Activation inputs moved above the data movement before them (MaxPool, Split, Concat, Reshape,
    nearest Resize, ...) as long as every reader of the value above reads it quantized: a pattern input,
    or data movement whose outputs are all read so (a Shape or Size reads no values, so it does not count;
    it keeps reading the float value: a Reshape's target computed from its own input, as torch exports
    it). A runtime that propagates dequantization through data movement (OpenVINO's low-precision
    transformations) then runs those ops on integers and fuses the one quantize into the op that makes the
    value; a quantize below a branch would stand alone. A value hoisted through a Concat becomes one target
    per Concat input, each with its own qparams (extra ones appended after the match's other inputs, so
    positions of weights do not move)."""
    reads = {(id(n), id(t.value)) for m in matches for t in m.inputs if t.role == "activation"
             for n in m.nodes if any(v is t.value for v in n.inputs)}
    memo: dict[int, bool] = {}

    def read_quantized(v: ir.Value) -> bool:
        if id(v) not in memo:
            memo[id(v)] = False
            uses = [u for u in v.uses() if not ops.shape_only(u.node)]
            memo[id(v)] = bool(uses) and not v.is_graph_output() and all(
                (id(u.node), id(v)) in reads or passes_on(u.node, u.idx) for u in uses)
        return memo[id(v)]

    def passes_on(node: ir.Node, index: int) -> bool:
        moved = ops.passed_on(node)
        return (moved is not None and index < len(moved) and node.inputs[index] in moved
                and all(read_quantized(o) for o in node.outputs))

    def sources(v: ir.Value, through: tuple[ir.Node, ...]) -> list[tuple[ir.Value, tuple[ir.Node, ...]]]:
        p = v.producer()
        moved = ops.passed_on(p) if p is not None else None
        if not moved or not all(is_float_activation(x) and read_quantized(x) for x in moved):
            return [(v, through)]
        return [s for x in moved for s in sources(x, (*through, p))]

    out = []
    for m in matches:
        found: dict[ir.Value, tuple[ir.Node, ...]] = {}  # value -> the data movement read on the way, in order
        zero: dict[ir.Value, bool] = {}
        slots: list[ir.Value | Target] = []
        for t in m.inputs:
            if t.role != "activation" or t.fixed_range is not None or t.scaled_from is not None:
                slots.append(t)
                continue
            for i, (v, through) in enumerate(sources(t.value, ())):
                if i == 0:
                    slots.append(v)
                found[v] = tuple(dict.fromkeys((*found.get(v, ()), *through)))
                zero[v] = zero.get(v, False) or t.zero_point_zero
        firsts = [s for s in slots if isinstance(s, ir.Value)]
        new = tuple(Target(s, "activation", through=found[s], zero_point_zero=zero[s]) if isinstance(s, ir.Value)
                    else s for s in slots)
        new += tuple(Target(v, "activation", through=through, zero_point_zero=zero[v]) for v, through in found.items()
                     if v not in firsts)
        out.append(m if new == m.inputs else PatternMatch(m.pattern, m.nodes, new, m.outputs, m.bias))
    return out


def permutation_of(v: ir.Value, root: ir.Value) -> bool:
    """``v`` comes from ``root`` through value-permuting ops only."""
    while v is not root:
        p = v.producer()
        if p is None or not ops.permutes_values(p):
            return False
        v = p.inputs[0]
    return True


def _from_excluded(v: ir.Value, excluded: Exclusions) -> bool:
    p = v.producer()
    return p is not None and p in excluded


def known_outputs(matches: list[PatternMatch]) -> set[ir.Value]:
    """Outputs whose qparams are known without observation (softmax's [0, 1], a scaled input's)."""
    return {t.value for m in matches for t in m.outputs if t.fixed_range is not None or t.scaled_from is not None}


def share_groups(matches: list[PatternMatch]) -> dict[ir.Value, ir.Value]:
    """Map each quantized activation to the value whose qparams it reuses (itself, or the source of
    a data-movement chain that is itself quantized)."""
    targets = {t.value for m in matches for t in (*m.inputs, *m.outputs) if t.role == "activation"
               and t.fixed_range is None and t.scaled_from is None}
    fixed = known_outputs(matches)
    groups = {}
    for v in targets:
        root, cur = v, v
        for _ in range(32):
            p = cur.producer()
            # (nearest Resize too: ORT then runs it on uint8; with a requantize around it, it dequantized
            # and resized in float)
            if p is None or not ops.shares_qparams(p) or not p.inputs or p.inputs[0] is None:
                break
            cur = p.inputs[0]
            if cur in targets or cur in fixed:
                root = cur
        groups[v] = root
    # Values quantized above one Concat (hoist_quantizers) share one scale: the reader after it needs one.
    unified: dict[ir.Value, ir.Value] = {}

    def find(v: ir.Value) -> ir.Value:
        while unified.get(v, v) is not v:
            v = unified[v]
        return v

    by_concat: dict[ir.Node, list[ir.Value]] = {}
    for m in matches:
        for t in m.inputs:
            for n in t.through:
                if n.op_type == "Concat" and t.value in groups and groups[t.value] not in fixed:
                    by_concat.setdefault(n, []).append(groups[t.value])
    for roots in by_concat.values():
        for r in roots[1:]:
            a, b = find(roots[0]), find(r)
            if a is not b:
                first, second = sorted((a, b), key=lambda x: x.name or "")
                unified[second] = first
    if not unified:
        return groups
    return {v: find(r) for v, r in groups.items()}


# --------------------------------------------------------------------------- qparams from the plan


def fixed_qparams(t: Target, config: QuantConfig) -> QParams:
    lo, hi = t.fixed_range
    # A symmetric activation type (a target that needs zero point 0 / 128) applies here too.
    return qparams_from_range(lo, hi, config.activation_dtype, symmetric=config.activation_symmetric)


def activation_qparams(the_plan: Plan, root_qparams: dict, config: QuantConfig) -> dict[str, QParams]:
    """QParams of every quantized activation by value name: observed roots, fixed ranges, and outputs
    scaled from their input (in plan order, so a scaled value may itself be the source of another)."""
    roots = dict(root_qparams)  # sequential calibration: the roots chosen so far (the others are left out)
    for m in the_plan.matches:
        for t in m.outputs:
            if t.fixed_range is not None:
                roots[t.value] = fixed_qparams(t, config)
            elif t.scaled_from is not None:
                source, factor = t.scaled_from
                qp = roots.get(the_plan.groups.get(source, source))
                if qp is not None:
                    roots[t.value] = QParams((qp.scale * np.float32(factor)).astype(np.float32), qp.zero_point,
                                             qp.dtype, qp.axis)
    for r in {the_plan.groups.get(t.value, t.value) for m in the_plan.matches for t in m.inputs if t.zero_point_zero}:
        if r in roots:
            roots[r] = zero_point_zero(roots[r])
    out = {v.name: roots[r] for v, r in the_plan.groups.items() if r in roots}
    out.update({t.value.name: roots[t.value] for m in the_plan.matches for t in m.outputs
                if (t.fixed_range is not None or t.scaled_from is not None) and t.value in roots})
    return out


def zero_point_zero(qp: QParams) -> QParams:
    """``qp``'s range with zero point 0: uint8 ``[0, hi]`` when it does not go negative, else int8
    symmetric over ``max(|lo|, |hi|)``. Per-channel or 16-bit qparams are returned as they are (the target
    then runs the op in float; its check reports it)."""
    if np.asarray(qp.scale).size != 1 or qp.dtype not in ("uint8", "int8"):
        return qp
    qmin, qmax = quant_range(qp.dtype)
    scale, zp = float(np.asarray(qp.scale).reshape(())), int(np.asarray(qp.zero_point).reshape(()))
    lo, hi = (qmin - zp) * scale, (qmax - zp) * scale
    if lo >= 0:
        return qp if zp == 0 else qparams_from_range(0.0, hi, "uint8", symmetric=False)
    return qparams_from_range(lo, hi, "int8", symmetric=True)


def with_zero_point_zero(the_plan: Plan, allowed: Callable[[Target], bool]) -> tuple[Plan, set[ir.Value]]:
    """The plan with zero point 0 (:func:`zero_point_zero`) on every quantized activation input whose share
    group has only targets ``allowed`` accepts (a target's rule: no Concat reads it, say), and the roots of
    the groups that changed; ``the_plan`` and an empty set when none can."""
    groups = the_plan.groups
    members: dict[ir.Value, list[Target]] = {}
    for m in the_plan.matches:
        for t in (*m.inputs, *m.outputs):
            if t.role == "activation":
                members.setdefault(groups.get(t.value, t.value), []).append(t)
    roots = {groups.get(t.value, t.value) for m in the_plan.matches for t in m.inputs
             if t.role == "activation" and not t.zero_point_zero and not t.per_channel}
    roots = {r for r in roots if all(allowed(t) for t in members[r])}
    if not roots:
        return the_plan, set()
    matches = [PatternMatch(m.pattern, m.nodes,
                            tuple(replace(t, zero_point_zero=True)
                                  if t.role == "activation" and groups.get(t.value, t.value) in roots else t
                                  for t in m.inputs), m.outputs, m.bias)
               for m in the_plan.matches]
    return Plan(matches, groups, the_plan.decisions), roots


def zero_point_zero_qparams(the_plan: Plan, act_qparams: dict[str, QParams],
                            roots: set[ir.Value]) -> dict[str, QParams]:
    """``act_qparams`` with every value of the groups of ``roots`` given :func:`zero_point_zero` qparams."""
    out = dict(act_qparams)
    for v, r in the_plan.groups.items():
        if r in roots and v.name in out:
            out[v.name] = zero_point_zero(out[v.name])
    return out


def checked(the_plan: Plan, act_qparams: dict[str, QParams]) -> tuple[Plan, dict[str, QParams]]:
    """The plan without the matches whose pattern rejects the calibrated qparams (recorded as float,
    with why), and the qparams with :func:`concat_inputs_take_output_qparams` applied."""
    reasons = {}
    for i, m in enumerate(the_plan.matches):
        fail = pattern_named(m.pattern).check(m, act_qparams)
        if fail is not None:
            reasons[i] = f"{m.pattern}: {fail.reason}"
    if reasons:
        the_plan = the_plan.mark_float(reasons)
    return the_plan, concat_inputs_take_output_qparams(the_plan, act_qparams)


def concat_inputs_take_output_qparams(the_plan: Plan, act_qparams: dict[str, QParams]) -> dict[str, QParams]:
    """A Concat input that feeds only the Concat (and is its own qparams root) is quantized with the
    Concat output's qparams: the output range covers it, so it is never clipped where calibration
    happened not to reach, and the runtime's concat needs no requantization. Returns a new dict."""
    out = dict(act_qparams)
    for m in reversed(the_plan.matches):
        if not pattern_named(m.pattern).inputs_share_output_qparams:
            continue
        qp = out.get(m.outputs[0].value.name)
        for t in m.inputs:
            v = t.value
            if (t.role == "activation" and qp is not None and len(v.uses()) == 1 and not v.is_graph_output()
                    and the_plan.groups.get(v, v) is v and v.name in out):
                out[v.name] = qp
    return out
