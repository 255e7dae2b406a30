"""Bias correction (qnnx.autoquant.bias_correction): "own", a layer's own mean output error per
channel from weight and bias rounding on its measured input means, and "sequential", each conv's
whole mean output shift against the float model, stage by stage; both folded into the int32 bias."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from float_graphs import Graph, conv_weight, run_ort

import qnnx
from qnnx import QuantConfig
from qnnx.autoquant.refinements.bias_correction import bias_dequantize, stages
from qnnx.errors import QnnxError
from qnnx.ir import const_array


def _one_conv(rng):
    """A 1x1 conv whose weights all round the same way on the int8 grid, on inputs with a large mean:
    the weight rounding shifts every output channel's mean by the same sign."""
    g = Graph()
    w = np.full((4, 8, 1, 1), 0.3, np.float32)
    w[:, 0] = 1.0  # sets the per-channel scale to 1/127: 0.3 -> 38.1 steps, rounded down to 38
    g.node("Conv", [g.input("x", [1, 8, 6, 6]), g.const(w, "w"), g.const(np.zeros(4, np.float32) + 0.5, "b")],
           name="conv", out="y")
    return g.model("y")


def _mean_error(model, qdq, samples):
    errs = [run_ort(model, {"x": x})[0] - run_ort(qdq, {"x": x})[0] for x in samples]
    return np.abs(np.mean(errs, axis=(0, 1, 3, 4))).max()


def test_correction_removes_the_mean_shift_of_weight_rounding():
    rng = np.random.default_rng(0)
    model = _one_conv(rng)
    calib = [(rng.standard_normal((1, 8, 6, 6)) + 3).astype(np.float32) for _ in range(8)]
    evals = [(rng.standard_normal((1, 8, 6, 6)) + 3).astype(np.float32) for _ in range(8)]
    # nearest rounding: weight_rounding="gptq" folds the mean error of its own rounding into the bias first;
    # 8-bit weights: the grid the weights below were chosen against
    plain = qnnx.quantize(model, calib, QuantConfig(progress=False, bias_correction=False, weight_bits=8,
                                                    weight_rounding="nearest")).qdq
    corrected = qnnx.quantize(model, calib, QuantConfig(progress=False, bias_correction=True, weight_bits=8,
                                                        weight_rounding="nearest")).qdq
    before, after = _mean_error(model, plain, evals), _mean_error(model, corrected, evals)
    assert before > 0.01  # 7 weights x (0.3 - 38/127) x mean 3: about 0.015 per channel
    assert after < before / 3


def test_correction_changes_nothing_without_biased_layers():
    g = Graph()
    g.node("MatMul", [g.input("x", [2, 8]), g.const(np.full((8, 3), 0.3, np.float32), "w")], name="mm", out="y")
    model = g.model("y")
    rng = np.random.default_rng(1)
    calib = [rng.standard_normal((2, 8)).astype(np.float32) for _ in range(4)]
    a = qnnx.quantize(model, calib, QuantConfig(progress=False, bias_correction=False, accuracy_guard=False)).qdq
    b = qnnx.quantize(model, calib, QuantConfig(progress=False, bias_correction=True, accuracy_guard=False)).qdq
    x = calib[0]
    np.testing.assert_array_equal(run_ort(a, {"x": x})[0], run_ort(b, {"x": x})[0])


# --------------------------------------------------------------------------- sequential correction


def _chain(rng, loud: bool = True):
    """conv1 -> relu -> conv2 -> relu -> conv3, with one loud input channel: the per-tensor uint8 scale it
    sets leaves the quiet channels a few levels, and their rounding shifts every conv's output mean."""
    g = Graph()
    x = g.input("x", [1, 4, 8, 8])
    w1 = conv_weight(rng, 8, 4)
    a = g.node("Relu", [g.node("Conv", [x, g.const(w1, "w1"), g.const(np.full(8, 0.05, np.float32))], name="conv1",
                               pads=[1, 1, 1, 1])])
    w2 = conv_weight(rng, 8, 8, k=1)
    b = g.node("Relu", [g.node("Conv", [a, g.const(w2, "w2"), g.const(np.zeros(8, np.float32))], name="conv2")])
    g.node("Conv", [b, g.const(conv_weight(rng, 4, 8, k=1), "w3"), g.const(np.zeros(4, np.float32))], name="conv3",
           out="y")
    return g.model("y")


def _samples(rng, n):
    out = []
    for _ in range(n):
        x = (rng.standard_normal((1, 4, 8, 8)) * 0.05 + 0.1).astype(np.float32)
        x[:, 0] *= 60  # the loud channel
        out.append(x)
    return out


def _output_means(model, names, samples):
    from qnnx import runtime

    sess = runtime.session(model if isinstance(model, ir.Model) else ir.from_proto(model), outputs=names,
                           optimize=False)
    outs = [sess.run(names, {"x": x}) for x in samples]
    return {n: np.mean([o[i].mean(axis=(0, 2, 3)) for o in outs], axis=0) for i, n in enumerate(names)}


def _conv_outputs(model):
    return {n.name: n.outputs[0].name for n in model.graph if n.op_type == "Conv"}


def test_sequential_correction_matches_every_conv_mean_to_float_on_its_samples():
    rng = np.random.default_rng(4)
    model = _chain(rng)
    calib = _samples(rng, 8)
    cfg = dict(progress=False, speed_fallback="off", refinement_samples=8, batch_size=1,
               weight_rounding="nearest")  # the weight rounding's own mean fold would shrink the shifts first
    off = qnnx.quantize(model, calib, QuantConfig(bias_correction="off", **cfg))
    seq = qnnx.quantize(model, calib, QuantConfig(bias_correction="sequential", **cfg))
    names = _conv_outputs(off.qdq)
    # conv3's output is the graph output "y": the QDQ model quantized it and calls the float value "y_float"
    assert names == {"conv1": names["conv1"], "conv2": names["conv2"], "conv3": "y_float"}
    float_names = {**names, "conv3": "y"}
    want = {names[k]: v for k, v in zip(names, _output_means(ir.from_proto(model), list(float_names.values()),
                                                             calib).values())}
    before = _output_means(off.qdq, list(names.values()), calib)
    after = _output_means(seq.qdq, list(names.values()), calib)
    for node, value in names.items():
        bias_dq = bias_dequantize(next(n for n in seq.qdq.graph if n.name == node))
        step = np.asarray(const_array(bias_dq.inputs[1]), np.float64)
        # Every layer's mean is the float one to within half its bias grid step: a later stage measured on
        # stale (uncorrected) cached inputs of an earlier one would leave the later layers off.
        np.testing.assert_array_less(np.abs(after[value] - want[value]), step / 2 + 1e-6)
    shift = max(np.abs(before[v] - want[v]).max() for v in names.values())
    assert shift > 50 * max(np.asarray(const_array(bias_dequantize(n).inputs[1])).max()
                            for n in seq.qdq.graph if n.op_type == "Conv")  # there was something to correct
    records = {r.node: r for r in seq.report.record("bias_correction").corrections}
    assert [(n, records[n].stage) for n in sorted(records)] == [("conv1", 0), ("conv2", 1), ("conv3", 2)]
    assert all(r.shift_rms > 0 and 0 < r.relative < 1 for r in records.values())
    assert ("3 conv(s) corrected for their mean output shift against float in 3 sequential stage(s)"
            in seq.report.summary())
    assert off.report.record("bias_correction") is None  # not run
    check = seq.report.record("bias_correction").check  # kept: the output agrees better with float than before
    assert check.kept and check.layers == 3 and check.after > check.before
    assert f"outputs' mean per-channel cosine {check.before:.4f} -> {check.after:.4f}" in seq.report.summary()


def test_a_correction_that_makes_the_outputs_worse_is_undone(monkeypatch):
    """The check after the correction (bias_correction.CorrectionCheck): a correction whose outputs agree
    worse with float than before it is taken back, and the report says so."""
    from qnnx.autoquant.refinements import bias_correction
    from qnnx.autoquant.refinements.bias_correction import CorrectionRecord, add_to_bias

    def harmful(float_model, qdq, samples, progress=False):  # shifts every conv's output by +2 per channel
        nodes = [n for n in qdq.graph if n.op_type == "Conv" and bias_dequantize(n) is not None]
        for n in nodes:
            add_to_bias(n, np.full(np.asarray(const_array(bias_dequantize(n).inputs[0])).shape, 2.0))
        return [CorrectionRecord(n.name, 0, 2.0, 1.0) for n in nodes]

    rng = np.random.default_rng(4)
    model = _chain(rng)
    calib = _samples(rng, 8)
    cfg = dict(progress=False, speed_fallback="off", refinement_samples=8, batch_size=1)
    off = qnnx.quantize(model, calib, QuantConfig(bias_correction="off", **cfg))
    # (a fault injected into the correction, not a stage observed: the refinement's own check must catch it)
    monkeypatch.setattr(bias_correction, "correct_biases_sequentially", harmful)
    seq = qnnx.quantize(model, calib, QuantConfig(bias_correction="sequential", **cfg))
    record = seq.report.record("bias_correction")
    check = record.check
    assert not check.kept and check.layers >= 1 and check.after < check.before - 0.01
    assert record.corrections == [] and seq.report.outputs == off.report.outputs
    x = calib[0]
    np.testing.assert_array_equal(run_ort(seq.qdq, {"x": x})[0], run_ort(off.qdq, {"x": x})[0])
    assert (f"correction of {check.layers} conv(s) undone: the outputs' mean per-channel cosine to float fell "
            f"{check.before:.4f} -> {check.after:.4f} with it" in seq.report.summary())


def test_stages_put_independent_convs_together():
    rng = np.random.default_rng(5)
    g = Graph()
    x = g.input("x", [1, 4, 6, 6])
    a = g.node("Conv", [x, g.const(conv_weight(rng, 4, 4, k=1)), g.const(np.zeros(4, np.float32))], name="a")
    b = g.node("Conv", [x, g.const(conv_weight(rng, 4, 4, k=1)), g.const(np.zeros(4, np.float32))], name="b")
    c = g.node("Conv", [g.node("Add", [a, b]), g.const(conv_weight(rng, 4, 4, k=1)), g.const(np.zeros(4, np.float32))],
               name="c")
    d = g.node("Conv", [x, g.const(conv_weight(rng, 4, 4, k=1)), g.const(np.zeros(4, np.float32))], name="d")
    g.node("Concat", [c, d], axis=1, out="y")
    m = ir.from_proto(g.model("y"))
    layers = [n for n in m.graph if n.op_type == "Conv"]
    assert [[n.name for n in s] for s in stages(layers, m.graph)] == [["a", "b", "d"], ["c"]]


def test_bias_correction_values():
    assert QuantConfig(bias_correction=True).refinements.bias_correction == "own"
    assert QuantConfig(bias_correction=False).refinements.bias_correction == "off"
    assert QuantConfig().refinements.bias_correction == "sequential"
    with pytest.raises(QnnxError, match="bias_correction must be one of off, own, sequential"):
        QuantConfig(bias_correction="all")

