"""check_output: an output never names an input, and is checked before any work."""

from __future__ import annotations

import os

import pytest

from qnnx.errors import QnnxError
from qnnx.paths import check_output


@pytest.fixture
def inputs(tmp_path):
    (tmp_path / "m.onnx").write_bytes(b"model")
    calib = tmp_path / "calib"
    calib.mkdir()
    (calib / "000.npy").write_bytes(b"sample")
    (tmp_path / "a_file").write_bytes(b"x")
    return {"model": tmp_path / "m.onnx", "calibration data": calib}


def _refused(out, inputs, match):
    with pytest.raises(QnnxError, match=match):
        check_output(out, inputs)


def test_a_new_file_beside_the_inputs_is_fine(tmp_path, inputs):
    assert check_output(tmp_path / "out.onnx", inputs) == tmp_path / "out.onnx"
    assert check_output(tmp_path / "new" / "dir" / "out.onnx", inputs).name == "out.onnx"  # parents are made later
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "calib", "m.onnx"]  # the probe left nothing


def test_no_input_is_overwritten(tmp_path, inputs):
    _refused(tmp_path / "m.onnx", inputs, "refusing to overwrite the input model")
    _refused(tmp_path / "calib" / ".." / "m.onnx", inputs, "refusing to overwrite the input model")
    _refused(tmp_path / "calib" / "000.npy", inputs, "refusing to write inside the calibration data directory")
    _refused(tmp_path / "calib" / "new.onnx", inputs, "inside the calibration data directory")
    _refused(tmp_path / "calib", inputs, "refusing to overwrite the input calibration data")


def test_a_symlink_to_the_input_is_the_input(tmp_path, inputs):
    os.symlink(tmp_path / "m.onnx", tmp_path / "link.onnx")
    _refused(tmp_path / "link.onnx", inputs, "refusing to overwrite the input model")


@pytest.mark.parametrize("out,match", [("", "names no file"), ("   ", "names no file"),
                                       ("/sys/qnnx-test.onnx", "cannot write in /sys"),
                                       ("/proc/qnnx/test.onnx", "cannot write in /proc")])
def test_paths_that_cannot_be_written(inputs, out, match):
    _refused(out, inputs, match)


def test_an_existing_directory_or_a_file_as_directory(tmp_path, inputs):
    (tmp_path / "d").mkdir()
    _refused(tmp_path / "d", inputs, "existing directory")
    _refused(tmp_path / "a_file" / "x.onnx", inputs, "is not a directory")


def test_the_external_data_of_the_model_is_an_input(tmp_path):
    import numpy as np
    import onnx
    from onnx import helper

    from qnnx.paths import model_files

    w = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[1], data_location=onnx.TensorProto.EXTERNAL)
    entry = w.external_data.add()
    entry.key, entry.value = "location", "weights.bin"
    (tmp_path / "weights.bin").write_bytes(np.float32(2).tobytes())
    g = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])], [w])
    (tmp_path / "m.onnx").write_bytes(helper.make_model(g).SerializeToString())
    files = model_files(tmp_path / "m.onnx")
    assert files == {"model": tmp_path / "m.onnx", "external data file weights.bin": tmp_path / "weights.bin"}
    _refused(tmp_path / "weights.bin", files, "refusing to overwrite the input external data file weights.bin")
    assert model_files(tmp_path / "absent.onnx") == {"model": tmp_path / "absent.onnx"}
