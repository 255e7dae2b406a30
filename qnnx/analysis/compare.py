"""``qnnx compare``: the per-tensor error of a quantized model against its float original.

The statistics are :mod:`qnnx.metrics` (automatic quantization measures with them too). A model
qnnx quantized was built from the *prepared* float model (folded BatchNorms, biases and affine ops,
fused Gemms): its tensor names follow that model, so it is the reference here, and a name means the
same value on both sides. Preparation is checked to compute what the original computes.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from qnnx.autoquant.prepare import prepare
from qnnx.dialect import DOMAIN
from qnnx.errors import QnnxError
from qnnx.ir import load_model
from qnnx.metrics import LayerError, compare_models, float_outputs
from qnnx.passes.lower import lower

__all__ = ["LayerError", "compare", "compare_models", "compare_on_openvino", "float_outputs", "format_table", "made_by_qnnx"]


def made_by_qnnx(model: ir.Model) -> bool:
    return model.producer_name == "qnnx"


def compare(float_model, quant_model, data, *, num_samples: int | None = None, progress=None) -> list[LayerError]:
    """Per-tensor error of ``quant_model`` against ``float_model`` (prepared first when qnnx made the
    quantized model, so its folded values are compared with what they compute; a model in the qnnx
    dialect is lowered first); the tensors equal on both sides (untouched by quantization) are left out,
    the outputs always kept."""
    fm, qm = load_model(float_model), load_model(quant_model)
    if any(n.domain == DOMAIN for n in qm.graph):  # the qnnx dialect runs on ONNX Runtime lowered (bit-exact)
        qm = lower(qm, copy=False)
    if made_by_qnnx(qm):
        dtypes = {n.inputs[2].dtype for n in qm.graph if n.op_type == "QuantizeLinear" and len(n.inputs) > 2
                  and n.inputs[2] is not None}
        wide = any(d is not None and d.itemsize == 2 for d in dtypes)
        fm = prepare(fm, min_opset=21 if wide else 13)
    errors = compare_models(fm, qm, data, num_samples=num_samples, progress=progress)
    return [e for e in errors if e.is_output or not math.isinf(e.sqnr_db) or e.sqnr_db < 0]


def format_table(errors: list[LayerError], limit: int = 20) -> str:
    outs = [e for e in errors if e.is_output]
    lines = ["outputs:"] + [f"  {e.name}: SQNR {e.sqnr_db:.1f} dB, cosine {e.cosine:.5f}, max |err| {e.max_abs:.4g}"
                            for e in outs]
    layers = [e for e in errors if not e.is_output][:limit]
    lines.append(f"worst {len(layers)} layers (of {sum(not e.is_output for e in errors)} changed by quantization):")
    lines += [f"  {e.sqnr_db:7.1f} dB  cos {e.cosine:.5f}  max {e.max_abs:9.4g}  {e.op_type:<18} {e.node or '-'}"
              + (f" (tensor {e.name})" if e.node and e.name != e.node else "") for e in layers]
    return "\n".join(lines)


def compare_on_openvino(float_model, quant_model, data, *, num_samples: int | None = None, threads: int | None = None,
                        precision: str = "default", progress=None) -> list[LayerError]:
    """The error of each output of ``quant_model`` as OpenVINO's CPU plugin computes it, against the float
    model on ONNX Runtime (the exact float reference; OpenVINO's own float is bf16 on some CPUs). Outputs
    only: the compiled model exposes no intermediate tensors. A model in the qnnx dialect is lowered."""
    from qnnx.data import CalibrationData, input_specs
    from qnnx.targets.openvino.runtime import compile_model, run

    fm, qm = load_model(float_model), load_model(quant_model)
    if any(n.domain == DOMAIN for n in qm.graph):
        qm = lower(qm, copy=False)
    samples = CalibrationData.from_source(data)
    samples = (samples if num_samples is None else samples.head(num_samples)).bind(input_specs(fm))
    names = [v.name for v in qm.graph.outputs]
    reference = float_outputs(fm, samples)
    common = [n for n in names if n in reference[0]] if reference else []
    if not common:
        raise QnnxError("the two models share no output names to compare")
    compiled = compile_model(qm, threads=threads, precision=precision)
    stats = {n: LayerError(n, "output", True) for n in common}
    for k, feed in enumerate(samples):
        got = dict(zip(names, run(compiled, feed)))
        for n in common:
            stats[n].add(np.asarray(reference[k][n]), got[n])
        if progress is not None:
            progress(k + 1, len(samples))
    return sorted(stats.values(), key=lambda s: (s.sqnr_db, s.name))
