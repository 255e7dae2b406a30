"""Calibration samples: a directory of .npy/.npz files, an :class:`~qnnx.autoquant.images.ImageFolder`,
or any iterable of arrays / feed dicts, validated against the model's inputs one sample at a time
(nothing is held in memory)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx_ir as ir

from qnnx.autoquant.images import ImageFolder, is_image_directory
from qnnx.errors import QnnxError


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple  # ints for static dims, None for dynamic ones
    dtype: ir.DataType | None = ir.DataType.FLOAT  # None: not declared (treated as float32)


def input_specs(model: ir.Model) -> list[InputSpec]:
    specs = []
    for v in model.graph.inputs:
        if v.name in model.graph.initializers:
            continue
        # symbolic dims and the -1/0 some exporters write for "dynamic" are not checked
        shape = tuple(d if isinstance(d, int) and d > 0 else None for d in v.shape) if v.shape is not None else None
        specs.append(InputSpec(v.name, shape, v.dtype))
    return specs


def _files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise QnnxError("calibration path is not a directory", where=str(directory))
    files = sorted(p for p in directory.iterdir() if p.suffix in (".npy", ".npz"))
    if not files:
        if is_image_directory(directory):
            raise QnnxError("no .npy or .npz calibration files, only images: give an ImageFolder with an "
                            "ImagePreprocess (command line: --preprocess or --resize)", where=str(directory))
        raise QnnxError("no .npy or .npz calibration files", where=str(directory))
    return files


def _subset(files: list, limit: int | None, seed: int | None) -> list:
    """A seeded random subset of ``limit`` files (kept in name order), or all of them."""
    if limit is not None and seed is not None and limit < len(files):
        pick = np.random.default_rng(seed).choice(len(files), size=limit, replace=False)
        return [files[i] for i in sorted(pick)]
    return list(files)


def _load_file(path: Path, specs: list[InputSpec]) -> dict[str, np.ndarray]:
    try:
        if path.suffix == ".npy":
            if len(specs) != 1:
                raise QnnxError(f".npy samples need a single-input model; this one has inputs "
                                f"{', '.join(s.name for s in specs)}: use .npz keyed by input name", where=str(path))
            return {specs[0].name: np.load(path, allow_pickle=False)}
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except QnnxError:
        raise
    except Exception as e:  # numpy raises ValueError/OSError/zipfile errors for bad files
        raise QnnxError(f"cannot read calibration sample ({type(e).__name__}: {e})", where=str(path)) from None


def _validate(feed: dict[str, np.ndarray], specs: list[InputSpec], where: str) -> dict[str, np.ndarray]:
    names = {s.name for s in specs}
    missing, extra = sorted(names - set(feed)), sorted(set(feed) - names)
    if missing or extra:
        detail = "; ".join(x for x in (f"missing {', '.join(missing)}" if missing else "",
                                       f"unknown {', '.join(extra)}" if extra else "") if x)
        raise QnnxError(f"sample does not match the model inputs ({detail}); expected {', '.join(sorted(names))}",
                        where=where)
    out = {}
    for s in specs:
        a = np.asarray(feed[s.name])
        want = _numpy_dtype(s)
        if want.kind == "f" and a.dtype.kind != "f":
            raise QnnxError(f"input {s.name!r} has dtype {a.dtype}; expected float", where=where)
        if want.kind in "iu" and a.dtype.kind not in "iu":  # token ids, indices: never silently truncated floats
            raise QnnxError(f"input {s.name!r} has dtype {a.dtype}; expected integer ({want})", where=where)
        if want.kind == "b" and a.dtype.kind != "b":
            raise QnnxError(f"input {s.name!r} has dtype {a.dtype}; expected bool", where=where)
        if s.shape is not None:
            if a.ndim != len(s.shape) or any(d is not None and d != n for d, n in zip(s.shape, a.shape)):
                want = "x".join("?" if d is None else str(d) for d in s.shape)
                raise QnnxError(f"input {s.name!r} has shape {'x'.join(map(str, a.shape))}, model expects {want}",
                                where=where)
        if a.size == 0:
            raise QnnxError(f"input {s.name!r} is empty", where=where)
        if want.kind == "f":
            bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
            if bad:
                raise QnnxError(f"input {s.name!r} has {bad} NaN/Inf value(s)", where=where)
        elif want.kind in "iu":
            info = np.iinfo(want)
            if a.min() < info.min or a.max() > info.max:
                raise QnnxError(f"input {s.name!r} has values outside {want}", where=where)
        out[s.name] = a.astype(want, copy=False)
    return out


def _numpy_dtype(spec: InputSpec) -> np.dtype:
    """The dtype the model declares for an input (float32 when undeclared)."""
    if spec.dtype is None:
        return np.dtype(np.float32)
    try:
        return np.dtype(spec.dtype.numpy())
    except Exception:  # a type numpy has no native dtype for (bfloat16, float8...) is fed as float32
        return np.dtype(np.float32)


def iter_samples(calibration, specs: list[InputSpec], limit: int | None = None,
                 seed: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Validated feed dicts, one at a time. From a directory or an ImageFolder with ``limit`` below the
    number of files, ``seed`` picks which files (a seeded random subset); otherwise files go in name order."""
    if isinstance(calibration, (str, os.PathLike)):
        files = _subset(_files(Path(calibration)), limit, seed)
        items: Iterator = ((str(p), _load_file(p, specs)) for p in files)
    elif isinstance(calibration, ImageFolder):
        items = calibration.named_samples(specs, _subset(calibration.files, limit, seed))
    else:
        try:
            source = iter(calibration)
        except TypeError:
            raise QnnxError(f"calibration must be a directory or an iterable of samples, "
                            f"got {type(calibration).__name__}") from None

        def numbered():
            for i, s in enumerate(source):
                if isinstance(s, dict):
                    yield f"calibration sample {i}", s
                elif len(specs) == 1:
                    yield f"calibration sample {i}", {specs[0].name: s}
                else:
                    raise QnnxError(f"calibration sample {i} is an array but the model has several inputs; "
                                    "give dicts keyed by input name")

        items = iter(numbered())
    n = 0
    while limit is None or n < limit:  # check the limit before pulling (and loading) the next sample
        item = next(items, None)
        if item is None:
            break
        where, feed = item
        yield _validate(feed, specs, where)
        n += 1
    if n == 0:
        raise QnnxError("calibration data is empty")
