"""Each stage of the pipeline alone, on a hand-made QuantState: what it writes, what it leaves alone.

Stages are called directly (no monkeypatching): a stage's contract is the fields it declares, and
Stage.__call__ refuses a stage that changes any other field.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx_ir as ir
import pytest
from float_graphs import Graph, main_model, samples

from qnnx import QnnxError, QuantConfig
from qnnx.autoquant import pipeline, stages
from qnnx.autoquant.report import QuantReport
from qnnx.autoquant.refinements.base import Refinement
from qnnx.autoquant.state import QuantState, Stage


def _state(model=None, data=None, **options) -> QuantState:
    return QuantState(config=QuantConfig(progress=False, **options), source=model or main_model(),
                      data=samples(6) if data is None else data, report=QuantReport())


def _upto(stage_name: str, state: QuantState) -> QuantState:
    for stage in pipeline.STAGES_BEFORE:
        state = stage(state)
        if stage.name == stage_name:
            return state
    raise AssertionError(stage_name)


def test_prepare_binds_the_data_reads_the_refinement_samples_and_leaves_the_source_alone():
    source = main_model()
    before = source.SerializeToString()
    state = stages.PREPARE(_state(source, refinement_samples=4))
    assert source.SerializeToString() == before
    assert [s.name for s in state.data.specs] == ["x"] and len(state.data) == 6
    assert len(state.samples) == 4 and all(set(f) == {"x"} for f in state.samples)
    np.testing.assert_array_equal(state.samples[0]["x"], samples(6)[0])
    assert state.plan is None and state.qdq is None  # nothing else written


def test_plan_writes_a_decision_for_every_node_and_refuses_a_model_with_nothing_to_quantize():
    state = stages.PLAN(stages.PREPARE(_state()))
    assert state.plan.matches and state.report.decisions is state.plan.decisions
    g = Graph()
    x = g.input("x", [1, 4])
    nothing = g.model(g.node("Identity", [x]))
    with pytest.raises(QnnxError, match="nothing to quantize: no node matched"):
        stages.PLAN(stages.PREPARE(_state(nothing, data=[np.ones((1, 4), np.float32)])))


def test_calibrate_writes_qparams_for_every_planned_activation_and_records_what_it_read():
    state = stages.CALIBRATE(_upto("plan", _state()))
    activations = {t.value.name for m in state.plan.matches for t in (*m.inputs, *m.outputs) if t.role == "activation"}
    assert activations <= set(state.qparams)
    rec = state.report.calibration
    assert rec.calibrator == "float" and rec.samples == 6 and rec.seconds > 0


def test_realize_leaves_the_float_model_alone():
    state = _upto("calibrate", _state())
    float_nodes = [n.op_type for n in state.float_model.graph]
    after = stages.REALIZE(state)
    assert [n.op_type for n in after.float_model.graph] == float_nodes
    ops = [n.op_type for n in after.qdq.graph]
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops


def test_a_stage_that_writes_an_undeclared_field_is_refused():
    sneaky = Stage("sneaky", lambda s: replace(s, qparams={"x": None}), ("config",), ())
    with pytest.raises(RuntimeError, match="sneaky.*qparams"):
        sneaky(_state())
    with pytest.raises(ValueError, match="unknown state fields"):
        Stage("bad", lambda s: s, ("no_such_field",), ())


class _Spoiler(Refinement):
    """Edits the QDQ model it is given, then says it changed nothing (or not)."""

    name = "spoiler"
    edits_qdq = True

    def __init__(self, keep: bool):
        self.keep = keep

    def enabled(self, config):
        return True

    def apply(self, state):
        state.qdq.graph.remove(next(iter(state.qdq.graph)), safe=False)
        return (state if self.keep else None), {"lines": lambda: []}


@pytest.mark.parametrize("keep", [True, False])
def test_a_refinement_edits_its_own_copy_and_can_be_undone(keep):
    state = stages.REALIZE(_upto("calibrate", _state()))
    nodes = state.qdq.graph.num_nodes()
    after = pipeline.refine(state, _Spoiler(keep))
    assert state.qdq.graph.num_nodes() == nodes  # the state before it is whole
    assert after.qdq.graph.num_nodes() == (nodes - 1 if keep else nodes)
    assert "spoiler" in state.report.records


def test_a_run_that_quantizes_nothing_fails_unless_allowed():
    model = main_model()
    everything = ("*",)
    with pytest.raises(QnnxError, match="nothing was quantized.*allow-float"):
        pipeline.run(model, samples(4), QuantConfig(progress=False, exclude_nodes=everything))
    state = pipeline.run(model, samples(4), QuantConfig(progress=False, exclude_nodes=everything, allow_float=True))
    assert not state.report.quantized()
    assert not [n for n in state.qdq.graph if n.op_type == "QuantizeLinear"]


def test_exclusions_take_globs_and_name_the_closest_candidates():
    state = stages.PREPARE(_state())
    names = [n.name for n in state.float_model.graph]
    conv = next(n for n in names if n.startswith("conv"))
    planned = stages.PLAN(replace(state, config=QuantConfig(progress=False, exclude_nodes=(conv[:-1] + "*",))))
    assert not next(d for d in planned.plan.decisions if d.node == conv).quantized
    with pytest.raises(QnnxError, match=f"matches no node.*did you mean '{conv}'"):
        stages.PLAN(replace(state, config=QuantConfig(progress=False, exclude_nodes=(conv + "x",))))
    with pytest.raises(QnnxError, match="no node of that op type.*did you mean 'Conv'"):
        stages.PLAN(replace(state, config=QuantConfig(progress=False, exclude_op_types=("conv",))))


def test_agreement_integerize_and_target_write_their_records_only():
    state = stages.REALIZE(_upto("calibrate", _state()))
    state = stages.AGREEMENT(state)
    assert [o.name for o in state.report.outputs] == ["y"] and state.report.outputs[0].samples == 6
    state = stages.INTEGERIZE(state)
    assert any(n.domain == "qnnx" for n in state.canonical.graph) and state.report.left_in_float == []
    state = stages.TARGET_CHECK(state)
    record = state.report.records["onnxruntime"]
    assert record.fusable >= 1 and record.unfused == []


def test_prepare_record_says_the_prepared_model_matches_the_original():
    state = stages.PREPARE(_state())
    record = state.report.records["prepare"]
    assert record.samples == 2 and record.max_error < 1e-5 and record.not_applied == () and record.lines() == []


def test_a_rewrite_that_makes_the_model_unrunnable_is_left_out_with_the_runtimes_reason(monkeypatch):
    """A prepared model ONNX Runtime refuses counts as one that computes something else: the rewrite whose
    absence makes it run again is left out and named, instead of the whole run failing."""
    real = stages.prepare_model

    def breaking(model, *, skip=frozenset(), **options):
        result = real(model, skip=skip, **options)
        if "fuse_batchnorm" not in skip:  # this "rewrite" leaves an attribute the op does not have
            node = next(n for n in result.model.graph if n.op_type == "Conv")
            node.attributes["no_such_attribute"] = ir.AttrInt64("no_such_attribute", 1)
        return result

    monkeypatch.setattr(stages, "prepare_model", breaking)
    record = stages.PREPARE(_state()).report.records["prepare"]
    assert [name for name, _ in record.not_applied] == ["fuse_batchnorm"]
    assert "does not run" in record.not_applied[0][1] and record.max_error < 1e-5


class _Ruiner(Refinement):
    """Multiplies every weight's scale by 30: the outputs go far from float."""

    name = "ruiner"
    edits_qdq = True

    def enabled(self, config):
        return True

    def apply(self, state):
        for n in state.qdq.graph:
            if n.op_type == "DequantizeLinear" and n.inputs[0].const_value is not None \
                    and n.inputs[0].dtype == ir.DataType.INT8:
                n.inputs[1].const_value = ir.tensor(n.inputs[1].const_value.numpy() * 30)
        return state, {"lines": lambda: []}


def test_a_refinement_that_pushes_the_outputs_far_after_the_guard_is_undone_not_refused():
    """After the accuracy guard brought every output within bounds, a later refinement that moves one far
    is undone (its record says so) instead of the whole model being refused; without the guard before it,
    the model is refused as before."""
    guard = next(r for r in pipeline.REFINEMENTS if r.name == "accuracy_guard")
    state = pipeline.run(main_model(), samples(6), QuantConfig(progress=False), refinements=(guard, _Ruiner()))
    record = state.report.records["ruiner"]
    assert isinstance(record, pipeline.PushedFar) and "undone" in record.lines()[0]
    assert not state.report.far_outputs()
    with pytest.raises(QnnxError, match="far from the float model"):
        pipeline.run(main_model(), samples(6), QuantConfig(progress=False), refinements=(_Ruiner(),))


def test_agreement_says_why_when_the_outputs_could_not_be_compared():
    state = _upto("realize", _state())
    stages.AGREEMENT(state)
    assert state.report.outputs and "agreement" not in state.report.records
    broken = state.qdq.clone()
    node = next(n for n in broken.graph if n.op_type == "QuantizeLinear")
    node.domain = "no.such.domain"  # ONNX Runtime cannot load it
    scratch = replace(state, qdq=broken, report=QuantReport())
    stages.AGREEMENT(scratch)
    assert scratch.report.outputs == []
    assert "not compared with float" in scratch.report.summary()
    assert "ONNX Runtime cannot load" in scratch.report.records["agreement"].unmeasured
