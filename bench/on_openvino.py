"""OpenVINO as the deployment target: fp32 vs NNCF vs qnnx ``--target openvino``, all run by OpenVINO's CPU plugin.

    python bench/on_openvino.py                                   # the five tuning models, 5 seeds, 32 calib, 200 eval
    python bench/on_openvino.py --tasks ppocr_cls --seeds 0 1 --eval 64 --repeats 30

For each task (bench/tasks.py) and each calibration set ``seed`` (``Task.calibration(--calib, seed)``,
the protocol's disjoint sets), the same samples calibrate

- ``nncf``: ``nncf.quantize(openvino.convert_model(model), nncf.Dataset(samples))``, its defaults;
- ``nncf_best``: the same with NNCF's documented recipe for the model where it has one
  (``model_type=TRANSFORMER`` for the transformer models, its YOLOv8 example's MIXED preset and ignored
  detection-head subgraph), else absent;
- ``qnnx``: ``qnnx.quantize(..., QuantConfig(target="openvino"))``, the QDQ file it writes;
- ``qnnx_sym`` (only with ``--with-symmetric``): the same with the opt-in ``symmetric_activations="auto"``
  (zero point 0 on the inputs where the plugin's outputs stay as close to float);
- ``qnnx_pairs`` (only with ``--with-pairs``): the same with the opt-in ``weight_bits="pairs"`` (MatMul/Gemm
  weights 8-bit with each same-sign pair of adjacent input channels within what the plugin's int16 sums hold);
- ``qnnx_gptq_all`` (only with ``--with-gptq-all``): the same with the opt-in ``weight_rounding="gptq_all"``
  (MatMul/Gemm weights GPTQ-rounded for their layer's output error too);
- ``qnnx_pairs_gptq`` (only with ``--with-pairs-gptq``): both opt-ins (pair-limited MatMul/Gemm weights,
  GPTQ-rounded within the pair limit);
- ``qnnx_dw_channel`` (only with ``--with-per-channel-depthwise``): the same with the opt-in
  ``depthwise_inputs="per_channel"`` (a depthwise conv's input quantized per channel);
- ``qnnx_w8`` (only with ``--with-8bit``): the same with ``weight_bits=8`` (no 7-bit headroom: exact on
  CPUs whose int8 kernels sum in 32 bits, VNNI or AMX);
- ``qnnx_transformer`` (only with ``--with-transformer-recipe``): qnnx's preset for a transformer on
  OpenVINO (``QuantConfig.with_preset("transformer")``): every MatMul input smoothed
  (``smoothing_sites="matmuls"``, ``smoothing_alpha=0.8``), pair-limited MatMul/Gemm weights GPTQ-rounded
  (``weight_bits="pairs"``, ``weight_rounding="gptq_all"``);
- ``qnnx_ort`` (only with ``--with-ort-shape``): qnnx's ONNX Runtime-shaped QDQ file, run on OpenVINO;

and every model is scored by OpenVINO (an ONNX file converted by ``openvino.convert_model`` first, as NNCF's
models are) on the same ``--eval`` evaluation samples (task metric; mean and
worst over the seeds), and its outputs compared with the fp32 model's computed in f32: the raw outputs'
cosine (``cosine to fp32``, bench/tasks.raw_agreement, mean over the samples) in the table, the task's own
agreement measures (decoded text, thresholded maps, labels) in the JSON. They show where a score above or
below another's is a departure from float rather than fidelity; neither alone is fidelity (a softmax
output's cosine follows its confidence more than its decisions). Latency: the fp32 model and each
quantizer's model of the first seed compiled side by side (CPU plugin, ``--threads`` threads, one stream) and timed interleaved on the first
evaluation sample, ``--rounds`` rounds of ``--repeats`` runs, in one process per model with the compile
order rotated (a later compile runs faster here); each model's time relative to NNCF's default model is
the median over the processes of the median of the rounds' ratios, and NNCF's model timed a second time
(``nncf_again``) shows the run's noise. Results: JSON (``--out``) and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.protocol import summarize  # noqa: E402
from bench.tasks import TASKS, main_metric  # noqa: E402
from qnnx.autoquant.config import PRESETS  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"
DEFAULT_TASKS = ("ppocr_rec", "ppocr_det", "ppocr_cls", "yolov8n", "minilm")
# SVTR blocks (PP-OCRv4 rec, also its confirmation tasks) / BERT / ViT: NNCF's model_type=TRANSFORMER preset
TRANSFORMERS = ("ppocr_rec", "ppocr_rec_heldout", "ppocr_rec_shift", "minilm", "paraphrase_minilm", "vit_focus")


def nncf_best_options(task_name: str, ov_model) -> dict | None:
    """NNCF's documented recipe for this model, or None when it has none beyond the defaults."""
    import nncf

    if task_name in TRANSFORMERS:
        return {"model_type": nncf.ModelType.TRANSFORMER}
    if task_name.startswith("yolov8n"):
        # NNCF's YOLOv8 example (examples/post_training_quantization/openvino/yolov8): MIXED preset, the
        # detection head's box decoding after the three Concats left float.
        names = {op.get_friendly_name() for op in ov_model.get_ops()}
        heads = [n for n in ("/model.22/Concat", "/model.22/Concat_1", "/model.22/Concat_2") if n in names]
        sink = [f"{o.get_node().get_friendly_name()}" for o in ov_model.outputs]
        if len(heads) == 3:
            scope = nncf.IgnoredScope(subgraphs=[nncf.Subgraph(inputs=heads, outputs=sink)])
            return {"preset": nncf.QuantizationPreset.MIXED, "ignored_scope": scope}
        return {"preset": nncf.QuantizationPreset.MIXED}
    return None


# qnnx's opt-in variants (QuantConfig options beyond target="openvino")
QNNX_OPTIONS = {"qnnx_sym": {"symmetric_activations": "auto"}, "qnnx_pairs": {"weight_bits": "pairs"},
                "qnnx_gptq_all": {"weight_rounding": "gptq_all"},
                "qnnx_pairs_gptq": {"weight_bits": "pairs", "weight_rounding": "gptq_all"},
                "qnnx_dw_channel": {"depthwise_inputs": "per_channel"}, "qnnx_w8": {"weight_bits": 8},
                "qnnx_transformer": dict(PRESETS["transformer"].options)}


def nncf_quantize(task_name: str, model_path: Path, calib: list, best: bool):
    import nncf
    import openvino as ov

    model = ov.convert_model(str(model_path))
    options = nncf_best_options(task_name, model) if best else {}
    if options is None:
        return None
    return nncf.quantize(model, nncf.Dataset(calib), subset_size=len(calib), **options)


def qnnx_quantize(model_path: Path, calib: list, target: str, out: Path, **options) -> Path:
    import qnnx

    qm = qnnx.quantize(str(model_path), calib, qnnx.QuantConfig(progress=False, target=target, **options))
    qm.save(out)
    return out


def compiled(model, threads: int, precision: str):
    """An OpenVINO CPU compiled model of an ONNX path or an ``openvino.Model``."""
    import openvino as ov

    from qnnx.targets.openvino.runtime import compile_model

    if isinstance(model, ov.Model):
        config = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": str(threads)}
        if precision != "default":
            config["INFERENCE_PRECISION_HINT"] = precision
        return ov.Core().compile_model(model, "CPU", config)
    return compile_model(model, threads=threads, precision=precision)


def outputs_of(model, feeds: list, threads: int, precision: str) -> list[list]:
    from qnnx.targets.openvino.runtime import run

    c = compiled(model, threads, precision)
    return [run(c, f) for f in feeds]


def int8_layers(model, precision: str) -> tuple[int, int]:
    """(int8, float) conv/matmul layers of the runtime graph."""
    from qnnx.targets.openvino.execution_check import contractions, executed_layers

    int8, floats = contractions(executed_layers(compiled(model, 1, precision)))
    return len(int8), len(floats)


def latency(models: dict, feed: dict, threads: int, repeats: int, precision: str, rounds: int, tmp: Path,
            processes: int = 0) -> dict:
    """Median ms of each model and its time relative to NNCF's default model, with NNCF's model timed a
    second time as ``nncf_again`` (its ratio is the run's own noise).

    Each model is written to a file and timed in ``processes`` processes (0: as many as there are models),
    each compiling them in a rotated order: on this host a model compiled later in a process runs a few
    percent faster than the same file compiled earlier, so one fixed order favours whatever comes last.
    Within a process the models run interleaved (``repeats`` per round, the order rotated each time, so a
    shared machine's load hits all alike); a process's ratio is the median over ``rounds`` of the round's
    median time over NNCF's; the ratio reported is the median over the processes."""
    import openvino as ov

    files = {}
    for k, m in models.items():
        if isinstance(m, ov.Model):
            files[k] = tmp / f"timed.{k}.xml"
            ov.save_model(m, files[k], compress_to_fp16=False)
        else:
            files[k] = Path(m)
    if "nncf" in files:
        files["nncf_again"] = files["nncf"]
    keys = list(files)
    feed_file = tmp / "timed.feed.npz"
    np.savez(feed_file, **feed)
    per_process = []
    for p in range(processes or len(keys)):
        order = keys[p % len(keys):] + keys[:p % len(keys)]
        spec = {"files": {k: str(files[k]) for k in order}, "feed": str(feed_file), "threads": threads,
                "repeats": repeats, "rounds": rounds, "precision": precision}
        out = subprocess.run([sys.executable, __file__, "--time-spec", json.dumps(spec)], check=True,
                             capture_output=True, text=True).stdout
        per_process.append(json.loads(out.strip().splitlines()[-1]))
    return {"ms": {k: statistics.median(r["ms"][k] for r in per_process) for k in keys},
            "vs_nncf": {k: statistics.median(r["vs_nncf"][k] for r in per_process) for k in keys},
            "vs_nncf_per_process": {k: [r["vs_nncf"][k] for r in per_process] for k in keys}}


def time_in_this_process(spec: dict) -> dict:
    """One process of :func:`latency`: the files compiled in the given order, timed interleaved."""
    from qnnx.targets.timing import interleaved_ms

    loaded = np.load(spec["feed"])
    feed = {k: loaded[k] for k in loaded.files}
    keys = list(spec["files"])
    requests = [compiled(spec["files"][k], spec["threads"], spec["precision"]).create_infer_request() for k in keys]
    runners = [lambda r=r: r.infer(feed) for r in requests]
    for run in runners:
        for _ in range(3):
            run()
    ref = keys.index("nncf") if "nncf" in keys else 0
    times: dict[str, list[float]] = {k: [] for k in keys}
    ratios: dict[str, list[float]] = {k: [] for k in keys}
    for _ in range(spec["rounds"]):
        this = interleaved_ms(runners, spec["repeats"])
        for k, ms in zip(keys, this):
            times[k] += ms
            ratios[k].append(statistics.median(ms) / statistics.median(this[ref]))
    return {"ms": {k: statistics.median(v) for k, v in times.items()},
            "vs_nncf": {k: statistics.median(v) for k, v in ratios.items()}}


def run_task(name: str, args, tmp: Path) -> dict:
    task = TASKS[name]
    why = task.unavailable()
    if why:
        return {"task": name, "unavailable": why}
    evaluation = task.evaluation(args.eval, seed=args.eval_seed)
    feeds, truths = [f for f, _ in evaluation], [t for _, t in evaluation]
    fp32 = task.score(outputs_of(task.model_path, feeds, args.score_threads, args.precision), truths)
    metric = main_metric(fp32)
    reference = outputs_of(task.model_path, feeds, args.score_threads, "f32")  # float as computed, not bf16
    print(f"== {name}: OpenVINO fp32 {metric} {fp32[metric]:.4f}", flush=True)
    configs = [c for c in ["nncf", "nncf_best", "qnnx"] + (["qnnx_sym"] if args.with_symmetric else [])
               + (["qnnx_pairs"] if args.with_pairs else [])
               + (["qnnx_gptq_all"] if args.with_gptq_all else [])
               + (["qnnx_pairs_gptq"] if args.with_pairs_gptq else [])
               + (["qnnx_dw_channel"] if args.with_per_channel_depthwise else [])
               + (["qnnx_w8"] if args.with_8bit else [])
               + (["qnnx_transformer"] if args.with_transformer_recipe else [])
               + (["qnnx_ort"] if args.with_ort_shape else []) if not args.only or c in args.only]
    res = {"task": name, "metric": metric, "fp32": fp32[metric],
           "configs": {c: {"per_seed": [], "errors": {}, "seconds": [], "agreement": []} for c in configs}}
    first: dict = {"fp32": task.model_path}
    for seed in args.seeds:
        calib = task.calibration(args.calib, seed=seed)
        for c in configs:
            t = time.perf_counter()
            try:
                if c.startswith("nncf"):
                    model = nncf_quantize(name, task.model_path, calib, best=c == "nncf_best")
                    if model is None:
                        res["configs"][c]["per_seed"].append(None)
                        res["configs"][c]["errors"][seed] = "no recipe beyond the defaults"
                        continue
                else:
                    model = qnnx_quantize(task.model_path, calib, "onnxruntime" if c == "qnnx_ort" else "openvino",
                                          tmp / f"{name}.{c}.{seed}.onnx",
                                          **QNNX_OPTIONS.get(c, {}))
                seconds = time.perf_counter() - t
                outputs = outputs_of(model, feeds, args.score_threads, args.precision)
                value = task.score(outputs, truths)[metric]
                agreement = task.agreement(reference, outputs)
            except Exception as e:  # noqa: BLE001 - a failing quantizer is a result, reported as such
                where = traceback.extract_tb(e.__traceback__)[-1]
                res["configs"][c]["errors"][seed] = f"{type(e).__name__}: {str(e)[:300]} [{Path(where.filename).name}:{where.lineno}]"
                value, seconds, agreement = None, time.perf_counter() - t, None
                model = None
            res["configs"][c]["per_seed"].append(value)
            res["configs"][c]["agreement"].append(agreement)
            res["configs"][c]["seconds"].append(seconds)
            if seed == args.seeds[0] and model is not None:
                first[c] = model
            print(f"   {c} seed {seed}: {'FAILED ' + res['configs'][c]['errors'][seed] if value is None else f'{value:.4f}'}"
                  + ("" if agreement is None else f", cosine to fp32 {agreement['cosine']:.5f}")
                  + f" (quantized in {seconds:.0f} s)", flush=True)
    for c in configs:
        r = res["configs"][c]
        score, cosine = summarize(r["per_seed"]), summarize([None if a is None else a["cosine"] for a in r["agreement"]])
        r["mean"], r["worst"] = score["mean"], score["worst"]
        r["cosine_mean"], r["cosine_worst"] = cosine["mean"], cosine["worst"]
    timed = latency(first, feeds[0], args.threads, args.repeats, args.precision, args.rounds, tmp, args.processes)
    ms = res["latency_ms"] = timed["ms"]
    res["time_vs_nncf"] = timed["vs_nncf"]
    res["time_vs_nncf_per_process"] = timed["vs_nncf_per_process"]
    res["int8_layers"] = {k: int8_layers(m, args.precision) for k, m in first.items()}
    print(f"   latency ({args.threads} thread(s), ms): " + ", ".join(f"{k} {v:.2f}" for k, v in ms.items())
          + " | int8/float conv+matmul layers: " + ", ".join(f"{k} {a}/{b}" for k, (a, b) in res["int8_layers"].items()),
          flush=True)
    return res


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.4f}"


def markdown(results: list[dict]) -> str:
    lines = ["| model | metric | OV fp32 | NNCF default mean / worst | NNCF best mean / worst | qnnx mean / worst | "
             "cosine to fp32: NNCF / NNCF best / qnnx (mean) | ms: fp32 / NNCF / NNCF best / qnnx | "
             "qnnx speed vs NNCF, NNCF best |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "unavailable" in r:
            lines.append(f"| {r['task']} | unavailable: {r['unavailable']} | | | | | | | |")
            continue
        c, ms = r["configs"], r["latency_ms"]
        if any(k not in c for k in ("nncf", "nncf_best", "qnnx")):
            continue
        cells = [f"{_fmt(c[k]['mean'])} / {_fmt(c[k]['worst'])}" if c[k]["mean"] is not None else "-"
                 for k in ("nncf", "nncf_best", "qnnx")]
        times = " / ".join(f"{ms[k]:.2f}" if k in ms else "-" for k in ("fp32", "nncf", "nncf_best", "qnnx"))
        rel = r.get("time_vs_nncf", {})
        ratio = ", ".join(f"{rel[k] / rel['qnnx']:.3f}x" if k in rel and "qnnx" in rel else "-"
                          for k in ("nncf", "nncf_best"))
        cosines = " / ".join(f"{c[k]['cosine_mean']:.5f}" if c[k].get("cosine_mean") is not None else "-"
                             for k in ("nncf", "nncf_best", "qnnx"))
        lines.append(f"| {r['task']} | {r['metric']} | {r['fp32']:.4f} | " + " | ".join(cells)
                     + f" | {cosines} | {times} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--tasks", nargs="+", default=list(DEFAULT_TASKS), choices=sorted(TASKS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--calib", type=int, default=32)
    ap.add_argument("--eval", type=int, default=200)
    ap.add_argument("--eval-seed", type=int, default=1,
                    help="which evaluation samples (Task.evaluation's seed; the protocol's are 1's)")
    ap.add_argument("--threads", type=int, default=1, help="inference threads of the latency runs")
    ap.add_argument("--score-threads", type=int, default=2, help="inference threads while scoring")
    ap.add_argument("--repeats", type=int, default=20, help="timed runs of each model per round")
    ap.add_argument("--rounds", type=int, default=5,
                    help="latency rounds per process (the ratio to NNCF: median over the processes of the rounds' median)")
    ap.add_argument("--processes", type=int, default=0,
                    help="timing processes, the compile order rotated in each (default: one per model); more of "
                         "them narrow the median's spread")
    ap.add_argument("--precision", default="default", help="INFERENCE_PRECISION_HINT (default: the plugin's)")
    ap.add_argument("--with-ort-shape", action="store_true", help="also qnnx's ONNX Runtime-shaped QDQ file on OpenVINO")
    ap.add_argument("--with-symmetric", action="store_true",
                    help="also qnnx with symmetric_activations='auto' (zero point 0 where the plugin's outputs allow)")
    ap.add_argument("--with-pairs", action="store_true",
                    help="also qnnx with weight_bits='pairs' (MatMul/Gemm weights 8-bit, int16 pairs limited)")
    ap.add_argument("--with-gptq-all", action="store_true",
                    help="also qnnx with weight_rounding='gptq_all' (MatMul/Gemm weights GPTQ-rounded too)")
    ap.add_argument("--with-pairs-gptq", action="store_true",
                    help="also qnnx with both: weight_bits='pairs' and weight_rounding='gptq_all'")
    ap.add_argument("--with-per-channel-depthwise", action="store_true",
                    help="also qnnx with depthwise_inputs='per_channel' (depthwise conv inputs per channel)")
    ap.add_argument("--with-8bit", action="store_true",
                    help="also qnnx with weight_bits=8 (8-bit weights: exact on CPUs whose int8 kernels sum in 32 bits)")
    ap.add_argument("--with-transformer-recipe", action="store_true",
                    help="also qnnx with every MatMul input smoothed (alpha 0.8) and pair-limited, GPTQ-rounded "
                         "MatMul/Gemm weights")
    ap.add_argument("--only", nargs="+",
                    help="a subset of the quantizers (nncf nncf_best qnnx qnnx_sym qnnx_pairs qnnx_gptq_all "
                         "qnnx_pairs_gptq qnnx_dw_channel qnnx_w8 qnnx_transformer qnnx_ort)")
    ap.add_argument("--out", type=Path, default=OUT / "openvino.json")
    ap.add_argument("--time-spec", help=argparse.SUPPRESS)  # one timing process of latency()
    args = ap.parse_args()
    if args.time_spec:
        print(json.dumps(time_in_this_process(json.loads(args.time_spec))))
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="qnnx_ov_bench_") as tmp:
        for name in args.tasks:
            results.append(run_task(name, args, Path(tmp)))
            args.out.write_text(json.dumps({"argv": sys.argv[1:], "results": results}, indent=1, default=str))
    print(markdown(results))
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
