"""Measure the sigmoid table TFLite's int16 LOGISTIC and TANH kernels interpolate, from LiteRT's interpreter.

The int16 TANH reference kernel reads entry ``|v| >> 8`` of a 256-entry unsigned Q0.16 table and
interpolates with the low 8 bits of ``v`` (the input rescaled to 1/(3*4096) steps); at ``v = 256 k`` the
fraction is 0 and the output is exactly ``table[k] - 32768``. With an input scale of 1/12288 the
rescaling is the identity (v = x), which reaches k <= 127; with 2/12288, v = 2x reaches the rest. The
entries are no formula's (44 are one off the rounded sigmoid), so qnnx.numerics_tflite stores what
this script prints:

    python bench/tflite_sigmoid_table.py          # needs ai-edge-litert (the dev extra)

tests/frontends/test_tflite_ops.py measures it again and compares.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.frontends.tflite_build import T, model, run  # noqa: E402


def tanh_outputs(x_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Every int16 input and LiteRT's reference int16 TANH of it (output scale 2**-15, zero points 0)."""
    x = np.arange(-32768, 32768).astype(np.int16).reshape(1, -1)
    m = model("TANH", [T(x.shape, np.int16, x_scale, 0)], [T(x.shape, np.int16, 2 ** -15, 0)])
    return x[0].astype(np.int64), run(m, [x])[0][0].astype(np.int64)


def measured_table() -> np.ndarray:
    table = np.empty(256, np.int64)
    x, y = tanh_outputs(1 / 12288)  # v = x
    for k in range(128):
        table[k] = y[x == 256 * k][0] + 32768
    x, y = tanh_outputs(2 / 12288)  # v = 2 x
    for k in range(128, 256):
        table[k] = y[x == 128 * k][0] + 32768
    return table


if __name__ == "__main__":
    t = measured_table()
    print(",\n".join(", ".join(str(int(v)) for v in t[i:i + 16]) for i in range(0, 256, 16)))
