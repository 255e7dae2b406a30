"""Typed configuration of automatic static quantization (frozen, validated; unknown keys raise)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from qnnx.autoquant.channel_padding import PaddingRecord
from qnnx.autoquant.bias_correction import CorrectionCheck, CorrectionRecord
from qnnx.autoquant.consumers import RECOGNIZERS as CONSUMER_FUNCTIONS
from qnnx.autoquant.weight_rounding import RoundingRecord
from qnnx.errors import QnnxError

METHODS = ("minmax", "moving_average", "percentile", "entropy", "mse")
HISTOGRAM_METHODS = ("percentile", "entropy", "mse")
ACTIVATION_DTYPES = ("uint8", "int8", "uint16", "int16")
WEIGHT_DTYPES = ("int8",)
CALIBRATIONS = ("float", "sequential")
SPEED_FALLBACKS = ("auto", "on", "off")
WEIGHT_ROUNDINGS = ("nearest", "gptq")
BIAS_CORRECTIONS = ("off", "own", "sequential")


@dataclass(frozen=True)
class QuantConfig:
    """How to quantize a float model.

    Defaults were chosen on the real models in ``bench/`` (32 calibration samples): uint8
    asymmetric activations (the u8 x s8 form x86 VNNI/AMX kernels take), int8 symmetric
    per-channel weights, mse calibration. Char accuracy on PP-OCR rec (48 lines, fp32 98.9%):
    mse 99.2%, percentile 99.999 95.9%, 99.99 92.4%, minmax 88.8%; PP-OCR det boxes vs fp32:
    mse identical, percentile 99.999 hmean 0.994. PP-OCR cls (64 crops, fp32 96.9%) prefers
    percentile 99.999 (95.3%) over mse (90.6%); entropy loses badly on one-sided tensors.
    """

    method: str = "mse"
    percentile: float = 99.999
    activation_dtype: str = "uint8"
    activation_symmetric: bool = False
    weight_dtype: str = "int8"
    per_channel: bool = True
    exclude_nodes: tuple[str, ...] = ()
    exclude_op_types: tuple[str, ...] = ()
    num_samples: int | None = None  # None: all calibration samples
    seed: int | None = 0  # picks the calibration files when num_samples < the files in a directory
    sqnr_threshold_db: float | None = None  # patterns whose output SQNR is below this stay float
    # Error propagation (seed 002): a second calibration pass observes every activation in the model
    # quantized with the first pass's qparams, so each layer's range sees the error of the layers before.
    # Off by default: on 64 samples it moved PP-OCR cls 90.6% -> 93.8% but rec 98.6% -> 95.8%.
    propagate_error: bool = False
    # "float": every activation observed in the float model (one pass). "sequential" (seed 002's
    # topological calibration): groups of activations in topological order, each observed on the
    # simulated model with everything before it already quantized; one pass over the data per stage
    # (``sequential_passes`` stages), each pass costing ~3.5x a float pass (the simulated model).
    # Off by default: PP-OCR rec char accuracy (32 samples, 3 calibration sets) 99.26/97.86/98.40 ->
    # 98.26/98.30/98.74 with 4 stages (mean 98.51 -> 98.44, less spread), quantize 9 s -> 35 s; 8 stages
    # 82.1/98.0/14.9: ranges observed on the quantized prefix keep its error (a depthwise conv output
    # doubles, max 11 -> 22) where ranges from the float model clip it, and the next stages compound it.
    calibration: str = "float"
    sequential_passes: int = 4
    fallback_samples: int = 8  # calibration samples kept for the SQNR fallback and bias correction
    # Samples of one shape concatenated along the batch axis into one ONNX Runtime run and one observe per
    # tensor: minmax and histogram observers are partition-invariant (bins on a power-of-two grid), so this
    # is the same statistic with fewer, larger calls. Used only when every model input has a dynamic batch
    # axis, the observers allow it (not moving_average) and the first batch's outputs match the first
    # sample run alone; 1 turns it off.
    calibration_batch_size: int = 16
    # Bias correction (bias_correction.py), last, on the ``fallback_samples`` kept from calibration:
    # "sequential" measures each conv's mean output shift against the float model per channel, upstream
    # error included, and folds it into the int32 bias, one topological stage at a time (each stage runs
    # its graph segment once per sample). "own" folds each Conv/Gemm's own error only (weight and bias
    # rounding on its measured input means), from one pass. Measured, with weight_rounding "gptq":
    # PP-OCRv4 rec mean character-accuracy drop (9 sets of 32 lines, 128 evaluation lines) 2.10 points
    # "off", 0.26 "sequential" (2.16 "own" with nearest rounding); YOLOv8n on photos hmean (6 sets)
    # 0.942 "off", 0.938 "sequential" (within the sets' spread); PP-OCRv4 det box hmean 0.994 on 2 sets
    # (fp32 0.993). Cost: rec quantize ~2 s, det ~8 s. True / False mean "own" / "off". Either is undone
    # when the outputs' distance from float (1 - mean per-channel cosine) grows by >10% with it (bias_correction.CorrectionCheck:
    # with other calibration choices it ruined YOLOv8n's class scores).
    bias_correction: str = "sequential"
    # Conv weights (weight_rounding.py): "gptq" rounds the int8 taps of each depthwise and ungrouped conv
    # for the conv's output error on the calibration inputs (``fallback_samples`` of them; GPTQ error
    # feedback, then +-1 polish) and folds the mean error left into the int32 bias; "nearest" rounds each
    # weight alone. Measured on PP-OCRv4 rec (mean character-accuracy drop, 9 calibration sets of 32
    # lines), depthwise convs only: with 16-bit activations (weights the only error) 1.75 -> -0.06 points
    # on one set; with the uint8 defaults it pays only together with the sequential bias correction: 1.72
    # with neither, 2.10 gptq alone, 1.33 sequential correction alone, 0.26 both. Ungrouped convs too
    # (session 13, speed fallback off): rec 0.22 -> 0.19 points; PP-OCR cls (6 sets) 95.8 -> 96.4%; det
    # hmean (sets 0, 1) 0.9943 / 0.9950 -> 0.9957 / 0.9964; YOLOv8n photos (12 sets) 0.954 -> 0.960 (8
    # of 12 better), synthetic scenes (6 sets) 0.868 -> 0.881 (set 1 0.868 -> 0.812: there the sequential
    # bias correction, kept by its check, then shifts the class scores down). Quantization takes longer
    # (defaults, side by side: YOLOv8n 5.4 -> 10.3 s, rec 7.6 -> 9.6 s).
    weight_rounding: str = "gptq"
    # SmoothQuant migration strength for LayerNorm outputs read by MatMuls (smoothing.py), None: off.
    # all-MiniLM-L6-v2 sentence-embedding cosine 0.9923 -> 0.9950 at 0.5; models without LayerNorm
    # -> MatMul are unchanged.
    smoothing_alpha: float | None = 0.5
    # Speed-aware fallback (speed.py): after calibration, time the float model and QDQ variants on ONNX
    # Runtime (CPU, 1 thread, the first calibration sample) and leave kinds of patterns float (depthwise
    # conv, elementwise, ...) where that is >= 3% faster; the whole model stays float unless int8 is >= 3%
    # faster than float. "on": always searched (up to 2 + 2 x kinds timings of ~1 s each). "auto" (the
    # default): searched only when all-int8 is not already speed.AUTO_INT8_SPEEDUP (1.2x) faster than float
    # after one timing, and not at all for graphs under speed.AUTO_MIN_FLOAT_MS per run. Measured: PP-OCR
    # cls all-int8 is 0.9x of fp32 (0.8x before channel padding) and the search makes it 1.0-1.03x
    # (+15 s); rec, det, YOLOv8n and MiniLM are 1.6-2.5x faster in int8 and pay one timing (1-6 s).
    # "off": never timed. True / False mean "on" / "off".
    speed_fallback: str = "auto"
    # With method "mse": an activation read only by one of these elementwise functions (consumers.py)
    # gets the range that minimises the error of the function's output, not of its own, e.g. SiLU's
    # flat negative side clipped for resolution where SiLU is steep. Measured (32 calibration samples):
    # YOLOv8n recall of fp32 detections over 6 calibration sets 0.744 -> 0.778 with "silu"; PP-OCRv4
    # rec mean char-accuracy drop over 9 sets 2.23 -> 2.23 points with "sigmoid" but 2.71 with
    # "hardswish" (the hard-swish bulk within 0-2 matters more downstream than its MSE says), so
    # hard-swish is not in the default. () judges every activation by its own error.
    consumer_functions: tuple[str, ...] = ("silu", "sigmoid")
    # With method "mse", asymmetric types: a SiLU output (consumers.silu_output) whose negative side is
    # narrower than this fraction of its positive one keeps that side whole (ObserverConfig.negative_lobe)
    # instead of clipping SiLU's dense minimum lobe to 0 (43% of YOLOv8n's second SiLU output is in it;
    # its step is wider than the lobe, so mse maps them all to 0, one shift of the same sign). Measured
    # (32 calibration samples, speed fallback off): YOLOv8n agreement with fp32 (hmean) on photos 0.945
    # -> 0.954 over 12 sets (11 better), on synthetic scenes 0.811 -> 0.868 over 6 (all better); fp32
    # class-score error at fp32's detections rms 0.070 -> 0.063, mean -0.029 -> -0.012 (6 sets). The
    # rule on every activation cost PP-OCRv4 rec 0.26 -> 0.39 points (its hard-swish outputs), so it
    # is SiLU's alone; 0.05 measured worse on YOLOv8n (0.942). 0: off.
    silu_lobe: float = 0.01
    # Histogram methods, an activation read only by convolutions (consumers.reader_weight_norms): each
    # channel's values count in its histogram with the squared norm of the weights that read the
    # channel, so the range minimises the convs' output error, not the activation's own. Measured (32
    # calibration samples, 9 sets, 128 evaluation lines, speed fallback off): PP-OCRv4 rec mean
    # char-accuracy drop 2.51 -> 1.72 points (sets 95.3-99.3%; 2.25 with the channel balance used
    # before); YOLOv8n on photos hmean 0.941 -> 0.941 (6 sets; 0.933 with that balance); PP-OCR cls
    # within one crop. Weighing through the elementwise ops before a conv (hard-swish inputs) measured
    # 4.15 points, the norms' square root 2.21, squared 2.63. False: every value counts alike.
    consumer_weighting: bool = True
    # Histogram methods: weight of a loud channel's values in the activation histograms,
    # min(1, median channel mean square / its own) ** channel_balance per batch (observers.py), so a
    # few channels far above the rest no longer set the range of the whole tensor. Measured with
    # "mse" (PP-OCRv4 rec, 9 sets): drop 2.51 points at 0, 2.25 at 0.5 without consumer_weighting,
    # but 3.83 vs 2.12 with it on 3 sets (the two count the loud channels down twice); YOLOv8n photos
    # hmean 0.941 at 0, 0.934 at 0.5; 1.0 ruins rec (12-21% on 3 sets). None: 0 (the default).
    channel_balance: float | None = None
    progress: bool = True

    def __post_init__(self):
        if self.method not in METHODS:
            raise QnnxError(f"unknown calibration method {self.method!r}; expected one of {', '.join(METHODS)}")
        if self.activation_dtype not in ACTIVATION_DTYPES:
            raise QnnxError(f"activation_dtype must be one of {', '.join(ACTIVATION_DTYPES)}")
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise QnnxError(f"weight_dtype must be one of {', '.join(WEIGHT_DTYPES)}")
        if not 0 < self.percentile <= 100:
            raise QnnxError(f"percentile must be in (0, 100], got {self.percentile}")
        if self.smoothing_alpha is not None and not 0 < self.smoothing_alpha <= 1:
            raise QnnxError(f"smoothing_alpha must be in (0, 1] or None, got {self.smoothing_alpha}")
        if isinstance(self.speed_fallback, bool):
            object.__setattr__(self, "speed_fallback", "on" if self.speed_fallback else "off")
        if self.speed_fallback not in SPEED_FALLBACKS:
            raise QnnxError(f"speed_fallback must be one of {', '.join(SPEED_FALLBACKS)} (or True / False), "
                            f"got {self.speed_fallback!r}")
        if isinstance(self.bias_correction, bool):
            object.__setattr__(self, "bias_correction", "own" if self.bias_correction else "off")
        if self.bias_correction not in BIAS_CORRECTIONS:
            raise QnnxError(f"bias_correction must be one of {', '.join(BIAS_CORRECTIONS)} (or True / False), "
                            f"got {self.bias_correction!r}")
        if self.weight_rounding not in WEIGHT_ROUNDINGS:
            raise QnnxError(f"weight_rounding must be one of {', '.join(WEIGHT_ROUNDINGS)}, "
                            f"got {self.weight_rounding!r}")
        if self.calibration not in CALIBRATIONS:
            raise QnnxError(f"unknown calibration {self.calibration!r}; expected one of {', '.join(CALIBRATIONS)}")
        if not 1 <= self.sequential_passes <= 64:
            raise QnnxError(f"sequential_passes must be in [1, 64], got {self.sequential_passes}")
        if self.calibration == "sequential" and self.propagate_error:
            raise QnnxError("propagate_error and calibration='sequential' both observe the quantized model: "
                            "choose one")
        if self.calibration_batch_size < 1:
            raise QnnxError(f"calibration_batch_size must be >= 1, got {self.calibration_batch_size}")
        if self.fallback_samples < 1:
            raise QnnxError(f"fallback_samples must be >= 1, got {self.fallback_samples}")
        if self.num_samples is not None and self.num_samples < 1:
            raise QnnxError(f"num_samples must be >= 1, got {self.num_samples}")
        if self.channel_balance is not None:
            if not (isinstance(self.channel_balance, (int, float)) and 0 <= self.channel_balance <= 1):
                raise QnnxError(f"channel_balance must be in [0, 1] or None, got {self.channel_balance!r}")
            if self.channel_balance and self.method not in HISTOGRAM_METHODS:
                raise QnnxError(f"channel_balance needs a histogram method ({', '.join(HISTOGRAM_METHODS)}), "
                                f"not {self.method!r}")
        if not isinstance(self.consumer_weighting, bool):
            raise QnnxError(f"consumer_weighting must be True or False, got {self.consumer_weighting!r}")
        if isinstance(self.consumer_functions, str) or not all(isinstance(v, str) for v in self.consumer_functions):
            raise QnnxError("consumer_functions must be a sequence of names")
        object.__setattr__(self, "consumer_functions", tuple(self.consumer_functions))
        unknown = [f for f in self.consumer_functions if f not in CONSUMER_FUNCTIONS]
        if unknown:
            raise QnnxError(f"unknown consumer function(s) {', '.join(map(repr, unknown))}; expected some of "
                            f"{', '.join(CONSUMER_FUNCTIONS)}")
        if not (isinstance(self.silu_lobe, (int, float)) and 0 <= self.silu_lobe < 1):
            raise QnnxError(f"silu_lobe must be in [0, 1), got {self.silu_lobe!r}")
        for name in ("exclude_nodes", "exclude_op_types"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise QnnxError(f"{name} must be a sequence of names")
            object.__setattr__(self, name, tuple(value))

    @property
    def effective_channel_balance(self) -> float:
        """channel_balance, or its default (0; see the field's comment for the measurements)."""
        return 0.0 if self.channel_balance is None else float(self.channel_balance)

    @classmethod
    def from_dict(cls, values: dict) -> "QuantConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise QnnxError(f"unknown QuantConfig option(s): {', '.join(unknown)}")
        return cls(**values)


@dataclass
class Decision:
    """Why a node ended up integer or float."""

    node: str
    op_type: str
    quantized: bool
    reason: str
    pattern: str | None = None
    sqnr_db: float | None = None


@dataclass(frozen=True)
class SpeedTrial:
    """One kind of pattern tried in float by the speed fallback: the best model so far vs the same with
    every match of ``kind`` float too (median ms, interleaved), and whether that stayed."""

    kind: str
    matches: int
    before_ms: float
    after_ms: float
    left_float: bool


@dataclass(frozen=True)
class SpeedReport:
    """What the speed fallback measured on ONNX Runtime (median ms per run, one thread)."""

    float_ms: float
    int8_ms: float  # every pattern int8
    trials: list[SpeedTrial]
    final_float_ms: float  # the last timing: float vs the chosen int8 variant
    final_ms: float
    whole_model_float: bool
    timings: int
    seconds: float
    skipped: str = ""  # speed_fallback="auto" stopped early: why (no kind was tried)

    def lines(self) -> list[str]:
        if self.skipped and math.isnan(self.int8_ms):  # stopped before timing int8
            return [f"speed (ONNX Runtime, 1 thread): float {self.float_ms:.3f} ms; {self.skipped}"]
        out = [f"speed (ONNX Runtime, 1 thread): float {self.float_ms:.3f} ms, all int8 {self.int8_ms:.3f} ms "
               f"({self.float_ms / self.int8_ms:.2f}x)"]
        if self.skipped:
            return out + [f"  {self.skipped}"]
        out += [f"  {t.kind} ({t.matches}) float: {t.before_ms:.3f} -> {t.after_ms:.3f} ms, "
                f"{'left float' if t.left_float else 'stays int8'}" for t in self.trials]
        chosen = "whole model kept float" if self.whole_model_float else "int8"
        out.append(f"  {chosen}: float {self.final_float_ms:.3f} ms vs best int8 {self.final_ms:.3f} ms "
                   f"({self.final_float_ms / self.final_ms:.2f}x); {self.timings} timings in {self.seconds:.1f}s")
        return out


@dataclass(frozen=True)
class OutputAgreement:
    """One model output, quantized vs float, on the calibration samples kept after calibration."""

    name: str
    sqnr_db: float
    cosine: float
    samples: int
    channel_cosine: float = math.nan  # mean of the per-channel (axis 1) cosines (compare.LayerError)


# An output this far from the float model's is not a quantized version of it. Measured on PP-OCR rec's
# probabilities: mse ranges (the default) cosine 0.978 / SQNR 13.7 dB, 10.5 dB on its worst calibration
# set (character accuracy still 96%); entropy 0.63 / 1.9 dB (character accuracy 0).
FAR_COSINE = 0.9
FAR_SQNR_DB = 6.0  # error power above a quarter of the signal's


@dataclass
class QuantReport:
    decisions: list[Decision] = field(default_factory=list)
    calibration_seconds: float = 0.0
    num_samples: int = 0
    left_in_float: list[tuple[str, str, str]] = field(default_factory=list)
    speed: SpeedReport | None = None  # unless QuantConfig(speed_fallback="off")
    outputs: list[OutputAgreement] = field(default_factory=list)
    padding: list[PaddingRecord] = field(default_factory=list)  # filled when the QDQ model is written
    rounding: list[RoundingRecord] = field(default_factory=list)  # depthwise convs, weight_rounding="gptq"
    corrections: list[CorrectionRecord] = field(default_factory=list)  # bias_correction="sequential"
    correction_check: CorrectionCheck | None = None  # any bias correction: kept, or undone as harmful
    # quantized conv/matmul groups ONNX Runtime's CPU optimizer leaves float (fusion_check.py), of ``fusable``
    unfused: list[str] = field(default_factory=list)
    fusable: int = 0

    def far_outputs(self) -> list[OutputAgreement]:
        return [o for o in self.outputs if o.cosine < FAR_COSINE or o.sqnr_db < FAR_SQNR_DB]

    def summary(self) -> str:
        q = [d for d in self.decisions if d.quantized]
        f = [d for d in self.decisions if not d.quantized]
        lines = [f"quantized {len(q)} pattern(s), {len(f)} node(s) kept in float; "
                 f"calibration {self.calibration_seconds:.1f}s on {self.num_samples} sample(s)"]
        if self.outputs:
            lines.append(f"outputs vs float on {self.outputs[0].samples} calibration sample(s): " + ", ".join(
                f"{o.name} SQNR {o.sqnr_db:.1f} dB, cosine {o.cosine:.4f}" for o in self.outputs))
        for o in self.far_outputs():
            lines.append(f"WARNING: output {o.name!r} is far from the float model's (SQNR {o.sqnr_db:.1f} dB, cosine "
                         f"{o.cosine:.3f}): not a faithful quantization; try method='mse' (the default), more "
                         "calibration samples, or exclude the layers `qnnx compare` lists worst")
        worst = sorted((d for d in self.decisions if d.sqnr_db is not None), key=lambda d: d.sqnr_db)[:5]
        if worst:
            lines.append("worst layers by output SQNR: " + ", ".join(f"{d.node} {d.sqnr_db:.1f} dB" for d in worst))
        if self.speed is not None:
            lines += self.speed.lines()
        if self.unfused:
            lines.append(f"WARNING: ONNX Runtime (CPU) would run {len(self.unfused)} of {self.fusable} quantized "
                         "conv/matmul group(s) in float, not as integer kernels: " + ", ".join(self.unfused[:8])
                         + (" ..." if len(self.unfused) > 8 else ""))
        rounded = [r for r in self.rounding if not r.reason]
        if rounded:
            gains, left = [r.gain_db for r in rounded], len(self.rounding) - len(rounded)
            depthwise = sum(r.depthwise for r in rounded)
            lines.append(f"weights: {len(rounded)} conv(s) ({depthwise} depthwise) rounded for their output error, "
                         f"weight-induced output error {min(gains):.1f}-{max(gains):.1f} dB lower than nearest rounding"
                         + (f"; {left} left at nearest rounding" if left else ""))
        check = self.correction_check
        if check is not None and not check.kept:
            lines.append(f"biases: correction of {check.layers} conv(s) undone: the outputs' mean per-channel cosine "
                         f"to float fell {check.before:.4f} -> {check.after:.4f} with it")
        if self.corrections:
            rel = sorted(c.relative for c in self.corrections)
            stages = max(c.stage for c in self.corrections) + 1
            lines.append(f"biases: {len(rel)} conv(s) corrected for their mean output shift against float in {stages} "
                         f"sequential stage(s) (median {100 * rel[len(rel) // 2]:.1f}%, max {100 * rel[-1]:.1f}% of "
                         "the output's rms)" + (f"; outputs' mean per-channel cosine {check.before:.4f} -> "
                                                f"{check.after:.4f}" if check is not None else ""))
        padded = [p for p in self.padding if p.padded]
        if padded:
            lines.append(f"written for ONNX Runtime: {len(padded)} depthwise conv(s) padded to its fast kernel's "
                         "channel multiple (same output): " + ", ".join(f"{p.node} {p.channels}->{p.padded}"
                                                                          for p in padded[:8])
                         + (" ..." if len(padded) > 8 else ""))
        for p in [p for p in self.padding if not p.padded][:5]:
            lines.append(f"  depthwise conv {p.node} ({p.channels} channels) not padded: {p.reason}")
        for d in f[:20]:
            lines.append(f"  float: {d.node} ({d.op_type}): {d.reason}")
        if len(f) > 20:
            lines.append(f"  ... and {len(f) - 20} more")
        for name, op, why in self.left_in_float:
            lines.append(f"  left in float in the integer model: {name} ({op}): {why}")
        return "\n".join(lines)
