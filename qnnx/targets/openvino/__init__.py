"""OpenVINO (CPU plugin) as a deployment target.

    execution  Conv, ConvTranspose, MatMul/Gemm, average pools and binary ops of two activations
               (residual adds, squeeze-excitation scales; not a value times a function of itself, as
               SiLU): quantized inputs, float output; every other pattern float. A MatMul of two
               activations (attention's queries x keys) gets zero point 0 on both inputs (uint8 when a
               value never goes negative, else int8 symmetric): the plugin runs it in int8 only then;
               one reading a Softmax (probabilities x values) stays float, as NNCF leaves it: quantizing
               the probability map costs more than the int8 MatMul saves (docs/benchmarks.md). The plugin
               runs a conv/matmul whose inputs are quantized on int8 kernels and fuses the float ops
               after it (bias, HardSwish, SiLU's Mul, the next layer's quantize) into the kernel as
               post-ops; a Q/DQ pair between them cuts that fusion. This is where NNCF's OpenVINO backend
               puts its quantizers (inputs of the ops of its CPU hardware config, never after
               elementwise ops). Other activations keep the configured type (uint8 with zero points)
               unless the symmetric_activations refinement (below) finds zero point 0 harmless.
    hoisting   quantizers go above data movement (MaxPool, Split, Concat, Reshape, ...) when every reader
               there reads quantized values: the plugin moves the dequantization down through them, runs
               them on u8 and fuses the one quantize into the conv that makes the value. Binary ops read
               quantized inputs for the same reason: otherwise the skip branch (a Split output in YOLOv8's
               C2f, a block input in MobileNet) or the scaled map of a squeeze-excitation block is read
               in float and its quantize stands alone.
    weights    as configured (``weight_bits``); on x86 CPUs without VNNI (cpu.py) the plugin's u8 x s8 kernels
               add the products of each two adjacent input channels in a saturating int16 (255 * 127 * 2 >
               32767; depthwise convs sum in int32): 7-bit weights, and the opt-in "pairs" (MatMul/Gemm
               weights 8-bit with each same-sign pair there within 128, execution.WeightGrid), keep those
               sums exact (NNCF's overflow fix narrows its weights for the same reason); the check notes a
               model whose weights can clip there
    symmetric  its int8 kernels are faster with zero point 0 on their inputs (int8 symmetric), which costs
               levels on a value with a short negative tail: the symmetric_activations refinement tries it
               on every input no Concat reads or makes (the plugin computes a Concat of int8 inputs wrongly on some
               CPUs: bench/ov_int8_concat.py), runs both models with outputs() and keeps zero point 0 only
               when the outputs stay as close to float there (refinements/symmetric_activations.py)
    depthwise  its depthwise convs take per-channel input qparams (axis 1; ranges.depthwise_inputs)
    export     the QDQ model as it is: no channel padding, no float MaxPool readers (ORT-only shaping)
    check      the model compiled once: which conv/matmul layers the runtime graph executes in int8, as
               layers or inside its generated attention kernels (execution_check.py), and why a
               ConvTranspose reading a zero point runs in float, and the precision its float layers run in
               (bf16 on CPUs that have it, where the report's f32 figures are not what runs); needs
               openvino, else the record says why it was not checked
    timer      median latency of compiled models on one thread, timed interleaved (runtime.py)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from qnnx import ops
from qnnx.errors import QnnxError
from qnnx.ir.build import const_array
from qnnx.targets.execution import Int8Execution, MatchFacts, wide_int8_pairs
from qnnx.targets.openvino.cpu import pairs_saturate
from qnnx.targets.openvino.execution_check import (
    contractions,
    executed_layers,
    in_int8_kernels,
)
from qnnx.targets.openvino.runtime import compile_model, median_latency_ms, run

INPUTS_ONLY = Int8Execution(inputs=True, output=False)
ZERO_POINT_INPUTS = Int8Execution(inputs=True, output=False, zero_point_inputs=True)
FLOAT_PROBABILITIES = Int8Execution(inputs=False, output=False,
                                    why="left float for OpenVINO: quantizing the attention probabilities costs "
                                        "more than the int8 MatMul saves")
FLOAT = Int8Execution(inputs=False, output=False,
                      why="left float for OpenVINO: its CPU plugin fuses it into the conv/matmul kernel before it "
                          "(a quantize there would cut the fusion)")
QUANTIZED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")


@dataclass(frozen=True)
class OpenVinoRecord:
    """What :meth:`OpenVinoTarget.check` found: conv/matmul layers of the QDQ model reading quantized
    inputs, and the runtime graph's int8 and float conv/matmul layers."""

    quantized: int = 0
    int8: int = 0
    float_layers: list[str] = field(default_factory=list)
    unchecked: str = ""
    saturating: bool = False  # int8 weight pairs beyond 128 on a CPU whose u8 x s8 kernels clip 16-bit pair sums
    in_kernels: int = 0  # of the int8 ones, those inside the plugin's generated kernels (its attention kernel)
    shifted_deconvolutions: list[str] = field(default_factory=list)  # ConvTranspose nodes reading a zero point
    float_precision: str = ""  # what the plugin runs float layers in by default on this CPU (bf16 where it has it)

    def lines(self) -> list[str]:
        if self.unchecked:
            return [f"OpenVINO: the model was not compiled to check its int8 layers: {self.unchecked}"]
        out = ["note: OpenVINO on this CPU (x86 without VNNI) sums uint8 x int8 products in saturating 16-bit pairs, "
               "so large sums in this model's int8 layers can be clipped; --weight-bits 7 or pairs keeps each pair "
               "within what these kernels sum exactly"] if self.saturating else []
        kernels = f", {self.in_kernels} of them inside its attention kernels" if self.in_kernels else ""
        out += [f"OpenVINO (CPU) executes {self.int8} conv/matmul layer(s) in int8{kernels} ({self.quantized} "
                f"quantized in the model), {len(self.float_layers)} in float"]
        if self.int8 < self.quantized:
            where = (", ".join(self.float_layers[:8]) + (" ..." if len(self.float_layers) > 8 else "")
                     if self.float_layers else "not found in its runtime graph")
            out.append(f"WARNING: OpenVINO runs {self.quantized - self.int8} quantized conv/matmul layer(s) in "
                       f"float: {where}")
            if self.shifted_deconvolutions:
                out.append("  its int8 deconvolution takes no input zero point, and ConvTranspose "
                           + ", ".join(self.shifted_deconvolutions[:4]) + " reads one; --symmetric-activations auto "
                           "tries zero point 0 where the outputs stay as close to float")
        if self.float_precision not in ("", "f32"):
            out.append(f"note: OpenVINO runs this model's float layers in {self.float_precision} on this CPU (its "
                       "default there); this report's SQNR and cosine are computed in f32 on ONNX Runtime: `qnnx "
                       "compare --runtime openvino` measures the model as the plugin runs it (--precision f32 keeps "
                       "f32)")
        return out


class OpenVinoTarget:
    name = "openvino"
    label = "OpenVINO"
    hoists_quantizers = True
    # Its kernels run inputs with zero point 0 (int8 symmetric) faster than uint8 ones with a zero point
    # (docs/benchmarks.md): the symmetric_activations refinement tries it, measured with outputs().
    zero_point_zero_faster = True
    # The plugin computes a Concat of int8 inputs wrongly on some CPUs, and moves a quantize after a Concat
    # up to its inputs: values a Concat reads or makes keep uint8.
    unsigned_readers = ("Concat",)
    # Its x86 kernels without VNNI add the products of adjacent input channels in int16 pairs (checked
    # against the plugin in tests/targets/openvino): pair-limited weights are exact there.
    pairs_input_channels = True
    # Its depthwise convs take per-channel input scales and zero points (the dequantization moves past the
    # conv, one scale per output channel), as NNCF quantizes them: depthwise_inputs "per_channel" may be used.
    per_channel_depthwise_inputs = True
    # A float Mul by a constant before a FakeQuantize is folded into it, or into the post-ops of the layer
    # making its input (checked on all-MiniLM-L6-v2's runtime graph): smoothing may divide by a new Mul.
    folds_scales_into_quantizers = True

    def outputs(self, model: ir.Model, feeds) -> list[dict[str, np.ndarray]]:
        """Each feed's graph outputs by name, computed by the CPU plugin (one thread) from the exported
        model: how a candidate really runs there."""
        compiled = compile_model(self.export(model), threads=1)
        wanted = {v.name for v in model.graph.outputs}
        names = [next((n for n in sorted(o.get_names()) if n in wanted), o.get_any_name()) for o in compiled.outputs]
        return [dict(zip(names, run(compiled, feed))) for feed in feeds]

    def execution(self, facts: MatchFacts) -> Int8Execution:
        if facts.kind == "matmul/gemm" and facts.activations == 2:
            if "Softmax" in facts.input_ops:  # attention's probabilities times values: a quantize of the
                return FLOAT_PROBABILITIES    # heads x tokens x tokens map costs more than the MatMul gains
            return ZERO_POINT_INPUTS  # queries times keys: the plugin's int8 MatMul takes no zero points
        if facts.kind in ("conv", "conv transpose", "matmul/gemm", "pool"):
            return INPUTS_ONLY
        if facts.kind == "binary" and facts.activations == 2 and not facts.gates_itself:
            return INPUTS_ONLY  # a residual add, a squeeze-excitation scale: not SiLU's gate (a conv post-op)
        return FLOAT

    def export(self, qdq: ir.Model) -> ir.Model:
        """A copy of ``qdq`` (OpenVINO reads the QDQ form as it is)."""
        copy = qdq.clone()
        copy.producer_name = "qnnx"
        return copy

    def check(self, qdq: ir.Model) -> OpenVinoRecord:
        quantized = [n for n in qdq.graph
                     if n.op_type in QUANTIZED_OPS and n.inputs and _reads_dequantized(n.inputs[0])]
        try:
            compiled = compile_model(self.export(qdq), threads=1)
        except QnnxError as e:
            return OpenVinoRecord(len(quantized), unchecked=str(e))
        layers = executed_layers(compiled)
        int8, floats = contractions(layers)
        in_kernels = in_int8_kernels(quantized, layers)
        shifted = [n.name for n in quantized if n.op_type == "ConvTranspose" and _reads_zero_point(n.inputs[0])]
        return OpenVinoRecord(len(quantized), len(int8) + len(in_kernels),
                              [layer.fused or layer.name for layer in floats],
                              saturating=wide_int8_pairs(qdq) and pairs_saturate(), in_kernels=len(in_kernels),
                              shifted_deconvolutions=shifted, float_precision=_precision_name(compiled))

    def timer(self, models: Sequence[ir.Model], feed: dict, repeats: int) -> list[float]:
        """Median ms per inference of each model (CPU plugin, one thread), timed interleaved, each as exported."""
        return median_latency_ms([self.export(m) for m in models], feed=feed, threads=1, repeats=repeats)


def _precision_name(compiled) -> str:
    """The compiled model's inference precision of float layers, as the precision option spells it."""
    name = str(compiled.get_property("INFERENCE_PRECISION_HINT")).lower()
    return next((p for p, word in (("bf16", "bfloat16"), ("f16", "float16"), ("f32", "float32")) if word in name), name)


def _reads_zero_point(v: ir.Value) -> bool:
    """``v`` is dequantized (directly or through data movement) with a zero point other than 0."""
    p = _dequantizer(v)
    zero_point = const_array(p.inputs[2]) if p is not None and len(p.inputs) > 2 else None
    return zero_point is not None and bool(np.any(zero_point != 0))


def _reads_dequantized(v: ir.Value | None) -> bool:
    """``v`` is a DequantizeLinear's output, directly or through data movement (the plugin moves the
    dequantization down through it)."""
    return _dequantizer(v) is not None


def _dequantizer(v: ir.Value | None) -> ir.Node | None:
    """The DequantizeLinear making ``v``'s values, directly or through data movement; else None."""
    p = ops.maker(v, lambda n: ops.passed_on(n) is not None) if v is not None else None
    return p if p is not None and p.op_type == "DequantizeLinear" else None


__all__ = ["OpenVinoRecord", "OpenVinoTarget"]
