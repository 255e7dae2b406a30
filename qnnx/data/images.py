"""Calibration from a directory of images: each file becomes the model's single input.

:class:`ImagePreprocess` says how a decoded image becomes an input array, in this order:

    decode     Pillow, to 8-bit RGB (``L`` with ``grayscale``); alpha is dropped; EXIF orientation is
               not applied (as Pillow and torchvision read images)
    resize     to ``size`` (H, W) in 8-bit with ``interpolation`` (Pillow's filters: its bilinear
               antialiases when shrinking, OpenCV's INTER_LINEAR does not, so pixels differ slightly
               from an OpenCV pipeline; calibration statistics hardly do):
               "stretch"    both sides to size, aspect ratio ignored
               "letterbox"  scaled to fit inside, centred, border filled with ``pad_value`` (YOLO)
               "crop"       shorter side to ``size / crop_pct``, then a centred H x W crop (ImageNet eval)
    channels   ``channel_order`` "rgb" or "bgr"
    normalize  ``(x * scale - mean) / std`` per channel, in float64, then cast to ``dtype``; ``mean`` and
               ``std`` are in the output channel order and in scaled units; ``pad_value`` is in pixel
               units (0..255) like the image, so padding is normalized with it
    layout     "nchw" or "nhwc", with a batch dimension of 1

:class:`ImageFolder` lists the image files of a directory (sorted by path, so runs are
deterministic) and is an iterable of arrays; :class:`~qnnx.data.samples.CalibrationData` reads it
file by file, checking each array against the model's input shape with the file's name.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Iterator

import numpy as np

from qnnx.data.specs import InputSpec, dims, fits
from qnnx.errors import QnnxError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
RESIZE_MODES = ("stretch", "letterbox", "crop")
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "box", "lanczos")
CHANNEL_ORDERS = ("rgb", "bgr")
LAYOUTS = ("nchw", "nhwc")
DTYPES = ("float32", "float16")


def _positive_finite(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise QnnxError(f"{name} must be a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise QnnxError(f"{name} must be finite and > 0, got {value}")
    return float(value)


def _choice(name: str, value, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise QnnxError(f"unknown {name} {value!r}; expected one of {', '.join(allowed)}")


@dataclass(frozen=True)
class ImagePreprocess:
    """How an image file becomes a model input (steps in the module docstring). Validated on
    construction; :meth:`preset` gives the usual ones (:data:`PRESETS`)."""

    size: tuple[int, int] | None = None  # (H, W); None keeps each image's own size
    resize: str = "stretch"
    interpolation: str = "bilinear"
    pad_value: float = 0.0  # letterbox border, pixel units
    crop_pct: float = 1.0  # crop: the crop's share of the resized shorter side
    scale: float = 1 / 255
    mean: tuple[float, ...] = (0.0,)  # one value for every channel, or one per channel
    std: tuple[float, ...] = (1.0,)
    channel_order: str = "rgb"
    layout: str = "nchw"
    dtype: str = "float32"
    grayscale: bool = False

    def __post_init__(self):
        if self.size is not None:
            size = tuple(self.size)
            if len(size) != 2 or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0
                                         for d in size):
                raise QnnxError(f"size must be two positive ints (H, W), got {self.size!r}")
            object.__setattr__(self, "size", (int(size[0]), int(size[1])))
        _choice("resize mode", self.resize, RESIZE_MODES)
        _choice("interpolation", self.interpolation, INTERPOLATIONS)
        _choice("channel order", self.channel_order, CHANNEL_ORDERS)
        _choice("layout", self.layout, LAYOUTS)
        _choice("dtype", self.dtype, DTYPES)
        if self.resize != "stretch" and self.size is None:
            raise QnnxError(f"resize mode {self.resize!r} needs a size")
        if not isinstance(self.pad_value, (int, float, np.integer, np.floating)) or not math.isfinite(self.pad_value):
            raise QnnxError(f"pad_value must be a finite number, got {self.pad_value!r}")
        crop_pct = _positive_finite("crop_pct", self.crop_pct)
        if crop_pct > 1:
            raise QnnxError(f"crop_pct must be in (0, 1], got {crop_pct}")
        object.__setattr__(self, "scale", _positive_finite("scale", self.scale))
        channels = 1 if self.grayscale else 3
        for name in ("mean", "std"):
            value = getattr(self, name)
            value = (value,) if isinstance(value, (int, float)) else tuple(value)
            if len(value) not in (1, channels):
                raise QnnxError(f"{name} needs 1 or {channels} values, got {len(value)}")
            if name == "std":
                value = tuple(_positive_finite("std", v) for v in value)
            elif not all(isinstance(v, (int, float, np.integer, np.floating)) and math.isfinite(v) for v in value):
                raise QnnxError(f"mean must be finite numbers, got {value!r}")
            object.__setattr__(self, name, tuple(float(v) for v in value))

    @property
    def channels(self) -> int:
        return 1 if self.grayscale else 3

    def output_shape(self) -> tuple[int | None, ...]:
        """The array shape one image gives (None for H/W without a fixed ``size``)."""
        h, w = self.size if self.size is not None else (None, None)
        return (1, self.channels, h, w) if self.layout == "nchw" else (1, h, w, self.channels)

    @classmethod
    def preset(cls, name: str, **overrides) -> "ImagePreprocess":
        """A preset of :data:`PRESETS`, with fields replaced by ``overrides`` (unknown names raise)."""
        if name not in PRESETS:
            raise QnnxError(f"unknown image preset {name!r}; expected one of {', '.join(PRESETS)}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise QnnxError(f"unknown ImagePreprocess option(s): {', '.join(unknown)}")
        return replace(PRESETS[name], **overrides)

    def __call__(self, image) -> np.ndarray:
        """The input array of a decoded ``PIL.Image``."""
        pixels = _resized(_to_8bit(image, self.grayscale), self)
        if self.channel_order == "bgr":
            pixels = pixels[..., ::-1]
        x = (pixels * self.scale - np.asarray(self.mean)) / np.asarray(self.std)
        x = x.astype(self.dtype)
        x = np.transpose(x, (2, 0, 1)) if self.layout == "nchw" else x
        return np.ascontiguousarray(x[None])


PRESETS: dict[str, ImagePreprocess] = {
    # torchvision / timm ImageNet evaluation: shorter side to 256, centre crop 224, ImageNet mean/std.
    "imagenet": ImagePreprocess(size=(224, 224), resize="crop", crop_pct=0.875, scale=1 / 255,
                                mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
    # Ultralytics YOLO: 640 letterbox with grey (114) border, /255, RGB, NCHW.
    "yolo": ImagePreprocess(size=(640, 640), resize="letterbox", pad_value=114.0, scale=1 / 255),
}


# Modes Pillow would convert to 8 bits by clipping at 255, not by scaling: refused rather than silently wrong.
_WIDE_MODES = ("I", "F", "I;16", "I;16B", "I;16L", "I;16N")


def _to_8bit(image, grayscale: bool):
    if image.mode in _WIDE_MODES:
        raise QnnxError(f"{image.mode} images (16/32-bit) are not supported; save the calibration images as 8-bit")
    return image.convert("L" if grayscale else "RGB")


def _resample(name: str):
    from PIL import Image

    return {"nearest": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR,
            "bicubic": Image.Resampling.BICUBIC, "box": Image.Resampling.BOX,
            "lanczos": Image.Resampling.LANCZOS}[name]


def _resized(image, p: ImagePreprocess) -> np.ndarray:
    """H x W x C float64 pixels (0..255, and ``pad_value`` in a letterbox border)."""
    resample = _resample(p.interpolation)
    w0, h0 = image.size
    if p.size is None:
        out = image
    elif p.resize == "stretch":
        out = image.resize((p.size[1], p.size[0]), resample)
    elif p.resize == "letterbox":
        h, w = p.size
        r = min(h / h0, w / w0)
        nh, nw = max(1, min(h, round(h0 * r))), max(1, min(w, round(w0 * r)))
        inner = np.asarray(image.resize((nw, nh), resample), dtype=np.float64)
        canvas = np.full((h, w, p.channels), float(p.pad_value))
        top, left = (h - nh) // 2, (w - nw) // 2
        canvas[top:top + nh, left:left + nw] = inner.reshape(nh, nw, p.channels)
        return canvas
    else:  # crop
        h, w = p.size
        r = max(h / h0, w / w0) / p.crop_pct
        nh, nw = max(h, round(h0 * r)), max(w, round(w0 * r))
        top, left = (nh - h) // 2, (nw - w) // 2
        out = image.resize((nw, nh), resample).crop((left, top, left + w, top + h))
    a = np.asarray(out, dtype=np.float64)
    return a.reshape(a.shape[0], a.shape[1], p.channels)


class ImageFolder:
    """The image files (.jpg .jpeg .png .bmp .webp, any case) of ``path``, sorted, each preprocessed
    into one input array. Iterating yields the arrays; it can be iterated again (re-reading the files).
    ``recursive`` includes subdirectories (sorted by relative path)."""

    def __init__(self, path, preprocess: ImagePreprocess | None = None, *, recursive: bool = False):
        self.path = Path(path)
        self.preprocess = preprocess if preprocess is not None else ImagePreprocess()
        if not isinstance(self.preprocess, ImagePreprocess):
            raise QnnxError(f"preprocess must be an ImagePreprocess, got {type(preprocess).__name__}")
        self.files = image_files(self.path, recursive=recursive)

    def __len__(self) -> int:
        return len(self.files)

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self.load(f) for f in self.files)

    def __repr__(self) -> str:
        return f"ImageFolder({str(self.path)!r}, {len(self.files)} images, {self.preprocess!r})"

    def load(self, file) -> np.ndarray:
        """The input array of one image file (:class:`QnnxError` naming it if it cannot be decoded)."""
        from PIL import Image

        try:
            with Image.open(file) as image:
                image.load()  # decode now: a truncated file fails here, not later
                return self.preprocess(image)
        except QnnxError as e:
            raise e.at(str(file)) from None
        except Exception as e:  # Pillow raises UnidentifiedImageError, OSError, SyntaxError, ...
            raise QnnxError(f"cannot read image ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})",
                            where=str(file)) from None

    def input_spec(self, specs: list[InputSpec]) -> InputSpec:
        """The one input images feed (:class:`QnnxError` naming the folder for a model with several)."""
        if len(specs) != 1:
            raise QnnxError(f"images feed a single-input model; this one has inputs "
                            f"{', '.join(s.name for s in specs)}", where=str(self.path))
        return specs[0]

    def feed(self, file, spec: InputSpec) -> dict[str, np.ndarray]:
        """``{input name: array}`` of one file, checked against the input's static dims (with a hint at
        the preprocessing step to change when the mismatch says which)."""
        a = self.load(file)
        if not fits(a.shape, spec):
            raise QnnxError(f"image gives input {'x'.join(map(str, a.shape))} but model input {spec.name!r} "
                            f"expects {dims(spec.shape)}{_hint(a.shape, spec.shape, self.preprocess)}",
                            where=str(file))
        return {spec.name: a}


def image_files(directory: Path, *, recursive: bool = False) -> tuple[Path, ...]:
    """The image files of ``directory``, sorted (:class:`QnnxError` if it is not a directory or has none)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise QnnxError("image path is not a directory", where=str(directory))
    found = directory.rglob("*") if recursive else directory.iterdir()
    files = sorted((p for p in found if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()),
                   key=lambda p: p.relative_to(directory).as_posix())
    if not files:
        raise QnnxError(f"no image files ({' '.join(IMAGE_SUFFIXES)}) in the directory", where=str(directory))
    return tuple(files)


def _hint(got: tuple[int, ...], want: tuple, p: ImagePreprocess) -> str:
    """What to change in the preprocessing, when the mismatch says which step."""
    if len(got) != 4 or len(want) != 4:
        return ""

    def fits(shape):
        return all(w is None or w == s for s, w in zip(shape, want))

    n, a, b, c = got
    other = "nhwc" if p.layout == "nchw" else "nchw"
    if fits((n, b, c, a) if p.layout == "nchw" else (n, c, a, b)):
        return f" (layout {other}?)"
    c_axis, hw = (1, (2, 3)) if p.layout == "nchw" else (3, (1, 2))
    if want[c_axis] is not None and want[c_axis] != got[c_axis]:
        return " (grayscale?)" if want[c_axis] == 1 else ""
    h, w = (want[i] for i in hw)
    if h is not None and w is not None:
        return f" (resize to {h}x{w}?)"
    return ""


def describe(p: ImagePreprocess) -> str:
    """One line for logs and reports: the steps that do something ("letterbox 640x640, pad 114, /255")."""
    parts = [f"{p.resize} {p.size[0]}x{p.size[1]}" if p.size else "no resize"]
    if p.resize == "letterbox":
        parts.append(f"pad {p.pad_value:g}")
    if p.resize == "crop" and p.crop_pct != 1:
        parts.append(f"crop_pct {p.crop_pct:g}")
    inverse = 1 / p.scale
    if p.scale != 1:
        parts.append(f"/{round(inverse)}" if abs(inverse - round(inverse)) < 1e-9 * inverse else f"x{p.scale:.6g}")
    if any(p.mean):
        parts.append(f"mean {','.join(f'{m:g}' for m in p.mean)}")
    if any(s != 1 for s in p.std):
        parts.append(f"std {','.join(f'{s:g}' for s in p.std)}")
    parts += [x for x in (p.channel_order != "rgb" and p.channel_order, p.layout != "nchw" and p.layout,
                          p.dtype != "float32" and p.dtype, p.grayscale and "grayscale") if x]
    return ", ".join(parts)


def _parse_floats(option: str, text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise QnnxError(f"bad {option} {text!r}: expected comma-separated numbers, e.g. 0.485,0.456,0.406") from None
    return values


def _parse_scale(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*(?:/\s*([0-9.eE+-]+)\s*)?", text)
    try:
        if m is None:
            raise ValueError
        return float(m.group(1)) / (float(m.group(2)) if m.group(2) else 1.0)
    except (ValueError, ZeroDivisionError):
        raise QnnxError(f"bad --scale {text!r}: expected a number or a fraction, e.g. 0.0039 or 1/255") from None


def _parse_size(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*(?:[xX]\s*(\d+)\s*)?", text)
    if m is None or int(m.group(1)) == 0 or (m.group(2) is not None and int(m.group(2)) == 0):
        raise QnnxError(f"bad --resize {text!r}: expected HxW with positive sizes, e.g. 224x224 (or 224 for a square)")
    h = int(m.group(1))
    return h, int(m.group(2)) if m.group(2) is not None else h


def preprocess_from_options(preset: str | None = None, resize: str | None = None, mean: str | None = None,
                            std: str | None = None, scale: str | None = None, channel_order: str | None = None,
                            layout: str | None = None, letterbox: bool = False,
                            grayscale: bool = False) -> ImagePreprocess | None:
    """The preprocessing the command line's options describe (strings as typed: ``resize`` "HxW" or
    "N", ``mean``/``std`` "a,b,c", ``scale`` "0.5" or "1/255"), starting from ``preset`` if given;
    None when no option is given (the calibration directory then holds .npy/.npz samples)."""
    given = {}
    if resize is not None:
        given["size"] = _parse_size(resize)
    if mean is not None:
        given["mean"] = _parse_floats("--mean", mean)
    if std is not None:
        given["std"] = _parse_floats("--std", std)
    if scale is not None:
        given["scale"] = _parse_scale(scale)
    if channel_order is not None:
        given["channel_order"] = channel_order
    if layout is not None:
        given["layout"] = layout
    if letterbox:
        given["resize"] = "letterbox"
    if grayscale:
        given["grayscale"] = True
    if preset is not None:
        return ImagePreprocess.preset(preset, **given)
    return ImagePreprocess(**given) if given else None


def is_image_directory(path) -> bool:
    """``path`` is a directory holding at least one image file (and so may want an ImageFolder)."""
    p = Path(path)
    return p.is_dir() and any(f.suffix.lower() in IMAGE_SUFFIXES for f in p.iterdir())


__all__ = ["IMAGE_SUFFIXES", "PRESETS", "ImageFolder", "ImagePreprocess", "describe", "image_files",
           "is_image_directory", "preprocess_from_options"]
