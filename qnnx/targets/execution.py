"""How a target executes one kind of quantization pattern: what the plan quantizes for it.

    Int8Execution(inputs=True, output=True)    integer in, integer out (ONNX Runtime's QLinear* kernels)
    Int8Execution(inputs=True, output=False)   integer inputs, float output: the runtime dequantizes the
                                               int32 accumulator and fuses the float ops after it
    Int8Execution(inputs=False, output=False)  float (``why`` says why it is left so for this target)

A target answers :meth:`execution` for a pattern kind ("conv", "matmul/gemm", "binary", ...); the plan
stage applies the answers (``autoquant.plan.for_target``). Kinds are strings so targets need nothing of
autoquant.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Int8Execution:
    inputs: bool = True
    output: bool = True
    why: str = ""

    def __post_init__(self):
        if self.output and not self.inputs:
            raise ValueError("a pattern with a quantized output and float inputs is not an execution")


WHOLE = Int8Execution()
