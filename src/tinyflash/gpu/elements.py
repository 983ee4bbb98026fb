"""An input element as float32, and a float32 result as an output element: the two conversions of a
CUDA-core kernel, which computes in float32 whatever its inputs' type.

float16 and float32 are numba types: ``float32(x)`` widens an element, and an assignment ``O[i] = value``
rounds a float32 into the array's type. bfloat16 is not (numba, like NumPy, has none): a bfloat16 array
reaches a kernel as its 16-bit patterns (an int16 or uint16 array, :func:`tinyflash.gpu.arrays.bfloat16_bits`),
and a pattern is the top half of a float32, so

* :func:`widen` puts the pattern in the top half of a 32-bit word: that word is the float32, exactly
  (``gpu.ptx.unpack``: a shift);
* :func:`narrow` rounds a float32 to nearest even and keeps the top half (``gpu.ptx.pack``: ``cvt.rn.bf16x2.f32``).

Each returns a device function chosen when a kernel is built, by the inputs' element type; for float16 and
float32 they are ``float32(x)`` and the value itself, so those kernels compile to what they were without
them. The tensor-core kernels move 16-bit patterns in pairs and do not need these (``warp_tile.py``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda, float32, uint16, uint32

from . import ptx

BFLOAT16 = "bfloat16"
BFLOAT16_COMPUTE_CAPABILITY = (8, 0)  # cvt.rn.bf16x2.f32, the rounding of narrow: Ampere on


def kernel_element(dtype) -> str | None:
    """What a kernel is built for, from the inputs' dtype (a NumPy dtype, or 'bfloat16'): 'bfloat16', or None
    for numba's own types."""
    return BFLOAT16 if str(dtype) == BFLOAT16 else None


def itemsize(dtype) -> int:
    """Bytes per element of ``dtype`` (a NumPy dtype, or 'bfloat16': 2)."""
    return 2 if str(dtype) == BFLOAT16 else np.dtype(dtype).itemsize


@lru_cache(maxsize=None)
def widen(element: str | None = None):
    """``widen(x) -> float32``: an element of an input array as float32, exactly; ``element`` 'bfloat16' for
    arrays of bfloat16 patterns (None, 'float16', 'float32': arrays of numba's own types)."""
    if element == BFLOAT16:
        unpack = ptx.unpack(BFLOAT16)

        @cuda.jit(device=True, inline="always")
        def widen_bfloat16(x):
            return unpack(uint32(x))[0]  # the pattern in a word's low half: its float32 is the shifted word

        return widen_bfloat16

    @cuda.jit(device=True, inline="always")
    def widen_float(x):
        return float32(x)

    return widen_float


@lru_cache(maxsize=None)
def narrow(element: str | None = None):
    """``narrow(value)``: what ``O[i] = narrow(value)`` stores for a float32 ``value``: its bfloat16 pattern,
    rounded to nearest even, for ``element`` 'bfloat16'; else the value, which the assignment rounds."""
    if element == BFLOAT16:
        pack = ptx.pack(BFLOAT16)

        @cuda.jit(device=True, inline="always")
        def narrow_bfloat16(value):
            return uint16(pack(value, float32(0.0)) & uint32(0xFFFF))  # the low half; the high one unused

        return narrow_bfloat16

    @cuda.jit(device=True, inline="always")
    def narrow_float(value):
        return value

    return narrow_float
