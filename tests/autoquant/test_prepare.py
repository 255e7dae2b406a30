"""Pre-quantization cleanup (qnnx.autoquant.prepare): opset conversion, constant folding,
BatchNormalization folding, dynamic shapes, naming, and never touching the caller's model.

Each transformed model is checked against the original on ONNX Runtime (float)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from float_graphs import Graph, conv_weight, run_ort
from onnx import numpy_helper

import qnnx
from qnnx import QnnxError, QuantConfig
from qnnx.autoquant.prepare import prepare
from qnnx.autoquant.refinements.sqnr_fallback import value_errors
from qnnx.ir import const_array

RNG = np.random.default_rng(11)


def _ops(model: ir.Model) -> list[str]:
    return [n.op_type for n in model.graph]


def _assert_same_outputs(original: onnx.ModelProto, prepared: ir.Model, feeds, rtol=1e-5, atol=1e-5):
    want, got = run_ort(original, feeds), run_ort(prepared, feeds)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        assert w.shape == g.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def test_opset_11_is_converted_to_13_and_computes_the_same():
    # Softmax changed meaning at 13 (opset 11 flattens to 2-D at `axis`), and Split/ReduceSum/Unsqueeze
    # moved attributes to inputs: the converter must rewrite all of them.
    g = Graph(opset=11)
    s = g.node("Softmax", [g.input("x", [2, 3, 5])], name="sm", axis=1)
    a, b = g.node("Split", [s], name="split", outputs=2, axis=2, split=[2, 3])
    r = g.node("ReduceSum", [b], name="rsum", axes=[2], keepdims=1)
    m = g.node("Mul", [a, r], name="mul")
    g.node("Unsqueeze", [m], name="unsq", axes=[0], out="y")
    model = g.model("y")
    p = prepare(model)
    assert p.opset_imports[""] == 13
    split = [n for n in p.graph if n.op_type == "Split"][0]
    assert "split" not in split.attributes and len(split.inputs) == 2
    for seed in range(2):
        x = np.random.default_rng(seed).normal(size=(2, 3, 5)).astype(np.float32)
        _assert_same_outputs(model, p, {"x": x}, rtol=1e-6, atol=1e-7)


def test_opset_13_and_above_is_kept():
    g = Graph(opset=19)
    g.node("Relu", [g.input("x", [2])], name="r", out="y")
    assert prepare(g.model("y")).opset_imports[""] == 19


def test_model_without_default_opset_is_refused():
    m = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []), opset_imports=[
        onnx.helper.make_opsetid("custom", 1)], ir_version=9)
    with pytest.raises(QnnxError, match="no default-domain opset import"):
        prepare(m)


def test_constant_nodes_and_constant_subgraphs_are_folded():
    g = Graph()
    w = g.node("Constant", [], name="wconst", value=numpy_helper.from_array(conv_weight(RNG, 4, 3)))
    two = g.node("Constant", [], name="two", value=numpy_helper.from_array(np.float32(2.0)))
    three = g.node("Constant", [], name="three", value=numpy_helper.from_array(np.float32(3.0)))
    five = g.node("Add", [two, three], name="five")
    c = g.node("Conv", [g.input("x", [1, 3, 6, 6]), w], name="conv", pads=[1, 1, 1, 1])
    g.node("Mul", [c, five], name="scale", out="y")
    model = g.model("y")
    p = prepare(model)
    assert sorted(_ops(p)) == ["Conv", "Mul"]
    conv = [n for n in p.graph if n.op_type == "Conv"][0]
    mul = [n for n in p.graph if n.op_type == "Mul"][0]
    assert conv.inputs[1].const_value is not None  # an initializer now
    k = [v for v in mul.inputs if v.const_value is not None]
    assert len(k) == 1 and float(k[0].const_value.numpy()) == 5.0
    _assert_same_outputs(model, p, {"x": RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)})


@pytest.mark.parametrize("dims", [[1, 3, 6, 6], ["N", 3, "H", "W"]])
def test_batchnorm_after_conv_is_folded(dims):
    c_out = 4
    g = Graph()
    c = g.node("Conv", [g.input("x", dims), g.const(conv_weight(RNG, c_out, 3), "w")], name="conv",
               pads=[1, 1, 1, 1])
    bn = [g.const(a.astype(np.float32)) for a in (RNG.uniform(0.5, 2, c_out), RNG.normal(size=c_out),
                                                 RNG.normal(size=c_out), RNG.uniform(0.5, 2, c_out))]
    g.node("BatchNormalization", [c, *bn], name="bn", epsilon=1e-5, out="y")
    model = g.model("y")
    p = prepare(model)
    assert _ops(p) == ["Conv"]
    conv = next(iter(p.graph))
    assert len(conv.inputs) == 3 and all(v.const_value is not None for v in conv.inputs[1:])
    _assert_same_outputs(model, p, {"x": RNG.standard_normal((2, 3, 5, 7) if "N" in dims else (1, 3, 6, 6))
                                    .astype(np.float32)}, rtol=1e-4, atol=1e-4)


def test_dynamic_batch_height_width_go_through_prepare_and_quantize():
    g = Graph()
    x = g.input("x", ["N", 3, "H", "W"])
    c = g.node("Conv", [x, g.const(conv_weight(RNG, 4, 3), "w"), g.const(np.full(4, 0.1, np.float32), "b")],
               name="conv", pads=[1, 1, 1, 1])
    r = g.node("Relu", [c], name="relu")
    p = g.node("GlobalAveragePool", [r], name="gap")
    g.node("Sigmoid", [p], name="sig", out="y")
    model = g.model("y")
    prepared = prepare(model)
    shape = prepared.graph.inputs[0].shape
    assert [isinstance(d, int) for d in shape] == [False, True, False, False]
    calib = [RNG.standard_normal(s).astype(np.float32) for s in [(1, 3, 6, 6), (2, 3, 8, 5), (3, 3, 4, 9)]]
    qm = qnnx.quantize(model, calib, QuantConfig(progress=False))
    assert qm.report.num_samples == 3 and all(d.quantized for d in qm.report.decisions)
    x = RNG.standard_normal((2, 3, 7, 11)).astype(np.float32)
    got = run_ort(qm.qdq, {"x": x})[0]
    want = run_ort(model, {"x": x})[0]
    assert got.shape == want.shape == (2, 4, 1, 1)
    np.testing.assert_allclose(got, want, atol=0.05)
    can = run_ort(qnnx.lower(qm.canonical), {"x": x})[0]  # the integer model takes other shapes too
    assert can.shape == (2, 4, 1, 1)


def _unnamed_model() -> onnx.ModelProto:
    g = Graph()
    x = g.input("x", [1, 3, 6, 6])
    c = g.node("Conv", [x, g.const(conv_weight(RNG, 4, 3), "w"), g.const(np.full(4, 0.1, np.float32), "b")],
               name="dup")
    r = g.node("Relu", [c], name="dup")
    s = g.node("Sigmoid", [r], name="")
    m = g.node("Mul", [r, s], name="")
    g.node("Tanh", [m], name="", out="y")
    return g.model("y")


def test_every_node_and_value_gets_a_unique_name():
    model = _unnamed_model()
    assert sum(1 for n in model.graph.node if not n.name) == 3  # the case under test
    p = prepare(model)
    nodes = [n.name for n in p.graph]
    assert len(nodes) == 5 and all(nodes) and len(set(nodes)) == len(nodes)
    values = [v.name for v in p.graph.inputs] + list(p.graph.initializers) + [o.name for n in p.graph
                                                                              for o in n.outputs]
    assert all(values) and len(set(values)) == len(values)


def test_the_input_model_object_and_file_are_not_modified(tmp_path):
    model = _unnamed_model()
    before = model.SerializeToString()
    prepare(model)
    assert model.SerializeToString() == before

    as_ir = ir.from_proto(model)
    ir_before = ir.to_proto(as_ir).SerializeToString()
    prepare(as_ir)
    assert ir.to_proto(as_ir).SerializeToString() == ir_before
    assert [n.name for n in as_ir.graph].count("") == 3

    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    file_before = path.read_bytes()
    p = prepare(path)
    p.graph.node(0).name = "changed"  # the result is independent of the file
    assert path.read_bytes() == file_before
    assert sorted(f.name for f in tmp_path.iterdir()) == ["m.onnx"]


def test_user_node_names_survive_prepare():
    g = Graph()
    c = g.node("Conv", [g.input("x", [1, 3, 6, 6]), g.const(conv_weight(RNG, 4, 3), "w"),
                        g.const(np.zeros(4, np.float32), "b")], name="my_conv")
    g.node("Relu", [c], name="my_relu", out="y")
    names = {n.name for n in prepare(g.model("y")).graph}
    assert {"my_conv", "my_relu"} <= names, names


@pytest.mark.parametrize("with_bias", [True, False])
def test_per_channel_mul_and_add_after_conv_fold_into_it(with_bias):
    """Both fold, into a biased Conv too: on PP-OCR rec over 9 calibration sets folding the affine
    blocks' shifts measured a 2.85-point mean drop against 4.30 without (and one integer add less each)."""
    g = Graph()
    ins = [g.input("x", [1, 3, 6, 6]), g.const(conv_weight(RNG, 4, 3), "w")]
    if with_bias:
        ins.append(g.const(RNG.normal(size=4).astype(np.float32), "b"))
    c = g.node("Conv", ins, name="conv", pads=[1, 1, 1, 1])
    m = g.node("Mul", [g.const(RNG.uniform(-2, 2, (4, 1, 1)).astype(np.float32), "a"), c], name="affine_mul")
    a = g.node("Add", [m, g.const(np.array([0.7], np.float32), "beta")], name="affine_add")
    g.node("Relu", [a], name="relu", out="y")  # a graph output keeps its producer (and name)
    model = g.model("y")
    p = prepare(model)
    assert _ops(p) == ["Conv", "Relu"]
    _assert_same_outputs(model, p, {"x": RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)}, rtol=1e-5, atol=1e-5)


def test_a_conv_that_absorbed_an_affine_op_takes_its_output_name_and_keeps_its_node_name():
    """The folded Conv computes what the Add after the Mul computed: its output carries that name, so a
    comparison by name with the original model pairs like with like; the node keeps the user's conv name."""
    g = Graph()
    c = g.node("Conv", [g.input("x", [1, 3, 6, 6]), g.const(conv_weight(RNG, 4, 3), "w")], name="conv",
               pads=[1, 1, 1, 1], out="conv_out")
    m = g.node("Mul", [c, g.const(RNG.uniform(0.5, 2, (4, 1, 1)).astype(np.float32), "a")], name="mul", out="mul_out")
    a = g.node("Add", [m, g.const(RNG.normal(size=(4, 1, 1)).astype(np.float32), "beta")], name="add", out="add_out")
    g.node("Relu", [a], name="relu", out="y")
    model = g.model("y")
    p = prepare(model)
    conv = next(n for n in p.graph if n.op_type == "Conv")
    assert (conv.name, conv.outputs[0].name) == ("conv", "add_out")
    feed = {"x": RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)}
    assert value_errors(ir.from_proto(model), p, ["add_out"], [feed])["add_out"].sqnr_db > 90  # float rounding only


def test_every_value_that_keeps_its_name_keeps_its_values():
    """Across prepare's rewrites together (BatchNorm fusion, affine folds, a shift folded into an unpadded
    conv, HardSwish spelled out, MatMul + bias Add -> Gemm), a name in both models means the same values:
    what ``qnnx compare`` relies on when it pairs a quantized model's tensors with the original's."""
    g = Graph()
    c1 = g.node("Conv", [g.input("x", [1, 3, 8, 8]), g.const(conv_weight(RNG, 4, 3), "w1")], name="c1",
                pads=[1, 1, 1, 1], out="c1_out")
    bn = [g.const(a.astype(np.float32)) for a in (RNG.uniform(0.5, 2, 4), RNG.normal(size=4),
                                                 RNG.normal(size=4), RNG.uniform(0.5, 2, 4))]
    b = g.node("BatchNormalization", [c1, *bn], name="bn", epsilon=1e-5, out="bn_out")
    m = g.node("Mul", [b, g.const(RNG.uniform(0.5, 2, (4, 1, 1)).astype(np.float32))], name="scale", out="scale_out")
    a = g.node("Add", [m, g.const(RNG.normal(size=(4, 1, 1)).astype(np.float32))], name="shift", out="shift_out")
    h = g.node("HardSwish", [a], name="hswish", out="hswish_out")
    s2 = g.node("Add", [h, g.const(RNG.normal(size=(1, 4, 1, 1)).astype(np.float32))], name="pre", out="pre_out")
    c2 = g.node("Conv", [s2, g.const(conv_weight(RNG, 6, 4, k=1), "w2")], name="c2", out="c2_out")
    f = g.node("Flatten", [g.node("GlobalAveragePool", [c2], name="gap", out="gap_out")], name="flat", out="flat_out")
    mm = g.node("MatMul", [f, g.const((RNG.standard_normal((6, 5)) * 0.3).astype(np.float32))], name="fc",
                out="fc_out")
    g.node("Add", [mm, g.const(RNG.normal(size=5).astype(np.float32))], name="fc_bias", out="y")
    model = g.model("y")
    p = prepare(model)
    assert "BatchNormalization" not in _ops(p) and "Gemm" in _ops(p)  # the rewrites did run
    shared = sorted({o.name for n in ir.from_proto(model).graph for o in n.outputs}
                    & {o.name for n in p.graph for o in n.outputs})
    feeds = [{"x": RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(2)]
    errors = value_errors(ir.from_proto(model), p, shared, feeds)
    worst = min(errors.values(), key=lambda e: e.sqnr_db)
    assert worst.sqnr_db > 90, f"{worst.name} keeps its name but not its values ({worst.sqnr_db:.1f} dB)"


@pytest.mark.parametrize("group, shift_shape, k, attrs, shift_first", [
    (1, (), 1, {}, False), (1, (1, 6, 1, 1), 1, {}, True), (3, (6, 1, 1), 1, {}, False),
    (6, (1,), 1, {}, True), (6, (1, 6, 1, 1), 3, {}, False), (1, (6, 1, 1), 3, {"strides": [2, 2]}, True),
    (2, (), 2, {"dilations": [2, 2]}, False), (1, (1, 6, 1, 1), 3, {"auto_pad": "VALID"}, False)])
def test_a_shift_before_an_unpadded_conv_folds_into_its_bias(group, shift_shape, k, attrs, shift_first):
    """``Add(x, c) -> Conv`` without padding: the conv reads x, its bias takes sum(W * c) per output
    (within the output's group, over the whole kernel); scalar and per-input-channel shifts on either
    Add input; dense, grouped and depthwise convs; k x k kernels with strides, dilations, VALID."""
    g = Graph()
    x = g.input("x", [1, 6, 7, 7])
    shift = g.const(RNG.normal(size=shift_shape).astype(np.float32), "shift")
    a = g.node("Add", [shift, x] if shift_first else [x, shift], name="shift_add")
    w = RNG.normal(size=(12, 6 // group, k, k)).astype(np.float32)
    g.node("Conv", [a, g.const(w, "w"), g.const(RNG.normal(size=12).astype(np.float32), "b")], name="pw",
           group=group, out="y", **attrs)
    model = g.model("y")
    p = prepare(model)
    assert _ops(p) == ["Conv"]
    _assert_same_outputs(model, p, {"x": RNG.standard_normal((1, 6, 7, 7)).astype(np.float32)}, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["padded", "same_upper", "second_reader", "spatial_shift", "broadcasts_x"])
def test_a_shift_stays_where_the_conv_would_see_it_differently(case):
    """Padding taps read 0, not the shift (explicit pads or auto_pad); a second reader needs the shifted
    value; a shift that varies over space is no per-channel constant; an Add that broadcasts x to more
    channels is what the conv's weights expect, not x."""
    g = Graph()
    x = g.input("x", [1, 1 if case == "broadcasts_x" else 4, 5, 5])
    shift = RNG.normal(size={"spatial_shift": (1, 1, 5, 5), "broadcasts_x": (1, 4, 1, 1)}.get(case, (1,)))
    a = g.node("Add", [x, g.const(shift.astype(np.float32), "shift")], name="shift_add")
    pads = {"pads": [1, 1, 1, 1]} if case == "padded" else {"auto_pad": "SAME_UPPER"} if case == "same_upper" else {}
    conv = g.node("Conv", [a, g.const(conv_weight(RNG, 4, 4), "w")], name="conv", **pads)
    outs = ["y"]
    if case == "second_reader":
        g.node("Relu", [a], name="other", out="z")
        outs.append("z")
    g.node("Identity", [conv], name="id", out="y")
    model = g.model(*outs)
    p = prepare(model)
    assert "Add" in _ops(p)
    shape = (1, 1 if case == "broadcasts_x" else 4, 5, 5)
    _assert_same_outputs(model, p, {"x": RNG.standard_normal(shape).astype(np.float32)}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["two_consumers", "spatial_constant"])
def test_affine_ops_that_are_not_per_output_channel_stay(case):
    g = Graph()
    c = g.node("Conv", [g.input("x", [1, 3, 6, 6]), g.const(conv_weight(RNG, 4, 3), "w")], name="conv",
               pads=[1, 1, 1, 1])
    if case == "spatial_constant":  # varies along W: not a per-channel scale
        k = g.const(RNG.uniform(0.5, 2, (1, 1, 1, 6)).astype(np.float32), "k")
    else:
        k = g.const(np.array(2.0, np.float32), "k")
    m = g.node("Mul", [c, k], name="mul")
    outs = ["y"]
    if case == "two_consumers":
        g.node("Relu", [c], name="other", out="z")
        outs.append("z")
    g.node("Identity", [m], name="id", out="y")
    model = g.model(*outs)
    p = prepare(model)
    assert "Mul" in _ops(p)
    _assert_same_outputs(model, p, {"x": RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)})


def test_matmul_with_a_bias_add_on_2d_input_becomes_gemm():
    g = Graph()
    mm = g.node("MatMul", [g.input("x", [2, 8]), g.const(RNG.standard_normal((8, 3)).astype(np.float32), "w")],
                name="mm")
    g.node("Add", [mm, g.const(RNG.standard_normal(3).astype(np.float32), "b")], name="bias", out="y")
    model = g.model("y")
    p = prepare(model)
    assert _ops(p) == ["Gemm"] and [v.name for v in p.graph.outputs] == ["y"]
    assert "b" not in p.graph.initializers  # the float bias moved into a Gemm bias, nothing left unused
    _assert_same_outputs(model, p, {"x": RNG.standard_normal((2, 8)).astype(np.float32)})


def test_matmul_on_3d_input_keeps_its_add():
    g = Graph()
    mm = g.node("MatMul", [g.input("x", [1, 2, 8]), g.const(RNG.standard_normal((8, 3)).astype(np.float32), "w")],
                name="mm")
    g.node("Add", [mm, g.const(RNG.standard_normal(3).astype(np.float32), "b")], name="bias", out="y")
    assert _ops(prepare(g.model("y"))) == ["MatMul", "Add"]


def test_conv_transpose_bias_add_and_the_batchnorm_behind_it_fold_into_it():
    g = Graph()
    ct = g.node("ConvTranspose", [g.input("x", [1, 3, 5, 5]),
                                  g.const((RNG.standard_normal((3, 4, 2, 2)) * 0.3).astype(np.float32), "w")],
                name="up", strides=[2, 2])
    a = g.node("Add", [ct, g.const(RNG.normal(size=(1, 4, 1, 1)).astype(np.float32), "b")], name="bias")
    bn = [g.const(v.astype(np.float32)) for v in (RNG.uniform(0.5, 2, 4), RNG.normal(size=4), RNG.normal(size=4),
                                                  RNG.uniform(0.5, 2, 4))]
    n = g.node("BatchNormalization", [a, *bn], name="bn", epsilon=1e-5)
    g.node("Relu", [n], name="relu", out="y")
    model = g.model("y")
    p = prepare(model)
    assert _ops(p) == ["ConvTranspose", "Relu"]
    _assert_same_outputs(model, p, {"x": RNG.standard_normal((1, 3, 5, 5)).astype(np.float32)}, rtol=1e-4, atol=1e-4)


def _spelled_out_layer_norm(g: Graph, x: str, width: int, *, square: str = "Pow", axes=(-1,), eps=1e-5,
                            scale=None, bias=None, name: str = "ln") -> str:
    """Paddle's / old exporters' LayerNorm in primitive ops (ReduceMean with an axes attribute)."""
    mean = g.node("ReduceMean", [x], name=f"{name}_mean", axes=list(axes))
    d = g.node("Sub", [x, mean], name=f"{name}_sub")
    sq = (g.node("Pow", [d, g.const(np.array(2.0, np.float32))], name=f"{name}_pow") if square == "Pow"
          else g.node("Mul", [d, d], name=f"{name}_sq"))
    var = g.node("ReduceMean", [sq], name=f"{name}_var", axes=list(axes))
    std = g.node("Sqrt", [g.node("Add", [var, g.const(np.array(eps, np.float32))], name=f"{name}_eps")],
                 name=f"{name}_sqrt")
    n = g.node("Div", [d, std], name=f"{name}_div")
    s = scale if scale is not None else RNG.uniform(0.5, 1.5, width).astype(np.float32)
    b = bias if bias is not None else RNG.normal(size=width).astype(np.float32)
    return g.node("Add", [g.node("Mul", [n, g.const(s)], name=f"{name}_scale"), g.const(b)], name=f"{name}_bias")


@pytest.mark.parametrize("square", ["Pow", "Mul"])
def test_spelled_out_layer_norm_is_fused_and_the_opset_raised_to_17(square):
    g = Graph(opset=12)
    x = g.input("x", [2, 5, 8])
    g.node("Relu", [_spelled_out_layer_norm(g, x, 8, square=square)], name="relu", out="y")
    model = g.model("y")
    p = prepare(model)
    assert p.opset_imports[""] == 17
    assert _ops(p) == ["LayerNormalization", "Relu"]
    ln = p.graph.node(0)
    assert ln.attributes["axis"].value == -1 and ln.attributes["epsilon"].value == pytest.approx(1e-5)
    _assert_same_outputs(model, p, {"x": RNG.normal(size=(2, 5, 8)).astype(np.float32) * 3})


def test_layer_norm_fusion_broadcasts_a_scalar_scale():
    g = Graph(opset=17)
    x = g.input("x", [2, 3, 6])
    _spelled_out_layer_norm(g, x, 6, scale=np.array([1.7], np.float32), name="y_ln")
    model = g.model(g.nodes[-1].output[0])
    p = prepare(model)
    assert _ops(p) == ["LayerNormalization"]
    assert p.graph.node(0).inputs[1].const_value.numpy().shape == (6,)
    _assert_same_outputs(model, p, {"x": RNG.normal(size=(2, 3, 6)).astype(np.float32)})


@pytest.mark.parametrize("axes", [(1,), (1, 2)])
def test_a_mean_over_other_axes_is_not_a_layer_norm(axes):
    g = Graph(opset=13)
    x = g.input("x", [2, 4, 4])
    _spelled_out_layer_norm(g, x, 4, axes=axes)
    model = g.model(g.nodes[-1].output[0])
    p = prepare(model)
    assert "LayerNormalization" not in _ops(p) and p.opset_imports[""] == 13  # nothing fused: opset untouched
    _assert_same_outputs(model, p, {"x": RNG.normal(size=(2, 4, 4)).astype(np.float32)})


def test_fused_layer_norm_input_stays_float_when_quantized():
    # The normalization rule (autoquant.normalization) now sees the LayerNorm: its variance and
    # var + eps are no longer quantized, and the residual Add feeding it stays float.
    g = Graph(opset=12)
    x = g.input("x", [1, 6, 8])
    mm = g.node("MatMul", [x, g.const(RNG.normal(size=(8, 8)).astype(np.float32) * 0.3)], name="mm")
    r = g.node("Add", [mm, x], name="residual")
    g.node("MatMul", [_spelled_out_layer_norm(g, r, 8), g.const(RNG.normal(size=(8, 4)).astype(np.float32))],
           name="head", out="y")
    calib = [RNG.normal(size=(1, 6, 8)).astype(np.float32) for _ in range(4)]
    q = qnnx.quantize(g.model("y"), calib, QuantConfig(progress=False))
    d = {x.node: x for x in q.report.decisions}
    assert not d["residual"].quantized and "LayerNormalization" in d["residual"].reason
    assert d["head"].quantized
    quantized_inputs = {n.inputs[0].name for n in q.qdq.graph if n.op_type == "QuantizeLinear"}
    assert not any("var" in v or "eps" in v for v in quantized_inputs)


def _hard_swish_model(opset=14, name="hs", output=False):
    g = Graph(opset=opset)
    x = g.input("x", [1, 4, 8, 8])
    c1 = g.node("Conv", [x, g.const(conv_weight(RNG, 8, 4), "w1")], name="conv1", pads=[1, 1, 1, 1])
    if output:
        g.node("HardSwish", [c1], name=name, out="y")
    else:
        hs = g.node("HardSwish", [c1], name=name, out="hs_out")
        g.node("Conv", [hs, g.const(conv_weight(RNG, 4, 8), "w2")], name="conv2", pads=[1, 1, 1, 1], out="y")
    return g.model("y")


@pytest.mark.parametrize("opset,output", [(14, False), (17, False), (14, True)])
def test_hard_swish_is_spelled_out_as_onnx_runtime_runs_it_in_integers(opset, output):
    model = _hard_swish_model(opset, output=output)
    p = prepare(model)
    ops = _ops(p)
    assert "HardSwish" not in ops and ops[1:5] == ["Add", "Clip", "Mul", "Div"]
    assert p.graph.outputs[0].name == "y"  # a graph output keeps its name
    div = p.graph.node(4)
    assert div.name == "hs" and const_array(div.inputs[1]) == 6.0  # the user's node name follows the output
    add, clip = p.graph.node(1), p.graph.node(2)
    assert const_array(add.inputs[1]) == 3.0 and [float(const_array(v)) for v in clip.inputs[1:]] == [0.0, 6.0]
    feeds = {"x": (RNG.normal(size=(1, 4, 8, 8)) * 3).astype(np.float32)}  # both knees and both flat parts
    _assert_same_outputs(model, p, feeds)  # float ulps apart: x * (x + 3) / 6 against x * (x / 6 + 0.5)


@pytest.mark.parametrize("excluded", [dict(exclude_nodes=("hs",)), dict(exclude_op_types=("HardSwish",))])
def test_an_excluded_hard_swish_stays_whole(excluded):
    p = prepare(_hard_swish_model(), **excluded)
    assert _ops(p) == ["Conv", "HardSwish", "Conv"]


def test_spelled_out_hard_swish_quantizes_as_integer_add_and_mul():
    # the Add and Mul are quantized patterns, the / 6 a rescaled DequantizeLinear: no float op is left
    # between the convs; excluding the HardSwish keeps it float and whole
    calib = [RNG.normal(size=(1, 4, 8, 8)).astype(np.float32) for _ in range(4)]
    q = qnnx.quantize(_hard_swish_model(), calib, QuantConfig(progress=False, speed_fallback="off"))
    patterns = {d.node: d.pattern for d in q.report.decisions if d.quantized}
    assert "Div" not in [n.op_type for n in q.qdq.graph]
    assert patterns["hs"] == "scale" and sorted(patterns.values()).count("binary") == 2
    kept = qnnx.quantize(_hard_swish_model(), calib, QuantConfig(progress=False, speed_fallback="off",
                                                                  exclude_nodes=("hs",)))
    assert [d for d in kept.report.decisions if d.node == "hs"][0].reason == "excluded by the user"
    assert "HardSwish" in [n.op_type for n in kept.qdq.graph]


def _wrongly_declared_reshape(opset: int) -> onnx.ModelProto:
    """x (2 x T) -> Transpose -> MatMul -> Reshape to a shape computed from Shape(x): (T, 1, 3), while
    the file declares the output (1, T): a wrong declaration, as real exporters leave."""
    h = onnx.helper
    nodes = [
        h.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
        h.make_node("MatMul", ["xt", "w"], ["t"]),
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("Gather", ["s", "one"], ["steps"], axis=0),
        h.make_node("Unsqueeze", ["steps", "zero"], ["steps1"]),
        h.make_node("Concat", ["steps1", "mid"], ["shape"], axis=0),
        h.make_node("Reshape", ["t", "shape"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3) / 5 - 0.4, "w"),
             numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1, 3], np.int64), "mid")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, "T"])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, "T"])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [13, 17])
def test_a_wrongly_declared_output_shape_does_not_reshape_what_the_model_computes(opset):
    """onnxscript's materialize-reshape rule would replace the computed shape by the declared one
    (flattening the output; at opset 13 with an ``allowzero`` the runtime refuses): qnnx leaves it out."""
    model = _wrongly_declared_reshape(opset)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5)).astype(np.float32)
    got = run_ort(prepare(ir.from_proto(model)), {"x": x})[0]
    want = run_ort(model, {"x": x})[0]
    assert got.shape == want.shape == (5, 1, 3)
    np.testing.assert_array_equal(got, want)
    q = qnnx.quantize(model, [{"x": rng.standard_normal((2, 5)).astype(np.float32)} for _ in range(4)],
                      QuantConfig(progress=False, speed_fallback="off"))
    assert q.report.records["prepare"].not_applied == ()
    assert run_ort(q.qdq, {"x": x})[0].shape == (5, 1, 3)
