"""Frontends: models from other representations into qnnx's (onnx-ir + the qnnx dialect)."""

from qnnx.frontends.onnx_quant import import_onnx

__all__ = ["import_onnx"]
