"""PP-OCR rec char accuracy and quantization time: default calibration vs sequential.

    python bench/sequential.py --calibration float --seeds 0 5 6
    python bench/sequential.py --calibration sequential --seeds 0 5 6

One line per seed: char accuracy on 128 evaluation lines (evaluation(128), seed 1) of the model
calibrated on calibration(32, seed=s), and the wall time of ``qnnx.quantize``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import onnx_ir as ir  # noqa: E402
import onnxruntime as ort  # noqa: E402

import qnnx  # noqa: E402
from bench.tasks import TASKS, run_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration", default="float")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 5, 6])
    ap.add_argument("--eval", type=int, default=128)
    ap.add_argument("--passes", type=int, default=4, help="sequential_passes")
    args = ap.parse_args()
    task = TASKS["ppocr_rec"]
    evaluation = task.evaluation(args.eval)
    feeds, truths = [f for f, _ in evaluation], [t for _, t in evaluation]
    accs = []
    for s in args.seeds:
        calib = task.calibration(32, seed=s)
        cfg = qnnx.QuantConfig(progress=False, calibration=args.calibration,
                                                sequential_passes=args.passes) if args.calibration != "float" \
            else qnnx.QuantConfig(progress=False)
        t0 = time.perf_counter()
        qm = qnnx.quantize(str(task.model_path), calib, cfg)
        seconds = time.perf_counter() - t0
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.log_severity_level = 2, 3
        sess = ort.InferenceSession(ir.to_proto(qm.qdq).SerializeToString(), so, providers=["CPUExecutionProvider"])
        acc = task.score(run_model(sess, feeds), truths)["char_acc"]
        accs.append(acc)
        print(f"{args.calibration} seed {s}: char_acc {acc:.4f}, quantize {seconds:.1f}s", flush=True)
    print(f"{args.calibration} mean char_acc {sum(accs) / len(accs):.4f}")


if __name__ == "__main__":
    main()
