"""The qnnx command: exit codes and one-line errors."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import qnnx
from qnnx.cli import main


def _qlinear_model() -> onnx.ModelProto:
    consts = [numpy_helper.from_array(np.float32(0.1), "sx"), numpy_helper.from_array(np.uint8(128), "zx"),
              numpy_helper.from_array(np.arange(-8, 10, dtype=np.int8).reshape(2, 1, 3, 3), "w"),
              numpy_helper.from_array(np.array([0.01, 0.02], np.float32), "sw"),
              numpy_helper.from_array(np.zeros(2, np.int8), "zw"),
              numpy_helper.from_array(np.float32(0.05), "sy"), numpy_helper.from_array(np.uint8(10), "zy")]
    node = helper.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"], ["y"], pads=[1, 1, 1, 1])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.UINT8, [1, 1, 5, 5])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.UINT8, [1, 2, 5, 5])], consts)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_lower_writes_a_plain_onnx_model_with_reference_results(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(_qlinear_model(), src)
    before = src.read_bytes()
    out = tmp_path / "m.lowered.onnx"
    assert main(["lower", str(src), "-o", str(out)]) == 0
    assert src.read_bytes() == before
    lowered = onnx.load(out)
    assert all(n.domain == "" for n in lowered.graph.node)
    x = np.random.default_rng(0).integers(0, 256, (1, 1, 5, 5)).astype(np.uint8)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, qnnx.ReferenceEvaluator(str(src)).run(None, {"x": x})[0])
    assert "wrote" in capsys.readouterr().out


def test_import_counts_qnnx_ops(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(_qlinear_model(), src)
    assert main(["import", str(src), "-o", str(tmp_path / "q.onnx")]) == 0
    assert "(2 qnnx ops)" in capsys.readouterr().out  # conv + requantize


@pytest.mark.parametrize("content,message", [(None, "file not found"), (b"not a model", "not a readable ONNX model"),
                                             ("truncated", "not a readable ONNX model")])
def test_bad_input_files_get_one_line_and_exit_1(tmp_path, capsys, content, message):
    src = tmp_path / "in.onnx"
    if content == "truncated":
        src.write_bytes(_qlinear_model().SerializeToString()[:40])
    elif content is not None:
        src.write_bytes(content)
    assert main(["lower", str(src), "-o", str(tmp_path / "o.onnx")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "in.onnx" in err
    assert not (tmp_path / "o.onnx").exists()


def test_output_equal_to_input_is_refused(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(_qlinear_model(), src)
    before = src.read_bytes()
    assert main(["lower", str(src), "-o", str(src)]) == 1
    assert "refusing to overwrite the input" in capsys.readouterr().err
    assert src.read_bytes() == before


def test_zero_scale_is_reported_with_the_node(tmp_path, capsys):
    m = _qlinear_model()
    m.graph.initializer[5].CopyFrom(numpy_helper.from_array(np.float32(0.0), "sy"))
    src = tmp_path / "m.onnx"
    onnx.save(m, src)
    assert main(["lower", str(src), "-o", str(tmp_path / "o.onnx")]) == 1
    err = capsys.readouterr().err
    assert "requantize" in err and "output_scale must be positive and finite" in err


def test_console_script_version_and_help():
    out = subprocess.run([sys.executable, "-m", "qnnx.cli", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"qnnx {qnnx.__version__}"
    helptext = subprocess.run([sys.executable, "-m", "qnnx.cli", "--help"], capture_output=True, text=True).stdout
    for cmd in ("import", "lower", "ops"):
        assert cmd in helptext


# --------------------------------------------------------------------------- qnnx quantize


def _float_model() -> onnx.ModelProto:
    """x[1,3,8,8] -> conv+relu -> sigmoid -> globalavgpool -> y: a small float model to quantize."""
    rng = np.random.default_rng(0)
    consts = [numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w"),
              numpy_helper.from_array(np.full(4, 0.1, np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Sigmoid", ["r"], ["s"], name="sig"),
             helper.make_node("GlobalAveragePool", ["s"], ["y"], name="gap")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 1, 1])], consts)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.fixture
def quantize_case(tmp_path):
    """A float model file and a calibration directory of 4 .npy samples."""
    src = tmp_path / "float.onnx"
    onnx.save(_float_model(), src)
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(1)
    for i in range(4):
        np.save(calib / f"{i}.npy", rng.standard_normal((1, 3, 8, 8)).astype(np.float32))
    return src, calib


def _run_float(src, x):
    return ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_quantize_writes_a_qdq_model_by_default_and_prints_the_summary(quantize_case, capsys):
    src, calib = quantize_case
    before = src.read_bytes()
    out = src.parent / "q.onnx"
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(calib)]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0].startswith("quantized 3 pattern(s), 0 node(s) kept in float; calibration")
    assert "on 4 sample(s)" in captured.out and captured.out.rstrip().endswith(f"wrote {out} (qdq)")
    assert "calibrating 4/4 samples" in captured.err  # progress, on stderr (the data knows its length now)
    assert src.read_bytes() == before
    model = onnx.load(out)
    ops = [n.op_type for n in model.graph.node]
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops and {n.domain for n in model.graph.node} == {""}
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, _run_float(src, x), atol=0.02)
    assert sorted(p.name for p in src.parent.iterdir()) == ["calib", "float.onnx", "q.onnx"]


@pytest.mark.parametrize("fmt", ["qnnx", "lowered"])
def test_quantize_other_formats(quantize_case, capsys, fmt):
    src, calib = quantize_case
    out = src.parent / f"q.{fmt}.onnx"
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "--format", fmt, "-q"]) == 0
    captured = capsys.readouterr()
    assert f"wrote {out} ({fmt})" in captured.out and captured.err == ""
    model = onnx.load(out)
    domains = {n.domain for n in model.graph.node}
    assert not {"QuantizeLinear", "DequantizeLinear"} & {n.op_type for n in model.graph.node}
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)
    if fmt == "qnnx":
        assert "qnnx" in domains
        got = qnnx.ReferenceEvaluator(str(out)).run(None, {"x": x})[0]
    else:
        assert domains == {""}
        got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, _run_float(src, x), atol=0.02)


def test_quantize_options_reach_the_model(quantize_case, capsys):
    src, calib = quantize_case
    out = src.parent / "q.onnx"
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "--method", "minmax",
                 "--activation-dtype", "int8", "--no-per-channel", "--exclude-op", "GlobalAveragePool",
                 "--num-samples", "2", "--sqnr-threshold", "-100", "--seed", "3", "-q"]) == 0
    text = capsys.readouterr().out
    assert "on 2 sample(s)" in text and "float: gap (GlobalAveragePool): excluded by the user" in text
    assert "worst layers by output SQNR" in text
    model = onnx.load(out)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    qs = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert qs and all(inits[n.input[2]].dtype == np.int8 for n in qs)  # int8 activations
    weight_dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits
                 and inits[n.input[0]].dtype == np.int8]
    assert len(weight_dq) == 1 and inits[weight_dq[0].input[1]].shape == ()  # per-tensor
    assert not any(a.name == "axis" for a in weight_dq[0].attribute)
    assert "GlobalAveragePool" in [n.op_type for n in model.graph.node]


def test_quantize_exclude_node_option(quantize_case, capsys):
    src, calib = quantize_case
    out = src.parent / "q.onnx"
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "--exclude-node", "conv",
                 "--exclude-node", "sig", "-q"]) == 0
    text = capsys.readouterr().out
    assert "float: conv (Conv): excluded by the user" in text and "float: sig (Sigmoid): excluded by the user" in text


def test_quantize_sequential_option(quantize_case, capsys):
    src, calib = quantize_case
    out = src.parent / "q.onnx"
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "--calibrator", "sequential",
                 "--sequential-passes", "2", "-q"]) == 0
    assert "QuantizeLinear" in [n.op_type for n in onnx.load(out).graph.node]
    capsys.readouterr()
    assert _exit_code(["quantize", str(src), "-o", str(out), "--calib", str(calib), "--calibrator", "sequential",
                       "--sequential-passes", "0", "-q"]) == 1
    assert "--sequential-passes" in capsys.readouterr().err


def test_quantize_speed_fallback_option(quantize_case, capsys, monkeypatch):
    from qnnx.targets import target

    def int8_is_slower(models, feed, repeats):  # a fake ONNX Runtime where any QuantizeLinear costs time
        return [2.0 if any(n.op_type == "QuantizeLinear" for n in m.graph) else 1.0 for m in models]

    # (the runtime's clock faked on the target the CLI times on, as a failing ir.save is faked elsewhere)
    monkeypatch.setattr(target("onnxruntime"), "timer", int8_is_slower)
    src, calib = quantize_case
    out = src.parent / "q.onnx"
    # a model left all float is an error unless asked for
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "--speed-fallback", "on", "-q"]) == 1
    assert "nothing was quantized: speed: " in capsys.readouterr().err and not out.exists()
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "--speed-fallback", "on",
                 "--allow-float"]) == 0
    captured = capsys.readouterr()
    assert "speed: whole model float: float 1.000 ms, best int8 2.000 ms" in captured.err  # progress
    assert "whole model kept float" in captured.out
    assert "float: conv (Conv): speed: the fastest int8 variant (2.000 ms) is not 3% faster" in captured.out
    assert not any(n.op_type == "QuantizeLinear" for n in onnx.load(out).graph.node)
    # off: never timed; an unknown value is a usage error naming the choices
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "--speed-fallback", "off", "-q"]) == 0
    assert any(n.op_type == "QuantizeLinear" for n in onnx.load(out).graph.node)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "--speed-fallback", "yes"])
    assert e.value.code == 1 and "'off', 'auto', 'on'" in capsys.readouterr().err


def _config_field_seen(quantize_case, monkeypatch, argv: list[str], field: str) -> list:
    """``qnnx quantize`` run with ``argv`` on the quantize case; the QuantConfig ``field`` (a top-level one,
    or a section's: ``ranges.method``) it passed. (A spy on the CLI -> config mapping only.)"""
    import qnnx.autoquant

    seen = []
    real = qnnx.autoquant.quantize

    def spy(model, calibration, config, validation=None):
        value = config
        for part in field.split("."):
            value = getattr(value, part)
        seen.append(value)
        return real(model, calibration, config, validation=validation)

    monkeypatch.setattr(qnnx.autoquant, "quantize", spy)
    src, calib = quantize_case
    assert main(["quantize", str(src), "-o", str(src.parent / "q.onnx"), "--calib", str(calib), "-q", *argv]) == 0
    return seen


@pytest.mark.parametrize("argv, want", [([], ("silu", "sigmoid")), (["none"], ()),
                                         (["hardswish", "silu"], ("hardswish", "silu"))])
def test_quantize_consumer_function_option(quantize_case, capsys, monkeypatch, argv, want):
    options = [a for name in argv for a in ("--consumer-function", name)]
    assert _config_field_seen(quantize_case, monkeypatch, options, "ranges.consumer_functions") == [want]


@pytest.mark.parametrize("argv, want", [([], True), (["--no-consumer-weighting"], False),
                                         (["--consumer-weighting"], True)])
def test_quantize_consumer_weighting_option(quantize_case, capsys, monkeypatch, argv, want):
    assert _config_field_seen(quantize_case, monkeypatch, argv, "ranges.consumer_weighting") == [want]


@pytest.mark.parametrize("argv, want", [([], 0.01), (["--silu-lobe", "0"], 0.0), (["--silu-lobe", "0.05"], 0.05)])
def test_quantize_silu_lobe_option(quantize_case, capsys, monkeypatch, argv, want):
    assert _config_field_seen(quantize_case, monkeypatch, argv, "ranges.silu_lobe") == [want]


def test_quantize_bad_silu_lobe_is_one_line(quantize_case, capsys):
    src, calib = quantize_case
    out = src.parent / "q.onnx"
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "-q", "--silu-lobe", "1.5"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "silu_lobe must be in [0, 1), got 1.5" in err
    assert not out.exists()


def test_quantize_unknown_consumer_function_is_one_line(quantize_case, capsys):
    src, calib = quantize_case
    out = src.parent / "q.onnx"
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "-q",
                 "--consumer-function", "gelu"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown consumer function(s) 'gelu'; expected some of silu, hardswish, sigmoid" in err
    assert not out.exists()


def _bad_quantize_case(tmp_path, case, src, calib):
    """Set up ``case``; returns (argv model path, calib dir, expected message)."""
    if case == "missing model":
        src.unlink()
        return src, calib, "file not found"
    if case == "not onnx":
        src.write_bytes(b"this is not a model")
        return src, calib, "not a readable ONNX model"
    if case == "truncated onnx":
        src.write_bytes(src.read_bytes()[:60])
        return src, calib, "not a readable ONNX model"
    if case == "missing calib dir":
        return src, tmp_path / "nowhere", "sample path is not a directory"
    if case == "empty calib dir":
        empty = tmp_path / "empty"
        empty.mkdir()
        return src, empty, "no .npy or .npz sample files"
    if case == "wrong shapes":
        for f in calib.iterdir():
            np.save(f, np.zeros((1, 3, 4, 4), np.float32))
        return src, calib, "input 'x' has shape 1x3x4x4, model expects 1x3x8x8"
    if case == "nan sample":
        x = np.zeros((1, 3, 8, 8), np.float32)
        x[0, 0, 0, :3] = np.nan
        np.save(calib / "0.npy", x)
        return src, calib, "input 'x' has 3 NaN/Inf value(s)"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["missing model", "not onnx", "truncated onnx", "missing calib dir",
                                  "empty calib dir", "wrong shapes", "nan sample"])
def test_quantize_bad_input_gets_one_line_exit_1_and_no_output(quantize_case, tmp_path, capsys, case):
    src, calib = quantize_case
    model, calib_dir, message = _bad_quantize_case(tmp_path, case, src, calib)
    out = tmp_path / "out.onnx"
    assert main(["quantize", str(model), "-o", str(out), "--calib", str(calib_dir)]) == 1
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("qnnx: error: ") and message in err
    if "calib" in case:
        assert str(calib_dir) in err
    elif case in ("missing model", "not onnx", "truncated onnx"):
        assert "float.onnx" in err
    else:
        assert "0.npy" in err  # the first sample file is named
    assert captured.out == ""
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out")) == []


def test_quantize_refuses_to_overwrite_its_input(quantize_case, capsys):
    src, calib = quantize_case
    before = src.read_bytes()
    assert main(["quantize", str(src), "-o", str(src), "--calib", str(calib)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "refusing to overwrite the input model" in err
    assert src.read_bytes() == before
    # the same file through another spelling of the path
    assert main(["quantize", str(src), "-o", str(src.parent / "." / src.name), "--calib", str(calib)]) == 1
    assert src.read_bytes() == before


def test_quantize_error_after_progress_is_still_one_clean_line(quantize_case, capsys):
    src, calib = quantize_case
    rng = np.random.default_rng(3)
    for i in range(4, 9):
        np.save(calib / f"{i}.npy", rng.standard_normal((1, 3, 8, 8)).astype(np.float32))
    (calib / "9.npy").write_bytes(b"garbage")
    assert main(["quantize", str(src), "-o", str(src.parent / "q.onnx"), "--calib", str(calib)]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("qnnx: error: ") and "9.npy" in err


def test_quantize_help_mentions_every_option(capsys):
    with pytest.raises(SystemExit) as info:
        main(["quantize", "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for option in ("-o", "--output", "--calib", "--format", "--method", "--percentile", "--activation-dtype",
                   "--per-channel", "--no-per-channel", "--exclude-node", "--exclude-op", "--num-samples", "--seed",
                   "--sqnr-threshold", "--calibrator", "--sequential-passes", "--speed-fallback", "--random-calibration",
                   "--consumer-function", "--allow-float", "-q", "--quiet"):
        assert re.search(rf"(^|[\s,\[]){re.escape(option)}\b", text), option
    for choice in ("qdq", "qnnx", "lowered", "minmax", "moving_average", "percentile", "entropy", "mse", "uint8",
                   "int8", "uint16", "int16"):
        assert choice in text, choice
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "quantize a float model with calibration samples" in capsys.readouterr().out


def test_from_qdq_writes_the_canonical_model(tmp_path, capsys):
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.UINT8, [1, 4])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.UINT8, [1, 4])
    init = [numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.uint8(128), "z")]
    g = helper.make_graph([helper.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
                           helper.make_node("Relu", ["xf"], ["r"]),
                           helper.make_node("QuantizeLinear", ["r", "s", "z"], ["y"])], "g", [x], [y], init)
    src = tmp_path / "qdq.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), src)
    assert main(["from-qdq", str(src), "-o", str(tmp_path / "c.onnx"), "--strict"]) == 0
    assert "left in float: none" in capsys.readouterr().out
    ops = [n.op_type for n in onnx.load(tmp_path / "c.onnx").graph.node]
    assert "Relu" not in ops and "Clip" in ops and "QuantizeLinear" not in ops


def _qdq_add_file(tmp_path):
    a = onnx.helper.make_tensor_value_info("a", onnx.TensorProto.UINT8, [1, 4])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.UINT8, [1, 4])
    init = [numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.uint8(128), "z"),
            numpy_helper.from_array(np.float32(0.3), "so")]
    g = helper.make_graph([helper.make_node("DequantizeLinear", ["a", "s", "z"], ["af"]),
                           helper.make_node("Add", ["af", "af"], ["r"]),
                           helper.make_node("QuantizeLinear", ["r", "so", "z"], ["y"])], "g", [a], [y], init)
    src = tmp_path / "qdq_add.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), src)
    return src


@pytest.mark.parametrize("numerics,compute", [(None, b"mlas"), ("onnxruntime", b"mlas"), ("qdq", b"float")])
def test_from_qdq_numerics(tmp_path, numerics, compute):
    # the default reproduces ONNX Runtime's QLinearAdd recipe; --numerics qdq keeps the QDQ meaning
    src = _qdq_add_file(tmp_path)
    extra = ["--numerics", numerics] if numerics else []
    assert main(["from-qdq", str(src), "-o", str(tmp_path / "c.onnx"), *extra]) == 0
    add = [n for n in onnx.load(tmp_path / "c.onnx").graph.node if n.op_type == "add"]
    assert len(add) == 1 and {a.name: a.s for a in add[0].attribute}["compute"] == compute


def test_from_qdq_unknown_numerics_is_one_line(tmp_path, capsys):
    assert main(["from-qdq", str(_qdq_add_file(tmp_path)), "-o", str(tmp_path / "c.onnx"), "--numerics", "tflite"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown numerics 'tflite'; expected one of onnxruntime, qdq" in err


def test_from_qdq_strict_names_the_float_op(tmp_path, capsys):
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.UINT8, [1, 4])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.UINT8, [1, 4])
    init = [numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.uint8(128), "z")]
    g = helper.make_graph([helper.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
                           helper.make_node("Cos", ["xf"], ["r"], name="cosine"),
                           helper.make_node("QuantizeLinear", ["r", "s", "z"], ["y"])], "g", [x], [y], init)
    src = tmp_path / "qdq.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), src)
    assert main(["from-qdq", str(src), "-o", str(tmp_path / "c.onnx"), "--strict"]) == 1
    err = capsys.readouterr().err
    assert "cosine (Cos): no integer rule for this op" in err and not (tmp_path / "c.onnx").exists()


def test_random_calibration_is_explicit_and_warns(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), src)
    assert main(["quantize", str(src), "-o", str(tmp_path / "q.onnx"), "--random-calibration", "-q"]) == 0
    assert "not meaningful" in capsys.readouterr().err and (tmp_path / "q.onnx").exists()
    with pytest.raises(SystemExit) as e:  # neither --calib nor --random-calibration: a user error, exit 1
        main(["quantize", str(src), "-o", str(tmp_path / "q2.onnx")])
    assert e.value.code == 1 and not (tmp_path / "q2.onnx").exists()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "one of the arguments --calib --random-calibration is required" in err


def test_quantize_symmetric_activations(quantize_case, capsys):
    src, calib = quantize_case
    out = src.parent / "q.onnx"
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "--symmetric", "-q"]) == 0
    model = onnx.load(out)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    zps = [inits[n.input[2]] for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert zps and all(z.dtype == np.uint8 and z == 128 for z in zps)  # uint8 symmetric: zero point 128
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "--asymmetric", "-q"]) == 0
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(out).graph.initializer}
    assert any(inits[n.input[2]] != 128 for n in onnx.load(out).graph.node if n.op_type == "QuantizeLinear")


@pytest.mark.parametrize("argv,message", [
    (["quantize", "m.onnx", "--calib", "d"], "Missing option '-o' / '--output'"),
    (["quantize", "m.onnx", "-o", "q.onnx", "--calib", "d", "--method", "best"], "'best' is not one of"),
    (["quantize", "m.onnx", "-o", "q.onnx", "--calib", "d", "--formt", "qdq"], "No such option: --formt"),
    (["quantize", "m.onnx", "-o", "q.onnx", "--calib", "d", "--num-samples", "0"], "--num-samples"),
    (["quantize", "m.onnx", "-o", "q.onnx", "--calib", "d", "--random-calibration"], "mutually exclusive"),
    (["lowr", "m.onnx"], "No such command 'lowr'"),
    (["bench"], "Missing argument"),
])
def test_usage_errors_are_one_line_and_exit_1(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 1
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("qnnx: error: ") and message in err, err
    assert captured.out == "" and "--help" in err


def test_bare_command_prints_help_and_exits_1(capsys):
    assert main([]) == 1
    assert "Commands:" in capsys.readouterr().out


IMAGE_OPTIONS = ["--preprocess", "--resize", "--letterbox", "--scale", "--mean", "--std", "--channel-order", "--layout"]


@pytest.mark.parametrize("command,options", [
    ("import", ["-o", "--output"]), ("from-qdq", ["-o", "--strict", "--numerics"]), ("lower", ["-o"]),
    ("from-tflite", ["-o", "--strict"]),
    ("quantize", ["--symmetric", "--asymmetric", "--calib", *IMAGE_OPTIONS]), ("inspect", []),
    ("compare", ["--data", "--num-samples", "--top", *IMAGE_OPTIONS]),
    ("bench", ["--data", "--threads", "--repeats", *IMAGE_OPTIONS]), ("ops", []),
])
def test_every_subcommand_has_help(capsys, command, options):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"Usage: qnnx {command} ")
    for option in options + ["--help"]:
        assert option in text, option


def test_internal_error_exits_2_and_names_the_log(quantize_case, capsys, monkeypatch):
    import qnnx.analysis

    def broken(model):
        raise RuntimeError("boom")

    monkeypatch.setattr(qnnx.analysis, "summarize", broken)
    src, _ = quantize_case
    assert main(["inspect", str(src)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "internal error" in err and "boom" in err
    log = err.rsplit("traceback in ", 1)[1]
    assert "RuntimeError: boom" in Path(log).read_text()


def test_tables_on_a_terminal(quantize_case, capsys, monkeypatch):
    """On a terminal the report is a rich table; the plain lines are for pipes (checked above)."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    src, calib = quantize_case
    out = src.parent / "q.onnx"
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "--exclude-op", "Sigmoid", "-q"]) == 0
    text = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)  # bold/colour escapes
    assert "nodes by op type" in text and "kept in float (1)" in text
    row = next(line for line in text.splitlines() if line.split()[:1] == ["Sigmoid"])
    assert row.split()[1:] == ["0", "1", "excluded", "by", "the", "user"]
    assert text.rstrip().endswith(f"wrote {out} (qdq)")
    assert main(["bench", str(src), str(out), "--repeats", "2"]) == 0
    text = capsys.readouterr().out
    assert "speedup vs first" in text and "1.00x" in text


# --------------------------------------------------------------------------- qnnx quantize --calib <images>


def _exit_code(argv) -> int:
    """main's exit code, whether returned or raised (usage errors raise SystemExit like any parser)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


@pytest.fixture
def image_case(tmp_path):
    """The float model of ``quantize_case`` (input 1x3x8x8) and a directory of four 10x12 PNGs."""
    from PIL import Image

    src = tmp_path / "float.onnx"
    onnx.save(_float_model(), src)
    images = tmp_path / "images"
    images.mkdir()
    rng = np.random.default_rng(2)
    for i in range(4):
        Image.fromarray(rng.integers(0, 256, (10, 12, 3), dtype=np.uint8)).save(images / f"{i}.png")
    return src, images


@pytest.mark.parametrize("options", [["--resize", "8x8"], ["--preprocess", "yolo", "--resize", "8"],
                                     ["--resize", "8", "--letterbox", "--scale", "1", "--mean", "127.5",
                                      "--std", "58,57,57", "--channel-order", "bgr"],
                                     ["--preprocess", "imagenet", "--resize", "8x8"]])
def test_quantize_from_an_image_directory(image_case, capsys, options):
    src, images = image_case
    out = src.parent / "q.onnx"
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(images), "-q", *options]) == 0
    assert "on 4 sample(s)" in capsys.readouterr().out and out.exists()


def test_quantize_image_options_reach_the_calibration(image_case, monkeypatch, capsys):
    import qnnx.autoquant as autoquant

    seen = {}

    def spy(model, calibration, config, validation=None):
        seen["calibration"] = calibration
        raise qnnx.QnnxError("stop here")

    monkeypatch.setattr(autoquant, "quantize", spy)
    src, images = image_case
    assert main(["quantize", str(src), "-o", str(src.parent / "q.onnx"), "--calib", str(images), "--preprocess",
                 "imagenet", "--resize", "8x6", "--layout", "nhwc", "--scale", "1/2"]) == 1
    folder = seen["calibration"].source  # one CalibrationData, built from the ImageFolder
    p = folder.preprocess
    assert (p.size, p.resize, p.layout, p.scale, p.mean) == ((8, 6), "crop", "nhwc", 0.5, (0.485, 0.456, 0.406))
    assert [f.name for f in folder.files] == ["0.png", "1.png", "2.png", "3.png"]


@pytest.mark.parametrize("options,message", [
    (["--resize", "8by8"], "bad --resize '8by8': expected HxW with positive sizes, e.g. 224x224"),
    (["--resize", "0x8"], "bad --resize '0x8'"),
    (["--resize", "8", "--mean", "0.5,x"], "bad --mean '0.5,x': expected comma-separated numbers"),
    (["--resize", "8", "--std", "1,2"], "std needs 1 or 3 values, got 2"),
    (["--resize", "8", "--std", "0"], "std must be finite and > 0, got 0.0"),
    (["--resize", "8", "--scale", "1/0"], "bad --scale '1/0': expected a number or a fraction"),
    (["--letterbox"], "resize mode 'letterbox' needs a size"),
    (["--preprocess", "resnet"], "'resnet' is not one of 'imagenet', 'yolo'"),
    (["--resize", "8", "--layout", "chw"], "'chw' is not one of 'nchw', 'nhwc'"),
])
def test_quantize_bad_image_option_is_a_usage_error(image_case, capsys, options, message):
    src, images = image_case
    out = src.parent / "q.onnx"
    assert _exit_code(["quantize", str(src), "-o", str(out), "--calib", str(images), *options]) == 1
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("qnnx: error: ") and message in err, err
    assert captured.out == "" and not out.exists()


def test_quantize_image_options_without_calib_dir(image_case, capsys):
    src, _ = image_case
    assert _exit_code(["quantize", str(src), "-o", str(src.parent / "q.onnx"), "--random-calibration",
                       "--resize", "8"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "image preprocessing options need --calib DIR" in err


@pytest.mark.parametrize("case", ["no images", "images without options", "corrupt image", "wrong size",
                                  "nhwc for nchw", "missing dir"])
def test_quantize_bad_image_directory_gets_one_line_exit_1(image_case, tmp_path, capsys, case):
    src, images = image_case
    options = ["--resize", "8x8"]
    if case == "no images":
        images = tmp_path / "empty"
        images.mkdir()
        (images / "notes.txt").write_text("x")
        message, where = "no image files (.jpg .jpeg .png .bmp .webp) in the directory", str(images)
    elif case == "images without options":
        options = []
        message, where = "only images: give an ImageFolder", str(images)
    elif case == "corrupt image":
        (images / "2.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
        message, where = "cannot read image (", str(images / "2.png")
    elif case == "wrong size":
        options = ["--resize", "6x8"]
        message, where = "image gives input 1x3x6x8 but model input 'x' expects 1x3x8x8 (resize to 8x8?)", "0.png"
    elif case == "nhwc for nchw":
        options = ["--resize", "8x8", "--layout", "nhwc"]
        message, where = "image gives input 1x8x8x3 but model input 'x' expects 1x3x8x8 (layout nchw?)", "0.png"
    else:
        images = tmp_path / "nowhere"
        message, where = "image path is not a directory", str(images)
    out = tmp_path / "out.onnx"
    assert _exit_code(["quantize", str(src), "-o", str(out), "--calib", str(images), "-q", *options]) == 1
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("qnnx: error: "), err
    assert message in err and where in err, err
    assert captured.out == "" and not out.exists()


# --------------------------------------------------------------------------- compare / bench --data <images>


def test_compare_and_bench_read_an_image_folder_with_the_image_options(image_case, capsys):
    src, images = image_case
    out = src.parent / "q.onnx"
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(images), "--resize", "8x8", "-q"]) == 0
    capsys.readouterr()
    assert main(["compare", str(src), str(out), "--data", str(images), "--resize", "8x8", "--letterbox",
                 "--mean", "0.5", "--num-samples", "3"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("on 3 sample(s)\noutputs:\n  y: SQNR ") and "worst 3 layers (of 3 changed by quantization):" in text
    assert main(["bench", str(src), str(out), "--data", str(images), "--preprocess", "imagenet", "--resize", "8",
                 "--repeats", "2"]) == 0
    assert [line.split()[-1] for line in capsys.readouterr().out.splitlines()] == [str(src), str(out)]


@pytest.mark.parametrize("argv,message", [
    (["compare", "{src}", "{src}", "--data", "{images}"],
     "only images: give an ImageFolder with an ImagePreprocess (command line: --preprocess or --resize)"),
    (["compare", "{src}", "{src}", "--data", "{images}", "--resize", "6x8"],
     "image gives input 1x3x6x8 but model input 'x' expects 1x3x8x8 (resize to 8x8?)"),
    (["bench", "{src}", "--resize", "8"], "image preprocessing options need --data DIR (a directory of images)"),
    (["bench", "{src}", "--data", "{images}", "--resize", "8by8"], "bad --resize '8by8'"),
])
def test_compare_and_bench_bad_image_input_is_one_line_exit_1(image_case, capsys, argv, message):
    src, images = image_case
    assert _exit_code([a.format(src=src, images=images) for a in argv]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("qnnx: error: ") and message in err, err


def test_quantize_summary_and_report_read_the_calibration_subset(quantize_case, capsys):
    """One CalibrationData: the summary compares on the first samples calibration used (of the seeded
    subset), not on the first files of the directory."""
    src, calib = quantize_case
    for i in range(4, 8):
        np.save(calib / f"{i}.npy", np.random.default_rng(i).standard_normal((1, 3, 8, 8)).astype(np.float32) * 3)
    out, report = src.parent / "q.onnx", src.parent / "report"
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "--num-samples", "3", "--seed", "5",
                 "-q", "--report", str(report)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "on 2 calibration sample(s)" in next(line for line in lines if line.startswith("worst"))
    assert any(line.startswith("outputs vs float on 3 calibration sample(s)") for line in lines)
    assert f"errors measured on 3 sample(s): 3 of 8 samples from {calib}/ (.npy; seed 5)" in \
        (report / "index.html").read_text()


# --------------------------------------------------------------------------- qnnx quantize --report, summary


def test_quantize_summary_lists_worst_layers_and_output_sqnr(quantize_case, capsys):
    """The worst layers by node name (what --exclude-node takes) on the 2 samples they are measured on; the
    outputs' agreement is the report's, on the refinement samples, said once."""
    from qnnx.analysis.compare import compare
    from qnnx.analysis.report import fmt_sqnr

    src, calib = quantize_case
    out = src.parent / "q.onnx"
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    errors = compare(src, out, calib, num_samples=2)  # what the summary compares on
    layers = [e for e in errors if not e.is_output]
    assert [e.node for e in layers] and len(layers) == 3  # conv, relu, sigmoid
    assert lines[-2] == "worst 3 layer(s) by SQNR on 2 calibration sample(s): " + ", ".join(
        f"{e.node} ({e.op_type}) {fmt_sqnr(e.sqnr_db)} dB" for e in layers)
    assert sum(line.startswith("outputs vs float on ") for line in lines) == 1
    assert not any(line.startswith("output SQNR") for line in lines)
    assert lines[-1] == f"wrote {out} (qdq)"


def test_quantize_summary_table_on_a_terminal(quantize_case, capsys, monkeypatch):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    src, calib = quantize_case
    assert main(["quantize", str(src), "-o", str(src.parent / "q.onnx"), "--calib", str(calib), "-q"]) == 0
    text = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    assert "worst layers by SQNR vs the float model (on 2 calibration sample(s))" in text


def test_quantize_report_writes_the_html_report(image_case, capsys):
    src, images = image_case
    out, report = src.parent / "q.onnx", src.parent / "report"
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(images), "--resize", "8x8", "-q",
                 "--report", str(report)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {report / 'index.html'}"
    html = (report / "index.html").read_text()
    pngs = re.findall(r'<img src="([^"]+)"', html)
    assert "layers.png" in pngs and len(pngs) >= 2
    assert sorted(p.name for p in report.iterdir()) == sorted(pngs + ["index.html"])
    assert "errors measured on 4 sample(s)" in html and str(src) in html
    # again: a previous report is replaced
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(images), "--resize", "8x8", "-q",
                 "--report", str(report)]) == 0


@pytest.mark.parametrize("case", ["foreign directory", "same as -o", "a file"])
def test_quantize_report_refused_before_quantizing(quantize_case, tmp_path, capsys, case):
    src, calib = quantize_case
    out = tmp_path / "q.onnx"
    report = tmp_path / "report"
    if case == "foreign directory":
        report.mkdir()
        (report / "notes.txt").write_text("mine")
        message = "refusing to replace: not a directory holding only a previous report"
    elif case == "same as -o":
        report = out
        message = "--report and -o name the same path"
    else:
        report.write_text("x")
        message = "refusing to replace"
    assert _exit_code(["quantize", str(src), "-o", str(out), "--calib", str(calib), "--report", str(report)]) == 1
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("qnnx: error: ") and message in err and str(report) in err
    assert captured.out == "" and not out.exists()
    assert "calibrating" not in captured.err  # refused before any calibration


def test_quantize_bias_correction_and_weight_rounding_reach_the_config(quantize_case, monkeypatch, capsys):
    # what ran shows in the summary: each refinement's own record
    src, calib = quantize_case
    out = src.parent / "q.onnx"
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "-q"]) == 0
    text = capsys.readouterr().out  # the defaults: gptq rounding, then the sequential correction
    assert "weights: 1 conv(s) (0 depthwise) rounded for their output error" in text
    assert "biases: 1 conv(s) corrected for their mean output shift against float in 1 sequential stage(s)" in text
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "--bias-correction", "off", "-q"]) == 0
    text = capsys.readouterr().out
    assert "weights: 1 conv(s)" in text and "biases:" not in text
    seen = _config_field_seen((src, calib), monkeypatch, ["--bias-correction", "own", "--weight-rounding", "nearest"],
                              "refinements.bias_correction")
    text = capsys.readouterr().out
    assert seen == ["own"] and "weights:" not in text and "sequential stage(s)" not in text


# --------------------------------------------------------------------------- paths, bench, random calibration


@pytest.mark.parametrize("target", ["sample", "inside calib", "calib itself", "existing directory", "empty", "/sys"])
def test_quantize_output_never_names_an_input_or_an_unwritable_path(quantize_case, capsys, target):
    """`-o samples/000.npy` once overwrote a calibration sample; odd paths exited 2."""
    src, calib = quantize_case
    (src.parent / "d").mkdir()
    out = {"sample": calib / "0.npy", "inside calib": calib / "q.onnx", "calib itself": calib,
           "existing directory": src.parent / "d", "empty": "", "/sys": "/sys/qnnx-cli-test.onnx"}[target]
    before = {p: p.read_bytes() for p in calib.iterdir()}
    assert _exit_code(["quantize", str(src), "-o", str(out), "--calib", str(calib)]) == 1
    captured = capsys.readouterr()
    assert len(captured.err.strip().splitlines()) == 1 and captured.err.startswith("qnnx: error: ")
    assert "calibrating" not in captured.err  # refused before any work
    assert {p: p.read_bytes() for p in calib.iterdir()} == before


def test_written_files_and_reports_follow_the_umask(image_case, capsys):
    src, images = image_case
    out, report = src.parent / "q.onnx", src.parent / "report"
    old = os.umask(0o027)
    try:
        assert main(["quantize", str(src), "-o", str(out), "--calib", str(images), "--resize", "8x8", "-q",
                     "--speed-fallback", "off", "--report", str(report)]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert stat.S_IMODE(report.stat().st_mode) == 0o750
    assert stat.S_IMODE((report / "index.html").stat().st_mode) == 0o640


def _one_input_model(path, name="x", elem=onnx.TensorProto.FLOAT, shape=(1, 4)):
    g = helper.make_graph([helper.make_node("Relu" if elem == onnx.TensorProto.FLOAT else "Identity", [name], ["y"])],
                          "g", [helper.make_tensor_value_info(name, elem, list(shape))],
                          [helper.make_tensor_value_info("y", elem, list(shape))])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return str(path)


def test_bench_refuses_models_of_different_inputs(tmp_path, capsys):
    a, b = _one_input_model(tmp_path / "a.onnx"), _one_input_model(tmp_path / "b.onnx", name="z")
    c = _one_input_model(tmp_path / "c.onnx", shape=(1, 5))
    assert main(["bench", a, b, "--repeats", "1"]) == 1
    assert "inputs z differ from" in capsys.readouterr().err
    assert main(["bench", a, c, "--repeats", "1"]) == 1
    assert "input 'x' is FLOAT [1x5] here but FLOAT [1x4]" in capsys.readouterr().err


def test_bench_profile_shows_each_models_time_per_op_type(image_case, capsys):
    src, images = image_case
    out = src.parent / "q.onnx"
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(images), "--resize", "8x8", "-q"]) == 0
    capsys.readouterr()
    assert main(["bench", str(src), str(out), "--data", str(images), "--resize", "8", "--repeats", "2",
                 "--profile"]) == 0
    text = capsys.readouterr().out
    float_part, int8_part = text.split(f"{src}: kernel time ")[1].split(f"{out}: kernel time ")
    assert "Conv " in float_part and "QLinearConv" not in float_part
    assert "QLinearConv" in int8_part  # ORT's fused kernel: the int8 conv ran as one


def test_bench_without_data_needs_float_inputs(tmp_path, capsys):
    s = _one_input_model(tmp_path / "s.onnx", elem=onnx.TensorProto.STRING, shape=(1,))
    assert main(["bench", s, "--repeats", "1"]) == 1
    assert "input 'x' is STRING; without --data bench feeds random float values" in capsys.readouterr().err


def test_random_calibration_refuses_a_huge_input_before_allocating(tmp_path, capsys):
    big = _one_input_model(tmp_path / "big.onnx", shape=(64, 3, 4096, 4096))
    assert main(["quantize", big, "-o", str(tmp_path / "q.onnx"), "--random-calibration", "-q"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "random calibration would need 192 GiB (16 samples of x [64, 3, 4096, 4096])" in err
    s = _one_input_model(tmp_path / "s.onnx", elem=onnx.TensorProto.STRING, shape=(1,))
    assert main(["quantize", s, "-o", str(tmp_path / "q.onnx"), "--random-calibration", "-q"]) == 1
    assert "input 'x' is STRING; random calibration makes float32 samples only" in capsys.readouterr().err


@pytest.mark.parametrize("argv, want", [([], 7), (["--weight-bits", "8"], 8),
                                        (["--weight-bits", "pairs", "--target", "openvino"], "pairs")])
def test_quantize_weight_bits_option(quantize_case, capsys, monkeypatch, argv, want):
    assert _config_field_seen(quantize_case, monkeypatch, argv, "weight_bits") == [want]


@pytest.mark.parametrize("argv, want", [([], ("norms", 0.5)), (["--smoothing-alpha", "0"], ("norms", None)),
                                        (["--smoothing-sites", "matmuls", "--smoothing-alpha", "0.8"],
                                         ("matmuls", 0.8))])
def test_quantize_smoothing_options(quantize_case, capsys, monkeypatch, argv, want):
    sites = _config_field_seen(quantize_case, monkeypatch, argv, "refinements.smoothing_sites")
    alpha = _config_field_seen(quantize_case, monkeypatch, argv, "refinements.smoothing_alpha")
    assert (sites[0], alpha[0]) == want


@pytest.mark.parametrize("argv, want", [
    (["--target", "openvino", "--preset", "transformer"], ("matmuls", 0.8, "pairs", "gptq_all")),
    # what the command line gives overrides the preset, 0 (smoothing off) included
    (["--target", "openvino", "--preset", "transformer", "--smoothing-alpha", "0", "--weight-bits", "7"],
     ("matmuls", None, 7, "gptq_all")),
    (["--target", "openvino", "--weight-rounding", "nearest", "--preset", "transformer"],
     ("matmuls", 0.8, "pairs", "nearest"))])
def test_quantize_preset_fills_what_the_command_line_leaves(quantize_case, capsys, monkeypatch, argv, want):
    fields = ("refinements.smoothing_sites", "refinements.smoothing_alpha", "weight_bits", "refinements.weight_rounding")
    seen = tuple(_config_field_seen(quantize_case, monkeypatch, argv, f)[0] for f in fields)
    assert seen == want


@pytest.mark.parametrize("argv, message", [(["--weight-bits", "9"], "weight_bits must be one of 7, 8, pairs, got '9'"),
                                           (["--weight-bits", "pairs"], "how onnxruntime's kernels pair products was "
                                                                         "not checked"),
                                           (["--preset", "transformer"], "preset 'transformer' was measured for target "
                                                                         "openvino only, not onnxruntime")])
def test_quantize_bad_weight_bits_or_preset_is_one_line(quantize_case, capsys, argv, message):
    src, calib = quantize_case
    out = src.parent / "q.onnx"
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "-q", *argv]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not out.exists()
