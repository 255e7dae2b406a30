"""``qnnx demo`` and the CLI on PP-OCR's real direction classifier (shipped in rapidocr-onnxruntime)."""

from __future__ import annotations

import re
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from qnnx import QuantConfig
from qnnx.cli import main
from qnnx.examples import ppocr_cls


def test_demo_without_the_extra_says_how_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "rapidocr_onnxruntime", None)  # import fails as if not installed
    assert main(["demo", "-q"]) == 1
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and 'pip install "qnnx[examples]"' in err and captured.out == ""


def _accuracies(text: str) -> dict[str, float]:
    return {m[1]: float(m[2]) / 100 for m in re.finditer(r"^  (fp32|int8 \(qnnx\)): accuracy ([0-9.]+)%", text, re.M)}


@pytest.mark.realmodel
def test_demo_end_to_end(tmp_path, capsys):
    out = tmp_path / "cls.int8.onnx"
    assert main(["demo", "--samples", "8", "--eval", "60", "--seed", "0", "-o", str(out), "-q",
                 "--export", str(tmp_path / "demo")]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    acc = _accuracies(captured.out)
    # 60 crops: one crop is 1.7 points; int8 may lose at most 3 of them against fp32
    assert acc["fp32"] >= 0.85 and acc["int8 (qnnx)"] >= acc["fp32"] - 0.05, captured.out
    assert f"wrote {out} (qdq)" in captured.out and re.search(r"int8 \(qnnx\): .* ms, [0-9.]+x", captured.out)

    assert (tmp_path / "demo" / "float.onnx").read_bytes() == ppocr_cls.load_classifier().path.read_bytes()
    assert sorted(p.name for p in (tmp_path / "demo" / "samples").iterdir()) == [f"{i:03d}.npy" for i in range(8)]

    # the saved model is a plain ONNX model ONNX Runtime runs, giving the labels the demo scored; it is QDQ
    # (the speed fallback, which could keep the whole model float, is off by default)
    model = onnx.load(out)
    assert "whole model kept float" not in captured.out
    assert {n.domain for n in model.graph.node} == {""}
    assert "QuantizeLinear" in {n.op_type for n in model.graph.node}, captured.out
    clf = ppocr_cls.load_classifier()
    tensors, labels = ppocr_cls.crops(clf, 60, seed=0, split=1)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = np.array([int(np.argmax(session.run(None, {"x": x})[0][0])) for x in tensors])
    assert np.mean(got == labels) == pytest.approx(acc["int8 (qnnx)"], abs=0.0005)  # printed with 0.1%

    # The speed fallback is off by default now (it used to be "auto" and time this classifier): nothing is
    # timed, so the result is deterministic: the same seed gives the same model bytes and accuracies.
    speed_lines = [line for line in captured.out.splitlines() if "speed (" in line]
    assert speed_lines == [], captured.out
    untimed = QuantConfig(progress=False, speed_fallback="off")
    first = ppocr_cls.run(8, 60, 0, tmp_path / "first.onnx", repeats=3, config=untimed)
    again = ppocr_cls.run(8, 60, 0, tmp_path / "again.onnx", repeats=3, config=untimed)
    assert (tmp_path / "again.onnx").read_bytes() == (tmp_path / "first.onnx").read_bytes() == out.read_bytes()
    assert again.fp32_accuracy == pytest.approx(acc["fp32"], abs=0.0005)
    assert again.int8_accuracy == pytest.approx(first.int8_accuracy, abs=0.0005)
    assert first.report.record("speed_fallback") is None


@pytest.mark.realmodel
def test_demo_refuses_to_overwrite_the_shipped_model(capsys):
    path = ppocr_cls.load_classifier().path
    before = path.stat().st_mtime_ns
    assert main(["demo", "-q", "-o", str(path)]) == 1
    assert "refusing to overwrite the input model" in capsys.readouterr().err and path.stat().st_mtime_ns == before


@pytest.fixture(scope="module")
def real_classifier(tmp_path_factory):
    """The shipped classifier, 8 calibration crops as .npy files, and its all-integer qnnx QDQ model (via the
    CLI, ``--speed-fallback off``: the default "auto" leaves this classifier's layers that ONNX Runtime runs
    slower in int8 float, and the strict canonical conversion below needs every op integer)."""
    tmp = tmp_path_factory.mktemp("cls")
    clf = ppocr_cls.load_classifier()
    calib = tmp / "calib"
    calib.mkdir()
    for i, x in enumerate(ppocr_cls.crops(clf, 8, seed=0, split=0)[0]):
        np.save(calib / f"{i}.npy", x)
    qdq = tmp / "cls.qdq.onnx"
    assert main(["quantize", str(clf.path), "-o", str(qdq), "--calib", str(calib), "-q", "--speed-fallback",
                 "off"]) == 0
    return clf, calib, qdq


@pytest.mark.realmodel
def test_cli_quantize_from_qdq_lower_on_the_real_classifier(real_classifier, tmp_path, capsys):
    clf, calib, qdq = real_classifier
    capsys.readouterr()
    canonical, lowered = tmp_path / "cls.qnnx.onnx", tmp_path / "cls.lowered.onnx"
    assert main(["from-qdq", str(qdq), "-o", str(canonical)]) == 0
    assert f"wrote {canonical}" in capsys.readouterr().out
    assert any(n.domain == "qnnx" for n in onnx.load(canonical).graph.node)
    assert main(["lower", str(canonical), "-o", str(lowered)]) == 0
    # the lowered integer model agrees with ONNX Runtime on the QDQ model to within 0.05 of a softmax
    # probability (measured: max 0.047, mean 0.007 over the 32 demo crops; the output step is 1/255): ORT's
    # fused integer kernels and the canonical form's per-op requantization round differently, and 36
    # hard-swish ops stay float in the canonical form. Not bit-exact, so the labels are what is asserted.
    runs = [ort.InferenceSession(str(m), providers=["CPUExecutionProvider"]) for m in (qdq, lowered)]
    for f in sorted(calib.iterdir())[:2]:
        want, got = (r.run(None, {clf.input_name: np.load(f)})[0] for r in runs)
        np.testing.assert_allclose(got, want, atol=0.05)
        assert np.argmax(got) == np.argmax(want)


@pytest.mark.realmodel
def test_cli_from_qdq_strict_on_the_real_classifier(real_classifier, tmp_path, capsys):
    _, _, qdq = real_classifier
    assert main(["from-qdq", str(qdq), "-o", str(tmp_path / "c.onnx"), "--strict"]) == 0
