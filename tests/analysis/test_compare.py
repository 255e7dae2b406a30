"""Per-layer error statistics: exact on known perturbations, streamed, clear errors."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import qnnx
from qnnx.analysis import compare_models, summarize
from qnnx.analysis.compare import LayerError, float_outputs
from qnnx.cli import main


def _model(scale: float) -> onnx.ModelProto:
    """y = relu(x * k) with k = scale: two copies differ by a known factor."""
    g = helper.make_graph([helper.make_node("Mul", ["x", "k"], ["m"]), helper.make_node("Relu", ["m"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
                          [numpy_helper.from_array(np.float32(scale), "k")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_sqnr_and_cosine_of_a_known_perturbation():
    rng = np.random.default_rng(0)
    data = [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(5)]
    errors = {e.name: e for e in compare_models(_model(1.0), _model(1.1), data)}
    # got = 1.1 * ref everywhere: noise/signal = 0.01 -> 20 dB; float32(1.1) = 1.10000002 moves it by 2e-6 dB
    assert errors["m"].sqnr_db == pytest.approx(20.0, abs=1e-5)
    assert errors["m"].cosine == pytest.approx(1.0, abs=1e-9)
    assert errors["y"].is_output and errors["y"].sqnr_db == pytest.approx(20.0, abs=1e-5)
    assert errors["m"].count == 5 * 8


def test_identical_models_have_infinite_sqnr():
    data = [np.ones((1, 8), np.float32)]
    assert all(math.isinf(e.sqnr_db) for e in compare_models(_model(1.0), _model(1.0), data))


def test_shape_mismatch_is_a_clear_error():
    e = LayerError("t", "Mul", False)
    with pytest.raises(qnnx.QnnxError, match="tensor 't' has shape"):
        e.add(np.zeros((2, 2)), np.zeros((4,)))


def test_cli_compare_lists_worst_layers_first(tmp_path, capsys):
    onnx.save(_model(1.0), tmp_path / "f.onnx")
    onnx.save(_model(0.5), tmp_path / "q.onnx")
    (tmp_path / "d").mkdir()
    for i in range(3):
        np.save(tmp_path / "d" / f"{i}.npy", np.random.default_rng(i).standard_normal((1, 8)).astype(np.float32))
    assert main(["compare", str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), "--data", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "outputs:" in out and "y: SQNR" in out and "Mul" in out


def test_cli_compare_bad_data_exits_1(tmp_path, capsys):
    onnx.save(_model(1.0), tmp_path / "f.onnx")
    (tmp_path / "d").mkdir()
    assert main(["compare", str(tmp_path / "f.onnx"), str(tmp_path / "f.onnx"), "--data", str(tmp_path / "d")]) == 1
    assert "no .npy or .npz sample files" in capsys.readouterr().err


def test_inspect_counts_quantized_ops(tmp_path):
    rng = np.random.default_rng(1)
    x = [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(4)]
    w = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    qm = qnnx.quantize(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), x,
                       qnnx.QuantConfig(progress=False))
    s = summarize(qm.qdq)
    assert s.ops[("", "QuantizeLinear")] == 2 and s.ops[("", "DequantizeLinear")] == 3  # x, y; + weight
    assert s.per_channel == 1 and s.per_tensor == 4 and s.scale_range[0] > 0
    c = summarize(qm.canonical)
    assert c.ops[("qnnx", "matmul")] == 1 and "qnnx integer ops" in c.format()


def test_cli_bench_times_models_and_reports_speedups(tmp_path, capsys):
    onnx.save(_model(1.0), tmp_path / "a.onnx")
    onnx.save(_model(2.0), tmp_path / "b.onnx")
    assert main(["bench", str(tmp_path / "a.onnx"), str(tmp_path / "b.onnx"), "--repeats", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and "1.00x vs first" in lines[0] and "ms" in lines[1]


def test_cli_bench_missing_file_exits_1(tmp_path, capsys):
    assert main(["bench", str(tmp_path / "nope.onnx")]) == 1
    assert "file not found" in capsys.readouterr().err


def test_channel_cosine_is_the_mean_of_each_channels_own():
    # channel 0 loud and exact, channel 1 quiet and reversed in sign: the whole tensor's cosine is the loud
    # channel's, the per-channel figure the mean of 1 and -1
    e = LayerError("t", "Concat", True)
    ref = np.stack([np.linspace(1, 100, 5)[None], np.linspace(0.01, 0.02, 5)[None]], axis=1)  # (1, 2, 5)
    got = ref * np.array([1.0, -1.0]).reshape(1, 2, 1)
    e.add(ref, got)
    e.add(2 * ref, 2 * got)
    assert e.cosine == pytest.approx(1.0, abs=1e-6)
    assert e.channel_cosine == pytest.approx(0.0, abs=1e-12)


def test_channel_cosine_skips_silent_channels_and_scores_silenced_ones_zero():
    e = LayerError("t", "Sigmoid", True)
    ref = np.zeros((1, 3, 4))
    ref[:, 0], ref[:, 1] = [1.0, 2.0, 3.0, 4.0], 0.5
    got = ref.copy()
    got[:, 1] = 0.0  # channel 1 silenced: cosine 0 (its SQNR, 0 dB, would rank it above a noisy one)
    e.add(ref, got)  # channel 2 is zero in both: left out
    assert e.channel_cosine == pytest.approx(0.5)


def test_channel_cosine_is_nan_when_channel_counts_differ():
    e = LayerError("t", "Conv", False)
    e.add(np.ones((1, 2, 3)), np.ones((1, 2, 3)))
    e.add(np.ones((1, 3, 3)), np.ones((1, 3, 3)))
    assert math.isnan(e.channel_cosine) and math.isinf(e.sqnr_db)


def test_channel_cosine_of_empty_outputs_is_nan_not_an_error():
    e = LayerError("boxes", "NonMaxSuppression", True)  # zero detections: shape (0, 6)
    e.add(np.zeros((0, 6)), np.zeros((0, 6)))
    assert math.isnan(e.channel_cosine) and e.count == 0


def test_a_float_reference_gives_the_same_statistics_without_rerunning_the_float_model():
    rng = np.random.default_rng(3)
    data = [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(4)]
    reference = float_outputs(_model(1.0), data)
    assert [sorted(r) for r in reference] == [["y"]] * 4
    plain = compare_models(_model(1.0), _model(1.1), data, outputs_only=True)
    cached = compare_models(_model(1.0), _model(1.1), data, outputs_only=True, reference=reference)
    assert [(e.name, e.signal, e.noise, e.dot, e.channel_cosine) for e in plain] == \
        [(e.name, e.signal, e.noise, e.dot, e.channel_cosine) for e in cached]
    with pytest.raises(ValueError, match="outputs_only"):
        compare_models(_model(1.0), _model(1.1), data, reference=reference)


def test_compare_reads_every_format_quantize_writes_and_lists_only_changed_layers(tmp_path):
    """qdq (padded for ORT), the canonical qnnx model (lowered to run) and the lowered one; a layer that
    quantization leaves exact is not listed, and the prepared float model is the reference."""
    import qnnx
    from qnnx.analysis.compare import compare
    from float_graphs import main_model, samples

    model, data = main_model(), samples(6)
    qm = qnnx.quantize(model, data, qnnx.QuantConfig(progress=False))
    for fmt in ("qdq", "qnnx", "lowered"):
        path = tmp_path / f"{fmt}.onnx"
        qm.save(path, format=fmt)
        errors = compare(model, path, data, num_samples=2)
        outputs = [e for e in errors if e.is_output]
        assert [e.name for e in outputs] == ["y"] and outputs[0].sqnr_db > 15, fmt
        assert all(not (e.sqnr_db == float("inf")) for e in errors if not e.is_output), fmt
    unquantized = compare(model, model, data, num_samples=2)
    assert [e.name for e in unquantized if not e.is_output] == []
