"""QuantConfig: intent at the top, three frozen sections of algorithm options, unknown keys raise."""

from __future__ import annotations

import dataclasses

import pytest

from qnnx import QnnxError, QuantConfig
from qnnx.autoquant.config import CalibrationOptions, RangeOptions, RefinementOptions


def test_section_options_route_by_name_and_nest():
    c = QuantConfig(method="minmax", batch_size=4, speed_fallback="on", per_channel=False)
    assert c.ranges.method == "minmax" and c.calibration.batch_size == 4
    assert c.refinements.speed_fallback == "on" and c.per_channel is False
    same = QuantConfig.from_dict({"ranges": {"method": "minmax"}, "calibration": {"batch_size": 4},
                                  "refinements": {"speed_fallback": "on"}, "per_channel": False})
    assert same == c
    assert QuantConfig(ranges=RangeOptions(method="minmax")).ranges.method == "minmax"


def test_defaults_are_deterministic():
    assert QuantConfig().refinements.speed_fallback == "off"


@pytest.mark.parametrize("options, message", [
    ({"metod": "mse"}, "unknown QuantConfig option 'metod'"),
    ({"ranges": {"metod": "mse"}}, "unknown ranges option"),
    ({"method": "best"}, "method must be one of"),
    ({"speed_fallback": "sometimes"}, "speed_fallback must be one of"),
    ({"calibrator": "magic"}, "calibrator must be one of"),
    ({"exclude_nodes": "conv1"}, "sequence of names"),
    ({"channel_balance": 0.5, "method": "minmax"}, "histogram method"),
    ({"per_channel": "yes"}, "True or False"),
])
def test_bad_options_raise_naming_the_option(options, message):
    with pytest.raises(QnnxError, match=message):
        QuantConfig(**options)


def test_configs_are_frozen_and_with_options_copies():
    c = QuantConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.per_channel = False  # type: ignore[misc]
    d = c.with_options(method="percentile", allow_float=True)
    assert (d.ranges.method, d.allow_float) == ("percentile", True) and c.ranges.method == "mse"
    assert d.as_dict()["ranges"]["method"] == "percentile"
    for cls in (RangeOptions, CalibrationOptions, RefinementOptions):
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen


def test_preset_sets_its_options_except_the_kept_ones():
    base = QuantConfig(target="openvino", weight_rounding="nearest")
    c = base.with_preset("transformer", keep={"weight_rounding"})
    assert (c.refinements.smoothing_sites, c.refinements.smoothing_alpha, c.weight_bits) == ("matmuls", 0.8, "pairs")
    assert c.refinements.weight_rounding == "nearest" and c.target == "openvino"
    assert base.with_preset("transformer").refinements.weight_rounding == "gptq_all"


@pytest.mark.parametrize("config, name, message", [
    (QuantConfig(target="openvino"), "bert", "preset must be one of transformer, got 'bert'"),
    (QuantConfig(), "transformer", "measured for target openvino only, not onnxruntime"),
])
def test_preset_refuses_unknown_names_and_other_targets(config, name, message):
    with pytest.raises(QnnxError, match=message):
        config.with_preset(name)
