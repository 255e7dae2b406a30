"""Held-out validation: samples set apart are never calibrated or fitted on, and each step is kept only
when it lowers their error by more than its spread."""

from __future__ import annotations

import numpy as np
import pytest
from float_graphs import main_model, samples

import qnnx
from qnnx import QnnxError, QuantConfig
from qnnx.autoquant import pipeline, stages
from qnnx.autoquant.report import QuantReport
from qnnx.autoquant.state import QuantState
from qnnx.autoquant.validation import Verdict, sample_errors


def test_a_verdict_needs_a_gain_larger_than_its_spread():
    before = np.array([0.10, 0.12, 0.11, 0.13])
    assert Verdict.of("x", before, before - 0.05).kept
    assert not Verdict.of("x", before, before + 0.01).kept
    noisy = Verdict.of("x", before, before + np.array([-0.05, 0.05, -0.05, 0.04]))
    assert not noisy.kept and noisy.spread > 0


def test_held_out_samples_neither_calibrate_nor_fit_refinements():
    data = samples(20)
    state = QuantState(config=QuantConfig(progress=False, validation=5), source=main_model(), data=data,
                       report=QuantReport())
    state = stages.HOLD_OUT(stages.PREPARE(state))
    held = {s["x"].tobytes() for s in state.validation}
    assert len(state.validation) == 5 and len(state.data) == 15
    assert not held & {f["x"].tobytes() for f in state.data}
    assert not held & {f["x"].tobytes() for f in state.samples}
    assert len(state.validation_reference) == 5


def test_validation_records_every_verdict_and_the_outputs_on_held_out_samples():
    qm = qnnx.quantize(main_model(), samples(24), QuantConfig(progress=False, validation=0.25))
    record = qm.report.record("validation")
    steps = [v.step for v in record.verdicts]
    assert steps[0] == "ranges (mse)" and "weight_rounding" in steps
    # a bias correction its own check undid changed nothing, so there is nothing to judge
    assert "bias_correction" in steps or not qm.report.records["bias_correction"].corrections
    assert qm.report.outputs[0].held_out and qm.report.outputs[0].samples == 6
    assert "held-out" in qm.report.summary()


def test_the_result_is_never_worse_on_held_out_samples_than_the_plain_recipe():
    data, held = samples(18), samples(6, seed=7)
    qm = qnnx.quantize(main_model(), data, QuantConfig(progress=False), validation=held)
    plain = qnnx.quantize(main_model(), data, QuantConfig(progress=False, **pipeline.PLAIN_RANGES,
                                                          weight_rounding="nearest", bias_correction="off"))
    from qnnx.autoquant.stages import PREPARE
    ref_state = PREPARE(QuantState(config=QuantConfig(progress=False), source=main_model(), data=held,
                                   report=QuantReport()))
    from qnnx.metrics import float_outputs
    ref = float_outputs(ref_state.float_model, list(ref_state.data))
    got, base = sample_errors(qm.qdq, list(ref_state.data), ref), sample_errors(plain.qdq, list(ref_state.data), ref)
    assert got.mean() <= base.mean() + 1e-12


def test_bad_validation_options_are_refused():
    with pytest.raises(QnnxError, match="validation must be"):
        QuantConfig(validation=1.5)
    with pytest.raises(QnnxError, match="cannot hold out"):
        qnnx.quantize(main_model(), samples(3), QuantConfig(progress=False, validation=3))
