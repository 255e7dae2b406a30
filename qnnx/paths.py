"""Output paths, checked before any work: qnnx never writes over what it reads.

An output must not be, or lie inside, any input: the model, its external data files, a calibration
file or the calibration directory (``-o samples/000.npy`` would overwrite a sample). It must name a file that can be
created: not empty, not an existing directory, in a directory that exists (or can be made) and
takes new files (probed by creating one, so a read-only mount or /sys fails here, not after a
calibration).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from qnnx.errors import QnnxError


def _resolved(p) -> Path:
    return Path(os.path.abspath(p)).resolve()


def check_output(out, inputs: dict | None = None, *, option: str = "-o") -> Path:
    """``out`` as a Path, or :class:`QnnxError` naming it and the rule it breaks. ``inputs``: what the
    command reads, ``{"model": path, "calibration data": directory}``; None paths are ignored."""
    if out is None or str(out).strip() == "":
        raise QnnxError(f"{option} names no file (empty path)")
    path = Path(out)
    where = str(out)
    target = _resolved(path)
    for what, inp in (inputs or {}).items():
        if inp is None:
            continue
        src = _resolved(inp)
        if target == src:
            raise QnnxError(f"refusing to overwrite the input {what}; choose another {option} path", where=where)
        if src.is_dir() and src in target.parents:
            raise QnnxError(f"refusing to write inside the {what} directory {inp}; choose another {option} path",
                            where=where)
    if target.is_dir():
        raise QnnxError(f"{option} is an existing directory; give a file name", where=where)
    if target.exists() and not target.is_file():
        raise QnnxError(f"{option} exists and is not a regular file", where=where)
    check_creatable(target, where)
    return path


def check_creatable(target: Path, where: str) -> None:
    """:class:`QnnxError` unless ``target`` can be created: its nearest existing ancestor is a
    directory that takes a new file (probed by making and removing one)."""
    parent = Path(os.path.abspath(target)).parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise QnnxError(f"cannot create {Path(target).name}: {parent} is not a directory", where=where)
    try:
        fd, probe = tempfile.mkstemp(prefix=".qnnx-probe.", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise QnnxError(f"cannot write in {parent}: {e.strerror or e}", where=where) from None


def model_files(model) -> dict:
    """``{"model": model, "external data file w.bin": path, ...}``: the files a model reads. An
    unreadable model lists itself only (loading it reports the problem)."""
    import onnx

    files = {"model": model}
    if model is None or not Path(model).is_file():
        return files
    try:
        proto = onnx.load(model, load_external_data=False)
    except Exception:  # not a model: load_model says so, naming the file
        return files
    base = Path(model).parent
    for t in _tensors(proto.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in t.external_data if e.key == "location"), None)
            if location:
                files[f"external data file {location}"] = base / location
    return files


def _tensors(graph):
    """Every TensorProto of ``graph`` and its subgraphs: initializers and tensor attributes."""
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _tensors(g)
