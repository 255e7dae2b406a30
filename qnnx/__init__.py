"""qnnx: exact integer quantization of ONNX graphs."""

from qnnx import numerics
from qnnx.errors import QnnxError
from qnnx.frontends import import_onnx
from qnnx.reference import ReferenceEvaluator

__version__ = "0.1.0"

__all__ = ["QnnxError", "ReferenceEvaluator", "import_onnx", "numerics", "__version__"]
