"""A real model nobody tuned on, with a wrong declaration: ddddocr's float captcha recognizer declares
its output (1, steps) while computing (steps, 1, classes). Quantized with the defaults it keeps its
shape and reads the captchas fp32 reads. Skipped unless the bench extra is installed
(``pip install -e ".[bench]"``): the model ships in the ddddocr package."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

pytest.importorskip("cv2", reason="needs the bench extra")
if __import__("importlib.util").util.find_spec("ddddocr") is None:
    pytest.skip("needs the bench extra (the ddddocr package)", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.tasks import TASKS  # noqa: E402

import qnnx  # noqa: E402


def _run(path, feeds) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.log_severity_level = 1, 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return [sess.run(None, f)[0] for f in feeds]


@pytest.mark.realmodel
def test_ddddocr_defaults_keep_the_output_shape_and_the_text(tmp_path):
    task = TASKS["ddddocr"]
    calib, ev = task.calibration(8, seed=0), [f for f, _ in task.evaluation(16)]
    q = qnnx.quantize(str(task.model_path), calib, qnnx.QuantConfig(progress=False))
    assert q.report.records["prepare"].not_applied == ()  # no rewrite had to be left out
    q.save(tmp_path / "q.onnx")
    ref, got = _run(task.model_path, ev), _run(tmp_path / "q.onnx", ev)
    assert all(r.shape == g.shape and r.shape[1:] == (1, 8210) for r, g in zip(ref, got))
    same = sum(task.decode([r]) == task.decode([g]) for r, g in zip(ref, got))
    assert same >= 14, f"{same} of 16 captchas read as fp32 reads them"
