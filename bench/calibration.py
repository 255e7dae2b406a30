"""Calibration cost: qnnx vs ONNX Runtime's quantize_static on the same samples.

    python bench/calibration.py --task ppocr_cls --samples 64 512

For each sample count and histogram method (percentile, entropy), the wall time and peak RSS of
a full quantization, each in a fresh child process (so peaks do not mix); qnnx with
``speed_fallback="off"``, ``weight_rounding="nearest"`` and ``bias_correction="off"`` (calibration is
what is compared: ORT's quantizer times nothing and rounds each weight to nearest).
ORT keeps every intermediate tensor of every sample in memory before building histograms; qnnx
streams samples into fixed-size histograms, so its peak should not grow with the sample count.
Besides the whole quantization, the calibration phase alone is timed (bench/phases.py): what the
samples cost, without either quantizer's fixed costs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.run import OUT, timed_quantize  # noqa: E402
from bench.tasks import TASKS  # noqa: E402


# What ORT's quantizer does after calibrating: round each weight to nearest, no bias correction.
CALIBRATION_ONLY = {"weight_rounding": "nearest", "bias_correction": "off"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="ppocr_cls")
    ap.add_argument("--samples", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--methods", nargs="+", default=["percentile", "entropy"])
    ap.add_argument("--ort-chunk", type=int, default=4,
                    help="ORT's CalibStridedMinMax (samples per calibration chunk, its memory-saving mode); "
                         "0: ORT's default, every sample's tensors collected in one pass")
    args = ap.parse_args()
    task = TASKS[args.task]
    OUT.mkdir(exist_ok=True)
    rows = ["| samples | method | ORT s | qnnx s | ORT / qnnx time | ORT calibration s | qnnx calibration s | "
            "ORT / qnnx calibration | ORT peak MiB | qnnx peak MiB |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for n in args.samples:
        calib = task.calibration(n)
        for method in args.methods:
            ort_name = {"percentile": "Percentile", "entropy": "Entropy"}[method]
            ot, om, oc = timed_quantize("_ort_quantize", args.task, calib, str(OUT / "cal.ort.onnx"), False,
                                        ort_name, args.ort_chunk or n, phases=True)
            qt, qm, qc = timed_quantize("_qnnx_quantize", str(task.model_path), calib, str(OUT / "cal.qnnx.onnx"),
                                        method, "off", CALIBRATION_ONLY, phases=True)
            rows.append(f"| {n} | {method} | {ot:.1f} | {qt:.1f} | {ot / qt:.1f}x | {oc:.1f} | {qc:.1f} | "
                        f"{oc / qc:.1f}x | {om:.0f} | {qm:.0f} |")
            print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
