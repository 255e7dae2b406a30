"""Automatic static quantization of float models (see pipeline.py for the stages)."""

from qnnx.autoquant.config import QuantConfig
from qnnx.autoquant.pipeline import QuantizedModel, quantize
from qnnx.autoquant.report import Decision, QuantReport
from qnnx.data import ImageFolder, ImagePreprocess

__all__ = ["Decision", "ImageFolder", "ImagePreprocess", "QuantConfig", "QuantReport", "QuantizedModel", "quantize"]
