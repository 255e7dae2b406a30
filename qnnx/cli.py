"""The ``qnnx`` command.

Exit codes: 0 ok, 1 bad input (one line on stderr naming the file/node and the
problem), 2 internal error (message plus the path of a debug log with the
traceback).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from pathlib import Path

from qnnx import __version__
from qnnx.errors import QnnxError


def _output_path(inp: str, out: str) -> Path:
    if Path(out).resolve() == Path(inp).resolve():
        raise QnnxError("refusing to overwrite the input model; choose another -o path", where=out)
    return Path(out)


def _cmd_import(args) -> str:
    from qnnx.frontends import import_onnx
    from qnnx.ir import save_model

    out = _output_path(args.model, args.output)
    model = import_onnx(args.model)
    n = sum(1 for node in model.graph if node.domain == "qnnx")
    save_model(model, out)
    return f"wrote {out} ({n} qnnx ops)"


def _cmd_from_qdq(args) -> str:
    from qnnx.frontends import convert_qdq
    from qnnx.ir import save_model

    out = _output_path(args.model, args.output)
    model, report = convert_qdq(args.model, strict=args.strict)
    save_model(model, out)
    return f"{report.summary()}\nwrote {out}"


def _cmd_lower(args) -> str:
    from qnnx.frontends import import_onnx
    from qnnx.ir import save_model
    from qnnx.passes.lower import lower

    out = _output_path(args.model, args.output)
    model = lower(import_onnx(args.model), copy=False)
    save_model(model, out)
    return f"wrote {out} ({model.graph.num_nodes()} standard ONNX ops, no qnnx ops)"


def _cmd_quantize(args) -> str:
    from qnnx.autoquant import QuantConfig, quantize

    out = _output_path(args.model, args.output)
    config = QuantConfig(method=args.method, percentile=args.percentile, activation_dtype=args.activation_dtype,
                         per_channel=args.per_channel, exclude_nodes=tuple(args.exclude_node),
                         exclude_op_types=tuple(args.exclude_op), num_samples=args.num_samples, seed=args.seed,
                         sqnr_threshold_db=args.sqnr_threshold, propagate_error=args.propagate_error,
                         progress=not args.quiet)
    if args.random_calibration:
        print("qnnx: warning: calibrating on random data; the quantized model's accuracy is not meaningful",
              file=sys.stderr)
        calibration = _random_samples(args.model, args.num_samples or 16, args.seed or 0)
    else:
        calibration = args.calib
    qm = quantize(args.model, calibration, config)
    qm.save(out, format=args.format)
    return f"{qm.report.summary()}\nwrote {out} ({args.format})"


def _cmd_inspect(args) -> str:
    from qnnx.analysis import summarize

    return summarize(args.model).format()


def _cmd_compare(args) -> str:
    from qnnx.analysis import compare_models
    from qnnx.analysis.compare import format_table

    errors = compare_models(args.float_model, args.quant_model, args.data, num_samples=args.num_samples)
    return format_table(errors, args.top)


def _cmd_bench(args) -> str:
    from qnnx.analysis.latency import median_latency_ms

    for m in args.models:
        if not Path(m).is_file():
            raise QnnxError("file not found", where=m)
    ms = median_latency_ms(args.models, args.data, threads=args.threads, repeats=args.repeats)
    base = ms[args.models[0]]
    return "\n".join(f"{v:9.2f} ms  {base / v:5.2f}x vs first  {p}" for p, v in ms.items())


def _random_samples(model_path: str, n: int, seed: int):
    """Standard-normal samples for a model with static input shapes (only behind --random-calibration)."""
    import numpy as np

    from qnnx.autoquant.data import input_specs
    from qnnx.ir import load_model

    specs = input_specs(load_model(model_path))
    for s in specs:
        if s.shape is None or any(d is None for d in s.shape):
            raise QnnxError(f"input {s.name!r} has dynamic dims; random calibration needs static shapes",
                            where=model_path)
    rng = np.random.default_rng(seed)
    return [{s.name: rng.standard_normal(s.shape).astype(np.float32) for s in specs} for _ in range(n)]


def _cmd_ops(args) -> str:
    from qnnx.dialect import REGISTRY

    width = max(map(len, REGISTRY))
    return "\n".join(f"{name:<{width}}  {s.doc.split('. ')[0].rstrip('.')}" for name, s in sorted(REGISTRY.items()))


class _Parser(argparse.ArgumentParser):
    """Usage errors are user errors: one line, exit 1 (exit 2 is reserved for internal errors)."""

    def error(self, message):
        self.exit(1, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    from qnnx.autoquant.config import ACTIVATION_DTYPES, METHODS, QuantConfig

    p = _Parser(prog="qnnx", description="Exact integer quantization of ONNX graphs.")
    p.add_argument("--version", action="version", version=f"qnnx {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    s = sub.add_parser("import", help="rewrite ONNX quantization ops (QuantizeLinear, DequantizeLinear, QLinearConv, "
                       "QLinearMatMul, ConvInteger, MatMulInteger, DynamicQuantizeLinear, com.microsoft QLinear*/QGemm) "
                       "into the qnnx dialect, op for op")
    s.add_argument("model", help="input .onnx file (never modified)")
    s.add_argument("-o", "--output", required=True, help="output .onnx file (written atomically)")
    s.set_defaults(func=_cmd_import)

    s = sub.add_parser("from-qdq", help="convert a pre-quantized QDQ or QOperator model into the canonical qnnx "
                       "integer form (fake-quantization-to-integer), listing any op left in float")
    s.add_argument("model", help="QDQ / QOperator .onnx file (never modified)")
    s.add_argument("-o", "--output", required=True, help="output .onnx file (written atomically)")
    s.add_argument("--strict", action="store_true", help="fail, naming them, if any op stays in float")
    s.set_defaults(func=_cmd_from_qdq)

    s = sub.add_parser("lower", help="import, then lower every qnnx op to standard ONNX ops that give "
                       "bit-identical results on any ONNX runtime")
    s.add_argument("model", help="input .onnx file with qnnx and/or ONNX quantization ops (never modified)")
    s.add_argument("-o", "--output", required=True, help="output .onnx file (written atomically)")
    s.set_defaults(func=_cmd_lower)

    s = sub.add_parser("quantize", help="quantize a float model with calibration samples (static, int8)")
    s.add_argument("model", help="float .onnx model (never modified)")
    s.add_argument("-o", "--output", required=True, help="output .onnx file (written atomically)")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--calib", metavar="DIR",
                     help="directory of calibration samples: .npy (single-input models) or .npz keyed by input name")
    src.add_argument("--random-calibration", action="store_true",
                     help="calibrate on random normal data (static input shapes only); the result is NOT "
                          "meaningful for accuracy — for trying the tool or timing only")
    s.add_argument("--format", choices=("qdq", "qnnx", "lowered"), default="qdq",
                   help="qdq: QuantizeLinear/DequantizeLinear that ONNX Runtime runs natively (default); qnnx: the "
                        "canonical integer model; lowered: the canonical model in standard ONNX ops")
    s.add_argument("--method", choices=METHODS, default=QuantConfig.method, help="activation calibration method")
    s.add_argument("--percentile", type=float, default=QuantConfig.percentile, help="for --method percentile")
    s.add_argument("--activation-dtype", choices=ACTIVATION_DTYPES, default=QuantConfig.activation_dtype)
    s.add_argument("--per-channel", action=argparse.BooleanOptionalAction, default=True,
                   help="per-channel weight scales (default on)")
    s.add_argument("--exclude-node", action="append", default=[], metavar="NAME", help="keep this node in float")
    s.add_argument("--exclude-op", action="append", default=[], metavar="OP_TYPE", help="keep this op type in float")
    s.add_argument("--num-samples", type=int, default=None, help="use at most this many calibration samples")
    s.add_argument("--seed", type=int, default=0,
                   help="which calibration files --num-samples picks (a seeded random subset of the directory)")
    s.add_argument("--sqnr-threshold", type=float, default=None, metavar="DB",
                   help="keep patterns whose output SQNR is below DB in float")
    s.add_argument("--propagate-error", action="store_true",
                   help="second calibration pass on the quantized model, so ranges see upstream error")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    s.set_defaults(func=_cmd_quantize)

    s = sub.add_parser("inspect", help="summarize a model: ops by domain, what is quantized, qparams")
    s.add_argument("model", help=".onnx file")
    s.set_defaults(func=_cmd_inspect)

    s = sub.add_parser("compare", help="per-output and per-layer error of a quantized model against its float "
                       "original (SQNR, cosine, max error), worst layers first")
    s.add_argument("float_model", help="float .onnx model")
    s.add_argument("quant_model", help="quantized .onnx model (QDQ or lowered; tensors are matched by name)")
    s.add_argument("--data", required=True, metavar="DIR", help="samples: .npy (single input) or .npz by input name")
    s.add_argument("--num-samples", type=int, default=None, help="use at most this many samples")
    s.add_argument("--top", type=int, default=20, help="how many layers to list")
    s.set_defaults(func=_cmd_compare)

    s = sub.add_parser("bench", help="median latency of one or more models on ONNX Runtime (timed interleaved), "
                       "with speedups relative to the first")
    s.add_argument("models", nargs="+", help=".onnx files (the first is the baseline)")
    s.add_argument("--data", metavar="DIR", default=None,
                   help="take the input from the first sample here (needed for dynamic dims)")
    s.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    s.add_argument("--repeats", type=int, default=20, help="timed runs per model")
    s.set_defaults(func=_cmd_bench)

    s = sub.add_parser("ops", help="list the qnnx dialect's ops")
    s.set_defaults(func=_cmd_ops)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    try:
        print(args.func(args))
        return 0
    except QnnxError as e:
        print(f"qnnx: error: {e}", file=sys.stderr)
        return 1
    except Exception:  # a bug: keep the traceback for the report, show one line
        log = Path(tempfile.gettempdir()) / "qnnx-debug.log"
        log.write_text(traceback.format_exc())
        print(f"qnnx: internal error ({sys.exc_info()[1]!r}); traceback in {log}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
