"""Automatic static quantization of float models (see pipeline.py for the stages)."""

from qnnx.autoquant.config import Decision, QuantConfig, QuantReport
from qnnx.autoquant.pipeline import QuantizedModel, quantize

__all__ = ["Decision", "QuantConfig", "QuantReport", "QuantizedModel", "quantize"]
