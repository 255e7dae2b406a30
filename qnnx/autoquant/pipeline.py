"""Automatic static quantization: prepare -> match patterns -> calibrate -> realize -> fall back.

    prepare      opset >= 13, constants folded, BatchNorm folded, shapes inferred (prepare.py)
    match        every node offered to the patterns anchored on its op type (patterns.py)
    calibrate    the float model on ONNX Runtime with every quantized value as an output,
                 streamed sample by sample into one observer per qparam group (memory flat);
                 ``propagate_error`` adds a pass on the simulated model (simulate.py) fed the first
                 pass's qparams; ``calibration="sequential"`` chooses qparams stage by stage in
                 topological order on the simulated model with the prefix quantized
    realize      QuantizeLinear/DequantizeLinear with the chosen qparams (qdq.py): the QDQ model;
                 fake-quantization-to-integer turns it into the canonical qnnx integer model,
                 expanding affine regions and consolidating dequantize->quantize into requantize
    fall back    patterns whose output SQNR (quantized vs float, on calibration samples) is
                 below ``sqnr_threshold_db`` are returned to float, and the model re-realized
    speed        ``speed_fallback`` ("auto" by default: only where all-int8 is not clearly faster): kinds
                 of patterns measured slower in int8 than in float on ONNX Runtime go back to float, or
                 the whole model when int8 is not faster (speed.py)

Values that only move data (Reshape, Transpose, MaxPool, ...) share the qparams of the value
they come from, so the integer model needs no requantize around them.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from qnnx import ops, runtime
from qnnx.autoquant.bias_correction import CorrectionCheck, correct_biases, correct_biases_sequentially
from qnnx.autoquant.weight_rounding import round_conv_weights
from qnnx.autoquant.config import HISTOGRAM_METHODS, Decision, OutputAgreement, QuantConfig, QuantReport
from qnnx.autoquant.data import input_specs, iter_samples
from qnnx.autoquant.fusion_check import unfused
from qnnx.autoquant.normalization import keep_normalization_inputs_float
from qnnx.autoquant.patterns import PATTERNS, MatchFail, PatternMatch, Target, pattern_named, patterns_for
from qnnx.analysis.compare import LayerError, compare_models, float_outputs
from qnnx.autoquant.consumers import consumer_function, reader_weight_norms, silu_output
from qnnx.autoquant.prepare import folded_into, prepare
from qnnx.autoquant.smoothing import smooth
from qnnx.autoquant.qdq import for_onnx_runtime, realize_qdq
from qnnx.autoquant.simulate import qparam_feed, simulate_model
from qnnx.calibrate import ObserverConfig, QParams, make_observer, qparams_from_range
from qnnx.errors import QnnxError
from qnnx.ir import save_model


@dataclass
class Plan:
    matches: list[PatternMatch]
    groups: dict[ir.Value, ir.Value]  # activation value -> the root value whose qparams it shares
    decisions: list[Decision] = field(default_factory=list)

    def observed_roots(self) -> set[ir.Value]:
        """The roots calibration observes: a root whose qparams follow from the plan alone (a fixed
        range, an output scaled from its input) is one too when a pattern reads it as an input, but an
        observer there would be overridden (:func:`activation_qparams`). PP-OCR cls: the hard-swish
        ``/ 6`` outputs and the HardSigmoid gates, 27 of 144 roots."""
        return set(self.groups.values()) - _known_outputs(self.matches)


def _nearest_value(node: ir.Node) -> str:
    return node.name or f"{node.op_type}({', '.join(v.name or '?' for v in node.outputs)})"


def plan(model: ir.Model, config: QuantConfig) -> Plan:
    matches, decisions = [], []
    claimed: set[ir.Node] = set()
    excluded_nodes = set(config.exclude_nodes)
    unknown = sorted(excluded_nodes - {n.name for n in model.graph})
    if unknown:
        raise QnnxError(f"exclude_nodes names no node of the model: {', '.join(unknown)}")
    for node in model.graph:
        if node in claimed:
            continue
        candidates = patterns_for(node.op_type) if node.domain in ("", "ai.onnx") else []
        if not candidates:
            if not ops.quiet(node):
                decisions.append(Decision(_nearest_value(node), node.op_type, False,
                                          "no quantization pattern for this op"))
            continue
        name = _nearest_value(node)
        if node.name in excluded_nodes or node.op_type in config.exclude_op_types:
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
            cut = [n for n in m.nodes[1:] if n.name in excluded_nodes or n.op_type in config.exclude_op_types]
            if cut:  # an excluded activation is not fused: the pattern ends before it
                m = PatternMatch(m.pattern, m.nodes[:1], m.inputs, (Target(m.nodes[0].outputs[0], "activation"),),
                                 m.bias)
                decisions += [Decision(_nearest_value(n), n.op_type, False, "excluded by the user") for n in cut]
            # An excluded node computes in float: its outputs get no quantize (a quantize after it would let
            # a runtime fuse it into an integer kernel anyway), so patterns reading it keep that input float.
            kept_inputs = tuple(t for t in m.inputs if not _from_excluded(t.value, excluded_nodes, config))
            reads_float = len(kept_inputs) != len(m.inputs)
            if reads_float:
                m = PatternMatch(m.pattern, m.nodes, kept_inputs, m.outputs, m.bias)
            kept = {t.value for t in kept_inputs}
            if any(t.scaled_from is not None and t.scaled_from[0] not in kept for t in m.outputs):
                reasons.append(f"{m.pattern}: its input comes from a float (excluded) node, nothing to rescale")
                continue
            if pattern.inputs_share_output_qparams and reads_float:
                # The float input would be quantized by the output's shared scale with its own range
                # never observed, so the range check (ConcatPattern.check) cannot protect it: YOLOv8n
                # with its class Sigmoid excluded had every score crushed to 0 by the box coordinates' scale.
                reasons.append(f"{m.pattern}: an input comes from a float (excluded) node; one shared scale "
                               "could crush it unseen")
                continue
            claimed.update(m.nodes)
            matches.append(m)
            decisions.append(Decision(name, node.op_type, True, f"pattern {m.pattern}", m.pattern))
            break
        else:
            decisions.append(Decision(name, node.op_type, False, "; ".join(reasons)))
    matches = keep_normalization_inputs_float(model.graph, matches, decisions)
    return Plan(matches, _share_groups(matches), decisions)


def _permutation_of(v: ir.Value, root: ir.Value) -> bool:
    """``v`` comes from ``root`` through value-permuting ops only."""
    while v is not root:
        p = v.producer()
        if p is None or not ops.permutes_values(p):
            return False
        v = p.inputs[0]
    return True


def _from_excluded(v: ir.Value, excluded_nodes: set[str], config: QuantConfig) -> bool:
    p = v.producer()
    return p is not None and (p.name in excluded_nodes or p.op_type in config.exclude_op_types)


def _known_outputs(matches: list[PatternMatch]) -> set[ir.Value]:
    """Outputs whose qparams are known without observation (softmax's [0, 1], a scaled input's)."""
    return {t.value for m in matches for t in m.outputs if t.fixed_range is not None or t.scaled_from is not None}


def _share_groups(matches: list[PatternMatch]) -> dict[ir.Value, ir.Value]:
    """Map each quantized activation to the value whose qparams it reuses (itself, or the source of
    a data-movement chain that is itself quantized)."""
    targets = {t.value for m in matches for t in (*m.inputs, *m.outputs) if t.role == "activation"
               and t.fixed_range is None and t.scaled_from is None}
    fixed = _known_outputs(matches)
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
    return groups


# --------------------------------------------------------------------------- calibration


def _progress(enabled: bool, done: int, total: int | None, started: float) -> None:
    if not enabled:
        return
    elapsed = time.perf_counter() - started
    if total:
        eta = elapsed / max(done, 1) * (total - done)
        msg = f"\rcalibrating {done}/{total} samples, {elapsed:.1f}s elapsed, ~{eta:.0f}s left"
    else:
        msg = f"\rcalibrating {done} samples, {elapsed:.1f}s elapsed"
    print(msg, end="", file=sys.stderr, flush=True)


_run = runtime.run  # a module name of its own: tests count calibration runs through it


def _session_with_outputs(model: ir.Model, values: list[ir.Value | str],
                          threads: int | None = None) -> ort.InferenceSession:
    """An ORT session of ``model`` that also returns ``values`` (values or names; the caller's model is
    unchanged); ``threads``: intra-op threads, default ORT's."""
    return runtime.session(model, outputs=values, purpose=" to calibrate it", threads=threads)


def _calibration_threads() -> int:
    """Intra-op threads of a calibration session: one core fewer than this process may use, left to the
    observers, which bin the previous run's outputs while the session makes the next (:func:`_overlapped`).
    With every core, ORT's threads and numpy's binning contend and the overlap gained nothing (PP-OCR cls,
    64 samples, 2 cores: 0.53 s in turn, 0.53-0.58 s overlapped with 2 threads, 0.45 s with 1)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - 1)


@dataclass(frozen=True)
class Simulated:
    """The plan's simulated model lowered for ONNX Runtime (simulate.py), with the first pass's
    qparams fed as inputs: what calibration observes instead of the float model."""

    session: ort.InferenceSession
    inputs: dict  # value name -> simulate.QParamInputs
    specs: list  # the float model's inputs, what calibration samples feed


def simulated(float_model: ir.Model, the_plan: Plan, config: QuantConfig) -> Simulated:
    from qnnx.passes.lower import lower

    sim, inputs = simulate_model(float_model, the_plan, config, standard=True)
    return Simulated(_session_with_outputs(lower(sim, copy=False), [i.observed for i in inputs.values()],
                                           _calibration_threads()), inputs, input_specs(float_model))


def _batchable(specs, observers) -> bool:
    """Samples may be concatenated along axis 0: every input's leading dim is dynamic and every
    observer's statistic is independent of how the data is split (or only better estimated in
    bigger batches: channel-balanced histograms, for which config.calibration_batch_size fixes it)."""
    return all(s.shape is not None and len(s.shape) > 0 and s.shape[0] is None for s in specs) and \
        all(o.partition_invariant or o.batch_statistics for o in observers)


CALIBRATION_BATCH_BYTES = 32 << 20  # fetched activations per batched run


def _same_shape_groups(samples, size):
    """Consecutive samples, up to ``size()`` per group, whose inputs all have equal shapes."""
    group: list[dict] = []
    for feed in samples:
        if group and (len(group) >= size() or any(np.shape(feed[k]) != np.shape(group[0][k]) for k in feed)):
            yield group
            group = []
        group.append(feed)
    if group:
        yield group


def _calibration_runs(sess, names: list[str], extra: dict, samples, max_batch: int):
    """``(samples, [outputs of each run])`` over the data. Samples of one shape go into one run, up to
    ``max_batch`` and :data:`CALIBRATION_BATCH_BYTES` of fetched activations (measured on the first
    sample, run alone; ONNX Runtime's arena keeps the largest run's buffers, so a batch is never
    tried when two samples would exceed the budget). The first batch, of two, probes that the model
    keeps samples apart; if it does not, every later run takes one sample."""
    batch = [1]
    groups = _same_shape_groups(samples, lambda: batch[0])

    def run(group: list[dict]) -> list:
        feed = group[0] if len(group) == 1 else {k: np.concatenate([f[k] for f in group]) for k in group[0]}
        return _run(sess, names, {**feed, **extra})

    first = next(groups, None)
    if first is None:
        return
    # (no run's outputs stay referenced here after their yield: they can be hundreds of MiB)
    single = run(first)
    per_sample = max(1, sum(np.asarray(o).nbytes for o in single))
    yield first, [single]
    del single
    cap = min(max_batch, CALIBRATION_BATCH_BYTES // per_sample)
    if cap >= 2:
        batch[0] = 2
        probe = next(groups, None)
        if probe is None:
            return
        if len(probe) == 1:  # another shape: no probe possible yet, stay per sample
            batch[0] = 1
            yield probe, [run(probe)]
        else:
            outs, alone = run(probe), run(probe[:1])
            if _batch_matches_sample(outs, alone, len(probe)):
                batch[0] = cap
                del alone
                yield probe, [outs]
                del outs
            else:  # the model mixes samples (or fixes the batch)
                batch[0] = 1
                del outs
                rest = run(probe[1:])
                yield probe, [alone, rest]
                del alone, rest
    yield from _overlapped(run, groups)


def _overlapped(run, groups):
    """``(group, [run(group)])`` for each group, the next group's run under way in a worker thread while
    the caller observes the current one. ONNX Runtime releases the GIL while it runs, so its kernels and
    output copies overlap numpy's binning, which holds the GIL (PP-OCR cls, 64 samples, in-process:
    calibration 0.53 -> 0.45 s; PP-OCRv4 det, 32 samples: 13.5 -> 12.4 s). At most two runs' outputs are
    alive: the one observed and the one being made."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="qnnx-calibration") as pool:
        current = next(groups, None)
        if current is None:
            return
        pending = pool.submit(run, current)
        for group in groups:  # reads the next samples while the run is under way
            outs = pending.result()
            pending = pool.submit(run, group)
            yield current, [outs]
            outs = None  # the caller has observed them: drop them before the next wait
            current = group
        outs = pending.result()
        pending = None
        yield current, [outs]


def _batch_matches_sample(batched: list, single: list, count: int) -> bool:
    """The batched run's first rows are the first sample's own outputs (float tolerance: kernels may
    block a larger batch differently), and every output grew by the batch: the model keeps samples apart."""
    for b, s in zip(batched, single):
        b, s = np.asarray(b), np.asarray(s)
        if b.ndim == 0 or s.ndim == 0 or b.shape[0] != count * s.shape[0] or b.shape[1:] != s.shape[1:]:
            return False
        head = b[:s.shape[0]].astype(np.float64)
        scale = max(float(np.max(np.abs(s))), 1e-12)
        if not np.allclose(head, s, rtol=1e-3, atol=1e-4 * scale):
            return False
    return True


def calibrate(model: ir.Model | Simulated, the_plan: Plan, calibration, config: QuantConfig,
              observers: dict | None = None, *, qparams: dict | None = None,
              roots: set | None = None) -> tuple[dict, int, float, list, dict]:
    """One observer per qparam group, fed sample by sample (``observers`` continues earlier ones).
    ``model`` is the float model, or the simulated one run with ``qparams`` (by value name; a value
    without qparams passes through in float); ``roots`` limits the groups observed.
    Returns (qparams by root value, samples, seconds, samples kept for the fallback, observers)."""
    # One observer per group, fed by the root and by members whose values are distributed differently
    # (MaxPool keeps the large values, Slice/Gather a part): a percentile of the root alone would clip
    # them. Members reached only through permutations (Reshape, Transpose...) add nothing and are skipped.
    wanted = the_plan.observed_roots() if roots is None else roots
    roots = sorted(wanted, key=lambda v: v.name)
    fetch = [(r, r) for r in roots] + [(v, r) for v, r in sorted(the_plan.groups.items(), key=lambda i: i[0].name)
                                       if r in wanted and v is not r and not _permutation_of(v, r)]
    obs_cfg = ObserverConfig(method=config.method, dtype=config.activation_dtype,
                             symmetric=config.activation_symmetric, percentile=config.percentile,
                             channel_balance=config.effective_channel_balance)
    if observers is None:
        shared = {r for v, r in the_plan.groups.items() if v is not r}
        weighting = config.consumer_weighting and config.method in HISTOGRAM_METHODS

        def root_config(r: ir.Value) -> ObserverConfig:
            cfg = obs_cfg if r in shared else replace(
                obs_cfg, consumer=consumer_function(r, config.consumer_functions),
                channel_weights=reader_weight_norms(r) if weighting else None)
            return replace(cfg, negative_lobe=config.silu_lobe) if config.silu_lobe and silu_output(r) else cfg

        observers = {r: make_observer(root_config(r)) for r in roots}
    if isinstance(model, Simulated):
        sess, extra = model.session, qparam_feed(model.inputs, qparams or {})
        names = [model.inputs[v.name].observed for v, _ in fetch]
    else:
        sess, extra = _session_with_outputs(model, [v for v, _ in fetch], _calibration_threads()), {}
        names = [v.name for v, _ in fetch]
    started = time.perf_counter()
    specs = model.specs if isinstance(model, Simulated) else input_specs(model)
    n = 0
    kept: list[dict] = []  # the first samples, for the fallbacks (the source may be a one-shot iterator)
    n_kept = config.fallback_samples  # the fallbacks, and the outputs' agreement with float in the report
    max_batch = config.calibration_batch_size if _batchable(specs, observers.values()) else 1
    try:
        samples = iter_samples(calibration, specs, config.num_samples, config.seed)
        for group, runs in _calibration_runs(sess, names, extra, samples, max_batch):
            kept.extend(group[:max(0, n_kept - len(kept))])
            for outs in runs:
                for (v, r), out in zip(fetch, outs):
                    try:
                        observers[r].observe(out)
                    except QnnxError as e:
                        where = f"calibration sample {n}" if len(group) == 1 else \
                            f"calibration samples {n}-{n + len(group) - 1}"
                        raise e.at(f"tensor {v.name!r} ({where})") from None
            runs = outs = out = None  # before the next run: one run's activations alive at a time
            if (n + len(group)) // 8 > n // 8:  # about every 8 samples
                _progress(config.progress, n + len(group), config.num_samples, started)
            n += len(group)
    finally:
        if config.progress and n:
            _progress(True, n, config.num_samples, started)
            print(file=sys.stderr)  # end the progress line, also before an error message
    qparams = {}
    for r in roots:
        try:
            qparams[r] = observers[r].compute_qparams()
        except QnnxError as e:
            raise e.at(f"tensor {r.name!r}") from None
    return qparams, n, time.perf_counter() - started, kept, observers


def calibrate_sequential(float_model: ir.Model, the_plan: Plan, calibration,
                         config: QuantConfig) -> tuple[dict, int, float, list]:
    """Qparams chosen in topological order on the already-quantized prefix (seed 002): the groups,
    sorted by where their root is computed, are cut into ``config.sequential_passes`` stages; stage k
    observes its groups on the simulated model in which every value whose qparams are already chosen
    (earlier stages, fixed ranges, values scaled from those) is quantized and every other value passes
    through in float. One streamed pass over the data per stage, one ORT session for all of them.
    Returns (qparams by root value, samples, seconds of the passes, samples kept for the fallbacks)."""
    started = time.perf_counter()
    sim = simulated(float_model, the_plan, config)
    position = {v: i for i, node in enumerate(float_model.graph) for v in node.outputs}
    roots = sorted(the_plan.observed_roots(), key=lambda v: (position.get(v, -1), v.name))
    stages = [list(s) for s in np.array_split(np.arange(len(roots)), min(config.sequential_passes, len(roots)))]
    known: dict = {}
    n, kept = 0, []
    for k, stage in enumerate(stages):
        chosen, n, _, kept_k, _ = calibrate(sim, the_plan, calibration, config,
                                            qparams=activation_qparams(the_plan, known, config),
                                            roots={roots[i] for i in stage})
        kept = kept if k else kept_k
        known.update(chosen)
    return known, n, time.perf_counter() - started, kept


def weight_qparams(w: np.ndarray, axis: int | None, config: QuantConfig) -> QParams:
    axis = axis if config.per_channel else None
    obs = make_observer(ObserverConfig(method="minmax", dtype=config.weight_dtype, symmetric=True, axis=axis))
    obs.observe(np.asarray(w, np.float32))
    return obs.compute_qparams()


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
    out = {v.name: roots[r] for v, r in the_plan.groups.items() if r in roots}
    out.update({t.value.name: roots[t.value] for m in the_plan.matches for t in m.outputs
                if (t.fixed_range is not None or t.scaled_from is not None) and t.value in roots})
    return out


# --------------------------------------------------------------------------- fallback


def pattern_sqnr(float_model: ir.Model, qdq_model: ir.Model, matches: list[PatternMatch], calibration,
                 config: QuantConfig) -> dict[int, float]:
    """Output SQNR of each pattern, quantized model vs float model, on ``calibration`` (a list of the
    first calibration samples, kept during calibration)."""
    outs = [(m.outputs[0].value if m.outputs else m.nodes[-1].outputs[0]).name for m in matches]
    f_vals = [v for v in (_find_value(float_model, n) for n in outs) if v is not None]
    q_vals = [v for v in (_find_value(qdq_model, n) for n in outs) if v is not None]
    fs, qs = _session_with_outputs(float_model, f_vals), _session_with_outputs(qdq_model, q_vals)
    errors = {n: LayerError(n, "", False) for n in outs}  # the SQNR of `qnnx compare`, not a second definition
    for feed in calibration:
        fr = dict(zip([v.name for v in f_vals], _run(fs, [v.name for v in f_vals], feed)))
        qr = dict(zip([v.name for v in q_vals], _run(qs, [v.name for v in q_vals], feed)))
        for n in outs:
            if n in fr and n in qr:
                errors[n].add(np.asarray(fr[n]), np.asarray(qr[n]))
    return {i: errors[n].sqnr_db for i, n in enumerate(outs)}


def _find_value(model: ir.Model, name: str) -> ir.Value | None:
    for node in model.graph:
        for o in node.outputs:
            if o.name == name:
                return o
    return None


# --------------------------------------------------------------------------- API


class QuantizedModel:
    """The result of :func:`quantize`: the QDQ model (what ONNX Runtime runs natively), the
    canonical qnnx integer model, and the report of every decision."""

    def __init__(self, qdq: ir.Model, report: QuantReport, keep_float: frozenset[str] = frozenset()):
        self.qdq = qdq
        self.report = report
        self.keep_float = keep_float  # node names the user excluded: FQ2I must not integerize them either
        self._canonical = None

    @property
    def canonical(self) -> ir.Model:
        if self._canonical is None:
            from qnnx.frontends.fq2i import convert

            self._canonical, fq = convert(self.qdq, keep_float=self.keep_float)
            self.report.left_in_float = fq.left_in_float
        return self._canonical

    def save(self, path, format: str = "qdq"):
        """Write ``format`` ("qdq", "qnnx" canonical, or "lowered" standard-ONNX integer) atomically."""
        if format == "qdq":
            model, self.report.padding = for_onnx_runtime(self.qdq)
        elif format == "qnnx":
            model = self.canonical
        elif format == "lowered":
            from qnnx.passes.lower import lower

            model = lower(self.canonical)
        else:
            raise QnnxError(f"unknown output format {format!r}; expected qdq, qnnx or lowered")
        return save_model(model, path)


def _concat_inputs_take_output_qparams(the_plan: Plan, act_qparams: dict) -> None:
    """A Concat input that feeds only the Concat (and is its own qparams root) is quantized with the
    Concat output's qparams: the output range covers it, so it is never clipped where calibration
    happened not to reach (YOLOv8n's class logits never went positive on calibration scenes and
    every score above 0.5 was clipped to 0.5), and the runtime's concat needs no requantization."""
    for m in reversed(the_plan.matches):
        if not pattern_named(m.pattern).inputs_share_output_qparams:
            continue
        out = act_qparams.get(m.outputs[0].value.name)
        for t in m.inputs:
            v = t.value
            if (t.role == "activation" and out is not None and len(v.uses()) == 1 and not v.is_graph_output()
                    and the_plan.groups.get(v, v) is v and v.name in act_qparams):
                act_qparams[v.name] = out


def _record_float(the_plan: Plan, reasons: dict[int, str]) -> list[PatternMatch]:
    """Mark the decision of each ``the_plan.matches[i]`` in ``reasons`` float, with that reason; returns
    the matches that stay."""
    by_anchor = {d.node: d for d in the_plan.decisions}
    for i, why in reasons.items():
        d = by_anchor.get(_nearest_value(the_plan.matches[i].nodes[0]))
        if d is not None:
            d.quantized, d.reason = False, why
    return [m for i, m in enumerate(the_plan.matches) if i not in reasons]


def _checked(the_plan: Plan, act_qparams: dict) -> Plan:
    """Drop the matches whose pattern rejects the calibrated qparams (recorded as float, with why)."""
    by_name = {p.name: p for p in PATTERNS}
    reasons = {}
    for i, m in enumerate(the_plan.matches):
        fail = by_name[m.pattern].check(m, act_qparams) if m.pattern in by_name else None
        if fail is not None:
            reasons[i] = f"{m.pattern}: {fail.reason}"
    if not reasons:
        return the_plan
    keep = _record_float(the_plan, reasons)
    return Plan(keep, _share_groups(keep), the_plan.decisions)


def quantize(model, calibration, config: QuantConfig | None = None) -> QuantizedModel:
    """Quantize a float model with representative ``calibration`` samples (no labels):
    a directory of .npy/.npz files, an :class:`~qnnx.autoquant.images.ImageFolder` (image files with
    their preprocessing), or an iterable of arrays (single input) / dicts by input name."""
    config = config or QuantConfig()
    # 16-bit QuantizeLinear/DequantizeLinear exist from opset 21 on.
    float_model = prepare(model, min_opset=21 if config.activation_dtype.endswith("16") else 13,
                          exclude_nodes=config.exclude_nodes, exclude_op_types=config.exclude_op_types)
    folded = folded_into(float_model)
    if any(n in folded for n in config.exclude_nodes):  # the user named a node prepare folded into another
        names = {n.name for n in float_model.graph}
        config = replace(config, exclude_nodes=tuple(dict.fromkeys(
            folded[n] if n not in names and n in folded else n for n in config.exclude_nodes)))
    float_model, calibration = smooth(float_model, calibration, config)
    the_plan = plan(float_model, config)
    if not the_plan.matches:
        raise QnnxError("nothing to quantize: no node matched a quantization pattern")
    passes = config.propagate_error or (config.calibration == "sequential" and config.sequential_passes > 1)
    if passes and not isinstance(calibration, (str, os.PathLike)) and iter(calibration) is calibration:
        what = "propagate_error" if config.propagate_error else "calibration='sequential'"
        raise QnnxError(f"{what} reads the calibration data twice or more: give a directory or a list, "
                        "not a one-shot iterator")
    if config.calibration == "sequential":
        root_qparams, n, seconds, kept = calibrate_sequential(float_model, the_plan, calibration, config)
    else:
        root_qparams, n, seconds, kept, observers = calibrate(float_model, the_plan, calibration, config)
    act_qparams = activation_qparams(the_plan, root_qparams, config)
    the_plan = _checked(the_plan, act_qparams)
    _concat_inputs_take_output_qparams(the_plan, act_qparams)
    if config.propagate_error:
        # The simulated model fed the first pass's qparams: each activation now carries the quantization
        # error of everything before it (the tensor observed is the float input of its simulated_quantize).
        # The same observers continue, so each range covers both the float and the quantized-prefix
        # behaviour: replacing the first pass moved some ranges 2x either way and cost PP-OCR rec 30 points.
        started = time.perf_counter()
        root_qparams, _, _, _, _ = calibrate(simulated(float_model, the_plan, config), the_plan, calibration,
                                             config, observers, qparams=act_qparams)
        seconds += time.perf_counter() - started
        act_qparams = activation_qparams(the_plan, root_qparams, config)
    qdq = realize_qdq(float_model, the_plan, act_qparams, config)
    report = QuantReport(the_plan.decisions, seconds, n)
    if config.sqnr_threshold_db is not None:
        scores = pattern_sqnr(float_model, qdq, the_plan.matches, kept, config)
        by_anchor = {d.node: d for d in report.decisions}
        for i, m in enumerate(the_plan.matches):
            d = by_anchor.get(_nearest_value(m.nodes[0]))
            if d is not None:
                d.sqnr_db = scores.get(i)
        low = {i: f"output SQNR {sq:.1f} dB below {config.sqnr_threshold_db} dB: kept float"
               for i, sq in scores.items() if sq < config.sqnr_threshold_db}
        if low:
            keep = _record_float(the_plan, low)
            the_plan = Plan(keep, _share_groups(keep), the_plan.decisions)
            qdq = realize_qdq(float_model, the_plan, act_qparams, config)
    keep = {n.name for n in float_model.graph
            if n.name in config.exclude_nodes or n.op_type in config.exclude_op_types}
    if config.speed_fallback != "off":
        qdq, speed_float = _speed_fallback(float_model, the_plan, act_qparams, qdq, kept[0], report, config)
        keep |= speed_float
    # Last, with bias correction: every re-realization above starts from nearest rounding and plain biases.
    if config.weight_rounding == "gptq":
        report.rounding = round_conv_weights(float_model, qdq, kept, progress=config.progress)
    if config.bias_correction == "off":
        report.outputs = output_agreement(float_model, qdq, kept)
    else:
        qdq = _corrected_biases(float_model, qdq, kept, report, config)
    report.unfused, report.fusable = unfused(for_onnx_runtime(qdq)[0])
    return QuantizedModel(qdq, report, frozenset(keep))


def _corrected_biases(float_model: ir.Model, qdq: ir.Model, kept: list[dict], report: QuantReport,
                      config: QuantConfig) -> ir.Model:
    """``qdq`` with its biases corrected (``config.bias_correction``), or as it was when the correction made
    the outputs agree worse with float on ``kept`` (bias_correction.CorrectionCheck says why it is checked);
    fills ``report.outputs``, ``report.corrections`` and ``report.correction_check``."""
    try:  # the float side of both comparisons, run once
        reference = float_outputs(float_model, kept) if kept else None
    except QnnxError:
        reference = None
    before = output_agreement(float_model, qdq, kept, reference)
    original = ir.from_proto(ir.to_proto(qdq)) if before else None  # the correction edits biases in place
    if config.bias_correction == "own":
        changed = correct_biases(float_model, qdq, kept)
    else:
        report.corrections = correct_biases_sequentially(float_model, qdq, kept, progress=config.progress)
        changed = len(report.corrections)
    report.outputs = output_agreement(float_model, qdq, kept, reference)
    if original is None or not changed or len(report.outputs) != len(before):
        return qdq  # nothing to compare with (no samples, or a model ONNX Runtime cannot run), or nothing done
    check = CorrectionCheck(changed, _mean_channel_cosine(before), _mean_channel_cosine(report.outputs))
    report.correction_check = check
    if check.kept:
        return qdq
    report.corrections, report.outputs = [], before
    return original


def _mean_channel_cosine(outputs: list[OutputAgreement]) -> float:
    known = [o.channel_cosine for o in outputs if np.isfinite(o.channel_cosine)]
    return float(np.mean(known)) if known else float("nan")  # nan: not comparable, the correction stays


def output_agreement(float_model: ir.Model, qdq: ir.Model, samples: list[dict],
                     reference: list[dict[str, np.ndarray]] | None = None) -> list[OutputAgreement]:
    """Each graph output of the QDQ model against the float model's on ``samples`` (or against
    ``reference``, the float outputs on them, compare.float_outputs): a quantization that went wrong (a
    method clipping everything, a tensor crushed by a shared scale) shows here, in the report, instead
    of only in the user's own evaluation."""
    if not samples:
        return []
    try:
        errors = compare_models(float_model, qdq, samples, outputs_only=True, reference=reference)
    except QnnxError:  # a QDQ model ORT cannot run (16-bit types on an old opset...) is still a valid result
        return []
    order = {v.name: i for i, v in enumerate(float_model.graph.outputs)}
    return [OutputAgreement(e.name, e.sqnr_db, e.cosine, len(samples), e.channel_cosine)
            for e in sorted(errors, key=lambda e: order.get(e.name, len(order)))]


def _speed_fallback(float_model: ir.Model, the_plan: Plan, act_qparams: dict, qdq: ir.Model, feed: dict,
                    report: QuantReport, config: QuantConfig) -> tuple[ir.Model, set[str]]:
    """Kinds of matches measured slower in int8 than in float on ONNX Runtime go back to float
    (speed.py), and the decisions say so. Returns the model and the names of the nodes now float
    (the canonical model keeps them float too, so every format agrees with the report)."""
    from qnnx.autoquant import speed

    def activations(m: PatternMatch) -> tuple:
        return m.pattern, tuple(t.value.name for t in m.inputs if t.role == "activation")

    def without(keep: list[PatternMatch]) -> Plan:
        # Re-planned as if the user had excluded the other matches' nodes: their outputs then get no
        # quantize, so a runtime cannot fuse them into integer kernels between their neighbours' Q/DQ.
        # A pattern reading such an output would get a float input: it computes in float on the runtime
        # anyway, so it goes too (its own output is still quantized where a pattern reads it). The
        # calibrated qparams stay: every value quantized now was quantized before, with the same group.
        kept = {m.nodes[0].name: activations(m) for m in keep}
        floats = tuple(n.name for m in the_plan.matches if m.nodes[0].name not in kept for n in m.nodes)
        replanned = plan(float_model, replace(config, exclude_nodes=config.exclude_nodes + floats))
        matches = [m for m in replanned.matches if kept.get(m.nodes[0].name) == activations(m)]
        return Plan(matches, _share_groups(matches), the_plan.decisions)

    def realize(keep: list[PatternMatch]) -> ir.Model:
        return realize_qdq(float_model, without(keep), act_qparams, config)

    choice = speed.choose(float_model, the_plan.matches, realize, feed, timer=speed.ort_timer,
                          progress=config.progress, qdq=qdq, auto=config.speed_fallback == "auto")
    report.speed = choice.report
    if choice.keep is not None and len(choice.keep) == len(the_plan.matches):
        return choice.model, set()  # every match stays int8 (speed_fallback="auto" stops here too)
    reasons = dict(choice.reasons)
    if choice.keep is not None:
        final = {m.nodes[0].name for m in without(choice.keep).matches}
        for i, m in enumerate(the_plan.matches):
            if i not in reasons and m.nodes[0].name not in final:
                reasons[i] = "speed: reads a node left float for speed, so it computes in float too"
    _record_float(the_plan, reasons)
    return choice.model, {n.name for i in reasons for n in the_plan.matches[i].nodes}
