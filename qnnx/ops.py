"""Facts about standard ONNX ops: one typed row per op type, read by every stage that asks.

Planning (which values share qparams, which unmatched ops deserve no "kept in float" line),
fake-quantization-to-integer (which ops the quantize type passes through, which have the identity
rule, which are lookup tables), the consumers of the "mse" observer (which ops pass SiLU outputs on),
the normalization rule (which ops only move data), channel padding (which ops never mix channels)
and the lookup tables themselves (each elementwise function's numpy definition) all ask here,
instead of each keeping its own list of op names.

Facts, each a field of :class:`OpFacts` (``False`` / ``None`` / ``()`` when not stated):

    permutes_values  the output is the first input's values rearranged: the same multiset
    moves_data       the output's values are copies of the first input's, picked by position only
                     (index arithmetic, no comparison): the integer op is the same op on the integers
    selects          every output value is one of the data inputs' values (``data_inputs``)
    shares_qparams   the integer form is the same op on the integers under the input's affine type
                     (fake-quantization-to-integer's identity rules), so the output takes the first
                     input's qparams: no requantize around it
    keeps_range      the output holds the data inputs' values or values interpolated between
                     neighbours (resampling): a value passed through keeps its range and the shape of
                     its distribution. Averaging pools stay in range too but reshape the distribution
    data_inputs      the inputs ``selects`` / ``keeps_range`` speak of: "first" or "all" (Concat)
    clamps           ``min(max(x, lo), hi)`` with constant bounds: monotonic, so quantize commutes
                     with it (a quantize after it gives the type of its input too)
    computes         False when the op computes no real values: it reads shapes, makes constants,
                     copies or converts the element type
    shape_only       the output depends on the input's shape only, not its values
    quiet            planning gives no "no quantization pattern" line when nothing matches it: it
                     only moves data, clamps, computes shapes or constants, or follows its input's
                     affine type (Pad, nearest Resize) once integer
    elementwise      one scalar function at each position (binary ones with numpy broadcasting)
    channelwise      each output channel (axis 1) is computed from the same input channel only
    function         the elementwise nonlinearity an op computes (:class:`ElementwiseFunction`):
                     the integer form is a lookup table of it
    normalization    divides by a statistic over many channels (LayerNorm, Group/InstanceNorm...)
    statistic        reduces its first input to a sum, mean or norm over axes (ReduceSum, ReduceMean...):
                     the statistics a normalization written out in elementary ops divides by
    bias_input       the index of a bias added to a contraction's accumulator
    fragile_inputs   inputs near a value where the op's slope is unbounded (a denominator, the
                     argument of sqrt / log / reciprocal near 0, a power's base): a small rounding
                     error there becomes a large output error

A fact that holds only for some values of one attribute is a :class:`When` (Resize selects in
"nearest" mode only). The query functions take an op type or a node (anything with ``op_type``,
``domain`` and ``attributes``, as ``onnx_ir.Node``); a node of another domain than ONNX's has no
facts, and an op type stands for a node with no attributes (their defaults). Ops with no row have
no facts. This module is a lower floor: it imports nothing from qnnx.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

import numpy as np

STANDARD_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class When:
    """A fact that holds when attribute ``attribute`` is one of ``values`` (``default`` when absent)."""

    attribute: str
    values: frozenset[str]
    default: str

    def holds(self, attributes: Mapping) -> bool:
        a = attributes.get(self.attribute) if attributes else None
        value = self.default if a is None else getattr(a, "value", a)
        if isinstance(value, bytes):
            value = value.decode()
        return value in self.values


Fact = bool | When


@dataclass(frozen=True)
class ElementwiseFunction:
    """An elementwise nonlinearity.

    ``numpy(x, attributes)``: its value as a float32 DequantizeLinear -> op -> QuantizeLinear chain
    computes it (ONNX Runtime's float32 arithmetic; ``attributes`` by name, defaults when absent); the
    lookup tables of its integer form are built from it. ``output_range``: the values it can take
    whatever the input and attributes, for a bounded function (its output gets that whole range as
    qparams, not an observed one). ``value_and_slope(x)``: ``(f(x), f'(x))`` in float64 at the
    attributes' defaults, for error models (the "mse" observer judging a range through the function
    reading it); ``None`` where no one asks."""

    name: str
    numpy: Callable[[np.ndarray, Mapping], np.ndarray]
    output_range: tuple[float, float] | None = None
    value_and_slope: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None


@dataclass(frozen=True)
class OpFacts:
    """What qnnx knows about one standard ONNX op type (the module docstring defines each field)."""

    op_type: str
    permutes_values: bool = False
    moves_data: bool = False
    selects: Fact = False
    shares_qparams: Fact = False
    keeps_range: Fact = False
    data_inputs: str = "first"
    clamps: bool = False
    computes: bool = True
    shape_only: bool = False
    quiet: bool = False
    elementwise: bool = False
    channelwise: bool = False
    function: ElementwiseFunction | None = None
    normalization: bool = False
    statistic: bool = False
    bias_input: int | None = None
    fragile_inputs: tuple[int, ...] = ()


# --------------------------------------------------------------------------- elementwise functions


def _sigmoid(x, a):
    with np.errstate(over="ignore"):  # exp(-x) -> inf for very negative x gives the right limit, 0
        return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)


def _hard_sigmoid(x, a):
    alpha, beta = a.get("alpha", 0.2), a.get("beta", 0.5)
    return np.clip(np.float32(alpha) * x + np.float32(beta), 0, 1).astype(np.float32)


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _smooth_sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # float64, no overflow warning for large |x|


def _sigmoid_value_and_slope(x):
    s = _smooth_sigmoid(x)
    return s, s * (1.0 - s)


def _hard_swish_value_and_slope(x):
    inner = np.clip(x + 3.0, 0.0, 6.0)
    return x * inner / 6.0, np.where(x < -3.0, 0.0, np.where(x > 3.0, 1.0, (2.0 * x + 3.0) / 6.0))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """The logistic function in float64 (``0.5 * (1 + tanh(x / 2))``: no overflow for large ``|x|``),
    as the error models use it (SiLU's gate)."""
    return _smooth_sigmoid(x)


SIGMOID = ElementwiseFunction("sigmoid", _sigmoid, (0.0, 1.0), _sigmoid_value_and_slope)
# HardSigmoid: clip(alpha * x + beta, 0, 1) whatever alpha and beta
HARD_SIGMOID = ElementwiseFunction("hardsigmoid", _hard_sigmoid, (0.0, 1.0))
HARD_SWISH = ElementwiseFunction(
    "hardswish", lambda x, a: x * np.clip(x / np.float32(6) + np.float32(0.5), 0, 1), None,
    _hard_swish_value_and_slope)
TANH = ElementwiseFunction("tanh", lambda x, a: np.tanh(x), (-1.0, 1.0))
LEAKY_RELU = ElementwiseFunction("leakyrelu", lambda x, a: np.where(x >= 0, x, np.float32(a.get("alpha", 0.01)) * x))
EXP = ElementwiseFunction("exp", lambda x, a: np.exp(x))
ERF = ElementwiseFunction("erf", lambda x, a: _erf(x))  # bounded by (-1, 1), but no one asks: left unstated
GELU = ElementwiseFunction("gelu", lambda x, a: 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0))))
ELU = ElementwiseFunction("elu", lambda x, a: np.where(x > 0, x, np.float32(a.get("alpha", 1.0)) * (np.exp(x) - 1)))
SOFTPLUS = ElementwiseFunction("softplus", lambda x, a: np.log1p(np.exp(x)))


# --------------------------------------------------------------------------- the table

_NEAREST = When("mode", frozenset({"nearest"}), "nearest")
# Rearrangements: every value kept, none compared. ``moves_data`` and ``shares_qparams`` follow.
_PERMUTE = dict(permutes_values=True, moves_data=True, selects=True, shares_qparams=True, keeps_range=True,
                quiet=True)
# Copies picked by position: some values dropped or repeated.
_MOVE = dict(moves_data=True, selects=True, shares_qparams=True, keeps_range=True, quiet=True)
# Every elementwise op is channel-wise. Channel padding's own list had the arithmetic, the clamps, Identity and
# five of the functions; Exp, Erf, Gelu, Elu, Softplus, Cast, Pow, Sqrt, Reciprocal and Log (and
# BatchNormalization) mix no channels either, so a depthwise region through them is padded now too.
_FUNCTION = dict(elementwise=True, channelwise=True)
_ARITHMETIC = dict(elementwise=True, channelwise=True)

_ROWS = [
    # ---- data movement
    OpFacts("Reshape", **_PERMUTE),
    OpFacts("Flatten", **_PERMUTE),
    OpFacts("Squeeze", **_PERMUTE),
    OpFacts("Unsqueeze", **_PERMUTE),
    OpFacts("Transpose", **_PERMUTE),
    # DepthToSpace/SpaceToDepth permute values exactly as Transpose does. They were in planning's
    # PERMUTES_VALUES and SHARES_QPARAMS but not in fake-quantization-to-integer's pass-through list nor
    # in the normalization rule's data-movement list; both now follow this row (an omission there).
    OpFacts("DepthToSpace", **_PERMUTE),
    OpFacts("SpaceToDepth", **_PERMUTE),
    OpFacts("Identity", **_PERMUTE, computes=False, elementwise=True, channelwise=True),
    OpFacts("Slice", **_MOVE),
    OpFacts("Split", **_MOVE),
    OpFacts("Gather", **_MOVE),
    # Expand/Tile repeat values: they were in SHARES_QPARAMS but not in the consumers' list of ops passing
    # SiLU outputs on (``selects``); they select as Slice does, so they pass them on now.
    OpFacts("Expand", **_MOVE),
    OpFacts("Tile", **_MOVE),
    # ---- selection by comparison or resampling
    OpFacts("MaxPool", selects=True, shares_qparams=True, keeps_range=True, quiet=True, channelwise=True),
    # GlobalMaxPool selects as MaxPool does, but has no integer rule: its output is observed on its own.
    OpFacts("GlobalMaxPool", selects=True, keeps_range=True, channelwise=True),
    # Resize: nearest selects (and shares qparams: fake-quantization-to-integer's rule takes nearest
    # only); linear interpolates between neighbours; cubic overshoots (negative kernel lobes), so it keeps
    # no range: the consumers' list counted every mode. Quiet in every mode, as before (a non-nearest
    # Resize stays float and fake-quantization-to-integer's report lists it).
    OpFacts("Resize", selects=_NEAREST, shares_qparams=_NEAREST,
            keeps_range=When("mode", frozenset({"nearest", "linear"}), "nearest"), quiet=True),
    # Concat: every input's values; its pattern gives all inputs the output's qparams (a pattern, not
    # shares_qparams: the share walk follows the first input only).
    OpFacts("Concat", selects=True, keeps_range=True, data_inputs="all"),
    # Pad follows its input's type once integer (a constant pad value quantized into it), but adds values.
    OpFacts("Pad", quiet=True),
    # ---- clamps
    OpFacts("Relu", clamps=True, quiet=True, **_ARITHMETIC),
    OpFacts("Clip", clamps=True, quiet=True, **_ARITHMETIC),
    # ---- shapes, constants, types. ``computes=False``: fake-quantization-to-integer's report of float ops
    # left in quantized regions skipped Shape, Size, Constant, Identity and Cast; ConstantOfShape and Range
    # make no real values from data either (they read shapes), so they join them.
    OpFacts("Shape", computes=False, shape_only=True, quiet=True),
    OpFacts("Size", computes=False, shape_only=True, quiet=True),
    OpFacts("Constant", computes=False, quiet=True),
    OpFacts("ConstantOfShape", computes=False, quiet=True),
    OpFacts("Range", computes=False, quiet=True),
    OpFacts("Cast", computes=False, quiet=True, elementwise=True, channelwise=True),
    # ---- elementwise functions (a lookup table once integer)
    OpFacts("Sigmoid", function=SIGMOID, **_FUNCTION),
    OpFacts("HardSigmoid", function=HARD_SIGMOID, **_FUNCTION),
    OpFacts("HardSwish", function=HARD_SWISH, **_FUNCTION),
    OpFacts("Tanh", function=TANH, **_FUNCTION),
    OpFacts("LeakyRelu", function=LEAKY_RELU, **_FUNCTION),
    OpFacts("Exp", function=EXP, **_FUNCTION),
    OpFacts("Erf", function=ERF, **_FUNCTION),
    OpFacts("Gelu", function=GELU, **_FUNCTION),
    OpFacts("Elu", function=ELU, **_FUNCTION),
    OpFacts("Softplus", function=SOFTPLUS, **_FUNCTION),
    # ---- arithmetic
    OpFacts("Add", **_ARITHMETIC),
    OpFacts("Sub", **_ARITHMETIC),
    OpFacts("Mul", **_ARITHMETIC),
    OpFacts("Div", fragile_inputs=(1,), **_ARITHMETIC),
    OpFacts("Max", **_ARITHMETIC),
    OpFacts("Min", **_ARITHMETIC),
    OpFacts("Pow", fragile_inputs=(0,), **_ARITHMETIC),
    OpFacts("Sqrt", fragile_inputs=(0,), **_ARITHMETIC),
    OpFacts("Reciprocal", fragile_inputs=(0,), **_ARITHMETIC),
    OpFacts("Log", fragile_inputs=(0,), **_ARITHMETIC),
    # ---- reductions
    OpFacts("ReduceSum", statistic=True),
    OpFacts("ReduceMean", statistic=True),
    OpFacts("ReduceSumSquare", statistic=True),
    OpFacts("ReduceL2", statistic=True),
    # per-channel a * x + b: channel-wise, but its C-sized parameters are no broadcast scalars
    OpFacts("BatchNormalization", channelwise=True),
    # ---- quantization (per-tensor or per-axis affine maps of each value)
    OpFacts("QuantizeLinear", channelwise=True),
    OpFacts("DequantizeLinear", channelwise=True),
    # ---- pools
    OpFacts("AveragePool", channelwise=True),
    OpFacts("GlobalAveragePool", channelwise=True),
    # ---- contractions
    OpFacts("Conv", bias_input=2),
    OpFacts("ConvTranspose", bias_input=2),
    OpFacts("Gemm", bias_input=2),
    OpFacts("MatMul"),
    # ---- normalizations (BatchNormalization is not one: at inference it is a fixed per-channel affine map)
    OpFacts("LayerNormalization", normalization=True),
    OpFacts("GroupNormalization", normalization=True),
    OpFacts("InstanceNormalization", normalization=True),
    OpFacts("RMSNormalization", normalization=True),
]

OPS: Mapping[str, OpFacts] = {row.op_type: row for row in _ROWS}
assert len(OPS) == len(_ROWS), "an op type has two rows"
NO_FACTS = OpFacts("")


# --------------------------------------------------------------------------- queries


def _op_type_and_attributes(op) -> tuple[str | None, Mapping]:
    if isinstance(op, str):
        return op, {}
    if getattr(op, "domain", "") not in STANDARD_DOMAINS:
        return None, {}
    return op.op_type, getattr(op, "attributes", None) or {}


def facts(op) -> OpFacts:
    """The row of ``op`` (an op type or a node); an op with no row, or a node of another domain, has
    no facts (every field at its default)."""
    op_type, _ = _op_type_and_attributes(op)
    return OPS.get(op_type, NO_FACTS) if op_type is not None else NO_FACTS


def _holds(op, name: str) -> bool:
    op_type, attributes = _op_type_and_attributes(op)
    if op_type is None or op_type not in OPS:
        return False
    fact = getattr(OPS[op_type], name)
    return fact.holds(attributes) if isinstance(fact, When) else bool(fact)


def permutes_values(op) -> bool:
    return _holds(op, "permutes_values")


def moves_data(op) -> bool:
    return _holds(op, "moves_data")


def selects(op) -> bool:
    return _holds(op, "selects")


def shares_qparams(op) -> bool:
    return _holds(op, "shares_qparams")


def keeps_range(op) -> bool:
    return _holds(op, "keeps_range")


def clamps(op) -> bool:
    return _holds(op, "clamps")


def computes(op) -> bool:
    """Unknown ops compute (the default); see the module docstring."""
    op_type, _ = _op_type_and_attributes(op)
    return op_type is None or facts(op_type).computes


def shape_only(op) -> bool:
    return _holds(op, "shape_only")


def quiet(op) -> bool:
    return _holds(op, "quiet")


def elementwise(op) -> bool:
    return _holds(op, "elementwise")


def channelwise(op) -> bool:
    return _holds(op, "channelwise")


def normalization(op) -> bool:
    return _holds(op, "normalization")


def statistic(op) -> bool:
    return _holds(op, "statistic")


def elementwise_function(op) -> ElementwiseFunction | None:
    return facts(op).function


def bias_input(op) -> int | None:
    return facts(op).bias_input


def reduction_axis(node, input_index: int, ndim: int) -> int | None:
    """The axis of a contraction's operand ``input_index`` (of rank ``ndim``) that its sums run over (the
    input channels of a weight): Conv 1, ConvTranspose 0 (weights are C_in x C_out/group x k), MatMul
    and Gemm by their operand's role and transposition; None for any other op, input or rank (a rank-1
    MatMul operand has no channel axis to pair)."""
    if node.domain not in STANDARD_DOMAINS:
        return None
    at = node.attributes if node.attributes else {}

    def flag(name: str) -> int:
        a = at.get(name)
        return int(getattr(a, "value", a) or 0)

    op = node.op_type
    if op in ("Conv", "ConvTranspose") and input_index == 1 and ndim >= 3:
        return 1 if op == "Conv" else 0
    if op == "MatMul" and ndim >= 2 and input_index in (0, 1):
        return ndim - 1 if input_index == 0 else ndim - 2
    if op == "Gemm" and ndim == 2 and input_index in (0, 1):
        transposed = flag("transA" if input_index == 0 else "transB")
        return (0 if transposed else 1) if input_index == 0 else (1 if transposed else 0)
    return None


def depthwise_channels(node) -> int | None:
    """The input channels of a depthwise Conv (every group reads one input channel: weights M x 1 x k,
    group > 1), from its weight's shape; None for any other node or when the shape is not known."""
    if node.op_type != "Conv" or node.domain not in STANDARD_DOMAINS or len(node.inputs) < 2 or node.inputs[1] is None:
        return None
    a = (node.attributes or {}).get("group")
    group = int(getattr(a, "value", a) or 1)
    shape = node.inputs[1].shape
    if group < 2 or shape is None or len(shape) < 3 or shape[1] != 1 or not isinstance(shape[0], int) \
            or shape[0] % group:
        return None
    return group


def fragile_inputs(op) -> tuple[int, ...]:
    return facts(op).fragile_inputs


def data_inputs(node) -> list:
    """The inputs of ``node`` that ``selects`` / ``keeps_range`` speak of (None inputs left out)."""
    inputs = list(node.inputs) if facts(node).data_inputs == "all" else list(node.inputs[:1])
    return [v for v in inputs if v is not None]


def passed_on(node) -> list | None:
    """The inputs whose values a data-movement node hands on unchanged (a Concat's every input, a
    qparams-sharing op's first: Reshape, Split, MaxPool, nearest Resize...), or None when ``node``
    computes new values."""
    if node.domain not in ("", "ai.onnx") or not (node.op_type == "Concat" or shares_qparams(node)):
        return None
    return data_inputs(node) or None


def maker(v, past: Callable[[object], bool]):
    """The node computing ``v``'s values, walking up past the nodes ``past`` accepts (through their first
    input); None for a graph input or an initializer."""
    p = v.producer()
    while p is not None and past(p) and p.inputs and p.inputs[0] is not None:
        p = p.inputs[0].producer()
    return p


def readers_through(v, op_types: tuple[str, ...]) -> bool:
    """Whether a node of one of ``op_types`` reads ``v``'s values, directly or through data movement
    (:func:`passed_on`)."""
    seen, todo = set(), [v]
    while todo:
        for use in todo.pop().uses():
            node = use.node
            if node.op_type in op_types:
                return True
            moved = passed_on(node)
            if moved is not None and id(node) not in seen and any(x is node.inputs[use.idx] for x in moved):
                seen.add(id(node))
                todo.extend(o for o in node.outputs if o is not None)
    return False


def made_through(v, op_types: tuple[str, ...]) -> bool:
    """Whether a node of one of ``op_types`` makes ``v``'s values, directly or through data movement
    (:func:`passed_on`, walking up its first input)."""
    p = maker(v, lambda n: n.op_type not in op_types and passed_on(n) is not None)
    return p is not None and p.op_type in op_types


def op_types(fact: Callable[[OpFacts], object]) -> tuple[str, ...]:
    """The op types whose row has ``fact`` (a predicate of the row, e.g. ``lambda f: f.moves_data``), in
    table order: for registering one rule or pattern for all of them."""
    return tuple(row.op_type for row in _ROWS if fact(row))


FACTS = tuple(f.name for f in fields(OpFacts) if f.name != "op_type")

__all__ = ["ElementwiseFunction", "FACTS", "OPS", "OpFacts", "When", "bias_input", "channelwise", "clamps",
           "computes", "data_inputs", "elementwise", "elementwise_function", "facts", "fragile_inputs",
           "keeps_range", "made_through", "maker", "moves_data", "normalization", "op_types", "passed_on",
           "permutes_values", "quiet", "readers_through", "selects", "shape_only", "shares_qparams", "sigmoid"]
