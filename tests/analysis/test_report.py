"""HTML quantization report and terminal summary (qnnx.analysis.report) on a tiny synthetic model:
the files exist and reference each other, every number on the page is compare_models' number in
the page's format, the directory is replaced atomically, and the page renders in headless Chromium."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

import qnnx
from qnnx import QnnxError, QuantConfig
from qnnx.analysis import compare_models
from qnnx.analysis.report import fmt_cosine, fmt_max, fmt_sqnr, format_summary, quantized_tensors, write_report

CHROMIUM = Path("/usr/bin/chromium")
# The bar chart's colours (< 20 dB, < 30 dB, more): nothing else on the page has them (the grey of
# an exact layer's bar is left out: antialiased text has it too).
BAR_COLOURS = [(0xC0, 0x39, 0x2B), (0xE6, 0x7E, 0x22), (0x2E, 0x86, 0xC1)]


def _model() -> onnx.ModelProto:
    """x[1,3,8,8] -> conv1 -> relu1 -> conv2 -> abs1 (no pattern: float) -> sig1 -> y[1,4,8,8];
    relu1 -> gap1 -> z[1,4,1,1]."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal(4) * 0.1).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Abs", ["c2"], ["a1"], name="abs1"),
             helper.make_node("Sigmoid", ["a1"], ["y"], name="sig1"),
             helper.make_node("GlobalAveragePool", ["r1"], ["z"], name="gap1")]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8]),
                           helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, 1, 1])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(m)
    return m


def _samples(n=6, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(n)]


@pytest.fixture(scope="module")
def quantized():
    return qnnx.quantize(_model(), _samples(), QuantConfig(progress=False, exclude_nodes=("sig1",)))


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory, quantized):
    d = tmp_path_factory.mktemp("r") / "report"
    assert write_report(d, _model(), quantized, _samples(), num_samples=4, histograms=3) == d / "index.html"
    return d


class _Page(HTMLParser):
    """Image sources and the rows of each table (by id) of a page."""

    def __init__(self, text: str):
        super().__init__()
        self.images, self.tables, self._table, self._row, self._cell = [], {}, None, None, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs["src"])
        elif tag == "table":
            self._table = self.tables.setdefault(attrs.get("id"), [])
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self._row.append(self._cell)
            self._cell = None
        elif tag == "tr":
            self._table.append(self._row)

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def _page(d: Path) -> _Page:
    return _Page((d / "index.html").read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- files


def test_html_references_existing_pngs_and_nothing_else(report_dir):
    page = _page(report_dir)
    pngs = sorted(p.name for p in report_dir.iterdir() if p.suffix == ".png")
    assert sorted(page.images) == pngs == ["hist_00.png", "hist_01.png", "hist_02.png", "layers.png"]
    for name in pngs:
        with Image.open(report_dir / name) as im:
            assert im.format == "PNG" and im.size[0] >= 600 and len(im.getcolors(1 << 20)) > 10
    text = (report_dir / "index.html").read_text()
    assert "<script" not in text and "http://" not in text and "https://" not in text and "src=\"/" not in text
    assert sorted(p.name for p in report_dir.iterdir()) == sorted(pngs + ["index.html"])
    assert not [p for p in report_dir.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_numbers_match_compare_models(report_dir, quantized):
    errors = compare_models(_model(), quantized.qdq, _samples()[:4])
    by_name = {e.name: e for e in errors}
    page = _page(report_dir)
    outputs = page.tables["outputs"]
    assert outputs[0] == ["output", "SQNR (dB)", "cosine", "max |error|"]
    assert sorted(r[0] for r in outputs[1:]) == ["y", "z"]
    for name, sqnr, cos, mx in outputs[1:]:
        e = by_name[name]
        assert (sqnr, cos, mx) == (fmt_sqnr(e.sqnr_db), fmt_cosine(e.cosine), fmt_max(e.max_abs))
    layers = page.tables["layers"][1:]
    # the quantized activations of the float model's tensors: conv1+relu1 -> r1, conv2 -> c2, gap1 -> z
    assert sorted(r[1] for r in layers) == ["c2", "r1", "z"]
    assert [r[1] for r in layers] == [e.name for e in errors if e.name in {"c2", "r1", "z"}]  # worst first
    for label, tensor, op, sqnr, cos, mx in layers:
        e = by_name[tensor]
        assert (op, sqnr, cos, mx) == (e.op_type, fmt_sqnr(e.sqnr_db), fmt_cosine(e.cosine), fmt_max(e.max_abs))
    assert {r[0] for r in layers} == {"relu1 (Relu)", "conv2 (Conv)", "gap1 (GlobalAveragePool)"}
    assert all(math.isfinite(float(r[3])) and float(r[3]) > 10 for r in layers)


def test_summary_says_what_stayed_float_and_why(report_dir, quantized):
    text = (report_dir / "index.html").read_text()
    r = quantized.report
    assert [d.node for d in r.decisions if not d.quantized] == ["abs1", "sig1"]
    assert 'id="quantized-count">quantized: <b>3</b> pattern(s) (Conv 2, GlobalAveragePool 1)' in text
    assert 'id="float-count">kept in float: <b>2</b> node(s)' in text
    assert f"calibration: {r.calibration_seconds:.2f} s on 6 sample(s)" in text
    rows = _page(report_dir).tables["float-nodes"][1:]
    assert rows == [["abs1", "Abs", "no quantization pattern for this op"], ["sig1", "Sigmoid", "excluded by the user"]]


def test_histogram_captions_give_the_clip_range_of_the_qparams(report_dir, quantized):
    tensors = {t.name: t for t in quantized_tensors(quantized.qdq, {"c1", "r1", "c2", "a1", "y", "z"})}
    assert sorted(tensors) == ["c2", "r1", "z"]
    t = tensors["c2"]
    assert t.dtype == "uint8" and t.clip_range == (-t.zero_point * t.scale, (255 - t.zero_point) * t.scale)
    text = (report_dir / "index.html").read_text()
    captions = re.findall(r"tensor (\w+): clip range \[([^,]+), ([^\]]+)\], ([0-9.]+)% of float values", text)
    assert len(captions) == 3
    for name, lo, hi, pct in captions:
        lo_want, hi_want = tensors[name].clip_range
        assert (lo, hi) == (f"{lo_want:.4g}", f"{hi_want:.4g}") and 0 <= float(pct) <= 100


def test_exact_clip_share(tmp_path, quantized):
    """The clipped share is counted over every value, not the plotted subsample."""
    x = _samples(1)
    t = {t.name: t for t in quantized_tensors(quantized.qdq, {"c2"})}["c2"]
    write_report(tmp_path / "r", _model(), quantized, x, histograms=3)
    import onnxruntime as ort

    m = _model()
    m.graph.output.append(helper.make_empty_tensor_value_info("c2"))
    c2 = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(["c2"], {"x": x[0]})[0]
    lo, hi = t.clip_range
    share = np.count_nonzero((c2 < lo) | (c2 > hi)) / c2.size
    assert f"tensor c2: clip range [{lo:.4g}, {hi:.4g}], {100 * share:.3f}% of float values" in \
        (tmp_path / "r" / "index.html").read_text()


def test_quantized_model_from_a_file_has_no_decisions(tmp_path, quantized):
    quantized.save(tmp_path / "q.onnx")
    onnx.save(_model(), tmp_path / "f.onnx")
    write_report(tmp_path / "r", tmp_path / "f.onnx", tmp_path / "q.onnx", _samples(2), histograms=0)
    text = (tmp_path / "r" / "index.html").read_text()
    assert "no record of the quantizer's decisions; it has 3 quantized activation(s)" in text
    assert str(tmp_path / "q.onnx") in text and str(tmp_path / "f.onnx") in text
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["index.html", "layers.png"]


def test_an_old_report_is_replaced_but_other_directories_are_not(tmp_path, quantized):
    d = tmp_path / "r"
    write_report(d, _model(), quantized, _samples(2), histograms=3)
    write_report(d, _model(), quantized, _samples(2), histograms=1)  # a previous report: replaced whole
    assert sorted(p.name for p in d.iterdir()) == ["hist_00.png", "index.html", "layers.png"]
    (d / "notes.txt").write_text("mine")
    with pytest.raises(QnnxError, match="refusing to replace: not a directory holding only a previous report"):
        write_report(d, _model(), quantized, _samples(2))
    assert (d / "notes.txt").read_text() == "mine"
    (tmp_path / "file").write_text("x")
    with pytest.raises(QnnxError, match="refusing to replace"):
        write_report(tmp_path / "file", _model(), quantized, _samples(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "r"]  # no temp dirs left


def test_failure_midway_leaves_no_directory(tmp_path, quantized):
    bad = [np.zeros((1, 3, 8, 8), np.float32), np.full((1, 3, 8, 8), np.nan, np.float32)]
    with pytest.raises(QnnxError, match="NaN/Inf"):
        write_report(tmp_path / "r", _model(), quantized, bad)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- terminal summary


def test_terminal_summary(quantized):
    errors = compare_models(_model(), quantized.qdq, _samples()[:4])
    r = quantized.report
    layers = [e for e in errors if not e.is_output]
    assert len(layers) == 4  # c1, r1, c2, a1: fewer than 5
    assert format_summary(r, errors).splitlines() == [
        f"quantized 3 pattern(s), 2 node(s) kept in float; calibration {r.calibration_seconds:.1f}s on 6 sample(s)",
        "  integer: Conv 2, GlobalAveragePool 1",
        "  float: Sigmoid 1: excluded by the user [sig1]",
        "  float: Abs 1: no quantization pattern for this op [abs1]",
        "worst 4 layer(s) by SQNR: " + ", ".join(f"{e.name} ({e.op_type}) {fmt_sqnr(e.sqnr_db)} dB" for e in layers),
        "output SQNR: " + ", ".join(f"{e.name} {fmt_sqnr(e.sqnr_db)} dB" for e in errors if e.is_output)]
    assert format_summary(r).splitlines()[0] == r.summary().splitlines()[0]
    # without compare errors: the SQNR fallback's per-pattern scores, when there are any
    assert "worst" not in format_summary(r)
    scored = qnnx.quantize(_model(), _samples(), QuantConfig(progress=False, sqnr_threshold_db=0.0))
    assert "worst 4 layer(s) by SQNR: " in format_summary(scored.report)


def test_summary_groups_many_nodes_with_one_reason():
    from qnnx.autoquant.report import CalibrationRecord, Decision, QuantReport

    r = QuantReport([Decision(f"n{i}", "Abs", False, "no quantization pattern for this op") for i in range(5)],
                    CalibrationRecord("float", 3, 1.25))
    assert format_summary(r).splitlines() == [
        "quantized 0 pattern(s), 5 node(s) kept in float; calibration 1.2s on 3 sample(s)",
        "  float: Abs 5: no quantization pattern for this op [n0, n1, n2, ... (5)]"]


# --------------------------------------------------------------------------- rendering


def _screenshot(page: Path, tmp_path: Path) -> np.ndarray:
    shot = tmp_path / "shot.png"
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1200,2000",
           page.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    with Image.open(shot) as im:
        assert im.size == (1200, 2000)
        return np.asarray(im.convert("RGB")).reshape(-1, 3).astype(int)


def _bar_pixels(px: np.ndarray) -> int:
    return int(sum(np.count_nonzero(np.all(np.abs(px - c) <= 3, axis=1)) for c in BAR_COLOURS))


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (apt-get install chromium)")
def test_page_renders_with_its_images_in_headless_chromium(report_dir, tmp_path):
    px = _screenshot(report_dir / "index.html", tmp_path)
    assert np.count_nonzero(px.sum(axis=1) < 200) > 2000, "page looks blank"  # text, table and chart lines
    # The bar colours exist only inside layers.png: they are on screen only if the image loaded.
    assert _bar_pixels(px) > 1000, "layers.png did not render"


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (apt-get install chromium)")
def test_the_rendering_check_fails_on_a_missing_image(report_dir, tmp_path):
    text = (report_dir / "index.html").read_text().lower()
    assert not any("%02x%02x%02x" % c in text for c in BAR_COLOURS)
    broken = tmp_path / "broken"
    shutil.copytree(report_dir, broken)
    (broken / "layers.png").unlink()
    assert _bar_pixels(_screenshot(broken / "index.html", tmp_path)) < 50
