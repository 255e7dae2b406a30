"""``qnnx compare``: the per-tensor error of a quantized model against its float original, as text.

The statistics themselves are :mod:`qnnx.metrics` (automatic quantization measures with them too).
"""

from __future__ import annotations

from qnnx.metrics import LayerError, compare_models, float_outputs

__all__ = ["LayerError", "compare_models", "float_outputs", "format_table"]


def format_table(errors: list[LayerError], limit: int = 20) -> str:
    outs = [e for e in errors if e.is_output]
    lines = ["outputs:"] + [f"  {e.name}: SQNR {e.sqnr_db:.1f} dB, cosine {e.cosine:.5f}, max |err| {e.max_abs:.4g}"
                            for e in outs]
    layers = [e for e in errors if not e.is_output][:limit]
    lines.append(f"worst {len(layers)} layers (of {sum(not e.is_output for e in errors)}):")
    lines += [f"  {e.sqnr_db:7.1f} dB  cos {e.cosine:.5f}  max {e.max_abs:9.4g}  {e.op_type:<18} {e.name}"
              for e in layers]
    return "\n".join(lines)
