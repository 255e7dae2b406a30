"""A model's inputs as calibration samples must meet them (:class:`InputSpec`), and the check of one
feed dict against them (:func:`validate_feed`): names, dtype kind, static dims, emptiness, NaN/Inf,
integer range; each violation a one-line :class:`QnnxError` naming the sample and the rule."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

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


def numpy_dtype(spec: InputSpec) -> np.dtype:
    """The dtype the model declares for an input (float32 when undeclared)."""
    if spec.dtype is None:
        return np.dtype(np.float32)
    try:
        return np.dtype(spec.dtype.numpy())
    except Exception:  # a type numpy has no native dtype for (bfloat16, float8...) is fed as float32
        return np.dtype(np.float32)


def dims(shape) -> str:
    """``1x3x?x?``: a shape as messages write it (``?`` for a dynamic dim)."""
    return "x".join("?" if d is None else str(d) for d in shape)


def fits(shape: tuple[int, ...], spec: InputSpec) -> bool:
    """An array of ``shape`` has the rank and static dims ``spec`` declares (any shape when undeclared)."""
    return spec.shape is None or (len(shape) == len(spec.shape) and
                                  all(d is None or d == n for d, n in zip(spec.shape, shape)))


def validate_feed(feed: dict[str, np.ndarray], specs: list[InputSpec], where: str) -> dict[str, np.ndarray]:
    """``feed`` with each array converted to its input's declared dtype, or :class:`QnnxError` at
    ``where`` (the file or "calibration sample i") naming the first rule it breaks."""
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
        want = numpy_dtype(s)
        if want.kind == "f" and a.dtype.kind != "f":
            raise QnnxError(f"input {s.name!r} has dtype {a.dtype}; expected float", where=where)
        if want.kind in "iu" and a.dtype.kind not in "iu":  # token ids, indices: never silently truncated floats
            raise QnnxError(f"input {s.name!r} has dtype {a.dtype}; expected integer ({want})", where=where)
        if want.kind == "b" and a.dtype.kind != "b":
            raise QnnxError(f"input {s.name!r} has dtype {a.dtype}; expected bool", where=where)
        if not fits(a.shape, s):
            raise QnnxError(f"input {s.name!r} has shape {'x'.join(map(str, a.shape))}, model expects "
                            f"{dims(s.shape)}", where=where)
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


__all__ = ["InputSpec", "dims", "fits", "input_specs", "numpy_dtype", "validate_feed"]
