"""Calibrators: (model, plan, samples) -> qparams of every observed root, and a record.

    float             the float model on ONNX Runtime with every observed value as an output, streamed
                      sample by sample (or batch by batch) into one observer per qparam group
    sequential        qparams chosen in topological stages on the simulated model with the prefix
                      quantized (seed 002's topological calibration)
    propagate_error   the float pass, then a pass on the simulated model fed its qparams, the same
                      observers continuing

A calibrator reads the samples (a :class:`~qnnx.data.CalibrationData`, re-iterable) and never hands
them back; memory stays flat in the number of samples. ``CALIBRATORS`` maps the config's name to each.
"""

from __future__ import annotations

import copy
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from qnnx import runtime
from qnnx.autoquant.config import QuantConfig
from qnnx.autoquant.consumers import consumer_function, reader_weight_norms, silu_output
from qnnx.autoquant.plan import Plan, activation_qparams, checked, permutation_of
from qnnx.autoquant.simulate import qparam_feed, simulate_model
from qnnx.calibrate import ObserverConfig, QParams, make_observer
from qnnx.errors import QnnxError
from qnnx.passes.lower import lower

CALIBRATION_BATCH_BYTES = 32 << 20  # fetched activations per batched run


@dataclass(frozen=True)
class Calibrated:
    """A calibrator's result: qparams by root value, samples read per pass, passes, seconds."""

    qparams: dict[ir.Value, QParams]
    samples: int
    passes: int
    seconds: float


def calibration_threads() -> int:
    """Intra-op threads of a calibration session: one core fewer than this process may use, left to the
    observers, which bin the previous run's outputs while the session makes the next (:func:`_overlapped`);
    with every core, ORT's threads and numpy's binning contend and the overlap gains nothing."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - 1)


@dataclass(frozen=True)
class Simulated:
    """The plan's simulated model lowered for ONNX Runtime (simulate.py), with qparams fed as inputs:
    what the sequential and error-propagating calibrators observe instead of the float model."""

    session: ort.InferenceSession
    inputs: dict  # value name -> simulate.QParamInputs


def simulated(float_model: ir.Model, the_plan: Plan, config: QuantConfig) -> Simulated:
    sim, inputs = simulate_model(float_model, the_plan, config, standard=True)
    return Simulated(runtime.session(lower(sim, copy=False), outputs=[i.observed for i in inputs.values()],
                                     purpose=" to calibrate it", threads=calibration_threads()), inputs)


def observers_for(the_plan: Plan, roots: list[ir.Value], config: QuantConfig) -> dict:
    """One observer per root, configured by what reads it (consumer function, reader weights, SiLU lobe); a
    per-channel root (Plan.per_channel_roots: depthwise conv inputs) gets a per-channel min-max observer (each
    channel's own range; why not clipped to the method's range for the tensor: docs/experiments.md)."""
    r = config.ranges
    base = ObserverConfig(method=r.method, dtype=config.activation_dtype, symmetric=config.activation_symmetric,
                          percentile=r.percentile, channel_balance=float(r.channel_balance))
    shared = {root for v, root in the_plan.groups.items() if v is not root}
    weighting = r.consumer_weighting and r.histogram
    per_channel = the_plan.per_channel_roots()

    def root_config(v: ir.Value) -> ObserverConfig:
        if v in per_channel:
            return ObserverConfig(method="minmax", dtype=config.activation_dtype,
                                  symmetric=config.activation_symmetric, axis=1)
        cfg = base if v in shared else replace(base, consumer=consumer_function(v, r.consumer_functions),
                                               channel_weights=reader_weight_norms(v) if weighting else None)
        return replace(cfg, negative_lobe=r.silu_lobe) if r.silu_lobe and silu_output(v) else cfg

    return {v: make_observer(root_config(v)) for v in roots}


def observe(model: ir.Model | Simulated, the_plan: Plan, data, config: QuantConfig, observers: dict | None = None,
            *, qparams: dict | None = None, roots: set | None = None,
            run: Callable = runtime.run) -> tuple[dict, dict, int]:
    """One streamed pass: each observed group's values into its observer (``observers`` continues
    earlier ones). ``model`` is the float model, or the simulated one run with ``qparams`` (by value
    name; a value without qparams passes through in float); ``roots`` limits the groups observed;
    ``run``: how a session is run (runtime.run). Returns (qparams by root, observers, samples read)."""
    # One observer per group, fed by the root and by members whose values are distributed differently
    # (MaxPool keeps the large values, Slice/Gather a part): a percentile of the root alone would clip
    # them. Members reached only through permutations (Reshape, Transpose...) add nothing and are skipped.
    wanted = the_plan.observed_roots() if roots is None else roots
    ordered = sorted(wanted, key=lambda v: v.name)
    fetch = [(r, r) for r in ordered] + [(v, r) for v, r in sorted(the_plan.groups.items(), key=lambda i: i[0].name)
                                         if r in wanted and v is not r and not permutation_of(v, r)]
    observers = dict(observers or {})
    observers.update(observers_for(the_plan, [r for r in ordered if r not in observers], config))
    if isinstance(model, Simulated):
        sess, extra = model.session, qparam_feed(model.inputs, qparams or {})
        names = [model.inputs[v.name].observed for v, _ in fetch]
    else:
        sess = runtime.session(model, outputs=[v for v, _ in fetch], purpose=" to calibrate it",
                               threads=calibration_threads())
        extra, names = {}, [v.name for v, _ in fetch]
    started = time.perf_counter()
    total = len(data)
    max_batch = config.calibration.batch_size if _batchable(data.specs, observers.values()) else 1
    n = 0
    try:
        for group, runs in _calibration_runs(sess, names, extra, iter(data), max_batch, run):
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
                _progress(config.progress, n + len(group), total, started)
            n += len(group)
    finally:
        if config.progress and n:
            _progress(True, n, total, started)
            print(file=sys.stderr)  # end the progress line, also before an error message
    chosen = {}
    for r in ordered:
        try:
            chosen[r] = observers[r].compute_qparams()
        except QnnxError as e:
            raise e.at(f"tensor {r.name!r}") from None
    return chosen, observers, n


def calibrate_float(float_model: ir.Model, the_plan: Plan, data, config: QuantConfig, **kw) -> Calibrated:
    started = time.perf_counter()
    qparams, _, n = observe(float_model, the_plan, data, config, **kw)
    return Calibrated(qparams, n, 1, time.perf_counter() - started)


def calibrate_propagating(float_model: ir.Model, the_plan: Plan, data, config: QuantConfig, **kw) -> Calibrated:
    """The float pass, then the simulated model fed its qparams: each activation then carries the
    quantization error of everything before it. The same observers continue, so each range covers
    both the float and the quantized-prefix behaviour."""
    started = time.perf_counter()
    first, observers, n = observe(float_model, the_plan, data, config, **kw)
    # The second pass simulates what would be realized: the plan checked against the first qparams
    # (on a copy of the decisions: the runner records its own check).
    draft = Plan(the_plan.matches, the_plan.groups, [copy.copy(d) for d in the_plan.decisions])
    draft, act = checked(draft, activation_qparams(draft, first, config))
    qparams, _, _ = observe(simulated(float_model, draft, config), draft, data, config, observers, qparams=act, **kw)
    return Calibrated(qparams, n, 2, time.perf_counter() - started)


def calibrate_sequential(float_model: ir.Model, the_plan: Plan, data, config: QuantConfig, **kw) -> Calibrated:
    """The groups, sorted by where their root is computed, cut into ``sequential_passes`` stages; stage k
    observes its groups on the simulated model in which every value whose qparams are already chosen
    (earlier stages, fixed ranges, values scaled from those) is quantized and every other value passes
    through in float. One streamed pass per stage, one ORT session for all of them."""
    started = time.perf_counter()
    sim = simulated(float_model, the_plan, config)
    position = {v: i for i, node in enumerate(float_model.graph) for v in node.outputs}
    roots = sorted(the_plan.observed_roots(), key=lambda v: (position.get(v, -1), v.name))
    stages = [list(s) for s in np.array_split(np.arange(len(roots)),
                                              min(config.calibration.sequential_passes, len(roots)))]
    known: dict = {}
    n = 0
    for stage in stages:
        chosen, _, n = observe(sim, the_plan, data, config, qparams=activation_qparams(the_plan, known, config),
                               roots={roots[i] for i in stage}, **kw)
        known.update(chosen)
    return Calibrated(known, n, len(stages), time.perf_counter() - started)


CALIBRATORS: dict[str, Callable[..., Calibrated]] = {
    "float": calibrate_float,
    "sequential": calibrate_sequential,
    "propagate_error": calibrate_propagating,
}


# --------------------------------------------------------------------------- streaming and batching


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


def _batchable(specs, observers) -> bool:
    """Samples may be concatenated along axis 0: every input's leading dim is dynamic and every
    observer's statistic is independent of how the data is split (or only better estimated in
    bigger batches: channel-balanced histograms, for which the batch size fixes it)."""
    return all(s.shape is not None and len(s.shape) > 0 and s.shape[0] is None for s in specs) and \
        all(o.partition_invariant or o.batch_statistics for o in observers)


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


def _calibration_runs(sess, names: list[str], extra: dict, samples, max_batch: int, run_session: Callable):
    """``(samples, [outputs of each run])`` over the data. Samples of one shape go into one run, up to
    ``max_batch`` and :data:`CALIBRATION_BATCH_BYTES` of fetched activations (measured on the first
    sample, run alone; ONNX Runtime's arena keeps the largest run's buffers, so a batch is never
    tried when two samples would exceed the budget). The first batch, of two, probes that the model
    keeps samples apart; if it does not, every later run takes one sample."""
    batch = [1]
    groups = _same_shape_groups(samples, lambda: batch[0])

    def run(group: list[dict]) -> list:
        feed = group[0] if len(group) == 1 else {k: np.concatenate([f[k] for f in group]) for k in group[0]}
        return run_session(sess, names, {**feed, **extra})

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
    output copies overlap numpy's binning, which holds the GIL. At most two runs' outputs are alive:
    the one observed and the one being made."""
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
