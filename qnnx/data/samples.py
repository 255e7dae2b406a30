"""Calibration samples as one type, :class:`CalibrationData`, built from whatever the user has: a
directory of .npy/.npz files, an :class:`~qnnx.data.images.ImageFolder`, a list of arrays or feed
dicts, a callable giving a fresh iterable, or a one-shot iterator.

Every consumer (calibration, the summary after quantize, ``compare``, the report, ``bench``) reads
the same object, so they all see the same samples in the same order. It is re-iterable: a directory
or image folder is read again file by file on each pass (one file in memory at a time), a callable
is called again, a one-shot iterator is read once and kept. Bound to a model's inputs
(:meth:`CalibrationData.bind`), iteration yields feed dicts validated one sample at a time
(:func:`qnnx.data.specs.validate_feed`).
"""

from __future__ import annotations

import collections.abc
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import onnx_ir as ir

from qnnx.data.images import ImageFolder, describe as describe_preprocess, is_image_directory
from qnnx.data.specs import InputSpec, input_specs, validate_feed
from qnnx.errors import QnnxError

Loader = Callable[[list[InputSpec]], dict[str, np.ndarray]]  # one sample's feed dict, read when called


def _files(directory: Path) -> tuple[Path, ...]:
    if not directory.is_dir():
        raise QnnxError("sample path is not a directory", where=str(directory))
    files = sorted(p for p in directory.iterdir() if p.suffix in (".npy", ".npz"))
    if not files:
        if is_image_directory(directory):
            raise QnnxError("no .npy or .npz sample files, only images: give an ImageFolder with an "
                            "ImagePreprocess (command line: --preprocess or --resize)", where=str(directory))
        raise QnnxError("no .npy or .npz sample files", where=str(directory))
    return tuple(files)


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


def _as_feed(sample, i: int, specs: list[InputSpec]) -> dict[str, np.ndarray]:
    """An in-memory sample as a feed dict: a dict as is, an array as the single input."""
    if isinstance(sample, dict):
        return sample
    if len(specs) == 1:
        return {specs[0].name: sample}
    raise QnnxError(f"calibration sample {i} is an array but the model has several inputs; "
                    "give dicts keyed by input name")


def _numbered(samples) -> Iterator[tuple[str, Loader]]:
    for i, s in enumerate(samples):
        yield f"calibration sample {i}", lambda specs, s=s, i=i: _as_feed(s, i, specs)


# --------------------------------------------------------------------------- sources
# A source lists its samples in a fixed order as (where, loader) entries; nothing is read until a
# loader is called. ``files`` is set for file-backed sources: a seeded subset picks among them.
# ``origin`` is what it was built from; count(limit) counts at most ``limit``; check(specs) refuses what
# can be refused before reading a sample; known_count() is the count when it costs nothing.


class _Source:
    files: tuple[Path, ...] | None = None
    origin: Any = None

    def entries(self) -> Iterator[tuple[str, Loader]]:
        raise NotImplementedError

    def count(self, limit: int | None = None) -> int:
        raise NotImplementedError

    def check(self, specs: list[InputSpec]) -> None:
        """Nothing to refuse before reading (a .npy file for a multi-input model is refused when read,
        naming it)."""

    def known_count(self) -> int | None:
        return None

    def describe(self) -> tuple[str, str, str]:
        """(noun, "from ...", details) for :meth:`CalibrationData.describe`."""
        raise NotImplementedError


class _Directory(_Source):
    def __init__(self, path: Path):
        self.path = self.origin = path
        self.files = _files(path)

    def entries(self) -> Iterator[tuple[str, Loader]]:
        return ((str(p), lambda specs, p=p: _load_file(p, specs)) for p in self.files)

    def count(self, limit: int | None = None) -> int:
        return len(self.files) if limit is None else min(len(self.files), limit)

    def describe(self) -> tuple[str, str, str]:
        kinds = ", ".join(sorted({p.suffix for p in self.files}))
        return "samples", f"from {_dir_name(self.path)}", kinds

    def known_count(self) -> int | None:
        return len(self.files)


class _Images(_Source):
    def __init__(self, folder: ImageFolder):
        self.folder = self.origin = folder
        self.files = folder.files

    def entries(self) -> Iterator[tuple[str, Loader]]:
        folder = self.folder
        return ((str(f), lambda specs, f=f: folder.feed(f, folder.input_spec(specs))) for f in self.files)

    def count(self, limit: int | None = None) -> int:
        return len(self.files) if limit is None else min(len(self.files), limit)

    def check(self, specs: list[InputSpec]) -> None:
        self.folder.input_spec(specs)

    def describe(self) -> tuple[str, str, str]:
        return "images", f"from {_dir_name(self.folder.path)}", describe_preprocess(self.folder.preprocess)

    def known_count(self) -> int | None:
        return len(self.files)


class _Memory(_Source):
    def __init__(self, samples: list):
        self.samples = self.origin = samples

    def entries(self) -> Iterator[tuple[str, Loader]]:
        return _numbered(self.samples)

    def count(self, limit: int | None = None) -> int:
        return len(self.samples) if limit is None else min(len(self.samples), limit)

    def describe(self) -> tuple[str, str, str]:
        return "samples", "", "in memory"

    def known_count(self) -> int | None:
        return len(self.samples)


class _Reiterable(_Source):
    """A callable giving a fresh iterable on each call (called once per pass), or a re-iterable object."""

    def __init__(self, make: Callable[[], Any], what: str, origin=None):
        self.make, self.what, self._count = make, what, None
        self.origin = make if origin is None else origin

    def entries(self) -> Iterator[tuple[str, Loader]]:
        made = self.make()
        try:
            samples = iter(made)
        except TypeError:
            raise QnnxError(f"calibration {self.what} gave {type(made).__name__}, not an iterable of samples") from None
        return _numbered(samples)

    def count(self, limit: int | None = None) -> int:
        """A pass over the samples (none is validated), remembered once complete."""
        if self._count is not None:
            return self._count if limit is None else min(self._count, limit)
        n = 0
        for _ in self.entries():
            if limit is not None and n == limit:
                return n
            n += 1
        self._count = n
        return n

    def describe(self) -> tuple[str, str, str]:
        return "samples", f"from {self.what}", ""

    def known_count(self) -> int | None:
        return self._count


class _Kept(_Source):
    """A one-shot iterator, read as far as some pass needed and kept, so every pass sees the same samples."""

    def __init__(self, iterator: Iterator):
        self.iterator, self.kept, self.done = iterator, [], False
        self.origin = self.kept

    def _pull(self) -> bool:
        if self.done:
            return False
        try:
            self.kept.append(next(self.iterator))
            return True
        except StopIteration:
            self.done, self.iterator = True, None
            return False

    def entries(self) -> Iterator[tuple[str, Loader]]:
        i = 0
        while i < len(self.kept) or self._pull():
            yield f"calibration sample {i}", lambda specs, s=self.kept[i], i=i: _as_feed(s, i, specs)
            i += 1

    def count(self, limit: int | None = None) -> int:
        while (limit is None or len(self.kept) < limit) and self._pull():
            pass
        return len(self.kept) if limit is None else min(len(self.kept), limit)

    def describe(self) -> tuple[str, str, str]:
        return "samples", "", "read once from an iterator, kept in memory"

    def known_count(self) -> int | None:
        return len(self.kept) if self.done else None


def _dir_name(path: Path) -> str:
    text = str(path)
    return text if text.endswith(os.sep) else text + os.sep


def _source_of(source):
    if isinstance(source, (str, os.PathLike)):
        return _Directory(Path(source))
    if isinstance(source, ImageFolder):
        return _Images(source)
    if isinstance(source, (list, tuple)):
        return _Memory(list(source))
    if isinstance(source, dict):
        raise QnnxError("calibration is a single dict: give a list of {input name: array} dicts")
    if callable(source) and not hasattr(source, "__iter__"):
        return _Reiterable(source, f"{getattr(source, '__name__', type(source).__name__)}()")
    if isinstance(source, collections.abc.Iterator):  # told apart without calling iter(): that may start a pass
        return _Kept(source)
    if not hasattr(source, "__iter__") and not hasattr(source, "__getitem__"):
        raise QnnxError(f"calibration must be a directory or an iterable of samples, got {type(source).__name__}")
    return _Reiterable(lambda: source, f"a {type(source).__name__}", source)


# --------------------------------------------------------------------------- the type


@dataclass(frozen=True)
class _Selection:
    indices: tuple[int, ...] | None = None  # which entries of the source, ascending; None: all
    limit: int | None = None  # then at most this many
    how: str = ""  # for describe: how the samples were picked from the source


class CalibrationData:
    """Calibration samples: re-iterable, in a fixed order, validated against a model's inputs once
    bound (:meth:`bind`). Build it with :meth:`from_source`; :meth:`head` and :meth:`split` give
    deterministic parts of it, sharing its source (a kept iterator is read once for all of them)."""

    def __init__(self, source, selection: _Selection = _Selection(), specs: list[InputSpec] | None = None):
        self._source, self._selection, self._specs = source, selection, specs

    @classmethod
    def from_source(cls, source, *, num_samples: int | None = None, seed: int | None = 0) -> "CalibrationData":
        """``source``: a directory path of .npy/.npz (one input: .npy; by input name: .npz), an
        :class:`ImageFolder`, a CalibrationData (returned as is, or re-limited), a list/tuple of arrays
        (single-input models) or {input name: array} dicts, a callable returning a fresh iterable
        (called again on each pass), or a one-shot iterator/generator (read once and kept in memory, so
        it can be iterated again).

        ``num_samples`` below the number of files of a directory/image folder with a ``seed``: a seeded
        random subset of them, kept in name order; otherwise the first ``num_samples``."""
        if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer))
                                        or num_samples < 1):
            raise QnnxError(f"num_samples must be a positive int, got {num_samples!r}")
        data = source if isinstance(source, CalibrationData) else cls(_source_of(source))
        return data._limited(num_samples, seed)

    def _limited(self, num_samples: int | None, seed: int | None) -> "CalibrationData":
        if num_samples is None:
            return self
        if seed is not None and self._source.files is not None:
            chosen = self._chosen()
            if num_samples >= len(chosen):
                return self
            pick = np.random.default_rng(seed).choice(len(chosen), size=num_samples, replace=False)
            return self._with(_Selection(tuple(chosen[i] for i in sorted(pick)), None, f"seed {seed}"))
        return self.head(num_samples)

    def _with(self, selection: _Selection) -> "CalibrationData":
        return CalibrationData(self._source, selection, self._specs)

    def _chosen(self) -> tuple[int, ...] | range:
        """The source indices of the samples, in order (counting the source when it is not a list)."""
        s = self._selection
        if s.indices is not None:
            return s.indices[:s.limit]
        n = self._source.count(s.limit)  # (a source may count past the limit: only a pass stops at it)
        return range(n if s.limit is None else min(n, s.limit))

    @property
    def source(self):
        """What the samples come from: a directory Path, an ImageFolder, a list, a callable or re-iterable
        object, or an iterator's samples kept so far (for messages and tests; iterate the CalibrationData
        itself)."""
        return self._source.origin

    def bind(self, specs: list[InputSpec] | ir.Model) -> "CalibrationData":
        """The same samples, validated against these inputs when iterated (a model: its inputs). What
        can be refused without reading a sample is refused here (images for a multi-input model)."""
        specs = input_specs(specs) if isinstance(specs, ir.Model) else list(specs)
        self._source.check(specs)
        return CalibrationData(self._source, self._selection, specs)

    @property
    def specs(self) -> list[InputSpec] | None:
        return self._specs

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        """Validated feed dicts (:class:`QnnxError` at the first ``next`` when not bound: ``iter`` itself
        reads nothing, so ``iter(data) is data`` tells a one-shot source apart cheaply)."""
        return self._feeds(self._specs)

    def _entries(self) -> Iterator[tuple[str, Loader]]:
        """The selected entries, in order; the limit is checked before the next entry is pulled (and a
        one-shot iterator read further)."""
        wanted, limit = self._selection.indices, self._selection.limit
        stop = limit if wanted is None else len(wanted) if limit is None else min(limit, len(wanted))
        entries = self._source.entries()
        n = i = 0
        while stop is None or n < stop:
            entry = next(entries, None)
            if entry is None:
                break
            if wanted is None or wanted[n] == i:
                yield entry
                n += 1
            i += 1

    def _feeds(self, specs: list[InputSpec] | None) -> Iterator[dict[str, np.ndarray]]:
        if specs is None:
            raise QnnxError("calibration data is not bound to a model's inputs: call bind(input_specs(model))")
        n = 0
        for where, load in self._entries():
            yield validate_feed(load(specs), specs, where)
            n += 1
        if n == 0:
            raise QnnxError("calibration data is empty")

    def __len__(self) -> int:
        """The number of samples (a callable source is run through once to count them, without reading
        files or validating; a one-shot iterator is read to its end and kept)."""
        return len(self._chosen())

    def head(self, n: int) -> "CalibrationData":
        """The first ``n`` samples, in order (all of them when there are fewer)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise QnnxError(f"head needs a positive number of samples, got {n!r}")
        s = self._selection
        limit = n if s.limit is None else min(n, s.limit)
        if limit == s.limit or (isinstance(self._source, (_Directory, _Images, _Memory)) and n >= len(self)):
            return self
        return self._with(replace(s, limit=limit, how=_joined(s.how, f"first {limit}")))

    def split(self, validation: int | float) -> tuple["CalibrationData", "CalibrationData"]:
        """``(calibration part, held-out part)``: ``validation`` samples (an int) or that fraction of them
        (a float in (0, 1), rounded half up) held out, spread evenly over the whole sequence (sample
        ``floor((2j + 1) n / 2k)`` for j < k), so a directory sorted by class or time gives both parts the
        same mix; the rest, in order, calibrate. Deterministic; :class:`QnnxError` when a part would be
        empty."""
        chosen = self._chosen()
        n = len(chosen)
        if isinstance(validation, (float, np.floating)):
            if not 0 < validation < 1:
                raise QnnxError(f"a validation fraction must be in (0, 1), got {validation}")
            k = int(np.floor(validation * n + 0.5))
        elif isinstance(validation, (int, np.integer)) and not isinstance(validation, bool):
            k = int(validation)
        else:
            raise QnnxError(f"validation must be a count (int) or a fraction (float), got {validation!r}")
        if not 0 < k < n:
            raise QnnxError(f"cannot hold out {k} of {n} calibration samples: both the calibration and the "
                            "held-out part need at least one")
        held = {(2 * j + 1) * n // (2 * k) for j in range(k)}
        calib = tuple(chosen[p] for p in range(n) if p not in held)
        out = tuple(chosen[p] for p in sorted(held))
        how = self._selection.how
        return (self._with(_Selection(calib, None, _joined(how, f"calibration part, {k} held out"))),
                self._with(_Selection(out, None, _joined(how, "held-out part"))))

    def describe(self) -> str:
        """One line for reports: "32 samples from samples/ (.npy)", "8 of 64 images from img/
        (letterbox 640x640, pad 114, /255; seed 0)"."""
        noun, origin, detail = self._source.describe()
        n = len(self)
        total = self._source.known_count() if self._selection != _Selection() else n
        notes = "; ".join(x for x in (detail, self._selection.how) if x)
        counted = n if total in (n, None) else total  # the number the noun follows
        return " ".join(x for x in (f"{n}" if total in (n, None) else f"{n} of {total}",
                                    noun if counted != 1 else noun[:-1],
                                    origin, f"({notes})" if notes else "") if x)

    def __repr__(self) -> str:
        if self._selection.indices is None and self._source.known_count() is None:  # not counted: don't read
            noun, origin, detail = self._source.describe()
            return f"CalibrationData({_joined(noun, origin, detail)}, not counted yet)"
        return f"CalibrationData({self.describe()})"


def _joined(*parts: str) -> str:
    return ", ".join(x for x in parts if x)


def iter_samples(calibration, specs: list[InputSpec], limit: int | None = None,
                 seed: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Validated feed dicts, one at a time: ``CalibrationData.from_source(calibration, num_samples=limit,
    seed=seed).bind(specs)``, except that a one-shot iterator is streamed, not kept (one pass). Kept while
    the pipeline still takes raw sources."""
    if isinstance(calibration, collections.abc.Iterator):
        data = CalibrationData(_Reiterable(lambda: calibration, "an iterator", calibration))._limited(limit, seed)
    else:
        data = CalibrationData.from_source(calibration, num_samples=limit, seed=seed)
    yield from data.bind(specs)


__all__ = ["CalibrationData", "iter_samples"]
