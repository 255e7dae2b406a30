"""Calibration cost: qnnx vs ONNX Runtime's quantize_static on the same samples.

    python bench/calibration.py --task ppocr_cls --samples 64 512

For each sample count and histogram method (percentile, entropy), the wall time and peak RSS of
a full quantization, each in a fresh child process (so peaks do not mix); qnnx with
``speed_fallback="off"``, ``weight_rounding="nearest"`` and ``bias_correction="off"`` (calibration is
what is compared: ORT's quantizer times nothing and rounds each weight to nearest).
ORT keeps every intermediate tensor of every sample in memory before building histograms; qnnx
streams samples into fixed-size histograms, so its peak should not grow with the sample count.
Besides the whole quantization, the calibration phase alone is timed (bench/phases.py): what the
samples cost, without either quantizer's fixed costs. With ``--repeats`` each figure is the median of
that many runs, the two quantizers taking turns, and a ratio is the median of the ratios of the runs
side by side (ORT's 64-sample calibration moved between 2.1 and 3.6 s from one run to the next on
this shared host).
"""

from __future__ import annotations

import argparse
import statistics
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
    ap.add_argument("--repeats", type=int, default=1, help="runs of each quantization; the table shows medians")
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
            ort_runs, qnnx_runs = [], []
            for _ in range(args.repeats):  # in turns: both see the same spells of host load
                ort_runs.append(timed_quantize("_ort_quantize", args.task, calib, str(OUT / "cal.ort.onnx"), False,
                                               ort_name, args.ort_chunk or n, phases=True))
                qnnx_runs.append(timed_quantize("_qnnx_quantize", str(task.model_path), calib,
                                                str(OUT / "cal.qnnx.onnx"), method, "off", CALIBRATION_ONLY,
                                                phases=True))
            ot, om, oc = (statistics.median(r[i] for r in ort_runs) for i in range(3))
            qt, qm, qc = (statistics.median(r[i] for r in qnnx_runs) for i in range(3))
            # ratios of the runs side by side, then their median
            rt, rc = (statistics.median(o[i] / q[i] for o, q in zip(ort_runs, qnnx_runs)) for i in (0, 2))
            rows.append(f"| {n} | {method} | {ot:.1f} | {qt:.1f} | {rt:.1f}x | {oc:.2f} | {qc:.2f} | "
                        f"{rc:.1f}x | {om:.0f} | {qm:.0f} |")
            print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
