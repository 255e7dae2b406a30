"""Speed-aware fallback: kinds of patterns stay float where ONNX Runtime's int8 kernels are slower.

People quantize for speed, and int8 is not always faster on ONNX Runtime's CPU kernels: on a small
MobileNetV3 int8 depthwise QLinearConv on small maps is slower than fp32's NCHWc depthwise conv, and
the SE blocks' small QLinearMul / QLinearGlobalAveragePool cost more than their float ops (figures:
docs/experiments.md, "Speed fallback"). Measured, not assumed: after calibration
(qparams known, nothing is recalibrated) QDQ variants of the plan are timed against each other:

    1. float model vs every pattern int8
    2. for each kind of pattern present (``KINDS`` order), the current best variant vs the same
       with that kind float too: kept when faster by ``MARGIN``, and again on a second timing
    3. the best int8 variant vs float: the whole model stays float unless int8 is faster by ``MARGIN``
       (quantizing costs accuracy; a speed-up within noise does not pay for it)

Whole kinds, not nodes: a trial per node would cost minutes, and ORT fuses neighbours, so one
node's cost depends on whether the nodes around it are integer.

Timing is a ``Timer``: ``timer(models, feed, repeats)`` -> median ms of each model, timed
interleaved so a noisy machine hits every variant alike (the target's ``timer``: ONNX Runtime CPU, one
thread). Repeats are chosen so that one timing takes about ``SECONDS_PER_TIMING`` per model, so the
total cost is roughly (2 + 2 x kinds) timings whatever the model's latency, bounded by
``BUDGET_S`` and ``MAX_TIMINGS``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import onnx_ir as ir

from qnnx.autoquant.patterns import PatternMatch, pattern_named
from qnnx.autoquant.plan import Plan, target_plan
from qnnx.autoquant.qdq import realize_qdq
from qnnx.autoquant.refinements.base import Refinement
from qnnx.errors import QnnxError
from qnnx.ir import const_array
from qnnx.targets import target

Timer = Callable[[Sequence[ir.Model], dict, int], list[float]]

# The order kinds are tried in: small memory-bound ops first (int8 often loses there), the big
# compute-bound convs and matmuls last (int8 usually wins there, so they rarely go).
KINDS = ("depthwise conv", "elementwise", "binary", "pool", "scale", "concat", "softmax", "gelu",
         "pointwise conv", "conv", "conv transpose", "matmul/gemm")
# A variant replaces the current best only when at least this much faster: medians of interleaved
# runs on a shared machine still move by a percent or two between timings.
MARGIN = 0.03
SECONDS_PER_TIMING = 0.25  # per model in one timing: repeats = this / latency, within REPEATS
REPEATS = (15, 400)
BUDGET_S = 60.0
MAX_TIMINGS = 4 + 2 * len(KINDS)  # every kind tried and confirmed, the combined trial, both ends
# speed_fallback="auto": no search when all-int8 is already this much faster than float after the first
# timing (the kinds search gains a few percent there and costs seconds per kind), and no timing at all
# for graphs under AUTO_MIN_FLOAT_MS per run (fragments and test graphs: a shared machine's timing noise
# is as large as their differences).
AUTO_INT8_SPEEDUP = 1.2
AUTO_MIN_FLOAT_MS = 0.5


def match_kind(m: PatternMatch) -> str:
    """The kind a match is excluded with: its pattern's ``kind`` (matmul and gemm together), a conv's
    split by shape (depthwise = group > 1, pointwise = 1x1)."""
    kind = pattern_named(m.pattern).kind
    if kind == "conv":
        node = m.nodes[0]
        group = node.attributes["group"].value if "group" in node.attributes else 1
        if group > 1:
            return "depthwise conv"
        w = const_array(m.inputs[1].value) if len(m.inputs) > 1 else None
        if w is not None and w.ndim > 2 and all(k == 1 for k in w.shape[2:]):
            return "pointwise conv"
        return "conv"
    return kind


@dataclass(frozen=True)
class SpeedTrial:
    """One kind of pattern tried in float: the best model so far vs the same with every match of ``kind``
    float too (median ms, interleaved), and whether that stayed."""

    kind: str
    matches: int
    before_ms: float
    after_ms: float
    left_float: bool


@dataclass(frozen=True)
class SpeedReport:
    """What the speed fallback measured on the target (median ms per run, one thread)."""

    float_ms: float
    int8_ms: float  # every pattern int8
    trials: list[SpeedTrial]
    final_float_ms: float  # the last timing: float vs the chosen int8 variant
    final_ms: float
    whole_model_float: bool
    timings: int
    seconds: float
    skipped: str = ""  # speed_fallback="auto" stopped early: why (no kind was tried)
    replayed: bool = False  # decisions from a speed plan, nothing timed

    def plan(self) -> tuple[str, ...]:
        """The decisions as a speed plan (RefinementOptions.speed_plan): the kinds left float, or ("all",)."""
        if self.whole_model_float:
            return ("all",)
        return tuple(t.kind for t in self.trials if t.left_float)

    def lines(self) -> list[str]:
        if self.replayed:
            return [f"speed: plan replayed, nothing timed: {', '.join(self.plan()) or 'every pattern int8'}"]
        if self.skipped and math.isnan(self.int8_ms):  # stopped before timing int8
            return [f"speed (1 thread): float {self.float_ms:.3f} ms; {self.skipped}"]
        out = [f"speed (1 thread): float {self.float_ms:.3f} ms, all int8 {self.int8_ms:.3f} ms "
               f"({self.float_ms / self.int8_ms:.2f}x)"]
        if self.skipped:
            return out + [f"  {self.skipped}"]
        out += [f"  {t.kind} ({t.matches}) float: {t.before_ms:.3f} -> {t.after_ms:.3f} ms, "
                f"{'left float' if t.left_float else 'stays int8'}" for t in self.trials]
        chosen = "whole model kept float" if self.whole_model_float else "int8"
        out.append(f"  {chosen}: float {self.final_float_ms:.3f} ms vs best int8 {self.final_ms:.3f} ms "
                   f"({self.final_float_ms / self.final_ms:.2f}x); {self.timings} timings in {self.seconds:.1f}s")
        return out


@dataclass
class SpeedChoice:
    """What :func:`choose` decided: the matches kept int8 (``None``: the whole model stays float),
    the model to return, the reason of every match returned to float (by index), and the record."""

    keep: list[PatternMatch] | None
    model: ir.Model
    reasons: dict[int, str]
    report: SpeedReport


def choose(float_model: ir.Model, matches: list[PatternMatch], realize: Callable[[list[PatternMatch]], ir.Model],
           feed: dict, *, timer: Timer, progress: bool = False, qdq: ir.Model | None = None,
           budget_s: float = BUDGET_S, max_timings: int = MAX_TIMINGS, auto: bool = False,
           runtime: str = "ONNX Runtime") -> SpeedChoice:
    """Greedy search over kinds of matches to leave float (module docstring). ``realize(keep)``
    builds the QDQ model of a subset of ``matches``; ``qdq`` is the all-int8 model when already built.
    ``auto``: stop early where the search cannot pay (:data:`AUTO_INT8_SPEEDUP`, :data:`AUTO_MIN_FLOAT_MS`);
    ``runtime``: what ``timer`` runs on, as the reasons name it."""
    started = time.perf_counter()
    say = (lambda msg: print(f"speed: {msg}", file=sys.stderr, flush=True)) if progress else (lambda msg: None)
    timings = 0

    def timed(a: ir.Model, b: ir.Model, repeats: int) -> tuple[float, float]:
        nonlocal timings
        timings += 1
        ta, tb = timer([a, b], feed, repeats)
        return float(ta), float(tb)

    # One quick run settles the repeats: about SECONDS_PER_TIMING per model and timing.
    probe = float(timer([float_model], feed, 3)[0])
    repeats = int(np.clip(SECONDS_PER_TIMING * 1000 / max(probe, 1e-3), *REPEATS))
    best = qdq if qdq is not None else realize(matches)

    def unchanged(float_ms: float, int8_ms: float, why: str) -> SpeedChoice:
        say(why)
        return SpeedChoice(list(matches), best, {}, SpeedReport(float_ms, int8_ms, [], float_ms, int8_ms, False,
                                                                timings, time.perf_counter() - started, why))

    if auto and probe < AUTO_MIN_FLOAT_MS:
        return unchanged(probe, float("nan"), f"auto: under {AUTO_MIN_FLOAT_MS} ms per run, int8 kept without "
                         "timing it")
    float_ms, int8_ms = timed(float_model, best, repeats)
    say(f"float {float_ms:.3f} ms, all int8 {int8_ms:.3f} ms ({float_ms / int8_ms:.2f}x), {repeats} runs per "
        f"timing")
    if auto and float_ms >= int8_ms * AUTO_INT8_SPEEDUP:
        return unchanged(float_ms, int8_ms, f"auto: all int8 is {float_ms / int8_ms:.2f}x faster than float "
                         f"(>= {AUTO_INT8_SPEEDUP}x): no kind tried")
    kinds = [match_kind(m) for m in matches]
    excluded: set[int] = set()
    reasons: dict[int, str] = {}
    trials: list[SpeedTrial] = []

    def affordable(label: str) -> bool:  # a trial takes up to two timings; one is kept for the end
        if timings + 2 <= max_timings - 1 and time.perf_counter() - started <= budget_s:
            return True
        say(f"time budget used up ({timings} timings, {time.perf_counter() - started:.0f}s): {label} not tried")
        return False

    models: list[ir.Model] = []

    def trial(label: str, group: set[int], why) -> bool:
        """The best model so far vs the same with ``group`` float too; a win is confirmed by a second
        timing, so one lucky median does not decide. A win leaves ``group`` float (``why(i, trial)``
        is each node's reason) and its model last in ``models``."""
        candidate = realize([m for i, m in enumerate(matches) if i not in excluded | group])
        before, after = timed(best, candidate, repeats)
        faster = after <= before * (1 - MARGIN)
        if faster:
            before, after = timed(best, candidate, repeats)
            faster = after <= before * (1 - MARGIN)
        t = SpeedTrial(label, len(group), before, after, faster)
        trials.append(t)
        say(f"{label} ({len(group)}) float: {before:.3f} -> {after:.3f} ms, "
            f"{'left float' if faster else 'stays int8'}")
        if faster:
            excluded.update(group)
            reasons.update({i: why(i, t) for i in group})
            models.append(candidate)
        return faster

    present = [k for k in KINDS if k in kinds] + sorted({k for k in kinds if k not in KINDS})
    for kind in present:
        group = {i for i, k in enumerate(kinds) if k == kind}
        if len(excluded | group) == len(matches):
            continue  # nothing left int8: that is the float model, compared last
        if not affordable(f"{kind} and later kinds"):
            break
        if trial(kind, group, lambda i, t: f"speed: int8 {kind} measured slower than float on {runtime} "
                 f"(model {t.before_ms:.3f} ms -> {t.after_ms:.3f} ms with every {kind} float)"):
            best = models[-1]
    # Kinds that each helped a little (below the margin) may help together: a float island costs a
    # Q/DQ pair at each border, and neighbouring kinds excluded together share their borders.
    hopeful = [t.kind for t in trials if not t.left_float and t.after_ms < t.before_ms]
    group = {i for i, k in enumerate(kinds) if k in hopeful}
    if len(hopeful) > 1 and len(excluded | group) < len(matches) and affordable(" + ".join(hopeful)):
        label = " + ".join(hopeful)
        if trial(label, group, lambda i, t: f"speed: int8 {kinds[i]} measured slower than float on {runtime} "
                 f"with {label} float together (model {t.before_ms:.3f} ms -> {t.after_ms:.3f} ms)"):
            best = models[-1]
    final_float_ms, final_ms = timed(float_model, best, repeats)
    whole_float = final_ms > final_float_ms * (1 - MARGIN)
    if whole_float:
        why = (f"speed: the fastest int8 variant ({final_ms:.3f} ms) is not {MARGIN:.0%} faster than float "
               f"({final_float_ms:.3f} ms) on {runtime}: whole model kept float")
        reasons.update({i: why for i in range(len(matches)) if i not in reasons})
    say(f"{'whole model float' if whole_float else 'int8'}: float {final_float_ms:.3f} ms, best int8 "
        f"{final_ms:.3f} ms ({final_float_ms / final_ms:.2f}x); {timings} timings, "
        f"{time.perf_counter() - started:.1f}s")
    report = SpeedReport(float_ms, int8_ms, trials, final_float_ms, final_ms, whole_float, timings,
                         time.perf_counter() - started)
    if whole_float:
        return SpeedChoice(None, float_model, reasons, report)
    return SpeedChoice([m for i, m in enumerate(matches) if i not in excluded], best, reasons, report)


def replay(speed_plan: tuple[str, ...], float_model: ir.Model, matches: list[PatternMatch],
           realize: Callable[[list[PatternMatch]], ir.Model]) -> SpeedChoice:
    """The choice a speed plan records, without timing anything: its kinds of matches float, or the whole
    model when the plan is ("all",)."""
    nan = float("nan")
    kinds = [match_kind(m) for m in matches]
    unknown = sorted(set(speed_plan) - set(KINDS) - {"all"} - set(kinds))
    if unknown:
        raise QnnxError(f"speed plan names unknown kinds of patterns {', '.join(unknown)}; known: "
                        f"{', '.join(('all',) + KINDS)}")
    if "all" in speed_plan:
        why = "speed: the speed plan keeps the whole model float"
        report = SpeedReport(nan, nan, [], nan, nan, True, 0, 0.0, replayed=True)
        return SpeedChoice(None, float_model, {i: why for i in range(len(matches))}, report)
    trials = [SpeedTrial(k, kinds.count(k), nan, nan, True) for k in speed_plan]
    reasons = {i: f"speed: the speed plan leaves every {k} float" for i, k in enumerate(kinds) if k in speed_plan}
    keep = [m for i, m in enumerate(matches) if i not in reasons]
    report = SpeedReport(nan, nan, trials, nan, nan, False, 0, 0.0, replayed=True)
    return SpeedChoice(keep, realize(keep), reasons, report)


class SpeedFallback(Refinement):
    """``config.refinements.speed_fallback`` "on" / "auto": kinds of matches measured slower in int8 than
    in float on the target go back to float, and their decisions say so. The nodes made float join
    ``keep_float``, so every format agrees with the report. Timing-dependent: off by default."""

    name = "speed_fallback"
    validated = False  # a speed choice: leaving layers float does not need the accuracy it would gain
    reads = ("float_model", "plan", "qparams", "qdq", "exclusions", "samples", "config")
    writes = ("plan", "qdq", "keep_float", "exclusions")

    def __init__(self, timer: Timer | None = None):
        self.timer = timer  # None: the config's target's timer (another one: tests, or a remote device)

    def enabled(self, config) -> bool:
        return config.refinements.speed_fallback != "off" or config.refinements.speed_plan is not None

    def apply(self, state):
        config, the_plan = state.config, state.plan

        def activations(m: PatternMatch) -> tuple:
            return m.pattern, tuple(t.value.name for t in m.inputs if t.role == "activation")

        def without(keep: list[PatternMatch]) -> Plan:
            # Re-planned as if the user had excluded the other matches' nodes: their outputs then get no
            # quantize, so a runtime cannot fuse them into integer kernels between their neighbours' Q/DQ.
            # A pattern reading such an output would get a float input: it computes in float on the runtime
            # anyway, so it goes too. The calibrated qparams stay: every value quantized now was quantized
            # before, with the same group.
            kept = {m.nodes[0].name: activations(m) for m in keep}
            floats = [n.name for m in the_plan.matches if m.nodes[0].name not in kept for n in m.nodes]
            replanned = target_plan(state.float_model, config, state.exclusions.with_nodes(floats))
            return the_plan.keeping([m for m in replanned.matches if kept.get(m.nodes[0].name) == activations(m)])

        def realize(keep: list[PatternMatch]) -> ir.Model:
            return realize_qdq(state.float_model, without(keep), state.qparams, config)

        if config.refinements.speed_plan is not None:
            choice = replay(config.refinements.speed_plan, state.float_model, the_plan.matches, realize)
        else:
            runtime = target(config.target)
            choice = choose(state.float_model, the_plan.matches, realize, state.samples[0],
                            timer=self.timer or runtime.timer, progress=config.progress, qdq=state.qdq,
                            auto=config.refinements.speed_fallback == "auto", runtime=runtime.label)
        if choice.keep is not None and len(choice.keep) == len(the_plan.matches):
            return None, choice.report  # every match stays int8
        reasons = dict(choice.reasons)
        if choice.keep is not None:
            final = {m.nodes[0].name for m in without(choice.keep).matches}
            for i, m in enumerate(the_plan.matches):
                if i not in reasons and m.nodes[0].name not in final:
                    reasons[i] = "speed: reads a node left float for speed, so it computes in float too"
        floats = {n.name for i in reasons for n in the_plan.matches[i].nodes}
        return replace(state, plan=the_plan.mark_float(reasons), qdq=choice.model,
                       keep_float=state.keep_float | floats,
                       exclusions=state.exclusions.with_nodes(floats)), choice.report
