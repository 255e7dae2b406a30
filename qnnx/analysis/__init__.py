"""What quantization did: per-layer error statistics and model summaries."""

from qnnx.analysis.compare import LayerError, compare_models
from qnnx.analysis.inspect import ModelSummary, summarize
from qnnx.analysis.report import format_summary, write_report

__all__ = ["LayerError", "ModelSummary", "compare_models", "format_summary", "summarize", "write_report"]
