"""Frontends: models from other representations into qnnx's (onnx-ir + the qnnx dialect)."""

from qnnx.frontends.fq2i import convert as convert_qdq
from qnnx.frontends.fq2i import from_qdq
from qnnx.frontends.onnx_quant import import_onnx
from qnnx.frontends.tflite import from_tflite

__all__ = ["convert_qdq", "from_qdq", "from_tflite", "import_onnx"]
