"""How much class-score error a YOLOv8n task's agreement metric tolerates, against what a model makes.

    python bench/score_noise.py --task yolov8n --model bench/out/yolov8n.qnnx.onnx

The task's metric is the hmean of detections agreeing with fp32's (same class, IoU > 0.5, nudenet's
score threshold). Two figures on the same ``--eval`` samples:

- the model's error: at every anchor where fp32's best class score exceeds 0.1, the model's best class
  score minus fp32's (rms and mean);
- the metric's tolerance: hmean after adding independent Gaussian noise of standard deviation sigma to
  fp32's class scores (clipped to [0, 1]), ``--trials`` draws per sigma. Real quantization errors are
  correlated between neighbouring anchors, so this is a yardstick, not a prediction.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.tasks import TASKS, run_model  # noqa: E402


def score_error(ref: list, out: list, floor: float = 0.1) -> np.ndarray:
    """Best-class score of ``out`` minus fp32's, at the anchors where fp32's best exceeds ``floor``."""
    errors = []
    for r, o in zip(ref, out):
        s_ref, s_out = r[0][0, 4:].max(0), o[0][0, 4:].max(0)  # (anchors,): outputs are (1, 4 + classes, anchors)
        keep = s_ref > floor
        errors.append(s_out[keep] - s_ref[keep])
    return np.concatenate(errors)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="yolov8n", choices=[k for k in TASKS if k.startswith("yolo")])
    ap.add_argument("--model", help="a quantized model to measure (optional)")
    ap.add_argument("--eval", type=int, default=128)
    ap.add_argument("--sigmas", type=float, nargs="+", default=[0.01, 0.02, 0.03, 0.04, 0.05, 0.06])
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    task = TASKS[args.task]
    evaluation = task.evaluation(args.eval)
    feeds, truths = [f for f, _ in evaluation], [t for _, t in evaluation]
    ref = run_model(str(task.model_path), feeds)
    if args.model:
        out = run_model(args.model, feeds)
        e = score_error(ref, out)
        print(f"{args.model}: hmean {task.score(out, truths)['hmean']:.3f}; best-class score error at "
              f"{e.size} anchors: rms {np.sqrt(np.mean(e ** 2)):.4f}, mean {e.mean():+.4f}")
    rng = np.random.default_rng(0)
    for sigma in args.sigmas:
        hmeans = []
        for _ in range(args.trials):
            noisy = []
            for r in ref:
                o = r[0].copy()
                o[0, 4:] = np.clip(o[0, 4:] + rng.normal(0, sigma, o[0, 4:].shape), 0, 1)
                noisy.append([o])
            hmeans.append(task.score(noisy, truths)["hmean"])
        print(f"score noise sigma {sigma:.3f}: hmean {' '.join(f'{h:.3f}' for h in hmeans)} "
              f"(mean {np.mean(hmeans):.3f})")


if __name__ == "__main__":
    main()
