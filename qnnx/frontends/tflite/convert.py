"""The TFLite importer's driver: a .tflite model -> canonical qnnx model (+ a report of what stayed float).

Operators are taken in the file's order (TFLite stores them topologically). Each runs its integer
rule (:mod:`.rules`); a rule that does not apply raises ``Unsupported`` and the op stays float
between ``qnnx.dequantize`` and ``qnnx.quantize`` when a float form exists (:mod:`.float_rules`),
listed in the report (``strict=True`` refuses instead). Inputs and outputs are the TFLite model's
tensors, same names, dtypes and NHWC shapes; the Transpose pairs the NCHW rules leave between two
of them are removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import onnx
import onnx_ir as ir

from qnnx import numerics
from qnnx.dialect import DOMAIN, VERSION
from qnnx.dialect.qparams import check_graph
from qnnx.errors import QnnxError
from qnnx.frontends.tflite import float_rules, rules  # noqa: F401  (registers the rules)
from qnnx.frontends.tflite.reader import TfliteModel, read
from qnnx.frontends.tflite.registry import FLOAT_RULES, INTEGER_TYPES, RULES, Context, Unsupported
from qnnx.ir import Builder

OPSET = 21
_ONNX_TYPES = {"FLOAT32": ir.DataType.FLOAT, "INT8": ir.DataType.INT8, "UINT8": ir.DataType.UINT8,
               "INT16": ir.DataType.INT16, "INT32": ir.DataType.INT32, "INT64": ir.DataType.INT64}


@dataclass
class Report:
    """What the import did not make integer: ``(operator, opcode, reason)`` per op kept in float."""

    left_in_float: list[tuple[str, str, str]] = field(default_factory=list)
    float_in_source: list[tuple[str, str]] = field(default_factory=list)  # float ops of the TFLite model itself

    def lines(self) -> list[str]:
        out = [f"left in float ({len(self.left_in_float)}):" if self.left_in_float else "every quantized op is integer"]
        out += [f"  {n} ({op}): {why}" for n, op, why in self.left_in_float]
        if self.float_in_source:
            out.append(f"float in the source model ({len(self.float_in_source)}): "
                       + ", ".join(f"{n} ({op})" for n, op in self.float_in_source))
        return out


def _graph_value(t) -> ir.Value:
    if t.dtype not in _ONNX_TYPES:
        raise QnnxError(f"model input {t.where} is {t.dtype}; supported: {', '.join(_ONNX_TYPES)}")
    return ir.Value(name=t.name, type=ir.TensorType(_ONNX_TYPES[t.dtype]), shape=ir.Shape(list(t.shape)))


def _is_integer(model: TfliteModel, i: int) -> bool:
    return model.tensors[i].dtype in INTEGER_TYPES and model.tensors[i].qparams is not None


def convert(source, *, strict: bool = False) -> tuple[ir.Model, Report]:
    """``source`` (path or bytes of a .tflite) as an ``ir.Model`` in canonical qnnx form, and the report."""
    model = read(source)
    graph = ir.Graph([], [], nodes=[], opset_imports={"": OPSET, DOMAIN: VERSION}, name="tflite")
    b = Builder(graph, prefix="tflite")
    ctx = Context(model, b)
    for i in model.inputs:
        v = _graph_value(model.tensors[i])
        graph.inputs.append(v)
        ctx.values[i] = v
    report = Report()
    renamed: set[str] = set()
    for op in model.operators:
        outputs = _import_op(op, ctx, report, strict)
        if len(outputs) != len(op.outputs):
            raise QnnxError(f"{op.where}: the rule made {len(outputs)} outputs for {len(op.outputs)}")
        for i, v in zip(op.outputs, outputs):
            ctx.values[i] = v
            t = model.tensors[i]
            if v.shape is None and v.const_value is None:  # later rules read their inputs' shapes
                v.shape = ir.Shape(list(t.shape))
            if v.dtype is None and t.dtype in _ONNX_TYPES:
                v.type = ir.TensorType(_ONNX_TYPES[t.dtype])
            _name_after(v, model.tensors[i].name, graph.meta["qnnx.names"], renamed)
    graph.extend(b.nodes)
    _propagate_types(graph, model, ctx)
    for i in model.outputs:
        t = model.tensors[i]
        v = ctx.values.get(i)
        if v is None:
            raise QnnxError(f"model output {t.where} is never computed")
        if v.is_graph_output() or v.is_graph_input() or v.const_value is not None:  # one value, two outputs
            v = b.op("Identity", [v], hint="output")
            graph.append(v.producer())
        v.name = t.name
        v.type = ir.TensorType(_ONNX_TYPES[t.dtype])
        v.shape = ir.Shape(list(t.shape))
        graph.outputs.append(v)
    _cancel_transposes(graph)
    check_graph(graph)  # the canonical model keeps the qparams rules of the dialect
    m = ir.Model(graph, ir_version=10, producer_name="qnnx.from_tflite")
    return m, report


def _name_after(v: ir.Value, name: str, taken: set[str], renamed: set[str]) -> None:
    """The value computing a TFLite tensor takes its name (once: a value standing for two tensors,
    a constant or an input keeps its own)."""
    if v.const_value is not None or v.is_graph_input() or v.name in renamed or name in taken:
        return
    v.name = name
    taken.add(name)
    renamed.add(name)


def _import_op(op, ctx: Context, report: Report, strict: bool) -> list[ir.Value]:
    model = ctx.model
    data = [i for i in op.inputs if i >= 0 and model.tensors[i].data is None] + list(op.outputs)
    if not any(_is_integer(model, i) for i in data):  # a float op of the source model
        rule = FLOAT_RULES.get(op.opcode) or RULES.get(op.opcode)
        if rule is None:
            raise QnnxError(f"{op.where}: float op with no rule")
        try:
            out = rule(op, ctx)
        except Unsupported as e:
            raise QnnxError(f"{op.where}: {e}") from None
        if op.opcode not in ("DEQUANTIZE", "QUANTIZE"):
            report.float_in_source.append((str(op.index), op.opcode))
        return out
    rule = RULES.get(op.opcode)
    why = f"no integer rule for {op.opcode}"
    if rule is not None:
        emitted = len(ctx.b.nodes)
        try:
            return rule(op, ctx)
        except Unsupported as e:
            why = str(e)
            del ctx.b.nodes[emitted:]  # what the rule built before it gave up
        except QnnxError as e:
            raise e.at(op.where) from None
    if strict:
        raise QnnxError(f"{op.where} stays float: {why} (strict)")
    if op.opcode not in FLOAT_RULES:
        raise QnnxError(f"{op.where}: {why}, and it has no float form either")
    report.left_in_float.append((str(op.index), op.opcode, why))
    return _in_float(op, ctx, why)


def _in_float(op, ctx: Context, why: str) -> list[ir.Value]:
    """Dequantize the op's integer inputs, run its float form, quantize its outputs (rounding tflite)."""
    float_ctx = replace(ctx, values=dict(ctx.values))
    for i in op.inputs:
        if i < 0 or not _is_integer(ctx.model, i):
            continue
        t = ctx.model.tensors[i]
        q = t.qparams
        if t.data is not None:
            float_ctx.values[i] = ctx.b.const(numerics.dequantize(t.data, q.scale if q.scale.size > 1 else q.scale[0],
                                                                  q.zero_point if q.scale.size > 1 else q.zero_point[0],
                                                                  axis=q.axis), "dequantized")
        else:
            float_ctx.values[i] = ctx.qnnx("dequantize", [ctx.value(i), *ctx.qparam_values(i, "")], hint="dequantize")
    try:
        ys = FLOAT_RULES[op.opcode](op, float_ctx)
    except Unsupported as e:
        raise QnnxError(f"{op.where}: {why}; its float form does not apply either: {e}") from None
    out = []
    for i, y in zip(op.outputs, ys):
        if _is_integer(ctx.model, i):
            y = ctx.qnnx("quantize", [y, *ctx.qparam_values(i, "")], out_dtype=INTEGER_TYPES[ctx.model.tensors[i].dtype],
                         rounding="tflite", hint="quantize")
        out.append(y)
    return out


_SAME_TYPE = {"Transpose", "Reshape", "Concat", "Pad", "Slice", "Gather", "MaxPool", "Split", "Clip", "Identity"}


def _propagate_types(graph: ir.Graph, model: TfliteModel, ctx: Context) -> None:
    """Element types (and TFLite's static shapes) on every value: data movement keeps its input's
    type; the values standing for TFLite tensors take the tensor's shape."""
    for node in graph:
        if node.domain == "" and node.op_type in _SAME_TYPE and node.inputs[0] is not None:
            for o in node.outputs:
                if o.dtype is None and node.inputs[0].dtype is not None:
                    o.type = ir.TensorType(node.inputs[0].dtype)
        elif node.domain == DOMAIN and node.op_type == "dequantize":
            node.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    for i, v in ctx.values.items():
        t = model.tensors[i]
        if v.shape is None and v.const_value is None:
            v.shape = ir.Shape(list(t.shape))
        if v.dtype is None and t.dtype in _ONNX_TYPES:
            v.type = ir.TensorType(_ONNX_TYPES[t.dtype])


def _cancel_transposes(graph: ir.Graph) -> None:
    """``Transpose(p) -> Transpose(q)`` with ``q`` undoing ``p``: readers of the second read the first's input."""
    for node in list(graph):
        if node.op_type != "Transpose" or node.domain:
            continue
        src = node.inputs[0].producer() if node.inputs[0] is not None else None
        if src is None or src.op_type != "Transpose" or src.domain:
            continue
        p, q = list(src.attributes["perm"].value), list(node.attributes["perm"].value)
        if [p[k] for k in q] != list(range(len(p))):
            continue
        out = node.outputs[0]
        if out.is_graph_output():
            continue
        ir.convenience.replace_all_uses_with(out, src.inputs[0])
    for node in reversed(list(graph)):  # the Transposes nobody reads any more
        if node.op_type == "Transpose" and not node.domain and not any(o.uses() or o.is_graph_output()
                                                                       for o in node.outputs):
            graph.remove(node, safe=True)


def from_tflite(source, *, strict: bool = False) -> onnx.ModelProto:
    """A full-integer .tflite model (path or bytes) as a canonical qnnx ONNX model, bit-exact with
    LiteRT's reference kernels for the ops with integer rules. Ops left in float are listed in the
    ``qnnx.left_in_float`` metadata (``strict=True`` refuses them)."""
    m, report = convert(source, strict=strict)
    m.metadata_props["qnnx.left_in_float"] = "; ".join(f"{n} ({op}): {why}" for n, op, why in report.left_in_float)
    return ir.to_proto(m)
