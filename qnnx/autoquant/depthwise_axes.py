"""Per value: a depthwise conv's input quantized per channel or per tensor (``depthwise_inputs="auto"``).

A depthwise conv's output channel reads one input channel, so a target like OpenVINO can give its input one
scale per channel. That pays where the channels' ranges differ widely (a hard-swish or BatchNorm-scaled map
whose narrow channels get few levels of the tensor's one scale) and costs where they do not: a per-channel
min-max range from a few calibration samples follows them closely and clips what they did not show. The
choice is made per value from the calibration samples, before calibrating: the readers' rounding noise with
each channel's own min-max step against the tensor's step as the configured observer chooses it,

    ratio = sum_c n_c s_c^2 / (s^2 sum_c n_c),    n_c = sum over the readers' filters reading channel c of |W_o|^2

(a conv's output error from its input's rounding ``e`` is ``W e``; uniform rounding has variance step^2/12).
Per channel when ``ratio <= NOISE_RATIO``: the readers' rounding noise at least 6 dB lower.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from qnnx import ops
from qnnx.autoquant.calibration import observe
from qnnx.autoquant.config import QuantConfig
from qnnx.autoquant.plan import Plan, with_per_tensor
from qnnx.ir.build import const_array

NOISE_RATIO = 0.25  # fixed before any model was measured with it (docs/experiments.md)


@dataclass(frozen=True)
class AxisChoice:
    """One depthwise conv input: its channels, the readers' rounding-noise ratio per channel / per tensor,
    and the choice."""

    value: str
    channels: int
    noise_ratio: float
    per_channel: bool


@dataclass(frozen=True)
class DepthwiseAxes:
    """The ``depthwise_axes`` stage's record: one :class:`AxisChoice` per depthwise conv input it weighed."""

    choices: tuple[AxisChoice, ...] = ()

    @property
    def per_tensor(self) -> frozenset[str]:
        """The values kept per tensor (what a re-plan must keep: ``plan.target_plan``'s ``per_tensor``)."""
        return frozenset(c.value for c in self.choices if not c.per_channel)

    def lines(self) -> list[str]:
        if not self.choices:
            return []
        chosen = [c for c in self.choices if c.per_channel]
        return [f"depthwise inputs: {len(chosen)} of {len(self.choices)} per channel (readers' rounding noise "
                f"per channel / per tensor <= {NOISE_RATIO})" +
                (": " + ", ".join(f"{c.value} {c.noise_ratio:.2f}" for c in chosen[:8]) if chosen else "") +
                (f", ... and {len(chosen) - 8} more" if len(chosen) > 8 else "")]


def reader_channel_norms(value: ir.Value, channels: int) -> np.ndarray:
    """``n_c``: the squared norms of the depthwise filters reading each channel of ``value``, summed over its
    readers (a channel multiplier m: output o reads channel o // m); ones where a reader's weight is not a
    constant of the expected shape."""
    total = np.zeros(channels)
    for node in {use.node for use in value.uses()}:
        w = const_array(node.inputs[1]) if ops.depthwise_channels(node) == channels else None
        if w is None or w.shape[0] % channels:
            return np.ones(channels)
        total += np.sum(np.asarray(w, np.float64).reshape(channels, -1) ** 2, axis=1)
    return total if np.sum(total) > 0 else np.ones(channels)


def noise_ratio(tensor_scale: float, channel_scales: np.ndarray, norms: np.ndarray) -> float:
    """The readers' rounding noise with ``channel_scales`` over that with one ``tensor_scale``."""
    s = np.asarray(channel_scales, np.float64)
    return float(np.sum(norms * s * s) / (float(tensor_scale) ** 2 * np.sum(norms)))


def choose_axes(float_model: ir.Model, the_plan: Plan, data, config: QuantConfig) -> tuple[Plan, DepthwiseAxes]:
    """The plan with each candidate per-channel root (``Plan.per_channel_roots``) kept per channel or
    returned to per tensor by its noise ratio, and the record; ``the_plan`` unchanged unless
    ``config.ranges.depthwise_inputs`` is "auto". Two passes of the float model over ``data``, observing
    only the candidates."""
    candidates = the_plan.per_channel_roots()
    if config.ranges.depthwise_inputs != "auto" or not candidates:
        return the_plan, DepthwiseAxes()
    quiet = config.with_options(progress=False)
    per_channel, _, _ = observe(float_model, the_plan, data, quiet, roots=candidates)
    flat = with_per_tensor(the_plan, frozenset(v.name for v in candidates))
    per_tensor, _, _ = observe(float_model, flat, data, quiet, roots=candidates)
    choices = []
    for v in sorted(candidates, key=lambda v: v.name):
        scales = np.asarray(per_channel[v].scale).reshape(-1)
        ratio = noise_ratio(float(per_tensor[v].scale), scales, reader_channel_norms(v, scales.size))
        choices.append(AxisChoice(v.name, int(scales.size), round(ratio, 6), ratio <= NOISE_RATIO))
    axes = DepthwiseAxes(tuple(choices))
    return with_per_tensor(the_plan, axes.per_tensor), axes
