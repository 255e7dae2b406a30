"""TFLite frontend: full-integer .tflite models into the canonical qnnx form (LiteRT's reference numerics)."""

from qnnx.frontends.tflite.convert import Report, convert, from_tflite

__all__ = ["Report", "convert", "from_tflite"]
