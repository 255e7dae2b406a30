"""The ``qnnx`` command (typer; tables via :mod:`qnnx.terminal`).

Exit codes: 0 ok; 1 bad input or bad usage (one line on stderr naming the file/node/option and the
problem); 2 internal error (one line naming the debug log that holds the traceback); 130 when
interrupted. Click's own usage errors (exit 2 with a usage block) are turned into that one line
with exit 1, because exit 2 means a bug in qnnx here.
"""

from __future__ import annotations

import enum
import functools
import math
import sys
import tempfile
import traceback
from inspect import Signature, signature
from pathlib import Path
from typing import Annotated

import typer
import typer.core

# typer >= 0.29 ships its own copy of click; these are the exceptions its parser raises.
from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError

from qnnx import __version__
from qnnx.autoquant.config import (ACTIVATION_DTYPES, BIAS_CORRECTIONS, CALIBRATORS, DEPTHWISE_INPUTS, METHODS,
                                   PRESETS, SMOOTHING_SITES, SPEED_FALLBACKS, SYMMETRIC_ACTIVATIONS, WEIGHT_ROUNDINGS,
                                   CalibrationOptions, QuantConfig, RangeOptions, RefinementOptions)
from qnnx.data import CalibrationData, ImageFolder, ImagePreprocess
from qnnx.errors import QnnxError
from qnnx.targets import TARGETS
from qnnx.targets.openvino.runtime import PRECISIONS as OV_PRECISIONS

class PanelCommand(typer.core.TyperCommand):
    """Plain click help with the options grouped: the common ones under "Options", then one section per
    ``rich_help_panel`` (typer draws panels only in its rich mode, which cuts long option names)."""

    def format_options(self, ctx, formatter) -> None:
        args, panels = [], {"Options": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                args.append(record)
            else:
                panels.setdefault(getattr(param, "rich_help_panel", None) or "Options", []).append(record)
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        for title, records in panels.items():
            if records:
                with formatter.section(title[:1].upper() + title[1:]):
                    formatter.write_dl(records)


# Plain click help, not typer's rich panels: those cut long option names ("--activation-d…") at 80 columns.
app = typer.Typer(name="qnnx", add_completion=False, rich_markup_mode=None, no_args_is_help=True,
                  context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})

Method = enum.Enum("Method", {m: m for m in METHODS}, type=str)
ActivationDtype = enum.Enum("ActivationDtype", {d: d for d in ACTIVATION_DTYPES}, type=str)
DEFAULT_METHOD = Method(QuantConfig().ranges.method)
DEFAULT_ACTIVATION_DTYPE = ActivationDtype(QuantConfig.activation_dtype)


class Format(str, enum.Enum):
    qdq = "qdq"
    qnnx = "qnnx"
    lowered = "lowered"


Calibrator = enum.Enum("Calibrator", {m: m for m in CALIBRATORS}, type=str)
SpeedFallback = enum.Enum("SpeedFallback", {m: m for m in SPEED_FALLBACKS}, type=str)
SymmetricActivations = enum.Enum("SymmetricActivations", {m: m for m in SYMMETRIC_ACTIVATIONS}, type=str)
DepthwiseInputs = enum.Enum("DepthwiseInputs", {m: m for m in DEPTHWISE_INPUTS}, type=str)
BiasCorrection = enum.Enum("BiasCorrection", {m: m for m in BIAS_CORRECTIONS}, type=str)
WeightRounding = enum.Enum("WeightRounding", {m: m for m in WEIGHT_ROUNDINGS}, type=str)
SmoothingSites = enum.Enum("SmoothingSites", {m: m for m in SMOOTHING_SITES}, type=str)
Preset = enum.Enum("Preset", {p: p for p in ("imagenet", "yolo")}, type=str)  # qnnx.data.images.PRESETS
ModelPreset = enum.Enum("ModelPreset", {p: p for p in PRESETS}, type=str)
ChannelOrder = enum.Enum("ChannelOrder", {c: c for c in ("rgb", "bgr")}, type=str)
Layout = enum.Enum("Layout", {c: c for c in ("nchw", "nhwc")}, type=str)
Runtime = enum.Enum("Runtime", {r: r for r in TARGETS}, type=str)
Precision = enum.Enum("Precision", {p: p for p in OV_PRECISIONS}, type=str)
_IMAGES = "images (a sample directory of .jpg/.png/.bmp/.webp)"
_RANDOM_CALIBRATION_BYTES = 1 << 30  # --random-calibration refuses samples larger than this in total
_SUMMARY_SAMPLES = 2  # calibration samples the summary after quantize compares on (each costs ~2 model runs)


Output = Annotated[str, typer.Option("-o", "--output", metavar="FILE", show_default=False,
                                     help="output .onnx file (written atomically; never the input)")]


def _model(help: str, metavar: str = "MODEL"):
    return typer.Argument(metavar=metavar, help=help, show_default=False)


def _consumer_functions(names: list[str] | None) -> tuple[str, ...]:
    if not names:
        return RangeOptions().consumer_functions
    if names == ["none"]:
        return ()
    return tuple(names)


def _output_path(out: str, model: str | None = None, calib: str | None = None, val: str | None = None) -> Path:
    """Every command's ``-o``: not an input, not inside an input directory, writable (qnnx.paths)."""
    from qnnx.paths import check_output, model_files

    return check_output(out, {**model_files(model), "calibration data": calib, "validation data": val})


def _given(ctx) -> set[str]:
    """The parameters of ``ctx`` given on the command line (not left at their defaults)."""
    from typer._click.core import ParameterSource

    return {name for name in ctx.params if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)}


def _version(value: bool) -> None:
    if value:
        print(f"qnnx {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="print the version and exit")] = False) -> None:
    """Exact integer quantization of ONNX graphs.

    Exit codes: 0 ok, 1 bad input or usage (one line on stderr), 2 internal error (names a debug log).
    """


@app.command("import", cls=PanelCommand, short_help='ONNX quantization ops -> qnnx dialect, op for op',
             help=('Rewrite ONNX quantization ops (QuantizeLinear, DequantizeLinear, QLinearConv, QLinearMatMul, '
                   'ConvInteger, MatMulInteger, DynamicQuantizeLinear, com.microsoft QLinear*/QGemm) into the qnnx '
                   'dialect, op for op.'))
def import_(model: Annotated[str, _model("input .onnx file (never modified)")],
            output: Output) -> None:
    from qnnx.frontends import import_onnx
    from qnnx.ir import save_model
    from qnnx.terminal import show_lines

    out = _output_path(output, model)
    m = import_onnx(model)
    n = sum(1 for node in m.graph if node.domain == "qnnx")
    save_model(m, out)
    show_lines(f"wrote {out} ({n} qnnx ops)")


@app.command("from-qdq", cls=PanelCommand, short_help='pre-quantized QDQ/QOperator model -> canonical integer form',
             help=('Convert a pre-quantized QDQ or QOperator model into the canonical qnnx integer form (fake-'
                   'quantization-to-integer), listing any op left in float.'))
def from_qdq(model: Annotated[str, _model("QDQ / QOperator .onnx file (never modified)")],
             output: Output,
             strict: Annotated[bool, typer.Option("--strict", help="fail, naming them, if any op stays in float")]
             = False,
             numerics: Annotated[str, typer.Option(
                 "--numerics", help="onnxruntime: compute what ONNX Runtime computes (its fused kernels' own "
                 "float32 recipes); qdq: the QDQ graph's runtime-independent meaning")] = "onnxruntime") -> None:
    from qnnx.frontends import convert_qdq
    from qnnx.ir import save_model
    from qnnx.terminal import show_lines

    out = _output_path(output, model)
    m, report = convert_qdq(model, strict=strict, numerics=numerics)
    save_model(m, out)
    show_lines(f"{report.summary()}\nwrote {out}")


@app.command("from-tflite", cls=PanelCommand, short_help='full-integer .tflite model -> canonical integer form',
             help=('Import a full-integer TFLite model (int8, or int16 activations with int8 weights) into the '
                   'canonical qnnx integer form, with the arithmetic of LiteRT\'s reference kernels; inputs and '
                   'outputs keep their names, integer types and NHWC shapes. Lists any op left in float.'))
def from_tflite(model: Annotated[str, _model(".tflite file (never modified)")],
                output: Output,
                strict: Annotated[bool, typer.Option("--strict", help="fail, naming them, if any op stays in float")]
                = False) -> None:
    from qnnx.frontends.tflite import convert
    from qnnx.ir import save_model
    from qnnx.terminal import show_lines

    out = _output_path(output, model)
    m, report = convert(model, strict=strict)
    m.metadata_props["qnnx.left_in_float"] = "; ".join(f"{n} ({op}): {why}" for n, op, why in report.left_in_float)
    save_model(m, out)
    show_lines("\n".join([*report.lines(), f"wrote {out}"]))


@app.command("lower", cls=PanelCommand, short_help='qnnx / ONNX quant ops -> plain ONNX, bit-exact on ONNX Runtime',
             help=('Import, then lower every qnnx op to standard ONNX ops that give bit-identical results on any '
                   'ONNX runtime.'))
def lower(model: Annotated[str, _model("input .onnx file with qnnx and/or ONNX quantization ops (never "
                                      "modified)")],
          output: Output) -> None:
    from qnnx.frontends import import_onnx
    from qnnx.ir import save_model
    from qnnx.passes.lower import lower as lower_model
    from qnnx.terminal import show_lines

    out = _output_path(output, model)
    m = lower_model(import_onnx(model), copy=False)
    save_model(m, out)
    show_lines(f"wrote {out} ({m.graph.num_nodes()} standard ONNX ops, no qnnx ops)")


def _image_preprocess(
        preprocess: Annotated[Preset | None, typer.Option(
            "--preprocess", metavar="PRESET", show_default=False, rich_help_panel=_IMAGES,
            help="image preprocessing preset: imagenet (shorter side 256, centre crop 224, ImageNet mean/std) or "
            "yolo (640 letterbox, /255); the options below override it")] = None,
        resize: Annotated[str | None, typer.Option(
            "--resize", metavar="HxW", show_default=False, rich_help_panel=_IMAGES,
            help="resize every image to H x W (N for N x N), stretched unless --letterbox")] = None,
        letterbox: Annotated[bool, typer.Option(
            "--letterbox", rich_help_panel=_IMAGES, help="keep the aspect ratio and pad (to --resize)")] = False,
        scale: Annotated[str | None, typer.Option(
            "--scale", metavar="S", show_default=False, rich_help_panel=_IMAGES,
            help="multiply pixels (0..255) by S, e.g. 1/255 (the default) or 1")] = None,
        mean: Annotated[str | None, typer.Option(
            "--mean", metavar="M[,M,M]", show_default=False, rich_help_panel=_IMAGES,
            help="subtract after scaling, per channel in output order (default 0)")] = None,
        std: Annotated[str | None, typer.Option(
            "--std", metavar="S[,S,S]", show_default=False, rich_help_panel=_IMAGES,
            help="then divide, per channel (default 1)")] = None,
        channel_order: Annotated[ChannelOrder | None, typer.Option(
            "--channel-order", show_default=False, rich_help_panel=_IMAGES, help="default rgb")] = None,
        layout: Annotated[Layout | None, typer.Option(
            "--layout", show_default=False, rich_help_panel=_IMAGES, help="default nchw")] = None,
) -> ImagePreprocess | None:
    """The image preprocessing options, defined once (:func:`_image_options` adds them to a command), and
    the ImagePreprocess they describe, or None when none is given."""
    from qnnx.data.images import preprocess_from_options

    try:
        return preprocess_from_options(preset=preprocess.value if preprocess else None, resize=resize, mean=mean,
                                       std=std, scale=scale,
                                       channel_order=channel_order.value if channel_order else None,
                                       layout=layout.value if layout else None, letterbox=letterbox)
    except QnnxError as e:  # a bad option value is a usage error
        raise UsageError(str(e)) from None


def _image_options(command):
    """Give ``command`` the image preprocessing options; it receives the ImagePreprocess they describe
    (or None) as its ``images`` argument. One definition for quantize, compare and bench."""
    own = [p for p in signature(command, eval_str=True).parameters.values() if p.name != "images"]
    extra = list(signature(_image_preprocess, eval_str=True).parameters.values())

    @functools.wraps(command)
    def with_images(**kwargs):
        given = {p.name: kwargs.pop(p.name) for p in extra}
        return command(**kwargs, images=_image_preprocess(**given))

    with_images.__signature__ = Signature(own + extra)
    return with_images


_CALIBRATION = "calibration"
_REFINEMENTS = "refinements (optional steps after realization)"
_EXPERT = "expert: activation ranges"
_R, _C, _F = RangeOptions(), CalibrationOptions(), RefinementOptions()


@app.command("quantize", cls=PanelCommand, short_help='quantize a float model with calibration samples',
             help=('Quantize a float model with calibration samples (static, int8 weights), then print what is '
                   'integer, what stayed float and why. The same inputs give a byte-identical file.'))
@_image_options
def quantize(
        ctx: typer.Context,
        model: Annotated[str, _model("float .onnx model (never modified)")],
        output: Output,
        calib: Annotated[str | None, typer.Option(
            "--calib", metavar="DIR", show_default=False,
            help="directory of calibration samples: .npy (single-input models) or .npz keyed by input name; or of "
            "images (.jpg .jpeg .png .bmp .webp) with --preprocess and/or --resize")] = None,
        format: Annotated[Format, typer.Option(
            "--format", help="qdq: QuantizeLinear/DequantizeLinear that ONNX Runtime runs natively; qnnx: the "
            "canonical integer model; lowered: the canonical model in standard ONNX ops")] = Format.qdq,
        activation_dtype: Annotated[ActivationDtype, typer.Option("--activation-dtype", help="activation integer "
                                                                  "type")] = DEFAULT_ACTIVATION_DTYPE,
        target: Annotated[Runtime, typer.Option(
            "--target", help="the runtime the model is quantized and its QDQ file shaped for: onnxruntime (every "
            "pattern integer, ORT's kernels' shaping) or openvino (the inputs of convs, matmuls, pools and binary ops "
            "of two signals quantized, above data movement, so the CPU plugin fuses the float ops after them; deploy "
            "it converted: ovc or openvino.convert_model)")
        ] = Runtime(QuantConfig.target),
        preset: Annotated[ModelPreset | None, typer.Option(
            "--preset", show_default=False,
            help="; ".join(f"{name}: {p.about} (--target {'/'.join(p.targets)})" for name, p in PRESETS.items())
            + "; options given on the command line override the preset's")] = None,
        per_channel: Annotated[bool, typer.Option("--per-channel/--no-per-channel",
                                                  help="per-channel weight scales")] = QuantConfig.per_channel,
        weight_bits: Annotated[str, typer.Option(
            "--weight-bits", metavar="7|8|pairs",
            help="7: weights within [-64, 64], so that the u8 x s8 kernels of ONNX Runtime and OpenVINO, which add "
            "pairs of products in 16 bits on x86 without VNNI, compute the model exactly on every CPU; 8: full "
            "int8 weights, for CPUs whose kernels accumulate in 32 bits (VNNI, ARM); pairs (--target openvino): "
            "7-bit convs, MatMul/Gemm weights 8-bit with each same-sign pair on adjacent input channels within "
            "128, which OpenVINO's kernels pair and sum exactly")] = str(QuantConfig.weight_bits),
        exclude_node: Annotated[list[str] | None, typer.Option(
            "--exclude-node", metavar="NAME", show_default=False,
            help="keep this node in float; a glob pattern ('/blocks.0/*') keeps every node it matches "
            "(repeatable; names as the report prints them)")] = None,
        exclude_op: Annotated[list[str] | None, typer.Option(
            "--exclude-op", metavar="OP_TYPE", show_default=False, help="keep every node of this op type in float "
            "(repeatable)")] = None,
        num_samples: Annotated[int | None, typer.Option(
            "--num-samples", min=1, show_default=False, help="use at most this many calibration samples (default: "
            "all; 16 with --random-calibration)")] = None,
        seed: Annotated[int, typer.Option(
            "--seed", help="which calibration files --num-samples picks (a seeded random subset of the directory); "
            "also seeds --random-calibration")] = 0,
        allow_float: Annotated[bool, typer.Option(
            "--allow-float", help="write the model even when nothing in it ended up quantized (otherwise that "
            "is an error)")] = False,
        quiet: Annotated[bool, typer.Option("-q", "--quiet", help="no progress output")] = False,
        report_dir: Annotated[str | None, typer.Option(
            "--report", metavar="DIR", show_default=False,
            help="also write an HTML report to DIR: index.html (decisions, per-output error, per-layer SQNR, "
            "activation histograms of the worst layers) with its PNG charts; replaces only a previous report")]
        = None,
        method: Annotated[Method, typer.Option("--method", rich_help_panel=_CALIBRATION,
                                               help="how activation ranges are chosen")] = DEFAULT_METHOD,
        percentile: Annotated[float, typer.Option("--percentile", rich_help_panel=_CALIBRATION,
                                                  help="for --method percentile")] = _R.percentile,
        symmetric: Annotated[bool, typer.Option(
            "--symmetric/--asymmetric", rich_help_panel=_CALIBRATION,
            help="activation ranges: symmetric around zero (zero point 0, or 128 for uint8) or asymmetric "
            "min..max")] = QuantConfig.activation_symmetric,
        calibrator: Annotated[Calibrator, typer.Option(
            "--calibrator", rich_help_panel=_CALIBRATION,
            help="float: observe the float model, one pass; sequential: choose qparams in --sequential-passes "
            "topological stages, each observed with the stages before it quantized; propagate_error: a second "
            "pass on the quantized model")] = Calibrator(_C.calibrator),
        sequential_passes: Annotated[int, typer.Option(
            "--sequential-passes", metavar="STAGES", min=1, max=64, rich_help_panel=_CALIBRATION,
            help="stages of --calibrator sequential")] = _C.sequential_passes,
        validation: Annotated[str | None, typer.Option(
            "--validation", metavar="N|FRACTION", show_default=False, rich_help_panel=_CALIBRATION,
            help="hold out N calibration samples (or this fraction, e.g. 0.25), spread evenly, and keep the range "
            "method and each refinement only when it lowers the error on them")] = None,
        val: Annotated[str | None, typer.Option(
            "--val", metavar="DIR", show_default=False, rich_help_panel=_CALIBRATION,
            help="held-out samples of their own (as --calib; images with the same image options) instead of "
            "--validation")] = None,
        min_sqnr: Annotated[float | None, typer.Option(
            "--min-sqnr", metavar="DB", show_default=False, rich_help_panel=_CALIBRATION,
            help="accuracy target: every output's SQNR against float (held-out samples if any); the layers "
            "adding the most error return to float until it is met (default: 6 dB, below which an output is far from float)")]
        = None,
        min_cosine: Annotated[float | None, typer.Option(
            "--min-cosine", metavar="C", show_default=False, rich_help_panel=_CALIBRATION,
            help="accuracy target: every output's cosine to float (default 0.9)")] = None,
        random_calibration: Annotated[bool, typer.Option(
            "--random-calibration", rich_help_panel=_CALIBRATION,
            help="calibrate on random normal data instead of --calib (static input shapes only); the result is "
            "NOT meaningful for accuracy: for trying the tool or timing only")] = False,
        smoothing_alpha: Annotated[float | None, typer.Option(
            "--smoothing-alpha", metavar="A", rich_help_panel=_REFINEMENTS,
            help="SmoothQuant strength in (0, 1]: how much of each activation channel's range moves into the "
            "weights reading it; 0 turns smoothing off")] = _F.smoothing_alpha,
        smoothing_sites: Annotated[SmoothingSites, typer.Option(
            "--smoothing-sites", rich_help_panel=_REFINEMENTS,
            help="'norms' smooths LayerNorm outputs read by MatMuls; 'matmuls' every activation a MatMul with a "
            "constant weight reads (a value projection or a new Mul divides it where no norm can; new Muls only with "
            "--target openvino, which folds them into its quantizers)")]
        = SmoothingSites(_F.smoothing_sites),
        weight_rounding: Annotated[WeightRounding, typer.Option(
            "--weight-rounding", rich_help_panel=_REFINEMENTS,
            help="'gptq' rounds the weights of depthwise and ungrouped convs for the conv's output error on the "
            "calibration inputs; 'gptq_all' those of MatMuls and Gemms too (within the pair limit with --weight-bits "
            "pairs); 'nearest' rounds each weight alone")] = WeightRounding(_F.weight_rounding),
        bias_correction: Annotated[BiasCorrection, typer.Option(
            "--bias-correction", rich_help_panel=_REFINEMENTS,
            help="fold mean output errors into int32 biases: 'sequential' each conv's whole mean shift against "
            "the float model, stage by stage; 'own' each Conv/Gemm's own rounding error; either is undone (and "
            "reported) when the outputs agree worse with float after it")] = BiasCorrection(_F.bias_correction),
        sqnr_threshold: Annotated[float | None, typer.Option(
            "--sqnr-threshold", metavar="DB", show_default=False, rich_help_panel=_REFINEMENTS,
            help="keep patterns whose output SQNR is below DB in float")] = None,
        speed_fallback: Annotated[SpeedFallback, typer.Option(
            "--speed-fallback", rich_help_panel=_REFINEMENTS,
            help="time float and int8 variants on the --target runtime (CPU, 1 thread) and leave kinds of layers "
            "float where int8 is measured slower, or the whole model when int8 is not faster: on = always, auto = "
            "only when all-int8 is not clearly faster, off = never. Its choices follow the timing, so the "
            "output is not reproducible with it")] = SpeedFallback(_F.speed_fallback),
        symmetric_activations: Annotated[SymmetricActivations, typer.Option(
            "--symmetric-activations", rich_help_panel=_REFINEMENTS,
            help="auto: on a target whose int8 kernels run zero point 0 faster (openvino), try int8 symmetric "
            "quantized inputs, run both models on that runtime and keep the candidate only when its outputs "
            "stay as close to float on the calibration samples (nothing timed; a proxy: it can still cost task "
            "accuracy, see docs/benchmarks.md); off: never")] = SymmetricActivations(_F.symmetric_activations),
        accuracy_guard: Annotated[bool, typer.Option(
            "--accuracy-guard/--no-accuracy-guard", rich_help_panel=_REFINEMENTS,
            help="while an output is far from float (SQNR < 6 dB or cosine < 0.9) or misses --min-sqnr/"
            "--min-cosine, return the layers adding the most error to float; refuse a model that still ends far; "
            "off: write it whatever its outputs (the report warns)")] = True,
        speed_plan: Annotated[str | None, typer.Option(
            "--speed-plan", metavar="FILE", show_default=False, rich_help_panel=_REFINEMENTS,
            help="replay the speed fallback's decisions from FILE without timing (reproducible); when FILE does "
            "not exist, --speed-fallback on|auto writes its decisions there")] = None,
        consumer_weighting: Annotated[bool, typer.Option(
            "--consumer-weighting/--no-consumer-weighting", rich_help_panel=_EXPERT,
            help="histogram methods: weigh each channel of an activation read only by convs by the squared norm "
            "of the weights reading it (the range minimises the convs' output error)")] = _R.consumer_weighting,
        consumer_function: Annotated[list[str] | None, typer.Option(
            "--consumer-function", metavar="NAME", show_default=False, rich_help_panel=_EXPERT,
            help="with --method mse, judge an activation read only by this function (silu, sigmoid, hardswish) "
            "by the error of the function's output (repeatable; replaces the default silu and sigmoid; none: "
            "judge every activation by its own error)")] = None,
        silu_lobe: Annotated[float, typer.Option(
            "--silu-lobe", metavar="FRACTION", rich_help_panel=_EXPERT,
            help="with --method mse: a SiLU output whose negative side is narrower than this fraction of its "
            "positive one keeps that side whole (SiLU's dense minimum lobe is not clipped to 0); 0: off"
        )] = _R.silu_lobe,
        depthwise_inputs: Annotated[DepthwiseInputs, typer.Option(
            "--depthwise-inputs", rich_help_panel=_EXPERT,
            help="per_channel: a value read only by depthwise convs gets one min-max range per channel (--target "
            "openvino, whose depthwise kernels take them); per_tensor: one range"
        )] = DepthwiseInputs(_R.depthwise_inputs),
        images: ImagePreprocess | None = None,
) -> None:
    from qnnx.analysis import compare_models
    from qnnx.autoquant import quantize as quantize_model
    from qnnx.terminal import show_lines, show_quant_report

    if calib is None and not random_calibration:
        raise UsageError("one of the arguments --calib --random-calibration is required")
    if calib is not None and random_calibration:
        raise UsageError("--calib and --random-calibration are mutually exclusive")
    if sqnr_threshold is not None and not math.isfinite(sqnr_threshold):
        raise UsageError(f"--sqnr-threshold must be a finite number of dB, got {sqnr_threshold}")
    # the samples config.num_samples/seed pick, read by calibration, the summary and the report alike
    calibration = _samples(calib, images, "--calib", num_samples=num_samples, seed=seed)
    out = _output_path(output, model, calib, val)
    if report_dir is not None:  # before quantizing: a refused directory must not cost a calibration
        from qnnx.analysis.report import check_report_directory
        from qnnx.paths import check_creatable

        if Path(report_dir).resolve() == out.resolve():
            raise QnnxError("--report and -o name the same path", where=report_dir)
        for inp in (model, calib, val):
            if inp is not None and Path(report_dir).resolve() in (Path(inp).resolve(), *Path(inp).resolve().parents):
                raise QnnxError(f"--report would replace a directory holding the input {inp}", where=report_dir)
        check_report_directory(report_dir)
        check_creatable(Path(report_dir), report_dir)
    config = QuantConfig(
        activation_dtype=activation_dtype.value, activation_symmetric=symmetric, per_channel=per_channel,
        weight_bits=int(weight_bits) if weight_bits in ("7", "8") else weight_bits,
        exclude_nodes=tuple(exclude_node or ()), exclude_op_types=tuple(exclude_op or ()),
        allow_float=allow_float, target=target.value, progress=not quiet,
        ranges=RangeOptions(method=method.value, percentile=percentile,
                            consumer_functions=_consumer_functions(consumer_function),
                            consumer_weighting=consumer_weighting, silu_lobe=silu_lobe,
                            depthwise_inputs=depthwise_inputs.value),
        calibration=CalibrationOptions(num_samples=num_samples, seed=seed, calibrator=calibrator.value,
                                       sequential_passes=sequential_passes, validation=_count_or_fraction(validation)),
        refinements=RefinementOptions(smoothing_alpha=smoothing_alpha or None,
                                      smoothing_sites=smoothing_sites.value,
                                      sqnr_threshold_db=sqnr_threshold, speed_fallback=speed_fallback.value,
                                      bias_correction=bias_correction.value, weight_rounding=weight_rounding.value,
                                      min_sqnr_db=min_sqnr, min_cosine=min_cosine, accuracy_guard=accuracy_guard,
                                      symmetric_activations=symmetric_activations.value,
                                      speed_plan=_read_speed_plan(speed_plan, speed_fallback.value)))
    if preset is not None:
        config = config.with_preset(preset.value, keep=_given(ctx))
    if validation is not None and val is not None:
        raise UsageError("--validation and --val are mutually exclusive")
    if random_calibration:
        if images is not None:  # (they would be ignored: random samples are no images)
            raise UsageError("image preprocessing options need --calib DIR (a directory of images)")
        calibration = CalibrationData.from_source(_random_samples(model, num_samples or 16, seed))
    held_out = _samples(val, images, "--val") if val is not None else None
    qm = quantize_model(model, calibration, config, validation=held_out)
    if random_calibration:  # said of the result, so an error stays the one line on stderr
        print("qnnx: warning: calibrated on random data; the quantized model's accuracy is not meaningful",
              file=sys.stderr)
    qm.save(out, format=format.value)
    if speed_plan is not None and config.refinements.speed_plan is None and qm.report.record("speed_fallback"):
        _write_speed_plan(speed_plan, qm.report.record("speed_fallback").plan())
    # the worst layers on a few samples (each costs a run fetching every tensor); the outputs' agreement is
    # the report's own, on the refinement samples
    errors = [e for e in compare_models(qm.float_model, qm.qdq, calibration.head(_SUMMARY_SAMPLES)) if not e.is_output]
    show_quant_report(qm.report, f"wrote {out} ({format.value})", errors=errors,
                      samples=min(_SUMMARY_SAMPLES, len(calibration)))
    if report_dir is not None:
        from qnnx.analysis.report import write_report

        show_lines(f"wrote {write_report(report_dir, model, qm, calibration, quantized_name=str(out))}")


def _read_speed_plan(path: str | None, speed_fallback: str) -> tuple[str, ...] | None:
    """The kinds a ``--speed-plan`` file leaves float, or None when the file is to be written."""
    if path is None or not Path(path).exists():
        if path is not None and speed_fallback == "off":
            raise UsageError(f"--speed-plan {path}: no such file; to make one, add --speed-fallback on")
        return None
    import json

    try:
        plan = json.loads(Path(path).read_text())["float_kinds"]
        if not isinstance(plan, list) or not all(isinstance(k, str) for k in plan):
            raise ValueError("float_kinds is not a list of names")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise QnnxError(f"not a speed plan ({type(e).__name__}: {e}); expected {{\"float_kinds\": [...]}}",
                        where=path) from None
    return tuple(plan)


def _write_speed_plan(path: str, kinds: tuple[str, ...]) -> None:
    import json

    from qnnx.ir.io import save_text

    save_text(json.dumps({"float_kinds": list(kinds)}) + "\n", path)


def _count_or_fraction(text: str | None) -> int | float | None:
    """``--validation``: a count ("8") or a fraction ("0.25")."""
    if text is None:
        return None
    try:
        return int(text) if text.strip().isdigit() else float(text)
    except ValueError:
        raise UsageError(f"--validation takes a count or a fraction, got {text!r}") from None


def _samples(path: str | None, images: ImagePreprocess | None, option: str, **limits) -> CalibrationData | None:
    """The one CalibrationData a command reads: the directory ``path`` of .npy/.npz, or of images when
    image options were given (a usage error without ``path``); None when neither."""
    if images is not None and path is None:
        raise UsageError(f"image preprocessing options need {option} DIR (a directory of images)")
    if path is None:
        return None
    return CalibrationData.from_source(ImageFolder(path, images) if images is not None else path, **limits)


def _random_samples(model_path: str, n: int, seed: int):
    """Standard-normal samples for a model with static input shapes (only behind --random-calibration)."""
    import numpy as np
    import onnx_ir as ir

    from qnnx.data import input_specs
    from qnnx.ir import load_model

    specs = input_specs(load_model(model_path))
    total = 0
    for s in specs:
        if s.shape is None or any(d is None for d in s.shape):
            raise QnnxError(f"input {s.name!r} has dynamic dims; random calibration needs static shapes",
                            where=model_path)
        if s.dtype not in (None, ir.DataType.FLOAT):
            raise QnnxError(f"input {s.name!r} is {s.dtype.name}; random calibration makes float32 samples only: "
                            "give --calib", where=model_path)
        total += 4 * int(np.prod(s.shape, dtype=object))
    if total * n > _RANDOM_CALIBRATION_BYTES:  # refused before allocating anything
        raise QnnxError(f"random calibration would need {total * n / 2**30:.3g} GiB ({n} samples of "
                        f"{', '.join(f'{s.name} {list(s.shape)}' for s in specs)}); give --calib or fewer "
                        "--num-samples", where=model_path)
    rng = np.random.default_rng(seed)
    return [{s.name: rng.standard_normal(s.shape).astype(np.float32) for s in specs} for _ in range(n)]


@app.command("inspect", cls=PanelCommand, short_help='ops by domain, what is quantized, qparams',
             help='Summarize a model: ops by domain, what is quantized, qparams.')
def inspect(model: Annotated[str, _model(".onnx file")]) -> None:
    from qnnx.analysis import summarize
    from qnnx.terminal import show_summary

    show_summary(summarize(model))


@app.command("compare", cls=PanelCommand, short_help='per-output and per-layer error vs the float model',
             help=('Per-output and per-layer error of a quantized model against its float original (SQNR, cosine, '
                   'max error), worst layers first.'))
@_image_options
def compare(
        float_model: Annotated[str, _model("float .onnx model", "FLOAT_MODEL")],
        quant_model: Annotated[str, _model("quantized .onnx model (QDQ or lowered; tensors are matched "
                                                  "by name)", "QUANT_MODEL")],
        data: Annotated[str, typer.Option(
            "--data", metavar="DIR", show_default=False,
            help="samples: .npy (single input) or .npz by input name; or images (.jpg .jpeg .png .bmp .webp) with "
            "--preprocess and/or --resize")],
        num_samples: Annotated[int | None, typer.Option("--num-samples", min=1, show_default=False,
                                                           help="use the first N samples (default: all)")]
        = None,
        top: Annotated[int, typer.Option("--top", min=0, help="how many layers to list")] = 20,
        quiet: Annotated[bool, typer.Option("-q", "--quiet", help="no progress output")] = False,
        runtime: Annotated[Runtime, typer.Option(
            "--runtime", help="what runs the quantized model: onnxruntime (every layer compared) or openvino (its "
            "CPU plugin, the model converted by openvino.convert_model: the outputs only; the float reference still "
            "runs on ONNX Runtime)")] = Runtime.onnxruntime,
        threads: Annotated[int | None, typer.Option("--threads", min=1, show_default=False,
                                                    help="openvino: inference threads (default: the plugin's)")]
        = None,
        precision: Annotated[Precision, typer.Option(
            "--precision", help="openvino: inference precision hint of its float layers (default: the plugin's, "
            "bf16 on CPUs that have it)")] = Precision.default,
        images: ImagePreprocess | None = None,
) -> None:
    from qnnx.analysis.compare import compare as compare_with
    from qnnx.analysis.compare import compare_on_openvino
    from qnnx.terminal import show_compare

    samples = _samples(data, images, "--data", num_samples=num_samples, seed=None)

    def progress(done: int, total: int) -> None:
        if not quiet:
            print(f"\rcomparing on sample {done}/{total}", end="\n" if done == total else "", file=sys.stderr,
                  flush=True)

    if runtime is Runtime.openvino:
        errors = compare_on_openvino(float_model, quant_model, samples, threads=threads, precision=precision.value,
                                     progress=progress)
    else:
        errors = compare_with(float_model, quant_model, samples, progress=progress)
    show_compare(errors, top, samples=len(samples))


@app.command("bench", cls=PanelCommand, short_help='median latency (ONNX Runtime or OpenVINO) and speedup vs the first model',
             help=('Median latency of one or more models on ONNX Runtime or OpenVINO (timed interleaved), with '
                   'speedups relative to the first. Each model runs in two sessions (compiled twice on OpenVINO) '
                   'made in mirrored order: one made later in a process runs a few percent faster.'))
@_image_options
def bench(
        models: Annotated[list[str], _model(".onnx files (the first is the baseline)")],
        data: Annotated[str | None, typer.Option(
            "--data", metavar="DIR", show_default=False,
            help="take the input from the first sample here: .npy/.npz, or images with --preprocess and/or "
            "--resize (needed for dynamic dims; default: random values)")]
        = None,
        threads: Annotated[int, typer.Option("--threads", min=1, help="intra-op threads")] = 1,
        repeats: Annotated[int, typer.Option(
            "--repeats", min=1, help="timed runs of each of a model's two sessions")] = 20,
        runtime: Annotated[Runtime, typer.Option(
            "--runtime", help="onnxruntime (CPU provider) or openvino (the model converted by openvino.convert_model, "
            "as for deployment, and compiled by its CPU plugin, one stream, latency hint)")] = Runtime.onnxruntime,
        precision: Annotated[Precision, typer.Option(
            "--precision", help="openvino: inference precision hint of its float layers (default: the plugin's, "
            "bf16 on CPUs that have it)")] = Precision.default,
        profile: Annotated[bool, typer.Option(
            "--profile", help="also where each model's time goes, per op type, from the runtime's own profiler "
            "(OpenVINO: per layer type and the precision it ran in)")] = False,
        images: ImagePreprocess | None = None,
) -> None:
    from qnnx.terminal import show_latency, show_profile

    samples = _samples(data, images, "--data")
    _same_inputs(models, random=samples is None)
    feed = _bench_feed(models[0], samples)
    if runtime is Runtime.openvino:
        from qnnx.targets.openvino.runtime import median_latency_ms as openvino_latency_ms

        ms = dict(zip(models, openvino_latency_ms(models, feed=feed, threads=threads, repeats=repeats,
                                                  precision=precision.value)))
        show_latency(ms, threads, runtime="OpenVINO (CPU)")
    else:
        from qnnx.targets.onnxruntime.latency import median_latency_ms

        show_latency(median_latency_ms(models, feed=feed, threads=threads, repeats=repeats), threads)
    if profile:
        from qnnx.analysis.profile import profile_model, profile_openvino

        for m in models:
            show_profile(m, profile_openvino(m, feed, threads=threads, precision=precision.value)
                         if runtime is Runtime.openvino else profile_model(m, feed, threads=threads))


def _same_inputs(models: list[str], *, random: bool) -> None:
    """bench feeds every model one input: their inputs must agree (names, dtypes, static dims), and
    random inputs are float32, so without --data every input must be float."""
    from qnnx.data import input_specs
    from qnnx.ir import load_model

    first = {s.name: s for s in input_specs(load_model(models[0]))}
    for m in models[1:]:
        mine = {s.name: s for s in input_specs(load_model(m))}
        if set(mine) != set(first):
            raise QnnxError(f"inputs {', '.join(sorted(mine))} differ from {models[0]}'s ({', '.join(sorted(first))}); "
                            "bench feeds every model the same input", where=m)
        for name, s in mine.items():
            f = first[name]
            dims_differ = s.shape is not None and f.shape is not None and (
                len(s.shape) != len(f.shape) or any(a != b for a, b in zip(s.shape, f.shape) if a and b))
            if s.dtype != f.dtype or dims_differ:
                raise QnnxError(f"input {name!r} is {_spec_text(s)} here but {_spec_text(f)} in {models[0]}; bench "
                                "feeds every model the same input", where=m)
    if random:
        for s in first.values():
            if s.dtype is not None and not s.dtype.is_floating_point():
                raise QnnxError(f"input {s.name!r} is {s.dtype.name}; without --data bench feeds random float "
                                "values: give --data", where=models[0])


def _spec_text(s) -> str:
    dims = "?" if s.shape is None else "x".join("?" if d is None else str(d) for d in s.shape)
    return f"{s.dtype.name if s.dtype is not None else 'untyped'} [{dims}]"


def _bench_feed(model_path: str, data):
    """The first sample of ``data``, or random values for a model with static input shapes."""
    import numpy as np

    from qnnx.data import CalibrationData, input_specs
    from qnnx.ir import load_model

    specs = input_specs(load_model(model_path))
    if data is not None:
        return next(iter(CalibrationData.from_source(data).head(1).bind(specs)))
    feed = {}
    for s in specs:
        if s.shape is None or any(d is None for d in s.shape):
            raise QnnxError(f"input {s.name!r} has dynamic dims: give --data with a sample", where=model_path)
        feed[s.name] = np.random.default_rng(0).standard_normal(s.shape).astype(np.float32)
    return feed


@app.command("ops", cls=PanelCommand, short_help="list the qnnx dialect's ops",
             help="List the qnnx dialect's ops.")
def ops() -> None:
    from qnnx.dialect import REGISTRY
    from qnnx.terminal import show_ops

    show_ops({name: s.doc.split(". ")[0].rstrip(".") for name, s in REGISTRY.items()})


@app.command("demo", cls=PanelCommand, short_help="quantize a real OCR model: fp32 vs int8 accuracy and latency",
             help=("Quantize PP-OCR's text-direction classifier (shipped in rapidocr-onnxruntime: "
                   'pip install "qnnx[examples]") on text-line crops rendered here, then print fp32 vs int8 '
                   "accuracy on other rendered crops (half turned by 180 degrees) and single-thread ONNX Runtime "
                   "latency. Deterministic for a given --seed (except the timings)."))
def demo(
        samples: Annotated[int, typer.Option("--samples", min=1, help="calibration crops")] = 32,
        eval_samples: Annotated[int, typer.Option("--eval", min=1, help="evaluation crops")] = 200,
        seed: Annotated[int, typer.Option("--seed", help="which crops are rendered")] = 0,
        output: Annotated[str | None, typer.Option("-o", "--output", metavar="FILE", show_default=False,
                                                  help="also save the int8 model (QDQ) here")] = None,
        export: Annotated[str | None, typer.Option(
            "--export", metavar="DIR", show_default=False,
            help="also write the float model (DIR/float.onnx) and the calibration crops (DIR/samples/*.npy), "
            "to try the other commands on")] = None,
        quiet: Annotated[bool, typer.Option("-q", "--quiet", help="no progress output")] = False,
) -> None:
    from qnnx.examples import ppocr_cls
    from qnnx.terminal import show_demo

    def log(line: str) -> None:
        if not quiet:
            print(f"qnnx demo: {line}", file=sys.stderr)

    if output is not None:
        _output_path(output)
    show_demo(ppocr_cls.run(samples, eval_samples, seed, output, log=log, export=export))


def _one_line(text: str) -> str:
    return " ".join(text.split())


@functools.lru_cache(maxsize=1)
def _click_command():
    """The click command typer builds from the signatures above (built once: ~0.1 s each time)."""
    return typer.main.get_command(app)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code. ``--help``/``--version`` and usage errors raise
    ``SystemExit`` (0 and 1) like any command-line parser."""
    command = _click_command()
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        code = command.main(args=args, prog_name="qnnx", standalone_mode=False)
    except NoArgsIsHelpError as e:  # bare `qnnx` or `qnnx quantize`: help, but not a success
        text = e.ctx.get_help() if e.ctx else ""  # typer's rich help prints itself and returns ""
        if text:
            print(text)
        return 1
    except UsageError as e:
        where = e.ctx.command_path if e.ctx else "qnnx"
        print(f"qnnx: error: {_one_line(e.format_message())} (see '{where} --help')", file=sys.stderr)
        raise SystemExit(1) from None
    except ClickException as e:  # e.g. a file click itself could not open
        print(f"qnnx: error: {_one_line(e.format_message())}", file=sys.stderr)
        return 1
    except QnnxError as e:
        print(f"qnnx: error: {e}", file=sys.stderr)
        return 1
    except typer.Abort:
        print("qnnx: interrupted", file=sys.stderr)
        return 130
    except Exception:  # a bug: keep the traceback for the report, show one line
        log = Path(tempfile.gettempdir()) / "qnnx-debug.log"
        log.write_text(traceback.format_exc())
        print(f"qnnx: internal error ({sys.exc_info()[1]!r}); traceback in {log}", file=sys.stderr)
        return 2
    if code is not None:  # --help, --version (click's Exit) or an interrupt (130)
        raise SystemExit(code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
