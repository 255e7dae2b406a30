"""Automatic static quantization of float models (see pipeline.py for the stages)."""

from qnnx.autoquant.config import Decision, QuantConfig, QuantReport
from qnnx.data import ImageFolder, ImagePreprocess
from qnnx.autoquant.pipeline import QuantizedModel, quantize

__all__ = ["Decision", "ImageFolder", "ImagePreprocess", "QuantConfig", "QuantReport", "QuantizedModel", "quantize"]
