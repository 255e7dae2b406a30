"""CalibrationData (qnnx.data.samples): one re-iterable type for every source, with deterministic
head/split, the seeded subset the pipeline has always picked, the same one-line errors as before,
and directories read one file at a time."""

from __future__ import annotations

import tracemalloc

import numpy as np
import onnx_ir as ir
import pytest
from data_models import add_tanh, conv_sigmoid
from PIL import Image

import qnnx
from qnnx import CalibrationData, QuantConfig
from qnnx.data import ImageFolder, ImagePreprocess, InputSpec, input_specs
from conftest import one_line_error

RNG = np.random.default_rng(11)
ONE = [InputSpec("x", (1, 3, 4, 4))]
TWO = input_specs(ir.from_proto(add_tanh()))


def _x(value: float = 0.0, shape=(1, 3, 4, 4)) -> np.ndarray:
    return np.full(shape, value, np.float32)


def _values(data) -> list[float]:
    """Each sample's first element: which sample it is (the fixtures fill sample i with i)."""
    return [float(next(iter(f.values())).flat[0]) for f in data]


@pytest.fixture
def npy_dir(tmp_path):
    """12 .npy samples, sample i filled with i (float64 on disk: fed as float32)."""
    d = tmp_path / "samples"
    d.mkdir()
    for i in range(12):
        np.save(d / f"{i:02d}.npy", np.full((1, 3, 4, 4), i, np.float64))
    (d / "notes.txt").write_text("not a sample")
    return d


@pytest.fixture
def image_dir(tmp_path):
    """6 uniform grey 4x4 images, image i of value 10 * i."""
    d = tmp_path / "images"
    d.mkdir()
    for i in range(6):
        Image.fromarray(np.full((4, 4, 3), 10 * i, np.uint8)).save(d / f"{i}.png")
    return d


# --------------------------------------------------------------------------- sources, re-iterated


def test_a_directory_is_re_iterable_in_name_order_and_converted_to_the_declared_dtype(npy_dir):
    data = CalibrationData.from_source(npy_dir).bind(ONE)
    first, second = list(data), list(data)
    assert _values(first) == list(range(12)) and len(data) == 12
    for a, b in zip(first, second):
        assert list(a) == ["x"] and a["x"].dtype == np.float32
        np.testing.assert_array_equal(a["x"], b["x"])
    assert data.specs == ONE and CalibrationData.from_source(npy_dir).specs is None


def test_an_image_folder_is_re_iterable(image_dir):
    data = CalibrationData.from_source(ImageFolder(image_dir, ImagePreprocess(scale=1.0))).bind(ONE)
    assert _values(data) == _values(data) == [0, 10, 20, 30, 40, 50] and len(data) == 6


def test_lists_and_tuples_of_arrays_or_dicts():
    arrays = [_x(i) for i in range(3)]
    assert _values(CalibrationData.from_source(arrays).bind(ONE)) == [0, 1, 2]
    assert _values(CalibrationData.from_source(tuple(arrays)).bind(ONE)) == [0, 1, 2]
    dicts = [{"a": np.full((1, 4), i, np.float32), "b": np.zeros((2, 4), np.float32)} for i in range(2)]
    data = CalibrationData.from_source(dicts).bind(TWO)
    assert _values(data) == [0, 1] and len(data) == 2


def test_a_one_shot_generator_is_read_once_kept_and_iterated_again():
    pulled = []

    def gen():
        for i in range(5):
            pulled.append(i)
            yield _x(i)

    data = CalibrationData.from_source(gen()).bind(ONE)
    it = iter(data)
    assert "not counted yet" in repr(data) and pulled == []  # neither iter() nor repr() reads
    next(it)
    assert pulled == [0]  # pulled one at a time
    assert _values(data.head(2)) == [0, 1] and pulled == [0, 1]  # no further than needed
    assert _values(data) == _values(data) == [0, 1, 2, 3, 4]
    assert pulled == [0, 1, 2, 3, 4] and len(data) == 5


def test_a_callable_is_called_again_for_each_pass():
    calls = []

    def make():
        calls.append(1)
        return (_x(i) for i in range(4))

    data = CalibrationData.from_source(make).bind(ONE)
    assert _values(data) == [0, 1, 2, 3] and _values(data) == [0, 1, 2, 3]
    assert len(calls) == 2
    assert len(data) == 4 and len(calls) == 3  # counted by a pass of its own, once
    assert len(data) == 4 and len(calls) == 3
    assert _values(data.head(2)) == [0, 1]


def test_a_re_iterable_object_is_iterated_again_once_per_pass():
    batch = np.stack([_x(i)[0] for i in range(3)])[:, None]  # (3, 1, 3, 4, 4): iterating gives the samples
    data = CalibrationData.from_source(batch).bind(ONE)
    assert _values(data) == _values(data) == [0, 1, 2]

    class Counted:
        passes = 0

        def __iter__(self):
            Counted.passes += 1
            return iter([_x(1), _x(2)])

    data = CalibrationData.from_source(Counted()).bind(ONE)
    assert Counted.passes == 0  # building it starts no pass
    assert _values(data) == [1, 2] and _values(data.head(1)) == [1] and Counted.passes == 2


def test_from_a_calibration_data_is_the_same_object_unless_limited(npy_dir):
    data = CalibrationData.from_source(npy_dir)
    assert CalibrationData.from_source(data) is data
    assert CalibrationData.from_source(data, num_samples=12) is data
    assert _values(CalibrationData.from_source(data, num_samples=3, seed=None).bind(ONE)) == [0, 1, 2]


# --------------------------------------------------------------------------- subsets, head, split


@pytest.mark.parametrize("num_samples,seed", [(5, 0), (3, 7), (11, 1)])
def test_seeded_subset_is_the_files_the_pipeline_always_picked(npy_dir, num_samples, seed):
    """The rule written out: ``default_rng(seed).choice(n, size=k, replace=False)``, kept in name order."""
    pick = sorted(np.random.default_rng(seed).choice(12, size=num_samples, replace=False))
    data = CalibrationData.from_source(npy_dir, num_samples=num_samples, seed=seed).bind(ONE)
    assert _values(data) == pick and len(data) == num_samples
    # the same re-limit as the pipeline applies to the data it is given (config.num_samples / seed)
    assert CalibrationData.from_source(data, num_samples=num_samples, seed=seed) is data


def test_seeded_subset_of_an_image_folder(image_dir):
    pick = sorted(np.random.default_rng(4).choice(6, size=3, replace=False))
    folder = ImageFolder(image_dir, ImagePreprocess(scale=1.0))
    assert _values(CalibrationData.from_source(folder, num_samples=3, seed=4).bind(ONE)) == [10 * i for i in pick]


def test_without_seed_or_from_memory_the_subset_is_the_first_samples(npy_dir):
    assert _values(CalibrationData.from_source(npy_dir, num_samples=4, seed=None).bind(ONE)) == [0, 1, 2, 3]
    assert len(CalibrationData.from_source(npy_dir, num_samples=4, seed=None)) == 4
    arrays = [_x(i) for i in range(6)]
    assert _values(CalibrationData.from_source(arrays, num_samples=4, seed=3).bind(ONE)) == [0, 1, 2, 3]
    assert len(CalibrationData.from_source(npy_dir, num_samples=40)) == 12


def test_quantize_reads_a_calibration_data_exactly_like_its_source(npy_dir, tmp_path):
    config = QuantConfig(progress=False, num_samples=5, seed=2, speed_fallback="off")
    model = conv_sigmoid(RNG)
    paths = {}
    for name, source in (("dir", npy_dir), ("data", CalibrationData.from_source(npy_dir, num_samples=5, seed=2)),
                         ("unlimited", CalibrationData.from_source(npy_dir))):
        paths[name] = tmp_path / f"{name}.onnx"
        qnnx.quantize(model, source, config).save(paths[name])
    assert paths["dir"].read_bytes() == paths["data"].read_bytes() == paths["unlimited"].read_bytes()


def test_head_is_the_first_n_in_order(npy_dir):
    data = CalibrationData.from_source(npy_dir, num_samples=6, seed=0).bind(ONE)
    order = _values(data)
    assert _values(data.head(4)) == order[:4] and len(data.head(4)) == 4
    assert _values(data.head(4).head(2)) == order[:2] and _values(data.head(2).head(4)) == order[:2]
    assert data.head(6) is data and data.head(100) is data
    assert "head needs a positive number" in one_line_error(lambda: data.head(0))


@pytest.mark.parametrize("validation,held", [(3, [2, 6, 10]), (0.25, [2, 6, 10]), (1, [6]),
                                             (11, [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11])])
def test_split_holds_out_samples_spread_evenly(npy_dir, validation, held):
    data = CalibrationData.from_source(npy_dir).bind(ONE)
    calib, out = data.split(validation)
    assert _values(out) == held
    assert _values(calib) == [i for i in range(12) if i not in held]
    assert len(calib) + len(out) == 12
    again = data.split(validation)
    assert _values(again[0]) == _values(calib) and _values(again[1]) == _values(out)


def test_split_of_a_subset_and_of_a_generator(npy_dir):
    data = CalibrationData.from_source(npy_dir, num_samples=6, seed=0).bind(ONE)
    order = _values(data)
    calib, out = data.split(2)
    assert _values(out) == [order[1], order[4]] and _values(calib) == [order[i] for i in (0, 2, 3, 5)]
    calib, out = CalibrationData.from_source(_x(i) for i in range(4)).bind(ONE).split(0.5)
    assert (_values(calib), _values(out)) == ([0, 2], [1, 3])


@pytest.mark.parametrize("validation", [0, 12, 13, 0.01, 0.99, 1.0, 0.0, -1, True, "2"])
def test_split_refuses_an_empty_part(npy_dir, validation):
    msg = one_line_error(lambda: CalibrationData.from_source(npy_dir).split(validation))
    assert "hold out" in msg or "validation" in msg


# --------------------------------------------------------------------------- errors: today's messages


def test_not_bound():
    data = CalibrationData.from_source([_x()])
    assert "not bound to a model's inputs" in one_line_error(lambda: list(data))


@pytest.mark.parametrize("source,specs,message", [
    ([_x(), _x(shape=(1, 2, 4, 4))], ONE, "calibration sample 1: input 'x' has shape 1x2x4x4, model expects 1x3x4x4"),
    ([np.ones((1, 3, 4, 4), np.int32)], ONE, "calibration sample 0: input 'x' has dtype int32; expected float"),
    ([_x(np.nan)], ONE, "calibration sample 0: input 'x' has 48 NaN/Inf value(s)"),
    ([np.ones((1, 4), np.float32)], TWO,
     "calibration sample 0 is an array but the model has several inputs; give dicts keyed by input name"),
    ([{"a": np.ones((1, 4), np.float32)}], TWO,
     "calibration sample 0: sample does not match the model inputs (missing b); expected a, b"),
    ([], ONE, "calibration data is empty"),
    (iter([]), ONE, "calibration data is empty"),
])
def test_bad_samples_give_the_same_one_line_errors(source, specs, message):
    assert one_line_error(lambda: list(CalibrationData.from_source(source).bind(specs))) == message


def test_bad_sources_are_refused_when_built(tmp_path, image_dir):
    assert one_line_error(lambda: CalibrationData.from_source(5)) == \
        "calibration must be a directory or an iterable of samples, got int"
    assert one_line_error(lambda: CalibrationData.from_source(tmp_path / "nope")) == \
        f"{tmp_path / 'nope'}: sample path is not a directory"
    assert "no .npy or .npz sample files, only images" in one_line_error(lambda: CalibrationData.from_source(image_dir))
    assert "give a list of {input name: array} dicts" in one_line_error(lambda: CalibrationData.from_source({"x": _x()}))
    assert "num_samples must be a positive int" in one_line_error(lambda: CalibrationData.from_source([_x()], num_samples=0))
    # images for a two-input model: refused when bound, before any file is read
    assert one_line_error(lambda: CalibrationData.from_source(ImageFolder(image_dir)).bind(TWO)) == \
        f"{image_dir}: images feed a single-input model; this one has inputs a, b"


def test_a_bad_file_is_named(npy_dir):
    (npy_dir / "05.npy").write_bytes(b"garbage")
    msg = one_line_error(lambda: list(CalibrationData.from_source(npy_dir).bind(ONE)))
    assert msg.startswith(f"{npy_dir / '05.npy'}: cannot read calibration sample (")


def test_a_callable_that_gives_no_iterable():
    assert one_line_error(lambda: list(CalibrationData.from_source(lambda: 3).bind(ONE))) == \
        "calibration <lambda>() gave int, not an iterable of samples"


# --------------------------------------------------------------------------- one file at a time


def test_files_are_read_lazily(npy_dir):
    """A corrupt file is not opened before its turn, nor at all when a head or a subset leaves it out."""
    (npy_dir / "03.npy").write_bytes(b"garbage")
    data = CalibrationData.from_source(npy_dir).bind(ONE)
    assert len(data) == 12  # counted from the listing
    it = iter(data)
    assert _values([next(it) for _ in range(3)]) == [0, 1, 2]
    assert "03.npy: cannot read calibration sample" in one_line_error(lambda: next(it))
    assert _values(data.head(3)) == [0, 1, 2]
    assert _values(data.split(3)[1]) == [2, 6, 10]  # held out, 03.npy not among them


def test_iterating_a_directory_keeps_memory_flat(tmp_path):
    """20 samples of 2 MB: iterating them holds about one sample (plus its validated copy), not twenty."""
    size = 2 << 20
    for i in range(20):
        np.save(tmp_path / f"{i:02d}.npy", np.full((1, size // 4), i, np.float32))
    data = CalibrationData.from_source(tmp_path).bind([InputSpec("x", (1, size // 4))])
    tracemalloc.start()
    try:
        n = sum(1 for _ in data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert n == 20 and peak < 3 * size, peak


# --------------------------------------------------------------------------- describe


def test_describe(npy_dir, image_dir):
    data = CalibrationData.from_source(npy_dir)
    assert data.describe() == f"12 samples from {npy_dir}/ (.npy)"
    assert data.head(1).describe() == f"1 of 12 samples from {npy_dir}/ (.npy; first 1)"
    assert len(data.head(1)) == 1 and len(data.bind(ONE).split(5)[0].head(2)) == 2
    assert CalibrationData.from_source(npy_dir, num_samples=4, seed=0).head(2).describe() == \
        f"2 of 12 samples from {npy_dir}/ (.npy; seed 0, first 2)"
    calib, out = data.split(3)
    assert calib.describe() == f"9 of 12 samples from {npy_dir}/ (.npy; calibration part, 3 held out)"
    assert out.describe() == f"3 of 12 samples from {npy_dir}/ (.npy; held-out part)"
    folder = ImageFolder(image_dir, ImagePreprocess.preset("yolo"))
    assert CalibrationData.from_source(folder).describe() == f"6 images from {image_dir}/ (letterbox 640x640, pad 114, /255)"
    assert CalibrationData.from_source([_x()] * 3).describe() == "3 samples (in memory)"
    assert CalibrationData.from_source(_x(i) for i in range(2)).describe() == \
        "2 samples (read once from an iterator, kept in memory)"


def test_the_data_package_is_a_lower_floor():
    """qnnx.data imports nothing of qnnx but itself and qnnx.errors (ast over its modules, local imports too)."""
    import ast
    from pathlib import Path

    import qnnx.data

    for path in Path(qnnx.data.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            for name in names:
                if name == "qnnx" or name.startswith("qnnx."):
                    assert name.startswith("qnnx.data") or name == "qnnx.errors", (path.name, name)
