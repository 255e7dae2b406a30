"""Error of a quantized model against its float original, per tensor, streamed over samples.

Every float tensor that exists under the same name in both models is compared (a QDQ export
keeps the float model's tensor names: the input of each QuantizeLinear is the original tensor,
computed from dequantized inputs, so its error is everything upstream). Statistics accumulate
sample by sample — memory does not grow with the number of samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from qnnx import runtime
from qnnx.data import CalibrationData, input_specs
from qnnx.errors import QnnxError
from qnnx.ir import load_model


@dataclass
class LayerError:
    name: str  # the tensor
    op_type: str
    is_output: bool
    node: str = ""  # the float model's node computing it (the name ``exclude_nodes`` takes)
    signal: float = 0.0  # sum of ref**2
    noise: float = 0.0  # sum of (ref - got)**2
    dot: float = 0.0
    got_sq: float = 0.0
    max_abs: float = 0.0
    count: int = 0
    nonfinite: int = 0  # elements that are inf/NaN in one model and not (or not the same) in the other
    # per channel (axis 1; one channel for a 0-D or 1-D tensor), while every sample has the same count
    channel_signal: np.ndarray | None = field(default=None, repr=False)
    channel_dot: np.ndarray | None = field(default=None, repr=False)
    channel_got_sq: np.ndarray | None = field(default=None, repr=False)

    def add(self, ref: np.ndarray, got: np.ndarray) -> None:
        if ref.shape != got.shape:
            raise QnnxError(f"tensor {self.name!r} has shape {got.shape} in the quantized model, {ref.shape} in "
                            "the float model")
        r, g = ref.astype(np.float64), got.astype(np.float64)
        finite = np.isfinite(r) & np.isfinite(g)
        if not finite.all():  # equal infinities (and NaN for NaN) are no error; any other inf/NaN is counted
            same = (r == g) | (np.isnan(r) & np.isnan(g))
            self.nonfinite += int(np.count_nonzero(~finite & ~same))
            r, g = np.where(finite, r, 0.0), np.where(finite, g, 0.0)
        d = (r - g).ravel()
        self.noise += float(d @ d)
        # per channel on (before, channel, after) views by einsum (no product temporaries the size of the
        # tensor); the whole tensor's sums are theirs
        shape = (1, 1, r.size) if r.ndim < 2 else (r.shape[0], r.shape[1], int(np.prod(r.shape[2:])))
        r, g = r.reshape(shape), g.reshape(shape)
        sums = [np.einsum("nck,nck->c", a, b) for a, b in ((r, r), (r, g), (g, g))]
        self.signal += float(sums[0].sum())
        self.dot += float(sums[1].sum())
        self.got_sq += float(sums[2].sum())
        self._add_channels(sums)
        self.max_abs = max(self.max_abs, float(np.max(np.abs(d))) if d.size else 0.0)
        self.count += d.size

    def _add_channels(self, sums: list[np.ndarray]) -> None:
        if self.count == 0:  # the first sample
            self.channel_signal, self.channel_dot, self.channel_got_sq = sums
        elif self.channel_signal is not None and self.channel_signal.shape == sums[0].shape:
            self.channel_signal, self.channel_dot, self.channel_got_sq = (
                a + b for a, b in zip((self.channel_signal, self.channel_dot, self.channel_got_sq), sums))
        else:  # the channel count changed between samples: no per-channel figure
            self.channel_signal = self.channel_dot = self.channel_got_sq = None

    @property
    def sqnr_db(self) -> float:
        """Signal over noise in dB: inf when identical, -inf when either model has inf/NaN the other has not
        (or the signal is not finite)."""
        if self.nonfinite or not (math.isfinite(self.noise) and math.isfinite(self.signal)):
            return -math.inf
        if self.noise == 0:
            return math.inf
        return 10 * math.log10(max(self.signal, 1e-300) / self.noise)

    @property
    def cosine(self) -> float:
        """NaN when either model has inf/NaN the other has not."""
        if self.nonfinite or not all(math.isfinite(v) for v in (self.signal, self.got_sq, self.dot)):
            return math.nan
        denom = math.sqrt(self.signal * self.got_sq)
        return 1.0 if denom == 0 and self.noise == 0 else (self.dot / denom if denom else 0.0)

    @property
    def channel_cosine(self) -> float:
        """The mean over channels (axis 1) of each channel's own cosine to the float values (0 for a channel
        the quantized model leaves all zero), channels the float model leaves all zero left out. Unlike
        :attr:`sqnr_db` it is not ruled by the loudest channels: YOLOv8n's output concatenates box
        coordinates (0..320) with class scores (0..1). Unlike a per-channel SQNR it does not reward
        silence: a class-score channel gone all zero has SQNR 0 dB, above that of a noisy but useful one."""
        if self.nonfinite or self.channel_signal is None or not np.isfinite(self.channel_signal).all() \
                or not (self.channel_signal > 0).any():
            return math.nan
        live = self.channel_signal > 0
        s, dot, g = self.channel_signal[live], self.channel_dot[live], self.channel_got_sq[live]
        denom = np.sqrt(s * g)
        return float(np.mean(np.where(denom > 0, dot / np.where(denom > 0, denom, 1.0), 0.0)))


def _float_values(model: ir.Model) -> dict[str, tuple[str, bool, str]]:
    """(op type, is a graph output, node name) of every float value a node computes, by name."""
    outputs = {v.name for v in model.graph.outputs}
    found = {}
    for node in model.graph:
        for o in node.outputs:
            if o.name and o.dtype is not None and o.dtype.is_floating_point():
                found[o.name] = (node.op_type, o.name in outputs, node.name or "")
    for v in model.graph.outputs:
        found.setdefault(v.name, ("output", True, ""))
    return found


def _unpadded(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """``got`` without the channels a target appended (axis 1, e.g. ONNX Runtime's depthwise padding):
    the same tensor otherwise."""
    if (ref.ndim >= 2 and got.ndim == ref.ndim and got.shape[1] > ref.shape[1]
            and got.shape[:1] + got.shape[2:] == ref.shape[:1] + ref.shape[2:]):
        return got[:, :ref.shape[1]]
    return got


def _session(model: ir.Model, names: list[str]) -> ort.InferenceSession:
    return runtime.session(model, outputs=names)


def float_outputs(float_model, data, *, num_samples: int | None = None) -> list[dict[str, np.ndarray]]:
    """The float model's graph outputs, per sample: the reference for :func:`compare_models` (``reference=``)
    when several quantized versions are compared on the same few samples, so the float model runs once."""
    fm = load_model(float_model)
    names = [v.name for v in fm.graph.outputs]
    sess = _session(fm, names)
    return [dict(zip(names, runtime.run(sess, names, feed))) for feed in _samples(data, fm, num_samples)]


def compare_models(float_model, quant_model, data, *, num_samples: int | None = None,
                   outputs_only: bool = False, reference: list[dict[str, np.ndarray]] | None = None,
                   progress: Callable[[int, int], None] | None = None) -> list[LayerError]:
    """Error statistics per tensor present in both models, worst SQNR first (outputs included;
    only the float model's graph outputs with ``outputs_only``). ``reference``: the float model's outputs
    on ``data`` from :func:`float_outputs` (``outputs_only`` only), instead of running it again.
    Channels a target appended to a tensor (axis 1) are left out. ``progress(done, total)`` after each
    sample."""
    if reference is not None and not outputs_only:
        raise ValueError("a reference holds graph outputs only: pass outputs_only=True")
    fm, qm = load_model(float_model), load_model(quant_model)
    from onnx_ir.passes.common import ShapeInferencePass

    if not outputs_only:
        fm = ShapeInferencePass(check_type=False, strict_mode=False)(fm).model  # dtypes of intermediate values
    fv, qv = _float_values(fm), {v.name for n in qm.graph for v in n.outputs} | {v.name for v in qm.graph.outputs}
    if outputs_only:
        fv = {n: t for n, t in fv.items() if t[1]}
    common = sorted(n for n in fv if n in qv)
    if not common:
        raise QnnxError("the two models share no tensor names to compare")
    fs, qs = None if reference is not None else _session(fm, common), _session(qm, common)
    stats = {n: LayerError(n, fv[n][0], fv[n][1], fv[n][2]) for n in common}
    samples = _samples(data, fm, num_samples)
    for k, feed in enumerate(samples):
        fr = runtime.run(fs, common, feed) if fs is not None else [reference[k][n] for n in common]
        for n, a, b in zip(common, fr, runtime.run(qs, common, feed)):
            a = np.asarray(a)
            stats[n].add(a, _unpadded(a, np.asarray(b)))
        if progress is not None:
            progress(k + 1, len(samples))
    return sorted(stats.values(), key=lambda s: (s.sqnr_db, s.name))


def _samples(data, model: ir.Model, num_samples: int | None) -> CalibrationData:
    samples = CalibrationData.from_source(data)
    return (samples if num_samples is None else samples.head(num_samples)).bind(input_specs(model))
