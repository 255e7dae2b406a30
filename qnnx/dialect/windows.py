"""Sliding-window geometry shared by conv and pooling (ONNX conventions: NC + spatial,
``pads = [begin..., end...]``, ``auto_pad``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qnnx.errors import QnnxError


@dataclass(frozen=True)
class Window:
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]  # begin..., end...
    out: tuple[int, ...]

    def padded(self, x: np.ndarray) -> np.ndarray:
        """``x`` (already shifted so that padding means 0) zero-padded on the spatial dims."""
        n = len(self.kernel)
        widths = [(0, 0), (0, 0)] + [(self.pads[i], self.pads[i + n]) for i in range(n)]
        return np.pad(x, widths)

    def taps(self, xp: np.ndarray):
        """Yield ``(kernel_index, view)``: the strided view of ``xp`` each kernel tap sees."""
        for idx in np.ndindex(*self.kernel):
            sl = tuple(slice(k * d, k * d + s * (o - 1) + 1, s)
                       for k, d, s, o in zip(idx, self.dilations, self.strides, self.out))
            yield idx, xp[(slice(None), slice(None), *sl)]

    def divisors(self, spatial: tuple[int, ...], count_include_pad: bool):
        """Average pooling's divisor: the window size, or (``count_include_pad`` off, with padding)
        the number of non-pad elements at each output position, float64 of shape 1 x 1 x out."""
        if count_include_pad or not any(self.pads):
            return np.float64(np.prod(self.kernel))
        ones = np.ones((1, 1, *spatial), dtype=np.int64)
        return sum(view for _, view in self.taps(self.padded(ones))).astype(np.float64)


def window(spatial: tuple[int, ...], kernel, strides, dilations, pads, auto_pad: str) -> Window:
    n = len(spatial)
    kernel = tuple(int(k) for k in kernel)
    strides = tuple(int(s) for s in (strides or [1] * n))
    dilations = tuple(int(d) for d in (dilations or [1] * n))
    if len(kernel) != n or len(strides) != n or len(dilations) != n:
        raise QnnxError(f"kernel/strides/dilations rank does not match {n} spatial dims")
    if min(strides) < 1 or min(dilations) < 1:
        raise QnnxError("strides and dilations must be >= 1")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
            small, large = total // 2, total - total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else large)
            end.append(large if auto_pad == "SAME_UPPER" else small)
        pads = tuple(begin + end)
    elif auto_pad == "VALID":
        pads = (0,) * (2 * n)
    elif auto_pad in ("NOTSET", "", None):
        pads = tuple(int(p) for p in (pads or [0] * (2 * n)))
        if len(pads) != 2 * n:
            raise QnnxError(f"pads must have {2 * n} values, got {len(pads)}")
    else:
        raise QnnxError(f"unknown auto_pad {auto_pad!r}")
    out = tuple((size + pads[i] + pads[i + n] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1
                for i, size in enumerate(spatial))
    if min(out) < 1:
        raise QnnxError(f"kernel {kernel} does not fit input {spatial} with pads {pads}")
    return Window(kernel, strides, dilations, pads, out)
