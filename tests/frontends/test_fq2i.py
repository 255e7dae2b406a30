"""Fake quantization to integer (``qnnx.frontends.convert_qdq``), rule by rule.

In the style of TVM's ``compare_fq_to_int``: every test builds a small float-QDQ graph by hand
(opset 21, ir_version 10; QuantizeLinear/DequantizeLinear with constant qparams; int8 weights and
int32 biases behind DequantizeLinear), converts it and checks

1. the expected ``qnnx`` ops are there, the converted float op is gone, no quantize/dequantize is
   left (integer inputs, integer outputs) and ``report.left_in_float == []``;
2. the converted model, run by ``qnnx.ReferenceEvaluator``, against ONNX Runtime's execution of the
   QDQ model (default CPU session: ORT fuses the QDQ groups it knows into its QLinear kernels) and
   against ``qnnx.ReferenceEvaluator`` on the QDQ model itself (float ops between Q/DQ).
   Outputs are integers (graphs end with QuantizeLinear), so a tolerance is counted in output
   quanta (LSB) exactly; each test states its tolerance and why;
3. one negative case per rule: the op stays float, with the recorded reason.

Graph outputs go through an Identity after the final QuantizeLinear (see ``QDQ.model``): a
QuantizeLinear output that is itself a graph output makes ``convert_qdq`` crash, which
``test_quantize_output_as_graph_output`` pins down (package bug, xfail).
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import qnnx
from qnnx.frontends import convert_qdq

Q_OPS = {"QuantizeLinear", "DequantizeLinear", "qnnx.quantize", "qnnx.dequantize"}


# --------------------------------------------------------------------------- graph building


class QDQ:
    """A small float-QDQ graph under construction (names are generated; values are names)."""

    def __init__(self, opset: int = 21):
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.dtypes: dict[str, int] = {}
        self._n = 0

    def _name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def input(self, name: str, dtype, shape) -> str:
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        self.dtypes[name] = elem
        return name

    def const(self, array, hint: str = "c") -> str:
        name = self._name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op_type: str, inputs, *, outputs: int = 1, name: str | None = None, domain: str = "",
             **attrs):
        outs = [self._name(f"{op_type.lower()}_out") for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name or self._name(op_type),
                                           domain=domain, **attrs))
        return outs[0] if outputs == 1 else outs

    def _qparams(self, scale, zero_point):
        s = self.const(np.asarray(scale, np.float32), "scale")
        z = self.const(np.asarray(zero_point), "zero_point")
        return s, z

    def quantize(self, x: str, scale, zero_point, *, axis: int | None = None, name: str | None = None) -> str:
        """QuantizeLinear; the output dtype is the zero point's (give it as a numpy scalar/array)."""
        attrs = {} if axis is None else {"axis": axis}
        y = self.node("QuantizeLinear", [x, *self._qparams(scale, zero_point)], name=name, **attrs)
        self.dtypes[y] = helper.np_dtype_to_tensor_dtype(np.asarray(zero_point).dtype)
        return y

    def dequantize(self, q: str, scale, zero_point, *, axis: int | None = None) -> str:
        attrs = {} if axis is None else {"axis": axis}
        return self.node("DequantizeLinear", [q, *self._qparams(scale, zero_point)], **attrs)

    def weight(self, q: np.ndarray, scale, zero_point=None, *, axis: int | None = None) -> str:
        """A constant integer tensor behind a DequantizeLinear (weights, biases)."""
        if zero_point is None:
            zero_point = np.zeros(np.shape(scale), q.dtype)
        return self.dequantize(self.const(q, "w"), scale, np.asarray(zero_point, q.dtype), axis=axis)

    def model(self, *outputs, float_outputs=()) -> onnx.ModelProto:
        """Integer ``outputs`` become graph outputs ``y0, y1...`` through an Identity each (a
        QuantizeLinear output may not be a graph output itself: package bug, see module doc);
        ``float_outputs`` are graph outputs as they are."""
        nodes, outs = list(self.nodes), []
        for i, v in enumerate(outputs):
            nodes.append(helper.make_node("Identity", [v], [f"y{i}"], name=f"out{i}"))
            outs.append(helper.make_tensor_value_info(f"y{i}", self.dtypes[v], None))
        outs += [helper.make_tensor_value_info(v, TensorProto.FLOAT, None) for v in float_outputs]
        g = helper.make_graph(nodes, "fq2i_test", self.inputs, outs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)], ir_version=10)
        onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True)  # a valid graph
        return m


def ints(rng, dtype, shape) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, size=shape).astype(dtype)


# --------------------------------------------------------------------------- running and comparing


def run_ort(model, feeds, *, optimize: bool = True, int8_kernels: bool = False) -> list[np.ndarray]:
    """ONNX Runtime, CPU. ``optimize=False``: no graph optimizations, so no QDQ fusion (float kernels).
    ``int8_kernels``: QDQ groups with int8 activations fused too (off by default on x86-64)."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if int8_kernels:
        so.add_session_config_entry("session.qdqisint8allowed", "1")
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    proto = model if isinstance(model, onnx.ModelProto) else qnnx.ir.to_proto(model)
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def run_ref(model, feeds) -> list[np.ndarray]:
    proto = model if isinstance(model, onnx.ModelProto) else qnnx.ir.to_proto(model)
    return qnnx.ReferenceEvaluator(proto).run(None, feeds)


def op_types(model) -> list[str]:
    """Node op types, ``qnnx.<op>`` for dialect ops (an ir.Model or a ModelProto)."""
    nodes = model.graph.node if isinstance(model, onnx.ModelProto) else model.graph
    return [f"qnnx.{n.op_type}" if n.domain == "qnnx" else n.op_type for n in nodes]


def lsb_diff(a: np.ndarray, b: np.ndarray) -> int:
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    return int(np.abs(a.astype(np.int64) - b.astype(np.int64)).max(initial=0))


def compare_fq_to_int(model: onnx.ModelProto, feeds: dict, *, ops=(), gone=(), lsb: int = 0,
                      ref_lsb: int | None = None, ort_optimize: bool = True):
    """Convert ``model``; check the ops; the converted model's outputs (qnnx reference) against ORT's
    execution of the QDQ model (at most ``lsb`` quanta apart) and against qnnx's reference on the QDQ
    model, which runs the float op between dequantize and quantize (at most ``ref_lsb``, default
    ``lsb``; conv/matmul give 1 there: float32 sums can cross a rounding boundary where the integer
    accumulator does not). The converted model, lowered to standard ONNX, must give the same integers
    on ORT. Returns (converted model, report, outputs)."""
    converted, report = convert_qdq(model)
    assert report.left_in_float == []
    types = op_types(converted)
    for op in ops:
        assert op in types, f"{op} missing from {types}"
    for op in gone:
        assert op not in types, f"{op} still in {types}"
    assert not Q_OPS & set(types), f"quantize/dequantize left in {types}"
    got = run_ref(converted, feeds)
    expected = run_ort(model, feeds, optimize=ort_optimize)
    ref_qdq = run_ref(model, feeds)
    lowered = run_ort(qnnx.lower(converted), feeds)
    for g, e, r, low in zip(got, expected, ref_qdq, lowered, strict=True):
        d_ort, d_ref = lsb_diff(g, e), lsb_diff(g, r)
        assert d_ort <= lsb, f"{d_ort} LSB from ORT (allowed {lsb})"
        assert d_ref <= (lsb if ref_lsb is None else ref_lsb), \
            f"{d_ref} LSB from the reference on the QDQ model"
        assert lsb_diff(low, g) == 0, "lowered model on ORT differs from the reference"
        assert len(np.unique(g)) > 2, "degenerate test: output (nearly) constant"
    return converted, report, got


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        # float inputs (run-time scales, clip bounds) positive
        feeds[vi.name] = ints(rng, dtype, shape) if dtype.kind in "iu" else \
            np.asarray(np.abs(rng.standard_normal(shape)) + 0.05, dtype)
    return feeds


def assert_left_in_float(model: onnx.ModelProto, node_name: str, op_type: str, reason: str, *,
                         reference: bool = True):
    """The node stays a float op with the recorded reason, and the converted model still computes the
    QDQ model, bit-exact: the float op and its dequantize/quantize are kept as they are. Compared on
    ORT without graph optimizations (the lowered converted model against the QDQ model: ORT's QDQ
    fusions would otherwise turn some of these refused cases into kernels that reject or misread
    them) and, with ``reference``, with qnnx's reference on both."""
    converted, report = convert_qdq(model)
    entries = [e for e in report.left_in_float if e[0] == node_name]
    assert len(entries) == 1, report.left_in_float
    assert entries[0][1] == op_type
    assert re.search(reason, entries[0][2]), entries[0][2]
    names = {n.name: n.op_type for n in converted.graph}
    assert names.get(node_name) == op_type
    feeds = random_feeds(model)
    pairs = [(run_ort(qnnx.lower(converted), feeds, optimize=False), run_ort(model, feeds, optimize=False))]
    if reference:
        pairs.append((run_ref(converted, feeds), run_ref(model, feeds)))
    for got, expected in pairs:
        for g, e in zip(got, expected, strict=True):
            if g.dtype.kind == "f":
                np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)
            else:
                assert lsb_diff(g, e) == 0
    return converted, report


# --------------------------------------------------------------------------- data movement

U8 = np.uint8
I8 = np.int8
XS, XZ = 0.05, U8(128)  # activation qparams used throughout (uint8)


def _data_movement_case(op):
    """(op_type, consts builder, attrs, input shape); the op's non-data inputs are int64 constants."""
    return {
        "Reshape": (lambda g: [g.const(np.array([1, 4, 18], np.int64))], {}, (1, 4, 3, 6)),
        "Transpose": (lambda g: [], dict(perm=[0, 2, 3, 1]), (1, 4, 3, 6)),
        "Flatten": (lambda g: [], dict(axis=2), (1, 4, 3, 6)),
        "Squeeze": (lambda g: [g.const(np.array([2], np.int64))], {}, (1, 4, 1, 18)),
        "Unsqueeze": (lambda g: [g.const(np.array([0, 3], np.int64))], {}, (4, 3, 6)),
        "Slice": (lambda g: [g.const(np.array([1, 5], np.int64)), g.const(np.array([4, 0], np.int64)),
                             g.const(np.array([1, 3], np.int64)), g.const(np.array([2, -2], np.int64))],
                  {}, (1, 4, 3, 6)),
        "Gather": (lambda g: [g.const(np.array([[3, 0], [2, 2]], np.int64))], dict(axis=1), (1, 4, 3, 6)),
        "Expand": (lambda g: [g.const(np.array([2, 4, 3, 6], np.int64))], {}, (1, 4, 1, 6)),
        "Tile": (lambda g: [g.const(np.array([1, 2, 1, 2], np.int64))], {}, (1, 4, 3, 6)),
        "DepthToSpace": (lambda g: [], dict(blocksize=2), (1, 8, 3, 3)),
        "SpaceToDepth": (lambda g: [], dict(blocksize=2), (1, 2, 4, 6)),
    }[op]


@pytest.mark.parametrize("op", ["Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Gather",
                                "Expand", "Tile", "DepthToSpace", "SpaceToDepth"])
def test_data_movement(op, rng):
    # Same qparams on both sides: the op runs on the integers and no requantize is needed. Bit-exact:
    # the op only moves values, and dequantize -> quantize with identical qparams is the identity.
    consts, attrs, shape = _data_movement_case(op)
    g = QDQ()
    x = g.dequantize(g.input("x", U8, shape), XS, XZ)
    y = g.node(op, [x, *consts(g)], **attrs)
    m = g.model(g.quantize(y, XS, XZ))
    converted, report, _ = compare_fq_to_int(m, {"x": ints(rng, U8, shape)}, ops=[op])
    assert report.converted == {op: 1}
    assert not any(t.startswith("qnnx.") for t in op_types(converted))


def test_data_movement_into_other_qparams_is_one_requantize(rng):
    # Transpose then a quantize with other qparams: the integer Transpose and one requantize.
    # At most 1 LSB: ORT rounds (x - z) * s in float32 and then divides by the output scale (two
    # roundings), the requantize multiplies by the float32 ratio of the scales (one).
    g = QDQ()
    x = g.dequantize(g.input("x", I8, (2, 4, 5)), 0.031, I8(-3))
    y = g.node("Transpose", [x], perm=[2, 0, 1])
    m = g.model(g.quantize(y, 0.043, U8(120)))
    converted, _, _ = compare_fq_to_int(m, {"x": ints(rng, I8, (2, 4, 5))}, ops=["Transpose", "qnnx.requantize"],
                                        lsb=1)
    assert op_types(converted).count("qnnx.requantize") == 1


def test_split_multi_output(rng):
    # Split: every output keeps the input's affine type. Bit-exact (data movement).
    g = QDQ()
    x = g.dequantize(g.input("x", I8, (2, 6, 5)), 0.02, I8(5))
    a, b, c = g.node("Split", [x, g.const(np.array([1, 3, 2], np.int64))], outputs=3, axis=1)
    m = g.model(g.quantize(a, 0.02, I8(5)), g.quantize(b, 0.02, I8(5)), g.quantize(c, 0.02, I8(5)))
    converted, _, outs = compare_fq_to_int(m, {"x": ints(rng, I8, (2, 6, 5))}, ops=["Split"])
    assert [o.shape for o in outs] == [(2, 1, 5), (2, 3, 5), (2, 2, 5)]
    assert op_types(converted).count("Split") == 1


def test_data_movement_negative_per_axis_activation(rng):
    g = QDQ()
    x = g.dequantize(g.input("x", U8, (1, 4, 3, 6)), np.array([0.1, 0.2, 0.3, 0.4], np.float32),
                     np.array([1, 2, 3, 4], U8), axis=1)
    y = g.node("Reshape", [x, g.const(np.array([1, 4, 18], np.int64))], name="reshape")
    m = g.model(g.quantize(y, 0.1, U8(0)))
    assert_left_in_float(m, "reshape", "Reshape", "input is quantized per-axis; this rule needs per-tensor")


# --------------------------------------------------------------------------- MaxPool, Resize, Pad


@pytest.mark.parametrize("per_channel", [False, True])
def test_max_pool(per_channel, rng):
    # MaxPool on the integers: dequantize is monotonic (positive scales), so max commutes with it.
    # Bit-exact. Per-channel activation qparams (axis 1) are allowed: the max stays per channel.
    g = QDQ()
    s = np.array([0.02, 0.05, 0.01], np.float32) if per_channel else np.float32(0.02)
    z = np.array([-4, 0, 9], I8) if per_channel else I8(-4)
    axis = 1 if per_channel else None
    x = g.dequantize(g.input("x", I8, (2, 3, 7, 6)), s, z, axis=axis)
    y = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 0])
    m = g.model(g.quantize(y, s, z, axis=axis))
    compare_fq_to_int(m, {"x": ints(rng, I8, (2, 3, 7, 6))}, ops=["MaxPool"])


@pytest.mark.parametrize("dtype", [np.uint16, np.int16])
def test_max_pool_16_bit(dtype, rng):
    # ONNX's MaxPool has no 16-bit integer type: the max is taken through float32, which holds every
    # 16-bit value exactly. Bit-exact, and the lowered model runs on ORT (a 16-bit MaxPool does not load).
    g = QDQ(opset=21)
    z = dtype(1000)
    x = g.dequantize(g.input("x", dtype, (2, 3, 7, 6)), 0.001, z)
    y = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 0])
    m = g.model(g.quantize(y, 0.001, z))
    converted, _, _ = compare_fq_to_int(m, {"x": ints(rng, dtype, (2, 3, 7, 6))}, ops=["MaxPool", "Cast"])
    pool = next(n for n in converted.graph if n.op_type == "MaxPool")
    assert pool.inputs[0].producer().op_type == "Cast" and pool.outputs[0].uses()[0].node.op_type == "Cast"


def test_max_pool_negative_indices_used(rng):
    g = QDQ()
    x = g.dequantize(g.input("x", I8, (1, 2, 4, 4)), 0.02, I8(0))
    y, idx = g.node("MaxPool", [x], outputs=2, name="maxpool", kernel_shape=[2, 2], strides=[2, 2])
    g.dtypes[idx] = TensorProto.INT64
    m = g.model(g.quantize(y, 0.02, I8(0)), idx)
    assert_left_in_float(m, "maxpool", "MaxPool", "MaxPool indices output is used")


def test_resize_nearest(rng):
    # Nearest Resize only picks input elements: bit-exact on the integers.
    g = QDQ()
    x = g.dequantize(g.input("x", U8, (1, 2, 3, 4)), XS, XZ)
    y = g.node("Resize", [x, "", g.const(np.array([1, 1, 2, 1.5], np.float32))], mode="nearest",
               nearest_mode="floor", coordinate_transformation_mode="asymmetric")
    m = g.model(g.quantize(y, XS, XZ))
    compare_fq_to_int(m, {"x": ints(rng, U8, (1, 2, 3, 4))}, ops=["Resize"])


def test_resize_nearest_16_bit(rng):
    # ONNX Runtime has no 16-bit Resize kernel: through float32, exact (the lowered model must run on ORT).
    g = QDQ(opset=21)
    x = g.dequantize(g.input("x", np.uint16, (1, 2, 3, 4)), 0.001, np.uint16(30000))
    y = g.node("Resize", [x, "", g.const(np.array([1, 1, 2, 2], np.float32))], mode="nearest")
    m = g.model(g.quantize(y, 0.001, np.uint16(30000)))
    converted, _, _ = compare_fq_to_int(m, {"x": ints(rng, np.uint16, (1, 2, 3, 4))}, ops=["Resize", "Cast"])
    resize = next(n for n in converted.graph if n.op_type == "Resize")
    assert resize.inputs[0].producer().op_type == "Cast"


def test_resize_negative_linear(rng):
    g = QDQ()
    x = g.dequantize(g.input("x", U8, (1, 2, 3, 4)), XS, XZ)
    y = g.node("Resize", [x, "", g.const(np.array([1, 1, 2, 2], np.float32))], mode="linear", name="resize")
    m = g.model(g.quantize(y, XS, XZ))
    assert_left_in_float(m, "resize", "Resize", "Resize mode 'linear' interpolates; only nearest is exact")


@pytest.mark.parametrize("case", ["zero", "representable", "reflect"])
def test_pad(case, rng):
    # Pad with the quantized pad value (the zero point for 0.0): bit-exact, since the value is exactly
    # representable (the rule refuses otherwise) and the other elements are only moved.
    g = QDQ()
    x = g.dequantize(g.input("x", U8, (1, 2, 3, 4)), XS, XZ)
    pads = g.const(np.array([0, 0, 1, 2, 0, 1, 2, 1], np.int64))
    if case == "zero":
        y = g.node("Pad", [x, pads])
    elif case == "representable":  # -0.5 = (118 - 128) * 0.05 (the check is allclose on float32)
        y = g.node("Pad", [x, pads, g.const(np.array(-0.5, np.float32))], mode="constant")
    else:
        y = g.node("Pad", [x, pads], mode="reflect")
    m = g.model(g.quantize(y, XS, XZ))
    compare_fq_to_int(m, {"x": ints(rng, U8, (1, 2, 3, 4))}, ops=["Pad"])


def test_pad_negative_value_not_representable(rng):
    g = QDQ()
    x = g.dequantize(g.input("x", U8, (1, 2, 3, 4)), XS, XZ)
    y = g.node("Pad", [x, g.const(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)),
                       g.const(np.array(0.123, np.float32))], name="pad")
    m = g.model(g.quantize(y, XS, XZ))
    assert_left_in_float(m, "pad", "Pad", r"pad value 0\.123\d* is not representable")


# --------------------------------------------------------------------------- Relu, Clip


@pytest.mark.parametrize("dtype", [U8, I8])
def test_relu(dtype, rng):
    # Relu = integer Clip at quantize(0) = the zero point. Bit-exact: quantize is monotonic, so
    # quantize(max(r, 0)) = max(quantize(r), zero point) with identical in/out qparams.
    z = dtype(100) if dtype == U8 else dtype(-20)
    g = QDQ()
    x = g.dequantize(g.input("x", dtype, (2, 3, 10)), 0.04, z)
    m = g.model(g.quantize(g.node("Relu", [x]), 0.04, z))
    compare_fq_to_int(m, {"x": ints(rng, dtype, (2, 3, 10))}, ops=["Clip"], gone=["Relu"])


def test_relu_per_channel(rng):
    # Per-channel (axis 1) qparams: an integer Max with one zero point per channel. Bit-exact (same
    # per-channel qparams on both sides; monotonic quantize per channel).
    s, z = np.array([0.1, 0.2, 0.05], np.float32), np.array([3, 200, 128], U8)
    g = QDQ()
    x = g.dequantize(g.input("x", U8, (2, 3, 10)), s, z, axis=1)
    m = g.model(g.quantize(g.node("Relu", [x]), s, z, axis=1))
    compare_fq_to_int(m, {"x": ints(rng, U8, (2, 3, 10))}, ops=["Max"], gone=["Relu"])


def test_relu_negative_run_time_qparams(rng):
    # A dequantize whose scale is a graph input: no affine type to propagate.
    g = QDQ()
    x = g.node("DequantizeLinear", [g.input("x", U8, (2, 5)), g.input("s", np.float32, []), g.const(U8(128))])
    m = g.model(g.quantize(g.node("Relu", [x], name="relu"), 0.1, U8(0)))
    assert_left_in_float(m, "relu", "Relu", "inputs are not quantized with constant qparams")


@pytest.mark.parametrize("bounds", ["both", "min_only", "max_only", "quantized_bounds"])
def test_clip(bounds, rng):
    # Integer Clip to the quantized bounds; bit-exact by monotonicity of quantize (same in/out qparams;
    # the bounds need not be representable). "quantized_bounds": min/max given as dequantized int8
    # constants, as exporters write them.
    g = QDQ()
    x = g.dequantize(g.input("x", I8, (2, 3, 10)), 0.05, I8(7))
    lo, hi = g.const(np.float32(-1.23)), g.const(np.float32(2.5))
    inputs = {"both": [x, lo, hi], "min_only": [x, lo], "max_only": [x, "", hi],
              "quantized_bounds": [x, g.weight(np.array(-20, I8), 0.05, I8(0)),
                                   g.weight(np.array(60, I8), 0.05, I8(0))]}[bounds]
    m = g.model(g.quantize(g.node("Clip", inputs), 0.05, I8(7)))
    compare_fq_to_int(m, {"x": ints(rng, I8, (2, 3, 10))}, ops=["Clip"])


def _clip_opset10_model():
    g = QDQ(opset=10)
    x = g.dequantize(g.input("x", U8, (3, 16)), 0.05, U8(128))
    return g.model(g.quantize(g.node("Clip", [x], min=-0.7, max=3.0, name="clip"), 0.05, U8(128)))


def test_clip_opset10_attribute_bounds_are_read():
    # Opset 10: the bounds are attributes. The integer Clip gets quantize(-0.7) = 114, quantize(3.0) = 188.
    converted, report = convert_qdq(_clip_opset10_model())
    assert report.left_in_float == [] and report.converted == {"Clip": 1}
    clip = next(n for n in converted.graph if n.op_type == "Clip")
    assert [int(v.const_value.numpy()) for v in clip.inputs[1:]] == [114, 188]


@pytest.mark.parametrize("opset,op,attrs", [(10, "Clip", dict(min=-0.7, max=3.0)), (11, "Relu", {}),
                                            (11, "MaxPool", dict(kernel_shape=[2, 2]))])
def test_old_opset_converted_model_runs(opset, op, attrs, rng):
    # Bit-exact once it runs (monotonic quantize, same in/out qparams).
    g = QDQ(opset=opset)
    x = g.dequantize(g.input("x", U8, (1, 2, 4, 4)), 0.05, U8(128))
    m = g.model(g.quantize(g.node(op, [x], **attrs), 0.05, U8(128)))
    feeds = {"x": ints(rng, U8, (1, 2, 4, 4))}
    converted, report = convert_qdq(m)
    assert report.left_in_float == []
    np.testing.assert_array_equal(run_ort(converted, feeds)[0], run_ort(m, feeds)[0])


def test_clip_per_channel(rng):
    # Per-channel (axis 1) qparams: integer Max/Min with per-channel quantized bounds. Bit-exact.
    s, z = np.array([0.1, 0.02, 0.05], np.float32), np.array([-3, 20, 0], I8)
    g = QDQ()
    x = g.dequantize(g.input("x", I8, (2, 3, 10)), s, z, axis=1)
    y = g.node("Clip", [x, g.const(np.float32(-1.0)), g.const(np.float32(1.5))])
    m = g.model(g.quantize(y, s, z, axis=1))
    compare_fq_to_int(m, {"x": ints(rng, I8, (2, 3, 10))}, ops=["Max", "Min"], gone=["Clip"])


def test_clip_negative_bounds_not_constant(rng):
    g = QDQ()
    x = g.dequantize(g.input("x", I8, (2, 5)), 0.05, I8(0))
    lo = g.input("lo", np.float32, [])
    m = g.model(g.quantize(g.node("Clip", [x, lo], name="clip"), 0.05, I8(0)))
    assert_left_in_float(m, "clip", "Clip", "clip bounds are not constants")


# --------------------------------------------------------------------------- lookup tables

# op -> (attrs, input (scale, zp), output (scale, zp), opset); qparams chosen so the table spans the
# output range without saturating most of it.
LUT_CASES = {
    "Sigmoid": ({}, (0.06, I8(0)), (1 / 256, I8(-128)), 21),
    "Tanh": ({}, (0.03, I8(0)), (1 / 128, I8(0)), 21),
    "HardSigmoid": (dict(alpha=0.25, beta=0.4), (0.05, I8(0)), (1 / 256, U8(0)), 21),
    "HardSwish": ({}, (0.05, U8(128)), (0.03, U8(20)), 21),
    "LeakyRelu": (dict(alpha=0.1), (0.05, I8(3)), (0.04, I8(-10)), 21),
    "Exp": ({}, (0.02, U8(128)), (0.05, U8(0)), 21),
    "Erf": ({}, (0.02, I8(0)), (1 / 128, I8(0)), 21),
    "Gelu": ({}, (0.03, U8(128)), (0.02, U8(30)), 20),
    "Elu": (dict(alpha=0.7), (0.04, I8(-5)), (0.03, I8(0)), 21),
    "Softplus": ({}, (0.05, I8(0)), (0.03, U8(0)), 21),
}


@pytest.mark.parametrize("per_channel", [False, True])
def test_int8_block_reproduces_ort_int8_kernels(per_channel, rng):
    # A YOLOv8 block with int8 activations: Conv(+bias) -> SiLU (Sigmoid, Mul) -> residual Add. With its
    # int8 QDQ fusion on, ORT runs QLinearConv / QLinearSigmoid / QLinearMul / QLinearAdd; the converted
    # model is bit-identical to that (with ORT's x86-64 defaults the group runs in float instead).
    g = QDQ()
    x = g.dequantize(g.input("x", I8, (1, 8, 32, 32)), 0.05, I8(3))
    w_scale = np.linspace(0.004, 0.01, 8).astype(np.float32) if per_channel else 0.007
    w = g.weight(ints(rng, I8, (8, 8, 3, 3)), w_scale, np.zeros(8, I8) if per_channel else I8(0),
                 axis=0 if per_channel else None)
    b = g.weight(rng.integers(-2000, 2000, 8).astype(np.int32), np.float32(0.05) * np.asarray(w_scale, np.float32),
                 None, axis=0 if per_channel else None)
    c = g.dequantize(g.quantize(g.node("Conv", [x, w, b], pads=[1, 1, 1, 1]), 0.08, I8(-5)), 0.08, I8(-5))
    s = g.dequantize(g.quantize(g.node("Sigmoid", [c]), 1 / 256, I8(-128)), 1 / 256, I8(-128))
    y = g.dequantize(g.quantize(g.node("Mul", [c, s]), 0.06, I8(-20)), 0.06, I8(-20))
    m = g.model(g.quantize(g.node("Add", [y, x]), 0.07, I8(-9)))
    feeds = {"x": ints(rng, I8, (1, 8, 32, 32))}
    converted, report = convert_qdq(m)
    assert report.left_in_float == []
    want = run_ort(m, feeds, int8_kernels=True)[0]
    got = run_ort(qnnx.lower(converted), feeds)[0]
    assert np.array_equal(got, want), f"{int((got != want).sum())} of {want.size} differ"
    assert len(np.unique(want)) > 20


def _batch_norm_model(dtype, x_axis=None):
    rng = np.random.default_rng(61)
    c = 6
    g = QDQ()
    z = U8(130) if dtype == U8 else I8(-4)
    xs = np.linspace(0.02, 0.05, c).astype(np.float32) if x_axis is not None else 0.031
    x = g.dequantize(g.input("x", dtype, (1, c, 16, 16)), xs, np.full(c, z) if x_axis is not None else z,
                     axis=x_axis)
    params = [g.const(v.astype(np.float32)) for v in (rng.uniform(0.3, 2, c) * rng.choice([-1, 1], c),
                                                      rng.normal(size=c), rng.normal(size=c), rng.uniform(0.2, 3, c))]
    y = g.node("BatchNormalization", [x, *params], epsilon=1e-3, name="bn")
    return g.model(g.quantize(y, 0.047, U8(120) if dtype == U8 else I8(3)))


@pytest.mark.parametrize("dtype", [U8, I8])
def test_batch_norm_is_a_per_channel_table(dtype):
    # ORT runs BatchNormalization between DQ and Q in float (it has no QLinear form); one row per channel
    # of its exact float32 recipe makes the converted model bit-identical to ORT. Every input byte is fed.
    m = _batch_norm_model(dtype)
    info = np.iinfo(dtype)
    x = np.broadcast_to(np.arange(info.min, int(info.max) + 1, dtype=dtype).reshape(1, 1, 16, 16), (1, 6, 16, 16))
    converted, _, _ = compare_fq_to_int(m, {"x": np.ascontiguousarray(x)}, ops=["qnnx.lut"], gone=["BatchNormalization"],
                                        lsb=0, ref_lsb=1)
    assert "qnnx.conv" not in op_types(converted)


@pytest.mark.parametrize("dtype", [U8, I8])
def test_numerics_qdq_keeps_the_graph_meaning(dtype):
    # numerics="qdq": no ORT recipe anywhere (add/mul/softmax/pool keep float32 multipliers or exact
    # forms, BatchNorm the exact depthwise conv), within 1 LSB of the QDQ graph's reference meaning
    m = _batch_norm_model(dtype)
    converted, report = convert_qdq(m, numerics="qdq")
    assert report.left_in_float == []
    proto = qnnx.ir.to_proto(converted)
    assert "lut" not in [n.op_type for n in proto.graph.node] and "conv" in [n.op_type for n in proto.graph.node]
    assert all(a.s != b"mlas" for n in proto.graph.node for a in n.attribute if a.name == "compute")
    feeds = {"x": ints(np.random.default_rng(3), dtype, (1, 6, 16, 16))}
    assert lsb_diff(run_ref(converted, feeds)[0], run_ref(m, feeds)[0]) <= 1


def test_unknown_numerics_is_refused():
    with pytest.raises(qnnx.QnnxError, match="unknown numerics 'exact'"):
        convert_qdq(_batch_norm_model(U8), numerics="exact")


def test_batch_norm_negative_per_axis_input():
    assert_left_in_float(_batch_norm_model(I8, x_axis=1), "bn", "BatchNormalization", "per-axis")


@pytest.mark.parametrize("op", list(LUT_CASES))
def test_lookup_table(op):
    # qnnx.lut with a table built offline in float32. The input is every value of the 8-bit type, so
    # the whole table is compared. At most 1 LSB from ORT: ORT evaluates the functions with its own
    # float approximations (MLAS logistic/tanh/erf polynomials, its QLinear* table builders), which can
    # land on the other side of a rounding boundary (measured here: 0 for all ten functions).
    attrs, (xs, xz), (ys, yz), opset = LUT_CASES[op]
    dtype = type(xz)
    g = QDQ(opset=opset)
    x = g.dequantize(g.input("x", dtype, (2, 128)), xs, xz)
    m = g.model(g.quantize(g.node(op, [x], **attrs), ys, yz))
    every = np.arange(np.iinfo(dtype).min, int(np.iinfo(dtype).max) + 1).astype(dtype).reshape(2, 128)
    compare_fq_to_int(m, {"x": every}, ops=["qnnx.lut"], gone=[op], lsb=1)


@pytest.mark.parametrize("between", ["Transpose", "DepthToSpace"])
def test_lookup_table_takes_the_type_of_a_quantize_after_a_permutation(between):
    # Sigmoid -> (a value-permuting op: qnnx.ops.permutes_values) -> quantize: the quantize saw exactly the
    # Sigmoid's values, so its type is the table's output type and the permutation runs on the integers.
    g = QDQ()
    x = g.dequantize(g.input("x", U8, (1, 8, 2, 2)), 0.05, U8(128))
    s = g.node("Sigmoid", [x], name="sigmoid")
    attrs = {"perm": [0, 2, 3, 1]} if between == "Transpose" else {"blocksize": 2}
    m = g.model(g.quantize(g.node(between, [s], **attrs), 1 / 256, U8(0)))
    every = np.arange(256).astype(U8)[:32].reshape(1, 8, 2, 2)
    compare_fq_to_int(m, {"x": every}, ops=["qnnx.lut", between], gone=["Sigmoid"], lsb=1)


def test_lookup_table_negative_output_also_float(rng):
    # The Sigmoid's output is quantized but is also a graph output in float: it must stay.
    g = QDQ()
    x = g.dequantize(g.input("x", I8, (2, 8)), 0.05, I8(0))
    s = g.node("Sigmoid", [x], name="sigmoid")
    m = g.model(g.quantize(s, 1 / 256, I8(-128)), float_outputs=[s])
    assert_left_in_float(m, "sigmoid", "Sigmoid", r"output is not quantized")


def test_lookup_table_graph_output_in_float_stays(rng):
    # A Sigmoid ending the graph in float leaves integer land: it stays float (with its dequantize),
    # and is not an op "inside a quantized region" (no report entry).
    g = QDQ()
    x = g.dequantize(g.input("x", I8, (2, 8)), 0.05, I8(0))
    s = g.node("Sigmoid", [x], name="sigmoid")
    m = g.model(float_outputs=[s])
    converted, report = convert_qdq(m)
    assert report.left_in_float == []
    assert "Sigmoid" in op_types(converted) and "qnnx.lut" not in op_types(converted)
    feeds = {"x": ints(rng, I8, (2, 8))}
    np.testing.assert_array_equal(run_ref(qnnx.ir.to_proto(converted), feeds)[0], run_ref(m, feeds)[0])


LUT_16_BIT_CASES = {
    # (op, x type, y type): a 16-bit activation's function is a 65536-entry table, so a W8A16 model's
    # sigmoids and GELUs are integer too; the output may be 8- or 16-bit.
    "Sigmoid int16 -> uint16": ("Sigmoid", (0.0005, np.int16(0)), (1 / 65536, np.uint16(0))),
    "Tanh uint16 -> int16": ("Tanh", (0.0001, np.uint16(32768)), (1 / 32768, np.int16(0))),
    "Gelu uint16 -> uint8": ("Gelu", (0.0002, np.uint16(20000)), (0.05, U8(10))),
}


@pytest.mark.parametrize("case", list(LUT_16_BIT_CASES))
def test_lookup_table_16_bit_input(case):
    # Every value of the 16-bit type, so the whole table is compared. Within 1 LSB of ORT: its float
    # sigmoid/tanh approximations cross rounding boundaries of a 16-bit output more often (measured: 88
    # and 74 of the 65536 entries, the 8-bit GELU none); and of the reference on the QDQ model (numpy's
    # float32 sigmoid against the table builder's: 3 entries).
    op, (xs, xz), (ys, yz) = LUT_16_BIT_CASES[case]
    dtype = type(xz)
    g = QDQ(opset=21)
    x = g.dequantize(g.input("x", dtype, (2, 32768)), xs, xz)
    m = g.model(g.quantize(g.node(op, [x]), ys, yz))
    every = np.arange(np.iinfo(dtype).min, int(np.iinfo(dtype).max) + 1).astype(dtype).reshape(2, 32768)
    compare_fq_to_int(m, {"x": every}, ops=["qnnx.lut"], gone=[op], lsb=1)


def test_lookup_table_negative_32_bit_input(rng):
    g = QDQ()
    x = g.dequantize(g.input("x", np.int32, (2, 8)), 0.001, np.int32(0))
    m = g.model(g.quantize(g.node("Tanh", [x], name="tanh"), 1 / 128, I8(0)))
    assert_left_in_float(m, "tanh", "Tanh", "int32 input: lookup tables take inputs of 16 bits or fewer")


# --------------------------------------------------------------------------- Conv, ConvTranspose


def _conv_model(rng, *, xdtype=U8, per_channel=False, bias="same", group=1, name="conv"):
    """x (2, 4, 7, 6) -> Conv(3x3, pads 1, M=6) -> Q. ``bias``: None, "same" (scale sx*sw, what quantizers
    write) or "other" (a different scale: the rule must requantize it into the accumulator type)."""
    c, m_out = 4, (8 if group == 4 else 6)
    xs, xz = 0.05, xdtype(128 if xdtype == U8 else -3)
    g = QDQ()
    x = g.dequantize(g.input("x", xdtype, (2, c, 7, 6)), xs, xz)
    w = ints(rng, I8, (m_out, c // group, 3, 3))
    w[w == -128] = -127
    if per_channel:
        ws = rng.uniform(0.004, 0.02, m_out).astype(np.float32)
        wf = g.weight(w, ws, np.zeros(m_out, I8), axis=0)
    else:
        ws = np.float32(0.01)
        wf = g.weight(w, ws, I8(0))
    inputs = [x, wf]
    if bias is not None:
        bs = (np.float32(xs) * ws).astype(np.float32)
        if bias == "other":
            bs = (bs * np.float32(1.37)).astype(np.float32)
        bq = rng.integers(-3000, 3000, m_out).astype(np.int32)
        inputs.append(g.weight(bq, bs, np.zeros(np.shape(bs), np.int32), axis=0 if per_channel else None))
    y = g.node("Conv", inputs, name=name, pads=[1, 1, 1, 1], group=group)
    ys = 0.15 if group == 1 else 0.06
    return g.model(g.quantize(y, ys, xdtype(120 if xdtype == U8 else 5)))


# case -> (model options, LSB allowed against ORT)
CONV_CASES = {
    # ORT fuses DQ -> Conv -> Q into QLinearConv: the int32 accumulator requantized as
    # float32(acc) * float32(sx*sw/sy), ties to even -- the requantize's arithmetic. Bit-exact.
    "per_tensor_bias": (dict(), 0),
    "per_tensor_no_bias": (dict(bias=None), 0),
    "per_channel_bias": (dict(per_channel=True), 0),
    "groups_per_channel": (dict(group=2, per_channel=True), 0),
    # A bias with another scale: qnnx requantizes it into the accumulator type (rounding it to a
    # multiple of sx*sw), ORT does not fuse and adds the exact real bias in float. At most 1 LSB.
    "per_tensor_other_bias_scale": (dict(bias="other"), 1),
    "per_channel_other_bias_scale": (dict(per_channel=True, bias="other"), 1),
    "depthwise_other_bias_scale": (dict(group=4, bias="other"), 1),
    # int8 activations: ORT's CPU QDQ fusion leaves this Conv in float (float32 sums). At most 1 LSB.
    "int8_activations_per_channel": (dict(xdtype=I8, per_channel=True), 1),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv(case, rng):
    # qnnx.conv (int32 accumulator, scale sx*sw) + qnnx.requantize; tolerances in CONV_CASES. A bias
    # with another scale is requantized into the accumulator type (per channel for per-channel weights).
    kw, lsb = CONV_CASES[case]
    m = _conv_model(rng, **kw)
    xdtype = kw.get("xdtype", U8)
    converted, _, _ = compare_fq_to_int(m, {"x": ints(rng, xdtype, (2, 4, 7, 6))},
                                        ops=["qnnx.conv", "qnnx.requantize"], gone=["Conv"], lsb=lsb, ref_lsb=1)
    assert_canonical_accumulator(converted, "conv", kw.get("bias", "same"),
                                 channels=(8 if kw.get("group") == 4 else 6) if kw.get("per_channel") else 1)


def assert_canonical_accumulator(converted, op: str, bias: str | None, channels: int):
    """docs/canonical.md rule 2: the int32 accumulator op feeds exactly one requantize; its bias is the
    int32 initializer as it was ("same" scale), or ("other" scale) a requantize into the accumulator
    type, with a per-channel output scale (``channels`` values) for per-channel weights."""
    node = next(n for n in converted.graph if n.op_type == op and n.domain == "qnnx")
    assert [u.node.op_type for u in node.outputs[0].uses()] == ["requantize"]
    bias_index = 6
    b = node.inputs[bias_index] if len(node.inputs) > bias_index else None
    if bias is None:
        assert b is None
    elif bias == "same":
        assert b.const_value is not None and b.dtype == onnx.TensorProto.INT32
    else:
        rq = b.producer()
        assert rq is not None and rq.op_type == "requantize"
        assert rq.attributes["out_dtype"].value == "int32"
        assert rq.inputs[3].const_value.numpy().size == channels
        assert not rq.inputs[4].const_value.numpy().any()  # zero point 0


def test_conv_negative_weights_per_channel_on_wrong_axis(rng):
    g = QDQ()
    x = g.dequantize(g.input("x", U8, (1, 4, 5, 5)), XS, XZ)
    w = ints(rng, I8, (6, 4, 3, 3))  # per input channel (axis 1) instead of per output channel
    wf = g.weight(w, np.array([0.01, 0.02, 0.03, 0.04], np.float32), np.zeros(4, I8), axis=1)
    m = g.model(g.quantize(g.node("Conv", [x, wf], name="conv"), 0.2, U8(128)))
    assert_left_in_float(m, "conv", "Conv", "weight is per-axis along axis 1, expected 0")


def _conv_transpose_model(rng, *, per_channel, bias, name="deconv"):
    xs = 0.05
    g = QDQ()
    x = g.dequantize(g.input("x", U8, (1, 4, 5, 6)), xs, XZ)
    m_out = 3
    w = ints(rng, I8, (4, m_out, 3, 3))
    w[w == -128] = -127
    ws = rng.uniform(0.004, 0.02, m_out).astype(np.float32) if per_channel else np.float32(0.01)
    wf = g.weight(w, ws, np.zeros(np.shape(ws), I8), axis=1 if per_channel else None)
    inputs = [x, wf]
    if bias is not None:
        bs = (np.float32(xs) * ws).astype(np.float32)
        if bias == "other":
            bs = (bs * np.float32(0.61)).astype(np.float32)
        inputs.append(g.weight(rng.integers(-3000, 3000, m_out).astype(np.int32), bs,
                               np.zeros(np.shape(bs), np.int32), axis=0 if per_channel else None))
    y = g.node("ConvTranspose", inputs, name=name, strides=[2, 2], pads=[1, 0, 1, 1], output_padding=[1, 0])
    return g.model(g.quantize(y, 0.1, U8(128)))


@pytest.mark.parametrize("per_channel,bias", [(False, "same"), (True, "same"), (True, "other"), (False, None)])
def test_conv_transpose(per_channel, bias, rng):
    # qnnx.conv_transpose + requantize; per-channel weights along axis 1 (C x M). At most 1 LSB: ORT
    # has no QDQ ConvTranspose fusion on CPU and runs the float op (float32 products and sums, the
    # float bias), which can land on the other side of a rounding boundary (measured: 1 LSB, rarely).
    m = _conv_transpose_model(rng, per_channel=per_channel, bias=bias)
    converted, _, _ = compare_fq_to_int(m, {"x": ints(rng, U8, (1, 4, 5, 6))},
                                        ops=["qnnx.conv_transpose", "qnnx.requantize"], gone=["ConvTranspose"], lsb=1)
    assert_canonical_accumulator(converted, "conv_transpose", bias, channels=3 if per_channel else 1)


def test_conv_transpose_negative_per_channel_on_axis0(rng):
    g = QDQ()
    x = g.dequantize(g.input("x", U8, (1, 4, 5, 6)), XS, XZ)
    w = ints(rng, I8, (4, 3, 3, 3))
    wf = g.weight(w, np.array([0.01, 0.02, 0.03, 0.04], np.float32), np.zeros(4, I8), axis=0)
    m = g.model(g.quantize(g.node("ConvTranspose", [x, wf], name="deconv"), 0.2, U8(128)))
    assert_left_in_float(m, "deconv", "ConvTranspose", "weight is per-axis along axis 0, expected 1")


# --------------------------------------------------------------------------- MatMul, Gemm


@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("adtype", [U8, I8])
def test_matmul(per_column, adtype, rng):
    # qnnx.matmul (int32 accumulator, scale sa*sb, per column for per-column B) + requantize.
    # uint8 A: bit-exact, ORT fuses to QLinearMatMul (float32(acc) * float32(sa*sb/sy), ties to even).
    # int8 A: ORT keeps the float MatMul between DQ/Q (float32 sums): at most 1 LSB.
    az = adtype(128 if adtype == U8 else 2)
    g = QDQ()
    a = g.dequantize(g.input("a", adtype, (2, 3, 16)), 0.04, az)
    b = ints(rng, I8, (16, 5))
    bs = rng.uniform(0.005, 0.02, 5).astype(np.float32) if per_column else np.float32(0.01)
    bf = g.weight(b, bs, np.zeros(np.shape(bs), I8), axis=1 if per_column else None)
    m = g.model(g.quantize(g.node("MatMul", [a, bf]), 0.15, adtype(120 if adtype == U8 else -4)))
    compare_fq_to_int(m, {"a": ints(rng, adtype, (2, 3, 16))}, ops=["qnnx.matmul", "qnnx.requantize"],
                      gone=["MatMul"], lsb=0 if adtype == U8 else 1, ref_lsb=1)


def test_matmul_negative_b_per_row(rng):
    g = QDQ()
    a = g.dequantize(g.input("a", U8, (3, 4)), 0.04, U8(128))
    bf = g.weight(ints(rng, I8, (4, 5)), np.array([0.01, 0.02, 0.03, 0.04], np.float32), np.zeros(4, I8), axis=0)
    m = g.model(g.quantize(g.node("MatMul", [a, bf], name="matmul"), 0.1, U8(128)))
    assert_left_in_float(m, "matmul", "MatMul", "per-axis along axis 0; matmul needs per-column")


@pytest.mark.parametrize("per_channel,bias", [(False, "same"), (True, "same"), (True, "other"), (False, None)])
def test_gemm(per_channel, bias, rng):
    # Gemm(transB=1) + bias -> qnnx.matmul on the transposed constant B + requantize. Bit-exact: ORT
    # fuses to com.microsoft QGemm (requantize in float32, ties to even).
    # A bias with another scale: ORT's QDQ -> QGemm fusion passes the int32 bias to QGemm without
    # looking at the bias's DequantizeLinear scale, so ORT's optimized result is not the QDQ graph's
    # meaning (measured: up to 21 LSB off). That case is compared with ORT without graph optimizations
    # (float Gemm): at most 1 LSB, the bias being rounded into the accumulator scale by qnnx.
    n, k = 5, 12
    sa = 0.04
    g = QDQ()
    a = g.dequantize(g.input("a", U8, (3, k)), sa, U8(128))
    bs = rng.uniform(0.005, 0.02, n).astype(np.float32) if per_channel else np.float32(0.01)
    b = g.weight(ints(rng, I8, (n, k)), bs, np.zeros(np.shape(bs), I8), axis=0 if per_channel else None)
    inputs = [a, b]
    if bias is not None:
        cs = (np.float32(sa) * bs).astype(np.float32)
        if bias == "other":
            cs = (cs * np.float32(2.5)).astype(np.float32)
        inputs.append(g.weight(rng.integers(-2000, 2000, n).astype(np.int32), cs, np.zeros(np.shape(cs), np.int32),
                               axis=0 if per_channel else None))
    m = g.model(g.quantize(g.node("Gemm", inputs, transB=1), 0.1, U8(110)))
    other = bias == "other"
    converted, _, _ = compare_fq_to_int(m, {"a": ints(rng, U8, (3, k))}, ops=["qnnx.matmul", "qnnx.requantize"],
                                        gone=["Gemm"], lsb=1 if other else 0, ref_lsb=1, ort_optimize=not other)
    assert_canonical_accumulator(converted, "matmul", bias, channels=n if per_channel else 1)


def test_gemm_negative_alpha(rng):
    g = QDQ()
    a = g.dequantize(g.input("a", U8, (3, 4)), 0.04, U8(128))
    b = g.weight(ints(rng, I8, (4, 5)), 0.01, I8(0))
    m = g.model(g.quantize(g.node("Gemm", [a, b], name="gemm", alpha=0.5), 0.1, U8(128)))
    assert_left_in_float(m, "gemm", "Gemm", "alpha/beta != 1")


# --------------------------------------------------------------------------- Add, Sub, Mul, Div


BINARY_CASES = {
    "same_dtype": ((I8, 0.03, I8(2)), (I8, 0.05, I8(-7)), (0.06, I8(1))),
    "mixed_dtype": ((U8, 0.03, U8(128)), (I8, 0.02, I8(0)), (0.05, U8(120))),
}


@pytest.mark.parametrize("case", list(BINARY_CASES))
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
def test_binary(op, case, rng):
    # qnnx.add/sub/mul into the consumer's qparams (ties to even). At most 1 LSB from ORT: same-dtype
    # Add/Mul take ORT's own QLinearAdd/QLinearMul recipe (compute="mlas", exact: see
    # test_binary_reproduces_ort_kernels); Sub, and mixed dtypes, run in float in ORT (dequantize, op,
    # quantize: one float rounding more than qnnx's float32 multipliers).
    (da, sa, za), (db, sb, zb), (sy, zy) = BINARY_CASES[case]
    if op == "Mul":
        sy = sa * sb * 40
    g = QDQ()
    a = g.dequantize(g.input("a", da, (2, 3, 4, 5)), sa, za)
    b = g.dequantize(g.input("b", db, (3, 1, 5)), sb, zb)  # broadcast
    m = g.model(g.quantize(g.node(op, [a, b]), sy, zy))
    compare_fq_to_int(m, {"a": ints(rng, da, (2, 3, 4, 5)), "b": ints(rng, db, (3, 1, 5))},
                      ops=[f"qnnx.{op.lower()}"], gone=[op], lsb=1)


@pytest.mark.parametrize("op", ["Add", "Mul"])
@pytest.mark.parametrize("dtype", [U8, I8])
@pytest.mark.parametrize("a_shape,b_shape", [((2, 3, 4, 5), (2, 3, 4, 5)), ((1, 3, 4, 5), (1, 3, 1, 1)),
                                             ((1, 3, 1, 1), (1, 3, 4, 5))])
def test_binary_reproduces_ort_kernels(op, dtype, a_shape, b_shape, rng):
    # 8-bit per-tensor Add/Mul: ORT fuses them into QLinearAdd/QLinearMul, and the conversion records
    # that kernel's own float32 recipe (compute="mlas"): bit-identical to ORT, 1 LSB at most from the
    # QDQ graph's exact meaning (the recipe's fused multiply-adds round differently).
    z = (lambda v: dtype(v + 128)) if dtype == U8 else dtype
    g = QDQ()
    a = g.dequantize(g.input("a", dtype, a_shape), 0.031, z(3))
    b = g.dequantize(g.input("b", dtype, b_shape), 0.017, z(-9))
    m = g.model(g.quantize(g.node(op, [a, b]), 0.043 if op == "Add" else 0.0021, z(5)))
    converted, _, _ = compare_fq_to_int(m, {"a": ints(rng, dtype, a_shape), "b": ints(rng, dtype, b_shape)},
                                        ops=[f"qnnx.{op.lower()}"], gone=[op], lsb=0, ref_lsb=1)
    node = next(n for n in qnnx.ir.to_proto(converted).graph.node if n.op_type == op.lower())
    assert {a.name: a.s for a in node.attribute}["compute"] == b"mlas"


def test_binary_per_axis_keeps_float_multipliers(rng):
    # ORT's QLinearAdd is per-tensor only; with per-axis qparams the conversion keeps compute="float"
    g = QDQ()
    a = g.dequantize(g.input("a", I8, (1, 3, 4)), np.array([0.1, 0.2, 0.3], np.float32), np.zeros(3, I8), axis=1)
    b = g.dequantize(g.input("b", I8, (1, 3, 4)), 0.05, I8(0))
    m = g.model(g.quantize(g.node("Add", [a, b]), 0.1, I8(0)))
    converted, report = convert_qdq(m)
    node = next(n for n in qnnx.ir.to_proto(converted).graph.node if n.op_type == "add")
    assert {a.name: a.s for a in node.attribute}["compute"] == b"float"


@pytest.mark.parametrize("op", ["Add", "Sub"])
def test_binary_negative_per_axis_on_different_axes(op, rng):
    g = QDQ()
    a = g.dequantize(g.input("a", I8, (1, 3, 3)), np.array([0.1, 0.2, 0.3], np.float32), np.zeros(3, I8), axis=1)
    b = g.dequantize(g.input("b", I8, (1, 3, 3)), np.array([0.1, 0.2, 0.3], np.float32), np.zeros(3, I8), axis=2)
    m = g.model(g.quantize(g.node(op, [a, b], name="binary"), 0.1, I8(0)))
    assert_left_in_float(m, "binary", op, "per-axis qparams on different axes")


@pytest.mark.parametrize("const", ["plain", "dequantized", "left_operand"])
def test_mul_by_positive_scalar_is_only_a_requantize(const, rng):
    # x * c, c > 0 constant: no integer op, the affine type's scale becomes sx*c, and the quantize
    # becomes one requantize. At most 1 LSB: ORT multiplies in float32 and then divides by the output
    # scale; the requantize multiplies once by float32(sx*c/sy) (type-only rescaling by a constant).
    g = QDQ()
    x = g.dequantize(g.input("x", I8, (3, 20)), 0.03, I8(4))
    c = g.const(np.float32(1.7)) if const != "dequantized" else g.weight(np.array(85, I8), 0.02, I8(0))
    y = g.node("Mul", [c, x] if const == "left_operand" else [x, c])
    m = g.model(g.quantize(y, 0.05, I8(-2)))
    converted, report, _ = compare_fq_to_int(m, {"x": ints(rng, I8, (3, 20))}, gone=["Mul", "qnnx.mul"], lsb=1)
    assert [t for t in op_types(converted) if t != "Identity"] == ["qnnx.requantize"]
    assert report.converted["Mul"] == 1


def test_mul_negative_two_consumers_with_different_qparams(rng):
    g = QDQ()
    a = g.dequantize(g.input("a", I8, (2, 4)), 0.03, I8(0))
    b = g.dequantize(g.input("b", I8, (2, 4)), 0.02, I8(0))
    y = g.node("Mul", [a, b], name="mul")
    m = g.model(g.quantize(y, 0.01, I8(0)), g.quantize(y, 0.02, I8(0)))
    assert_left_in_float(m, "mul", "Mul", "quantized with different qparams by its consumers")


def test_div_by_positive_scalar(rng):
    # x / c: the scale becomes sx/c; one requantize. At most 1 LSB (as for Mul by a constant).
    g = QDQ()
    x = g.dequantize(g.input("x", U8, (3, 20)), 0.03, U8(100))
    m = g.model(g.quantize(g.node("Div", [x, g.const(np.float32(2.9))]), 0.01, U8(128)))
    converted, _, _ = compare_fq_to_int(m, {"x": ints(rng, U8, (3, 20))}, gone=["Div"], lsb=1)
    assert [t for t in op_types(converted) if t != "Identity"] == ["qnnx.requantize"]


@pytest.mark.filterwarnings("ignore:divide by zero")
@pytest.mark.parametrize("divisor", ["tensor", "negative"])
def test_div_negative(divisor, rng):
    g = QDQ()
    x = g.dequantize(g.input("x", U8, (3, 4)), 0.03, U8(100))
    d = g.dequantize(g.input("d", U8, (3, 4)), 0.1, U8(0)) if divisor == "tensor" else g.const(np.float32(-2.0))
    m = g.model(g.quantize(g.node("Div", [x, d], name="div"), 0.01, U8(128)))
    assert_left_in_float(m, "div", "Div", "only division by a positive scalar constant has an integer rule")


# --------------------------------------------------------------------------- Concat, pooling, Softmax


def test_concat_equal_types_is_plain_concat(rng):
    # All inputs and the output in one affine type: a plain Concat of the integers. Bit-exact.
    g = QDQ()
    a = g.dequantize(g.input("a", U8, (1, 2, 3)), XS, XZ)
    b = g.dequantize(g.input("b", U8, (1, 4, 3)), XS, XZ)
    m = g.model(g.quantize(g.node("Concat", [a, b], axis=1), XS, XZ))
    converted, _, _ = compare_fq_to_int(m, {"a": ints(rng, U8, (1, 2, 3)), "b": ints(rng, U8, (1, 4, 3))},
                                        ops=["Concat"], gone=["qnnx.concat"])
    assert not any(t.startswith("qnnx.") for t in op_types(converted))


def test_concat_different_types(rng):
    # Inputs with other qparams (and dtypes): qnnx.concat requantizes each into the output's type with
    # compute="qdq", float32 dequantize then float32 quantize, as the QDQ graph does: bit-exact.
    g = QDQ()
    a = g.dequantize(g.input("a", U8, (2, 2, 5)), 0.03, U8(128))
    b = g.dequantize(g.input("b", I8, (2, 3, 5)), 0.05, I8(-3))
    c = g.dequantize(g.input("c", U8, (2, 1, 5)), 0.04, U8(100))
    m = g.model(g.quantize(g.node("Concat", [a, b, c], axis=1), 0.04, U8(100)))
    feeds = {"a": ints(rng, U8, (2, 2, 5)), "b": ints(rng, I8, (2, 3, 5)), "c": ints(rng, U8, (2, 1, 5))}
    compare_fq_to_int(m, feeds, ops=["qnnx.concat"], gone=["Concat"], lsb=0)


def test_concat_at_exact_ties_follows_the_qdq_graph():
    # YOLOv8's stride tensor as ORT quantizes it: strides 8/16/32 at 255 quanta of 8/255, 16/255, 32/255,
    # concatenated into 32/255. 16 -> 127.5 quanta exactly in real numbers; the QDQ graph dequantizes to
    # float32 16.0 and divides by float32(32/255), a little above 32/255: 127.49999 -> 127. One float32
    # multiplier (exactly 0.5) gives 128. compute="qdq" reproduces ORT bit for bit (fused and not).
    g = QDQ()
    parts = [g.dequantize(g.input(f"s{k}", U8, (1, 4)), k / 255, U8(0)) for k in (8, 16, 32)]
    m = g.model(g.quantize(g.node("Concat", parts, axis=1), 32 / 255, U8(0)))
    feeds = {f"s{k}": np.array([[255, 254, 1, 0]], U8) for k in (8, 16, 32)}
    converted, _, got = compare_fq_to_int(m, feeds, ops=["qnnx.concat"], gone=["Concat"])
    assert got[0][0, 4] == 127
    assert lsb_diff(got[0], run_ort(m, feeds, optimize=False)[0]) == 0


def test_concat_negative_per_axis_inputs(rng):
    # (ORT's optimizer fuses this group into QLinearConcat anyway and misreads the per-axis scales;
    # assert_left_in_float compares on ORT without graph optimizations.)
    g = QDQ()
    a = g.dequantize(g.input("a", U8, (1, 2, 3)), np.array([0.1, 0.2], np.float32), np.array([0, 1], U8), axis=1)
    b = g.dequantize(g.input("b", U8, (1, 2, 3)), 0.1, U8(0))
    m = g.model(g.quantize(g.node("Concat", [a, b], axis=1, name="concat"), 0.1, U8(0)))
    assert_left_in_float(m, "concat", "Concat", "per-axis concat inputs")


@pytest.mark.parametrize("attrs", [dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                                   dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
                                   dict(kernel_shape=[2, 2], strides=[2, 2])],
                         ids=["exclude_pad", "include_pad", "no_pad"])
def test_average_pool(attrs, rng):
    # qnnx.avg_pool: the window sum requantized by sx / (count * sy). At most 1 LSB: ORT fuses to
    # QLinearAveragePool, which averages in float and rounds its own way.
    g = QDQ()
    x = g.dequantize(g.input("x", U8, (2, 3, 7, 8)), 0.05, U8(128))
    m = g.model(g.quantize(g.node("AveragePool", [x], **attrs), 0.03, U8(125)))
    compare_fq_to_int(m, {"x": ints(rng, U8, (2, 3, 7, 8))}, ops=["qnnx.avg_pool"], gone=["AveragePool"], lsb=1)


def test_average_pool_negative_ceil_mode(rng):
    g = QDQ()
    x = g.dequantize(g.input("x", U8, (1, 2, 5, 5)), 0.05, U8(128))
    m = g.model(g.quantize(g.node("AveragePool", [x], name="pool", kernel_shape=[2, 2], strides=[2, 2],
                                  ceil_mode=1), 0.05, U8(128)))
    assert_left_in_float(m, "pool", "AveragePool", "ceil_mode=1")


@pytest.mark.parametrize("dtype", [U8, I8])
def test_global_average_pool(dtype, rng):
    # qnnx.global_avg_pool. At most 1 LSB (QLinearGlobalAveragePool averages in float).
    z = dtype(128 if dtype == U8 else 3)
    g = QDQ()
    x = g.dequantize(g.input("x", dtype, (2, 4, 5, 6)), 0.05, z)
    m = g.model(g.quantize(g.node("GlobalAveragePool", [x]), 0.01, z))
    compare_fq_to_int(m, {"x": ints(rng, dtype, (2, 4, 5, 6))}, ops=["qnnx.global_avg_pool"],
                      gone=["GlobalAveragePool"], lsb=1)


def test_global_average_pool_negative_dtype_change(rng):
    g = QDQ()
    x = g.dequantize(g.input("x", U8, (1, 2, 3, 3)), 0.05, U8(128))
    m = g.model(g.quantize(g.node("GlobalAveragePool", [x], name="gap"), 0.05, I8(0)))
    assert_left_in_float(m, "gap", "GlobalAveragePool", "pooling output must have the input's dtype")


@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("dtype", [U8, I8])
def test_softmax(axis, dtype, rng):
    # qnnx.softmax with ORT's QLinearSoftmax recipe (compute="mlas"): bit-identical to ORT where it fuses
    # the group (uint8); int8 groups run in float Softmax on x86-64 by default (ORT's int8 QDQ fusion is
    # off there): at most 1 LSB. The exact QDQ meaning (qnnx's reference): at most 1 LSB.
    z = dtype(128 if dtype == U8 else 0)
    g = QDQ()
    x = g.dequantize(g.input("x", dtype, (2, 5, 7)), 0.08, z)
    oz = U8(0) if dtype == U8 else I8(-128)
    m = g.model(g.quantize(g.node("Softmax", [x], axis=axis), 1 / 256, oz))
    converted, _, _ = compare_fq_to_int(m, {"x": ints(rng, dtype, (2, 5, 7))}, ops=["qnnx.softmax"], gone=["Softmax"],
                                        lsb=0 if dtype == U8 else 1, ref_lsb=1)
    node = next(n for n in qnnx.ir.to_proto(converted).graph.node if n.op_type == "softmax")
    assert {a.name: a.s for a in node.attribute}["compute"] == b"mlas"


def test_softmax_opset12_non_last_axis_converts_after_opset_conversion(rng):
    # Opset-12 Softmax on axis 1 normalizes over the flattened trailing dims. The boundary opset conversion
    # rewrites it as Flatten -> Softmax(-1) -> Reshape, which converts: <= 1 LSB (table vs float exp), compared
    # on ORT only (onnx.reference applies opset-13 semantics to Softmax-12).
    g = QDQ(opset=12)
    x = g.dequantize(g.input("x", U8, (2, 5, 7)), 0.08, U8(128))
    m = g.model(g.quantize(g.node("Softmax", [x], axis=1, name="softmax"), 1 / 256, U8(0)))
    converted, report = convert_qdq(m)
    assert report.left_in_float == [] and "qnnx.softmax" in op_types(converted)
    feeds = {"x": ints(rng, U8, (2, 5, 7))}
    assert lsb_diff(run_ref(qnnx.ir.to_proto(converted), feeds)[0],
                    run_ort(m, feeds)[0]) <= 1


# --------------------------------------------------------------------------- dequantize -> quantize


def test_dequantize_quantize_other_qparams_is_one_requantize(rng):
    # Bit-exact: the requantize computes what the pair does (compute="qdq": float32 dequantize, then
    # float32 quantize).
    g = QDQ()
    x = g.dequantize(g.input("x", I8, (4, 30)), 0.037, I8(-9))
    m = g.model(g.quantize(x, 0.05, U8(131)))
    converted, _, _ = compare_fq_to_int(m, {"x": ints(rng, I8, (4, 30))}, ops=["qnnx.requantize"])
    assert op_types(converted) == ["qnnx.requantize", "Identity"]
    assert next(n for n in converted.graph if n.op_type == "requantize").attributes["compute"].value == "qdq"


def test_dequantize_quantize_identical_qparams_disappears(rng):
    # Bit-exact: nothing left but the output Identity.
    g = QDQ()
    x = g.dequantize(g.input("x", I8, (4, 30)), 0.037, I8(-9))
    m = g.model(g.quantize(x, 0.037, I8(-9)))
    converted, _, _ = compare_fq_to_int(m, {"x": ints(rng, I8, (4, 30))})
    assert op_types(converted) == ["Identity"]


# --------------------------------------------------------------------------- strict, from_qdq, graph outputs


def _leftover_model():
    g = QDQ()
    x = g.dequantize(g.input("x", U8, (1, 2, 3, 4)), XS, XZ)
    y = g.node("Resize", [x, "", g.const(np.array([1, 1, 2, 2], np.float32))], mode="linear",
               name="resize_linear")
    r = g.node("Relu", [g.dequantize(g.quantize(y, XS, XZ), XS, XZ)])
    return g.model(g.quantize(r, XS, XZ))


def test_strict_raises_naming_the_float_op():
    with pytest.raises(qnnx.QnnxError, match=r"resize_linear \(Resize\): Resize mode 'linear'"):
        convert_qdq(_leftover_model(), strict=True)
    with pytest.raises(qnnx.QnnxError, match=r"resize_linear \(Resize\)"):
        qnnx.from_qdq(_leftover_model(), strict=True)


def test_from_qdq_metadata_lists_leftovers(rng):
    out = qnnx.from_qdq(_leftover_model())
    assert isinstance(out, onnx.ModelProto)
    meta = {p.key: p.value for p in out.metadata_props}
    assert re.fullmatch(r"resize_linear \(Resize\): Resize mode 'linear' interpolates.*", meta["qnnx.left_in_float"])
    assert "qnnx.clip" not in op_types(out) and "Clip" in op_types(out)  # the Relu after it was converted
    # The linear Resize stays in float exactly as in the QDQ model (bit-exact against qnnx's reference
    # on the QDQ model); ORT runs QDQ Resize on the uint8 values with its own rounding: at most 1 LSB.
    feeds = {"x": ints(rng, U8, (1, 2, 3, 4))}
    got = run_ref(out, feeds)[0]
    assert lsb_diff(got, run_ref(_leftover_model(), feeds)[0]) == 0
    assert lsb_diff(got, run_ort(_leftover_model(), feeds)[0]) <= 1

    g = QDQ()
    x = g.dequantize(g.input("x", U8, (2, 3)), XS, XZ)
    clean = qnnx.from_qdq(g.model(g.quantize(g.node("Relu", [x]), XS, XZ)))
    assert {p.key: p.value for p in clean.metadata_props}["qnnx.left_in_float"] == ""


def test_quantize_output_as_graph_output(rng):
    init = [numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.uint8(128), "z")]
    g = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), helper.make_node("Relu", ["xf"], ["r"]),
         helper.make_node("QuantizeLinear", ["r", "s", "z"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [4])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [4])], init)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    converted, report = convert_qdq(m)
    assert report.left_in_float == [] and [o.name for o in converted.graph.outputs] == ["y"]
    feeds = {"x": ints(rng, U8, (4,))}
    np.testing.assert_array_equal(run_ref(qnnx.ir.to_proto(converted), feeds)[0], run_ort(m, feeds)[0])


# --------------------------------------------------------------------------- a whole model


def _float_net() -> onnx.ModelProto:
    """Conv+Relu, Conv, SiLU (Sigmoid * x), residual Add, MaxPool, GlobalAveragePool, Flatten, MatMul."""
    rng = np.random.default_rng(0)
    weights = dict(w1=(8, 3, 3, 3), b1=(8,), w2=(8, 8, 3, 3), b2=(8,), wm=(8, 10))
    inits = [numpy_helper.from_array((rng.standard_normal(s) * (0.5 if n == "wm" else 0.2)).astype(np.float32), n)
             for n, s in weights.items()]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c2"], ["s2"]),
        helper.make_node("Mul", ["c2", "s2"], ["silu"]),
        helper.make_node("Add", ["silu", "r1"], ["res"]),
        helper.make_node("MaxPool", ["res"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["mp"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "wm"], ["y"]),
    ]
    g = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("activation", ["QInt8", "QUInt8"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_whole_model_quantized_by_onnxruntime(per_channel, activation, tmp_path):
    # quantize_static (QDQ, 8 random calibration samples), convert: nothing left in float, and the
    # dequantized output equal to ORT's execution of the QDQ model (max abs diff 0), also after
    # qnnx.lower on ORT. Exact here although Add/Mul/Sigmoid are only <= 1 LSB per op in general:
    # ORT fuses QLinearConv/QLinearMatMul (bit-exact), and the few add/mul/table off-by-ones the
    # per-op tests see do not occur on this net's values.
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Calibration(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(1)
            self.samples = iter([{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.samples, None)

    onnx.save(_float_net(), tmp_path / "float.onnx")
    quantize_static(tmp_path / "float.onnx", tmp_path / "qdq.onnx", Calibration(), quant_format=QuantFormat.QDQ,
                    per_channel=per_channel, activation_type=getattr(QuantType, activation),
                    weight_type=QuantType.QInt8)
    qdq = onnx.load(tmp_path / "qdq.onnx")
    converted, report = convert_qdq(qdq)
    assert report.left_in_float == []
    types = op_types(converted)
    assert {t for t in types if not t.startswith("qnnx.")} <= {"MaxPool", "Flatten"}
    for op in ("conv", "requantize", "lut", "mul", "add", "global_avg_pool", "matmul"):
        assert f"qnnx.{op}" in types, types
    assert types.count("qnnx.quantize") == 1 and types.count("qnnx.dequantize") == 1  # the graph's edges only
    lowered = qnnx.lower(converted)
    rng = np.random.default_rng(2)
    outputs = []
    for _ in range(6):
        feeds = {"x": (rng.standard_normal((1, 3, 8, 8)) * 1.5).astype(np.float32)}
        expected = run_ort(qdq, feeds)[0]
        got = run_ref(converted, feeds)[0]
        assert np.abs(got - expected).max() == 0
        assert np.abs(run_ort(lowered, feeds)[0] - expected).max() == 0
        outputs.append(got)
    assert len(np.unique(np.concatenate(outputs))) > 20  # not a degenerate output


def test_add_then_relu_or_clip_before_one_quantize_is_an_integer_add_and_clamp():
    """ORT's and qnnx's QDQ quantize after the activation: quantize(clip(a + b)) equals the integer
    clamp of quantize(a + b) to the quantized bounds (quantize is monotonic), so no float op stays."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    s, z = np.float32(0.05), np.uint8(128)
    inits = [numpy_helper.from_array(np.array(s), "s"), numpy_helper.from_array(np.array(z), "z"),
             numpy_helper.from_array(np.array(0.04, np.float32), "so"), numpy_helper.from_array(np.array(0, np.uint8), "zo"),
             numpy_helper.from_array(np.array(0.0, np.float32), "lo"), numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
    nodes = [helper.make_node("DequantizeLinear", ["a", "s", "z"], ["fa"]),
             helper.make_node("DequantizeLinear", ["b", "s", "z"], ["fb"]),
             helper.make_node("Add", ["fa", "fb"], ["sum"], name="add"),
             helper.make_node("Clip", ["sum", "lo", "hi"], ["c"], name="clip"),
             helper.make_node("QuantizeLinear", ["c", "so", "zo"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.UINT8, [1, 64]) for n in "ab"],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 64])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    canonical = qnnx.from_qdq(model, strict=True)
    assert {n.op_type for n in canonical.graph.node} <= {"add", "Clip", "Max", "Min", "requantize", "Cast"}
    rng = np.random.default_rng(0)
    feeds = {n: rng.integers(0, 256, (1, 64)).astype(np.uint8) for n in "ab"}
    want = onnx.reference.ReferenceEvaluator(model).run(None, feeds)[0].astype(int)
    got = qnnx.ReferenceEvaluator(canonical).run(None, feeds)[0].astype(int)
    assert np.abs(got - want).max() <= 1  # the integer add rounds once (fixed point), the float graph twice
