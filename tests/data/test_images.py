"""Image-directory calibration (qnnx.data.images): every preprocessing step on tiny generated
images with exact expected values (nearest resampling and scales that are exact in binary, so
"equal" means bit-identical float32), and one clear error line per problem."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from data_models import add, conv_sigmoid
from PIL import Image

import qnnx
from qnnx import QuantConfig
from qnnx.data import input_specs, iter_samples
from qnnx.data.images import PRESETS, ImageFolder, ImagePreprocess, describe
from conftest import one_line_error

RNG = np.random.default_rng(5)

# 2 rows x 3 columns, RGB; every value distinct so any misplaced pixel shows.
PIXELS = np.array([[[10, 20, 30], [40, 50, 60], [70, 80, 90]],
                   [[100, 110, 120], [130, 140, 150], [160, 170, 180]]], np.uint8)
RAW = dict(scale=1.0, interpolation="nearest")  # pixel values unchanged


def _png(path, pixels=PIXELS, mode=None):
    Image.fromarray(np.asarray(pixels, np.uint8), mode).save(path)
    return path


def _load(tmp_path, pixels=PIXELS, **options) -> np.ndarray:
    _png(tmp_path / "img.png", pixels)
    return ImageFolder(tmp_path, ImagePreprocess(**options)).load(tmp_path / "img.png")


def _chw(hwc) -> np.ndarray:
    return np.asarray(hwc, np.float32).transpose(2, 0, 1)[None]


def _model(dims=(1, 3, 4, 4)):
    return conv_sigmoid(RNG, dims)


def _specs(model):
    return input_specs(ir.from_proto(model))


# --------------------------------------------------------------------------- preprocessing steps


def test_no_resize_keeps_pixels_in_nchw_float32(tmp_path):
    x = _load(tmp_path, **RAW)
    assert x.dtype == np.float32 and x.shape == (1, 3, 2, 3)
    np.testing.assert_array_equal(x, _chw(PIXELS))


def test_default_scale_is_one_over_255(tmp_path):
    x = _load(tmp_path, pixels=np.full((1, 2, 3), [0, 51, 255], np.uint8))
    np.testing.assert_array_equal(x[0, :, 0, 0], np.float32([0.0, 51 / 255, 1.0]))


def test_stretch_with_nearest_repeats_pixels(tmp_path):
    x = _load(tmp_path, size=(4, 6), **RAW)
    np.testing.assert_array_equal(x, _chw(PIXELS.repeat(2, axis=0).repeat(2, axis=1)))


def test_stretch_ignores_aspect_ratio(tmp_path):
    x = _load(tmp_path, size=(2, 6), **RAW)  # only the width doubles
    np.testing.assert_array_equal(x, _chw(PIXELS.repeat(2, axis=1)))


def test_bilinear_of_a_uniform_image_is_exact(tmp_path):
    x = _load(tmp_path, pixels=np.full((3, 5, 3), [7, 77, 177], np.uint8), size=(8, 8), scale=1.0)
    np.testing.assert_array_equal(x, np.broadcast_to(np.float32([7, 77, 177])[None, :, None, None], (1, 3, 8, 8)))


def test_letterbox_pads_top_and_bottom_centred(tmp_path):
    # 2x3 into 6x3: scale 1, two rows of padding above and below
    x = _load(tmp_path, size=(6, 3), resize="letterbox", pad_value=114, **RAW)
    want = np.full((6, 3, 3), 114, np.float32)
    want[2:4] = PIXELS
    np.testing.assert_array_equal(x, _chw(want))


def test_letterbox_scales_to_fit_then_pads_left_and_right(tmp_path):
    # 2x3 into 4x8: r = min(4/2, 8/3) = 2 -> 4x6 image, one column of padding each side
    x = _load(tmp_path, size=(4, 8), resize="letterbox", pad_value=0.5, **RAW)
    want = np.full((4, 8, 3), 0.5, np.float32)
    want[:, 1:7] = PIXELS.repeat(2, axis=0).repeat(2, axis=1)
    np.testing.assert_array_equal(x, _chw(want))


def test_letterbox_padding_is_normalized_like_pixels(tmp_path):
    x = _load(tmp_path, size=(4, 3), resize="letterbox", pad_value=114, scale=0.5, mean=(7.0,), std=(2.0,),
              interpolation="nearest")
    assert x[0, 0, 0, 0] == np.float32((114 * 0.5 - 7) / 2)  # padding row: 25.0
    assert x[0, 0, 1, 0] == np.float32((10 * 0.5 - 7) / 2)  # first image pixel: -1.0


def test_crop_takes_the_centre(tmp_path):
    # 2x3 to 2x2: the shorter side is already 2; the crop starts at column (3 - 2) // 2 = 0
    x = _load(tmp_path, size=(2, 2), resize="crop", **RAW)
    np.testing.assert_array_equal(x, _chw(PIXELS[:, 0:2]))
    wide = np.arange(2 * 6 * 3, dtype=np.uint8).reshape(2, 6, 3)
    x = _load(tmp_path, pixels=wide, size=(2, 2), resize="crop", **RAW)
    np.testing.assert_array_equal(x, _chw(wide[:, 2:4]))


def test_crop_pct_resizes_the_shorter_side_larger_first(tmp_path):
    # crop_pct 0.5: shorter side 2 -> 4 (image 4x6 by nearest), then the centre 2x2: rows 1..2, columns 2..3
    x = _load(tmp_path, size=(2, 2), resize="crop", crop_pct=0.5, **RAW)
    up = PIXELS.repeat(2, axis=0).repeat(2, axis=1)
    np.testing.assert_array_equal(x, _chw(up[1:3, 2:4]))


def test_scale_mean_std_per_channel(tmp_path):
    x = _load(tmp_path, scale=0.5, mean=(1.0, 2.0, 3.0), std=(0.5, 2.0, 4.0), interpolation="nearest")
    # pixel (0, 0) = (10, 20, 30): (5 - 1) / 0.5, (10 - 2) / 2, (15 - 3) / 4
    np.testing.assert_array_equal(x[0, :, 0, 0], np.float32([8.0, 4.0, 3.0]))
    want = (PIXELS.astype(np.float64) * 0.5 - [1.0, 2.0, 3.0]) / [0.5, 2.0, 4.0]
    np.testing.assert_array_equal(x, _chw(want.astype(np.float32)))


def test_bgr_reverses_channels_and_mean_is_in_output_order(tmp_path):
    x = _load(tmp_path, channel_order="bgr", mean=(1.0, 2.0, 3.0), **RAW)
    np.testing.assert_array_equal(x[0, :, 0, 0], np.float32([30 - 1, 20 - 2, 10 - 3]))
    np.testing.assert_array_equal(x, _chw(PIXELS[..., ::-1].astype(np.float32) - [1, 2, 3]))


def test_nhwc_layout(tmp_path):
    x = _load(tmp_path, layout="nhwc", **RAW)
    assert x.shape == (1, 2, 3, 3) and x.flags.c_contiguous
    np.testing.assert_array_equal(x[0], PIXELS.astype(np.float32))


def test_grayscale_uses_pillows_luma_and_gives_one_channel(tmp_path):
    pixels = np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255], [90, 90, 90]]], np.uint8)
    x = _load(tmp_path, pixels=pixels, grayscale=True, **RAW)
    # ITU-R 601-2 luma in Pillow's integer arithmetic: 76, 150, 29; a grey pixel keeps its value
    assert x.shape == (1, 1, 1, 4)
    np.testing.assert_array_equal(x[0, 0, 0], np.float32([76, 150, 29, 90]))
    assert _load(tmp_path, pixels=pixels, grayscale=True, layout="nhwc", **RAW).shape == (1, 1, 4, 1)


def test_alpha_is_dropped_and_palette_and_grey_files_become_rgb(tmp_path):
    rgba = np.array([[[10, 20, 30, 0], [40, 50, 60, 255]]], np.uint8)
    _png(tmp_path / "a.png", rgba, "RGBA")
    Image.fromarray(np.array([[5, 250]], np.uint8), "L").save(tmp_path / "b.png")
    Image.fromarray(PIXELS).convert("P", palette=Image.Palette.ADAPTIVE, colors=8).save(tmp_path / "c.png")
    folder = ImageFolder(tmp_path, ImagePreprocess(**RAW))
    a, b, c = list(folder)
    np.testing.assert_array_equal(a, _chw(rgba[..., :3]))
    np.testing.assert_array_equal(b, _chw([[[5, 5, 5], [250, 250, 250]]]))
    np.testing.assert_array_equal(c, _chw(PIXELS))  # 6 colours fit an 8-colour palette exactly


def test_float16_dtype(tmp_path):
    x = _load(tmp_path, dtype="float16")
    assert x.dtype == np.float16
    np.testing.assert_array_equal(x, (_chw(PIXELS).astype(np.float64) / 255).astype(np.float16))


def test_every_format_is_read_in_sorted_order(tmp_path):
    _png(tmp_path / "b.png")
    Image.fromarray(PIXELS).save(tmp_path / "a.BMP")
    Image.fromarray(PIXELS).save(tmp_path / "c.webp", lossless=True)
    Image.fromarray(PIXELS).save(tmp_path / "d.jpeg", quality=100)
    Image.fromarray(PIXELS).save(tmp_path / "e.jpg", quality=100)
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "sub").mkdir()
    _png(tmp_path / "sub" / "f.png")
    folder = ImageFolder(tmp_path, ImagePreprocess(**RAW))
    assert [f.name for f in folder.files] == ["a.BMP", "b.png", "c.webp", "d.jpeg", "e.jpg"]
    got = list(folder)
    for x in got[:3]:  # lossless formats: exact
        np.testing.assert_array_equal(x, _chw(PIXELS))
    for x in got[3:]:  # JPEG: lossy, chroma subsampled; close but not exact
        assert x.shape == (1, 3, 2, 3) and np.max(np.abs(x - _chw(PIXELS))) < 40
    assert [f.name for f in ImageFolder(tmp_path, recursive=True).files][-1] == "f.png"
    assert len(list(folder)) == 5  # iterable again


def test_presets():
    imagenet = ImagePreprocess.preset("imagenet")
    assert imagenet.size == (224, 224) and imagenet.resize == "crop" and imagenet.crop_pct == 0.875
    assert imagenet.mean == (0.485, 0.456, 0.406) and imagenet.std == (0.229, 0.224, 0.225)
    assert imagenet.output_shape() == (1, 3, 224, 224)
    yolo = ImagePreprocess.preset("yolo", layout="nhwc")
    assert (yolo.size, yolo.resize, yolo.pad_value, yolo.layout) == ((640, 640), "letterbox", 114.0, "nhwc")
    assert set(PRESETS) == {"imagenet", "yolo"}
    assert describe(yolo) == "letterbox 640x640, pad 114, /255, nhwc"
    assert describe(PRESETS["imagenet"]) == \
        "crop 224x224, crop_pct 0.875, /255, mean 0.485,0.456,0.406, std 0.229,0.224,0.225"
    assert describe(ImagePreprocess(scale=0.3, channel_order="bgr", layout="nhwc", grayscale=True, mean=3)) == \
        "no resize, x0.3, mean 3, bgr, nhwc, grayscale"  # only the steps that do something


def test_imagenet_preset_on_an_image(tmp_path):
    # 300x400 (H x W) -> shorter side 256 -> 256x341 -> centre 224x224; uniform colour survives exactly
    _png(tmp_path / "u.png", np.full((300, 400, 3), [124, 116, 104], np.uint8))
    x = ImageFolder(tmp_path, ImagePreprocess.preset("imagenet")).load(tmp_path / "u.png")
    want = ((np.array([124, 116, 104]) / 255 - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]).astype(np.float32)
    assert x.shape == (1, 3, 224, 224)
    np.testing.assert_array_equal(x[0, :, 100, 100], want)


# --------------------------------------------------------------------------- calibration


def test_quantize_from_an_image_folder(tmp_path):
    for i in range(4):
        _png(tmp_path / f"{i}.png", RNG.integers(0, 256, (5, 7, 3)))
    folder = ImageFolder(tmp_path, ImagePreprocess(size=(4, 4)))
    qm = qnnx.quantize(_model(), folder, QuantConfig(progress=False))
    assert qm.report.num_samples == 4
    assert [d.node for d in qm.report.decisions if d.quantized] == ["conv", "sig"]
    qm = qnnx.quantize(_model(), folder, QuantConfig(progress=False, calibrator="propagate_error"))  # read twice
    assert qm.report.num_samples == 4


def test_iter_samples_picks_a_seeded_subset_and_names_the_input(tmp_path):
    for i in range(6):
        _png(tmp_path / f"{i}.png", np.full((4, 4, 3), i * 10, np.uint8))
    folder = ImageFolder(tmp_path, ImagePreprocess(scale=1.0))
    specs = _specs(_model())
    got = [f["x"][0, 0, 0, 0] for f in iter_samples(folder, specs, limit=3, seed=0)]
    again = [f["x"][0, 0, 0, 0] for f in iter_samples(folder, specs, limit=3, seed=0)]
    assert got == again and len(got) == 3 and got == sorted(got)
    assert [f["x"][0, 0, 0, 0] for f in iter_samples(folder, specs, limit=2, seed=None)] == [0, 10]


def test_dynamic_model_accepts_each_images_own_size(tmp_path):
    _png(tmp_path / "a.png", np.zeros((3, 5, 3)))
    _png(tmp_path / "b.png", np.zeros((6, 2, 3)))
    got = list(iter_samples(ImageFolder(tmp_path), _specs(_model(("N", 3, "H", "W")))))
    assert [f["x"].shape for f in got] == [(1, 3, 3, 5), (1, 3, 6, 2)]


# --------------------------------------------------------------------------- errors


def test_directory_without_images(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "x.npy").write_bytes(b"")
    msg = one_line_error(lambda: ImageFolder(tmp_path))
    assert "no image files (.jpg .jpeg .png .bmp .webp)" in msg and str(tmp_path) in msg


def test_missing_directory(tmp_path):
    msg = one_line_error(lambda: ImageFolder(tmp_path / "nope"))
    assert "image path is not a directory" in msg and "nope" in msg


@pytest.mark.parametrize("content,kind", [(b"not an image at all", "UnidentifiedImageError"), ("truncated", "")])
def test_unreadable_image_names_the_file(tmp_path, content, kind):
    _png(tmp_path / "a.png")
    bad = tmp_path / "b.png"
    if content == "truncated":  # a valid header, then the pixel data stops
        _png(bad, RNG.integers(0, 256, (64, 64, 3)))
        bad.write_bytes(bad.read_bytes()[:200])
    else:
        bad.write_bytes(content)
    folder = ImageFolder(tmp_path)
    msg = one_line_error(lambda: list(folder))
    assert msg.startswith(f"{bad}: cannot read image (") and kind in msg
    msg = one_line_error(lambda: qnnx.quantize(_model((1, 3, 2, 3)), folder, QuantConfig(progress=False)))
    assert "b.png: cannot read image" in msg


def test_16_bit_images_are_refused_not_clipped(tmp_path):
    Image.fromarray(np.array([[0, 1000]], np.uint16)).save(tmp_path / "deep.png")
    msg = one_line_error(lambda: list(ImageFolder(tmp_path)))
    assert msg == (f"{tmp_path / 'deep.png'}: I;16 images (16/32-bit) are not supported; save the calibration "
                   "images as 8-bit")


def test_shape_mismatch_names_the_file_and_says_what_to_change(tmp_path):
    _png(tmp_path / "a.png")
    specs = _specs(_model())
    msg = one_line_error(lambda: list(iter_samples(ImageFolder(tmp_path, ImagePreprocess(size=(8, 8))), specs)))
    assert msg == (f"{tmp_path / 'a.png'}: image gives input 1x3x8x8 but model input 'x' expects 1x3x4x4 "
                   "(resize to 4x4?)")
    msg = one_line_error(lambda: list(iter_samples(ImageFolder(tmp_path, ImagePreprocess(size=(4, 4), layout="nhwc")),
                                           specs)))
    assert "image gives input 1x4x4x3 but model input 'x' expects 1x3x4x4 (layout nchw?)" in msg
    msg = one_line_error(lambda: list(iter_samples(ImageFolder(tmp_path, ImagePreprocess(size=(4, 4))),
                                           _specs(_model((1, 1, 4, 4))))))
    assert "image gives input 1x3x4x4 but model input 'x' expects 1x1x4x4 (grayscale?)" in msg


def test_two_input_model_is_refused(tmp_path):
    _png(tmp_path / "a.png")
    msg = one_line_error(lambda: list(iter_samples(ImageFolder(tmp_path), _specs(add((1, 3, 2, 3))))))
    assert "images feed a single-input model; this one has inputs a, b" in msg and str(tmp_path) in msg


def test_npy_directory_holding_only_images_points_to_image_folder(tmp_path):
    _png(tmp_path / "a.png")
    msg = one_line_error(lambda: list(iter_samples(tmp_path, _specs(_model()))))
    assert "no .npy or .npz sample files, only images: give an ImageFolder" in msg and str(tmp_path) in msg


@pytest.mark.parametrize("options,expected", [
    (dict(size=(0, 4)), "size must be two positive ints (H, W), got (0, 4)"),
    (dict(size=(4,)), "size must be two positive ints"),
    (dict(size=(4.0, 4)), "size must be two positive ints"),
    (dict(resize="fit", size=(4, 4)), "unknown resize mode 'fit'; expected one of stretch, letterbox, crop"),
    (dict(resize="letterbox"), "resize mode 'letterbox' needs a size"),
    (dict(interpolation="cubic"), "unknown interpolation 'cubic'"),
    (dict(channel_order="rbg"), "unknown channel order 'rbg'; expected one of rgb, bgr"),
    (dict(layout="chw"), "unknown layout 'chw'; expected one of nchw, nhwc"),
    (dict(dtype="int8"), "unknown dtype 'int8'; expected one of float32, float16"),
    (dict(scale=0), "scale must be finite and > 0, got 0"),
    (dict(scale=float("nan")), "scale must be finite and > 0"),
    (dict(std=(1.0, 0.0, 1.0)), "std must be finite and > 0, got 0.0"),
    (dict(mean=(0.5, 0.5)), "mean needs 1 or 3 values, got 2"),
    (dict(mean=(0.5, 0.5, 0.5), grayscale=True), "mean needs 1 or 1 values, got 3"),
    (dict(mean=(float("inf"),)), "mean must be finite numbers"),
    (dict(crop_pct=1.5), "crop_pct must be in (0, 1], got 1.5"),
    (dict(pad_value=float("nan")), "pad_value must be a finite number"),
])
def test_bad_options(options, expected):
    assert expected in one_line_error(lambda: ImagePreprocess(**options))


def test_bad_preset_and_override():
    assert one_line_error(lambda: ImagePreprocess.preset("resnet")) == \
        "unknown image preset 'resnet'; expected one of imagenet, yolo"
    assert one_line_error(lambda: ImagePreprocess.preset("yolo", sise=(1, 1))) == "unknown ImagePreprocess option(s): sise"
    assert "size must be two positive ints" in one_line_error(lambda: ImagePreprocess.preset("yolo", size=(0, 1)))
