"""What the ``qnnx`` command prints.

On a terminal: rich tables. Anywhere else (a pipe, a file, a test's capture): the same facts as
plain lines whose wording is stable, so ``grep`` and scripts can rely on it. Rich decides what a
terminal is (``isatty``, or the ``TTY_COMPATIBLE`` / ``FORCE_COLOR`` environment variables).

Errors never go through here: the CLI writes them to stderr as one unwrapped line.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping, Sequence

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text


def stdout_console() -> Console:
    # highlight off: numbers and paths keep one colour; soft_wrap: a long path is never split
    return Console(highlight=False, soft_wrap=True)


def _table(title: str | None = None) -> Table:
    return Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", title_style="bold")


def _print(console: Console, text: str) -> None:
    if console.is_terminal:
        console.print(Text(text))
    else:
        console.file.write(text + "\n")


def _db(v: float | None) -> str:
    if v is None:
        return ""
    if math.isinf(v):
        return "exact" if v > 0 else "inf/NaN"
    return f"{v:.1f}"


def show_lines(text: str, console: Console | None = None) -> None:
    _print(console or stdout_console(), text)


def show_quant_report(report, wrote: str, console: Console | None = None, errors: Sequence | None = None,
                      samples: int = 0) -> None:
    """``qnnx quantize``: what is integer, what stayed float and why, the worst layers by SQNR (from
    ``errors`` of :func:`qnnx.analysis.compare_models`, when given), then the written file."""
    from qnnx.analysis.report import format_errors

    console = console or stdout_console()
    if not console.is_terminal:
        _print(console, "\n".join([report.summary(), *format_errors(list(errors or []), samples=samples)] + [wrote]))
        return
    headline = report.summary().splitlines()[0]
    console.print(Text(headline, style="bold"))
    by_op: dict[str, list] = collections.defaultdict(lambda: [0, 0, collections.Counter()])
    for d in report.decisions:
        row = by_op[d.op_type]
        row[0 if d.quantized else 1] += 1
        if not d.quantized:
            row[2][d.reason] += 1
    t = _table("nodes by op type")
    t.add_column("op type")
    t.add_column("integer", justify="right", style="green")
    t.add_column("float", justify="right", style="yellow")
    t.add_column("why float")
    for op, (q, f, reasons) in sorted(by_op.items(), key=lambda i: (-i[1][1], -i[1][0], i[0])):
        why = "; ".join(f"{r} ({c})" if c > 1 else r for r, c in reasons.most_common())
        t.add_row(op, str(q), str(f) if f else "", why)
    console.print(t)
    floats = [d for d in report.decisions if not d.quantized]
    if floats:
        t = _table(f"kept in float ({len(floats)})")
        t.add_column("node")
        t.add_column("op type")
        t.add_column("reason")
        t.add_column("SQNR dB", justify="right")
        for d in floats[:20]:
            t.add_row(d.node, d.op_type, d.reason, _db(d.sqnr_db))
        if len(floats) > 20:
            t.add_row(f"... and {len(floats) - 20} more", "", "", "")
        console.print(t)
    worst = sorted((d for d in report.decisions if d.sqnr_db is not None), key=lambda d: d.sqnr_db)[:5]
    if worst:
        t = _table("worst layers by output SQNR")
        t.add_column("node")
        t.add_column("op type")
        t.add_column("SQNR dB", justify="right")
        for d in worst:
            t.add_row(d.node, d.op_type, _db(d.sqnr_db))
        console.print(t)
    if errors:
        _show_worst_tensors(errors, console, samples)
    if report.left_in_float:
        t = _table("left in float in the integer model")
        t.add_column("node")
        t.add_column("op type")
        t.add_column("why")
        for name, op, why in report.left_in_float:
            t.add_row(name, op, why)
        console.print(t)
    console.print(Text(wrote, style="bold green"))


def _show_worst_tensors(errors: Sequence, console: Console, samples: int, top: int = 5) -> None:
    t = _table(f"worst layers by SQNR vs the float model (on {samples} calibration sample(s))")
    for col in ("node", "op type", "SQNR dB", "cosine"):
        t.add_column(col, justify="right" if col in ("SQNR dB", "cosine") else "left")
    for e in [e for e in errors if not e.is_output and not (math.isinf(e.sqnr_db) and e.sqnr_db > 0)][:top]:
        t.add_row(e.node or e.name, e.op_type, _db(e.sqnr_db), f"{e.cosine:.5f}")
    for e in errors:
        if e.is_output:
            t.add_row(f"output {e.name}", "", _db(e.sqnr_db), f"{e.cosine:.5f}", style="bold")
    console.print(t)


def show_compare(errors: Sequence, top: int, console: Console | None = None, samples: int = 0) -> None:
    """``qnnx compare``: per-output error, then the worst layers (by node, as ``--exclude-node`` takes them)."""
    from qnnx.analysis.compare import format_table

    console = console or stdout_console()
    if not console.is_terminal:
        _print(console, f"on {samples} sample(s)\n" + format_table(list(errors), top))
        return
    t = _table(f"outputs (on {samples} sample(s))")
    for col in ("output", "SQNR dB", "cosine", "max |err|"):
        t.add_column(col, justify="left" if col == "output" else "right")
    for e in errors:
        if e.is_output:
            t.add_row(e.name, _db(e.sqnr_db), f"{e.cosine:.5f}", f"{e.max_abs:.4g}")
    console.print(t)
    layers = [e for e in errors if not e.is_output]
    t = _table(f"worst {min(top, len(layers))} layers (of {len(layers)} changed by quantization)")
    for col in ("SQNR dB", "cosine", "max |err|", "op type", "node", "tensor"):
        t.add_column(col, justify="right" if col in ("SQNR dB", "cosine", "max |err|") else "left")
    for e in layers[:top]:
        t.add_row(_db(e.sqnr_db), f"{e.cosine:.5f}", f"{e.max_abs:.4g}", e.op_type, e.node, e.name)
    console.print(t)


def show_summary(summary, console: Console | None = None) -> None:
    """``qnnx inspect``."""
    from qnnx.analysis.inspect import QUANT_OPS

    console = console or stdout_console()
    if not console.is_terminal:
        _print(console, summary.format())
        return
    t = Table(box=None, show_header=False, title=f"model {summary.path}", title_justify="left", title_style="bold")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("opsets", ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in summary.opsets.items()))
    t.add_row("inputs", ", ".join(summary.inputs))
    t.add_row("outputs", ", ".join(summary.outputs))
    integer = sum(c for (d, _), c in summary.ops.items() if d == "qnnx")
    qdq = sum(c for k, c in summary.ops.items() if k in QUANT_OPS)
    t.add_row("nodes", f"{sum(summary.ops.values())}: {integer} qnnx integer ops, {qdq} quantize/dequantize/"
                       "requantize nodes")
    if summary.scale_range:
        t.add_row("qparams", f"{summary.per_tensor} per-tensor, {summary.per_channel} per-axis; scales "
                             f"{summary.scale_range[0]:.3g} .. {summary.scale_range[1]:.3g}")
    console.print(t)
    ops = _table("ops")
    ops.add_column("count", justify="right")
    ops.add_column("op")
    for (d, op), c in sorted(summary.ops.items(), key=lambda i: (-i[1], i[0])):
        ops.add_row(str(c), f"{d + '.' if d else ''}{op}", style="cyan" if (d, op) in QUANT_OPS or d == "qnnx" else "")
    console.print(ops)


def show_latency(ms: Mapping[str, float], threads: int, console: Console | None = None,
                 runtime: str = "ONNX Runtime") -> None:
    """``qnnx bench``: median latency per model and the speedup over the first."""
    console = console or stdout_console()
    base = next(iter(ms.values()))
    if not console.is_terminal:
        _print(console, "\n".join(f"{v:9.2f} ms  {base / v:5.2f}x vs first  {p}" for p, v in ms.items()))
        return
    t = _table(f"median latency on {runtime}, {threads} thread(s)")
    t.add_column("model")
    t.add_column("ms", justify="right")
    t.add_column("speedup vs first", justify="right")
    for p, v in ms.items():
        t.add_row(p, f"{v:.2f}", f"{base / v:.2f}x", style="bold" if v < base else "")
    console.print(t)


def show_profile(model: str, profile, console: Console | None = None, top: int = 8) -> None:
    """``qnnx bench --profile``: one model's time per op type (an ``analysis.profile.Profile``)."""
    _print(console or stdout_console(), f"{model}: {profile.table(top)}")


def show_ops(docs: Mapping[str, str], console: Console | None = None) -> None:
    """``qnnx ops``: the dialect's ops with the first sentence of their docs."""
    console = console or stdout_console()
    if not console.is_terminal:
        width = max(map(len, docs))
        _print(console, "\n".join(f"{name:<{width}}  {doc}" for name, doc in sorted(docs.items())))
        return
    t = _table(f"qnnx dialect ops ({len(docs)})")
    t.add_column("op", style="cyan")
    t.add_column("what it computes")
    for name, doc in sorted(docs.items()):
        t.add_row(name, doc)
    console.print(t)


def show_demo(result, console: Console | None = None) -> None:
    """``qnnx demo``: fp32 vs int8 accuracy and latency of the PP-OCR direction classifier."""
    console = console or stdout_console()
    r = result
    title = (f"PP-OCR text-direction classifier (rapidocr-onnxruntime): {r.eval_samples} rendered crops, "
             f"int8 calibrated on {r.calibration_samples}")
    rows = [("fp32", r.fp32_accuracy, r.fp32_ms, 1.0), ("int8 (qnnx)", r.int8_accuracy, r.int8_ms, r.speedup)]
    tail = [f"int8 gives the fp32 label on {100 * r.label_agreement:.1f}% of the crops"]
    if r.speedup < 1:
        tail.append("int8 is slower than fp32 here: ONNX Runtime's CPU kernels for this small QDQ model do not "
                    "beat its fp32 kernels (see docs/benchmarks.md)")
    speed = getattr(r.report, "speed", None)
    if speed is not None:  # what the speed fallback measured and left float
        floats = sum(1 for d in r.report.decisions if not d.quantized and d.reason.startswith("speed: "))
        tail += speed.lines() + ([f"{floats} node(s) left float for speed (the report says which)"] if floats else [])
    if r.int8_path is not None:
        tail.append(f"wrote {r.int8_path} (qdq)")
    if not console.is_terminal:
        lines = [title] + [f"  {name}: accuracy {100 * acc:.1f}%, {ms:.3f} ms, {x:.2f}x" for name, acc, ms, x in rows]
        _print(console, "\n".join(lines + tail))
        return
    t = _table(title)
    t.add_column("model")
    t.add_column("accuracy", justify="right")
    t.add_column("latency (1 thread)", justify="right")
    t.add_column("speedup", justify="right")
    for name, acc, ms, x in rows:
        t.add_row(name, f"{100 * acc:.1f}%", f"{ms:.3f} ms", f"{x:.2f}x", style="bold" if name != "fp32" else "")
    console.print(t)
    for line in tail:
        console.print(Text(line))
