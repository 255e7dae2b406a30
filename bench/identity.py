"""Byte identity of the benchmark's quantized models: sha256 of every file qnnx writes.

Each task of bench/tasks.py is quantized on ``calibration(--calib, seed=--seed)`` with the
defaults but no speed fallback (its choices follow the timing) and saved as qdq, qnnx and
lowered. A refactoring that must not change any model records the hashes before and checks
them after:

    python bench/identity.py --write baseline.json --out baseline/
    python bench/identity.py --check baseline.json --out after/     # exit 1 if a file differs

``--check`` prints one line per task and format, ``same`` or ``DIFFERENT`` (with the first
difference from the file kept under the baseline's ``--out``). The float model and the
calibration samples are hashed too, and the library versions and core count recorded, so a
difference in what went in is told apart from one in what qnnx did.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import qnnx  # noqa: E402
from bench.protocol import TUNING  # noqa: E402
from bench.tasks import TASKS  # noqa: E402

FORMATS = ("qdq", "qnnx", "lowered")  # saved in this order: each save reads the same QuantizedModel
CALIB, SEED = 64, 0  # bench/run.py's calibration size, Task.calibration's seed


def identity_config() -> qnnx.QuantConfig:
    """The defaults without speed fallback or progress bar. Only this changes when QuantConfig's
    fields do: the models it gives must not."""
    return qnnx.QuantConfig(speed_fallback="off", progress=False)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def samples_sha256(samples: list[dict[str, np.ndarray]]) -> str:
    """One hash over every sample's input names, dtypes, shapes and bytes."""
    h = hashlib.sha256()
    for feeds in samples:
        for name in sorted(feeds):
            a = np.ascontiguousarray(feeds[name])
            h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def environment() -> dict:
    def v(package):
        try:
            return version(package)
        except PackageNotFoundError:
            return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"python": platform.python_version(), "cores": cores,
            **{p: v(p) for p in ("numpy", "onnx", "onnx-ir", "onnxruntime", "torch")}}


def run_task(name: str, calib: int, seed: int, out: Path) -> dict[str, str]:
    """Quantize one task and save every format under ``out``; the hashes of what went in and came out."""
    task = TASKS[name]
    t0 = time.perf_counter()
    samples = task.calibration(calib, seed=seed)  # first: minilm exports its float model here
    t1 = time.perf_counter()
    qm = qnnx.quantize(str(task.model_path), samples, identity_config())
    t2 = time.perf_counter()
    hashes = {"float": file_sha256(task.model_path), "calibration": samples_sha256(samples)}
    for fmt in FORMATS:
        hashes[fmt] = file_sha256(qm.save(out / f"{name}.{fmt}.onnx", format=fmt))
    t3 = time.perf_counter()
    print(f"{name}: samples {t1 - t0:.1f} s, quantize {t2 - t1:.1f} s, save {t3 - t2:.1f} s",
          file=sys.stderr, flush=True)
    return hashes


def first_difference(a: Path, b: Path) -> str:
    """Where two ONNX files first differ: opsets, graph inputs/outputs, a node, an initializer."""
    ma, mb = onnx.load(str(a)), onnx.load(str(b))
    ga, gb = ma.graph, mb.graph
    for what, xa, xb in (("opset_import", ma.opset_import, mb.opset_import), ("inputs", ga.input, gb.input),
                         ("outputs", ga.output, gb.output), ("metadata", ma.metadata_props, mb.metadata_props)):
        if list(xa) != list(xb):
            return f"{what} differ"
    for i, (na, nb) in enumerate(zip(ga.node, gb.node)):
        if na != nb:
            return f"node {i}: {na.op_type} {na.name!r} vs {nb.op_type} {nb.name!r}"
    if len(ga.node) != len(gb.node):
        return f"{len(ga.node)} vs {len(gb.node)} nodes"
    ia, ib = {t.name: t for t in ga.initializer}, {t.name: t for t in gb.initializer}
    if ia.keys() != ib.keys():
        return f"initializers only in one: {sorted(ia.keys() ^ ib.keys())[:5]}"
    changed = [n for n in ia if ia[n] != ib[n]]
    if changed:
        return f"{len(changed)} initializers differ, first {changed[0]!r}"
    return "same graph, different serialization"


def check(baseline: dict, results: dict, baseline_dir: Path | None, out: Path) -> bool:
    """Print one line per task and key; True when everything is the same."""
    ok = True
    for name, hashes in results.items():
        before = baseline["tasks"].get(name)
        if before is None:
            print(f"{name} not in the baseline")
            ok = False
            continue
        for key, sha in hashes.items():
            if sha == before.get(key):
                print(f"{name} {key} same")
                continue
            ok = False
            where = ""
            old = baseline_dir / f"{name}.{key}.onnx" if baseline_dir else None
            if key in FORMATS and old is not None and old.exists():
                where = f" ({first_difference(old, out / f'{name}.{key}.onnx')})"
            print(f"{name} {key} DIFFERENT{where}")
    if environment() != baseline["environment"]:
        print(f"environment differs: baseline {baseline['environment']}, now {environment()}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", type=Path, metavar="FILE", help="record the hashes in this JSON file")
    mode.add_argument("--check", type=Path, metavar="FILE", help="compare with the hashes in this JSON file")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out" / "identity",
                    help="directory for the quantized models (default bench/out/identity)")
    ap.add_argument("--tasks", nargs="+", choices=list(TASKS),
                    help="default: the baseline's tasks with --check, the tuning set with --write")
    ap.add_argument("--calib", type=int, help=f"calibration samples (default {CALIB}, or the baseline's)")
    ap.add_argument("--seed", type=int, help=f"calibration seed (default {SEED}, or the baseline's)")
    args = ap.parse_args()
    baseline = json.loads(args.check.read_text()) if args.check else None
    calib = args.calib if args.calib is not None else baseline["calib"] if baseline else CALIB
    seed = args.seed if args.seed is not None else baseline["seed"] if baseline else SEED
    if baseline and (calib, seed) != (baseline["calib"], baseline["seed"]):
        raise SystemExit(f"identity.py: {args.check} was made with --calib {baseline['calib']} "
                         f"--seed {baseline['seed']}")
    if baseline and baseline.get("out") and Path(baseline["out"]) == args.out.resolve():
        raise SystemExit("identity.py: --out must not be the baseline's directory (its files are compared)")
    args.out.mkdir(parents=True, exist_ok=True)
    tasks = args.tasks or (list(baseline["tasks"]) if baseline else list(TUNING))
    results = {name: run_task(name, calib, seed, args.out) for name in tasks}
    if args.write:
        record = {"calib": calib, "seed": seed, "out": str(args.out.resolve()),
                  "environment": environment(), "tasks": results}
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(json.dumps(record, indent=1) + "\n")
        for name, hashes in results.items():
            for key, sha in hashes.items():
                print(f"{name} {key} {sha}")
    else:
        baseline_dir = Path(baseline["out"]) if baseline.get("out") else None
        sys.exit(0 if check(baseline, results, baseline_dir, args.out) else 1)


if __name__ == "__main__":
    main()
