"""Calibration observers: streaming statistics of a float tensor -> affine qparams.

An observer sees a tensor one batch at a time (:meth:`Observer.observe`) and decides its
quantization parameters once (:meth:`Observer.compute_qparams`). Its state has a fixed size,
whatever the number of batches, and observers that saw disjoint batches combine with
:meth:`Observer.merge` (data-parallel calibration). The methods, one registered class each
(:data:`OBSERVERS`):

``"minmax"``          running min/max, per channel with ``axis`` (merge: exact)
``"moving_average"``  exponential moving average of per-batch min/max, per channel with ``axis``
                      (merge: ``a.merge(b)`` equals ``a`` having seen ``b``'s batches after its own,
                      up to float64 rounding of the decay factor)
``"percentile"``      clip at a percentile of ``|x|`` (symmetric) or at the lower/upper
                      percentiles (asymmetric), from a histogram
``"entropy"``         KL-divergence threshold search (TensorRT's calibration, as ONNX Runtime's
                      ``EntropyCalibrater``), from a histogram
``"mse"``             the clipping range minimising expected quantization MSE (rounding noise
                      inside the range + clipping error outside), from a histogram; optionally
                      the error seen through the elementwise function that consumes the tensor
                      (``consumer``, :data:`CONSUMER_FUNCTIONS`)

Histogram state (:class:`HistogramObserver`): ``bins`` int64 counts on a *canonical grid*:
bin ``g`` (a global integer) is ``[g*w, (g+1)*w)`` with ``w`` a power of two, and ``w`` is the
smallest power of two (above a floor relative to ``max|x|``) such that the bins from
``floor(min/w)`` to ``floor(max/w)`` number at most ``bins``; the stored window starts at
``floor(min/w)``. When a batch falls outside the window, ``w`` doubles as often as needed and the
old counts are summed in groups of ``2**k`` bins: grids of widths ``w`` and ``2**k * w`` are
nested (every old bin lies inside exactly one new bin), so nothing is redistributed or
approximated. The state is therefore a function of the multiset of observed values alone: any
batch order, and any tree of merges, gives bit-identical counts, hence identical qparams.

Ranges always include 0 (:func:`qparams_from_range`), so real 0 is exactly representable.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from qnnx.dtypes import int_type
from qnnx.errors import QnnxError
from qnnx.numerics import check_scale, check_zero_point, normalize_axis
from qnnx.ops import facts, sigmoid

QPARAM_DTYPES: tuple[str, ...] = ("int8", "uint8", "int16", "uint16")

# Scale of an all-zero range: any positive scale represents 0 exactly; float32 epsilon (2**-23, as
# PyTorch) rather than something near the float32 minimum so that derived scales (bias scale =
# input scale * weight scale, requantization ratios) stay normal float32 numbers.
ZERO_RANGE_SCALE = float(np.finfo(np.float32).eps)
# Floor of every other scale: the smallest normal float32 (2**-126). A range this tiny is still
# resolved, and a runtime that flushes subnormals to zero never divides by a zero scale.
MIN_SCALE = float(np.finfo(np.float32).tiny)
_FLOAT32_MAX = float(np.finfo(np.float32).max)
MAX_BINS = 1 << 20  # histogram bins; a typo like bins=10**9 fails in the config, not in np.zeros

# Histogram width floor relative to max|x|: w >= 2**(exponent(max|x|) - 40), so every global bin
# index is below 2**41 in magnitude and exact in float64 (and float32 after floor, see _bin_counts).
_WIDTH_FLOOR_BITS = 40
# Width of an all-zero histogram (and absolute floor): far below any float32 value's floor above.
_MIN_WIDTH = 2.0 ** -1000


# --------------------------------------------------------------------------- consumer functions


def _silu(x):
    """SiLU, ``x * sigmoid(x)``: no ONNX op of its own, the sigmoid's gate times its input."""
    return x * sigmoid(x), sigmoid(x) * (1.0 + x * (1.0 - sigmoid(x)))


# The elementwise function a tensor's only reader applies, for the "mse" method: x -> (f(x), f'(x))
# (float64 arrays). A range is then judged by the error of f(x) rather than of x, so a tail that f
# flattens (SiLU's and hard-swish's negative side, both tails of a sigmoid) is clipped for
# resolution where f is steep. A positive constant factor on f changes no choice.
# Weight of the plain error of x next to the error of f(x): keeps a range from collapsing where f is flat.
CONSUMER_IDENTITY_WEIGHT = 1e-8
# The ops' own functions are their rows' (qnnx.ops.ElementwiseFunction.value_and_slope).
CONSUMER_FUNCTIONS: dict[str, object] = {
    "identity": None,
    "silu": _silu,
    "hardswish": facts("HardSwish").function.value_and_slope,
    "sigmoid": facts("Sigmoid").function.value_and_slope,
}


# --------------------------------------------------------------------------- qparams


@dataclass(frozen=True, eq=False)
class QParams:
    """Affine quantization parameters of one tensor: ``q = clip(round(x / scale) + zero_point)``.

    ``scale`` is float32 and ``zero_point`` int32, both of shape ``()`` (per-tensor, ``axis`` None)
    or ``(C,)`` (per-axis along ``axis``). Validated on construction: every scale positive and
    finite, every zero point inside ``dtype``'s range. The arrays are read-only copies. Two
    QParams are equal when dtype, axis and every scale/zero point are bit-identical.
    """

    scale: np.ndarray
    zero_point: np.ndarray
    dtype: str
    axis: int | None = None

    def __post_init__(self):
        if self.dtype not in QPARAM_DTYPES:
            raise QnnxError(f"qparams dtype must be one of {', '.join(QPARAM_DTYPES)}, got {self.dtype!r}")
        if self.axis is not None and not _is_int(self.axis):
            raise QnnxError(f"qparams axis must be an int or None, got {self.axis!r}")
        scale = np.array(check_scale(np.asarray(self.scale)), dtype=np.float32)
        check_scale(scale)  # again after the cast: a float64 scale may overflow or flush in float32
        zero_point = check_zero_point(self.zero_point, int_type(self.dtype)).astype(np.int32)
        if scale.shape != zero_point.shape:
            raise QnnxError(f"scale shape {scale.shape} != zero_point shape {zero_point.shape}")
        expect = 0 if self.axis is None else 1
        if scale.ndim != expect:
            kind = "per-tensor qparams (axis None) need" if self.axis is None else "per-axis qparams need"
            raise QnnxError(f"{kind} {expect}-D scale/zero_point, got shape {scale.shape}")
        scale.setflags(write=False)
        zero_point.setflags(write=False)
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "zero_point", zero_point)

    def __eq__(self, other) -> bool:
        if not isinstance(other, QParams):
            return NotImplemented
        return (self.dtype == other.dtype and self.axis == other.axis
                and self.scale.shape == other.scale.shape
                and bool(np.all(self.scale.view(np.int32) == other.scale.view(np.int32)))
                and bool(np.all(self.zero_point == other.zero_point)))

    __hash__ = None  # holds arrays


def quant_range(dtype: str, reduce_range: bool = False) -> tuple[int, int]:
    """``(qmin, qmax)`` of ``dtype``; ``reduce_range`` drops one bit (int8 -> [-64, 63], uint8 -> [0, 127])."""
    if dtype not in QPARAM_DTYPES:
        raise QnnxError(f"dtype must be one of {', '.join(QPARAM_DTYPES)}, got {dtype!r}")
    t = int_type(dtype)
    bits = t.bits - 1 if reduce_range else t.bits
    if t.signed:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def qparams_from_range(lo, hi, dtype: str, symmetric: bool, reduce_range: bool = False,
                       axis: int | None = None) -> QParams:
    """The qparams that map the real range ``[lo, hi]`` onto ``dtype``.

    ``lo``/``hi`` are scalars (``axis`` None) or 1-D arrays of one bound per channel (``axis`` set).
    The range is first widened to contain 0 (``lo = min(lo, 0)``, ``hi = max(hi, 0)``) so that real
    0 is exactly representable (zero padding, ReLU outputs). With ``qmin, qmax`` of ``dtype``
    (one bit less with ``reduce_range``):

    - symmetric: ``scale = max(|lo|, |hi|) / ((qmax - qmin) / 2)``; zero point 0 for signed types,
      the midpoint ``(qmin + qmax + 1) // 2`` for unsigned ones (128 for uint8, 32768 for uint16,
      64 for reduce_range uint8). The representable range is ``[qmin, qmax] * scale`` around the
      zero point, so the positive extreme may clip by half a step (PyTorch's convention).
    - asymmetric: ``scale = (hi - lo) / (qmax - qmin)``,
      ``zero_point = clip(round_half_even(qmin - lo / scale))`` with the float32 scale.

    Edge cases:

    - ``lo == hi == 0`` (an all-zero tensor): ``scale = ZERO_RANGE_SCALE`` (2**-23), zero point as
      above (``qmin`` when asymmetric). A constant nonzero value ``c`` is *not* degenerate: the range
      becomes ``[0, c]`` (or ``[c, 0]``) and ``c`` maps to ``qmax`` (``qmin``) to float32 precision
      (asymmetric) or within half a step (symmetric).
    - ranges so tiny that the scale would fall below the smallest normal float32: ``scale =
      MIN_SCALE`` (2**-126); the scale is never zero or subnormal.
    - non-finite bounds or ``lo > hi``: :class:`QnnxError`; a range too wide for a float32
      scale (only reachable with float64 bounds): :class:`QnnxError`.

    The result's scale is always finite and > 0, its zero point within range.
    """
    qmin, qmax = quant_range(dtype, reduce_range)
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    expect = 0 if axis is None else 1
    if lo.shape != hi.shape or lo.ndim != expect:
        what = "scalars (per-tensor, axis None)" if axis is None else "1-D arrays (per-axis)"
        raise QnnxError(f"range bounds must be {what} of the same shape, got lo {lo.shape} and hi {hi.shape}")
    finite = np.isfinite(lo) & np.isfinite(hi)
    if not finite.all():
        raise QnnxError(f"range has {int(np.count_nonzero(~finite))} non-finite bound(s): lo={lo}, hi={hi}")
    if (lo > hi).any():
        raise QnnxError(f"range lower bound exceeds upper bound: lo={lo}, hi={hi}")
    lo = np.minimum(lo, 0.0)
    hi = np.maximum(hi, 0.0)
    if symmetric:
        scale = np.maximum(-lo, hi) / ((qmax - qmin) / 2)
    else:
        scale = (hi - lo) / (qmax - qmin)
    with np.errstate(over="ignore"):  # checked right below, with a message
        scale = np.where(hi == lo, ZERO_RANGE_SCALE, np.maximum(scale, MIN_SCALE)).astype(np.float32)
    if not np.isfinite(scale).all():
        raise QnnxError(f"range [{lo}, {hi}] is too wide for a float32 scale")
    if symmetric:
        zero_point = np.full(scale.shape, 0 if qmin < 0 else (qmin + qmax + 1) // 2)
    else:
        # With the float32 scale actually stored, so that quantize(lo) lands on qmin.
        zero_point = np.clip(np.rint(qmin - lo / scale.astype(np.float64)), qmin, qmax)
    return QParams(scale, zero_point.astype(np.int32), dtype, axis)


# --------------------------------------------------------------------------- config


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_real(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


@dataclass(frozen=True)
class ObserverConfig:
    """What an observer computes. Validated on construction (every problem is a :class:`QnnxError`).

    ``method``: a key of :data:`OBSERVERS`. ``dtype``: one of int8, uint8, int16, uint16.
    ``axis``: per-channel axis (weights), only for methods that support it (minmax,
    moving_average); histogram methods are per-tensor. ``percentile`` in (0, 100] (percentile
    method), ``averaging_constant`` in (0, 1] (moving_average), ``bins`` in [16, 2**20]
    (histogram methods), ``consumer`` a key of :data:`CONSUMER_FUNCTIONS` (the "mse" method judges
    the error through it; the other methods ignore it), ``channel_balance`` in [0, 1] and
    ``channel_weights`` (positive finite, one per channel; histogram methods only, see
    :class:`HistogramObserver`) along ``balance_axis``, ``negative_lobe`` in [0, 1) (the "mse"
    method, see :class:`MSEObserver`). Every field is checked whatever the method,
    so a bad value never hides until someone switches methods.
    """

    method: str = "minmax"
    dtype: str = "uint8"
    symmetric: bool = False
    axis: int | None = None
    percentile: float = 99.999
    averaging_constant: float = 0.01
    bins: int = 2048
    reduce_range: bool = False
    consumer: str = "identity"  # a key of CONSUMER_FUNCTIONS; only the "mse" method uses it
    # Histogram methods: each batch's values of channel c (along balance_axis) count with weight
    # min(1, median_c' ms / ms_c) ** channel_balance, ms = that batch's per-channel mean square. 0: off.
    channel_balance: float = 0.0
    # Histogram methods: channel c's values count with this fixed weight (e.g. the squared norm of the
    # weights that read the channel: its rounding error's share of the reader's output error). None: off.
    channel_weights: tuple[float, ...] | None = None
    balance_axis: int = 1
    # "mse", asymmetric: a negative side narrower than this fraction of the positive one is kept whole
    # (the range starts at the data's minimum). 0: off. See MSEObserver.
    negative_lobe: float = 0.0

    def __post_init__(self):
        cls = OBSERVERS.get(self.method) if isinstance(self.method, str) else None
        if cls is None:
            raise QnnxError(f"unknown observer method {self.method!r}; expected one of {', '.join(OBSERVERS)}")
        if self.dtype not in QPARAM_DTYPES:
            raise QnnxError(f"observer dtype must be one of {', '.join(QPARAM_DTYPES)}, got {self.dtype!r}")
        for name in ("symmetric", "reduce_range"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise QnnxError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.axis is not None:
            if not _is_int(self.axis):
                raise QnnxError(f"axis must be an int or None, got {self.axis!r}")
            if not cls.per_axis:
                raise QnnxError(f"the {self.method!r} observer is per-tensor only: axis must be None, "
                                f"got {self.axis} (per-axis methods: "
                                f"{', '.join(m for m, c in OBSERVERS.items() if c.per_axis)})")
        if not (_is_real(self.percentile) and 0 < self.percentile <= 100):
            raise QnnxError(f"percentile must be in (0, 100], got {self.percentile!r}")
        if not (_is_real(self.averaging_constant) and 0 < self.averaging_constant <= 1):
            raise QnnxError(f"averaging_constant must be in (0, 1], got {self.averaging_constant!r}")
        if not (_is_int(self.bins) and 16 <= self.bins <= MAX_BINS):
            raise QnnxError(f"bins must be an int in [16, {MAX_BINS}], got {self.bins!r}")
        if not (_is_real(self.channel_balance) and 0 <= self.channel_balance <= 1):
            raise QnnxError(f"channel_balance must be in [0, 1], got {self.channel_balance!r}")
        if not (_is_real(self.negative_lobe) and 0 <= self.negative_lobe < 1):
            raise QnnxError(f"negative_lobe must be in [0, 1), got {self.negative_lobe!r}")
        if not _is_int(self.balance_axis):
            raise QnnxError(f"balance_axis must be an int, got {self.balance_axis!r}")
        if self.channel_balance and not issubclass(cls, HistogramObserver):
            raise QnnxError(f"channel_balance needs a histogram method (percentile, entropy, mse), not "
                            f"{self.method!r}")
        if self.channel_weights is not None:
            w = np.asarray(self.channel_weights, dtype=np.float64) if isinstance(self.channel_weights, tuple) else None
            if w is None or w.ndim != 1 or w.size < 1 or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
                raise QnnxError("channel_weights must be a tuple of finite non-negative floats, not all zero")
            if not issubclass(cls, HistogramObserver):
                raise QnnxError(f"channel_weights needs a histogram method (percentile, entropy, mse), not "
                                f"{self.method!r}")
        if not isinstance(self.consumer, str) or self.consumer not in CONSUMER_FUNCTIONS:
            raise QnnxError(f"unknown consumer function {self.consumer!r}; expected one of "
                            f"{', '.join(CONSUMER_FUNCTIONS)}")


# --------------------------------------------------------------------------- observers

OBSERVERS: dict[str, type["Observer"]] = {}


def register_observer(method: str):
    """Class decorator: ``@register_observer("minmax")`` makes ``ObserverConfig(method="minmax")`` valid."""

    def register(cls: type[Observer]) -> type[Observer]:
        if method in OBSERVERS:
            raise ValueError(f"observer method {method!r} is already registered")
        cls.method = method
        OBSERVERS[method] = cls
        return cls

    return register


def make_observer(config: ObserverConfig) -> "Observer":
    """A fresh observer of ``config.method``."""
    if not isinstance(config, ObserverConfig):
        raise QnnxError(f"make_observer needs an ObserverConfig, got {type(config).__name__}")
    return OBSERVERS[config.method](config)


class Observer:
    """Shared machinery: batch checks, counting, merging, and the range -> qparams step.

    A subclass implements ``_update(x, mn, mx)`` (fold one validated batch and its min/max,
    float64 arrays of shape ``()`` or ``(C,)``, into the state), ``_merge_state(other)`` (both
    non-empty) and ``_range()`` (the clipping range ``(lo, hi)``, before 0 is included).

    Batch rules (:meth:`observe`), the same for every method:

    - the array must be floating point (float16/32/64), else :class:`QnnxError`;
    - an empty batch raises :class:`QnnxError` ("empty batch") rather than being skipped: an empty
      activation during calibration means the data or the graph is wrong;
    - NaN or +-Inf anywhere raises :class:`QnnxError` with the count of non-finite values; values
      beyond the float32 range (float64 input) raise too. The state is untouched by a rejected
      batch, so the observer stays usable;
    - with ``axis``, every batch must have the same number of channels.

    :attr:`num_observed` counts accepted batches (``observe`` calls); a merge adds the counts.
    """

    method: ClassVar[str] = ""
    per_axis: ClassVar[bool] = False
    # True when observing a concatenation of batches gives the same state as observing them one by
    # one (the statistic does not depend on how the data is split): callers may then batch samples.
    partition_invariant: ClassVar[bool] = False
    # True when the state depends on the batching only through per-batch statistics that get better
    # with bigger batches (channel balance): callers may batch samples too, with a fixed batch size.
    batch_statistics: ClassVar[bool] = False

    def __init__(self, config: ObserverConfig):
        if not isinstance(config, ObserverConfig):
            raise QnnxError(f"{type(self).__name__} needs an ObserverConfig, got {type(config).__name__}")
        if config.method != self.method:
            raise QnnxError(f"{type(self).__name__} implements {self.method!r} but the config asks for "
                            f"{config.method!r}; use make_observer(config)")
        self.config = config
        self._batches = 0
        self._channels: int | None = None

    @property
    def num_observed(self) -> int:
        """Number of accepted batches (including those of merged observers)."""
        return self._batches

    def observe(self, x) -> None:
        """Fold one batch into the state (rules in the class docstring)."""
        x = np.asarray(x)
        if x.dtype.kind != "f":
            raise QnnxError(f"observe needs a floating-point array, got dtype {x.dtype}")
        if x.size == 0:
            raise QnnxError(f"empty batch (shape {x.shape}): observers need at least one value per batch")
        axis = self.config.axis
        channels = None
        if axis is None:
            mn, mx = np.min(x), np.max(x)
        else:
            ax = normalize_axis(axis, x.ndim)
            channels = x.shape[ax]
            if self._channels is not None and channels != self._channels:
                raise QnnxError(f"batch has {channels} channels along axis {axis}, earlier batches had "
                                f"{self._channels}")
            others = tuple(i for i in range(x.ndim) if i != ax)
            mn, mx = np.min(x, axis=others), np.max(x, axis=others)
        mn = np.asarray(mn, dtype=np.float64)
        mx = np.asarray(mx, dtype=np.float64)
        # min/max propagate NaN and reach +-Inf, so finite extremes prove the whole batch finite
        # without an extra pass; only a bad batch pays for counting.
        if not (np.isfinite(mn).all() and np.isfinite(mx).all()):
            nan = int(np.count_nonzero(np.isnan(x)))
            inf = int(np.count_nonzero(np.isinf(x)))
            raise QnnxError(f"batch has {nan + inf} non-finite value(s) ({nan} NaN, {inf} Inf) out of "
                            f"{x.size}; calibration data must be finite")
        amax = max(float(np.max(-mn)), float(np.max(mx)))
        if amax > _FLOAT32_MAX:
            raise QnnxError(f"batch has values of magnitude {amax:g}, beyond float32; no float32 scale "
                            f"can represent them")
        self._update(x, mn, mx)
        self._channels = channels
        self._batches += 1

    def merge(self, other: "Observer") -> None:
        """Fold the state of ``other`` (same class and config, disjoint batches) into this observer.

        What the result equals is method-specific (see the subclass); ``other`` is unchanged.
        Merging an empty observer is a no-op; merging into an empty one copies ``other``.
        """
        if other is self:
            raise QnnxError("cannot merge an observer into itself (its batches would count twice)")
        if type(other) is not type(self) or other.config != self.config:
            raise QnnxError(f"can only merge observers of the same config: {self.config} vs "
                            f"{getattr(other, 'config', type(other).__name__)}")
        if other._batches == 0:
            return
        if self._batches == 0:
            for name, value in vars(other).items():
                if name != "config":
                    setattr(self, name, copy.deepcopy(value))
            return
        if other._channels != self._channels:
            raise QnnxError(f"cannot merge observers of {self._channels} and {other._channels} channels")
        self._merge_state(other)
        self._batches += other._batches

    def compute_range(self) -> tuple[np.ndarray, np.ndarray]:
        """The calibrated clipping range ``(lo, hi)`` (float64, shape ``()`` or ``(C,)``), before 0 is included.

        Raises :class:`QnnxError` if no batch was observed.
        """
        if self._batches == 0:
            raise QnnxError(f"{self.method} observer observed no data: call observe() with at least one "
                            f"batch before compute_qparams()")
        lo, hi = self._range()
        return np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)

    def compute_qparams(self) -> QParams:
        """:func:`qparams_from_range` of :meth:`compute_range` with this observer's dtype/symmetric/axis.

        Raises :class:`QnnxError` ("... observed no data") if no batch was observed.
        """
        lo, hi = self.compute_range()
        c = self.config
        return qparams_from_range(lo, hi, c.dtype, c.symmetric, c.reduce_range, c.axis)

    # subclass hooks
    def _update(self, x: np.ndarray, mn: np.ndarray, mx: np.ndarray) -> None:
        raise NotImplementedError

    def _merge_state(self, other: "Observer") -> None:
        raise NotImplementedError

    def _range(self) -> tuple:
        raise NotImplementedError


@register_observer("minmax")
class MinMaxObserver(Observer):
    """Running min and max (per channel with ``axis``). Merge is exact: min of mins, max of maxes."""

    per_axis = True
    partition_invariant = True

    def __init__(self, config: ObserverConfig):
        super().__init__(config)
        self._min: np.ndarray | None = None
        self._max: np.ndarray | None = None

    def _update(self, x, mn, mx):
        if self._min is None:
            self._min, self._max = mn, mx
        else:
            np.minimum(self._min, mn, out=self._min)
            np.maximum(self._max, mx, out=self._max)

    def _merge_state(self, other):
        np.minimum(self._min, other._min, out=self._min)
        np.maximum(self._max, other._max, out=self._max)

    def _range(self):
        return self._min, self._max


@register_observer("moving_average")
class MovingAverageObserver(Observer):
    """Exponential moving average of the per-batch min and max (per channel with ``axis``).

    The first batch sets the averages; batch ``b`` then moves them by
    ``avg += averaging_constant * (b - avg)`` (PyTorch's MovingAverageMinMaxObserver, ORT's
    ``moving_average`` option). Only the order of batches matters, not their sizes.

    Merge: an average is order-dependent, so ``a.merge(b)`` means "``b``'s batches came after
    ``a``'s". Exactly: running from ``a``'s average through ``b``'s ``k`` batches gives
    ``ema_b + (1 - c)**k * (ema_a - first_b)``, where ``first_b`` is the min/max of ``b``'s first
    batch; so the state keeps the first batch's extremes and ``(1 - c)**k``. The merged average
    equals the sequential one up to float64 rounding (a few ulps), not bit for bit.
    """

    per_axis = True

    def __init__(self, config: ObserverConfig):
        super().__init__(config)
        self._avg_min: np.ndarray | None = None
        self._avg_max: np.ndarray | None = None
        self._first_min: np.ndarray | None = None
        self._first_max: np.ndarray | None = None
        self._decay = 1.0  # (1 - averaging_constant) ** num_observed

    def _update(self, x, mn, mx):
        c = float(self.config.averaging_constant)
        if self._avg_min is None:
            self._avg_min, self._avg_max = mn, mx
            self._first_min, self._first_max = mn.copy(), mx.copy()
        else:
            self._avg_min += c * (mn - self._avg_min)
            self._avg_max += c * (mx - self._avg_max)
        self._decay *= 1.0 - c

    def _merge_state(self, other):
        self._avg_min[...] = other._avg_min + other._decay * (self._avg_min - other._first_min)
        self._avg_max[...] = other._avg_max + other._decay * (self._avg_max - other._first_max)
        self._decay *= other._decay

    def _range(self):
        return self._avg_min, self._avg_max


# --------------------------------------------------------------------------- histogram grid


def _width_floor(amax: float) -> float:
    if amax == 0.0:
        return _MIN_WIDTH
    return max(_MIN_WIDTH, math.ldexp(1.0, math.frexp(amax)[1] - _WIDTH_FLOOR_BITS))


def _fits(lo: float, hi: float, width: float, bins: int) -> bool:
    # lo / width and hi / width are exact (power-of-two width), so this is the exact bin count.
    return math.floor(hi / width) - math.floor(lo / width) < bins


def _fit_width(lo: float, hi: float, bins: int, at_least: float) -> float:
    """Smallest power of two >= ``at_least`` and the floor for ``max(|lo|, |hi|)`` covering
    ``[lo, hi]`` in ``bins`` bins. Fitting is monotone in the width (if ``w`` fits, ``2w`` does)
    and in the range, which makes the streaming width equal to the width computed from scratch."""
    width = max(at_least, _width_floor(max(-lo, hi)))
    per_bin = (hi - lo) / bins
    if per_bin > 0:
        # Start one power of two below floor(log2(per_bin)): (hi - lo) may round up in float64,
        # and starting above the minimal fitting width would break canonicity.
        width = max(width, math.ldexp(1.0, math.frexp(per_bin)[1] - 2))
    while not _fits(lo, hi, width, bins):
        width *= 2.0
    return width


def _regrid(counts: np.ndarray, width: float, start: float, new_width: float, new_start: float) -> np.ndarray:
    """Counts of grid (width, start) summed onto the coarser nested grid (new_width, new_start)."""
    ratio = new_width / width  # a power of two >= 1
    nz = np.flatnonzero(counts)
    # Global bin indices are integers below 2**41, so the sum, the division by a power of two and
    # the floor are all exact in float64.
    idx = np.floor((start + nz) / ratio) - new_start
    if nz.size and (idx.min() < 0 or idx.max() >= counts.size):
        raise AssertionError("histogram regrid out of the window: the fit check is broken")
    out = np.zeros_like(counts)
    np.add.at(out, idx.astype(np.intp), counts[nz])
    return out


BIN_BLOCK = 1 << 16  # values per pass of the binning loop: its temporaries stay in cache


def _channel_weights(x: np.ndarray, axis: int, power: float) -> tuple[np.ndarray, int] | None:
    """Per-channel weights ``min(1, median ms / ms_c) ** power`` of one batch and the number of values
    per channel run in C order (``x.shape[axis+1:]``); None when there is nothing to balance."""
    if x.ndim < 2 or not -x.ndim <= axis < x.ndim:
        return None
    ax = normalize_axis(axis, x.ndim)
    channels, run = x.shape[ax], math.prod(x.shape[ax + 1:])
    if channels < 2:
        return None
    # mean squares per channel, accumulated in x's own precision (weights need no more, and float64
    # squares are several times slower)
    x3 = x.reshape(-1, channels, run)
    ms = np.einsum("ocr,ocr->c", x3, x3).astype(np.float64) / (x3.shape[0] * run)
    med = float(np.median(ms))
    if not (med > 0 and math.isfinite(med)):
        return None
    w = np.ones_like(ms)
    loud = ms > med  # only these are weighed down (a silent channel's med / 0 would overflow)
    w[loud] = (med / ms[loud]) ** power
    return w, run


def _weight_segments(size: int, weights: tuple[np.ndarray, int] | None):
    """``(lo, hi, weight)`` blocks of at most about :data:`BIN_BLOCK` flat positions covering ``size``
    values: weight None (unweighted), a float (one channel run) or the array of each position's weight,
    built without a per-value index computation (channel runs are contiguous in C order)."""
    if weights is None:
        for lo in range(0, size, BIN_BLOCK):
            yield lo, min(lo + BIN_BLOCK, size), None
        return
    w, run = weights
    period = run * w.size  # the channel pattern repeats every period values
    if period <= BIN_BLOCK:
        step = period * (BIN_BLOCK // period)
        pattern = np.tile(np.repeat(w, run), BIN_BLOCK // period)
        for lo in range(0, size, step):
            yield lo, min(lo + step, size), pattern[:min(step, size - lo)]
    elif run >= BIN_BLOCK // 4:  # long runs: blocks inside one run share its weight
        for r in range(size // run):
            for lo in range(r * run, (r + 1) * run, BIN_BLOCK):
                yield lo, min(lo + BIN_BLOCK, (r + 1) * run), float(w[r % w.size])
    else:  # whole runs per block
        per = BIN_BLOCK // run
        for r0 in range(0, size // run, per):
            r1 = min(r0 + per, size // run)
            yield r0 * run, r1 * run, np.repeat(w[np.arange(r0, r1) % w.size], run)


def _bin_counts(x: np.ndarray, width: float, start: float, bins: int,
                weights: tuple[np.ndarray, int] | None = None) -> np.ndarray:
    """Histogram of ``x`` on bins ``[g*width, (g+1)*width)``, ``g = start .. start + bins - 1``: int64
    counts, or float64 sums of per-channel ``weights`` (:func:`_channel_weights`).

    Blocks of :data:`BIN_BLOCK` values: on whole tensors the scaled copy and the index array fall out
    of cache, and large batches bin much slower (figures: docs/experiments.md, "Ranges and
    observers")."""
    flat = x.reshape(-1)
    # Multiplying a float32 by a power of two >= 1 never rounds (results stay below 2**41), and float32
    # halves the memory traffic. Scaling down could round float32 subnormals (a tiny negative becoming
    # -0.0 would land one bin too high); float64 holds every float32 / width exactly. (float64 inputs:
    # exact except for float64 subnormals, which no float32 graph produces.)
    exact32 = x.dtype.itemsize <= 4 and 2.0 ** -100 <= width <= 1.0
    dtype, factor = (np.float32, np.float32(1.0 / width)) if exact32 else (np.float64, 1.0 / width)
    scaled = np.empty(min(BIN_BLOCK, flat.size), dtype)
    counts = np.zeros(bins, np.int64 if weights is None else np.float64)
    for lo, hi, weight in _weight_segments(flat.size, weights):
        t = scaled[:hi - lo]
        np.multiply(flat[lo:hi], factor, out=t, dtype=dtype)
        np.floor(t, out=t)
        idx = t.astype(np.intp)
        idx -= int(start)
        if weight is None or isinstance(weight, float):
            block = np.bincount(idx, minlength=bins)  # a negative index raises here
            if weight is not None:
                block = block * weight
        else:
            block = np.bincount(idx, weights=weight, minlength=bins)
        if block.size != bins:
            raise AssertionError("value outside the histogram window: the fit check is broken")
        counts += block
    return counts


class HistogramObserver(Observer):
    """Base of the histogram methods: ``bins`` counts on the canonical power-of-two grid (module
    docstring) plus the exact running min and max. Per-tensor only.

    The bin width is the smallest power of two that fits ``[min, max]`` in ``bins`` bins, so it is
    under ``2 * (max - min) / bins`` (the resolution of every method built on it); a subclass sees
    the histogram through :meth:`_zero_covering` (coarsened if needed so the window contains 0) and
    :meth:`_abs_histogram` (``|x|``, for thresholds applied to both sides).

    Merge is exact and order-free: the merged counts are bit-identical to those of one observer
    that saw all batches, in any order (the state depends only on the multiset of values).

    With ``channel_balance`` p > 0 the counts are float64 sums of weights instead: in each batch, the
    values of channel c weigh ``min(1, median ms / ms_c) ** p`` (ms: mean squares per channel along
    ``balance_axis`` in that batch). A few channels far louder than the rest (hard-swish outputs can
    have channels two orders of magnitude above the bulk) then count less, and every method built on the
    histogram trades their tails for the resolution of the bulk. The weights come from each batch, so
    the state depends on the batching (:attr:`batch_statistics`); merge stays exact up to float sums.

    With ``channel_weights`` the values of channel c also count with that fixed weight (float64
    sums; fixed weights keep the state independent of the batching). A tensor shaped with another
    channel count along ``balance_axis`` is a :class:`QnnxError`.

    A constant tensor (min == max) keeps its exact range: no method clips it.
    """

    partition_invariant = True  # without channel_balance: the state depends only on the multiset of values

    def __init__(self, config: ObserverConfig):
        super().__init__(config)
        if config.channel_balance:
            self.partition_invariant = False
            self.batch_statistics = True
        self._fixed = None if config.channel_weights is None else np.asarray(config.channel_weights, np.float64)
        self._counts: np.ndarray | None = None  # int64 (float64 with channel weights of either kind), (bins,)
        self._width = 0.0  # a power of two
        self._start = 0.0  # global index of bin 0 (an integer, held as float)
        self._min = math.inf
        self._max = -math.inf

    @property
    def histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """``(counts, edges)``: a copy of the int64 counts and their ``bins + 1`` float64 edges
        (bin ``i`` is ``[edges[i], edges[i+1])``). Raises :class:`QnnxError` before any data."""
        if self._counts is None:
            raise QnnxError(f"{self.method} observer observed no data")
        edges = (self._start + np.arange(self._counts.size + 1, dtype=np.float64)) * self._width
        return self._counts.copy(), edges

    def _update(self, x, mn, mx):
        lo, hi = min(self._min, float(mn)), max(self._max, float(mx))
        bins = self.config.bins
        if self._counts is None:
            width = _fit_width(lo, hi, bins, 0.0)
            start = float(math.floor(lo / width))
            weighted = self.config.channel_balance or self._fixed is not None
            self._counts = np.zeros(bins, dtype=np.float64 if weighted else np.int64)
        else:
            width = _fit_width(lo, hi, bins, self._width)
            start = float(math.floor(lo / width))
            if (width, start) != (self._width, self._start):  # the batch fell outside the window
                self._counts = _regrid(self._counts, self._width, self._start, width, start)
        self._width, self._start, self._min, self._max = width, start, lo, hi
        weights = _channel_weights(x, self.config.balance_axis, self.config.channel_balance) \
            if self.config.channel_balance else None
        if self._fixed is not None:
            weights = self._with_fixed_weights(x, weights)
        self._counts += _bin_counts(x, width, start, bins, weights)

    def _with_fixed_weights(self, x: np.ndarray, weights):
        axis = self.config.balance_axis
        if x.ndim < 2 or not -x.ndim <= axis < x.ndim or x.shape[axis] != self._fixed.size:
            raise QnnxError(f"channel_weights has {self._fixed.size} entries but the tensor of shape "
                            f"{list(x.shape)} has {x.shape[axis] if -x.ndim <= axis < x.ndim else 'no'} "
                            f"channels along axis {axis}")
        if weights is None:
            return self._fixed, math.prod(x.shape[normalize_axis(axis, x.ndim) + 1:])
        return weights[0] * self._fixed, weights[1]

    def _merge_state(self, other):
        lo, hi = min(self._min, other._min), max(self._max, other._max)
        width = _fit_width(lo, hi, self.config.bins, max(self._width, other._width))
        start = float(math.floor(lo / width))
        self._counts = (_regrid(self._counts, self._width, self._start, width, start)
                        + _regrid(other._counts, other._width, other._start, width, start))
        self._width, self._start, self._min, self._max = width, start, lo, hi

    def _range(self):
        if self._min == self._max:
            # A constant tensor: nothing to clip, and the methods' models (KL of a spread, uniform
            # rounding noise) would trim it by up to a bin; keep the value exactly representable.
            return self._min, self._max
        return self._clipping_range()

    def _clipping_range(self) -> tuple[float, float]:
        raise NotImplementedError

    # -- views of the histogram used by the methods

    def _zero_covering(self) -> tuple[np.ndarray, float, float]:
        """(counts, width, start) coarsened as needed so that the window contains 0 too."""
        lo, hi = min(self._min, 0.0), max(self._max, 0.0)
        width = _fit_width(lo, hi, self.config.bins, self._width)
        start = float(math.floor(lo / width))
        if (width, start) == (self._width, self._start):
            return self._counts, width, start
        return _regrid(self._counts, self._width, self._start, width, start), width, start

    def _abs_histogram(self) -> tuple[np.ndarray, float]:
        """Histogram of ``|x|``: bin ``a`` is ``[a*w, (a+1)*w)``, trimmed after the last nonzero bin.

        Folding is exact because the grid is anchored at 0: bin ``g < 0`` (``[g*w, (g+1)*w)``) holds
        ``|x|`` in ``(-(g+1)*w, -g*w]``, i.e. bin ``-g-1`` up to which side an edge value falls.
        """
        counts, width, start = self._zero_covering()
        g = start + np.arange(counts.size)
        a = np.where(g >= 0, g, -g - 1).astype(np.intp)
        folded = np.zeros(int(a.max()) + 1, dtype=counts.dtype)
        np.add.at(folded, a, counts)
        return folded[: int(np.flatnonzero(folded)[-1]) + 1], width

    def _amax(self) -> float:
        return max(-self._min, self._max)

    def _clip_to_data(self, lo: float, hi: float) -> tuple[float, float]:
        return max(lo, self._min), min(hi, self._max)

    def _levels(self) -> int:
        """Quantization levels that cover ``[0, T]`` for a threshold T on ``|x|``: the whole grid when
        the range is one-sided (asymmetric, data of one sign: 0 sits at an end), half otherwise."""
        qmin, qmax = quant_range(self.config.dtype, self.config.reduce_range)
        levels = qmax - qmin + 1
        one_sided = not self.config.symmetric and (self._min >= 0 or self._max <= 0)
        return levels if one_sided else levels // 2


def _hist_quantile(counts: np.ndarray, width: float, start: float, q: float) -> float:
    """Value below which a fraction ``q`` of the mass lies, interpolating linearly inside a bin."""
    cdf = np.cumsum(counts)
    rank = q * float(cdf[-1])
    b = min(int(np.searchsorted(cdf, rank, side="left")), counts.size - 1)
    before = float(cdf[b - 1]) if b else 0.0
    frac = (rank - before) / float(counts[b]) if counts[b] else 1.0
    return (start + b + min(max(frac, 0.0), 1.0)) * width


@register_observer("percentile")
class PercentileObserver(HistogramObserver):
    """Clip at a percentile, from the histogram (linear interpolation inside a bin).

    Symmetric: ``T`` = the ``percentile``-th percentile of ``|x|``, range ``[-T, T]`` (clipped
    to the data). Asymmetric: the clipped mass ``100 - percentile`` percent is split between the
    tails, as ONNX Runtime's PercentileCalibrater: ``lo``, ``hi`` = the ``(100 - p) / 2`` and
    ``100 - (100 - p) / 2`` percentiles of ``x``. ``percentile=100`` gives the exact min/max.
    Resolution: one histogram bin (under ``2 * (max - min) / bins``).
    """

    def _clipping_range(self):
        p = float(self.config.percentile)
        if p == 100.0:
            return self._min, self._max
        if self.config.symmetric:
            hist, width = self._abs_histogram()
            t = min(_hist_quantile(hist, width, 0.0, p / 100.0), self._amax())
            return self._clip_to_data(-t, t)
        tail = (100.0 - p) / 200.0
        lo = _hist_quantile(self._counts, self._width, self._start, tail)
        hi = _hist_quantile(self._counts, self._width, self._start, 1.0 - tail)
        return self._clip_to_data(lo, hi)


def _xlogx(v: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(v > 0, v * np.log(np.where(v > 0, v, 1.0)), 0.0)


KL_EPS = 1e-4  # counts given to an empty last group of Q (ORT's / MXNet's smoothing epsilon)
# KL values this close are equal: the evaluation's rounding error (terms of order log(total) ~ 10
# cancelling) is ~1e-14, and real differences between candidates are far larger.
KL_TIE = 1e-12


def _kl_inner_p_log_q(csum: np.ndarray, cnz: np.ndarray, widths: np.ndarray, levels: int) -> np.ndarray:
    """``sum_j p_j log q_j`` (unnormalised) over the first ``levels - 1`` groups of Q, for each group
    width in ``widths``: those groups, ``[k*g, (k+1)*g)``, depend only on ``g = i // levels``, so the
    ~``n / levels`` distinct widths cover every candidate ``i`` (P equals the histogram there; only
    the last group varies with ``i``). Groups without mass contribute nothing."""
    bounds = widths[:, None] * np.arange(levels)[None, :]
    mass = np.diff(csum[bounds], axis=1)
    nonzero = np.diff(cnz[bounds], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(mass > 0, mass / np.maximum(nonzero, 1), 1.0)
    return np.einsum("ij,ij->i", mass, np.log(ratio))


def kl_threshold_bins(hist: np.ndarray, levels: int) -> int:
    """TensorRT's entropy calibration on a histogram of ``|x|``: the number ``i >= levels`` of
    leading bins to keep that minimises ``KL(P || Q)``.

    For each candidate ``i``: ``P`` = the first ``i`` bins, the clipped mass added to bin ``i-1``;
    ``Q`` = the first ``i`` bins merged into ``levels`` groups of ``i // levels`` bins (the last
    group takes the remainder), each group's mass spread evenly over the group's bins where ``P``
    is nonzero (zero elsewhere). Both normalised.

    ``Q`` is nonzero wherever ``P`` is, except in one case: the last group is empty but clipped mass
    was folded into it (the typical "clip the outliers" candidate). There ``Q`` gets ``KL_EPS``
    (1e-4) counts, the epsilon of ORT's/MXNet's ``smooth_distribution``, so clipping a mass ``m`` of
    outliers costs about ``m/total * log(m / KL_EPS)`` instead of an infinite divergence; no other
    smoothing is needed. A candidate that keeps no mass at all (``P`` all clipped) is never chosen
    (ORT: ``smooth_distribution`` returns None, divergence inf).

    Evaluated for all candidates at once with prefix sums (no loop over candidates); the groups
    before the last are shared by every candidate with the same group width, so they are summed once
    per width (a 2048-bin histogram has 16 widths for 1921 candidates). Returns
    ``len(hist)`` (no clipping) when ``len(hist) <= levels``. The smallest threshold it can pick is
    ``levels`` bins of ``|x|``: resolution comes from the histogram (raise ``bins`` for tensors whose
    outliers are hundreds of times the typical magnitude).
    """
    h = np.asarray(hist, dtype=np.float64)
    n = h.size
    if n <= levels:
        return n
    i = np.arange(levels, n + 1)
    g = i // levels  # bins per group; the last group is [(levels - 1) * g, i)
    zero = np.zeros(1)
    csum = np.concatenate([zero, np.cumsum(h)])
    cnz = np.concatenate([zero, np.cumsum(h > 0)])
    chl = np.concatenate([zero, np.cumsum(_xlogx(h))])
    total = csum[n]
    clipped = total - csum[i]
    last = h[i - 1]
    widths, which = np.unique(g, return_inverse=True)
    inner = _kl_inner_p_log_q(csum, cnz, widths, levels)[which]
    start = (levels - 1) * g
    q_last = csum[i] - csum[start]  # Q's mass in the last group
    nz_last = cnz[i] - cnz[start] + ((last == 0) & (clipped > 0))  # bins where P is nonzero there
    p_last = q_last + clipped  # P's mass in the last group
    empty_last = (q_last == 0) & (clipped > 0)  # then nz_last == 1: only bin i-1
    q_last = np.where(empty_last, KL_EPS, q_last)
    q_total = csum[i] + np.where(empty_last, KL_EPS, 0.0)
    p_log_p = chl[i] - _xlogx(last) + _xlogx(last + clipped)
    with np.errstate(divide="ignore", invalid="ignore"):
        # sum_j p_j log q_j, with q_j = group mass / nonzero bins inside a group (unnormalised)
        p_log_q = inner + np.where(p_last > 0, p_last * np.log(q_last / np.maximum(nz_last, 1)), 0.0)
        # KL = sum P log P - sum P log Q with P = p / total, Q = q / sum(q)
        kl = (p_log_p - p_log_q) / total - np.log(total) + np.log(q_total)
    kl = np.where(np.isfinite(kl) & (csum[i] > 0), kl, np.inf)
    # Candidates whose KL ties with the minimum up to float rounding: on sparse histograms P can equal Q
    # for thresholds that clip most of the mass, and argmin alone let the summation order's last bit
    # choose (one 14-value histogram: 228 bins kept, clipping 76% of it, vs all 1834). Among ties: the
    # least clipped mass, then the fewest bins (thresholds over empty bins tie too; they only coarsen).
    ties = np.flatnonzero(kl <= kl.min() + KL_TIE)
    least = ties[clipped[ties] <= clipped[ties].min()]
    return int(i[least[0]])


@register_observer("entropy")
class EntropyObserver(HistogramObserver):
    """KL-divergence calibration (TensorRT; ONNX Runtime's EntropyCalibrater), see :func:`kl_threshold_bins`.

    The search runs on the histogram of ``|x|`` for both modes; the threshold ``T`` (the upper
    edge of the last kept bin, at most ``max|x|``) gives ``[-T, T]`` clipped to the data. For
    asymmetric configs the same ``T`` is applied to both sides (ORT does the same: one threshold
    on a histogram centred at 0), with ``levels`` = the full grid when the data has one sign (0 at
    an end of the range, e.g. ReLU outputs) and half of it otherwise.

    With 16-bit types (32768+ levels) the quantization grid is finer than any histogram of at most
    ``bins`` bins; KL cannot see rounding noise there and the range is the full ``[min, max]``.
    """

    def _clipping_range(self):
        hist, width = self._abs_histogram()
        keep = kl_threshold_bins(hist, self._levels())
        t = min(keep * width, self._amax())
        return self._clip_to_data(-t, t)


def _capped(candidates: np.ndarray, cap: int = 512) -> np.ndarray:
    """At most ``cap`` evenly spread candidates, both ends kept (bounds the 2-D search to cap**2)."""
    if candidates.size <= cap:
        return candidates
    return candidates[np.unique(np.linspace(0, candidates.size - 1, cap).round().astype(np.intp))]


@register_observer("mse")
class MSEObserver(HistogramObserver):
    """The clipping range minimising the expected squared quantization error, from the histogram.

    Every bin's mass sits at its centre ``c``. For a range with step ``s`` (as
    :func:`qparams_from_range` would compute it): a value inside costs the uniform rounding noise
    ``s**2 / 12``; a value outside costs its clipping error ``(c - bound)**2``. Candidates are the
    histogram edges (plus the exact data extremes), so the cost of every candidate comes from
    prefix sums of counts, ``c`` and ``c**2``.

    Symmetric: one threshold ``T`` on ``|x|`` (step ``T / ((qmax - qmin) / 2)``, clipping at ``T``;
    the half-step asymmetry of the symmetric grid is ignored). Asymmetric: all pairs
    ``lo <= 0 <= hi`` of at most 512 candidates per side (step ``(hi - lo) / (qmax - qmin)``).

    ``negative_lobe`` r > 0 (asymmetric): when ``-min < r * max``, ``lo`` is the data's minimum. A
    SiLU output's negative side is its flat minimum (-0.278), where a large share of the values can sit
    (docs/experiments.md, "Ranges and observers"); with a step wider than that lobe the mse optimum clips it
    to 0, and every one of those values moves the same way: a shift the rounding-noise model counts as
    independent errors. Keeping the lobe costs at most ``r`` of the resolution.
    """

    def _clipping_range(self):
        qmin, qmax = quant_range(self.config.dtype, self.config.reduce_range)
        fn = CONSUMER_FUNCTIONS[self.config.consumer]
        if fn is not None:
            return self._consumer_range(fn, qmax - qmin)
        if self.config.symmetric:
            return self._symmetric_range((qmax - qmin) / 2)
        return self._asymmetric_range(qmax - qmin)

    def _consumer_range(self, fn, steps: int):
        """The range minimising the expected squared error of ``f(x)`` (``config.consumer``): bin mass at
        its centre ``c``; inside, rounding noise ``f'(c)**2 * step**2 / 12``; outside, ``(f(c) - f(bound))**2``;
        plus :data:`CONSUMER_IDENTITY_WEIGHT` times the plain error of ``x``, so a range never collapses
        where ``f`` is flat. Candidates as the plain method; symmetric ranges are the pairs ``(-T, T)``."""
        counts, width, start = self._zero_covering()
        h = counts.astype(np.float64)
        x = (start + np.arange(h.size) + 0.5) * width
        fx, slope = fn(x)
        zero = np.zeros(1)

        def prefix(v):
            return np.concatenate([zero, np.cumsum(v)])

        n = prefix(h)
        sums = [(fn, prefix(h * fx), prefix(h * fx * fx), prefix(h * slope * slope), 1.0),
                (lambda v: (v, None), prefix(h * x), prefix(h * x * x), n, CONSUMER_IDENTITY_WEIGHT)]
        first, last = int(np.flatnonzero(h)[0]), int(np.flatnonzero(h)[-1])
        zero_bin = int(-start)
        if self.config.symmetric:
            reach = max(zero_bin - first, last + 1 - zero_bin)
            k = np.arange(1, reach + 1)
            hi_val = k * width
            hi_val[-1] = self._amax()
            lo_idx, hi_idx = np.clip(zero_bin - k, 0, h.size), np.clip(zero_bin + k, 0, h.size)
            lo_idx[-1], hi_idx[-1] = 0, h.size
            lo_val = -hi_val
        else:
            lo_idx = np.concatenate([[first], np.arange(max(first + 1, 0), zero_bin + 1)])
            lo_val = np.concatenate([[min(self._min, 0.0)], (start + lo_idx[1:]) * width])
            hi_idx = np.concatenate([np.arange(zero_bin, last + 1), [last + 1]])
            hi_val = np.concatenate([(start + hi_idx[:-1]) * width, [max(self._max, 0.0)]])
            sel = _capped(np.arange(lo_idx.size))
            lo_idx, lo_val = lo_idx[sel, None], lo_val[sel, None]
            sel = _capped(np.arange(hi_idx.size))
            hi_idx, hi_val = hi_idx[None, sel], hi_val[None, sel]
        step = (hi_val - lo_val) / steps
        cost = 0.0
        for f, s1, s2, noise, weight in sums:
            f_lo, f_hi = f(lo_val)[0], f(hi_val)[0]
            left = f_lo * f_lo * n[lo_idx] - 2 * f_lo * s1[lo_idx] + s2[lo_idx]
            right = (s2[-1] - s2[hi_idx]) - 2 * f_hi * (s1[-1] - s1[hi_idx]) + f_hi * f_hi * (n[-1] - n[hi_idx])
            cost = cost + weight * (left + right + step * step / 12 * (noise[hi_idx] - noise[lo_idx]))
        best = np.unravel_index(int(np.argmin(cost)), np.shape(cost))
        lo, hi = np.broadcast_arrays(lo_val, hi_val)
        return self._clip_to_data(float(lo[best]), float(hi[best]))

    def _symmetric_range(self, half_steps: float):
        hist, width = self._abs_histogram()
        h = hist.astype(np.float64)
        c = np.arange(h.size) + 0.5  # bin centres, in bin widths
        zero = np.zeros(1)
        n = np.concatenate([zero, np.cumsum(h)])
        s1 = np.concatenate([zero, np.cumsum(h * c)])
        s2 = np.concatenate([zero, np.cumsum(h * c * c)])
        # thresholds: every inner edge k (bins < k kept), then the exact max|x| (nothing clipped)
        k = np.arange(1, h.size + 1)
        t = k.astype(np.float64)
        t[-1] = self._amax() / width
        out_n, out_s1, out_s2 = n[-1] - n[k], s1[-1] - s1[k], s2[-1] - s2[k]
        clip = out_s2 - 2 * t * out_s1 + t * t * out_n
        noise = (t / half_steps) ** 2 / 12 * n[k]
        best = float(t[int(np.argmin(clip + noise))]) * width
        return self._clip_to_data(-best, best)

    def _asymmetric_range(self, steps: int):
        counts, width, start = self._zero_covering()
        h = counts.astype(np.float64)
        c = start + np.arange(h.size) + 0.5  # bin centres in bin widths (|c| <= bins: well scaled)
        zero = np.zeros(1)
        n = np.concatenate([zero, np.cumsum(h)])
        s1 = np.concatenate([zero, np.cumsum(h * c)])
        s2 = np.concatenate([zero, np.cumsum(h * c * c)])
        first = int(np.flatnonzero(h)[0])
        last = int(np.flatnonzero(h)[-1])
        zero_bin = int(-start)  # local index of the bin [0, w)
        lo_min = min(self._min, 0.0) / width
        hi_max = max(self._max, 0.0) / width
        # (value in bin widths, local index of the first kept bin / one past the last kept bin)
        lo_idx = np.arange(max(first + 1, 0), zero_bin + 1)
        lo_val = start + lo_idx.astype(np.float64)
        lo_idx = np.concatenate([[first], lo_idx])
        lo_val = np.concatenate([[lo_min], lo_val])
        hi_idx = np.arange(zero_bin, last + 1)
        hi_val = start + hi_idx.astype(np.float64)
        hi_idx = np.concatenate([hi_idx, [last + 1]])
        hi_val = np.concatenate([hi_val, [hi_max]])
        sel = _capped(np.arange(lo_idx.size))
        lo_idx, lo_val = lo_idx[sel], lo_val[sel]
        if self._min < 0 and -self._min < self.config.negative_lobe * self._max:
            lo_idx, lo_val = lo_idx[:1], lo_val[:1]  # the exact minimum only: nothing clipped below
        sel = _capped(np.arange(hi_idx.size))
        hi_idx, hi_val = hi_idx[sel], hi_val[sel]
        left = lo_val * lo_val * n[lo_idx] - 2 * lo_val * s1[lo_idx] + s2[lo_idx]
        out_n, out_s1, out_s2 = n[-1] - n[hi_idx], s1[-1] - s1[hi_idx], s2[-1] - s2[hi_idx]
        right = out_s2 - 2 * hi_val * out_s1 + hi_val * hi_val * out_n
        inside = n[hi_idx][None, :] - n[lo_idx][:, None]
        step = (hi_val[None, :] - lo_val[:, None]) / steps
        cost = left[:, None] + right[None, :] + step * step / 12 * inside
        a, b = np.unravel_index(int(np.argmin(cost)), cost.shape)
        return self._clip_to_data(float(lo_val[a]) * width, float(hi_val[b]) * width)
