"""Pre-quantized models -> canonical form: what stays float, and agreement with ONNX Runtime.

    python bench/fq2i_agreement.py --calib 16 --eval 8

Each real model is quantized by ONNX Runtime's quantize_static (QDQ; per-channel and per-tensor
weights; int8 and uint8 activations), converted with qnnx.from_qdq, lowered to standard ONNX and
run on the task's evaluation inputs. Reported: float ops left inside quantized regions, the share
of output elements identical to ORT running the QDQ model, within one output quantum of it, and
argmax agreement along the last axis — against ORT's defaults (fused QLinear kernels; int8 activations
run in float on x86-64), against ORT with its int8 QDQ fusion enabled (session.qdqisint8allowed=1),
and within one quantum of ORT with graph optimizations off (the QDQ graph's own float semantics).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import qnnx  # noqa: E402
from bench.baseline_ort import ort_quantize_static  # noqa: E402
from bench.run import OUT  # noqa: E402
from bench.tasks import TASKS  # noqa: E402


def _session(model, level, int8_allowed: bool = False) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.log_severity_level = 3
    if int8_allowed:
        # ORT's QDQ fusion of int8 (s8) activations; off by default on x86-64, where it then runs those
        # QDQ groups in float (DequantizeLinear -> op -> QuantizeLinear), on by default on Arm
        so.add_session_config_entry("session.qdqisint8allowed", "1")
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def _output_quantum(path: str) -> float | None:
    g = onnx.load(path).graph
    prod = {o: n for n in g.node for o in n.output}
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in g.initializer}
    p = prod.get(g.output[0].name)
    while p is not None and p.op_type in ("Reshape", "Flatten", "Identity", "Squeeze", "Unsqueeze", "Transpose"):
        p = prod.get(p.input[0])  # data movement after the last DequantizeLinear keeps its quantum
    if p is not None and p.op_type == "DequantizeLinear" and p.input[1] in inits and inits[p.input[1]].size == 1:
        return float(inits[p.input[1]])
    return None


def measure(name: str, per_channel: bool, activation: str, n_calib: int, n_eval: int, reuse: bool) -> str:
    task = TASKS[name]
    OUT.mkdir(exist_ok=True)
    path = str(OUT / f"{name}.{'pc' if per_channel else 'pt'}.{activation}.qdq.onnx")
    if not (reuse and Path(path).exists()):
        ort_quantize_static(task, task.calibration(n_calib), path, per_channel=per_channel, activation=activation)
    canonical, report = qnnx.frontends.convert_qdq(path)
    lowered = qnnx.ir.to_proto(qnnx.lower(canonical))
    ours = _session(lowered.SerializeToString(), ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    refs = {"default": _session(path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL),
            "int8": _session(path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, int8_allowed=True),
            "unfused": _session(path, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)}
    q = _output_quantum(path)
    tol = (q if q else 0.0) * 1.0001
    stats = {k: dict(exact=0, within=0, size=0, argmax=[]) for k in refs}
    for feed, _ in task.evaluation(n_eval):
        o = ours.run(None, feed)[0].astype(np.float64)
        for label, sess in refs.items():
            r = sess.run(None, feed)[0].astype(np.float64)
            st = stats[label]
            st["exact"] += int((r == o).sum())
            st["within"] += int((np.abs(r - o) <= tol).sum())
            st["size"] += r.size
            if r.ndim >= 2:
                st["argmax"].append(float(np.mean(r.argmax(-1) == o.argmax(-1))))

    def cells(label, full=True):
        st = stats[label]
        within = f"{st['within'] / st['size']:.4%}"
        if not full:
            return within
        return f"{st['exact'] / st['size']:.4%} | {within} | {np.mean(st['argmax']):.4f}"

    return (f"| {name} | {'per-channel' if per_channel else 'per-tensor'} | {activation} | {len(report.left_in_float)} | "
            f"{cells('default')} | {cells('int8')} | {cells('unfused', full=False)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS))
    ap.add_argument("--calib", type=int, default=16)
    ap.add_argument("--eval", type=int, default=8)
    ap.add_argument("--reuse", action="store_true", help="keep QDQ models already in bench/out (compare converters "
                    "on identical inputs)")
    ap.add_argument("--configs", nargs="+", default=["per-channel/QInt8", "per-tensor/QUInt8", "per-channel/QUInt8",
                                                     "per-tensor/QInt8"],
                    help="weights/activations pairs (ORT quantize_static's per_channel and activation_type)")
    args = ap.parse_args()
    print("| model | weights | activations | float ops left | identical to ORT (default) | within 1 quantum | argmax "
          "| identical to ORT (int8 kernels) | within 1 quantum | argmax | within 1 quantum of ORT (unoptimized) |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    configs = [(w == "per-channel", a) for w, a in (c.split("/") for c in args.configs)]
    for name in args.tasks:
        for per_channel, activation in configs:
            print(measure(name, per_channel, activation, args.calib, args.eval, args.reuse), flush=True)


if __name__ == "__main__":
    main()
