"""Every corpus case (fuzz_corpus.py) through every command and the Python API.

Bad input: exit 1 with one line ``qnnx: error: ...`` on stderr (never a traceback, never exit 2),
nothing written, every input byte-identical; the API raises QnnxError and nothing else. Odd but
valid input may be refused the same way; when a command succeeds, what it wrote loads in ONNX
Runtime or qnnx.ReferenceEvaluator and gives finite outputs.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fuzz_corpus import QUICK, calibration_cases, counts, model_cases, qparams_cases, usage_cases

import qnnx
from qnnx.cli import main
from qnnx.dialect import REGISTRY
from qnnx.frontends.onnx_quant import IMPORT_RULES

MODEL_COMMANDS = ("import", "from-qdq", "lower")
# ORT cannot feed or fetch these, and has no 2-bit kernels at all
_SUB_BYTE = (onnx.TensorProto.INT4, onnx.TensorProto.UINT4, onnx.TensorProto.INT2, onnx.TensorProto.UINT2)


def _snapshot(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(d.rglob("*"))}


def _run(argv: list[str], d: Path, capsys, *, bad: bool, out: Path | None = None) -> int:
    """Run the command; check the exit code, the message, and that no input changed."""
    before = _snapshot(d)
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:  # usage errors and --help leave through SystemExit, as with any parser
        code = e.code
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err + cap.out, cap.err
    assert code in (0, 1), f"exit {code}: {cap.err}"
    after = _snapshot(d)
    if code == 1:
        lines = cap.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("qnnx: error: "), cap.err
        assert after == before, "a refused command left files behind or changed an input"
    else:
        assert not bad, f"bad input accepted: {argv}"
        changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
        allowed = {str(out.relative_to(d))} if out is not None else set()
        assert changed <= allowed, f"changed besides the output: {sorted(changed - allowed)}"
    return code


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    init = {t.name for t in model.graph.initializer}
    feeds = {}
    for v in model.graph.input:
        if v.name in init:
            continue
        t = v.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in t.shape.dim]
        if t.elem_type == onnx.TensorProto.STRING:
            feeds[v.name] = np.full(shape, "a", dtype=object)
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        if np.dtype(dtype).kind == "f":
            feeds[v.name] = rng.standard_normal(shape).astype(dtype)
        else:
            info = ml_dtypes.iinfo(dtype) if np.dtype(dtype).itemsize == 1 and dtype not in (np.int8, np.uint8) \
                else np.iinfo(dtype)
            lo, hi = max(int(info.min), -100), min(int(info.max), 100)
            feeds[v.name] = rng.integers(lo, hi + 1, shape).astype(dtype)
    return feeds


def _runs(path: Path) -> None:
    """The written model runs (ONNX Runtime when it can feed its inputs, else the reference evaluator)
    with finite float outputs."""
    model = onnx.load(path)
    feeds = _feeds(model)
    standard = all(n.domain in ("", "ai.onnx") for n in model.graph.node)
    sub_byte = any(v.type.tensor_type.elem_type in _SUB_BYTE for v in (*model.graph.input, *model.graph.output)) \
        or any(t.data_type in (onnx.TensorProto.INT2, onnx.TensorProto.UINT2) for t in model.graph.initializer)
    if standard and not sub_byte:
        outs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    else:
        outs = qnnx.ReferenceEvaluator(str(path)).run(None, feeds)
    for o in outs:
        o = np.asarray(o)
        if o.dtype.kind == "f":
            assert np.all(np.isfinite(o)), "non-finite output"


def _api_refuses(fn, *args) -> bool:
    """True when ``fn`` raised QnnxError; any other exception fails the test."""
    try:
        fn(*args)
    except qnnx.QnnxError as e:
        assert "\n" not in str(e), str(e)
        return True
    return False


def _ids(cases):
    return [c.id for c in cases]


MODEL_CASES = model_cases() + qparams_cases()


@pytest.mark.parametrize("case", MODEL_CASES, ids=_ids(MODEL_CASES))
def test_model_commands(case, tmp_path, capsys):
    files = case.build(tmp_path)
    model = str(files["model"])
    out = tmp_path / "out.onnx"
    for command in MODEL_COMMANDS:
        if _run([command, model, "-o", str(out)], tmp_path, capsys, bad=case.bad, out=out) == 0:
            _runs(out)
            out.unlink()
    if case.category == "qparams":  # inspect summarizes what it reads: it may accept bad qparams, never crash
        _run(["inspect", model], tmp_path, capsys, bad=False)
    if case.category == "model":  # the commands that read a model without writing one, and quantize
        _run(["inspect", model], tmp_path, capsys, bad=case.bad)
        _run(["bench", model, "--repeats", "1"], tmp_path, capsys, bad=case.bad)
        (tmp_path / "data").mkdir()
        _run(["compare", model, model, "--data", str(tmp_path / "data")], tmp_path, capsys, bad=True)  # no samples
        q = tmp_path / "q.onnx"
        if _run(["quantize", model, "--random-calibration", "--num-samples", "2", "-o", str(q), *QUICK], tmp_path,
                capsys, bad=case.bad, out=q) == 0:
            _runs(q)


@pytest.mark.parametrize("case", MODEL_CASES, ids=_ids(MODEL_CASES))
def test_model_api(case, tmp_path):
    files = case.build(tmp_path)
    path = files["model"]
    before = _snapshot(tmp_path)
    refused = [_api_refuses(qnnx.import_onnx, path), _api_refuses(qnnx.from_qdq, path),
               _api_refuses(lambda p: qnnx.lower(qnnx.import_onnx(p)), path)]
    try:
        evaluator = qnnx.ReferenceEvaluator(path)
    except qnnx.QnnxError:
        refused.append(True)
    else:
        refused.append(False)
        outs = evaluator.run(None, _feeds(onnx.load(path)))
        assert all(np.all(np.isfinite(o)) for o in outs if np.asarray(o).dtype.kind == "f")
    if case.bad:
        assert all(refused), f"accepted by {[n for n, r in zip(('import', 'from_qdq', 'lower', 'reference'), refused) if not r]}"
    assert _snapshot(tmp_path) == before


CALIBRATION_CASES = calibration_cases()


@pytest.mark.parametrize("case", CALIBRATION_CASES, ids=_ids(CALIBRATION_CASES))
def test_calibration(case, tmp_path, capsys):
    files = case.build(tmp_path)
    out = tmp_path / "q.onnx"
    argv = ["quantize", str(files["model"]), "--calib", str(files["calib"]), "-o", str(out), *QUICK]
    if _run(argv, tmp_path, capsys, bad=case.bad, out=out) == 0:
        _runs(out)
    if case.bad:
        before = _snapshot(tmp_path)
        assert _api_refuses(qnnx.quantize, files["model"], files["calib"])
        assert _snapshot(tmp_path) == before


USAGE_CASES = usage_cases()


@pytest.mark.parametrize("case", USAGE_CASES, ids=_ids(USAGE_CASES))
def test_paths_and_options(case, tmp_path, capsys):
    files = case.build(tmp_path)
    _run(files["argv"], tmp_path, capsys, bad=True)
    assert not Path("/sys/qnnx-fuzz.onnx").exists()


def test_the_corpus_covers_every_quantization_op():
    """Every qnnx op and every ONNX / com.microsoft op import_onnx rewrites has qparams cases."""
    ops = {c.name.split("/")[0] for c in qparams_cases()}
    assert {f"qnnx.{op}" for op in REGISTRY} <= ops
    assert {op for _, op in IMPORT_RULES} <= ops
    assert all(row["bad"] for row in counts().values())
