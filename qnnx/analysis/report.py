"""What quantization did, for a person: an HTML report (a directory with ``index.html`` and PNG
charts) and a short terminal summary.

The report shows, from :class:`~qnnx.autoquant.config.QuantReport` and a few samples:

    summary      patterns quantized (by op type), nodes kept in float and why, calibration time
    outputs      SQNR, cosine and max |error| of every model output (:func:`compare_models`)
    layers       SQNR of every quantized activation, worst first (bar chart and table); the value is
                 the tensor as computed in the QDQ model from dequantized inputs, so it carries all
                 upstream quantization error (exactly what ``qnnx compare`` prints)
    histograms   for the worst layers, the float model's values and the QDQ model's dequantized
                 values on one grid aligned to the quantization step, with the clip points
                 ``(qmin - zero_point) * scale`` and ``(qmax - zero_point) * scale`` marked

The page is static: relative image paths, no scripts, no fonts or styles from the network. The
directory is written atomically (built beside it, then renamed into place); an existing directory
is replaced only if it holds nothing but a previous report's files.
"""

from __future__ import annotations

import collections
import html
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx_ir as ir

from qnnx import runtime
from qnnx.analysis.compare import LayerError, compare_models
from qnnx.autoquant.pipeline import QuantizedModel
from qnnx.autoquant.report import QuantReport
from qnnx.data import CalibrationData, input_specs
from qnnx.calibrate.observers import quant_range
from qnnx.errors import QnnxError
from qnnx.ir import load_model
from qnnx.ir.io import umask

_HIST_VALUES = 400_000  # values kept per tensor for a histogram (a strided subsample of every sample)
_HIST_BINS = 400  # at most this many bins; each bin holds a power-of-two number of quantization steps
_BAR_LAYERS = 60  # layers in the bar chart (the table lists all)
_QDQ_DTYPES = {ir.DataType.UINT8: "uint8", ir.DataType.INT8: "int8", ir.DataType.UINT16: "uint16",
               ir.DataType.INT16: "int16"}


@dataclass(frozen=True)
class QuantizedTensor:
    """An activation quantized in a QDQ model: its float name in the float model, the name of its
    dequantized value in the QDQ model, and its (per-tensor) qparams."""

    name: str
    dequantized: str
    scale: float
    zero_point: int
    dtype: str

    @property
    def clip_range(self) -> tuple[float, float]:
        qmin, qmax = quant_range(self.dtype)
        return (qmin - self.zero_point) * self.scale, (qmax - self.zero_point) * self.scale


def quantized_tensors(qdq: ir.Model, float_names: set[str]) -> list[QuantizedTensor]:
    """Per-tensor QuantizeLinear -> DequantizeLinear pairs on activations (not weights) of ``qdq``."""
    graph_outputs = {v.name for v in qdq.graph.outputs}
    found = []
    for q in qdq.graph:
        if q.op_type != "QuantizeLinear" or q.domain not in ("", "ai.onnx") or len(q.inputs) < 3:
            continue
        x, s, z = q.inputs[:3]
        if x is None or x.const_value is not None or s is None or z is None or s.const_value is None \
                or z.const_value is None:
            continue
        scale, zp = s.const_value.numpy(), z.const_value.numpy()
        if scale.size != 1 or z.const_value.dtype not in _QDQ_DTYPES:
            continue
        dqs = [u.node for u in q.outputs[0].uses() if u.node.op_type == "DequantizeLinear"]
        if not dqs:
            continue
        dq = dqs[0].outputs[0].name
        # A graph output keeps its name on the DequantizeLinear; the float value before it is renamed.
        name = x.name if x.name in float_names and dq not in graph_outputs else dq
        if name in float_names:
            found.append(QuantizedTensor(name, dq, float(scale.reshape(())), int(zp.reshape(())),
                                         _QDQ_DTYPES[z.const_value.dtype]))
    return found


# --------------------------------------------------------------------------- formatting


def fmt_sqnr(v: float) -> str:
    if math.isinf(v):
        return "exact" if v > 0 else "inf/NaN"
    return f"{v:.2f}"


def fmt_cosine(v: float) -> str:
    return f"{v:.6f}"


def fmt_max(v: float) -> str:
    return f"{v:.4g}"


def _reason_groups(report: QuantReport) -> list[tuple[str, list]]:
    groups = collections.defaultdict(list)
    for d in report.decisions:
        if not d.quantized:
            groups[d.reason].append(d)
    return sorted(groups.items(), key=lambda g: (-len(g[1]), g[0]))


def _by_op(decisions) -> str:
    counts = collections.Counter(d.op_type for d in decisions)
    return ", ".join(f"{op} {n}" for op, n in sorted(counts.items(), key=lambda i: (-i[1], i[0])))


def format_summary(report: QuantReport, errors: list[LayerError] | None = None, top: int = 5) -> str:
    """A few lines for the terminal: what was quantized (by op type), what stayed float and why,
    calibration time (the first line is :meth:`QuantReport.summary`'s), then the ``top`` worst layers
    by SQNR and the outputs' SQNR from ``errors`` of :func:`compare_models` (without them, the SQNR
    fallback's per-pattern scores, if it ran)."""
    q = [d for d in report.decisions if d.quantized]
    lines = [report.summary().splitlines()[0]]
    if q:
        lines.append(f"  integer: {_by_op(q)}")
    for reason, ds in _reason_groups(report):
        names = ", ".join(d.node for d in ds[:3]) + (f", ... ({len(ds)})" if len(ds) > 3 else "")
        lines.append(f"  float: {_by_op(ds)}: {reason} [{names}]")
    for name, op, why in report.left_in_float:
        lines.append(f"  left in float in the integer model: {name} ({op}): {why}")
    if errors is not None:
        return "\n".join(lines + format_errors(errors, top))
    scored = sorted((d for d in report.decisions if d.sqnr_db is not None), key=lambda d: d.sqnr_db)[:top]
    if scored:
        lines.append(f"worst {len(scored)} layer(s) by SQNR: " +
                     ", ".join(f"{d.node} ({d.op_type}) {fmt_sqnr(d.sqnr_db)} dB" for d in scored))
    return "\n".join(lines)


def format_errors(errors: list[LayerError], top: int = 5, samples: int = 0) -> list[str]:
    """Two lines from :func:`compare_models`: the ``top`` worst layers by SQNR (by node name, as
    ``exclude_nodes`` takes them; layers quantization left exact are not listed), the outputs' SQNR."""
    on = f" on {samples} calibration sample(s)" if samples else ""
    worst = [f"{e.node or e.name} ({e.op_type}) {fmt_sqnr(e.sqnr_db)} dB" for e in errors
             if not e.is_output and not (math.isinf(e.sqnr_db) and e.sqnr_db > 0)][:top]
    lines = [f"worst {len(worst)} layer(s) by SQNR{on}: " + ", ".join(worst)] if worst else []
    outputs = [f"{e.name} {fmt_sqnr(e.sqnr_db)} dB" for e in errors if e.is_output]
    return lines + ([f"output SQNR{on}: " + ", ".join(outputs)] if outputs else [])


# --------------------------------------------------------------------------- charts


def _figure(width: float, height: float):
    # The Figure API with the Agg canvas: no pyplot, no global backend switch, no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _bar_chart(layers: list[LayerError], labels: dict[str, str], path: Path) -> None:
    shown = layers[:_BAR_LAYERS]
    finite = [e.sqnr_db for e in shown if not math.isinf(e.sqnr_db)]
    cap = (max(finite) if finite else 0.0) + 10.0  # where an exact (infinite SQNR) layer's bar ends
    # an exact layer's bar ends at the cap; a layer with inf/NaN the float model has not gets no bar
    values = [(cap if e.sqnr_db > 0 else 0.0) if math.isinf(e.sqnr_db) else e.sqnr_db for e in shown]
    fig = _figure(9, 1.2 + 0.28 * len(shown))
    ax = fig.add_subplot()
    y = np.arange(len(shown))
    colors = ["#c0392b" if v < 20 else "#e67e22" if v < 30 else "#2e86c1" for v in values]
    bars = ax.barh(y, values, color=colors)
    for bar, e in zip(bars, shown):
        if math.isinf(e.sqnr_db) and e.sqnr_db > 0:
            bar.set_hatch("//")
            bar.set_facecolor("#d5dbdb")
    ax.set_yticks(y, [labels.get(e.name, e.name) for e in shown], fontsize=8)
    ax.invert_yaxis()  # worst on top
    exact = any(math.isinf(e.sqnr_db) and e.sqnr_db > 0 for e in shown)
    ax.set_xlabel("SQNR (dB), higher is better" + ("; hatched: exact (no error)" if exact else ""))
    ax.set_xlim(min(0.0, min(values, default=0.0)), cap * 1.02 if cap > 0 else 1.0)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


def _hist_chart(t: QuantizedTensor, label: str, ref: np.ndarray, got: np.ndarray, sqnr: float,
                path: Path) -> None:
    lo, hi = t.clip_range
    span_lo = min(lo, float(ref.min()), float(got.min()))
    span_hi = max(hi, float(ref.max()), float(got.max()))
    # Bins aligned to the quantization grid (n * scale): each dequantized value sits mid-bin, so the
    # histogram of the quantized values has no aliasing combs.
    steps = (span_hi - span_lo) / t.scale
    k = 1 << max(0, math.ceil(math.log2(max(steps / _HIST_BINS, 1.0))))
    first, last = math.floor(span_lo / t.scale / k), math.ceil(span_hi / t.scale / k)
    edges = (np.arange(first, last + 2) * k - 0.5) * t.scale
    fig = _figure(9, 3.2)
    ax = fig.add_subplot()
    ax.hist(ref, bins=edges, histtype="stepfilled", color="#85c1e9", alpha=0.7, label="float model")
    ax.hist(got, bins=edges, histtype="step", color="#1a5276", linewidth=1.2, label="quantized (dequantized)")
    for x in (lo, hi):
        ax.axvline(x, color="#e74c3c", linestyle="--", linewidth=1)
    ax.set_yscale("log")
    ax.set_xlabel(f"value (clip range [{lo:.4g}, {hi:.4g}], scale {t.scale:.4g}, zero point {t.zero_point}, "
                  f"{t.dtype})")
    ax.set_ylabel("count")
    ax.set_title(f"{label}: SQNR {fmt_sqnr(sqnr)} dB", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path)


def _collect(fm: ir.Model, qm: ir.Model, tensors: list[QuantizedTensor], feeds: list[dict]):
    """Strided subsamples of each tensor (float model, dequantized in the QDQ model) and the exact
    share of float values outside the clip range."""
    fs = runtime.session(fm, outputs=[t.name for t in tensors])
    qs = runtime.session(qm, outputs=[t.dequantized for t in tensors])
    per = max(1, _HIST_VALUES // max(len(feeds), 1))
    ref = {t.name: [] for t in tensors}
    got = {t.name: [] for t in tensors}
    clipped = collections.Counter()
    total = collections.Counter()
    for feed in feeds:
        fr = runtime.run(fs, [t.name for t in tensors], feed)
        qr = runtime.run(qs, [t.dequantized for t in tensors], feed)
        for t, a, b in zip(tensors, fr, qr):
            a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
            lo, hi = t.clip_range
            clipped[t.name] += int(np.count_nonzero((a < lo) | (a > hi)))
            total[t.name] += a.size
            stride = max(1, math.ceil(a.size / per))
            ref[t.name].append(a[::stride])
            got[t.name].append(b[::stride])
    return ({n: np.concatenate(v) for n, v in ref.items()}, {n: np.concatenate(v) for n, v in got.items()},
            {n: clipped[n] / max(total[n], 1) for n in ref})


# --------------------------------------------------------------------------- HTML

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1000px; color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f3f3f3; }
img { max-width: 100%; border: 1px solid #eee; }
.meta { color: #555; } figure { margin: 1.5em 0; } figcaption { color: #444; font-size: 0.9em; }
"""


def _e(x) -> str:
    return html.escape(str(x))


def _table(table_id: str, header: list[str], rows: list[list], numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "\n".join("<tr>" + "".join(f'<td class="num">{_e(c)}</td>' if i in numeric else f"<td>{_e(c)}</td>"
                                      for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f'<table id="{table_id}">\n<tr>{head}</tr>\n{body}\n</table>'


def _model_name(model) -> str:
    return str(model) if isinstance(model, (str, os.PathLike)) else f"(in memory: {type(model).__name__})"


def _settings_html(settings: dict) -> str:
    """The QuantConfig the model was quantized with, section by section."""
    rows = [[k, repr(v)] for k, v in settings.items() if not isinstance(v, dict)]
    rows += [[f"{section}.{k}", repr(v)] for section, values in settings.items() if isinstance(values, dict)
             for k, v in values.items()]
    return "<details id=\"settings\"><summary>settings</summary>" + _table("settings-table", ["option", "value"], rows) \
        + "</details>"


def _summary_html(report: QuantReport | None, n_qdq: int) -> str:
    if report is None:
        return (f"<p>The quantized model was given as a file, so there is no record of the quantizer's decisions; "
                f"it has {n_qdq} quantized activation(s).</p>")
    q = [d for d in report.decisions if d.quantized]
    f = [d for d in report.decisions if not d.quantized]
    parts = ["<ul>",
             f'<li id="quantized-count">quantized: <b>{len(q)}</b> pattern(s)' + (f" ({_e(_by_op(q))})" if q else "")
             + "</li>",
             f'<li id="float-count">kept in float: <b>{len(f)}</b> node(s)</li>',
             f'<li id="calibration">calibration: {report.calibration_seconds:.2f} s on {report.num_samples} '
             f"sample(s)</li>"]
    for reason, ds in _reason_groups(report):
        parts.append(f"<li>{len(ds)} node(s) ({_e(_by_op(ds))}): {_e(reason)}</li>")
    parts.append("</ul>")
    if f:
        parts.append(_table("float-nodes", ["node", "op", "why it stayed float"],
                            [[d.node, d.op_type, d.reason] for d in f]))
    steps = [line for record in report.records.values() for line in record.lines()]
    if steps:
        parts.append("<p>Stages and refinements (kept, dropped and why):</p><ul id=\"steps\">"
                     + "".join(f"<li>{_e(line)}</li>" for line in steps) + "</ul>")
    if report.left_in_float:
        parts.append("<p>Left in float by the integer conversion:</p>")
        parts.append(_table("left-in-float", ["node", "op", "why"], [list(x) for x in report.left_in_float]))
    return "\n".join(parts)


def write_report(directory, float_model, quantized_model, samples, *, num_samples: int = 8,
                 histograms: int = 6, title: str = "qnnx quantization report", top: int = 20,
                 quantized_name: str | None = None) -> Path:
    """Write ``directory/index.html`` and its PNG charts; returns the path of ``index.html``.

    ``quantized_model`` is a :class:`~qnnx.autoquant.pipeline.QuantizedModel` (its QDQ model and its
    report) or a QDQ model (path, ModelProto, ir.Model; then there are no decisions to show).
    ``samples`` is a :class:`~qnnx.data.CalibrationData` or anything it is built from; its first
    ``num_samples`` are used. ``histograms`` is how many of the worst layers get an activation histogram;
    the layer table shows the ``top`` worst, the rest folded. ``quantized_name``: the file the quantized
    model was written to, for the header.
    """
    if num_samples < 1 or histograms < 0:
        raise QnnxError("num_samples must be >= 1 and histograms >= 0")
    target = Path(directory)
    check_report_directory(target)
    fm = load_model(float_model)
    settings = None
    if isinstance(quantized_model, QuantizedModel):
        qm, report, settings = quantized_model.qdq, quantized_model.report, quantized_model.config.as_dict()
        q_name = quantized_name or "(quantized in memory, not written)"
        # a model qnnx made is compared with the prepared float model it was built from (analysis.compare)
        fm = quantized_model.float_model
    else:
        qm, report, q_name = load_model(quantized_model), None, quantized_name or _model_name(quantized_model)
    used = CalibrationData.from_source(samples).head(num_samples).bind(input_specs(fm))
    feeds = list(used)
    errors = compare_models(fm, qm, feeds)
    by_name = {e.name: e for e in errors}
    producers = {o.name: n for n in fm.graph for o in n.outputs}
    tensors = [t for t in quantized_tensors(qm, set(producers) | {v.name for v in fm.graph.outputs})
               if t.name in by_name]
    labels = {t.name: _label(producers.get(t.name), t.name) for t in tensors}
    layers = sorted((by_name[t.name] for t in tensors), key=lambda e: (e.sqnr_db, e.name))
    worst = [t for t in sorted(tensors, key=lambda t: (by_name[t.name].sqnr_db, t.name))][:histograms]

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    os.chmod(tmp, 0o777 & ~umask())  # mkdtemp makes it private; give it the user's usual permissions
    try:
        body = [f"<h1>{_e(title)}</h1>",
                f'<p class="meta">float model: {_e(_model_name(float_model))}<br>quantized model: {_e(q_name)}<br>'
                f"errors measured on {len(feeds)} sample(s): {_e(used.describe())}</p>",
                *([_settings_html(settings)] if settings else []),
                "<h2>Summary</h2>", _summary_html(report, len(tensors)),
                "<h2>Outputs</h2>",
                _table("outputs", ["output", "SQNR (dB)", "cosine", "max |error|"],
                       [[e.name, fmt_sqnr(e.sqnr_db), fmt_cosine(e.cosine), fmt_max(e.max_abs)]
                        for e in errors if e.is_output], {1, 2, 3})]
        body.append("<h2>Per-layer error</h2>")
        if layers:
            _bar_chart(layers, labels, tmp / "layers.png")
            more = f" (the {_BAR_LAYERS} worst of {len(layers)})" if len(layers) > _BAR_LAYERS else ""
            rows = [[labels[e.name], e.name, e.op_type, fmt_sqnr(e.sqnr_db), fmt_cosine(e.cosine), fmt_max(e.max_abs)]
                    for e in layers]
            header = ["layer", "tensor", "op", "SQNR (dB)", "cosine", "max |error|"]
            body += [f"<p>SQNR of each quantized activation, worst first{more}: the tensor as the quantized "
                     "model computes it from dequantized inputs, so it includes all upstream error. Bars: red "
                     "below 20 dB, orange below 30 dB, blue from 30 dB; grey hatched: exact (no error).</p>",
                     '<img src="layers.png" alt="per-layer SQNR bar chart">',
                     f"<p>The {min(top, len(rows))} worst layers (the layer name is what --exclude-node "
                     "takes):</p>", _table("layers", header, rows[:top], {3, 4, 5})]
            if len(rows) > top:
                body.append(f"<details><summary>the other {len(rows) - top} layers</summary>"
                            + _table("layers-rest", header, rows[top:], {3, 4, 5}) + "</details>")
        else:
            body.append("<p>No quantized activation (QuantizeLinear -> DequantizeLinear pair) in the quantized "
                        "model matches a tensor of the float model.</p>")
        if worst:
            body.append(f"<h2>Activation histograms of the {len(worst)} worst layers</h2>")
            body.append("<p>Float values and dequantized values on one grid (each bin a whole number of "
                        "quantization steps); dashed red lines: the clip points of the quantization range. "
                        "Log scale.</p>")
            ref, got, clipped = _collect(fm, qm, worst, feeds)
            for i, t in enumerate(worst):
                png = f"hist_{i:02d}.png"
                _hist_chart(t, labels[t.name], ref[t.name], got[t.name], by_name[t.name].sqnr_db, tmp / png)
                lo, hi = t.clip_range
                body.append(f'<figure><img src="{png}" alt="histogram of {_e(t.name)}"><figcaption>'
                            f"{_e(labels[t.name])}, tensor {_e(t.name)}: clip range [{lo:.4g}, {hi:.4g}], "
                            f"{100 * clipped[t.name]:.3f}% of float values outside it</figcaption></figure>")
        page = ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                f"<title>{_e(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n" + "\n".join(body) +
                "\n</body>\n</html>\n")
        (tmp / "index.html").write_text(page, encoding="utf-8")
        _swap_into_place(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target / "index.html"


def _label(node: ir.Node | None, tensor: str) -> str:
    if node is None:
        return tensor
    return f"{node.name or tensor} ({node.op_type})"


def _is_report_file(p: Path) -> bool:
    return p.is_file() and (p.name == "index.html" or p.suffix == ".png")


def check_report_directory(target) -> None:
    """:class:`QnnxError` unless ``target`` is absent or a previous report that may be replaced."""
    target = Path(target)
    if target.exists() and (not target.is_dir() or not all(_is_report_file(p) for p in target.iterdir())):
        raise QnnxError("refusing to replace: not a directory holding only a previous report (index.html, .png)",
                        where=str(target))


def _swap_into_place(tmp: Path, target: Path) -> None:
    """Rename the finished ``tmp`` to ``target``; an old report there is moved aside first and
    removed after, so ``target`` is never a half-written report (at worst briefly absent)."""
    old = None
    if target.exists():
        check_report_directory(target)
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
        os.rmdir(old)
        os.rename(target, old)
    try:
        os.rename(tmp, target)
    except BaseException:
        if old is not None:
            os.rename(old, target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
