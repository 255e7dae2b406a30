"""fp32 vs qnnx int8 (QuantConfig defaults) vs qnnx int8 with ``speed_fallback``: task accuracy on the
evaluation samples and single-thread latency on ONNX Runtime (the three models timed interleaved, three times).

    python bench/speed_fallback.py ppocr_cls        # also ppocr_rec, ppocr_det, yolov8n
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.tasks import TASKS, run_model  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("task", choices=sorted(TASKS))
    ap.add_argument("--calib", type=int, default=32)
    ap.add_argument("--eval", type=int, default=64)
    args = ap.parse_args()

    import qnnx
    from qnnx import QuantConfig
    from qnnx.targets.onnxruntime.latency import median_latency_ms

    task = TASKS[args.task]
    calib, ev = task.calibration(args.calib), task.evaluation(args.eval)
    feeds, truths = [f for f, _ in ev], [t for _, t in ev]
    OUT.mkdir(exist_ok=True)
    paths = {"fp32": str(task.model_path)}
    for label, speed in (("int8", False), ("int8 speed_fallback", True)):
        started = time.perf_counter()
        # (allow_float: keeping the whole model float is one of the speed fallback's answers)
        qm = qnnx.quantize(str(task.model_path), calib, QuantConfig(progress=False, speed_fallback=speed,
                                                                    allow_float=True))
        print(f"{label}: quantized in {time.perf_counter() - started:.1f}s", flush=True)
        if speed:
            print("\n".join(qm.report.record("speed_fallback").lines()))
        paths[label] = str(OUT / f"{args.task}.{label.replace(' ', '_')}.onnx")
        qm.save(paths[label])
    for label, path in paths.items():
        print(f"{label}: {task.score(run_model(path, feeds), truths)}", flush=True)
    probe = median_latency_ms([paths["fp32"]], feed=feeds[0], repeats=3)[paths["fp32"]]
    repeats = max(20, int(100 / max(probe, 0.1)))  # about 0.1 s per model and timing
    for _ in range(3):
        ms = median_latency_ms(list(paths.values()), feed=feeds[0], repeats=repeats)
        f = ms[paths["fp32"]]
        print("1 thread: " + ", ".join(f"{k} {ms[p]:.3f} ms ({f / ms[p]:.2f}x)" for k, p in paths.items()), flush=True)


if __name__ == "__main__":
    main()
