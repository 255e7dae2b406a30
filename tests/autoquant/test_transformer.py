"""Transformer building blocks in automatic quantization: a linear layer's bias in the accumulator,
the erf GELU as one unit, normalization inputs kept float, float readers of float values, and
SmoothQuant smoothing of LayerNorm outputs (exact in float, better once quantized).

Small synthetic graphs shaped like one BERT layer (token x hidden activations with one outlier
channel, as the residual stream of a real transformer has)."""

from __future__ import annotations

from functools import cache

import numpy as np
import onnx_ir as ir
import pytest
from float_graphs import Graph, nodes_by_name, qdq_of, run_ort

import qnnx
from qnnx import QnnxError, QuantConfig
from qnnx.autoquant.patterns import MatchFail, patterns_for
from qnnx.autoquant.plan import plan
from qnnx.autoquant.prepare import prepare
from qnnx.autoquant.refinements.sqnr_fallback import value_errors
from qnnx.autoquant.smoothing import smooth, smoothing_sites
from qnnx.data import CalibrationData, input_specs

RNG = np.random.default_rng(11)
H, F, T = 16, 32, 6  # hidden, FFN width, tokens
OUTLIER = 3  # the hidden channel carrying large values


def _w(rows, cols, std=0.3):
    return (RNG.standard_normal((rows, cols)) * std).astype(np.float32)


def _gelu(g: Graph, x: str, half_first: bool = False, prefix: str = "gelu") -> str:
    """The erf GELU as torch exports it before opset 20 (``half_first``: x * 0.5 computed first)."""
    d = g.node("Div", [x, g.const(np.float32(np.sqrt(2.0)))], name=f"{prefix}_div")
    e = g.node("Erf", [d], name=f"{prefix}_erf")
    a = g.node("Add", [e, g.const(np.float32(1.0))], name=f"{prefix}_add")
    if half_first:
        h = g.node("Mul", [x, g.const(np.float32(0.5))], name=f"{prefix}_half")
        return g.node("Mul", [h, a], name=f"{prefix}_mul")
    m = g.node("Mul", [x, a], name=f"{prefix}_mul")
    return g.node("Mul", [m, g.const(np.float32(0.5))], name=f"{prefix}_half")


@cache
def _layer(half_first: bool = False):
    """(Built once: the weights are drawn at random.) x -> LN -> linear(+bias) -> GELU -> linear(+bias) -> + LN output -> LN -> y (a post-LN FFN block)."""
    g = Graph(opset=17)
    x = g.input("x", [1, T, H])
    ones, zeros = np.ones(H, np.float32), np.zeros(H, np.float32)
    n1 = g.node("LayerNormalization", [x, g.const(ones, "g1"), g.const(zeros, "b1")], name="ln1", axis=-1,
                out="n1")
    u = g.node("MatMul", [n1, g.const(_w(H, F), "w_up")], name="up", out="up_mm")
    ub = g.node("Add", [u, g.const(RNG.normal(0, .1, F).astype(np.float32), "b_up")], name="up_bias", out="up_b")
    act = _gelu(g, ub, half_first)
    d = g.node("MatMul", [act, g.const(_w(F, H), "w_down")], name="down", out="down_mm")
    db = g.node("Add", [g.const(RNG.normal(0, .1, H).astype(np.float32), "b_down"), d], name="down_bias",
                out="down_b")
    r = g.node("Add", [db, n1], name="residual", out="res")
    g.node("LayerNormalization", [r, g.const(ones, "g2"), g.const(zeros, "b2")], name="ln2", axis=-1, out="y")
    return g.model("y")


def _tokens(n, seed=5, outlier=30.0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((1, T, H)).astype(np.float32)
        x[..., OUTLIER] *= outlier
        out.append({"x": x})
    return out


def _decisions(model):
    return {d.node: d for d in plan(prepare(model), QuantConfig(progress=False)).decisions}


def _cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


# --------------------------------------------------------------------------- linear layer bias


def test_matmul_absorbs_its_bias_add_into_the_accumulator():
    p = prepare(_layer())
    m = patterns_for("MatMul")[0].match(nodes_by_name(p)["up"])
    assert [n.name for n in m.nodes] == ["up", "up_bias"] and m.bias.name == "b_up"
    assert [t.value.name for t in m.outputs] == ["up_b"]
    qm = qnnx.quantize(_layer(), _tokens(4), QuantConfig(progress=False, smoothing_alpha=None))
    nodes = nodes_by_name(qm.qdq)
    assert all(u.node.op_type != "QuantizeLinear" for u in nodes["up"].outputs[0].uses())  # no Q before the bias
    bias_dq = nodes["up_bias"].inputs[1].producer()
    assert bias_dq.op_type == "DequantizeLinear" and bias_dq.inputs[0].dtype == ir.DataType.INT32
    q, scale = bias_dq.inputs[0].const_value.numpy(), bias_dq.inputs[1].const_value.numpy()
    b = qm.qdq.graph.initializers.get("b_up")
    assert b is None  # the float bias is replaced by its int32 form
    x_scale = qdq_of(qm.qdq, "n1")[0].inputs[1].const_value.numpy()
    w_scale = nodes["up"].inputs[1].producer().inputs[1].const_value.numpy()
    np.testing.assert_allclose(scale, x_scale * w_scale, rtol=1e-6)  # the accumulator's scale, per column
    assert q.dtype == np.int32 and q.shape == (F,)


@pytest.mark.parametrize("bias", [np.zeros((1, F), np.float32), None], ids=["2-D constant", "activation"])
def test_matmul_leaves_other_adds_alone(bias):
    g = Graph()
    x = g.input("x", [2, H])
    mm = g.node("MatMul", [x, g.const(_w(H, F))], name="mm")
    other = g.const(bias) if bias is not None else g.input("z", [2, F])
    g.node("Add", [mm, other], name="add", out="y")
    m = patterns_for("MatMul")[0].match(nodes_by_name(ir.from_proto(g.model("y")))["mm"])
    assert [n.name for n in m.nodes] == ["mm"] and m.bias is None


# --------------------------------------------------------------------------- erf GELU


@pytest.mark.parametrize("half_first", [False, True], ids=["x*(1+erf)*0.5", "(x*0.5)*(1+erf)"])
def test_erf_gelu_is_one_elementwise_unit(half_first):
    d = _decisions(_layer(half_first))
    gelu = [v for v in d.values() if v.pattern == "gelu"]
    assert len(gelu) == 1 and gelu[0].quantized
    p = prepare(_layer(half_first))
    m = next(m for m in plan(p, QuantConfig(progress=False)).matches if m.pattern == "gelu")
    assert len(m.nodes) == 5
    assert [t.value.name for t in m.inputs] == ["up_b"] and [t.value.name for t in m.outputs] == \
        [m.nodes[-1].outputs[0].name]
    qm = qnnx.quantize(_layer(half_first), _tokens(4), QuantConfig(progress=False, smoothing_alpha=None))
    inside = {n.name for n in m.nodes}
    # no requantization inside the activation: no QuantizeLinear reads a value computed inside it but the last
    qs = [n for n in qm.qdq.graph if n.op_type == "QuantizeLinear" and n.inputs[0].producer() is not None
          and n.inputs[0].producer().name in inside]
    assert [q.inputs[0].producer().name for q in qs] == [m.nodes[-1].name]


def test_div_by_another_constant_is_not_a_gelu():
    g = Graph()
    x = g.input("x", [2, 4])
    d = g.node("Div", [x, g.const(np.float32(2.0))], name="div")
    g.node("Erf", [d], name="erf", out="y")
    node = nodes_by_name(ir.from_proto(g.model("y")))["div"]
    gelu = next(p for p in patterns_for("Div") if p.name == "gelu")
    m = gelu.match(node)
    assert isinstance(m, MatchFail) and "x / sqrt2" in m.reason


# --------------------------------------------------------------------------- normalization inputs


def test_values_read_by_layernorm_stay_float():
    d = _decisions(_layer())
    assert not d["residual"].quantized and "feeds LayerNormalization 'ln2'" in d["residual"].reason
    assert "down_bias" not in d  # part of the linear layer "down"
    assert d["down"].quantized and "float output (feeds LayerNormalization 'ln2')" in d["down"].reason
    qm = qnnx.quantize(_layer(), _tokens(4), QuantConfig(progress=False, smoothing_alpha=None))
    nodes = nodes_by_name(qm.qdq)
    assert nodes["ln2"].inputs[0].producer().name == "residual"  # no DequantizeLinear in front of ln2
    assert not [n for n in qm.qdq.graph if n.op_type == "QuantizeLinear" and n.inputs[0].name in
                ("res", "down_b", "down_mm")]
    qdq_of(qm.qdq, "up_b")  # the linear layer feeding the GELU still ends in a quantize


def test_float_readers_of_a_float_value_keep_it_exact():
    """ln1's output feeds the up-projection (quantized) and the residual Add (float): the Add reads
    the float value, only the MatMul reads the DequantizeLinear."""
    qm = qnnx.quantize(_layer(), _tokens(4), QuantConfig(progress=False, smoothing_alpha=None))
    nodes = nodes_by_name(qm.qdq)
    assert nodes["residual"].inputs[1].name == "n1" and nodes["residual"].inputs[1].producer().name == "ln1"
    assert nodes["up"].inputs[0].producer().op_type == "DequantizeLinear"


# --------------------------------------------------------------------------- smoothing


def test_smoothing_is_exact_in_float_and_moves_the_outlier_into_the_weights():
    calib = _tokens(8)
    model = prepare(_layer())
    assert [s.absorber.name for s in smoothing_sites(model.graph)] == ["ln1"]
    ref = [run_ort(model, f)[0] for f in calib]
    data = CalibrationData.from_source(calib).bind(input_specs(model))
    smoothed = smooth(model, data, QuantConfig(progress=False).refinements.smoothing_alpha)
    nodes = nodes_by_name(smoothed)
    assert nodes["residual"].inputs[1].name == "n1" and nodes["residual"].inputs[1].producer().op_type == "Mul"
    for f, r in zip(calib, ref):
        np.testing.assert_allclose(run_ort(smoothed, f)[0], r, rtol=1e-4, atol=1e-4)  # float rounding only
    gamma = nodes["ln1"].inputs[1].const_value.numpy()
    assert np.argmin(gamma) == OUTLIER  # the outlier channel is divided the most


@cache
def _ln_linear():
    """x -> LN (gamma 20x larger on one channel: an outlier channel in its output) -> linear -> LN -> y
    (the last LN keeps the linear layer's output float, so y shows the error of its quantized input)."""
    g = Graph(opset=17)
    gamma = np.full(H, 0.5, np.float32)
    gamma[OUTLIER] = 10.0
    n = g.node("LayerNormalization", [g.input("x", [1, T, H]), g.const(gamma), g.const(np.zeros(H, np.float32))],
               name="ln", axis=-1)
    mm = g.node("MatMul", [n, g.const(_w(H, F))], name="mm")
    b = g.node("Add", [mm, g.const(np.zeros(F, np.float32))], name="bias")
    g.node("LayerNormalization", [b, g.const(np.ones(F, np.float32))], name="ln_out", axis=-1, out="y")
    return g.model("y")


def _sqnr_db(ref, got):
    ref, got = np.concatenate([r.ravel() for r in ref]), np.concatenate([q.ravel() for q in got])
    return 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((ref - got).astype(np.float64) ** 2))


def test_smoothing_improves_the_quantized_layer():
    calib, ev = _tokens(16, outlier=1.0), _tokens(8, seed=9, outlier=1.0)
    ref = [run_ort(_ln_linear(), f)[0] for f in ev]
    sqnr = {}
    for alpha in (None, 0.5):
        qm = qnnx.quantize(_ln_linear(), calib, QuantConfig(progress=False, smoothing_alpha=alpha))
        sqnr[alpha] = _sqnr_db(ref, [run_ort(qm.qdq, f)[0] for f in ev])
    assert sqnr[0.5] > sqnr[None] + 6, sqnr  # at least one more bit's worth


def test_smoothing_reads_a_one_shot_iterator_once():
    calib = _tokens(6)
    qm = qnnx.quantize(_layer(), iter(calib), QuantConfig(progress=False))
    assert qm.report.num_samples == 6


@pytest.mark.parametrize("alpha", [0.0, 1.5, -0.5])
def test_smoothing_alpha_is_validated(alpha):
    with pytest.raises(QnnxError, match="smoothing_alpha"):
        QuantConfig(smoothing_alpha=alpha)


HEADS = 2


@cache
def _attention_layer(scrambled: bool = False):
    """(Built once.) x -> LN -> Q/K/V (two heads) -> softmax(q k^T) v -> output projection -> + LN output ->
    LN -> FFN (GELU, one channel of it an outlier) -> y. ``scrambled``: the value heads are split as
    (dim, head) but merged back as (head, dim), so the context's channels are not the value projection's."""
    g = Graph(opset=17)
    rng = np.random.default_rng(7)  # its own draws: the same weights whichever test builds it first

    def _w(rows, cols):
        return (rng.standard_normal((rows, cols)) * 0.3).astype(np.float32)

    def shape(dims):
        return g.const(np.array(dims, np.int64))

    d = H // HEADS
    ones, zeros = np.ones(H, np.float32), np.zeros(H, np.float32)
    n1 = g.node("LayerNormalization", [g.input("x", [1, T, H]), g.const(ones), g.const(zeros)], name="ln1",
                axis=-1, out="n1")
    proj = {k: g.node("Add", [g.node("MatMul", [n1, g.const(_w(H, H))], name=k), g.const(_w(1, H)[0])],
                      name=f"{k}_bias") for k in ("q", "k", "v")}
    heads = {k: g.node("Transpose", [g.node("Reshape", [proj[k], shape([1, T, HEADS, d])])], perm=[0, 2, 1, 3])
             for k in ("q", "k")}
    if scrambled:
        heads["v"] = g.node("Transpose", [g.node("Reshape", [proj["v"], shape([1, T, d, HEADS])])], perm=[0, 3, 1, 2])
    else:
        heads["v"] = g.node("Transpose", [g.node("Reshape", [proj["v"], shape([1, T, HEADS, d])])], perm=[0, 2, 1, 3])
    scores = g.node("MatMul", [heads["q"], g.node("Transpose", [heads["k"]], perm=[0, 1, 3, 2])], name="qk")
    p = g.node("Softmax", [scores], name="softmax", axis=-1)
    c = g.node("MatMul", [p, heads["v"]], name="pv")
    ctx = g.node("Reshape", [g.node("Transpose", [c], perm=[0, 2, 1, 3]), shape([1, T, H])], out="ctx")
    o = g.node("Add", [g.node("MatMul", [ctx, g.const(_w(H, H))], name="out"), g.const(_w(1, H)[0])])
    n2 = g.node("LayerNormalization", [g.node("Add", [o, n1]), g.const(ones), g.const(zeros)], name="ln2", axis=-1)
    w_up = _w(H, F)
    w_up[:, 5] *= 20  # an outlier channel in the GELU output
    act = _gelu(g, g.node("MatMul", [n2, g.const(w_up)], name="up"), prefix="act")
    down = g.node("MatMul", [act, g.const(_w(F, H))], name="down")
    g.node("LayerNormalization", [g.node("Add", [down, n2]), g.const(ones), g.const(zeros)], name="ln3", axis=-1,
           out="y")
    return g.model("y")


def test_smoothing_every_matmul_input_finds_who_divides():
    model = prepare(_attention_layer())
    assert [s.absorber.name for s in smoothing_sites(model.graph)] == ["ln1", "ln2"]
    kinds = {tuple(m.name for m in s.matmuls): (s.kind, s.absorber.name if s.absorber else None)
             for s in smoothing_sites(model.graph, "matmuls")}
    assert kinds == {("q", "k", "v"): ("norm", "ln1"), ("out",): ("projection", "v"), ("up",): ("norm", "ln2"),
                     ("down",): ("mul", None)}


@pytest.mark.parametrize("scrambled", [False, True])
def test_smoothing_every_matmul_input_is_exact_in_float(scrambled):
    """Applied blindly, the scrambled heads' projection changes the outputs; the stage sees it and divides
    the context by a Mul instead (on OpenVINO, the quantized model then has a Mul before the output
    projection)."""
    calib = _tokens(8)
    model = prepare(_attention_layer(scrambled))
    ref = [run_ort(model, f)[0] for f in calib]
    data = CalibrationData.from_source(calib).bind(input_specs(model))
    blind = smooth(model, data, 0.8, "matmuls")
    same = all(np.allclose(run_ort(blind, f)[0], r, rtol=1e-4, atol=1e-4) for f, r in zip(calib, ref))
    assert same != scrambled
    qm = qnnx.quantize(_attention_layer(scrambled), calib, QuantConfig(progress=False, target="openvino",
                                                                       smoothing_alpha=0.8, smoothing_sites="matmuls"))
    record = qm.report.records["smooth"]
    assert record.not_applied.startswith("value projections not used") == scrambled
    assert dict(record.sites) == {"norm": 2, "projection": 1, "mul": 1}
    out = nodes_by_name(qm.qdq)["out"]
    x = out.inputs[0]
    while x.producer().op_type in ("QuantizeLinear", "DequantizeLinear"):
        x = x.producer().inputs[0]
    assert x.producer().op_type == ("Mul" if scrambled else "Reshape")
    for f in _tokens(4, seed=9):
        assert _cosine(run_ort(qm.qdq, f)[0], run_ort(_attention_layer(scrambled), f)[0]) > 0.95  # a working model


@pytest.mark.parametrize("build, sites", [(_ln_linear, "norms"), (_attention_layer, "matmuls")])
def test_smoothing_leaves_no_scaled_value_under_its_original_name(build, sites):
    """A norm output read by MatMuls only (_ln_linear's) and a value projection's chain hold y / s after
    smoothing: they are renamed, so every value that keeps its name keeps its values, and comparing the
    quantized model with the original float model by name (``qnnx compare``) pairs like with like."""
    calib = _tokens(4)
    original = prepare(build())
    smoothed = smooth(prepare(build()), CalibrationData.from_source(calib).bind(input_specs(original)), 0.8, sites)
    names = {v.name for n in original.graph for v in n.outputs} & {v.name for n in smoothed.graph for v in n.outputs}
    renamed = {v.name for n in smoothed.graph for v in n.outputs if v.name.endswith("_smoothed")}
    assert renamed
    errors = value_errors(original, smoothed, sorted(names), calib)
    worst = min(errors.values(), key=lambda e: e.sqnr_db)
    assert worst.sqnr_db > 80, f"{worst.name} keeps its name but not its values ({worst.sqnr_db:.1f} dB)"


@cache
def _gelu_ffn():
    """x -> linear -> GELU (one channel an outlier) -> linear -> LN -> y: no LayerNorm to divide the GELU output."""
    g = Graph(opset=17)
    rng = np.random.default_rng(8)
    w_up = (rng.standard_normal((H, F)) * 0.3).astype(np.float32)
    w_up[:, 5] *= 20
    act = _gelu(g, g.node("MatMul", [g.input("x", [1, T, H]), g.const(w_up)], name="up"), prefix="act")
    down = g.node("MatMul", [act, g.const((rng.standard_normal((F, H)) * 0.3).astype(np.float32))], name="down")
    g.node("LayerNormalization", [down, g.const(np.ones(H, np.float32))], name="ln", axis=-1, out="y")
    return g.model("y")


def test_smoothing_mul_stays_float_before_the_quantizer_and_helps():
    """On OpenVINO the GELU output's Mul stays float with the quantizer right after it (the plugin folds it
    there), and smoothing it brings the quantized layer closer to float than leaving it."""
    calib, ev = _tokens(16, outlier=1.0), _tokens(8, seed=9, outlier=1.0)
    ref = [run_ort(_gelu_ffn(), f)[0] for f in ev]
    sqnr = {}
    for sites in ("norms", "matmuls"):
        qm = qnnx.quantize(_gelu_ffn(), calib, QuantConfig(progress=False, target="openvino", smoothing_alpha=0.8,
                                                            smoothing_sites=sites))
        sqnr[sites] = _sqnr_db(ref, [run_ort(qm.qdq, f)[0] for f in ev])
    q = nodes_by_name(qm.qdq)["down"].inputs[0].producer().inputs[0].producer()
    assert q.op_type == "QuantizeLinear" and q.inputs[0].producer().op_type == "Mul"
    assert sqnr["matmuls"] > sqnr["norms"] + 3, sqnr


def test_smoothing_leaves_a_projection_that_does_not_map_on_onnx_runtime():
    """Without Muls to fall back on, the scrambled heads' context is left unsmoothed (the report says so) and
    the LayerNorm sites stay."""
    qm = qnnx.quantize(_attention_layer(True), _tokens(8), QuantConfig(progress=False, smoothing_alpha=0.8,
                                                                        smoothing_sites="matmuls"))
    assert qm.report.records["smooth"].not_applied.startswith("value projections not used")
    assert "smooth: value projections not used" in qm.report.summary()
    assert nodes_by_name(qm.qdq)["ln1"].inputs[1].name.endswith("smoothed_scale")


def test_a_context_with_another_reader_is_divided_by_a_mul_not_its_projection():
    """A projection's columns would divide every reader of the context: with a reader besides the MatMuls
    (a residual, say) the site takes a Mul, which only they read."""
    model = prepare(_attention_layer())
    nodes = nodes_by_name(model)
    ctx = nodes["out"].inputs[0]
    extra = ir.node("Identity", [ctx], name="extra")
    model.graph.insert_after(nodes["out"], extra)
    model.graph.outputs.append(extra.outputs[0])
    kinds = {tuple(m.name for m in s.matmuls): s.kind for s in smoothing_sites(model.graph, "matmuls")}
    assert kinds[("out",)] == "mul"


def test_smoothing_adds_no_mul_on_onnx_runtime():
    """ONNX Runtime quantizes the GELU's output itself: a Mul after it would round the value twice, so
    "matmuls" adds none there (the same model as "norms")."""
    calib = _tokens(8, outlier=1.0)
    models = [qnnx.quantize(_gelu_ffn(), calib, QuantConfig(progress=False, smoothing_alpha=0.8, smoothing_sites=s))
              for s in ("norms", "matmuls")]
    assert [n.op_type for n in models[1].qdq.graph] == [n.op_type for n in models[0].qdq.graph]
    assert not any("smooth" in n.name for n in models[1].qdq.graph)


def test_smoothing_sites_is_validated():
    with pytest.raises(QnnxError, match="smoothing_sites"):
        QuantConfig(smoothing_sites="all")


def test_canonical_linear_layer_keeps_the_bias_in_the_integer_matmul():
    """FQ2I turns DQ -> MatMul -> Add(DQ int32 bias) -> Q into one qnnx.matmul with its bias input
    and a requantize: no float op left, and the same integers as ONNX Runtime's QDQ run within one
    output quantum (float vs fixed-point requantize rounding at ties)."""
    g = Graph(opset=17)
    mm = g.node("MatMul", [g.input("x", [1, T, H]), g.const(_w(H, F), "w")], name="mm")
    g.node("Add", [mm, g.const(RNG.normal(0, .5, F).astype(np.float32), "b")], name="bias", out="y")
    feeds = [{"x": RNG.standard_normal((1, T, H)).astype(np.float32)} for _ in range(4)]
    qm = qnnx.quantize(g.model("y"), feeds, QuantConfig(progress=False))
    canonical = qm.canonical
    ops = [n.op_type for n in canonical.graph if n.domain == "qnnx"]
    assert ops.count("matmul") == 1 and not qm.report.left_in_float, (ops, qm.report.left_in_float)
    matmul = next(n for n in canonical.graph if n.op_type == "matmul")
    assert len(matmul.inputs) == 7 and matmul.inputs[6].dtype == ir.DataType.INT32
    assert not [n for n in canonical.graph if n.op_type == "Add"]
    step = float(qdq_of(qm.qdq, "y_float")[0].inputs[1].const_value.numpy())  # the graph output's quantum
    for f in feeds:
        ref = run_ort(qm.qdq, f)[0]
        got = qnnx.ReferenceEvaluator(ir.to_proto(canonical)).run(None, f)[0]
        np.testing.assert_allclose(got, ref, atol=step * 1.001, rtol=0)


# --------------------------------------------------------------------------- attention masks


def _attention(style: str):
    """scores = q k^T of a float input, masked by an int64 attention_mask (1 = token, 0 = padding),
    softmax, times v. ``style``: "where" (Where(mask, 0, finfo.min), transformers >= 4.3x) or
    "mul" ((1 - mask) * -10000, older BERT exports)."""
    g = Graph(opset=17)
    x = g.input("x", [1, T, H])
    mask = g.input("attention_mask", [1, T], np.int64)
    scores = g.node("MatMul", [x, g.node("Transpose", [x], perm=[0, 2, 1])], name="qk")
    m = g.node("Unsqueeze", [g.node("Cast", [mask], to=1), g.const(np.array([1], np.int64))])  # 1 x 1 x T
    if style == "where":
        keep = g.node("Cast", [m], to=9)
        add = g.node("Where", [keep, g.const(np.float32(0.0)), g.const(np.float32(np.finfo(np.float32).min))],
                     name="mask")
    else:
        add = g.node("Mul", [g.node("Sub", [g.const(np.float32(1.0)), m]), g.const(np.float32(-10000.0))],
                     name="mask")
    masked = g.node("Add", [scores, add], name="masked")
    p = g.node("Softmax", [masked], name="softmax", axis=-1)
    g.node("MatMul", [p, x], name="pv", out="y")
    return g.model("y")


def _padded(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        mask = np.ones((1, T), np.int64)
        mask[0, rng.integers(2, T):] = 0
        out.append({"x": rng.standard_normal((1, T, H)).astype(np.float32), "attention_mask": mask})
    return out


@pytest.mark.parametrize("style", ["where", "mul"])
def test_attention_mask_and_masked_softmax_input_stay_float(style):
    d = _decisions(_attention(style))
    assert not d["masked"].quantized and "additive attention mask" in d["masked"].reason
    m = next(m for m in plan(prepare(_attention(style)), QuantConfig(progress=False)).matches
             if m.pattern == "softmax")
    assert m.inputs == () and m.outputs[0].fixed_range == (0.0, 1.0)
    calib, ev = _padded(8, 1), _padded(4, 2)
    qm = qnnx.quantize(_attention(style), calib, QuantConfig(progress=False))
    for f in ev:
        cos = _cosine(run_ort(qm.qdq, f)[0], run_ort(_attention(style), f)[0])
        assert cos > 0.99, cos  # a quantized mask leaves the scores one or two levels: cosine ~0.5


def test_embedding_sums_are_not_masks():
    g = Graph(opset=17)
    ids = g.input("ids", [1, T], np.int64)
    a = g.node("Gather", [g.const(_w(30, H)), ids], name="word")
    b = g.node("Gather", [g.const(_w(2, H)), g.node("Mul", [ids, g.const(np.int64(0))])], name="type")
    g.node("Add", [a, b], name="embed_sum", out="y")
    node = nodes_by_name(ir.from_proto(g.model("y")))["embed_sum"]
    assert next(p for p in patterns_for("Add") if p.name == "binary").match(node).pattern == "binary"


@pytest.mark.parametrize("half_first", [False, True], ids=["x*(1+erf)*0.5", "(x*0.5)*(1+erf)"])
def test_canonical_erf_gelu_is_one_table_lookup(half_first):
    """FQ2I turns the realized GELU unit (DQ -> five float ops -> Q) into one qnnx.lut; the integers
    match ONNX Runtime's QDQ run within one output quantum (float32 rounding near a boundary)."""
    g = Graph(opset=17)
    x = g.input("x", [1, T, F])
    g.node("Identity", [_gelu(g, g.node("Tanh", [x], name="tanh"), half_first)], name="id", out="y")  # folded
    feeds = [{"x": (RNG.standard_normal((1, T, F)) * 2).astype(np.float32)} for _ in range(4)]
    qm = qnnx.quantize(g.model("y"), feeds, QuantConfig(progress=False))
    canonical = qm.canonical
    assert [n.op_type for n in canonical.graph if n.domain == "qnnx"].count("lut") == 2  # tanh, gelu
    assert not [n for n in canonical.graph if n.op_type in ("Erf", "Div")] and not qm.report.left_in_float
    step = float(qdq_of(qm.qdq, "y_float")[0].inputs[1].const_value.numpy())  # the output's quantum
    for f in feeds:
        ref = run_ort(qm.qdq, f)[0]
        got = qnnx.ReferenceEvaluator(ir.to_proto(canonical)).run(None, f)[0]
        np.testing.assert_allclose(got, ref, atol=step * 1.001, rtol=0)

