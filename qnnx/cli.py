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


def _cmd_lower(args) -> str:
    from qnnx.frontends import import_onnx
    from qnnx.ir import save_model
    from qnnx.passes.lower import lower

    out = _output_path(args.model, args.output)
    model = lower(import_onnx(args.model), copy=False)
    save_model(model, out)
    return f"wrote {out} ({model.graph.num_nodes()} standard ONNX ops, no qnnx ops)"


def _cmd_ops(args) -> str:
    from qnnx.dialect import REGISTRY

    width = max(map(len, REGISTRY))
    return "\n".join(f"{name:<{width}}  {s.doc.split('. ')[0].rstrip('.')}" for name, s in sorted(REGISTRY.items()))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qnnx", description="Exact integer quantization of ONNX graphs.")
    p.add_argument("--version", action="version", version=f"qnnx {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    s = sub.add_parser("import", help="rewrite ONNX quantization ops (QuantizeLinear, DequantizeLinear, QLinearConv, "
                       "QLinearMatMul, ConvInteger, MatMulInteger, DynamicQuantizeLinear) into the qnnx dialect")
    s.add_argument("model", help="input .onnx file (never modified)")
    s.add_argument("-o", "--output", required=True, help="output .onnx file (written atomically)")
    s.set_defaults(func=_cmd_import)

    s = sub.add_parser("lower", help="import, then lower every qnnx op to standard ONNX ops that give "
                       "bit-identical results on any ONNX runtime")
    s.add_argument("model", help="input .onnx file with qnnx and/or ONNX quantization ops (never modified)")
    s.add_argument("-o", "--output", required=True, help="output .onnx file (written atomically)")
    s.set_defaults(func=_cmd_lower)

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
