"""Which convolutions and matmuls OpenVINO's CPU plugin executes in int8, read from the compiled model.

The plugin decides per layer after its low-precision transformations: a conv or matmul whose input and
weights reach it as quantized values runs on u8/i8 kernels; one whose quantization could not be
propagated to it (a Q/DQ pair in the wrong place, an unsupported zero point) silently runs in float.
The runtime graph (``compiled.get_runtime_model()``) names each executed layer's type
(``layerType``), its precision (``runtimePrecision``) and the original layers fused into it
(``originalLayersNames``). A group of ops the plugin compiles into one generated kernel (a ``Subgraph``
layer: its attention kernel takes queries x keys, the scaling and mask, the softmax and probabilities x
values) lists its ops but not always the first one, which it renames.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import onnx_ir as ir

CONTRACTIONS = ("Convolution", "Deconvolution", "FullyConnected", "MatMul", "GroupConvolution")
INT8 = ("u8", "i8", "U8", "I8")


@dataclass(frozen=True)
class ExecutedLayer:
    name: str
    layer_type: str
    precision: str
    fused: str  # the original layers this one executes, comma-separated


def executed_layers(compiled) -> list[ExecutedLayer]:
    """Every layer of the runtime graph, in execution order."""
    out = []
    for op in compiled.get_runtime_model().get_ordered_ops():
        rt = op.get_rt_info()

        def info(key: str) -> str:
            return rt[key].astype(str) if key in rt else ""

        out.append(ExecutedLayer(op.get_friendly_name(), info("layerType"), info("runtimePrecision"),
                                 info("originalLayersNames")))
    return out


def contractions(layers: list[ExecutedLayer]) -> tuple[list[ExecutedLayer], list[ExecutedLayer]]:
    """(int8, float) conv/matmul layers."""
    mine = [layer for layer in layers if layer.layer_type in CONTRACTIONS]
    return [layer for layer in mine if layer.precision in INT8], [layer for layer in mine if layer.precision not in INT8]


def in_int8_kernels(nodes: Iterable[ir.Node], layers: list[ExecutedLayer]) -> list[str]:
    """The names of ``nodes`` (quantized convs/matmuls) that an int8 ``Subgraph`` layer executes rather than
    a conv/matmul layer: one the layer lists, itself, an op reading its output, one reading that op's output
    or one making its input (the converter renames the ops it rewrites, the plugin the group's first op:
    PP-OCRv5 rec's kernel lists neither its queries x keys MatMul nor the Softmax after it, only the
    MatMul after that). A node whose output a conv/matmul layer lists is that layer's (the converter names
    a layer making a graph output after it)."""
    listed = {name for layer in layers if layer.layer_type in CONTRACTIONS
              for name in (layer.name, *layer.fused.split(","))}
    kernels = [{layer.name, *layer.fused.split(",")} - {""} for layer in layers
               if layer.layer_type == "Subgraph" and layer.precision in INT8]
    out = []
    for node in nodes:
        if node.name in listed or any(v.name in listed for v in node.outputs):
            continue
        readers = [use.node for v in node.outputs for use in v.uses()]
        near = ({node.name} | {r.name for r in readers}
                | {use.node.name for r in readers for v in r.outputs for use in v.uses()}
                | {v.producer().name for v in node.inputs if v is not None and v.producer() is not None})
        if any(near & kernel for kernel in kernels):
            out.append(node.name)
    return out
