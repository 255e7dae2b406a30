"""The symmetric activations refinement (opt-in): zero point 0 on quantized inputs for a target whose kernels
run them faster, kept only when the target's outputs stay as close to float. The target's runtime is ONNX Runtime
here (``outputs`` patched), so the rule is tested without OpenVINO; the marked test runs the real one."""

from __future__ import annotations

import numpy as np
import pytest
from float_graphs import Graph, conv_weight, qparams_of, run_ort, samples

import qnnx
from qnnx import QuantConfig
from qnnx.autoquant.refinements import symmetric_activations as sym
from qnnx.errors import QnnxError
from qnnx.targets import target
from qnnx.targets.openvino import OpenVinoTarget


def _model(shift: float = 0.0, concat: bool = True):
    """x -> conv a -> Relu -> (+ shift) -> conv b -> y, and Concat(conv a's output, x) -> conv c -> z: the
    Relu output (never negative, or from -shift when shifted) is read by conv b only; x by conv a and the
    Concat (float, its output quantized below it for conv c)."""
    rng = np.random.default_rng(4)
    g = Graph()
    x = g.input("x", [1, 4, 8, 8])
    a = g.node("Conv", [x, g.const(conv_weight(rng, 4, 4), "wa")], name="a", pads=[1, 1, 1, 1], out="a_out")
    r = g.node("Relu", [a], name="relu", out="r_out")
    if shift:
        r = g.node("Add", [r, g.const(np.float32(-shift), "shift")], name="shift", out="shifted")
    g.node("Conv", [r, g.const(conv_weight(rng, 4, 4), "wb")], name="b", pads=[1, 1, 1, 1], out="y")
    if not concat:
        return g.model("y")
    c = g.node("Concat", [a, x], name="cat", axis=1, out="cat_out")
    g.node("Conv", [c, g.const(conv_weight(rng, 4, 8), "wc")], name="c", pads=[1, 1, 1, 1], out="z")
    return g.model("y", "z")


def _on_ort(self, model, feeds):
    names = [v.name for v in model.graph.outputs]
    return [dict(zip(names, run_ort(model, feed))) for feed in feeds]


def _quantize(model, **options):
    options = {"symmetric_activations": "auto", **options}
    return qnnx.quantize(model, samples(8, shape=(1, 4, 8, 8)),
                         config=QuantConfig(progress=False, target="openvino", weight_rounding="nearest",
                                            bias_correction="off", **options))


def _zero_points(qdq) -> dict[str, tuple]:
    out = {}
    for n in qdq.graph:
        if n.op_type == "QuantizeLinear":
            _, zp = qparams_of(n)
            out[n.inputs[0].name] = (zp.dtype, int(zp))
    return out


def test_a_candidate_is_accepted_within_a_tenth_more_error():
    assert sym.accepted(0.010, 0.0109) and sym.accepted(0.010, 0.008)
    assert not sym.accepted(0.010, 0.0111)
    assert not sym.accepted(1e-5, 1e-4)  # however small: a tenfold error is not taken


def test_a_model_already_far_from_float_on_the_target_is_not_tried(monkeypatch):
    monkeypatch.setattr(OpenVinoTarget, "outputs", _on_ort)
    monkeypatch.setattr(sym, "FAR", 0.0)
    qm = _quantize(_model(shift=0.05))
    record = qm.report.records["symmetric_activations"]
    assert record.kept is None and not record.tries and "already far from float" in record.lines()[0]
    assert _zero_points(qm.qdq)["shifted"][0] == np.uint8


def test_inputs_get_zero_point_0_except_values_a_concat_reads(monkeypatch):
    monkeypatch.setattr(OpenVinoTarget, "outputs", _on_ort)
    qm = _quantize(_model(shift=0.05))
    record = qm.report.records["symmetric_activations"]
    zero = _zero_points(qm.qdq)
    assert record.kept is record.tries[0] and "kept" in record.lines()[0]  # the first candidate: every input
    assert zero["shifted"] == (np.int8, 0)  # signed: int8 symmetric
    assert zero["x"][0] == np.uint8 and zero["x"][1] != 0  # a Concat reads it: the plugin's int8 Concat is wrong
    assert zero["cat_out"][0] == np.uint8  # the Concat's output too: the plugin moves its quantize up the Concat
    assert record.kept.values == 1


def test_a_candidate_further_from_float_is_not_kept_and_the_near_symmetric_one_is_tried_next(monkeypatch):
    monkeypatch.setattr(OpenVinoTarget, "outputs", _on_ort)
    # the Relu output shifted by -0.05 has a short negative side (zero point 0 doubles its step); the graph
    # input x is near-symmetric (normal samples)
    qm = _quantize(_model(shift=0.05, concat=False))
    plain = _quantize(_model(shift=0.05, concat=False), symmetric_activations="off")
    record = qm.report.records["symmetric_activations"]
    first, second = record.tries
    assert first.values == 2 and not first.kept and first.error > record.before * (1 + sym.RELATIVE_GROWTH)
    assert second.values == 1 and record.kept is second
    zero, before = _zero_points(qm.qdq), _zero_points(plain.qdq)
    assert zero["shifted"] == before["shifted"] and zero["shifted"][0] == np.uint8  # kept its zero point
    assert zero["x"] == (np.int8, 0) and before["x"][0] == np.uint8
    assert "tried zero point 0 on 2 value(s)" in "\n".join(record.lines())


def test_when_no_candidate_is_close_enough_the_model_is_left_as_it_was(monkeypatch):
    monkeypatch.setattr(OpenVinoTarget, "outputs", _on_ort)
    monkeypatch.setattr(sym, "accepted", lambda before, after: False)
    qm = _quantize(_model(shift=0.05, concat=False))
    plain = _quantize(_model(shift=0.05, concat=False), symmetric_activations="off")
    record = qm.report.records["symmetric_activations"]
    assert record.kept is None and len(record.tries) == 2 and "not kept" in record.lines()[0]
    assert _zero_points(qm.qdq) == _zero_points(plain.qdq)


def test_coarsening_measures_the_step_zero_point_0_costs():
    from qnnx.calibrate import qparams_from_range

    assert sym.coarsening(qparams_from_range(0.0, 4.0, "uint8", symmetric=False)) == 1.0
    assert sym.coarsening(qparams_from_range(-0.1, 4.0, "uint8", symmetric=False)) == pytest.approx(1.95, abs=0.03)
    assert sym.coarsening(qparams_from_range(-4.0, 4.0, "uint8", symmetric=False)) == pytest.approx(1.0, abs=0.01)


def test_off_by_default_and_the_onnxruntime_target_never_try_it(monkeypatch):
    monkeypatch.setattr(OpenVinoTarget, "outputs", _on_ort)
    assert QuantConfig().refinements.symmetric_activations == "off"
    assert "symmetric_activations" not in _quantize(_model(), symmetric_activations="off").report.records
    qm = qnnx.quantize(_model(), samples(8, shape=(1, 4, 8, 8)),
                       config=QuantConfig(progress=False, target="onnxruntime", weight_rounding="nearest",
                                          bias_correction="off", symmetric_activations="auto"))
    assert "symmetric_activations" not in qm.report.records
    assert not target("onnxruntime").zero_point_zero_faster


def test_without_the_runtime_the_record_says_it_was_not_tried(monkeypatch):
    def missing(self, model, feeds):
        raise QnnxError("this needs OpenVINO: pip install 'qnnx[openvino]'")

    monkeypatch.setattr(OpenVinoTarget, "outputs", missing)
    qm = _quantize(_model(shift=0.05))
    record = qm.report.records["symmetric_activations"]
    assert record.kept is None and "not tried" in record.lines()[0] and "OpenVINO" in record.lines()[0]
    assert _zero_points(qm.qdq)["shifted"][0] == np.uint8


def test_an_unknown_choice_is_refused():
    with pytest.raises(QnnxError, match="symmetric_activations"):
        QuantConfig(symmetric_activations="on")


@pytest.mark.openvino
def test_on_openvino_the_choice_follows_the_plugins_outputs_and_is_reproducible():
    pytest.importorskip("openvino")
    first, second = _quantize(_model(shift=0.05)), _quantize(_model(shift=0.05))
    record = first.report.records["symmetric_activations"]
    assert record.before is not None and record.tries
    assert [t.kept for t in record.tries] == [sym.accepted(record.before, t.error) for t in record.tries]
    assert first.qdq.graph.num_nodes() == second.qdq.graph.num_nodes()
    assert _zero_points(first.qdq) == _zero_points(second.qdq)
