"""How a target executes one kind of quantization pattern: what the plan quantizes for it.

    Int8Execution(inputs=True, output=True)    integer in, integer out (ONNX Runtime's QLinear* kernels)
    Int8Execution(inputs=True, output=False)   integer inputs, float output: the runtime dequantizes the
                                               int32 accumulator and fuses the float ops after it
    Int8Execution(inputs=False, output=False)  float (``why`` says why it is left so for this target)

A target answers :meth:`execution` for the :class:`MatchFacts` of each pattern match (its kind: "conv",
"matmul/gemm", "binary", ...; its anchor's op type; ...); the plan stage applies the answers
(``autoquant.plan.for_target``). Facts are plain values so targets need nothing of autoquant.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir


@dataclass(frozen=True)
class Int8Execution:
    inputs: bool = True
    output: bool = True
    why: str = ""
    zero_point_inputs: bool = False  # its integer inputs need zero point 0 (OpenVINO's MatMul of two activations)

    def __post_init__(self):
        if self.output and not self.inputs:
            raise ValueError("a pattern with a quantized output and float inputs is not an execution")


WHOLE = Int8Execution()


@dataclass(frozen=True)
class MatchFacts:
    """What a target is told about one pattern match."""

    kind: str  # the pattern's kind ("conv", "binary", ...)
    op_type: str = ""  # its anchor's op type
    activations: int = 1  # activation inputs (a binary op with a constant operand has one)
    gates_itself: bool = False  # a Mul of a value and an elementwise function of it (SiLU, x * hardsigmoid(x))
    input_ops: tuple[str, ...] = ()  # op types making its activation inputs, past data movement ("": graph input)


def wide_int8_weights(model: ir.Model) -> bool:
    """Whether a constant int8 tensor behind a DequantizeLinear holds a value beyond +-64: a pair of such
    products with uint8 255 overflows the int16 sums of u8 x s8 kernels without VNNI (``weight_bits`` 7
    keeps them within it)."""
    for n in model.graph:
        if n.op_type == "DequantizeLinear" and n.inputs[0].const_value is not None \
                and n.inputs[0].dtype == ir.DataType.INT8:
            q = n.inputs[0].const_value.numpy()
            if q.size and int(np.abs(q.astype(np.int16)).max()) > 64:
                return True
    return False
