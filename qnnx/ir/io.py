"""Loading and saving models: ONNX files (external data included) <-> onnx-ir.

Only the API boundary touches protobuf. Saves are atomic: a temporary file in
the destination directory, then ``os.replace``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import onnx
import onnx_ir as ir

from qnnx.errors import QnnxError
from qnnx.ir.validate import check_model

ModelLike = "str | os.PathLike | onnx.ModelProto | ir.Model"


def load_model(model, *, copy: bool = True) -> ir.Model:
    """An ``ir.Model`` from a path, a ModelProto or an ir.Model (copied unless ``copy=False``,
    so passes never mutate what the caller handed in). A file or ModelProto is checked first
    (:func:`qnnx.ir.validate.check_model`): this is where models enter qnnx."""
    if isinstance(model, ir.Model):
        return model.clone() if copy else model
    if isinstance(model, onnx.ModelProto):
        return _deserialize(model, None, None)
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise QnnxError("file not found" if not path.is_dir() else "is a directory, not an ONNX file",
                            where=str(path))
        try:
            proto = onnx.load(path, load_external_data=False)
        except Exception as e:  # protobuf raises several types for truncated/garbage files
            raise QnnxError(f"not a readable ONNX model ({type(e).__name__}: {str(e)[:200]})",
                            where=str(path)) from None
        return _deserialize(proto, str(path.parent), str(path))
    raise QnnxError(f"expected a path, onnx.ModelProto or onnx_ir.Model, got {type(model).__name__}")


def _deserialize(proto: onnx.ModelProto, base_dir: str | None, where: str | None) -> ir.Model:
    """The checked proto as an ``ir.Model`` (external data read from ``base_dir`` into memory, nodes
    sorted topologically when the file lists them out of order)."""
    ordered = check_model(proto, base_dir=base_dir, where=where)
    try:
        m = ir.serde.deserialize_model(proto)
    except Exception as e:  # onnx-ir refuses what the checks above do not cover (e.g. a bad attribute)
        raise QnnxError(f"not a valid ONNX model ({type(e).__name__}: {str(e).splitlines()[0][:200]})",
                        where=where) from None
    if base_dir is not None:
        ir.external_data.set_base_dir(m.graph, base_dir)
    # Read external data now (it was checked present): ONNX Runtime sessions and the reference evaluator
    # take the model serialized in memory, where a relative external data path no longer resolves.
    ir.external_data.load_to_model(m)
    if not ordered:
        m.graph.sort()
    return m


def to_proto(model: ir.Model) -> onnx.ModelProto:
    return ir.to_proto(model)


def umask() -> int:
    """The process umask (read by setting it, as POSIX offers no getter, and restoring it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomically(path, write, what: str = "the file") -> Path:
    """``write(tmp)`` into a temporary file beside ``path``, then renamed onto it: ``path`` is never half
    written. The file gets the permissions any tool gives a new file (0666 less the umask; the temp
    file alone would be private). A path that cannot be written is a :class:`QnnxError` naming it."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        write(tmp)
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise QnnxError(f"cannot write {what}: {e.strerror or e}", where=str(path)) from None
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise
    return path


def save_model(model: ir.Model, path, *, external_data: str | None = None) -> Path:
    """Write ``model`` to ``path`` atomically (:func:`write_atomically`)."""
    return write_atomically(path, lambda tmp: ir.save(model, tmp, external_data=external_data), "the model")


def save_text(text: str, path) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`write_atomically`)."""
    return write_atomically(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
