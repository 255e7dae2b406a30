"""Task metric of qnnx configurations averaged over calibration sets: single runs move by a point or
two with the calibration samples, so configurations are compared on their mean.

    python bench/seeds.py --task ppocr_rec '{}' '{"method": "minmax"}'
    python bench/seeds.py --task ppocr_rec '{"calibrator": "sequential", "sequential_passes": 4}'
    python bench/seeds.py --task yolov8n_photos '{}' '{"method": "percentile"}' --seeds 0 1 2

The configurations come before ``--seeds`` (argparse would read them as seeds).

Each argument is a JSON object of QuantConfig options. For each one and each seed: the model is
quantized on ``calibration(--calib, seed)`` and scored on ``evaluation(--eval)`` (the same evaluation
samples for every configuration); one line per configuration with the score per seed, the mean drop
from fp32 in points of the task's main metric (``--metric`` for another), and the mean quantization wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import onnx_ir as ir  # noqa: E402
import onnxruntime as ort  # noqa: E402

import qnnx  # noqa: E402
from bench.tasks import TASKS, main_metric, run_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+", help="JSON objects of QuantConfig options ('{}': the defaults)")
    ap.add_argument("--task", default="ppocr_rec", choices=sorted(TASKS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 5, 6])
    ap.add_argument("--calib", type=int, default=32)
    ap.add_argument("--eval", type=int, default=128)
    ap.add_argument("--metric", help="score key to average (default: the task's main metric, as in bench/run.py)")
    args = ap.parse_args()
    task = TASKS[args.task]
    evaluation = task.evaluation(args.eval)
    feeds, truths = [f for f, _ in evaluation], [t for _, t in evaluation]
    fp32 = task.score(run_model(str(task.model_path), feeds), truths)
    metric = args.metric or main_metric(fp32)
    if metric not in fp32:
        raise SystemExit(f"seeds.py: {args.task} has no metric {metric!r}; it has {', '.join(fp32)}")
    print(f"{args.task} fp32 {metric} {fp32[metric]:.4f}", flush=True)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.log_severity_level = 2, 3
    for spec in args.configs:
        options = json.loads(spec)
        scores, seconds = [], []
        for seed in args.seeds:
            t0 = time.perf_counter()
            qm = qnnx.quantize(str(task.model_path), task.calibration(args.calib, seed=seed),
                               qnnx.QuantConfig(progress=False, **options))
            seconds.append(time.perf_counter() - t0)
            sess = ort.InferenceSession(ir.to_proto(qm.qdq).SerializeToString(), so,
                                        providers=["CPUExecutionProvider"])
            scores.append(task.score(run_model(sess, feeds), truths)[metric])
        drop = 100 * (fp32[metric] - sum(scores) / len(scores))
        print(f"{spec}: {metric} " + " / ".join(f"{s:.4f}" for s in scores)
              + f" (seeds {' '.join(map(str, args.seeds))}), mean drop {drop:.2f} points, "
              f"quantize {sum(seconds) / len(seconds):.1f} s", flush=True)


if __name__ == "__main__":
    main()
