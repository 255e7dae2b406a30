"""Does this CPU's int8 dot product saturate? On x86 without VNNI (AVX2, AVX-512F alone), oneDNN's u8 x s8
kernels multiply with ``vpmaddubsw``, which adds each pair of u8 * s8 products in a saturating int16:
255 * 127 * 2 = 64770 > 32767, so large activations against large weights clip. VNNI (``vpdpbusd``)
and AMX accumulate in int32. The flags come from ``/proc/cpuinfo``; elsewhere (or unreadable) the
answer is that it saturates, the safe side (7-bit weights cost a little precision, never a wrong sum)."""

from __future__ import annotations

import platform
from functools import cache

EXACT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


@cache
def pairs_saturate() -> bool:
    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return False  # ARM's int8 dot products (sdot/udot) accumulate in int32
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return True
    return not any(flag in flags for flag in EXACT_FLAGS)
