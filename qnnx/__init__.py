"""qnnx: exact integer quantization of ONNX graphs."""

from qnnx import numerics
from qnnx.autoquant import QuantConfig, QuantizedModel, quantize
from qnnx.data import CalibrationData, ImageFolder, ImagePreprocess
from qnnx.errors import QnnxError
from qnnx.frontends import from_qdq, from_tflite, import_onnx
from qnnx.ir import load_model, save_model
from qnnx.passes.lower import lower
from qnnx.reference import ReferenceEvaluator

__version__ = "0.1.0"

__all__ = ["CalibrationData", "ImageFolder", "ImagePreprocess", "QuantConfig", "QuantizedModel", "quantize", "QnnxError", "ReferenceEvaluator", "from_qdq", "from_tflite", "import_onnx", "load_model", "lower", "numerics", "save_model",
           "__version__"]
