"""A speed plan replays the speed fallback's decisions without timing anything."""

from __future__ import annotations


import pytest

from float_graphs import main_model, samples

import qnnx
from qnnx import QnnxError, QuantConfig


def _quantize(**options):
    return qnnx.quantize(main_model(), samples(6), QuantConfig(progress=False, allow_float=True, **options))


def test_a_replayed_plan_leaves_its_kinds_float_and_is_reproducible():
    one, two = _quantize(speed_plan=("binary",)), _quantize(speed_plan=("binary",))
    record = one.report.record("speed_fallback")
    assert record.replayed and record.plan() == ("binary",) and record.timings == 0
    floats = [d for d in one.report.decisions if d.reason.startswith("speed: the speed plan")]
    assert floats and all(d.op_type in ("Add", "Mul") for d in floats)
    assert qnnx.ir.to_proto(one.qdq).SerializeToString() == qnnx.ir.to_proto(two.qdq).SerializeToString()


def test_the_whole_model_plan_and_an_unknown_kind():
    whole = _quantize(speed_plan=("all",))
    assert not whole.report.quantized() and whole.report.record("speed_fallback").plan() == ("all",)
    with pytest.raises(QnnxError, match="unknown kinds of patterns warp"):
        _quantize(speed_plan=("warp",))
