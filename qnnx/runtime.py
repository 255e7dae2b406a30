"""ONNX Runtime sessions, made one way: CPU provider, quiet logs, chosen thread count and graph
optimization level, optionally extra outputs (intermediate values to fetch) and ORT's profiler.
A model ORT refuses, or a run that fails, becomes a one-line :class:`QnnxError`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
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
        proto = model if isinstance(model, onnx.ModelProto) else None
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads is not None:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    elif per_axis_activation_quantizers(proto if proto is not None else _header(source)):
        # ORT's level-2 QDQ fusion turns DQ -> Conv -> Q with a per-channel Q into a QLinearConv, which then
        # fails on every run (its output zero point must be one value): such models run at level 1.
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
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


def _header(path: str) -> onnx.ModelProto | None:
    """The graph of the model file at ``path`` without its external data; None when it cannot be read
    (ONNX Runtime then says why)."""
    try:
        return onnx.load(path, load_external_data=False)
    except Exception:  # protobuf's and the OS's own errors: the session's QnnxError names the problem
        return None


def per_axis_activation_quantizers(proto: onnx.ModelProto | None) -> bool:
    """Whether a QuantizeLinear of ``proto``'s main graph quantizes a computed value (not an initializer) with a
    constant per-axis scale (more than one value): per-channel activations, as a depthwise conv's input."""
    if proto is None:
        return False
    graph = proto.graph
    sizes = {t.name: int(np.prod(t.dims)) for t in graph.initializer}
    sizes.update({n.output[0]: int(np.prod(a.t.dims)) for n in graph.node if n.op_type == "Constant"
                  for a in n.attribute if a.name == "value"})
    return any(n.op_type == "QuantizeLinear" and n.domain in ("", "ai.onnx") and len(n.input) > 1
               and n.input[0] not in sizes and sizes.get(n.input[1], 1) > 1 for n in graph.node)


def run(sess: ort.InferenceSession, names, feed: dict) -> list:
    """``sess.run(names, feed)``; ORT's own exception types (multi-line messages: a feed of the wrong
    shape or type, a kernel failing on the data) become a one-line :class:`QnnxError`."""
    try:
        return sess.run(names, feed)
    except Exception as e:
        raise QnnxError(f"ONNX Runtime failed on a sample: {str(e).splitlines()[0][:300]}") from None
