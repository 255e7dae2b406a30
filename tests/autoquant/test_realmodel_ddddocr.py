"""A real model nobody tuned on, with a wrong declaration: ddddocr's float captcha recognizer declares
its output (1, steps) while computing (steps, 1, classes). Quantized with the defaults it keeps its
shape and reads the captchas fp32 reads. Skipped unless the bench extra is installed
(``pip install -e ".[bench]"``): the model ships in the ddddocr package."""

from __future__ import annotations

import pytest
from bench_tasks import bench_module

import qnnx

tasks = bench_module("tasks", "ddddocr")
TASKS, run_model = tasks.TASKS, tasks.run_model


@pytest.mark.realmodel
def test_ddddocr_defaults_keep_the_output_shape_and_the_text(tmp_path):
    task = TASKS["ddddocr"]
    calib, ev = task.calibration(8, seed=0), [f for f, _ in task.evaluation(16)]
    q = qnnx.quantize(str(task.model_path), calib, qnnx.QuantConfig(progress=False))
    assert q.report.records["prepare"].not_applied == ()  # no rewrite had to be left out
    q.save(tmp_path / "q.onnx")
    ref, got = ([o[0] for o in run_model(m, ev)] for m in (task.model_path, tmp_path / "q.onnx"))
    assert all(r.shape == g.shape and r.shape[1:] == (1, 8210) for r, g in zip(ref, got))
    same = sum(task.decode([r]) == task.decode([g]) for r, g in zip(ref, got))
    assert same >= 14, f"{same} of 16 captchas read as fp32 reads them"
