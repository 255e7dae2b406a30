"""The TFLite frontend's API and command: what it writes, what it refuses, and the lazy dependency."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("ai_edge_litert")

import qnnx  # noqa: E402
from qnnx.cli import main  # noqa: E402
from qnnx.errors import QnnxError  # noqa: E402
from tests.frontends.tflite_build import T, model, opts  # noqa: E402

DATA = Path(__file__).parent.parent / "data" / "tflite"


def test_boundary_keeps_tflite_names_dtypes_and_nhwc_shapes():
    proto = qnnx.from_tflite(DATA / "face_detection_int8.tflite")
    assert [(i.name, i.type.tensor_type.elem_type, [d.dim_value for d in i.type.tensor_type.shape.dim])
            for i in proto.graph.input] == [("input", onnx.TensorProto.INT8, [1, 128, 128, 3])]
    assert [o.name for o in proto.graph.output] == ["regressors", "classificators"]
    assert {p.key: p.value for p in proto.metadata_props}["qnnx.left_in_float"] == ""
    ops = {n.op_type for n in proto.graph.node}
    assert {"conv", "requantize", "add"} <= ops and "Transpose" in ops


def test_conv_chain_keeps_one_transpose_pair():
    """NHWC at the boundary, NCHW inside: the Transposes between two convs cancel."""
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (4, 1, 1, 4)).astype(np.int8)
    conv = model("CONV_2D", [T((1, 5, 5, 4), np.int8, 0.1, 0), T(w.shape, np.int8, [0.01] * 4, 0, 0, w), None],
                 [T((1, 5, 5, 4), np.int8, 0.1, 0)], opts("Conv2DOptions", padding=0, strideW=1, strideH=1))
    from ai_edge_litert import schema_py_generated as s
    import flatbuffers

    m = s.ModelT.InitFromPackedBuf(conv, 0)  # a second conv reading the first's output
    sg = m.subgraphs[0]
    out2 = s.TensorT()
    out2.name, out2.shape, out2.type, out2.buffer, out2.quantization = "out_b", [1, 5, 5, 4], s.TensorType.INT8, 0, \
        sg.tensors[sg.outputs[0]].quantization
    sg.tensors.append(out2)
    op2 = s.OperatorT()
    op2.opcodeIndex, op2.inputs, op2.outputs = 0, [sg.outputs[0], 1, -1], [len(sg.tensors) - 1]
    op2.builtinOptionsType, op2.builtinOptions = sg.operators[0].builtinOptionsType, sg.operators[0].builtinOptions
    sg.operators.append(op2)
    sg.outputs = [len(sg.tensors) - 1]
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    proto = qnnx.from_tflite(bytes(b.Output()), strict=True)
    assert [n.op_type for n in proto.graph.node].count("Transpose") == 2


def test_missing_litert_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)
    with pytest.raises(QnnxError, match=r"pip install 'qnnx\[tflite\]'"):
        qnnx.from_tflite(DATA / "mltk_keyword_spotting.tflite")


def test_cli_from_tflite(tmp_path, capsys):
    out = tmp_path / "kws.onnx"
    assert main(["from-tflite", str(DATA / "mltk_keyword_spotting.tflite"), "-o", str(out), "--strict"]) == 0
    assert "every quantized op is integer" in capsys.readouterr().out
    m = onnx.load(out)
    assert m.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # its input is float in TFLite too


def test_cli_from_tflite_refuses(tmp_path, capsys):
    src = DATA / "mltk_keyword_spotting.tflite"
    assert main(["from-tflite", str(src), "-o", str(src)]) == 1
    assert "refusing to overwrite the input model" in capsys.readouterr().err
    assert main(["from-tflite", str(tmp_path / "none.tflite"), "-o", str(tmp_path / "x.onnx")]) == 1
    assert "no such .tflite file" in capsys.readouterr().err
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"\x00" * 64)
    assert main(["from-tflite", str(bad), "-o", str(tmp_path / "x.onnx")]) == 1
    assert "not a TFLite flatbuffer" in capsys.readouterr().err
    mx = tmp_path / "mx.tflite"
    mx.write_bytes(model("MAXIMUM", [T((1, 4), np.int8, 0.1, 0), T((1, 4), np.int8, 0.1, 0)], [T((1, 4), np.int8, 0.1, 0)]))
    assert main(["from-tflite", str(mx), "-o", str(tmp_path / "x.onnx")]) == 1
    assert "operator 0 (MAXIMUM): no integer rule for MAXIMUM, and it has no float form either" in capsys.readouterr().err
    assert not (tmp_path / "x.onnx").exists()


def test_corrupted_files_are_refused_in_one_line():
    """Truncated files and flipped bytes in a real model's flatbuffer: converted, or a QnnxError,
    never another exception."""
    data = (DATA / "mltk_keyword_spotting.tflite").read_bytes()
    rng = np.random.default_rng(26)
    for k in range(120):
        b = bytearray(data)
        if k % 2:
            b = b[: int(rng.integers(0, len(b)))]
        else:
            for _ in range(int(rng.integers(1, 6))):
                b[int(rng.integers(len(b) - 6000, len(b)))] = int(rng.integers(0, 256))
        try:
            qnnx.from_tflite(bytes(b))
        except QnnxError as e:
            assert "\n" not in str(e)
