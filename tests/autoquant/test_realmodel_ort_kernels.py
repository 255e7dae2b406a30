"""The written QDQ models of real PP-OCR models run as integer kernels on ONNX Runtime: every quantized
conv group fused (fusion_check.py; 9 of PP-OCRv4 rec's depthwise convs once silently ran float; the
default weight rounding and bias correction keep it so), the
classifier's depthwise convs padded to ORT's fast kernel with the same output bits (channel_padding.py).
The models ship in rapidocr-onnxruntime (the examples extra, part of dev)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rapidocr_onnxruntime", reason="needs the examples extra")
pytest.importorskip("cv2", reason="needs the examples extra")

import cv2  # noqa: E402
import onnx_ir as ir  # noqa: E402
import onnxruntime as ort  # noqa: E402
import rapidocr_onnxruntime  # noqa: E402

import qnnx  # noqa: E402
from qnnx import QuantConfig  # noqa: E402
from qnnx.examples.ppocr_cls import crops, load_classifier  # noqa: E402
from qnnx.examples.text_lines import text_line  # noqa: E402
from qnnx.targets import target  # noqa: E402

UNTIMED = QuantConfig(progress=False, speed_fallback="off")


def _run(model: ir.Model, feed: dict) -> np.ndarray:
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.log_severity_level = 1, 3
    sess = ort.InferenceSession(ir.to_proto(model).SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feed)[0]


@pytest.mark.realmodel
def test_ppocr_cls_depthwise_convs_are_padded_with_the_same_bits_and_every_group_is_fused():
    clf = load_classifier()
    calibration, _ = crops(clf, 8, 0, 0)
    qm = qnnx.quantize(str(clf.path), calibration, UNTIMED)
    padded, records = target("onnxruntime").export(qm.qdq), qm.report.record("onnxruntime").padding
    assert sorted(r.channels for r in records if r.padded) == [8, 24, 40, 88, 88, 104, 200, 200]
    assert all(r.padded % 16 == 0 for r in records if r.padded)
    ort_record = qm.report.record("onnxruntime")
    assert ort_record.unfused == [] and ort_record.fusable >= 40
    for x in crops(clf, 4, 0, 1)[0]:
        np.testing.assert_array_equal(_run(padded, {clf.input_name: x}), _run(qm.qdq, {clf.input_name: x}))


def _rec_input(seed: int) -> np.ndarray:
    """A rendered text line as rapidocr feeds PP-OCRv4 rec: height 48, width 320, [-1, 1]."""
    img, _ = text_line(np.random.default_rng([7, seed]))
    h, w = img.shape[:2]
    width = min(320, int(np.ceil(48 * w / h)))
    x = np.zeros((3, 48, 320), np.float32)
    x[:, :, :width] = (cv2.resize(img, (width, 48)).astype(np.float32).transpose(2, 0, 1) / 255 - 0.5) / 0.5
    return x[None]


@pytest.mark.realmodel
def test_ppocr_rec_every_quantized_conv_is_an_integer_kernel():
    path = Path(rapidocr_onnxruntime.__file__).parent / "models" / "ch_PP-OCRv4_rec_infer.onnx"
    qm = qnnx.quantize(str(path), [_rec_input(i) for i in range(8)], UNTIMED)
    ort_record, rounding = qm.report.record("onnxruntime"), qm.report.record("weight_rounding").layers
    assert ort_record.fusable >= 40
    # The defaults re-round the 14 depthwise convs' weights and the ungrouped convs' that see enough input
    # patches (not the SE blocks' 1x1 convs on pooled maps: 8 patches for 60-480 taps), and correct every
    # conv's int32 bias: the biases stay at x_scale * w_scale, so ORT still fuses every group.
    depthwise = [r for r in rounding if r.depthwise]
    assert len(depthwise) == 14 and all(r.gain_db > 1 and not r.reason for r in depthwise)
    rounded = [r for r in rounding if not r.depthwise and not r.reason]
    assert len(rounded) >= 15 and all(r.gain_db > 1 for r in rounded)
    assert all("too few to rank roundings by" in r.reason for r in rounding if r.reason)
    assert len(qm.report.record("bias_correction").corrections) >= 38
    assert ort_record.unfused == [], ort_record.unfused
