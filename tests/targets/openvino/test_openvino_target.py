"""The OpenVINO target: what its plan quantizes (no OpenVINO needed), then its check, timer, ``qnnx bench``
and ``qnnx compare`` on the CPU plugin (marked ``openvino``, skipped without the package)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx_ir as ir
import pytest
from float_graphs import Graph, conv_weight, nodes_by_name, qdq_of, qparams_of, samples, squeeze_excitation_model

import qnnx
from qnnx import QuantConfig
from qnnx.targets import target
from qnnx.autoquant.plan import gates_itself
from qnnx.targets.execution import Int8Execution, MatchFacts


def _model():
    """x -> conv a -> SiLU (a * Sigmoid(a)) -> conv b -> + x residual -> y."""
    rng = np.random.default_rng(0)
    g = Graph()
    x = g.input("x", [1, 4, 8, 8])
    a = g.node("Conv", [x, g.const(conv_weight(rng, 4, 4), "wa"), g.const(np.full(4, 0.1, np.float32), "ba")],
               name="a", pads=[1, 1, 1, 1])
    s = g.node("Sigmoid", [a], name="sig")
    m = g.node("Mul", [a, s], name="silu")
    b = g.node("Conv", [m, g.const(conv_weight(rng, 4, 4), "wb")], name="b", pads=[1, 1, 1, 1])
    g.node("Add", [b, x], name="residual", out="y")
    return g.model("y")


def _quantized(name: str):
    return qnnx.quantize(_model(), samples(8, shape=(1, 4, 8, 8)),
                         config=QuantConfig(progress=False, target=name, weight_rounding="nearest",
                                            bias_correction="off"))


def _quantize_inputs(model) -> dict[str, str]:
    """Each QuantizeLinear's input -> the op types reading its DequantizeLinear."""
    out = {}
    for n in model.graph:
        if n.op_type == "QuantizeLinear":
            readers = {u.node.op_type for d in n.outputs[0].uses() for u in d.node.outputs[0].uses()}
            out[n.inputs[0].name] = ",".join(sorted(readers))
    return out


def test_openvino_quantizes_conv_and_residual_add_inputs_and_leaves_the_elementwise_ops_float():
    qm = _quantized("openvino")
    q = _quantize_inputs(qm.qdq)
    # x into conv a and the residual add (one quantize, read by both), SiLU's output into conv b, conv b's
    # output into the add: nothing else
    assert q == {"x": "Add,Conv", "silu": "Conv", "b": "Add"} or sorted(q.values()) == ["Add", "Add,Conv", "Conv"]
    assert not any(n.op_type == "QuantizeLinear" and n.inputs[0].producer() is not None
                   and n.inputs[0].producer().op_type in ("Sigmoid", "Add") for n in qm.qdq.graph)
    why = {d.node: d for d in qm.report.decisions}
    assert not why["sig"].quantized and "OpenVINO" in why["sig"].reason
    assert why["residual"].quantized and "float output" in why["residual"].reason
    assert why["a"].quantized and "float output" in why["a"].reason


def test_openvino_quantizes_binary_ops_of_two_signals_only():
    ov = target("openvino")
    assert ov.execution(MatchFacts("binary", "Add", 1)).inputs is False  # a constant operand
    assert ov.execution(MatchFacts("binary", "Mul", 2, gates_itself=True)).inputs is False  # SiLU's gate
    assert ov.execution(MatchFacts("binary", "Mul", 2)).inputs is True  # a squeeze-excitation scale
    assert ov.execution(MatchFacts("binary", "Add", 2)).inputs is True  # a residual add
    assert not ov.execution(MatchFacts("binary", "Add", 2)).zero_point_inputs
    assert ov.execution(MatchFacts("elementwise", "Sigmoid")).inputs is False
    assert ov.execution(MatchFacts("matmul/gemm", "MatMul", 2, input_ops=("Mul", "Transpose"))).zero_point_inputs
    assert not ov.execution(MatchFacts("matmul/gemm", "MatMul", 2, input_ops=("Softmax", "Reshape"))).inputs


def test_a_value_times_a_function_of_itself_gates_itself():
    model = ir.from_proto(_model())
    assert gates_itself(next(n for n in model.graph if n.name == "silu"))


def _branchy_model(float_reader: bool = False):
    """x -> conv a -> Split -> (conv b on one half, MaxPool on the other) -> Concat(b, pooled, half) ->
    conv c -> y; ``float_reader``: the pooled value is also a graph output (read in float)."""
    rng = np.random.default_rng(1)
    g = Graph()
    x = g.input("x", [1, 4, 8, 8])
    a = g.node("Conv", [x, g.const(conv_weight(rng, 8, 4), "wa")], name="a", pads=[1, 1, 1, 1], out="a_out")
    h0, h1 = g.node("Split", [a, g.const(np.array([4, 4], np.int64), "sizes")], name="split", outputs=2, axis=1)
    b = g.node("Conv", [h0, g.const(conv_weight(rng, 4, 4), "wb")], name="b", pads=[1, 1, 1, 1], out="b_out")
    p = g.node("MaxPool", [h1], name="pool", kernel_shape=[3, 3], pads=[1, 1, 1, 1], out="pooled")
    c = g.node("Concat", [b, p, h0], name="cat", axis=1, out="cat_out")
    g.node("Conv", [c, g.const(conv_weight(rng, 4, 12), "wc")], name="c", pads=[1, 1, 1, 1], out="y")
    return g.model("y", "pooled") if float_reader else g.model("y")


def _quantize_branchy(name: str, float_reader: bool = False):
    return qnnx.quantize(_branchy_model(float_reader), samples(8, shape=(1, 4, 8, 8)),
                         config=QuantConfig(progress=False, target=name, weight_rounding="nearest",
                                            bias_correction="off"))


def test_openvino_quantizes_above_split_maxpool_and_concat_with_one_scale_for_the_concat():
    qm = _quantize_branchy("openvino")
    quantized = {n.inputs[0].name for n in qm.qdq.graph if n.op_type == "QuantizeLinear"}
    # the input, conv a's output (above the Split, the MaxPool and the Concat), conv b's output (a Concat
    # input); nothing after the Split, the MaxPool or the Concat
    assert quantized == {"x", "a_out", "b_out"}
    (_, dq_a), (_, dq_b) = qdq_of(qm.qdq, "a_out"), qdq_of(qm.qdq, "b_out")
    for got, want in zip(qparams_of(dq_b), qparams_of(dq_a)):  # one scale: conv c reads them as one tensor
        np.testing.assert_array_equal(got, want)
    assert {u.node.op_type for u in dq_a.outputs[0].uses()} == {"Split"}


def test_openvino_keeps_the_quantize_below_a_value_read_in_float():
    qm = _quantize_branchy("openvino", float_reader=True)
    quantized = {n.inputs[0].name for n in qm.qdq.graph if n.op_type == "QuantizeLinear"}
    # the pooled value is a graph output: it stays float, so the Concat's quantize stays below the Concat and
    # the Split's below the Split
    assert "cat_out" in quantized and not {"a_out", "pooled"} & quantized
    assert qm.qdq.graph.outputs[1].producer().op_type == "MaxPool"


def _projection(g: Graph, x, rng, name: str):
    """``name``: x times a constant 8x8 weight ``w{name}``, output ``{name}_out``."""
    return g.node("MatMul", [x, g.const(rng.normal(size=(8, 8)).astype(np.float32), f"w{name}")], name=name,
                  out=f"{name}_out")


def _attention_model():
    """q = x Wq, k = x Wk (signed), p = Softmax(q k^T) (non-negative), y = p v: two MatMuls of activations."""
    rng = np.random.default_rng(2)
    g = Graph()
    x = g.input("x", [1, 6, 8])
    q, k = _projection(g, x, rng, "q"), _projection(g, x, rng, "k")
    kt = g.node("Transpose", [k], name="kt", perm=[0, 2, 1], out="kt_out")
    s = g.node("MatMul", [q, kt], name="scores", out="scores_out")
    p = g.node("Softmax", [s], name="softmax", axis=-1, out="p_out")
    g.node("MatMul", [p, q], name="context", out="y")
    return g.model("y")


def _quantized_for_openvino(model, shape):
    return qnnx.quantize(model, samples(8, shape=shape),
                         config=QuantConfig(progress=False, target="openvino", weight_rounding="nearest",
                                            bias_correction="off"))


def _zero_points(model) -> dict[str, tuple]:
    """Each QuantizeLinear's input -> (zero point dtype, zero point)."""
    out = {}
    for n in model.graph:
        if n.op_type == "QuantizeLinear":
            _, zp = qparams_of(n)
            out[n.inputs[0].name] = (zp.dtype, int(zp))
    return out


def test_openvino_gives_queries_and_keys_zero_points_0_and_leaves_probabilities_float():
    qm = _quantized_for_openvino(_attention_model(), (1, 6, 8))
    zero = _zero_points(qm.qdq)
    assert zero["q_out"] == (np.int8, 0)
    assert zero["k_out"] == (np.int8, 0) and "kt_out" not in zero  # above the Transpose (data movement)
    assert "p_out" not in zero  # probabilities x values stays float: no quantize of the probability map
    assert zero["x"][0] == np.uint8  # the projections' input keeps its calibrated zero point
    why = {d.node: d for d in qm.report.decisions}
    assert not why["context"].quantized and "probabilities" in why["context"].reason


def _deconvolution_model():
    """y = ConvTranspose(x) (stride 2), x signed: its quantized input has a zero point."""
    g = Graph()
    x = g.input("x", [1, 8, 6, 6])
    w = g.const((np.random.default_rng(0).normal(size=(8, 4, 2, 2)) * 0.3).astype(np.float32), "w")
    g.node("ConvTranspose", [x, w], strides=[2, 2], name="up", out="y")
    return g.model("y")


@pytest.mark.openvino
def test_check_says_why_a_conv_transpose_reading_a_zero_point_runs_in_float():
    pytest.importorskip("openvino")
    record = _quantized_for_openvino(_deconvolution_model(), (1, 8, 6, 6)).report.record("openvino")
    assert record.quantized == 1 and record.int8 == 0 and record.shifted_deconvolutions == ["up"]
    lines = record.lines()
    warning = next(i for i, line in enumerate(lines) if line.startswith("WARNING"))
    assert "takes no input zero point" in lines[warning + 1] and "up" in lines[warning + 1]
    fixed = qnnx.quantize(_deconvolution_model(), samples(8, shape=(1, 8, 6, 6)),
                          config=QuantConfig(progress=False, target="openvino", symmetric_activations="auto"))
    assert fixed.report.record("openvino").int8 == 1  # the option the note names runs it in int8


def test_a_value_a_concat_makes_keeps_its_zero_point_where_zero_point_0_is_asked_for():
    # keys made by a Concat (a cache of past keys, say): OpenVINO computes a Concat of int8 inputs wrongly on
    # some CPUs (bench/ov_int8_concat.py), so they keep uint8 with their zero point; the queries get zero point 0
    rng = np.random.default_rng(5)
    g = Graph()
    x = g.input("x", [1, 6, 8])
    q, k1, k2 = (_projection(g, x, rng, name) for name in ("q", "k1", "k2"))
    k = g.node("Concat", [k1, k2], name="cat", axis=1, out="k_out")
    kt = g.node("Transpose", [k], name="kt", perm=[0, 2, 1], out="kt_out")
    g.node("MatMul", [q, kt], name="scores", out="y")
    zero = _zero_points(_quantized_for_openvino(g.model("y"), (1, 6, 8)).qdq)
    assert zero["q_out"] == (np.int8, 0)
    keys = [zero[v] for v in ("k1_out", "k2_out", "k_out") if v in zero]
    assert keys and all(dtype == np.uint8 for dtype, _ in keys)


def test_zero_point_zero_keeps_the_range_with_zero_point_0():
    from qnnx.autoquant.plan import zero_point_zero
    from qnnx.calibrate import qparams_from_range

    asymmetric = qparams_from_range(-1.0, 3.0, "uint8", symmetric=False)
    hi = (255 - int(asymmetric.zero_point)) * float(asymmetric.scale)
    signed = zero_point_zero(asymmetric)
    assert signed.dtype == "int8" and int(signed.zero_point) == 0
    assert float(signed.scale) * 127.5 == pytest.approx(hi)  # the same largest value, symmetric around 0
    positive = qparams_from_range(0.0, 2.0, "uint8", symmetric=False)
    assert zero_point_zero(positive) is positive
    wide = qparams_from_range(-1.0, 3.0, "uint16", symmetric=False)
    assert zero_point_zero(wide) is wide  # 16-bit activations: left as they are


def test_a_shape_reader_does_not_stop_the_hoist():
    """torch's exports reshape a projection with a target computed from the projection's own Shape: the
    Shape reads no values, so the quantizer still goes above the Reshape (OpenVINO then fuses it into the
    projection instead of running the Reshape in float and the quantizer alone), and the Shape keeps
    reading the float value."""
    rng = np.random.default_rng(4)
    g = Graph()
    p = _projection(g, g.input("x", ["n", 6, 8]), rng, "p")  # a dynamic batch: the Shape is not folded
    leading = g.node("Slice", [g.node("Shape", [p], name="shape"), g.const(np.array([0], np.int64)),
                                g.const(np.array([2], np.int64))])
    heads = g.node("Concat", [leading, g.const(np.array([2, 4], np.int64))], axis=0)  # n x 6 x 2 heads x 4
    r = g.node("Reshape", [p, heads], name="reshape", out="r_out")
    g.node("MatMul", [r, g.const(rng.normal(size=(4, 4)).astype(np.float32), "w2")], name="second", out="y")
    qm = _quantized_for_openvino(g.model("y"), (1, 6, 8))
    quantized = {n.inputs[0].name for n in qm.qdq.graph if n.op_type == "QuantizeLinear"}
    assert "p_out" in quantized and "r_out" not in quantized
    assert nodes_by_name(qm.qdq)["shape"].inputs[0].name == "p_out"


def _multi_head_attention_model():
    """A BERT-style attention: queries, keys, values projected and split into 4 heads (Reshape, Transpose),
    p = Softmax(q k), the context p v merged back (Transpose, Reshape) and projected again."""
    rng = np.random.default_rng(3)
    g = Graph()
    tokens, heads, width = 16, 4, 16
    x = g.input("x", [1, tokens, heads * width])
    split = g.const(np.array([1, tokens, heads, width], np.int64))
    merged = g.const(np.array([1, tokens, heads * width], np.int64))

    def projection(name: str, perm: list[int]):
        w = g.const((rng.normal(size=(heads * width, heads * width)) / 8).astype(np.float32), f"w{name}")
        p = g.node("MatMul", [x, w], name=name, out=f"{name}_out")
        return g.node("Transpose", [g.node("Reshape", [p, split])], perm=perm, name=f"{name}_heads")

    q, k, v = projection("q", [0, 2, 1, 3]), projection("k", [0, 2, 3, 1]), projection("v", [0, 2, 1, 3])
    p = g.node("Softmax", [g.node("MatMul", [q, k], name="scores")], axis=-1, name="softmax")
    c = g.node("MatMul", [p, v], name="context", out="context_out")
    t = g.node("Transpose", [c], perm=[0, 2, 1, 3], name="heads_back", out="heads_back_out")
    r = g.node("Reshape", [t, merged], name="merge", out="merge_out")
    wo = g.const((rng.normal(size=(heads * width, heads * width)) / 8).astype(np.float32), "wo")
    g.node("MatMul", [r, wo], name="output_projection", out="y")
    return g.model("y")


@pytest.mark.openvino
def test_check_counts_queries_times_keys_inside_the_attention_kernel_as_int8():
    """The plugin compiles an attention (queries x keys, softmax, probabilities x values) into one generated
    int8 kernel whose layer does not list the first MatMul by name: the check counts it there, not as a
    quantized layer run in float."""
    pytest.importorskip("openvino")
    from qnnx.targets.openvino.execution_check import executed_layers
    from qnnx.targets.openvino.runtime import compile_model

    qm = _quantized_for_openvino(_multi_head_attention_model(), (1, 16, 64))
    record = qm.report.record("openvino")
    fused = any(layer.layer_type == "Subgraph" and "context" in layer.fused.split(",")
                for layer in executed_layers(compile_model(qm.export(), threads=1)))
    assert record.unchecked == "" and record.in_kernels == int(fused)  # the kernel where the CPU has one
    assert record.int8 == record.quantized == 5  # q, k, v, the output projection and queries x keys
    assert not any(line.startswith("WARNING") for line in record.lines())


def test_onnxruntime_does_not_hoist():
    qm = _quantize_branchy("onnxruntime")
    quantized = {n.inputs[0].name for n in qm.qdq.graph if n.op_type == "QuantizeLinear"}
    assert {"a_out", "b_out", "cat_out"} <= quantized  # every pattern's output, where it is made


def test_onnxruntime_quantizes_the_same_model_whole():
    qm = _quantized("onnxruntime")
    q = _quantize_inputs(qm.qdq)
    assert len(q) > 2  # conv outputs, the sigmoid, the residual add are quantized too
    assert target("onnxruntime").execution(MatchFacts("binary", "Add", 2)) == Int8Execution()


def test_the_openvino_canonical_form_keeps_the_unquantized_ops_float_and_is_close_to_float():
    qm = _quantized("openvino")
    ops = {n.op_type for n in qm.canonical.graph}
    assert {"Sigmoid", "Add"} <= ops  # left float, fed by the dequantized int32 accumulators
    x = samples(4, shape=(1, 4, 8, 8), seed=3)
    from float_graphs import run_ort
    from qnnx.passes.lower import lower

    for xi in x:
        ref = run_ort(qm.float_model, {"x": xi})[0]
        got = run_ort(lower(qm.canonical), {"x": xi})[0]
        qdq = run_ort(qm.qdq, {"x": xi})[0]
        # the canonical model computes the QDQ model's numbers (int32 accumulators, exact dequantize)
        np.testing.assert_allclose(got, qdq, atol=1e-5 * max(1.0, float(np.abs(qdq).max())))
        assert float(np.abs(got - ref).max()) < 0.1 * float(np.abs(ref).max())


def test_an_execution_with_an_output_and_no_inputs_is_refused():
    with pytest.raises(ValueError):
        Int8Execution(inputs=False, output=True)


# --------------------------------------------------------------------------- on OpenVINO itself


@pytest.mark.openvino
def test_check_finds_both_convs_executed_in_int8():
    pytest.importorskip("openvino")
    qm = _quantized("openvino")
    record = qm.report.record("openvino")
    assert record.unchecked == ""
    assert record.quantized == 2 and record.int8 == 2
    assert "WARNING" not in qm.report.summary()


@pytest.mark.openvino
def test_check_says_when_the_plugin_runs_float_layers_in_bf16():
    """This report's figures are ONNX Runtime's f32 ones; where the plugin runs float layers in bf16 by default
    (CPUs with avx512_bf16 or AMX), the record says so, and only there."""
    pytest.importorskip("openvino")
    from qnnx.targets.openvino.runtime import compile_model

    qm = _quantized("openvino")
    record = qm.report.record("openvino")
    hint = str(compile_model(qm.export()).get_property("INFERENCE_PRECISION_HINT"))
    assert record.float_precision == {"bfloat16": "bf16", "float16": "f16"}.get(hint.split("'")[1], "f32")
    noted = any(line.startswith("note: OpenVINO runs this model's float layers in") for line in record.lines())
    assert noted == (record.float_precision != "f32")
    assert not any(line.startswith("note: OpenVINO runs") for line in
                   replace(record, float_precision="f32").lines())


@pytest.mark.openvino
def test_check_counts_a_conv_making_a_graph_output_once():
    """The conv after a squeeze-excitation Mul makes the graph output (the converter names its layer after
    that output) and reads the Mul's int8 eltwise kernel: one int8 layer, not also one inside a kernel."""
    pytest.importorskip("openvino")
    lines = target("openvino").check(_quantized_for_openvino(squeeze_excitation_model(), (1, 4, 8, 8)).qdq).lines()
    assert lines[0] == "OpenVINO (CPU) executes 4 conv/matmul layer(s) in int8 (4 quantized in the model), 0 in float"


@pytest.mark.openvino
def test_check_counts_convs_reading_quantized_values_through_data_movement():
    pytest.importorskip("openvino")
    from qnnx.targets.openvino.execution_check import executed_layers
    from qnnx.targets.openvino.runtime import compile_model

    qm = _quantize_branchy("openvino")
    record = qm.report.record("openvino")
    assert record.quantized == 3 and record.int8 == 3  # conv c reads the Concat of dequantized values
    layers = {layer.layer_type: layer.precision for layer in executed_layers(compile_model(qm.export()))
              if layer.layer_type in ("Split", "Pooling", "Concatenation")}
    assert set(layers.values()) <= {"u8", "i8"}, layers  # the data movement runs on integers


@pytest.mark.openvino
def test_timer_and_outputs_on_the_cpu_plugin():
    pytest.importorskip("openvino")
    from qnnx.targets.openvino.runtime import compile_model, run

    qm = _quantized("openvino")
    ms = target("openvino").timer([qm.float_model, qm.qdq], {"x": samples(1, shape=(1, 4, 8, 8))[0]}, repeats=3)
    assert len(ms) == 2 and all(m > 0 for m in ms)
    x = samples(1, shape=(1, 4, 8, 8), seed=5)[0]
    from float_graphs import run_ort

    ref = run_ort(qm.float_model, {"x": x})[0]
    got = run(compile_model(qm.export(), threads=1, precision="f32"), {"x": x})[0]
    assert got.shape == ref.shape
    assert float(np.abs(got - ref).max()) < 0.1 * float(np.abs(ref).max())


@pytest.mark.openvino
def test_cli_bench_and_compare_on_openvino(tmp_path):
    pytest.importorskip("openvino")
    from typer.testing import CliRunner

    from qnnx.cli import app
    from qnnx.ir import save_model

    qm = _quantized("openvino")
    fp, qp = tmp_path / "f.onnx", tmp_path / "q.onnx"
    save_model(qm.float_model, fp)
    qm.save(qp)
    data = tmp_path / "data"
    data.mkdir()
    for i, x in enumerate(samples(2, shape=(1, 4, 8, 8))):
        np.save(data / f"{i}.npy", x)
    runner = CliRunner()
    r = runner.invoke(app, ["bench", str(fp), str(qp), "--runtime", "openvino", "--repeats", "2", "--data", str(data)])
    assert r.exit_code == 0, r.output
    assert "vs first" in r.output or "OpenVINO" in r.output
    r = runner.invoke(app, ["bench", str(fp), str(qp), "--runtime", "openvino", "--repeats", "2", "--data", str(data),
                            "--profile", "--precision", "f32"])
    assert r.exit_code == 0, r.output
    float_part, int8_part = r.output.split(f"{fp}: kernel time ")[1].split(f"{qp}: kernel time ")
    assert "Convolution [f32]" in float_part and "Convolution [int8]" in int8_part  # the plugin's layers as they ran
    r = runner.invoke(app, ["compare", str(fp), str(qp), "--data", str(data), "--runtime", "openvino", "-q",
                            "--precision", "f32", "--threads", "1"])
    assert r.exit_code == 0, r.output
    assert "SQNR" in r.output


def test_ops_reading_a_float_output_accumulator_stay_float_in_the_canonical_form():
    """MatMul -> Softmax -> MatMul: for OpenVINO the first MatMul's output is float, so its int32 accumulator
    reaches the Softmax; the Softmax stays float instead of failing integerization."""
    rng = np.random.default_rng(1)
    g = Graph()
    x = g.input("x", [1, 6, 8])
    a = g.node("MatMul", [x, g.const(rng.standard_normal((8, 8)).astype(np.float32), "w1")], name="mm1")
    s = g.node("Softmax", [a], name="softmax", axis=-1)
    g.node("MatMul", [s, g.const(rng.standard_normal((8, 4)).astype(np.float32), "w2")], name="mm2", out="y")
    data = [rng.standard_normal((1, 6, 8)).astype(np.float32) for _ in range(4)]
    qm = qnnx.quantize(g.model("y"), data, config=QuantConfig(progress=False, target="openvino",
                                                              weight_rounding="nearest", bias_correction="off"))
    assert "Softmax" in {n.op_type for n in qm.canonical.graph}
    assert ("softmax", "Softmax", "an operand is int32 (an accumulator); qnnx.softmax takes 8/16-bit operands") \
        in qm.report.left_in_float


# --------------------------------------------------------------------------- int16 pair sums on the plugin
# (compiled with precision f32: on a CPU with bf16 the plugin's default would round the integer outputs)


def _integer_conv(w: np.ndarray, hw: int = 5, group: int = 1):
    """x (uint8 integers, scale 1) -> int8 weights ``w`` (scale 1) -> Conv without padding: the plugin's
    integer conv as it is, the accumulator dequantized by 1."""
    from onnx import TensorProto, helper, numpy_helper

    c_out, c_in = w.shape[0], w.shape[1] * group
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "zp"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["y"], group=group)]
    inits = [numpy_helper.from_array(np.array(1.0, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.uint8), "zp"),
             numpy_helper.from_array(w.astype(np.int8), "w"),
             numpy_helper.from_array(np.ones(c_out, np.float32), "ws"),
             numpy_helper.from_array(np.zeros(c_out, np.int8), "wz")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _pair_conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """numerics.u8s8_pair_dot applied tap by tap (pairs of input channels at one tap; taps summed in int32)."""
    from qnnx import numerics

    c_out, c_in, kh, kw = w.shape
    h = x.shape[2] - kh + 1
    out = np.zeros((c_out, h, h), np.int64)
    for i in range(kh):
        for j in range(kw):
            patch = x[0, :, i:i + h, j:j + h].reshape(c_in, -1).T  # (positions, C_in)
            out += numerics.u8s8_pair_dot(patch, w[:, :, i, j].T).T.reshape(c_out, h, h)
    return out


@pytest.mark.openvino
@pytest.mark.parametrize("c_in,k", [(8, 1), (16, 3), (3, 3), (5, 1)])
def test_the_plugin_sums_adjacent_input_channels_as_numerics_models_it(c_in, k):
    pytest.importorskip("openvino")
    from qnnx import numerics
    from qnnx.targets.openvino.cpu import pairs_saturate
    from qnnx.targets.openvino.runtime import compile_model, run

    rng = np.random.default_rng(c_in * 10 + k)
    w = rng.integers(-127, 128, (4, c_in, k, k))
    w[:, :2] = 127  # a same-sign pair at its largest: 255 * 127 * 2 does not fit int16
    x = rng.integers(0, 256, (1, c_in, 5, 5))
    x[:, :2] = 255
    got = run(compile_model(_integer_conv(w), threads=1, precision="f32"), {"x": x.astype(np.float32)})[0][0]
    exact = _pair_conv(x, w) if pairs_saturate() else None
    if exact is None:  # a CPU that accumulates in int32: the exact sums
        from float_graphs import run_ort
        exact = run_ort(_integer_conv(w), {"x": x.astype(np.float32)})[0][0]
    np.testing.assert_array_equal(got, exact)
    # within the pair limit nothing clips: the exact integer conv
    limited = np.array(w)  # each same-sign pair's odd member cut to what the limit leaves (pairs at 128 remain)
    even, odd = w[:, 0:w.shape[1] // 2 * 2:2], w[:, 1::2]
    room = numerics.U8S8_PAIR_LIMIT - np.abs(even)
    limited[:, 1::2] = np.where(even * odd > 0, np.sign(odd) * np.minimum(np.abs(odd), room), odd)
    assert numerics.same_sign_pair_sums(limited, 1).max() <= numerics.U8S8_PAIR_LIMIT
    got = run(compile_model(_integer_conv(limited), threads=1, precision="f32"), {"x": x.astype(np.float32)})[0][0]
    full = sum(np.einsum("chw,oc->ohw", x[0, :, i:i + 6 - k, j:j + 6 - k].astype(np.int64), limited[:, :, i, j])
               for i in range(k) for j in range(k))
    np.testing.assert_array_equal(got, full)


@pytest.mark.openvino
@pytest.mark.parametrize("channels,k", [(8, 3), (24, 3), (16, 5)])
def test_the_plugin_sums_depthwise_convs_in_int32(channels, k):
    """uint8 255 against int8 +-127 (and -128) on every tap: sums far beyond int16 come out exact. So a
    depthwise conv's weights need no pair limit there (execution.wide_int8_pairs finds no pairs in their
    single input channel per group), unlike the u8 x s8 kernels of ungrouped convs and matmuls."""
    pytest.importorskip("openvino")
    from qnnx.targets.openvino.runtime import compile_model, run

    rng = np.random.default_rng(channels + k)
    w = rng.integers(-127, 128, (channels, 1, k, k))
    w[: channels // 2] = 127  # every tap at its largest, one sign
    w[channels // 2:, :, 0] = -128
    x = rng.integers(0, 256, (1, channels, 7, 7))
    x[:, : channels // 2 + 2] = 255
    got = run(compile_model(_integer_conv(w, hw=7, group=channels), threads=1, precision="f32"), {"x": x.astype(np.float32)})[0][0]
    h = 7 - k + 1
    exact = sum(x[0, :, i:i + h, j:j + h].astype(np.int64) * w[:, 0, i, j, None, None]
                for i in range(k) for j in range(k))
    assert np.abs(exact).max() > 2 ** 17  # far beyond what int16 sums hold
    np.testing.assert_array_equal(got, exact)


def _loud_linear():
    """x[4, 16] -> MatMul by weights whose input channels 0-3 are large and positive (same-sign pairs at full
    scale) -> y: with x at its range's top the plugin's int16 pair sums of full int8 weights clip."""
    rng = np.random.default_rng(12)
    w = rng.normal(0, 0.1, (16, 8)).astype(np.float32)
    w[:4] = 1.0
    g = Graph()
    g.node("MatMul", [g.input("x", [4, 16]), g.const(w, "w")], name="fc", out="y")
    return g.model("y")


@pytest.mark.openvino
def test_pair_limited_weights_compute_on_the_plugin_what_their_graph_says():
    pytest.importorskip("openvino")
    from float_graphs import run_ort

    from qnnx.targets.openvino.cpu import pairs_saturate
    from qnnx.targets.openvino.runtime import compile_model, run

    rng = np.random.default_rng(13)
    calib = [rng.uniform(0, 1, (4, 16)).astype(np.float32) for _ in range(6)] + [np.ones((4, 16), np.float32)]
    x = {"x": np.ones((4, 16), np.float32)}  # every input at the top of its range: uint8 255
    errors = {}
    for bits in ("pairs", 8):
        qm = qnnx.quantize(_loud_linear(), calib, QuantConfig(progress=False, target="openvino", weight_bits=bits,
                                                              accuracy_guard=False))
        graph_says = run_ort(qm.qdq, x, optimize=False)[0]  # the QDQ graph's own float arithmetic
        got = run(compile_model(qm.export(), threads=1, precision="f32"), x)[0]
        errors[bits] = float(np.abs(got - graph_says).max() / np.abs(graph_says).max())
        assert not qm.report.record("openvino").saturating if bits == "pairs" else True
    assert errors["pairs"] < 1e-5
    if pairs_saturate():  # the counterpart: full int8 weights clip on this CPU's kernels
        assert errors[8] > 0.05


def _integer_linear(w: np.ndarray, op: str):
    """x (uint8 integers, scale 1) @ int8 weights ``w`` (K, N; scale 1) as a MatMul or a Gemm with transB."""
    from onnx import TensorProto, helper, numpy_helper

    k, n = w.shape
    stored = w if op == "MatMul" else w.T
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "zp"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"]),
             helper.make_node(op, ["xd", "wd"], ["y"], **({"transB": 1} if op == "Gemm" else {}))]
    inits = [numpy_helper.from_array(np.array(1.0, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.uint8), "zp"),
             numpy_helper.from_array(np.ascontiguousarray(stored).astype(np.int8), "w"),
             numpy_helper.from_array(np.array(1.0, np.float32), "ws")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.openvino
@pytest.mark.parametrize("op,k", [("MatMul", 16), ("MatMul", 33), ("Gemm", 7), ("Gemm", 64)])
def test_the_plugin_pairs_adjacent_input_channels_of_matmuls_as_numerics_models_it(op, k):
    pytest.importorskip("openvino")
    from qnnx import numerics
    from qnnx.targets.openvino.cpu import pairs_saturate
    from qnnx.targets.openvino.runtime import compile_model, run

    rng = np.random.default_rng(k)
    w = rng.integers(-127, 128, (k, 5))
    w[rng.integers(0, k, 6)] = 127  # rows at full scale: same-sign neighbours whose int16 pair sum clips
    x = rng.integers(0, 256, (3, k))
    x[0] = 255
    got = run(compile_model(_integer_linear(w, op), threads=1, precision="f32"), {"x": x.astype(np.float32)})[0]
    want = numerics.u8s8_pair_dot(x, w) if pairs_saturate() else x @ w
    np.testing.assert_array_equal(got, want)
    if pairs_saturate():
        assert not np.array_equal(want, x @ w)  # the case clips: the pairing is what the equality checks
