"""Deployment targets: how the logical QDQ model is shaped, checked and timed for one runtime.

A target has a ``name`` (and a ``label`` for messages), five flags and four methods, the only runtime-specific
code of automatic quantization:

    execution(facts) -> Int8Execution  how it executes a pattern match (execution.MatchFacts: its kind,
                                       its anchor's op type, ...): quantized whole, inputs only (float
                                       output), or float (execution.py); the plan stage applies it
    hoists_quantizers                  whether quantizers go above data movement whose readers all read
                                       quantized values (``autoquant.plan.hoist_quantizers``)
    zero_point_zero_faster             whether its kernels run inputs with zero point 0 faster; such a target
                                       also has ``outputs(model, feeds)`` (the outputs by name its runtime
                                       computes), for the symmetric_activations refinement
    unsigned_readers                   op types it computes wrongly on int8 inputs: a value they read or make
                                       keeps a uint8 grid where zero point 0 is asked for
    pairs_input_channels               whether its x86 int8 kernels sum products of adjacent input channels in
                                       int16 pairs (checked), so pair-limited weights (weight_bits "pairs") are
                                       exact there
    per_channel_depthwise_inputs       whether its depthwise convs take per-channel (axis 1) input qparams
                                       (``per_channel_depthwise``: the config's depthwise_inputs resolved)
    folds_scales_into_quantizers       whether a float Mul by a constant right before a quantizer costs
                                       nothing there (folded into it): smoothing may then divide by a Mul
    export(qdq) -> ir.Model            the model as written for the runtime (a copy; same numbers)
    check(qdq)  -> record              what the runtime would do with it (a report record: ``lines()``)
    timer(models, feed, repeats)       median ms of each model on the runtime, timed interleaved

The canonical qnnx form is what the plan quantized: it follows ``execution`` (which ops are integer),
never the export's shaping.
"""

from __future__ import annotations

from qnnx.errors import QnnxError
from qnnx.targets.execution import PAIRS, WeightGrid
from qnnx.targets.onnxruntime import OnnxRuntimeTarget
from qnnx.targets.openvino import OpenVinoTarget

TARGETS = {"onnxruntime": OnnxRuntimeTarget(), "openvino": OpenVinoTarget()}


def target(name: str):
    """The registered target called ``name``."""
    try:
        return TARGETS[name]
    except KeyError:
        raise QnnxError(f"unknown target {name!r}; expected one of {', '.join(TARGETS)}") from None


def weight_grid(target_name: str, weight_bits: int | str) -> WeightGrid:
    """The weight grid of a config: 7 or 8 bits for every weight, or "pairs" (7-bit convs, MatMul/Gemm
    weights 8-bit with int16 pairs limited) on a target whose kernels pair adjacent input channels."""
    if weight_bits != "pairs":
        return WeightGrid(weight_bits)
    if not target(target_name).pairs_input_channels:
        raise QnnxError(f"weight_bits 'pairs' keeps the weights of adjacent input channels within what OpenVINO's "
                        f"x86 kernels sum exactly in int16 pairs; how {target_name}'s kernels pair products was not "
                        "checked: use weight_bits 7 (exact on every CPU) or 8")
    return PAIRS


def per_channel_depthwise(target_name: str, depthwise_inputs: str, per_channel_weights: bool) -> bool:
    """Whether depthwise conv inputs get per-channel qparams under ``depthwise_inputs`` ("per_tensor" or
    "per_channel"); "per_channel" is a :class:`QnnxError` unless the target's depthwise kernels take them and
    the weights are per-channel (the int32 accumulator's scale is then one input channel's times one weight
    channel's)."""
    if depthwise_inputs != "per_channel":
        return False
    if not target(target_name).per_channel_depthwise_inputs:
        raise QnnxError(f"depthwise_inputs 'per_channel' needs a target whose depthwise convs take per-channel "
                        f"input qparams (openvino); {target_name}'s take one scale and zero point")
    if not per_channel_weights:
        raise QnnxError("depthwise_inputs 'per_channel' needs per-channel weights (per_channel=True)")
    return True
