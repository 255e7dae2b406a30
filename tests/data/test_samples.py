"""Calibration samples (qnnx.data.samples) as the pipeline reads them today (iter_samples): directories of .npy/.npz, iterables of arrays or
feed dicts, validated one sample at a time against the model inputs, with one clear error line
per problem (the checks below assert the message substrings users rely on)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from data_models import add_tanh, conv_sigmoid, embedding

import qnnx
from qnnx import QnnxError, QuantConfig
from qnnx.data import InputSpec, input_specs, iter_samples

RNG = np.random.default_rng(3)


def _one_input_model(dims=(1, 3, 4, 4)):
    return conv_sigmoid(RNG, dims)


def _two_input_model():
    return add_tanh()


def _specs(model):
    return input_specs(ir.from_proto(model))


ONE = _specs(_one_input_model())
TWO = _specs(_two_input_model())
DYN = _specs(_one_input_model(("N", 3, "H", "W")))


def _x(shape=(1, 3, 4, 4), dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _error(calibration, specs, limit=None) -> str:
    with pytest.raises(QnnxError) as info:
        list(iter_samples(calibration, specs, limit))
    msg = str(info.value)
    assert "\n" not in msg, msg  # one line
    return msg


# --------------------------------------------------------------------------- accepted forms


def test_input_specs_static_and_dynamic_dims():
    assert ONE == [InputSpec("x", (1, 3, 4, 4))]
    assert TWO == [InputSpec("a", (1, 4)), InputSpec("b", (None, 4))]
    assert DYN == [InputSpec("x", (None, 3, None, None))]


def test_directory_of_npy_for_a_single_input_model(tmp_path):
    arrays = [_x() for _ in range(3)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"s{i}.npy", a if i else a.astype(np.float64))  # float64 is accepted, as float32
    (tmp_path / "README.txt").write_text("not a sample")
    (tmp_path / "sub").mkdir()
    got = list(iter_samples(tmp_path, ONE))
    assert len(got) == 3
    for feed, a in zip(got, arrays):  # sorted file order
        assert list(feed) == ["x"] and feed["x"].dtype == np.float32
        np.testing.assert_array_equal(feed["x"], a)
    assert len(list(iter_samples(str(tmp_path), ONE, limit=2))) == 2  # str paths too


def test_directory_of_npz_keyed_by_input_name_for_a_two_input_model(tmp_path):
    feeds = [{"a": _x((1, 4)), "b": _x((n, 4))} for n in (1, 3)]
    for i, f in enumerate(feeds):
        np.savez(tmp_path / f"s{i}.npz", **f)
    got = list(iter_samples(tmp_path, TWO))
    assert [sorted(f) for f in got] == [["a", "b"], ["a", "b"]]
    for g_, f in zip(got, feeds):
        np.testing.assert_array_equal(g_["a"], f["a"])
        np.testing.assert_array_equal(g_["b"], f["b"])
    qm = qnnx.quantize(_two_input_model(), tmp_path, QuantConfig(progress=False))
    assert qm.report.num_samples == 2
    assert [d.node for d in qm.report.decisions if d.quantized] == ["add", "tanh"]


def test_iterable_of_arrays_and_of_dicts():
    arrays = [_x() for _ in range(3)]
    got = list(iter_samples(arrays, ONE))
    assert [list(f) for f in got] == [["x"]] * 3
    np.testing.assert_array_equal(got[2]["x"], arrays[2])
    dicts = [{"a": _x((1, 4)), "b": _x((2, 4))}, {"b": _x((1, 4)), "a": _x((1, 4))}]
    got = list(iter_samples(iter(dicts), TWO))
    assert len(got) == 2 and got[1]["b"].shape == (1, 4)
    assert len(list(iter_samples((a for a in arrays), ONE, limit=1))) == 1


def test_samples_are_pulled_one_at_a_time():
    pulled = []

    def gen():
        for i in range(5):
            pulled.append(i)
            yield _x()

    it = iter_samples(gen(), ONE)
    next(it)
    assert pulled == [0]
    next(it)
    assert pulled == [0, 1]


# --------------------------------------------------------------------------- errors


def test_empty_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    msg = _error(tmp_path, ONE)
    assert "no .npy or .npz sample files" in msg and str(tmp_path) in msg


def test_missing_directory(tmp_path):
    msg = _error(tmp_path / "nope", ONE)
    assert "sample path is not a directory" in msg and "nope" in msg


def test_npy_given_to_a_two_input_model(tmp_path):
    np.save(tmp_path / "s0.npy", _x((1, 4)))
    msg = _error(tmp_path, TWO)
    assert ".npy samples need a single-input model" in msg and "a, b" in msg
    assert "use .npz keyed by input name" in msg and "s0.npy" in msg


def test_array_given_to_a_two_input_model():
    msg = _error([_x((1, 4))], TWO)
    assert "calibration sample 0 is an array but the model has several inputs" in msg


@pytest.mark.parametrize("feed,expected", [
    ({"a": np.zeros((1, 4), np.float32)}, "missing b"),
    ({"a": np.zeros((1, 4), np.float32), "b": np.zeros((1, 4), np.float32), "c": np.zeros(1, np.float32)},
     "unknown c"),
    ({"a": np.zeros((1, 4), np.float32), "B": np.zeros((1, 4), np.float32)}, "missing b; unknown B"),
])
def test_wrong_input_names(tmp_path, feed, expected):
    np.savez(tmp_path / "s0.npz", **feed)
    msg = _error(tmp_path, TWO)
    assert "sample does not match the model inputs" in msg and expected in msg and "expected a, b" in msg
    assert "s0.npz" in msg
    assert expected in _error([feed], TWO)  # the same check for dicts


@pytest.mark.parametrize("shape,expected", [
    ((3, 4, 4), "input 'x' has shape 3x4x4, model expects 1x3x4x4"),
    ((1, 2, 4, 4), "input 'x' has shape 1x2x4x4, model expects 1x3x4x4"),
    ((2, 3, 4, 4), "input 'x' has shape 2x3x4x4, model expects 1x3x4x4"),
])
def test_wrong_rank_or_static_dim(shape, expected):
    msg = _error([_x(), _x(shape)], ONE)
    assert expected in msg and "calibration sample 1" in msg


def test_dynamic_dims_accept_any_size_but_not_another_rank():
    assert len(list(iter_samples([_x((2, 3, 5, 7)), _x((1, 3, 1, 1))], DYN))) == 2
    assert "model expects ?x3x?x?" in _error([_x((2, 3, 5))], DYN)


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.bool_])
def test_integer_dtype(dtype):
    msg = _error([np.ones((1, 3, 4, 4), dtype)], ONE)
    assert f"input 'x' has dtype {np.dtype(dtype)}; expected float" in msg


def _token_model():
    return embedding(RNG)


TOKENS = _specs(_token_model())


def test_integer_input_keeps_its_declared_dtype():
    assert TOKENS == [InputSpec("ids", (1, None), ir.DataType.INT64)]
    feeds = list(iter_samples([np.array([[1, 2, 9]], np.int64), np.array([[3]], np.int32)], TOKENS))
    assert [f["ids"].dtype for f in feeds] == [np.int64, np.int64]  # int32 widened, never cast to float
    assert feeds[1]["ids"].tolist() == [[3]]


@pytest.mark.parametrize("dtype", [np.float32, np.bool_])
def test_integer_input_refuses_non_integers(dtype):
    assert f"input 'ids' has dtype {np.dtype(dtype)}; expected integer (int64)" in _error(
        [np.ones((1, 3), dtype)], TOKENS)


def test_integer_input_out_of_range():
    specs = _specs(embedding(RNG, np.int32, (1, 2), rows=4))
    assert "input 'ids' has values outside int32" in _error([np.array([[0, 2**40]], np.int64)], specs)


def test_quantize_a_model_with_token_id_input():
    m = _token_model()
    qm = qnnx.quantize(m, [{"ids": RNG.integers(0, 10, (1, 5))} for _ in range(4)], QuantConfig(progress=False))
    assert any(d.quantized and d.op_type == "Tanh" for d in qm.report.decisions)


def test_nan_and_inf_are_counted(tmp_path):
    a = _x()
    a.flat[[0, 5]] = np.nan
    a.flat[7] = -np.inf
    msg = _error([_x(), a], ONE)
    assert "input 'x' has 3 NaN/Inf value(s)" in msg and "calibration sample 1" in msg
    np.save(tmp_path / "bad.npy", a)
    msg = _error(tmp_path, ONE)
    assert "has 3 NaN/Inf value(s)" in msg and "bad.npy" in msg


def test_empty_array():
    assert "input 'x' is empty" in _error([_x((0, 3, 4, 4))], DYN)


@pytest.mark.parametrize("calibration", [[], (), iter([]), (x for x in [])], ids=["list", "tuple", "iter", "gen"])
def test_empty_iterable(calibration):
    assert _error(calibration, ONE) == "calibration data is empty"


def test_not_an_iterable():
    assert "calibration must be a directory or an iterable of samples, got int" in _error(5, ONE)


@pytest.mark.parametrize("content", [b"garbage", b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order'"],
                         ids=["garbage", "truncated-header"])
def test_corrupt_npy_names_the_file(tmp_path, content):
    np.save(tmp_path / "a_good.npy", _x())
    (tmp_path / "b_corrupt.npy").write_bytes(content)
    msg = _error(tmp_path, ONE)
    assert "cannot read calibration sample" in msg and str(tmp_path / "b_corrupt.npy") in msg


def test_corrupt_npz_names_the_file(tmp_path):
    (tmp_path / "s.npz").write_bytes(b"PK\x03\x04 not really a zip")
    msg = _error(tmp_path, TWO)
    assert "cannot read calibration sample" in msg and "s.npz" in msg


def test_errors_reach_quantize_with_the_sample(tmp_path):
    bad = _x()
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(QnnxError, match=r"calibration sample 2: input 'x' has 1 NaN/Inf value\(s\)"):
        qnnx.quantize(_one_input_model(), [_x(), _x(), bad], QuantConfig(progress=False))
    with pytest.raises(QnnxError, match="calibration data is empty"):
        qnnx.quantize(_one_input_model(), [], QuantConfig(progress=False))


def test_limit_does_not_read_past_the_last_sample(tmp_path):
    for i in range(2):
        np.save(tmp_path / f"s{i}.npy", _x())
    (Path(tmp_path) / "s2.npy").write_bytes(b"garbage")
    assert len(list(iter_samples(tmp_path, ONE, limit=2))) == 2
