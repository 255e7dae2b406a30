"""``qnnx demo``: quantize a real model end to end and measure what it costs and gains.

The model is PP-OCR's text-direction classifier (``ch_ppocr_mobile_v2.0_cls_infer.onnx``, a
MobileNetV3 that tells 0 degree from 180 degree text-line crops), shipped inside the PyPI package
``rapidocr-onnxruntime``. Nothing is downloaded: the data are text-line crops rendered here
(:mod:`qnnx.examples.text_lines`), every odd one turned by 180 degrees, so the labels are known,
and put through rapidocr's own pre-processing (``TextClassifier.resize_norm_img`` with the
``cls_image_shape`` of its ``config.yaml``), so the tensors are what rapidocr feeds the model.

Calibration crops and evaluation crops come from different seed streams, so they never overlap;
the same ``seed`` gives the same crops, qparams and accuracies on every run (latency varies).
"""

from __future__ import annotations

import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qnnx.errors import QnnxError

INSTALL_HINT = 'the demo needs rapidocr-onnxruntime (it ships the model): pip install "qnnx[examples]"'
_STREAM = zlib.crc32(b"qnnx demo ppocr_cls")  # this demo's seed streams, apart from any other user of the seed


@dataclass(frozen=True)
class Classifier:
    """The shipped model file and rapidocr's pre-processing for it."""

    path: Path
    input_name: str
    preprocess: object  # rapidocr TextClassifier without a session: only resize_norm_img is used

    def tensor(self, crop_bgr: np.ndarray) -> np.ndarray:
        return self.preprocess.resize_norm_img(crop_bgr)[None].astype(np.float32)


def load_classifier() -> Classifier:
    try:
        import cv2  # noqa: F401  (rapidocr's dependency; the crops are drawn with it)
        import rapidocr_onnxruntime
        from rapidocr_onnxruntime.ch_ppocr_cls.text_cls import TextClassifier
        from rapidocr_onnxruntime.utils import read_yaml
    except ImportError:
        raise QnnxError(INSTALL_HINT) from None
    root = Path(rapidocr_onnxruntime.__file__).parent
    cfg = read_yaml(str(root / "config.yaml"))["Cls"]
    path = root / cfg["model_path"]
    if not path.is_file():
        raise QnnxError(f"rapidocr-onnxruntime has no classifier model at {path}; reinstall it", where="qnnx demo")
    pre = TextClassifier.__new__(TextClassifier)  # its __init__ would open an ORT session we do not need
    pre.cls_image_shape = cfg["cls_image_shape"]
    return Classifier(path, "x", pre)


def crops(classifier: Classifier, n: int, seed: int, split: int) -> tuple[list[np.ndarray], np.ndarray]:
    """``n`` model inputs and their labels (1 = turned by 180 degrees: every odd crop)."""
    import cv2

    from qnnx.examples.text_lines import text_line

    tensors, labels = [], np.arange(n) % 2
    for i in range(n):
        img, _ = text_line(np.random.default_rng(np.random.SeedSequence([_STREAM, split, seed, i])))
        if labels[i]:
            img = cv2.rotate(img, cv2.ROTATE_180)
        tensors.append(classifier.tensor(img))
    return tensors, labels


def predict(model_path: Path, input_name: str, tensors: list[np.ndarray]) -> np.ndarray:
    """Labels from the softmax over (0, 180), as rapidocr's ClsPostProcess takes them (argmax)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    session = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    return np.array([int(np.argmax(session.run(None, {input_name: x})[0][0])) for x in tensors])


def _export(clf: Classifier, calibration: list[np.ndarray], directory: Path, output) -> None:
    import shutil

    float_path = directory / "float.onnx"
    if output is not None and Path(output).resolve() == float_path.resolve():
        raise QnnxError("-o names the exported float model; choose another -o path", where=str(output))
    if directory.exists() and not directory.is_dir():
        raise QnnxError("--export needs a directory", where=str(directory))
    (directory / "samples").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(clf.path, float_path)
    for i, x in enumerate(calibration):
        np.save(directory / "samples" / f"{i:03d}.npy", x)


@dataclass(frozen=True)
class DemoResult:
    calibration_samples: int
    eval_samples: int
    fp32_accuracy: float
    int8_accuracy: float
    label_agreement: float  # share of crops where int8 and fp32 give the same label
    fp32_ms: float  # median single-thread latency on ONNX Runtime, one crop
    int8_ms: float
    int8_path: Path | None  # where the int8 model was saved (None: not kept)
    report: object  # qnnx.autoquant.config.QuantReport

    @property
    def speedup(self) -> float:
        return self.fp32_ms / self.int8_ms


def run(samples: int = 32, eval_samples: int = 200, seed: int = 0, output: str | Path | None = None,
        repeats: int = 100, log=None, export: str | Path | None = None, config=None) -> DemoResult:
    """Render crops, quantize the classifier (QDQ, ``config`` or the default :class:`QuantConfig`), score
    fp32 and int8 on the evaluation crops, time both single-threaded. ``log(str)`` gets progress lines.
    ``export``: a directory to receive ``float.onnx`` (the shipped model) and ``samples/*.npy`` (the
    calibration crops), to try the other ``qnnx`` commands on."""
    from qnnx.targets.onnxruntime.latency import median_latency_ms
    from qnnx.autoquant import QuantConfig, quantize

    if samples < 1 or eval_samples < 1:
        raise QnnxError("--samples and --eval must be >= 1", where="qnnx demo")
    log = log or (lambda _: None)
    clf = load_classifier()
    if output is not None and Path(output).resolve() == clf.path.resolve():
        raise QnnxError("refusing to overwrite the input model; choose another -o path", where=str(output))
    log(f"rendering {samples} calibration and {eval_samples} evaluation crops")
    calibration, _ = crops(clf, samples, seed, split=0)
    evaluation, labels = crops(clf, eval_samples, seed, split=1)
    if export is not None:
        _export(clf, calibration, Path(export), output)
        log(f"wrote {Path(export) / 'float.onnx'} and {samples} crops in {Path(export) / 'samples'}")
    log(f"quantizing {clf.path.name} on {samples} crops")
    qm = quantize(str(clf.path), [{clf.input_name: x} for x in calibration], config or QuantConfig(progress=False))
    with tempfile.TemporaryDirectory(prefix="qnnx-demo-") as tmp:
        int8_path = Path(output) if output is not None else Path(tmp) / "cls.int8.onnx"
        qm.save(int8_path)
        log("scoring fp32 and int8, timing both (1 thread)")
        fp32, int8 = predict(clf.path, clf.input_name, evaluation), predict(int8_path, clf.input_name, evaluation)
        ms = median_latency_ms([str(clf.path), str(int8_path)], feed={clf.input_name: evaluation[0]}, threads=1,
                               repeats=repeats)
    return DemoResult(samples, eval_samples, float(np.mean(fp32 == labels)), float(np.mean(int8 == labels)),
                      float(np.mean(fp32 == int8)), ms[str(clf.path)], ms[str(int8_path)],
                      Path(output) if output is not None else None, qm.report)
