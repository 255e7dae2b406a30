"""Speed-aware fallback (``QuantConfig(speed_fallback="on" | "auto")``, autoquant/refinements/speed_fallback.py).

The greedy logic is tested with a fake timer (``SpeedFallback(timer)``, run by the pipeline's runner in
place of the default refinement, or ``choose(..., timer=)``): each model's
"latency" is the sum of per-node costs, a node counting as int8 when every float input it reads
comes from a DequantizeLinear (ONNX Runtime's condition for fusing it into an integer kernel).
One test runs the real timer on ONNX Runtime and asserts only what does not depend on timing.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from float_graphs import Graph, conv_weight, nodes_by_name, run_ort, samples

import qnnx
from qnnx import QnnxError, QuantConfig
from qnnx.autoquant import pipeline
from qnnx.autoquant.patterns import PatternMatch, Target
from qnnx.autoquant.pipeline import QuantizedModel
from qnnx.autoquant.refinements import speed_fallback as speed
from qnnx.autoquant.refinements.speed_fallback import SpeedFallback
from qnnx.targets import target


def _pointwise_then_depthwise(g: Graph, rng):
    """x[1,4,8,8] -> pw (1x1 conv to 8 channels) -> relu (r) -> dw (3x3, group 8); (r, dw's output)."""
    x = g.input("x", [1, 4, 8, 8])
    pw = g.node("Conv", [x, g.const(conv_weight(rng, 8, 4, k=1), "w_pw")], name="pw", out="pw_out")
    r = g.node("Relu", [pw], name="relu", out="r")
    dw = g.node("Conv", [r, g.const((rng.standard_normal((8, 1, 3, 3)) * 0.3).astype(np.float32), "w_dw")],
                name="dw", group=8, pads=[1, 1, 1, 1], out="dw_out")
    return r, dw


def _model():
    """x[1,4,8,8] -> pw (1x1 conv) + relu -> dw (3x3, group 8) -> add (residual) -> sig -> gap -> flatten
    -> mm -> y[1,5]: one match of each kind pointwise conv, depthwise conv, binary, elementwise, pool, matmul."""
    rng = np.random.default_rng(0)
    g = Graph()
    r, dw = _pointwise_then_depthwise(g, rng)
    a = g.node("Add", [dw, r], name="add", out="a")
    s = g.node("Sigmoid", [a], name="sig", out="s")
    p = g.node("GlobalAveragePool", [s], name="gap", out="p")
    f = g.node("Flatten", [p], name="flatten", out="f")
    g.node("MatMul", [f, g.const((rng.standard_normal((8, 5)) * 0.3).astype(np.float32), "w_mm")], name="mm",
           out="y")
    return g.model("y")


CALIB = samples(4, shape=(1, 4, 8, 8))


def _is_int8(node: ir.Node) -> bool:
    reads = [v for v in node.inputs if v is not None and v.dtype is not None and v.dtype.is_floating_point()]
    return bool(reads) and all(v.producer() is not None and v.producer().op_type == "DequantizeLinear"
                               for v in reads)


def _fake_timer(costs: dict[str, tuple[float, float]], log: list | None = None):
    """Latency = sum of costs[node] = (float ms, int8 ms) over the named nodes; others cost nothing."""

    def cost(model: ir.Model) -> float:
        return sum(costs[n.name][_is_int8(n)] for n in model.graph if n.name in costs)

    def timer(models, feed, repeats):
        if log is not None:
            log.append(len(models))
        return [cost(m) for m in models]

    return timer


def _quantize_timed(timer, model=None, calib=CALIB, **options) -> QuantizedModel:
    """quantize() with the speed fallback timing on ``timer`` (the other refinements as configured)."""
    refinements = tuple(SpeedFallback(timer) if isinstance(r, SpeedFallback) else r for r in pipeline.REFINEMENTS)
    config = QuantConfig(**{"progress": False, "speed_fallback": True, **options})
    return QuantizedModel(pipeline.run(_model() if model is None else model, calib, config, refinements))


def _quantize(costs, **options):
    return _quantize_timed(_fake_timer(costs), **options)


def _speed(qm):
    return qm.report.record("speed_fallback")


def _decisions(qm):
    return {d.node: d for d in qm.report.decisions}


def test_config_validates_speed_fallback():
    # (off by default now: timing makes the output depend on the machine's load)
    assert QuantConfig().refinements.speed_fallback == "off"
    with pytest.raises(QnnxError, match="speed_fallback must be one of off, auto, on"):
        QuantConfig(speed_fallback="yes")
    assert QuantConfig.from_dict({"speed_fallback": True}).refinements.speed_fallback == "on"
    assert QuantConfig(speed_fallback=False).refinements.speed_fallback == "off"


def test_off_never_times():
    log = []
    qm = _quantize_timed(_fake_timer({"mm": (2.0, 1.0)}, log), speed_fallback="off")
    assert log == [] and _speed(qm) is None


def test_auto_keeps_int8_without_a_search_when_it_is_clearly_faster():
    # every node 2x faster in int8 except dw (slower): "on" would try it, "auto" stops after one timing
    costs = {"pw": (4, 1), "dw": (1, 3), "add": (2, 1), "sig": (2, 1), "gap": (2, 1), "mm": (2, 1)}
    qm = _quantize(costs, speed_fallback="auto")
    s = _speed(qm)
    assert (s.float_ms, s.int8_ms, s.trials, s.timings) == (13, 8, [], 1)
    assert s.skipped == "auto: all int8 is 1.62x faster than float (>= 1.2x): no kind tried"
    assert all(d.quantized for d in qm.report.decisions if d.pattern) and not qm.keep_float
    assert "no kind tried" in qm.report.summary()
    assert not _decisions(_quantize(costs, speed_fallback="on"))["dw"].quantized


def test_auto_searches_when_int8_is_not_clearly_faster():
    # all int8 only 1.05x faster (dw slow): auto searches and leaves dw float, like "on"
    costs = {"pw": (2, 1), "dw": (1, 5.5), "add": (2, 1), "sig": (2, 1), "gap": (2, 1), "mm": (2, 1)}
    qm = _quantize(costs, speed_fallback="auto")
    assert not _speed(qm).skipped and _speed(qm).trials
    assert not _decisions(qm)["dw"].quantized


def test_auto_does_not_time_tiny_graphs():
    log = []
    qm = _quantize_timed(_fake_timer({"mm": (speed.AUTO_MIN_FLOAT_MS / 2, 1.0)}, log), speed_fallback="auto")
    assert log == [1]  # the probe only
    s = _speed(qm)
    assert s.skipped.startswith("auto: under 0.5 ms per run") and s.trials == [] and s.int8_ms != s.int8_ms
    assert "int8 kept without timing it" in qm.report.summary()
    assert all(d.quantized for d in qm.report.decisions if d.pattern)


def test_match_kinds():
    m = _model()
    qnnx.quantize(m, CALIB, QuantConfig(progress=False))  # the model quantizes as a whole
    graph = ir.from_proto(m).graph
    by_name = nodes_by_name(ir.from_proto(m))
    w = {"w_pw": graph.initializers["w_pw"], "w_dw": graph.initializers["w_dw"]}
    x = Target(graph.inputs[0], "activation")
    assert speed.match_kind(PatternMatch("conv", (by_name["pw"],), (x, Target(w["w_pw"], "weight", 0)), ())) \
        == "pointwise conv"
    assert speed.match_kind(PatternMatch("conv", (by_name["dw"],), (x, Target(w["w_dw"], "weight", 0)), ())) \
        == "depthwise conv"
    assert speed.match_kind(PatternMatch("gemm", (by_name["mm"],), (x,), ())) == "matmul/gemm"
    assert speed.match_kind(PatternMatch("pool", (by_name["gap"],), (x,), ())) == "pool"


def test_slower_kind_stays_float_with_the_reason():
    # dw int8 is 4 ms slower; every other node is twice as fast in int8.
    costs = {"pw": (2, 1), "dw": (1, 5), "add": (2, 1), "sig": (2, 1), "gap": (2, 1), "mm": (2, 1)}
    qm = _quantize(costs)
    d = _decisions(qm)
    assert not d["dw"].quantized
    assert d["dw"].reason.startswith("speed: int8 depthwise conv measured slower than float on ONNX Runtime (model ")
    assert all(d[n].quantized for n in ("pw", "sig", "gap", "mm"))
    # Truly float in the model: float weights, and no quantize after it (a runtime would fuse DQ -> Conv -> Q)
    nodes = nodes_by_name(qm.qdq)
    assert nodes["dw"].inputs[1].producer() is None
    assert all(u.node.op_type != "QuantizeLinear" for u in nodes["dw"].outputs[0].uses())
    # The residual add would read the float dw output (no QLinearAdd then): it goes float too, and says why.
    assert not d["add"].quantized and d["add"].reason == "speed: reads a node left float for speed, so it " \
        "computes in float too"
    assert nodes["add"].inputs[0] is nodes["dw"].outputs[0]
    trial = next(t for t in _speed(qm).trials if t.kind == "depthwise conv")
    assert trial.left_float and trial.after_ms < trial.before_ms
    assert not _speed(qm).whole_model_float
    assert "depthwise conv (1) float" in qm.report.summary()
    assert "dw" in qm.keep_float and "pw" not in qm.keep_float
    (y,) = run_ort(qm.qdq, {"x": CALIB[0]})
    assert y.shape == (1, 5)


def test_a_pattern_reading_a_float_kind_follows_it():
    # x -> conv + relu -> Mul(0.5) -> gap -> flatten -> mm: with the conv float, the scale (a type change of the
    # conv's integers) has nothing to rescale and computes in float too.
    rng = np.random.default_rng(1)
    g = Graph()
    x = g.input("x", [1, 3, 8, 8])
    c = g.node("Conv", [x, g.const(conv_weight(rng, 4, 3), "w")], name="c", pads=[1, 1, 1, 1], out="c_out")
    r = g.node("Relu", [c], name="r", out="r_out")  # else prepare folds the Mul into the conv's weights
    sc = g.node("Mul", [r, g.const(np.array(0.5, np.float32), "half")], name="sc", out="sc_out")
    p = g.node("GlobalAveragePool", [sc], name="gap", out="p")
    f = g.node("Flatten", [p], name="flatten", out="f")
    g.node("MatMul", [f, g.const((rng.standard_normal((4, 2)) * 0.3).astype(np.float32), "w_mm")], name="mm",
           out="y")
    qm = _quantize_timed(_fake_timer({"c": (1, 5), "gap": (2, 1), "mm": (2, 1)}), g.model("y"), samples(4))
    d = _decisions(qm)
    assert d["c"].reason.startswith("speed: int8 conv measured slower")
    assert not d["sc"].quantized and d["sc"].reason == "speed: reads a node left float for speed, so it computes " \
        "in float too"
    assert d["gap"].quantized and d["mm"].quantized
    assert {"c", "r", "sc"} <= qm.keep_float
    assert nodes_by_name(qm.qdq)["sc"].op_type == "Mul"  # not folded into a DequantizeLinear


def test_faster_kinds_stay_int8():
    costs = {n: (2, 1) for n in ("pw", "dw", "add", "sig", "gap", "mm")}
    qm = _quantize(costs)
    assert all(d.quantized for d in qm.report.decisions if d.pattern)
    s = _speed(qm)
    assert (s.float_ms, s.int8_ms, s.final_ms) == (12, 6, 6) and not s.whole_model_float
    assert s.trials and not any(t.left_float for t in s.trials)


def test_whole_model_float_when_int8_is_slower():
    costs = {n: (1, 2) for n in ("pw", "dw", "add", "sig", "gap", "mm")}
    with pytest.raises(QnnxError, match="nothing was quantized: speed: .*allow-float"):
        _quantize(costs)  # a model left all float is an error unless asked for
    qm = _quantize(costs, allow_float=True)
    assert _speed(qm).whole_model_float
    assert not any(d.quantized for d in qm.report.decisions)
    assert all(d.reason.startswith("speed: ") for d in qm.report.decisions if d.pattern)
    assert any("whole model kept float" in d.reason for d in qm.report.decisions)
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in qm.qdq.graph)
    assert "whole model kept float" in qm.report.summary()


def test_int8_only_a_little_faster_than_float_stays_float():
    # 2% faster than float is within the margin: quantizing would cost accuracy for nothing measurable.
    costs = {"mm": (1.0, 0.98)}
    qm = _quantize(costs, allow_float=True)
    assert _speed(qm).whole_model_float


@pytest.mark.parametrize("dw_int8, left_float", [(1.04, False), (1.2, True)])
def test_margin(dw_int8, left_float):
    # All int8: dw_int8 + 1; dw float: 1 + 1 (add then float too, at no cost here). 1.04 -> 2% gain: kept int8.
    qm = _quantize({"dw": (1.0, dw_int8), "mm": (2.0, 1.0)})
    assert _decisions(qm)["dw"].quantized is not left_float
    assert not _speed(qm).whole_model_float


def test_a_win_is_confirmed_by_a_second_timing():
    calls = []
    # pw float would take dw with it (dw would read a float input): make that a clear loss.
    base = _fake_timer({"pw": (10.0, 1.0), "dw": (1.0, 5.0), "mm": (2.0, 1.0)})

    def flaky(models, feed, repeats):  # the confirmation of the first trial sees no difference
        calls.append(len(models))
        out = base(models, feed, repeats)
        return [out[0], out[0]] if len(calls) == 4 else out

    qm = _quantize_timed(flaky)
    # calls: probe, float vs int8, dw trial, dw confirmation (flat: rejected), ...
    assert _decisions(qm)["dw"].quantized
    assert not _speed(qm).trials[0].left_float


def test_budget_caps_the_timings(capsys):
    m = qnnx.quantize(_model(), CALIB, QuantConfig(progress=False)).qdq
    log = []
    timer = _fake_timer({"dw": (1.0, 5.0), "mm": (2.0, 1.0)}, log)
    # A stand-in plan: six matches of different kinds (only their kinds matter to the search).
    graph = ir.from_proto(_model()).graph
    by_name = {n.name: n for n in graph}
    x = Target(graph.inputs[0], "activation")
    matches = [PatternMatch(p, (by_name[n],), (x,), ()) for p, n in
               [("binary", "add"), ("elementwise", "sig"), ("pool", "gap"), ("gemm", "mm")]]
    choice = speed.choose(m, matches, lambda keep: m, {"x": CALIB[0]}, timer=timer, max_timings=5, progress=True)
    # float vs int8, two trials (nothing gained: no confirmation), the end: a third trial could need 2 more.
    assert choice.report.timings == 4 and len(choice.report.trials) == 2
    assert "speed: time budget used up (3 timings" in capsys.readouterr().err
    assert log == [1, 2, 2, 2, 2]  # the probe, then interleaved pairs
    choice = speed.choose(m, matches, lambda keep: m, {"x": CALIB[0]}, timer=timer, budget_s=0.0)
    assert choice.report.timings == 2 and not choice.report.trials


def test_progress_lines(capsys):
    _quantize_timed(_fake_timer({"dw": (1.0, 5.0), "mm": (2.0, 1.0)}), progress=True)
    err = capsys.readouterr().err
    assert "speed: float 3.000 ms, all int8 6.000 ms" in err
    assert "speed: depthwise conv (1) float: 6.000 -> 2.000 ms, left float" in err


def test_real_onnx_runtime_run():
    """The real timer (the target's): whatever it decides, the result runs, agrees with the report, and is
    recorded. (allow_float: a decision to keep the whole model float is otherwise an error.)"""
    assert target("onnxruntime").timer is not None
    qm = qnnx.quantize(_model(), CALIB, QuantConfig(progress=False, speed_fallback=True, allow_float=True))
    s = _speed(qm)
    assert s is not None and s.float_ms > 0 and s.int8_ms > 0 and s.timings >= 2
    (y,) = run_ort(qm.qdq, {"x": CALIB[0]})
    assert y.shape == (1, 5) and np.all(np.isfinite(y))
    has_qdq = any(n.op_type == "QuantizeLinear" for n in qm.qdq.graph)
    assert has_qdq is not s.whole_model_float
    if not s.whole_model_float:  # kept int8 only when measured faster than float by the margin
        assert s.final_ms <= s.final_float_ms * (1 - speed.MARGIN)


def test_a_re_planned_model_keeps_the_targets_per_channel_depthwise_inputs():
    # x -> pw + relu -> dw -> relu -> 3x3 conv c -> y on OpenVINO with per-channel depthwise inputs: the fallback
    # re-plans without c as the plan stage planned (the dw conv's input still per channel).
    rng = np.random.default_rng(4)
    g = Graph()
    _, dw = _pointwise_then_depthwise(g, rng)
    r2 = g.node("Relu", [dw], name="relu2", out="r2")
    g.node("Conv", [r2, g.const(conv_weight(rng, 4, 8), "w_c")], name="c", pads=[1, 1, 1, 1], out="y")
    costs = {"pw": (2, 1), "dw": (10, 1), "c": (1, 5)}
    qm = _quantize_timed(_fake_timer(costs), g.model("y"), CALIB, target="openvino", depthwise_inputs="per_channel")
    d = _decisions(qm)
    assert not d["c"].quantized and d["dw"].quantized
    assert d["c"].reason.startswith("speed: int8 conv measured slower than float on OpenVINO")
    dq = nodes_by_name(qm.qdq)["dw"].inputs[0].producer()
    assert dq.op_type == "DequantizeLinear" and dq.inputs[1].const_value.numpy().shape == (8,)
