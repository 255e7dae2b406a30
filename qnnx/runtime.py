"""ONNX Runtime sessions, made one way: CPU provider, quiet logs, chosen thread count and graph
optimization level, optionally extra outputs (intermediate values to fetch) and ORT's profiler.
A model ORT refuses, or a run that fails, becomes a one-line :class:`QnnxError`."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnx_ir as ir
import onnxruntime as ort

from qnnx.errors import QnnxError


def session(model: ir.Model | onnx.ModelProto | str | Path, *, outputs=(), threads: int | None = None,
            optimize: bool = True, profile_prefix: str | None = None, optimized_to: str | None = None,
            purpose: str = "", where: str | None = None) -> ort.InferenceSession:
    """A CPU session of ``model`` (a file, an ``ir.Model`` or a ``ModelProto``, serialized, never modified).

    ``outputs``: values or names also returned (``ir.Model`` only); ``threads``: intra-op threads (one
    inter-op thread), default ORT's; ``optimize=False``: no graph optimizations (the graph as written);
    ``profile_prefix``: turn ORT's profiler on; ``optimized_to``: write the graph ORT runs to this path,
    optimized up to level 2 ("extended": its QDQ fusions; level 3's layout passes would rename nodes);
    ``purpose`` / ``where``: context of the error message.
    """
    if isinstance(model, ir.Model):
        proto = ir.to_proto(model)
        existing = {o.name for o in proto.graph.output}
        for v in outputs:
            name = v if isinstance(v, str) else v.name
            if name not in existing:
                proto.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
                existing.add(name)
        source = proto.SerializeToString()
    elif outputs:
        raise TypeError("extra outputs need an ir.Model")
    else:
        source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads is not None:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if optimized_to is not None:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        opts.optimized_model_filepath = optimized_to
    if profile_prefix is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    try:
        return ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # ORT's own exception types (e.g. a custom-domain op it has no kernel for)
        raise QnnxError(f"ONNX Runtime cannot load the model{purpose}: {str(e).splitlines()[0][:300]}",
                        where=where) from None


def run(sess: ort.InferenceSession, names, feed: dict) -> list:
    """``sess.run(names, feed)``; ORT's own exception types (multi-line messages: a feed of the wrong
    shape or type, a kernel failing on the data) become a one-line :class:`QnnxError`."""
    try:
        return sess.run(names, feed)
    except Exception as e:
        raise QnnxError(f"ONNX Runtime failed on a sample: {str(e).splitlines()[0][:300]}") from None
