"""What quantization did: per-layer error statistics and model summaries."""

from qnnx.analysis.compare import LayerError, compare_models
from qnnx.analysis.inspect import ModelSummary, summarize

__all__ = ["LayerError", "ModelSummary", "compare_models", "summarize"]
