"""Thin helpers over onnx-ir, the one in-memory IR of every qnnx pass."""

from qnnx.ir.build import Builder, const_array, drop_unused_initializers, replace_node, replace_value
from qnnx.ir.io import load_model, save_model, to_proto

__all__ = ["Builder", "const_array", "drop_unused_initializers", "replace_node", "replace_value", "load_model", "save_model", "to_proto"]
