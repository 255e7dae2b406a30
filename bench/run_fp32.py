"""fp32 reference numbers and the ONNX Runtime static-quantization baseline.

    python bench/run_fp32.py --n 64 [--calib 64] [--tasks ppocr_rec,ppocr_cls] [--method MinMax] [--per-channel]

For every task: fp32 metric, fp32 single-thread median latency (ORT CPU),
then ``quantize_static`` (QDQ, u8 activations / s8 weights, per-tensor by
default) calibrated on ``--calib`` samples, its metric, its agreement with
fp32 and its latency.  Prints a markdown table, then every metric in full.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from baseline_ort import ort_quantize_static
from tasks import TASKS, make_session, run_model

PRIMARY = {"ppocr_rec": "char_acc", "ppocr_cls": "accuracy", "ppocr_det": "hmean", "yolov8n": "hmean"}
KEY_AGREE = {"ppocr_rec": "text_equal", "ppocr_cls": "label_equal", "ppocr_det": "bin_iou",
             "yolov8n": "det_recall_vs_fp32"}


def median_latency_ms(model, feeds, reps: int = 10) -> float:
    """Median wall time of ``reps`` single-thread runs of one sample, after a warm-up."""
    sess = make_session(model, threads=1)
    sess.run(None, feeds)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=64, help="evaluation samples per task")
    ap.add_argument("--calib", type=int, default=None, help="calibration samples (default: --n)")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--method", default="MinMax", choices=["MinMax", "Percentile", "Entropy"])
    ap.add_argument("--per-channel", action="store_true")
    ap.add_argument("--reps", type=int, default=10, help="latency repetitions")
    ap.add_argument("--out-dir", default=None, help="where to keep the quantized models (default: temp dir)")
    a = ap.parse_args(argv)
    out_dir = Path(a.out_dir or tempfile.mkdtemp(prefix="qnnx_bench_"))
    t_start = time.perf_counter()
    rows, details = [], []
    for name in a.tasks.split(","):
        task = TASKS[name]
        t0 = time.perf_counter()
        ev = task.evaluation(a.n)
        feeds, truths = [f for f, _ in ev], [t for _, t in ev]
        ref = run_model(task.model_path, feeds)
        fp32 = task.score(ref, truths)
        fp32_ms = median_latency_ms(task.model_path, feeds[0], a.reps)

        qpath = out_dir / f"{name}_ort_{a.method}{'_pc' if a.per_channel else ''}.onnx"
        report = ort_quantize_static(task, task.calibration(a.calib or a.n), qpath, a.method, a.per_channel)
        out = run_model(qpath, feeds)
        q = task.score(out, truths)
        agree = task.agreement(ref, out)
        q_ms = median_latency_ms(qpath, feeds[0], a.reps)
        p, k = PRIMARY[name], KEY_AGREE[name]
        rows.append(f"| {name} | {p} | {fp32[p]:.4f} | {fp32_ms:.1f} | {q[p]:.4f} | {agree[k]:.4f} ({k}) "
                    f"| {agree['cosine']:.4f} | {agree['max_abs']:.3g} | {q_ms:.1f} |")
        details.append(f"- **{name}** ({time.perf_counter() - t0:.0f}s) fp32: {_fmt(fp32)}; ORT int8: {_fmt(q)}; "
                       f"agreement: {_fmt(agree)}; pre-process: {report['pre_process']}; "
                       f"fixes: {report.get('fixes', [])}")
        print(f"[{name} done in {time.perf_counter() - t0:.0f}s]", file=sys.stderr, flush=True)

    print(f"\nn_eval={a.n} n_calib={a.calib or a.n}, ORT quantize_static {a.method} QDQ u8/s8 "
          f"{'per-channel' if a.per_channel else 'per-tensor'}; latency = median single-thread ms\n")
    print("| task | metric | fp32 | fp32 ms | ORT int8 | agreement | cosine | max abs err | int8 ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\n" + "\n".join(details))
    print(f"\nwall time {time.perf_counter() - t_start:.0f}s; quantized models in {out_dir}")


def _fmt(d: dict) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in d.items())


if __name__ == "__main__":
    main()
