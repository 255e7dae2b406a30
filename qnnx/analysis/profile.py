"""Where the time goes: the runtime's own profiler, summarised per op type and per node.

ORT's profile names the kernels it actually ran after its graph optimizations (a QDQ Conv that
fused shows up as ``QLinearConv``; one that did not shows up as ``DequantizeLinear`` + ``Conv`` +
``QuantizeLinear``), so this is the view to read when an int8 export is not as fast as expected.
OpenVINO's per-layer counters name the layers of its runtime graph with the precision each ran in
(``Convolution [int8]``; a conv/matmul quantized in the model but shown in ``bf16`` or ``f32`` runs in
float), and its generated kernels (an attention) as ``Subgraph``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from qnnx import runtime
from qnnx.errors import QnnxError


@dataclass(frozen=True)
class OpTime:
    """Total microseconds per run spent in one op type (or one node) over the profiled runs."""

    name: str
    op_type: str
    us_per_run: float
    calls_per_run: float
    share: float  # of all kernel time


@dataclass(frozen=True)
class Profile:
    total_us_per_run: float
    by_op_type: list[OpTime]
    by_node: list[OpTime]

    def table(self, top: int = 8) -> str:
        lines = [f"kernel time {self.total_us_per_run / 1000:.2f} ms/run"]
        for o in self.by_op_type[:top]:
            lines.append(f"  {o.op_type:<34} {o.us_per_run / 1000:8.3f} ms  {o.share:6.1%}  x{o.calls_per_run:g}")
        return "\n".join(lines)


def profile_model(model_path: str, feed: dict[str, np.ndarray], *, threads: int = 1, runs: int = 10,
                  warmup: int = 3) -> Profile:
    """Run ``model_path`` ``warmup + runs`` times with ORT's profiler on; summarise the timed runs."""
    with tempfile.TemporaryDirectory(prefix="qnnx_profile_") as tmp:
        sess = runtime.session(model_path, threads=threads, profile_prefix=os.path.join(tmp, "ort"),
                               where=str(model_path))
        for _ in range(warmup + runs):
            sess.run(None, feed)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    return summarize_events(events, runs=runs, warmup=warmup)


def summarize_events(events: list[dict], *, runs: int, warmup: int = 0) -> Profile:
    """Aggregate the kernel events of the last ``runs`` model runs of an ORT profile trace."""
    # Runs are delimited by "model_run" events; kernels are "Node" events named "<node>_kernel_time".
    starts = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    if len(starts) < warmup + runs:
        raise QnnxError(f"profile holds {len(starts)} runs, expected {warmup + runs}")
    first_ts = starts[warmup] if warmup else (starts[0] if starts else 0)
    per_node: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time") or e["ts"] < first_ts:
            continue
        key = (e["name"][: -len("_kernel_time")], e.get("args", {}).get("op_name", "?"))
        per_node[key][0] += e["dur"]
        per_node[key][1] += 1
    return _summary(per_node, runs)


def _summary(per_node: dict[tuple[str, str], list[float]], runs: int) -> Profile:
    """A :class:`Profile` of ``runs`` runs from each (node, op type)'s [total microseconds, calls]."""
    total = sum(v[0] for v in per_node.values()) or 1.0
    by_type: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for (_, op), (dur, n) in per_node.items():
        by_type[op][0] += dur
        by_type[op][1] += n
    nodes = sorted((OpTime(name, op, dur / runs, n / runs, dur / total) for (name, op), (dur, n) in per_node.items()),
                   key=lambda o: -o.us_per_run)
    types = sorted((OpTime(op, op, dur / runs, n / runs, dur / total) for op, (dur, n) in by_type.items()),
                   key=lambda o: -o.us_per_run)
    return Profile(total / runs, types, nodes)


def profile_openvino(model_path: str, feed: dict[str, np.ndarray], *, threads: int = 1, runs: int = 10,
                     warmup: int = 3, precision: str = "default") -> Profile:
    """Run ``model_path`` on OpenVINO's CPU plugin ``warmup + runs`` times with its per-layer counters on;
    each executed layer's time over the timed runs, its op type the layer type and the precision it ran in."""
    from qnnx.targets.openvino.runtime import compile_model

    request = compile_model(model_path, threads=threads, precision=precision, profile=True).create_infer_request()
    per_node: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for i in range(warmup + runs):
        request.infer(feed)
        if i < warmup:
            continue
        for layer in request.profiling_info:
            if layer.status.name == "EXECUTED":
                ran_in = layer.exec_type.rsplit("_", 1)[-1].lower()
                kind = f"{layer.node_type} [{'int8' if ran_in in ('i8', 'u8') else ran_in}]"
                per_node[(layer.node_name, kind)][0] += layer.real_time.total_seconds() * 1e6
                # once a run: the plugin marks a layer too quick to time NOT_RUN in some runs
                per_node[(layer.node_name, kind)][1] = runs
    return _summary(per_node, runs)
