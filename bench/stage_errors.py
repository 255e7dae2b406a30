"""Where YOLOv8n's int8 class-score error comes from, stage by stage (ultralytics' ``/model.N/`` names).

    python bench/stage_errors.py --mode in --stages 0 1 2 22           # each stage alone quantized
    python bench/stage_errors.py --mode out --stages 1,22 0-2,22 --seeds 0 1 2 3 4 5   # those float

``--mode in``: every node outside the stage is excluded (float), so the model carries that stage's
quantization error alone. ``--mode out``: the stage(s) float, the rest quantized. For each, the
best-class score error at the anchors where fp32 scores above 0.1 (``score_noise.score_error``) and the
task's hmean of detections agreeing with fp32, per calibration seed. If the stages' errors were
independent, the squares of the ``in`` figures would add up to the whole model's; if they were
coherent, the figures themselves would. Stages with no quantizable node (Upsample, Concat) are skipped.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import qnnx  # noqa: E402
from bench.score_noise import score_error  # noqa: E402
from bench.tasks import TASKS, run_model  # noqa: E402


def stage_of(node_name: str) -> int | None:
    parts = node_name.split("/")
    return int(parts[1].split(".")[1]) if len(parts) > 2 and parts[1].startswith("model.") else None


def parse_stages(spec: str) -> set[int]:
    """``1,3-5`` -> {1, 3, 4, 5}."""
    out: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out |= set(range(int(lo), int(hi or lo) + 1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="yolov8n", choices=[k for k in TASKS if k.startswith("yolo")])
    ap.add_argument("--mode", choices=["in", "out"], default="in")
    ap.add_argument("--stages", nargs="+", required=True, help="stage sets, e.g. 1 or 0-2,22")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--calib", type=int, default=32)
    ap.add_argument("--eval", type=int, default=64)
    args = ap.parse_args()
    task = TASKS[args.task]
    names = [n.name for n in onnx.load(str(task.model_path)).graph.node]
    evaluation = task.evaluation(args.eval)
    feeds, truths = [f for f, _ in evaluation], [t for _, t in evaluation]
    ref = run_model(str(task.model_path), feeds)
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.stages:
            stages = parse_stages(spec)
            chosen = [n for n in names if (stage_of(n) in stages) == (args.mode == "out")]
            rms, hmean = [], []
            for seed in args.seeds:
                config = qnnx.QuantConfig(progress=False, speed_fallback="off", exclude_nodes=chosen)
                try:
                    qm = qnnx.quantize(str(task.model_path), task.calibration(args.calib, seed), config)
                except qnnx.QnnxError as e:
                    print(f"stages {spec}: skipped ({e})", flush=True)
                    break
                path = Path(tmp) / "model.onnx"
                qm.save(path)
                out = run_model(str(path), feeds)
                e = score_error(ref, out)
                rms.append(float(np.sqrt(np.mean(e ** 2))))
                hmean.append(task.score(out, truths)["hmean"])
            if rms:
                print(f"stages {spec} {'alone quantized' if args.mode == 'in' else 'float'}: score error rms "
                      f"{' '.join(f'{r:.4f}' for r in rms)} (mean {np.mean(rms):.4f}); hmean "
                      f"{' '.join(f'{h:.3f}' for h in hmean)} (mean {np.mean(hmean):.3f})", flush=True)


if __name__ == "__main__":
    main()
