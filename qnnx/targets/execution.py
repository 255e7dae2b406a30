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

from qnnx import numerics, ops


@dataclass(frozen=True)
class Int8Execution:
    inputs: bool = True
    output: bool = True
    why: str = ""
    # its integer inputs need zero point 0 (OpenVINO's MatMul of two activations; autoquant.plan.zero_point_zero:
    # uint8 from 0 when never negative, else int8 symmetric)
    zero_point_inputs: bool = False

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


@dataclass(frozen=True)
class WeightGrid:
    """The integers a target's conv/matmul weights take (int8, symmetric, per output channel).

    bits 7          [-64, 64]: a pair of products with uint8 255 fits the int16 sums of x86 kernels without
                    VNNI (numerics.U8S8_PAIR_LIMIT), whatever pairs they sum
    bits 8          [-128, 127]: for kernels that accumulate in 32 bits (VNNI, AMX, ARM)
    int16_pairs     op types (MatMul, Gemm: weight_rounding re-rounds them within the pair limit; it rounds
                    conv weights within a box range) whose weights take 8 bits instead, each output
                    channel's scale widened so that every same-sign pair of weights on adjacent input
                    channels sums to at most numerics.U8S8_PAIR_LIMIT: exact on kernels that pair adjacent
                    input channels (oneDNN's, so OpenVINO's: checked against the plugin in
                    tests/targets/openvino), and nearly as fine as 8 bits
    """

    bits: int = 7
    int16_pairs: tuple[str, ...] = ()

    def __post_init__(self):
        if self.bits not in (7, 8):
            raise ValueError(f"no {self.bits}-bit weight grid")
        if not set(self.int16_pairs) <= {"MatMul", "Gemm"}:
            raise ValueError(f"pair-limited weights are for MatMul and Gemm, not {self.int16_pairs}")

    def pairs(self, op_type: str) -> bool:
        """Whether ``op_type``'s weights take the pair-limited 8-bit grid."""
        return op_type in self.int16_pairs

    def range(self, op_type: str) -> tuple[int, int]:
        """The integers ``op_type``'s weights may take (the symmetric 7-bit scale maps the largest
        magnitude to 63.5, which rounds to 64: two products 255 * 64 still fit in int16)."""
        return (-64, 64) if self.bits == 7 and not self.pairs(op_type) else (-128, 127)


def wide_int8_weights(model: ir.Model) -> bool:
    """Whether a constant int8 tensor behind a DequantizeLinear holds a value beyond +-64: a pair of such
    products with uint8 255 overflows the int16 sums of u8 x s8 kernels without VNNI (``weight_bits`` 7
    keeps them within it)."""
    for n in model.graph:
        if n.op_type == "DequantizeLinear" and n.inputs[0].const_value is not None \
                and n.inputs[0].dtype == ir.DataType.INT8:
            q = n.inputs[0].const_value.numpy()
            if _beyond_7_bits(q):
                return True
    return False


def _beyond_7_bits(q: np.ndarray) -> bool:
    """Whether int8 values ``q`` leave [-64, 64], the 7-bit grid whose every pair a u8 x s8 kernel sums exactly."""
    return bool(q.size) and int(np.abs(q.astype(np.int16)).max()) > 64


def wide_int8_pairs(model: ir.Model) -> bool:
    """Whether a conv/matmul reads constant int8 weights (through a DequantizeLinear) with a same-sign pair
    on adjacent input channels beyond numerics.U8S8_PAIR_LIMIT, which kernels summing those pairs in int16
    can clip; weights whose input-channel axis is unknown count when beyond +-64."""
    for node in model.graph:
        for i, v in enumerate(node.inputs):
            dq = v.producer() if v is not None else None
            if dq is None or dq.op_type != "DequantizeLinear" or dq.inputs[0].const_value is None \
                    or dq.inputs[0].dtype != ir.DataType.INT8:
                continue
            q = dq.inputs[0].const_value.numpy().astype(np.int64)
            axis = ops.reduction_axis(node, i, q.ndim)
            if axis is None:
                if node.op_type in ("Conv", "ConvTranspose", "MatMul", "Gemm") and _beyond_7_bits(q):
                    return True
            elif numerics.same_sign_pair_sums(q, axis).max(initial=0) > numerics.U8S8_PAIR_LIMIT:
                return True
    return False


PAIRS = WeightGrid(7, int16_pairs=("MatMul", "Gemm"))  # weight_bits "pairs": 7-bit convs, pair-limited matmuls
