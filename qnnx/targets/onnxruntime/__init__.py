"""ONNX Runtime (CPU) as a deployment target.

    execution every pattern quantized whole (inputs and output): ORT's QDQ fusions want DQ -> op -> Q

    export   MaxPools read a per-channel DequantizeLinear so ORT keeps them float (max_pool.py); each
             quantized depthwise conv's channels padded to ORT's fast kernel (channel_padding.py)
    check    ORT's level-2 optimizer run once on the exported model: quantized conv/matmul groups it
             would leave float (fusion_check.py)
    timer    median latency on one thread, models timed interleaved (latency.py)
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field

import onnx_ir as ir

from qnnx.ir import save_model
from qnnx.targets.execution import WHOLE, Int8Execution, MatchFacts, wide_int8_weights
from qnnx.targets.onnxruntime.channel_padding import PaddingRecord, pad_depthwise_channels
from qnnx.targets.onnxruntime.fusion_check import unfused
from qnnx.targets.onnxruntime.kernels import u8s8_saturates
from qnnx.targets.onnxruntime.latency import median_latency_ms
from qnnx.targets.onnxruntime.max_pool import float_max_pools


@dataclass(frozen=True)
class OnnxRuntimeRecord:
    """What :meth:`OnnxRuntimeTarget.check` found: the channel padding the written model carries, and
    the quantized groups ORT's optimizer leaves float (of ``fusable``)."""

    padding: list[PaddingRecord] = field(default_factory=list)
    unfused: list[str] = field(default_factory=list)
    fusable: int = 0
    saturating: bool = False  # u8 x s8 weights beyond +-64 on a CPU whose ORT kernels clip 16-bit pair sums

    def lines(self) -> list[str]:
        out = []
        if self.saturating:
            out.append("note: ONNX Runtime on this CPU (x86 without VNNI) sums uint8 x int8 products in saturating "
                       "16-bit pairs (integer conv, matmul, gemm), so large sums in this model's integer layers can "
                       "be clipped (the output figures above include it); --weight-bits 7 keeps every weight within "
                       "[-64, 64], which these kernels sum exactly")
        if self.unfused:
            out.append(f"WARNING: ONNX Runtime (CPU) would run {len(self.unfused)} of {self.fusable} quantized "
                       "conv/matmul group(s) in float, not as integer kernels: " + ", ".join(self.unfused[:8])
                       + (" ..." if len(self.unfused) > 8 else ""))
        padded = [p for p in self.padding if p.padded]
        if padded:
            out.append(f"written for ONNX Runtime: {len(padded)} depthwise conv(s) padded to its fast kernel's "
                       "channel multiple (same output): " + ", ".join(f"{p.node} {p.channels}->{p.padded}"
                                                                        for p in padded[:8])
                       + (" ..." if len(padded) > 8 else ""))
        for p in [p for p in self.padding if not p.padded][:5]:
            out.append(f"  depthwise conv {p.node} ({p.channels} channels) not padded: {p.reason}")
        return out


class OnnxRuntimeTarget:
    name = "onnxruntime"
    label = "ONNX Runtime"

    hoists_quantizers = False  # every pattern's output is quantized where it is made
    zero_point_zero_faster = False  # its u8 x s8 kernels take zero points at no cost
    unsigned_readers: tuple[str, ...] = ()  # no op it computes wrongly on int8 inputs
    # Its x86 kernels without VNNI sum u8 x s8 products in int16 pairs in the order of its own packing and
    # im2col, not checked to pair adjacent input channels as OpenVINO's do.
    pairs_input_channels = False
    # Its QLinearConv takes one input scale and zero point (and its QDQ fusion rejects per-channel ones).
    per_channel_depthwise_inputs = False
    # A float Mul before a quantizer is one more float op here, and the elementwise unit making its input
    # (a GELU, for one) is quantized whole: smoothing would round that value twice.
    folds_scales_into_quantizers = False

    def execution(self, facts: MatchFacts) -> Int8Execution:
        """Every pattern whole: ORT fuses each DQ -> op -> Q group into one QLinear*/integer kernel."""
        return WHOLE

    def export(self, qdq: ir.Model) -> ir.Model:
        """A copy of ``qdq`` shaped for ORT's kernels (same output bits)."""
        return self._exported(qdq)[0]

    def check(self, qdq: ir.Model) -> OnnxRuntimeRecord:
        model, padding = self._exported(qdq)
        missed, fusable = unfused(model)
        u8 = any(n.op_type == "QuantizeLinear" and len(n.inputs) > 2 and n.inputs[2] is not None
                 and n.inputs[2].dtype == ir.DataType.UINT8 for n in model.graph)
        saturating = bool(fusable) and u8 and wide_int8_weights(model) and u8s8_saturates()
        return OnnxRuntimeRecord(padding, missed, fusable, saturating=saturating)

    def timer(self, models: Sequence[ir.Model], feed: dict, repeats: int) -> list[float]:
        """Median ms per run of each model (CPU, one thread), timed interleaved, each as exported."""
        with tempfile.TemporaryDirectory(prefix="qnnx_speed_") as tmp:
            paths = [os.path.join(tmp, f"variant{i}.onnx") for i in range(len(models))]
            for model, path in zip(models, paths):
                save_model(self.export(model), path)
            ms = median_latency_ms(paths, feed=feed, threads=1, repeats=repeats)
        return [ms[p] for p in paths]

    @staticmethod
    def _exported(qdq: ir.Model) -> tuple[ir.Model, list[PaddingRecord]]:
        copy = qdq.clone()
        copy.producer_name = "qnnx"
        float_max_pools(copy.graph)
        return copy, pad_depthwise_channels(copy.graph)


__all__ = ["OnnxRuntimeRecord", "OnnxRuntimeTarget"]
