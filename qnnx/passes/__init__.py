"""Graph passes over onnx-ir models (each takes and returns an ``ir.Model``)."""
