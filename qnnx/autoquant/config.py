"""Typed configuration of automatic static quantization: frozen, validated, unknown keys raise.

``QuantConfig`` holds the user's intent (which types, which granularity, what to leave float) and
three sections of algorithm options, each a frozen dataclass of its own:

    ranges       how activation ranges are chosen (observer method and its parameters)
    calibration  which samples, which calibrator (float, sequential, error-propagating), batching
    refinements  the optional steps after realization (smoothing before planning, weight rounding,
                 bias correction, SQNR and speed fallbacks)

Every section field may also be given by name at the top level (``QuantConfig(method="minmax")``):
the names are unique across sections, so it routes to the one section that owns it. Why each default
is what it is, with the measurements, is in docs/experiments.md (the current results: docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from qnnx.calibrate.observers import CONSUMER_FUNCTIONS, OBSERVERS, HistogramObserver
from qnnx.errors import QnnxError
from qnnx.targets import per_channel_depthwise, weight_grid

METHODS = tuple(OBSERVERS)  # the registered observers, one per calibration method
HISTOGRAM_METHODS = tuple(m for m, cls in OBSERVERS.items() if issubclass(cls, HistogramObserver))
ACTIVATION_DTYPES = ("uint8", "int8", "uint16", "int16")
WEIGHT_DTYPES = ("int8",)
WEIGHT_BITS = (7, 8, "pairs")
CALIBRATORS = ("float", "sequential", "propagate_error")
SPEED_FALLBACKS = ("off", "auto", "on")
WEIGHT_ROUNDINGS = ("nearest", "gptq", "gptq_all")
SMOOTHING_SITES = ("norms", "matmuls")
BIAS_CORRECTIONS = ("off", "own", "sequential")
SYMMETRIC_ACTIVATIONS = ("off", "auto")
DEPTHWISE_INPUTS = ("per_tensor", "per_channel")
CONSUMER_FUNCTION_NAMES = tuple(f for f in CONSUMER_FUNCTIONS if f != "identity")


@dataclass(frozen=True)
class Preset:
    """A named set of option values for one kind of model on given targets (``QuantConfig.with_preset``).

    ``options``: top-level or section field names and their values; ``targets``: where they were measured
    (docs/benchmarks.md), the only targets the preset may be used for.
    """

    options: tuple[tuple[str, object], ...]
    targets: tuple[str, ...]
    about: str


# transformer: every MatMul input smoothed, pair-limited GPTQ-rounded MatMul/Gemm weights (docs/benchmarks.md,
# "A transformer recipe"); as NNCF's model_type=TRANSFORMER, chosen by the user; measured better than the
# defaults on BERT-like encoders, worse on a ViT ("Three new kinds of model").
PRESETS = {
    "transformer": Preset((("smoothing_sites", "matmuls"), ("smoothing_alpha", 0.8), ("weight_bits", "pairs"),
                           ("weight_rounding", "gptq_all")), targets=("openvino",),
                          about="BERT-like transformer encoders on OpenVINO: every MatMul input smoothed (alpha "
                                "0.8), MatMul/Gemm weights pair-limited 8-bit and GPTQ-rounded"),
}


def _choice(name: str, value, allowed: tuple) -> None:
    if value not in allowed:
        raise QnnxError(f"{name} must be one of {', '.join(map(str, allowed))}, got {value!r}")


def _names(name: str, value) -> tuple[str, ...]:
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise QnnxError(f"{name} must be a sequence of names")
    return tuple(value)


@dataclass(frozen=True)
class RangeOptions:
    """How each activation's range is chosen from its observed values.

    ``method``: the observer (calibrate.observers). ``percentile``: for "percentile".
    ``consumer_functions``: with "mse", an activation read only by one of these elementwise
    functions is judged by the error of the function's output (autoquant.consumers).
    ``consumer_weighting``: histogram methods, an activation read only by convolutions weighs each
    channel by the squared norm of the weights reading it (the convs' output error, not its own).
    ``silu_lobe``: with "mse" on asymmetric types, a SiLU output whose negative side is narrower than
    this fraction of its positive one keeps that side whole; 0: off.
    ``channel_balance``: histogram methods, weight of loud channels, min(1, median ms / ms_c) ** b; 0: off.
    ``depthwise_inputs``: "per_channel" gives a value read only by depthwise convs one min-max range per
    channel (axis 1), on a target whose depthwise kernels take them (OpenVINO); "per_tensor": one range.
    """

    method: str = "mse"
    percentile: float = 99.999
    consumer_functions: tuple[str, ...] = ("silu", "sigmoid")
    consumer_weighting: bool = True
    silu_lobe: float = 0.01
    channel_balance: float = 0.0
    depthwise_inputs: str = "per_tensor"

    def __post_init__(self):
        _choice("method", self.method, METHODS)
        _choice("depthwise_inputs", self.depthwise_inputs, DEPTHWISE_INPUTS)
        if not 0 < self.percentile <= 100:
            raise QnnxError(f"percentile must be in (0, 100], got {self.percentile}")
        object.__setattr__(self, "consumer_functions", _names("consumer_functions", self.consumer_functions))
        unknown = [f for f in self.consumer_functions if f not in CONSUMER_FUNCTION_NAMES]
        if unknown:
            raise QnnxError(f"unknown consumer function(s) {', '.join(map(repr, unknown))}; expected some of "
                            f"{', '.join(CONSUMER_FUNCTION_NAMES)}")
        if not isinstance(self.consumer_weighting, bool):
            raise QnnxError(f"consumer_weighting must be True or False, got {self.consumer_weighting!r}")
        if not (isinstance(self.silu_lobe, (int, float)) and 0 <= self.silu_lobe < 1):
            raise QnnxError(f"silu_lobe must be in [0, 1), got {self.silu_lobe!r}")
        if not (isinstance(self.channel_balance, (int, float)) and 0 <= self.channel_balance <= 1):
            raise QnnxError(f"channel_balance must be in [0, 1], got {self.channel_balance!r}")
        if self.channel_balance and self.method not in HISTOGRAM_METHODS:
            raise QnnxError(f"channel_balance needs a histogram method ({', '.join(HISTOGRAM_METHODS)}), "
                            f"not {self.method!r}")

    @property
    def histogram(self) -> bool:
        return self.method in HISTOGRAM_METHODS


@dataclass(frozen=True)
class CalibrationOptions:
    """Which samples calibrate, and how.

    ``num_samples``/``seed``: at most this many samples (a seeded subset of a directory).
    ``calibrator``: "float" observes the float model in one pass; "sequential" chooses qparams in
    ``sequential_passes`` topological stages on the simulated model with the prefix quantized;
    "propagate_error" adds a second pass on the simulated model fed the first pass's qparams.
    ``batch_size``: samples of one shape run as one batch when the model allows it (1: off).
    ``refinement_samples``: the first samples, which the refinements and the report's output check use.
    ``validation``: hold out this many calibration samples (an int) or this fraction of them (a float),
    spread evenly, and keep a range method or refinement only when it lowers the error on them
    (autoquant/validation.py); None: no held-out validation unless validation data is given.
    """

    num_samples: int | None = None
    seed: int | None = 0
    calibrator: str = "float"
    sequential_passes: int = 4
    batch_size: int = 16
    refinement_samples: int = 8
    validation: int | float | None = None

    def __post_init__(self):
        _choice("calibrator", self.calibrator, CALIBRATORS)
        v = self.validation
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or (isinstance(v, float) and not 0 < v < 1) or (isinstance(v, int) and v < 1)):
            raise QnnxError(f"validation must be a count >= 1 or a fraction in (0, 1), got {v!r}")
        if not 1 <= self.sequential_passes <= 64:
            raise QnnxError(f"sequential_passes must be in [1, 64], got {self.sequential_passes}")
        for name in ("batch_size", "refinement_samples"):
            if getattr(self, name) < 1:
                raise QnnxError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_samples is not None and self.num_samples < 1:
            raise QnnxError(f"num_samples must be >= 1, got {self.num_samples}")

    @property
    def passes(self) -> int:
        """How many times the calibrator reads the data."""
        return {"float": 1, "propagate_error": 2, "sequential": self.sequential_passes}[self.calibrator]


@dataclass(frozen=True)
class RefinementOptions:
    """The optional steps, each a module of autoquant/refinements (smoothing is a transform of the
    float model before planning).

    ``smoothing_alpha``: SmoothQuant strength; None: off.
    ``smoothing_sites``: "norms" smooths LayerNorm outputs read by MatMuls; "matmuls" every activation a
    MatMul with a constant weight reads (a value projection or a new Mul divides it where no norm can; new
    Muls only on a target that folds them into its quantizers: OpenVINO).
    ``weight_rounding``: "gptq" rounds conv weights for the conv's output error, the others nearest;
    "gptq_all" MatMul and Gemm weights too; "nearest" each weight alone.
    ``bias_correction``: "sequential" folds each conv's mean output shift against float into its bias,
    stage by stage; "own" its own rounding error; "off".
    ``sqnr_threshold_db``: patterns whose output SQNR is below this stay float; None: off.
    ``speed_fallback``: "on" times float and int8 variants on the target and leaves slower kinds of
    layers float; "auto" only when int8 is not clearly faster; "off" (default) never times, so the
    same inputs give the same model.
    ``speed_plan``: replay a speed fallback's decisions without timing: the kinds of patterns to leave float
    (``SpeedReport.plan()`` of an earlier run; ("all",): the whole model), so the output is reproducible.
    ``min_sqnr_db`` / ``min_cosine``: an accuracy target for every output against float (on the held-out
    samples, else the refinement samples); the costliest patterns return to float until it is met.
    ``max_drop``: with a metric given to ``quantize(metric=...)``, the largest drop of the metric on the
    held-out samples against the float model's (absolute, in the metric's units; 0.01 when a metric is
    given without it); the costliest patterns return to float until it is met.
    ``symmetric_activations``: "auto" tries zero point 0 on the quantized inputs on a target whose kernels run
    them faster (OpenVINO), kept only when the target's outputs stay as close to float; "off" (default).
    ``accuracy_guard``: True (default) returns the patterns that add the most error to float while an output
    is far from float (the report's bounds, 6 dB / 0.9) or misses the target above, and refuses a model
    whose outputs still end far from float; False writes it whatever its outputs (the report warns).
    """

    smoothing_alpha: float | None = 0.5
    smoothing_sites: str = "norms"
    weight_rounding: str = "gptq"
    bias_correction: str = "sequential"
    sqnr_threshold_db: float | None = None
    speed_fallback: str = "off"
    speed_plan: tuple[str, ...] | None = None
    min_sqnr_db: float | None = None
    min_cosine: float | None = None
    max_drop: float | None = None
    accuracy_guard: bool = True
    symmetric_activations: str = "off"

    def __post_init__(self):
        if self.min_cosine is not None and not -1 <= self.min_cosine <= 1:
            raise QnnxError(f"min_cosine must be in [-1, 1], got {self.min_cosine}")
        if self.max_drop is not None and (isinstance(self.max_drop, bool) or not isinstance(self.max_drop, (int, float))
                                          or not 0 <= self.max_drop < float("inf")):
            raise QnnxError(f"max_drop must be a finite number >= 0, got {self.max_drop!r}")
        if self.smoothing_alpha is not None and not 0 < self.smoothing_alpha <= 1:
            raise QnnxError(f"smoothing_alpha must be in (0, 1] or None, got {self.smoothing_alpha}")
        if isinstance(self.speed_fallback, bool):
            object.__setattr__(self, "speed_fallback", "on" if self.speed_fallback else "off")
        _choice("speed_fallback", self.speed_fallback, SPEED_FALLBACKS)
        if self.speed_plan is not None:
            object.__setattr__(self, "speed_plan", _names("speed_plan", self.speed_plan))
        if isinstance(self.bias_correction, bool):
            object.__setattr__(self, "bias_correction", "own" if self.bias_correction else "off")
        _choice("bias_correction", self.bias_correction, BIAS_CORRECTIONS)
        _choice("weight_rounding", self.weight_rounding, WEIGHT_ROUNDINGS)
        _choice("smoothing_sites", self.smoothing_sites, SMOOTHING_SITES)
        _choice("symmetric_activations", self.symmetric_activations, SYMMETRIC_ACTIVATIONS)


_SECTIONS = {"ranges": RangeOptions, "calibration": CalibrationOptions, "refinements": RefinementOptions}
_ROUTES = {f.name: section for section, cls in _SECTIONS.items() for f in fields(cls)}


@dataclass(frozen=True, init=False)
class QuantConfig:
    """How to quantize a float model: the intent, then the algorithm sections (module docstring).

    ``activation_dtype`` uint8 (asymmetric: the u8 x s8 form x86 VNNI kernels take), int8, or 16-bit;
    ``weight_dtype`` int8, symmetric, per channel unless ``per_channel`` is False; ``weight_bits``: 7
    (default: every weight in [-64, 64], so that a pair of u8 x s8 products cannot overflow the 16-bit sums
    of the int8 kernels of ONNX Runtime and OpenVINO on x86 without VNNI: the model computes what its
    graph says on every CPU), 8 for hardware whose kernels accumulate in 32 bits, or "pairs" (OpenVINO:
    7-bit convs, MatMul/Gemm weights 8-bit with each same-sign pair on adjacent input channels within
    128, which its kernels pair and sum exactly; ``targets.execution.WeightGrid``); ``exclude_nodes``
    (node names or glob patterns) and ``exclude_op_types`` stay float; ``allow_float``: return a model
    in which nothing ended up quantized instead of failing; ``target``: the runtime the written QDQ
    model is shaped for; ``progress``: progress lines on stderr.
    """

    activation_dtype: str = "uint8"
    activation_symmetric: bool = False
    weight_dtype: str = "int8"
    weight_bits: int | str = 7
    per_channel: bool = True
    exclude_nodes: tuple[str, ...] = ()
    exclude_op_types: tuple[str, ...] = ()
    allow_float: bool = False
    target: str = "onnxruntime"
    progress: bool = True
    ranges: RangeOptions = field(default_factory=RangeOptions)
    calibration: CalibrationOptions = field(default_factory=CalibrationOptions)
    refinements: RefinementOptions = field(default_factory=RefinementOptions)

    def __init__(self, **options):
        own = {f.name for f in fields(self)}
        routed: dict[str, dict] = {s: {} for s in _SECTIONS}
        for key, value in options.items():
            if key in _ROUTES:
                routed[_ROUTES[key]][key] = value
            elif key not in own:
                raise QnnxError(f"unknown QuantConfig option {key!r}")
        for f in fields(self):
            if f.name in _SECTIONS:
                cls = _SECTIONS[f.name]
                given = options.get(f.name, cls())
                if isinstance(given, dict):
                    given = cls(**given) if set(given) <= {g.name for g in fields(cls)} else _unknown(f.name, given)
                if not isinstance(given, cls):
                    raise QnnxError(f"QuantConfig {f.name} must be a {cls.__name__} or a dict")
                object.__setattr__(self, f.name, replace(given, **routed[f.name]) if routed[f.name] else given)
            else:
                object.__setattr__(self, f.name, options.get(f.name, f.default))
        self.__post_init__()

    def __post_init__(self):
        _choice("activation_dtype", self.activation_dtype, ACTIVATION_DTYPES)
        _choice("weight_dtype", self.weight_dtype, WEIGHT_DTYPES)
        _choice("weight_bits", self.weight_bits, WEIGHT_BITS)
        for name in ("exclude_nodes", "exclude_op_types"):
            object.__setattr__(self, name, _names(name, getattr(self, name)))
        for name in ("activation_symmetric", "per_channel", "allow_float", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise QnnxError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not isinstance(self.target, str):
            raise QnnxError(f"target must be a name, got {self.target!r}")
        if self.weight_bits == "pairs":
            weight_grid(self.target, self.weight_bits)  # a target whose kernels' pairing is known
        per_channel_depthwise(self.target, self.ranges.depthwise_inputs, self.per_channel)  # possible here

    def with_preset(self, name: str, keep=()) -> "QuantConfig":
        """A copy with preset ``name``'s option values (``PRESETS``), except the options named in ``keep``
        (the ones a user gave explicitly); a :class:`QnnxError` for an unknown preset or another target."""
        _choice("preset", name, tuple(PRESETS))
        preset = PRESETS[name]
        if self.target not in preset.targets:
            raise QnnxError(f"preset {name!r} was measured for target {', '.join(preset.targets)} only, "
                            f"not {self.target}: give its options one by one to use them there")
        return self.with_options(**{k: v for k, v in preset.options if k not in set(keep)})

    def with_options(self, **options) -> "QuantConfig":
        """A copy with ``options`` (top-level or section field names) changed."""
        current = {f.name: getattr(self, f.name) for f in fields(self)}
        for key, value in options.items():
            if key in _ROUTES:
                section = _ROUTES[key]
                current[section] = replace(current[section], **{key: value})
            elif key in current:
                current[key] = value
            else:
                raise QnnxError(f"unknown QuantConfig option {key!r}")
        return QuantConfig(**current)

    @classmethod
    def from_dict(cls, values: dict) -> "QuantConfig":
        """From a (JSON) dict of top-level, section or nested section options; unknown keys raise."""
        return cls(**values)

    def as_dict(self) -> dict:
        """Every option, nested by section (for reports and replay)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _SECTIONS}
        for section in _SECTIONS:
            value = getattr(self, section)
            out[section] = {f.name: getattr(value, f.name) for f in fields(value)}
        return out


def _unknown(section: str, given: dict):
    cls = _SECTIONS[section]
    bad = sorted(set(given) - {f.name for f in fields(cls)})
    raise QnnxError(f"unknown {section} option(s): {', '.join(bad)}")
