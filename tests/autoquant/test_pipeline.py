"""End to end: ``qnnx.quantize(model, calibration, QuantConfig(...))`` on small float graphs.

The shared model (``float_graphs.main_model``: conv+relu -> conv -> residual add -> a*sigmoid(a) -> maxpool ->
globalavgpool -> transpose -> reshape -> matmul) is quantized once with the defaults; other tests
quantize it (or a smaller graph) with one option changed. Checks:

- the QDQ model runs on ONNX Runtime and stays close to float (cosine similarity);
- the canonical model (FQ2I of the QDQ model) has no float compute, and its output, via
  ``qnnx.ReferenceEvaluator`` and via ``qnnx.lower`` + ORT, equals ORT's execution of the QDQ
  model without graph optimizations (float ops between Q/DQ) within one output quantum;
- every option does what it says in the model itself (axis attributes, zero-point dtypes,
  float nodes left, shared qparams), and the report says why.
"""

from __future__ import annotations

import gc
import math
import re
import tracemalloc

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from float_graphs import (Graph, conv_weight, main_model, nodes_by_name, qdq_of, qparams_of, run_ort, run_ref,
                               samples)

import qnnx
from qnnx import QnnxError, QuantConfig, runtime
from qnnx.autoquant import calibration, stages
from qnnx.autoquant.calibration import CALIBRATORS
from qnnx.autoquant.config import METHODS
from qnnx.autoquant.state import QuantState

RNG = np.random.default_rng(5)
TEST_INPUTS = samples(8, seed=99)  # held out: same distribution as the calibration set


@pytest.fixture(scope="module")
def main_float():
    return main_model()


@pytest.fixture(scope="module")
def main_quantized(main_float):
    """The shared model quantized with the defaults (mse, uint8, per-channel) on 16 samples."""
    return qnnx.quantize(main_float, samples(16), QuantConfig(progress=False))


def _quantize(model, calib=None, **options):
    return qnnx.quantize(model, samples(8) if calib is None else calib, QuantConfig(progress=False, **options))


def _cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _outputs(model, inputs, runner=run_ort, **kw):
    return np.concatenate([runner(model, {"x": x}, **kw)[0].ravel() for x in inputs])


def _output_scale(qdq) -> float:
    dq = [n for n in qdq.graph if n.op_type == "DequantizeLinear" and n.outputs[0].is_graph_output()]
    assert len(dq) == 1
    return float(qparams_of(dq[0])[0])


def _weight_dq(qdq, node_name: str, index: int = 1) -> ir.Node:
    """The DequantizeLinear feeding input ``index`` of node ``node_name`` (weights: 1, bias: 2)."""
    producer = nodes_by_name(qdq)[node_name].inputs[index].producer()
    assert producer is not None and producer.op_type == "DequantizeLinear", node_name
    return producer


def _axis(node: ir.Node):
    return node.attributes["axis"].value if "axis" in node.attributes else None


def _activation_qs(qdq) -> list[ir.Node]:
    return [n for n in qdq.graph if n.op_type == "QuantizeLinear"]


def _all_scales(qdq) -> list[np.ndarray]:
    return [qparams_of(n)[0] for n in qdq.graph if n.op_type in ("QuantizeLinear", "DequantizeLinear")]


def _float_compute_nodes(canonical) -> list[str]:
    """Nodes producing a float value, except the input quantize and the output dequantize."""
    out = []
    for n in canonical.graph:
        if n.domain == "qnnx" and n.op_type in ("quantize", "dequantize"):
            continue
        if any(o.dtype is None or o.dtype.is_floating_point() for o in n.outputs):
            out.append(f"{n.op_type} {n.name}")
    return out


# --------------------------------------------------------------------------- the shared model


def test_qdq_model_runs_on_ort_close_to_float(main_float, main_quantized):
    qdq = main_quantized.qdq
    assert len(_activation_qs(qdq)) >= 9
    assert [o.name for o in qdq.graph.outputs] == ["y"] and [i.name for i in qdq.graph.inputs] == ["x"]
    f = _outputs(main_float, TEST_INPUTS)
    q = _outputs(qdq, TEST_INPUTS)
    assert q.shape == f.shape == (8 * 5,)
    assert _cosine(f, q) > 0.99
    assert not np.array_equal(f, q)  # it is quantized


def test_report_and_summary(main_quantized):
    rep = main_quantized.report
    decided = {d.node: (d.quantized, d.pattern) for d in rep.decisions}
    assert decided == {"conv1": (True, "conv"), "conv2": (True, "conv"), "add1": (True, "binary"),
                       "sig1": (True, "elementwise"), "mul1": (True, "binary"), "gap1": (True, "pool"),
                       "mm1": (True, "matmul")}
    assert rep.num_samples == 16 and rep.calibration_seconds >= 0
    assert rep.summary().splitlines()[0].startswith("quantized 7 pattern(s), 0 node(s) kept in float; "
                                                    "calibration ")
    assert "on 16 sample(s)" in rep.summary()


def test_canonical_model_is_integer_only(main_quantized):
    can = main_quantized.canonical
    assert main_quantized.report.left_in_float == []
    assert _float_compute_nodes(can) == []
    ops = [n.op_type for n in can.graph]
    assert ops[0] == "quantize" and ops[-1] == "dequantize"
    assert {"conv", "add", "lut", "mul", "global_avg_pool", "matmul"} <= set(ops)
    assert not {"QuantizeLinear", "DequantizeLinear", "Conv", "Add", "Mul", "Sigmoid", "MatMul"} & set(ops)


def test_canonical_equals_qdq_on_ort_without_optimizations_within_one_quantum(main_quantized):
    qdq, can = main_quantized.qdq, main_quantized.canonical
    quantum = _output_scale(qdq)
    want = _outputs(qdq, TEST_INPUTS, optimize=False)
    ref = _outputs(can, TEST_INPUTS, runner=run_ref)
    lowered = qnnx.lower(can)
    assert not any(n.domain == "qnnx" for n in lowered.graph)
    low = _outputs(lowered, TEST_INPUTS)
    assert len(np.unique(want)) > 10  # not a degenerate comparison
    assert np.abs(ref - want).max() <= quantum * 1.001
    assert np.abs(low - want).max() <= quantum * 1.001
    np.testing.assert_array_equal(low, ref)  # lowering is bit-exact


@pytest.mark.parametrize("fmt", ["qdq", "qnnx", "lowered"])
def test_save_writes_a_loadable_file_atomically(main_quantized, tmp_path, fmt):
    target = tmp_path / "out" / f"m.{fmt}.onnx"
    assert main_quantized.save(target, format=fmt) == target
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temporary file left
    loaded = onnx.load(target)
    domains = {n.domain for n in loaded.graph.node}
    x = TEST_INPUTS[0]
    if fmt == "qdq":
        assert domains == {""} and "QuantizeLinear" in {n.op_type for n in loaded.graph.node}
        np.testing.assert_array_equal(run_ort(loaded, {"x": x})[0], run_ort(main_quantized.qdq, {"x": x})[0])
    elif fmt == "qnnx":
        assert "qnnx" in domains
        np.testing.assert_array_equal(run_ref(loaded, {"x": x})[0], run_ref(main_quantized.canonical, {"x": x})[0])
    else:
        assert domains == {""}
        np.testing.assert_array_equal(run_ort(loaded, {"x": x})[0], run_ref(main_quantized.canonical, {"x": x})[0])


def test_default_save_format_is_qdq(main_quantized, tmp_path):
    main_quantized.save(tmp_path / "m.onnx")
    assert "QuantizeLinear" in {n.op_type for n in onnx.load(tmp_path / "m.onnx").graph.node}


def test_save_refuses_an_unknown_format(main_quantized, tmp_path):
    with pytest.raises(QnnxError, match="unknown output format 'tflite'; expected qdq, qnnx or lowered"):
        main_quantized.save(tmp_path / "m.onnx", format="tflite")
    assert list(tmp_path.iterdir()) == []


def test_save_failure_leaves_the_previous_file_and_no_temporary(main_quantized, tmp_path, monkeypatch):
    target = tmp_path / "m.onnx"
    target.write_bytes(b"previous")

    def failing_save(model, path, **kw):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(ir, "save", failing_save)
    with pytest.raises(QnnxError, match="cannot write the model: disk full"):  # one line, exit 1 on the CLI
        main_quantized.save(target)
    assert target.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]


def test_data_movement_values_share_the_qparams_of_their_source(main_quantized):
    qdq = main_quantized.qdq
    # MaxPool: its output (the pool's input target) is quantized exactly like the mul output it comes from
    for source, moved in [("m1", "p1"), ("g1", "f1")]:  # m1 -MaxPool-> p1, g1 -Transpose-Reshape-> f1
        (s_scale, s_zp), (m_scale, m_zp) = qparams_of(qdq_of(qdq, source)[0]), qparams_of(qdq_of(qdq, moved)[0])
        assert s_scale == m_scale and s_zp == m_zp and s_zp.dtype == m_zp.dtype
    can = main_quantized.canonical
    movers = [n for n in can.graph if n.op_type in ("MaxPool", "Transpose", "Reshape")]
    assert sorted(n.op_type for n in movers) == ["MaxPool", "Reshape", "Transpose"]
    for n in movers:
        producer = n.inputs[0].producer()
        assert producer is not None and producer.op_type != "requantize", n.name
        assert all(u.node.op_type != "requantize" for u in n.outputs[0].uses()), n.name
        assert n.outputs[0].dtype == ir.DataType.UINT8
    assert sum(n.op_type == "requantize" for n in can.graph) == 3  # after conv1, conv2, matmul: no others


def test_max_pool_reads_its_own_per_channel_dequantize_so_ort_keeps_it_float(main_quantized):
    # ONNX Runtime drops DQ -> MaxPool -> Q into a slow uint8 MaxPool only for scalar qparams; qnnx's
    # QDQ as written for ORT gives the MaxPool the same qparams repeated per channel: same numbers, float
    # kernel. The logical QDQ model keeps the per-tensor DequantizeLinear (a target's shaping, not qnnx's).
    assert next(n for n in main_quantized.qdq.graph if n.op_type == "MaxPool").inputs[0].producer() \
        .attributes.get("axis") is None
    qdq = main_quantized.export("qdq")
    pool = next(n for n in qdq.graph if n.op_type == "MaxPool")
    dq = pool.inputs[0].producer()
    assert dq.op_type == "DequantizeLinear" and dq.attributes["axis"].value == 1
    scale, zp = (dq.inputs[i].const_value.numpy() for i in (1, 2))
    channels = pool.inputs[0].shape[1]
    assert scale.shape == zp.shape == (channels,)
    q = dq.inputs[0].producer()  # the per-tensor qparams the values were quantized with
    q_scale, q_zp = qparams_of(q)
    assert np.all(scale == q_scale) and np.all(zp == q_zp)
    # The same model with a per-tensor DQ there (what ORT would fuse) computes the same bits.
    proto = ir.to_proto(qdq)
    node = next(n for n in proto.graph.node if n.name == dq.name)
    node.input[1], node.input[2] = q.inputs[1].name, q.inputs[2].name
    del node.attribute[:]
    x = samples(1, seed=3)[0]
    np.testing.assert_array_equal(run_ort(qdq, {"x": x})[0], run_ort(proto, {"x": x})[0])
    # FQ2I reads repeated qparams as per-tensor: no requantize appears around the integer MaxPool.
    can_pool = next(n for n in main_quantized.canonical.graph if n.op_type == "MaxPool")
    assert can_pool.inputs[0].producer().op_type != "requantize"


def _shift_model(shift: float, bias: bool = False):
    """x -> conv (padded) -> sigmoid -> Add(shift) -> conv (padded, biased if ``bias``) -> y: the shift
    feeds a padded conv, so prepare cannot fold it (padding taps would see 0, not the shift)."""
    g = Graph()
    c1 = g.node("Conv", [g.input("x", [1, 3, 8, 8]), g.const(conv_weight(RNG, 4, 3), "w1")], name="c1",
                pads=[1, 1, 1, 1])
    s = g.node("Sigmoid", [c1], name="sig")
    a = g.node("Add", [s, g.const(np.array(shift, np.float32), "shift")], name="shift_add")
    b2 = [g.const(np.array([0.3, -0.2], np.float32), "b2")] if bias else []
    g.node("Conv", [a, g.const(conv_weight(RNG, 2, 4), "w2"), *b2], name="c2", pads=[1, 1, 1, 1], out="y")
    return g.model("y")


def test_a_constant_add_becomes_a_zero_point_shift():
    # sigmoid's output is quantized on [0, 1] (scale 1/255, zero point 0); + 0.25 is 63.75 steps: the
    # conv would read the sigmoid's integers with zero point -64, which uint8 cannot hold, so the add
    # stays; at -0.25 the zero point becomes +64 and the add is gone.
    stays = _quantize(_shift_model(0.25))
    assert "Add" in [n.op_type for n in stays.qdq.graph]
    model = _shift_model(-0.25)
    qm = _quantize(model)
    assert "Add" not in [n.op_type for n in qm.qdq.graph]
    conv = nodes_by_name(qm.qdq)["c2"]
    dq = conv.inputs[0].producer()
    scale, zp = dq.inputs[1].const_value.numpy(), dq.inputs[2].const_value.numpy()
    q = dq.inputs[0].producer()
    q_scale, q_zp = qparams_of(q)
    assert q.inputs[0].producer().op_type == "Sigmoid" and scale == q_scale
    assert int(zp) == int(q_zp) + round(0.25 / float(q_scale)) == 64
    # the integers now mean sigmoid - 64 steps: close to the float model, and FQ2I's canonical model
    # (an integer conv with input zero point 64) agrees with ORT on the QDQ model
    inputs = samples(4, seed=5)
    want = _outputs(model, inputs)
    got = _outputs(qm.qdq, inputs)
    assert _cosine(want, got) > 0.999
    assert not any(n.op_type == "Add" for n in qm.canonical.graph)
    ref = _outputs(qm.canonical, inputs, runner=run_ref)
    assert np.abs(ref - _outputs(qm.qdq, inputs, optimize=False)).max() <= _output_scale(qm.qdq) * 1.001


def test_a_zero_point_shift_requantizes_the_readers_bias_so_ort_still_fuses_the_conv(tmp_path):
    # The shift changes the conv's input scale from the add's calibrated one to the sigmoid's: a bias
    # left at the old x_scale * w_scale makes ONNX Runtime keep the conv float (it happened to 9 of
    # PP-OCRv4 rec's depthwise convs).
    model = _shift_model(-0.25, bias=True)
    # the float bias, requantized, is what is checked below (nearest rounding: gptq folds its mean error in)
    qm = _quantize(model, bias_correction="off", weight_rounding="nearest")
    assert "Add" not in [n.op_type for n in qm.qdq.graph]
    conv = nodes_by_name(qm.qdq)["c2"]
    x_scale = conv.inputs[0].producer().inputs[1].const_value.numpy()
    w_scale = conv.inputs[1].producer().inputs[1].const_value.numpy()
    bias_dq = conv.inputs[2].producer()
    np.testing.assert_array_equal(bias_dq.inputs[1].const_value.numpy(), (np.float32(x_scale) * w_scale).astype(np.float32))
    bias = bias_dq.inputs[0].const_value.numpy() * bias_dq.inputs[1].const_value.numpy()
    np.testing.assert_allclose(bias, [0.3, -0.2], atol=float(np.max(bias_dq.inputs[1].const_value.numpy())))
    assert all(n.outputs[0].uses() or n.outputs[0].is_graph_output() for n in qm.qdq.graph
               if n.op_type == "DequantizeLinear")  # the replaced bias's DequantizeLinear is gone
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    so.log_severity_level = 3
    ort.InferenceSession(ir.to_proto(qm.qdq).SerializeToString(), so, providers=["CPUExecutionProvider"])
    assert "Conv" not in [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node]
    inputs = samples(4, seed=5)
    assert _cosine(_outputs(model, inputs), _outputs(qm.qdq, inputs)) > 0.999


def test_the_report_compares_every_output_with_the_float_model(main_float, main_quantized):
    (out,) = main_quantized.report.outputs
    assert out.name == "y" and out.samples == QuantConfig().calibration.refinement_samples
    # The same statistic, computed independently on the same (first) calibration samples.
    want = [run_ort(main_float, {"x": x})[0] for x in samples(16)[:out.samples]]
    got = [run_ort(main_quantized.qdq, {"x": x})[0] for x in samples(16)[:out.samples]]
    ref, q = np.concatenate([w.ravel() for w in want]), np.concatenate([g.ravel() for g in got])
    assert out.sqnr_db == pytest.approx(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((ref - q) ** 2.0)),
                                        rel=1e-3)
    assert out.cosine > 0.999 and not main_quantized.report.far_outputs()
    assert f"outputs vs float on {out.samples} calibration sample(s): y SQNR" in main_quantized.report.summary()
    assert "WARNING" not in main_quantized.report.summary()


def test_a_quantization_far_from_the_float_model_is_flagged_in_the_report(main_float):
    # Clipping 80% of every activation: the output no longer follows the float model. With the accuracy
    # guard off, the model is returned and the report says so; by default the guard returns the patterns
    # adding the most error to float until no output is far (or refuses the model if none can stay).
    qm = _quantize(main_float, samples(16), method="percentile", percentile=20.0, accuracy_guard=False)
    (far,) = qm.report.far_outputs()
    assert far.name == "y" and far.cosine < 0.9
    assert "WARNING: output 'y' is far from the float model's" in qm.report.summary()
    guarded = _quantize(main_float, samples(16), method="percentile", percentile=20.0)
    assert guarded.report.record("accuracy_guard").left_float and not guarded.report.far_outputs()


def test_the_input_model_file_and_object_are_untouched(tmp_path, main_float):
    path = tmp_path / "float.onnx"
    onnx.save(main_float, path)
    before = path.read_bytes()
    proto_before = main_float.SerializeToString()
    qm = qnnx.quantize(path, samples(4), QuantConfig(progress=False))
    qm.save(tmp_path / "q.onnx", format="lowered")
    assert path.read_bytes() == before
    assert main_float.SerializeToString() == proto_before
    as_ir = ir.from_proto(main_float)
    qnnx.quantize(as_ir, samples(2), QuantConfig(progress=False))
    assert ir.to_proto(as_ir).SerializeToString() == ir.to_proto(ir.from_proto(main_float)).SerializeToString()


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize("per_channel", [True, False])
def test_weights_per_channel_or_per_tensor(main_float, per_channel):
    qdq = _quantize(main_float, per_channel=per_channel).qdq
    for node, axis, channels in [("conv1", 0, 8), ("conv2", 0, 8), ("mm1", 1, 5)]:
        dq = _weight_dq(qdq, node)
        scale, zp = qparams_of(dq)
        assert dq.inputs[0].const_value.dtype == ir.DataType.INT8 and not zp.any()  # int8 symmetric
        if per_channel:
            assert _axis(dq) == axis and scale.shape == (channels,) and len(np.unique(scale)) == channels
        else:
            assert _axis(dq) is None and scale.shape == ()
    # the bias is int32 with scale x_scale * w_scale (per channel when the weights are)
    x_scale = qparams_of(qdq_of(qdq, "x")[0])[0]
    w_scale = qparams_of(_weight_dq(qdq, "conv1"))[0]
    b = _weight_dq(qdq, "conv1", 2)
    assert b.inputs[0].const_value.dtype == ir.DataType.INT32
    np.testing.assert_allclose(np.broadcast_to(qparams_of(b)[0], (8,)), np.broadcast_to(x_scale * w_scale, (8,)),
                               rtol=1e-6)
    f, q = _outputs(main_float, TEST_INPUTS), _outputs(qdq, TEST_INPUTS)
    assert _cosine(f, q) > 0.99


@pytest.mark.parametrize("dtype,onnx_type", [("uint8", ir.DataType.UINT8), ("int8", ir.DataType.INT8)])
def test_activation_dtype_is_honoured(main_float, dtype, onnx_type):
    qm = _quantize(main_float, activation_dtype=dtype)
    qs = _activation_qs(qm.qdq)
    assert len(qs) >= 9
    for q in qs:
        assert q.inputs[2].const_value.dtype == onnx_type, q.name
        assert q.outputs[0].dtype in (None, onnx_type)
    assert _weight_dq(qm.qdq, "conv1").inputs[0].const_value.dtype == ir.DataType.INT8  # weights stay int8
    assert _cosine(_outputs(main_float, TEST_INPUTS), _outputs(qm.qdq, TEST_INPUTS)) > 0.99
    can = qm.canonical
    assert qm.report.left_in_float == [] and _float_compute_nodes(can) == []
    assert {n.outputs[0].dtype for n in can.graph if n.op_type == "MaxPool"} == {onnx_type}


def test_int16_activations_on_opset_21():
    qm = _quantize(main_model(opset=21), activation_dtype="int16")
    assert {q.inputs[2].const_value.dtype for q in _activation_qs(qm.qdq)} == {ir.DataType.INT16}
    assert _cosine(_outputs(main_model(opset=21), TEST_INPUTS), _outputs(qm.qdq, TEST_INPUTS)) > 0.999


def test_int16_activations_on_opset_17_give_a_valid_model():
    qm = _quantize(main_model(opset=17), activation_dtype="int16")
    run_ort(qm.qdq, {"x": TEST_INPUTS[0]})


def test_excluded_nodes_and_op_types_stay_float_and_are_reported(main_float):
    qm = _quantize(main_float, exclude_nodes=("conv2",), exclude_op_types=("MatMul",))
    decided = {d.node: d for d in qm.report.decisions}
    for name in ("conv2", "mm1"):
        assert not decided[name].quantized and decided[name].reason == "excluded by the user"
    assert all(d.quantized for n, d in decided.items() if n not in ("conv2", "mm1"))
    assert "float: conv2 (Conv): excluded by the user" in qm.report.summary()
    nodes = nodes_by_name(qm.qdq)
    for name in ("conv2", "mm1"):  # float weights, as in the float model
        w = nodes[name].inputs[1]
        assert w.producer() is None and w.const_value.dtype == ir.DataType.FLOAT
    assert nodes["conv2"].inputs[2].producer() is None  # float bias
    assert _weight_dq(qm.qdq, "conv1").inputs[0].const_value.dtype == ir.DataType.INT8
    can = nodes_by_name(qm.canonical)
    assert can["conv2"].op_type == "Conv" and can["mm1"].op_type == "MatMul"
    assert can["conv2"].outputs[0].dtype == ir.DataType.FLOAT
    assert "conv" in {n.op_type for n in qm.canonical.graph}  # conv1 is still integer
    assert _cosine(_outputs(main_float, TEST_INPUTS), _outputs(qm.qdq, TEST_INPUTS)) > 0.99


def test_excluding_sigmoid_keeps_it_float(main_float):
    qm = _quantize(main_float, exclude_op_types=("Sigmoid",))
    assert {d.node: d.reason for d in qm.report.decisions}["sig1"] == "excluded by the user"
    sig = nodes_by_name(qm.qdq)["sig1"]
    assert all(u.node.op_type != "QuantizeLinear" for u in sig.outputs[0].uses())


def test_excluding_a_fused_activation_is_reported(main_float):
    qm = _quantize(main_float, exclude_nodes=("relu1",))
    assert "relu1" in {d.node for d in qm.report.decisions if d.reason == "excluded by the user"}


def test_concat_with_an_input_from_an_excluded_node_stays_float():
    # YOLOv8n's head: box coordinates (hundreds) concatenated with class probabilities (0..1). With the
    # Sigmoid excluded, its output was never observed, and a quantized Concat crushed every score to 0.
    g = Graph()
    big = g.node("Conv", [g.input("x", [1, 3, 6, 6]), g.const(conv_weight(RNG, 4, 3, std=30.0), "w")], name="conv",
                 pads=[1, 1, 1, 1])
    sig = g.node("Sigmoid", [g.node("Conv", ["x", g.const(conv_weight(RNG, 2, 3), "w2")], name="conv2",
                                    pads=[1, 1, 1, 1])], name="sig")
    g.node("Concat", [big, sig], name="cat", axis=1, out="y")
    model = g.model("y")
    qm = _quantize(model, samples(8, (1, 3, 6, 6)), exclude_nodes=("sig",))
    cat = {d.node: d for d in qm.report.decisions}["cat"]
    assert not cat.quantized and "excluded" in cat.reason
    x = samples(1, (1, 3, 6, 6), seed=5)[0]
    want, got = run_ort(model, {"x": x})[0][:, 4:], run_ort(qm.qdq, {"x": x})[0][:, 4:]
    np.testing.assert_allclose(got, want, atol=0.05)  # the probabilities survive (quantized: all 0 or one level)


def test_exclude_a_node_by_its_name_when_prepare_rewrites_it():
    g = Graph()
    c = g.node("Conv", [g.input("x", [1, 3, 6, 6]), g.const(conv_weight(RNG, 4, 3), "w"),
                        g.const(np.zeros(4, np.float32), "b")], name="conv")
    g.node("Sigmoid", [c], name="sig", out="y")
    qm = _quantize(g.model("y"), samples(4, (1, 3, 6, 6)), exclude_nodes=("conv",))
    assert {d.node: d.quantized for d in qm.report.decisions}.get("conv") is False


@pytest.mark.parametrize("name", ["bias_add", "shift", "conv"])
def test_excluding_a_node_that_prepare_folded_excludes_the_node_that_absorbed_it(name):
    """prepare folds a shift into the 1x1 conv after it and a bias Add into the conv before it; the user
    still names them as in their model: the conv that now computes them stays float, and the model
    written out carries no trace of the bookkeeping."""
    g = Graph()
    s = g.node("Add", [g.input("x", [1, 3, 6, 6]), g.const(np.array(0.5, np.float32), "c")], name="shift")
    c = g.node("Conv", [s, g.const(conv_weight(RNG, 4, 3, k=1), "w"), g.const(np.ones(4, np.float32), "b")],
               name="conv")
    a = g.node("Add", [c, g.const(RNG.normal(size=(4, 1, 1)).astype(np.float32), "beta")], name="bias_add")
    g.node("Sigmoid", [a], name="sig", out="y")
    qm = _quantize(g.model("y"), samples(4, (1, 3, 6, 6)), exclude_nodes=(name,))
    decisions = {d.node: d for d in qm.report.decisions}
    assert decisions["conv"].quantized is False and decisions["conv"].reason == "excluded by the user"
    assert decisions["sig"].quantized
    assert "conv" in qm.keep_float
    assert not qm.qdq.graph.metadata_props and not qm.canonical.graph.metadata_props.get("qnnx.prepare.folded_into")
    with pytest.raises(QnnxError, match="--exclude-node 'nope' matches no node of the model"):
        _quantize(g.model("y"), samples(4, (1, 3, 6, 6)), exclude_nodes=("nope",))


def test_excluding_a_bias_add_that_hid_a_batch_norm_follows_the_conv_fusion():
    """Conv -> bias Add -> BatchNorm: prepare folds the Add into the conv, then fuses the BatchNorm, which
    replaces the conv by one named after the BatchNorm; naming the Add still finds (and excludes) it."""
    g = Graph()
    c = g.node("Conv", [g.input("x", [1, 3, 6, 6]), g.const(conv_weight(RNG, 4, 3), "w")], name="conv",
               pads=[1, 1, 1, 1])
    a = g.node("Add", [c, g.const(RNG.normal(size=(4, 1, 1)).astype(np.float32), "beta")], name="bias_add")
    bn = g.node("BatchNormalization", [a] + [g.const(v.astype(np.float32), n) for n, v in (
        ("gamma", np.full(4, 1.5)), ("b", np.full(4, 0.1)), ("mean", np.full(4, 0.2)), ("var", np.ones(4)))],
        name="bn")
    r = g.node("Relu", [bn], name="relu")
    g.node("Conv", [r, g.const(conv_weight(RNG, 2, 4), "w2")], name="head", out="y")
    qm = _quantize(g.model("y"), samples(4, (1, 3, 6, 6)), exclude_nodes=("bias_add",))
    decisions = {d.node: d for d in qm.report.decisions}
    assert decisions["bn"].op_type == "Conv"  # the fused conv, named after the BatchNorm
    assert decisions["bn"].quantized is False and decisions["bn"].reason == "excluded by the user"
    assert decisions["head"].quantized


def test_sqnr_threshold_very_high_sends_every_pattern_back_to_float(main_float):
    # (a model left all float is an error unless asked for)
    qm = _quantize(main_float, sqnr_threshold_db=1000.0, allow_float=True)
    assert len(qm.report.decisions) == 7
    for d in qm.report.decisions:
        assert not d.quantized and math.isfinite(d.sqnr_db), d
        m = re.fullmatch(r"output SQNR (-?\d+\.\d) dB below 1000\.0 dB: kept float", d.reason)
        assert m and float(m.group(1)) == pytest.approx(d.sqnr_db, abs=0.051), d.reason
    assert not {"QuantizeLinear", "DequantizeLinear"} & {n.op_type for n in qm.qdq.graph}
    assert "quantized 0 pattern(s), 7 node(s) kept in float" in qm.report.summary()
    assert "worst layers by output SQNR" in qm.report.summary()
    np.testing.assert_allclose(_outputs(qm.qdq, TEST_INPUTS[:2]), _outputs(main_float, TEST_INPUTS[:2]),
                               rtol=1e-5, atol=1e-6)


def test_sqnr_threshold_very_low_keeps_everything_and_a_middle_one_splits(main_float, main_quantized):
    low = _quantize(main_float, samples(16), sqnr_threshold_db=-1000.0)
    assert all(d.quantized and math.isfinite(d.sqnr_db) and d.sqnr_db > 10 for d in low.report.decisions)
    assert ir.to_proto(low.qdq).graph == ir.to_proto(main_quantized.qdq).graph  # same model as without fallback
    scores = sorted(d.sqnr_db for d in low.report.decisions)
    threshold = (scores[2] + scores[3]) / 2
    mid = _quantize(main_float, samples(16), sqnr_threshold_db=threshold)
    by_node = {d.node: d.sqnr_db for d in low.report.decisions}
    for d in mid.report.decisions:
        assert d.quantized == (by_node[d.node] >= threshold), (d.node, by_node[d.node], threshold)
        if not d.quantized:
            assert "below" in d.reason and d.node in {n.name for n in mid.qdq.graph}
    kept_float = {d.node for d in mid.report.decisions if not d.quantized}
    assert len(kept_float) == 3
    assert _cosine(_outputs(main_float, TEST_INPUTS), _outputs(mid.qdq, TEST_INPUTS)) > 0.99


def test_sqnr_fallback_with_a_generator(main_float):
    _quantize(main_float, (x for x in samples(8)), sqnr_threshold_db=10.0)


@pytest.mark.parametrize("method", METHODS)
def test_every_calibration_method_runs(main_float, method):
    qm = _quantize(main_float, method=method)
    scales = _all_scales(qm.qdq)
    assert all(np.all(s > 0) and np.all(np.isfinite(s)) for s in scales)
    q = _outputs(qm.qdq, TEST_INPUTS)
    assert np.isfinite(q).all()
    assert _cosine(_outputs(main_float, TEST_INPUTS), q) > 0.9
    assert _float_compute_nodes(qm.canonical) == [] and qm.report.left_in_float == []


def test_calibration_methods_choose_different_ranges(main_float):
    # one outlier value: minmax covers it, percentile 99 clips it
    outlier = samples(1, seed=5)[0]
    outlier[0, 0, 0, 0] = 40.0
    calib = samples(8) + [outlier]
    x_scale = {m: float(qparams_of(qdq_of(_quantize(main_float, calib, method=m, percentile=99.0).qdq, "x")[0])[0])
               for m in ("minmax", "percentile")}
    assert x_scale["minmax"] >= 40.0 / 255 * 0.99
    assert x_scale["percentile"] < x_scale["minmax"] / 4


@pytest.mark.parametrize("method", METHODS)
def test_constant_activation_never_gets_a_zero_scale(method):
    g = Graph()
    c = g.node("Conv", [g.input("x", [1, 3, 6, 6]), g.const(conv_weight(RNG, 4, 3), "w")], name="conv1")
    r = g.node("Relu", [c], name="relu1")
    c2 = g.node("Conv", [r, g.const(conv_weight(RNG, 4, 4, k=1), "w2")], name="conv2")
    g.node("Sigmoid", [c2], name="sig", out="y")
    model = g.model("y")
    zeros = [np.zeros((1, 3, 6, 6), np.float32)] * 3  # every activation is constant 0 (sigmoid: 0.5)
    for dtype in ("uint8", "int8"):
        qm = _quantize(model, zeros, method=method, activation_dtype=dtype)
        scales = _all_scales(qm.qdq)
        assert len(scales) >= 6 and all(np.all(s > 0) and np.all(np.isfinite(s)) for s in scales)
        x = RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
        want = run_ort(qm.qdq, {"x": x}, optimize=False)[0]
        assert np.isfinite(want).all()
        np.testing.assert_allclose(run_ref(qm.canonical, {"x": x})[0], want, atol=_output_scale(qm.qdq) * 1.001)
        assert qm.report.left_in_float == []


@pytest.mark.parametrize("dtype,qmin,qmax", [("uint8", 0, 255), ("int8", -128, 127)])
def test_softmax_output_range_is_fixed_to_zero_one_whatever_the_calibration(dtype, qmin, qmax):
    g = Graph()
    c = g.node("Conv", [g.input("x", [1, 3, 4, 4]), g.const(conv_weight(RNG, 6, 3, k=1), "w")], name="conv")
    g.node("Softmax", [c], name="sm", axis=1, out="y")
    model = g.model("y")
    for calib_scale in (0.01, 10.0):  # nearly uniform (max ~1/6) or nearly one-hot outputs
        qm = _quantize(model, samples(4, (1, 3, 4, 4), scale=calib_scale), activation_dtype=dtype)
        scale, zp = qparams_of(qdq_of(qm.qdq, "y_float")[0])
        lo, hi = (qmin - int(zp)) * float(scale), (qmax - int(zp)) * float(scale)
        assert lo == 0.0 and abs(hi - 1.0) <= 1.001 * float(scale), (scale, zp)  # [0, 1] within a quantum
        assert {d.node: d.pattern for d in qm.report.decisions} == {"conv": "conv", "sm": "softmax"}


@pytest.mark.parametrize("calibrator", ["float", "sequential"])
def test_values_whose_qparams_follow_from_the_plan_are_not_observed(calibrator):
    # conv -> Div(6) -> conv and conv -> HardSigmoid -> Mul: the Div output (the input's scale / 6) and
    # the gate ([0, 1]) are read by patterns, so they are their own share roots; observing them was
    # wasted work (their qparams come from the plan), and they must still get those qparams.
    g = Graph()
    x = g.input("x", [1, 3, 6, 6])
    a = g.node("Conv", [x, g.const(conv_weight(RNG, 4, 3, k=1), "w1")], name="conv1", out="a")
    d = g.node("Div", [a, g.const(np.array(6.0, np.float32))], name="div", out="d")
    b = g.node("Conv", [d, g.const(conv_weight(RNG, 4, 4, k=1), "w2")], name="conv2", out="b")
    gate = g.node("HardSigmoid", [b], name="gate", out="gate")
    g.node("Mul", [b, gate], name="mul", out="y")
    options = dict(calibrator=calibrator, sequential_passes=2)
    qparams, runs = _calibrated_counting_runs(g.model("y"), samples(4, (1, 3, 6, 6)), **options)
    assert set(qparams) == {"x", "a", "b", "y"}  # the observed roots; neither d nor the gate
    assert len({name for names, _, _ in runs for name in names}) == 4  # and nothing else is fetched
    qm = _quantize(g.model("y"), samples(4, (1, 3, 6, 6)), **options)
    # the Div is a rescaled DequantizeLinear of a's integers (ScalePattern)
    conv2_input = nodes_by_name(qm.qdq)["conv2"].inputs[0].producer()
    (a_scale, a_zp), (d_scale, d_zp) = qparams_of(qdq_of(qm.qdq, "a")[0]), qparams_of(conv2_input)
    assert float(d_scale) == pytest.approx(float(a_scale) / 6, rel=1e-6) and int(d_zp) == int(a_zp)
    g_scale, g_zp = qparams_of(qdq_of(qm.qdq, "gate")[0])
    assert int(g_zp) == 0 and float(g_scale) == pytest.approx(1 / 255, rel=1e-6)


def test_nan_in_calibration_data_names_the_input(main_float):
    bad = samples(1)[0]
    bad[0, 1, 2, 3] = np.nan
    with pytest.raises(QnnxError, match=r"calibration sample 3: input 'x' has 1 NaN/Inf value\(s\)"):
        _quantize(main_float, samples(3) + [bad])


def test_nan_inside_the_model_names_the_tensor():
    g = Graph()
    lg = g.node("Log", [g.input("x", [4])], name="log", out="logx")
    g.node("Sigmoid", [lg], name="sig", out="y")
    with pytest.raises(QnnxError, match=r"tensor 'logx' \(calibration sample 1\).*1 NaN"):
        _quantize(g.model("y"), [np.ones(4, np.float32), np.array([1, 2, -1, 3], np.float32)])


def _with_middle_op(kind: str):
    g = Graph()
    x = g.input("x", [1, 3, 8, 8])
    c1 = g.node("Conv", [x, g.const(conv_weight(RNG, 4, 3), "w1"), g.const(np.full(4, .1, np.float32), "b1")],
                name="conv1", out="c1")
    if kind == "topk":
        mid = g.node("TopK", [c1, g.const(np.array([4], np.int64), "k")], name="topk", outputs=2, axis=3)[0]
    else:
        mid = g.node("Gelu", [c1], name="custom", domain="com.microsoft")
    g.node("Conv", [mid, g.const(conv_weight(RNG, 4, 4, k=1), "w2"), g.const(np.full(4, .1, np.float32), "b2")],
           name="conv2", out="y")
    return g.model("y")


@pytest.mark.parametrize("kind,node,op,reason", [
    ("topk", "topk", "TopK", "no integer rule for this op"),
    ("custom", "custom", "Gelu", None),  # com.microsoft: a custom domain ONNX Runtime can run
])
def test_an_unsupported_op_stays_float_and_the_rest_is_quantized(kind, node, op, reason):
    model = _with_middle_op(kind)
    qm = _quantize(model, samples(4))
    assert {d.node: d.quantized for d in qm.report.decisions} == {"conv1": True, "conv2": True, node: False}
    assert next(d for d in qm.report.decisions if d.node == node).reason == "no quantization pattern for this op"
    assert nodes_by_name(qm.qdq)[node].op_type == op
    can = qm.canonical
    assert [n.op_type for n in can.graph].count("conv") == 2
    entries = [e for e in qm.report.left_in_float if e[0] == node]
    assert len(entries) == 1 and entries[0][1] == op and entries[0][2], qm.report.left_in_float
    if reason:
        assert entries[0][2] == reason
    f, q = _outputs(model, TEST_INPUTS), _outputs(qm.qdq, TEST_INPUTS)
    assert _cosine(f, q) > 0.99
    # lowered + ORT: qnnx's reference evaluator does not know com.microsoft ops
    np.testing.assert_allclose(_outputs(qnnx.lower(can), TEST_INPUTS[:2], optimize=False),
                               _outputs(qm.qdq, TEST_INPUTS[:2], optimize=False), atol=_output_scale(qm.qdq) * 1.001)


def test_the_summary_lists_an_unsupported_op():
    qm = _quantize(_with_middle_op("topk"), samples(4))
    assert qm.canonical is not None
    assert "topk" in qm.report.summary()


def test_an_op_ort_cannot_run_is_a_clear_error():
    g = Graph()
    c = g.node("Conv", [g.input("x", [1, 3, 8, 8]), g.const(conv_weight(RNG, 4, 3), "w")], name="conv1")
    g.node("MyOp", [c], name="mine", domain="example.custom", out="y")
    with pytest.raises(QnnxError, match="MyOp"):
        _quantize(g.model("y"), samples(2))


def test_nothing_to_quantize():
    g = Graph()
    r = g.node("Relu", [g.input("x", [2, 6])], name="relu")
    t = g.node("Transpose", [r], name="t", perm=[1, 0])
    g.node("TopK", [t, g.const(np.array([2], np.int64), "k")], name="topk", outputs=2, axis=0)
    model = g.model(g.nodes[-1].output[0])
    with pytest.raises(QnnxError, match="nothing to quantize: no node matched a quantization pattern"):
        _quantize(model, [np.ones((2, 6), np.float32)])


def test_grouped_conv_transpose_weights_are_int8():
    g = Graph()
    c = g.node("ConvTranspose", [g.input("x", [1, 4, 5, 5]), g.const(conv_weight(RNG, 4, 2), "w"),
                                 g.const(np.full(4, 0.1, np.float32), "b")], name="ct", group=2, strides=[2, 2])
    g.node("Sigmoid", [c], name="sig", out="y")
    qm = _quantize(g.model("y"), samples(4, (1, 4, 5, 5)))
    w = _weight_dq(qm.qdq, "ct")
    assert w.inputs[0].const_value.dtype == ir.DataType.INT8 and not qparams_of(w)[1].any()
    assert _weight_dq(qm.qdq, "ct", 2).inputs[0].const_value.dtype == ir.DataType.INT32


def test_qdq_model_has_no_unused_float_weights(main_float, main_quantized):
    p = ir.to_proto(main_quantized.qdq)
    used = {i for n in p.graph.node for i in n.input}
    assert [t.name for t in p.graph.initializer if t.name not in used] == []
    # (no file-size comparison: on a 4 KB model the qparams and value_info outweigh the int8 saving)


def test_num_samples_and_progress(main_float, capsys):
    qm = qnnx.quantize(main_float, samples(10), QuantConfig(num_samples=3, progress=True))
    assert qm.report.num_samples == 3
    err = capsys.readouterr().err
    assert "calibrating 3/3 samples" in err and err.endswith("\n")
    _quantize(main_float, samples(2))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("options,message", [
    (dict(method="kl"), "method must be one of minmax, moving_average, percentile, entropy, mse, got 'kl'"),
    (dict(activation_dtype="int4"), "activation_dtype must be one of"),
    (dict(weight_dtype="uint8"), "weight_dtype must be one of"),
    (dict(percentile=0), "percentile must be in (0, 100]"),
    (dict(num_samples=0), "num_samples must be >= 1"),
    (dict(batch_size=0), "batch_size must be >= 1"),
    (dict(exclude_nodes="conv1"), "exclude_nodes must be a sequence of names"),
])
def test_config_is_validated(options, message):
    with pytest.raises(QnnxError) as info:
        QuantConfig(**options)
    assert message in str(info.value)


def test_config_from_dict_rejects_unknown_keys():
    assert QuantConfig.from_dict({"method": "mse", "exclude_nodes": ["a"]}).exclude_nodes == ("a",)
    with pytest.raises(QnnxError, match="unknown QuantConfig option 'flavour'"):
        QuantConfig.from_dict({"flavour": 1, "colour": 2})


# --------------------------------------------------------------------------- memory


def _peak_bytes(model, n: int) -> int:
    def gen():
        rng = np.random.default_rng(0)
        for _ in range(n):
            yield rng.standard_normal((1, 3, 48, 48)).astype(np.float32)

    gc.collect()
    tracemalloc.start()
    try:
        # percentile: a streaming histogram method whose final search is small, so the peak is dominated
        # by what calibration holds (mse's 2-D range search alone would allocate several MB)
        # a callable giving a fresh generator on each pass: the samples are never all held (a one-shot
        # iterator would be kept in memory, so that every pass reads the same samples)
        qnnx.quantize(model, gen, QuantConfig(progress=False, method="percentile"))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_calibration_keeps_no_per_sample_state():
    g = Graph()
    c = g.node("Conv", [g.input("x", [1, 3, 48, 48]), g.const(conv_weight(RNG, 4, 3), "w")], name="conv",
               pads=[1, 1, 1, 1])
    r = g.node("Relu", [c], name="relu")
    g.node("Sigmoid", [r], name="sig", out="y")
    model = g.model("y")
    sample_bytes = 3 * 48 * 48 * 4
    p8, p64 = _peak_bytes(model, 8), _peak_bytes(model, 64)
    # holding the 56 extra samples (or their activations) would add >= 56 * sample_bytes (1.5 MB)
    assert p64 < 1.5 * p8 + 256 * 1024, (p8, p64)
    assert 56 * sample_bytes > 0.5 * p8 + 256 * 1024  # the bound above is tight enough to see that


def test_propagate_error_runs_a_second_pass_on_the_quantized_model(main_float):
    data = samples(6)
    one = qnnx.quantize(main_float, data, QuantConfig(progress=False, method="minmax"))
    two = qnnx.quantize(main_float, data, QuantConfig(progress=False, method="minmax", calibrator="propagate_error"))
    assert two.report.calibration_seconds > 0 and two.report.left_in_float == []
    # minmax observers continue across passes: every range can only grow, and some must change
    # because the second pass sees the first pass's quantization error.
    s1, s2 = _scales(one.qdq), _scales(two.qdq)
    assert s1.keys() == s2.keys()
    assert all(s2[k] >= s1[k] for k in s1) and any(s2[k] > s1[k] for k in s1)


def test_propagate_error_reads_a_one_shot_iterator_twice_through_the_kept_samples(main_float):
    # (it used to be refused: CalibrationData now keeps what a one-shot iterator gave, so the second
    # pass reads the same samples)
    config = QuantConfig(progress=False, method="minmax", calibrator="propagate_error")
    once = qnnx.quantize(main_float, iter(samples(4)), config)
    listed = qnnx.quantize(main_float, samples(4), config)
    assert once.report.num_samples == 4
    assert ir.to_proto(once.qdq).SerializeToString() == ir.to_proto(listed.qdq).SerializeToString()


def _scales(model) -> dict[str, float]:
    return {name: float(np.max(v.const_value.numpy())) for name, v in model.graph.initializers.items()
            if name.endswith("/q_scale")}


# --------------------------------------------------------------------------- export shaped for runtimes


def _conv_div_conv():
    rng = np.random.default_rng(3)
    g = Graph()
    c1 = g.node("Conv", [g.input("x", [1, 3, 8, 8]), g.const(conv_weight(rng, 4, 3), "w1")], name="conv1",
                pads=[1, 1, 1, 1], out="c1")
    r = g.node("Relu", [c1], name="relu1", out="r1")
    d = g.node("Div", [r, g.const(np.array(6.0, np.float32), "six")], name="div", out="d")
    g.node("Conv", [d, g.const(conv_weight(rng, 2, 4), "w2")], name="conv2", pads=[1, 1, 1, 1], out="y")
    return g.model("y")


def test_division_by_a_positive_constant_becomes_a_rescaled_dequantize():
    model = _conv_div_conv()
    qm = _quantize(model, samples(8))
    qdq = qm.qdq
    assert not [n for n in qdq.graph if n.op_type == "Div"]
    q, dq = qdq_of(qdq, "r1")  # the Relu output's integers ...
    readers = [u.node for u in q.outputs[0].uses()]
    assert len(readers) == 1  # ... are read once, by a DequantizeLinear with scale / 6 (same zero point)
    scaled = readers[0]
    assert scaled.op_type == "DequantizeLinear" and [u.node.name for u in scaled.outputs[0].uses()] == ["conv2"]
    s, z = qparams_of(q)
    s2, z2 = qparams_of(scaled)
    assert s2 == np.float32(s * np.float32(1 / 6)) and z2 == z
    x = samples(1, seed=9)[0]
    want, got = run_ort(model, {"x": x})[0], run_ort(qdq, {"x": x})[0]
    assert _cosine(want, got) > 0.999
    canonical = qm.canonical  # FQ2I reads the rescaled DequantizeLinear as a type change: integer-only
    assert _float_compute_nodes(canonical) == []


def test_bias_that_would_overflow_int32_raises_the_weight_scale_of_its_channel():
    rng = np.random.default_rng(4)
    w = conv_weight(rng, 3, 3)
    w[1] = 1e-9  # a dead channel: its per-channel scale would be ~1e-11
    g = Graph()
    g.node("Conv", [g.input("x", [1, 3, 8, 8]), g.const(w, "w"), g.const(np.array([0.1, 5.0, -0.2], np.float32), "b")],
           name="conv", pads=[1, 1, 1, 1], out="y")
    model = g.model("y")
    qdq = _quantize(model, samples(8)).qdq
    bias = _weight_dq(qdq, "conv", 2).inputs[0].const_value.numpy()
    assert np.abs(bias).max() <= 2**30
    x = samples(1, seed=5)[0]
    want, got = run_ort(model, {"x": x})[0], run_ort(qdq, {"x": x})[0]
    np.testing.assert_allclose(got[0, 1], want[0, 1], atol=0.05)  # the dead channel keeps its bias of 5


def _two_branch_concat(small: float):
    """Two conv branches concatenated on channels; the second's values are ``small`` times the first's."""
    rng = np.random.default_rng(6)
    g = Graph()
    x = g.input("x", [1, 3, 8, 8])
    a = g.node("Conv", [x, g.const(conv_weight(rng, 4, 3), "wa")], name="conv_a", pads=[1, 1, 1, 1], out="a")
    b = g.node("Conv", [x, g.const(conv_weight(rng, 4, 3) * small, "wb")], name="conv_b", pads=[1, 1, 1, 1],
               out="b")
    c = g.node("Concat", [a, b], name="cat", axis=1, out="c")
    g.node("Conv", [c, g.const(conv_weight(rng, 2, 8), "wc")], name="conv_c", pads=[1, 1, 1, 1], out="y")
    return g.model("y")


def test_concat_inputs_feeding_only_the_concat_share_its_output_qparams():
    qdq = _quantize(_two_branch_concat(0.5), samples(8)).qdq
    out_qp = qparams_of(qdq_of(qdq, "c")[0])
    for v in ("a", "b"):
        np.testing.assert_array_equal(qparams_of(qdq_of(qdq, v)[0]), out_qp)


def test_concat_of_ranges_far_apart_stays_float_and_says_why():
    qm = _quantize(_two_branch_concat(1e-3), samples(8))
    d = [d for d in qm.report.decisions if d.node == "cat"][0]
    assert not d.quantized and "smaller range than the output" in d.reason
    # Its inputs keep their own qparams (nothing shared), so the small branch keeps its resolution.
    assert qparams_of(qdq_of(qm.qdq, "b")[0])[0] < qparams_of(qdq_of(qm.qdq, "a")[0])[0] / 100
    x = samples(1, seed=2)[0]
    want, got = run_ort(_two_branch_concat(1e-3), {"x": x})[0], run_ort(qm.qdq, {"x": x})[0]
    assert _cosine(want, got) > 0.99


def test_bounded_elementwise_outputs_get_their_whole_range():
    g = Graph()
    s = g.node("Sigmoid", [g.input("x", [1, 16])], name="sig", out="s")
    g.node("Tanh", [s], name="tanh", out="y")
    small = [x * 0.01 for x in samples(8, shape=(1, 16))]  # sigmoid near 0.5, tanh near 0.46: narrow ranges
    qdq = _quantize(g.model("y"), small).qdq
    s_scale, s_zp = qparams_of(qdq_of(qdq, "s")[0])
    assert s_scale == np.float32(1 / 255) and s_zp == 0
    y_scale, _ = qparams_of(qdq_of(qdq, "y_float")[0])  # a graph output keeps its name on the dequantized value
    assert y_scale == pytest.approx(2 / 255, rel=1e-6)


def test_hard_swish_gate_gets_its_whole_range_unobserved():
    # x * Clip(x + 3, 0, 6) / 6 on data within [-1, 1]: the gate only ever sees [2, 4], yet it is
    # 6 * HardSigmoid(x) and gets [0, 6] without being observed, as HardSigmoid gets [0, 1]
    g = Graph()
    x = g.input("x", [1, 3, 6, 6])
    a = g.node("Conv", [x, g.const(conv_weight(RNG, 4, 3, k=1) * 0.1, "w1")], name="conv1", out="a")
    s = g.node("Add", [a, g.const(np.array(3.0, np.float32))], name="shift")
    gate = g.node("Clip", [s, g.const(np.array(0.0, np.float32)), g.const(np.array(6.0, np.float32))],
                  name="clip", out="gate")
    m = g.node("Mul", [a, gate], name="mul", out="m")
    g.node("Div", [m, g.const(np.array(6.0, np.float32))], name="div", out="y")
    data = [np.clip(d, -1, 1) for d in samples(4, (1, 3, 6, 6))]
    qm = _quantize(g.model("y"), data, speed_fallback="off")
    g_scale, g_zp = qparams_of(qdq_of(qm.qdq, "gate")[0])
    assert int(g_zp) == 0 and float(g_scale) == pytest.approx(6 / 255, rel=1e-6)
    _, runs = _calibrated_counting_runs(g.model("y"), data, speed_fallback="off")
    observed = [(float(np.min(o)), float(np.max(o))) for _, _, outs in runs for o in outs if np.size(o) > 1]
    assert observed and not any(2.0 <= lo and hi <= 4.0 for lo, hi in observed)  # nothing fetched the gate's values


def test_division_after_an_excluded_node_stays_float_instead_of_failing():
    model = _conv_div_conv()
    qm = _quantize(model, samples(8), exclude_nodes=("relu1",))
    d = [d for d in qm.report.decisions if d.node == "div"][0]
    assert not d.quantized and "excluded" in d.reason
    assert [n for n in qm.qdq.graph if n.op_type == "Div"]
    x = samples(1, seed=9)[0]
    assert _cosine(run_ort(model, {"x": x})[0], run_ort(qm.qdq, {"x": x})[0]) > 0.999


@pytest.mark.parametrize("mode,shared", [("nearest", True), ("linear", False)])
def test_nearest_resize_shares_its_input_qparams(mode, shared):
    rng = np.random.default_rng(8)
    g = Graph()
    c = g.node("Conv", [g.input("x", [1, 3, 4, 4]), g.const(conv_weight(rng, 4, 3), "w")], name="conv",
               pads=[1, 1, 1, 1], out="c")
    r = g.node("Resize", [c, "", g.const(np.array([1, 1, 2, 2], np.float32), "scales")], name="up", mode=mode,
               out="r")
    g.node("Conv", [r, g.const(conv_weight(rng, 2, 4), "w2")], name="conv2", pads=[1, 1, 1, 1], out="y")
    qdq = _quantize(g.model("y"), samples(8, shape=(1, 3, 4, 4))).qdq
    same = np.array_equal(qparams_of(qdq_of(qdq, "c")[0])[0], qparams_of(qdq_of(qdq, "r")[0])[0])
    assert same == shared  # equal qparams around a nearest Resize: ORT runs it on uint8


def test_a_division_that_is_the_graph_output_becomes_the_rescaled_output():
    rng = np.random.default_rng(12)
    g = Graph()
    c = g.node("Conv", [g.input("x", [1, 3, 8, 8]), g.const(conv_weight(rng, 4, 3), "w")], name="conv",
               pads=[1, 1, 1, 1], out="c")
    r = g.node("Relu", [c], name="relu", out="r")
    g.node("Div", [r, g.const(np.array(6.0, np.float32), "six")], name="div", out="y")
    model = g.model("y")
    qdq = _quantize(model, samples(4)).qdq
    assert [o.name for o in qdq.graph.outputs] == ["y"] and not [n for n in qdq.graph if n.op_type == "Div"]
    assert qdq.graph.outputs[0].producer().op_type == "DequantizeLinear"
    x = samples(1, seed=3)[0]
    assert _cosine(run_ort(model, {"x": x})[0], run_ort(qdq, {"x": x})[0]) > 0.999


def _batch_model(mix: bool = False):
    """x[N,3,12,12] (dynamic batch) -> conv -> relu -> conv -> y; with ``mix`` the batch mean is
    added first, so a sample's activations depend on the other samples run with it."""
    g = Graph()
    x = g.input("x", ["N", 3, 12, 12])
    if mix:
        x = g.node("Add", [x, g.node("ReduceMean", [x], axes=[0], keepdims=1, name="batch_mean")], name="mixed")
    c = g.node("Conv", [x, g.const(conv_weight(RNG, 6, 3), "w1")], name="conv1", pads=[1, 1, 1, 1])
    r = g.node("Relu", [c], name="relu1")
    g.node("Conv", [r, g.const(conv_weight(RNG, 4, 6), "w2")], name="conv2", pads=[1, 1, 1, 1], out="y")
    return g.model("y")


def _calibrated_counting_runs(model, data, **cfg):
    """Calibrate as quantize does (prepare, smooth, plan, then the configured calibrator), counting the
    calibrator's ONNX Runtime runs through its ``run`` parameter. Returns (qparams by root value name,
    [(fetched names, feed, outputs) of each run])."""
    state = QuantState(config=QuantConfig(progress=False, **cfg), source=model, data=data)
    for stage in (stages.PREPARE, stages.SMOOTH, stages.PLAN):
        state = stage(state)
    runs = []

    def counting(sess, names, feed):
        outs = runtime.run(sess, names, feed)
        runs.append((list(names), feed, outs))
        return outs

    calibrate = CALIBRATORS[state.config.calibration.calibrator]
    result = calibrate(state.float_model, state.plan, state.data, state.config, run=counting)
    return {v.name: qp for v, qp in result.qparams.items()}, runs


def _root_scales(qparams) -> dict[str, float]:
    return {name: float(np.max(qp.scale)) for name, qp in qparams.items()}


@pytest.mark.parametrize("method", ["minmax", "percentile", "mse"])
def test_calibration_batches_samples_into_one_run(method):
    # partition-invariant observers see the same values in fewer, larger runs: the same qparams
    # (float tolerance: ORT may block a batch's convolution differently from one sample's)
    # (mse's default channel balance weighs each batch by its own statistics: off here, it is not invariant)
    data = samples(20, shape=(1, 3, 12, 12))
    model = _batch_model()
    extra = {"channel_balance": 0.0} if method != "minmax" else {}
    one, runs_one = _calibrated_counting_runs(model, data, method=method, batch_size=1, **extra)
    many, runs_many = _calibrated_counting_runs(model, data, method=method, batch_size=8, **extra)
    assert len(runs_one) == 20
    # the first sample alone (its activations' size sets the batch), a probe of two (and its first
    # sample alone again, to compare), then batches of up to 8
    assert [f["x"].shape[0] for _, f, _ in runs_many] == [1, 2, 1, 8, 8, 1]
    s1, s8 = _root_scales(one), _root_scales(many)
    assert s1.keys() == s8.keys() and s1
    for k in s1:
        np.testing.assert_allclose(s8[k], s1[k], rtol=1e-5, err_msg=k)


def test_calibration_does_not_batch_a_model_that_mixes_samples():
    data = samples(6, shape=(1, 3, 12, 12))
    model = _batch_model(mix=True)
    one, _ = _calibrated_counting_runs(model, data, method="minmax", batch_size=1)
    many, runs = _calibrated_counting_runs(model, data, method="minmax", batch_size=8)
    assert [f["x"].shape[0] for _, f, _ in runs] == [1, 2, 1, 1, 1, 1, 1]  # the probe failed: one sample per run
    assert _root_scales(many) == _root_scales(one)


@pytest.mark.parametrize("why,model_fn,cfg", [
    ("moving average depends on batch boundaries", lambda: _batch_model(), dict(method="moving_average")),
    ("static batch dim", lambda: main_model(), dict(method="minmax")),
])
def test_calibration_keeps_one_sample_per_run(why, model_fn, cfg):
    shape = (1, 3, 12, 12) if "moving" in why else (1, 3, 8, 8)
    _, runs = _calibrated_counting_runs(model_fn(), samples(5, shape=shape), batch_size=8, **cfg)
    assert [f["x"].shape[0] for _, f, _ in runs] == [1] * 5, why


def test_calibration_batch_stays_within_the_activation_budget(monkeypatch):
    # per sample this model fetches 3 activations of 6x12x12 or 4x12x12 floats (~6 KB): a 16 KB budget
    # fits two samples per run, an 8 KB budget none (no batch is ever tried then)
    # (the budget is a setting, not a stage being observed: the runs are counted through ``run``)
    monkeypatch.setattr(calibration, "CALIBRATION_BATCH_BYTES", 16 << 10)
    _, runs = _calibrated_counting_runs(_batch_model(), samples(7, shape=(1, 3, 12, 12)), method="minmax",
                                        batch_size=8)
    assert [f["x"].shape[0] for _, f, _ in runs] == [1, 2, 1, 2, 2]
    monkeypatch.setattr(calibration, "CALIBRATION_BATCH_BYTES", 8 << 10)
    _, runs = _calibrated_counting_runs(_batch_model(), samples(4, shape=(1, 3, 12, 12)), method="minmax",
                                        batch_size=8)
    assert [f["x"].shape[0] for _, f, _ in runs] == [1, 1, 1, 1]


def test_the_next_calibration_run_is_under_way_while_the_caller_observes():
    import threading
    import weakref

    started = {k: threading.Event() for k in range(4)}

    def run(group):
        started[group[0]].set()
        return np.full(3, group[0], np.float32)

    seen, alive = [], []
    for group, runs in calibration._overlapped(run, iter([[0], [1], [2], [3]])):
        k = group[0]
        if k < 3:  # the caller is still holding run k's outputs: run k + 1 must already have started
            assert started[k + 1].wait(timeout=10), f"run {k + 1} did not start while run {k} was observed"
        seen.append((k, runs[0].tolist()))
        alive.append(weakref.ref(runs[0]))
        del runs
        if k >= 1:  # run k - 1's outputs were dropped by the generator too
            assert alive[k - 1]() is None, f"run {k - 1}'s outputs are still alive at group {k}"
    assert seen == [(k, [float(k)] * 3) for k in range(4)]
    assert list(calibration._overlapped(run, iter([]))) == []


def test_a_failed_calibration_run_in_the_worker_reaches_the_caller():
    def run(group):
        if group[0] == 2:
            raise QnnxError("ONNX Runtime failed on a sample: boom")
        return [group[0]]

    got = []
    with pytest.raises(QnnxError, match="failed on a sample: boom"):
        for group, _ in calibration._overlapped(run, iter([[0], [1], [2], [3]])):
            got.append(group[0])
    assert got == [0, 1]


@pytest.mark.parametrize("cores,threads", [(1, 1), (2, 1), (8, 7)])
def test_calibration_sessions_leave_one_core_to_the_observers(cores, threads, monkeypatch):
    monkeypatch.setattr(calibration.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert calibration.calibration_threads() == threads

