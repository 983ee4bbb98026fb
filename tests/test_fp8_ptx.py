"""The FP8 conversions of tinyflash.gpu.fp8 in a kernel, against the NumPy rounding of core/e4m3.py.

Without a GPU the kernel runs on numba's simulator, with the emulations of gpu/fp8_emulation.py (ml_dtypes'
rounding, clipped to ±448); on a GPU the very same test runs the instructions themselves.
"""

import numpy as np
import pytest
from numba import cuda

from tinyflash.core.e4m3 import E4M3_MAX, SMALLEST_SUBNORMAL, decode_e4m3, encode_e4m3, round_e4m3
from tinyflash.gpu import fp8, ptx
from tinyflash.gpu.fp8_emulation import pack_e4m3x2, unpack_e4m3x2


def edge_values(rng, n):
    """Ties between e4m3 numbers, the edges of the range, NaN and ±inf, and random floats of every size."""
    ties = np.array([1.0625, 1.1875, 464.0, 3 * SMALLEST_SUBNORMAL / 2, SMALLEST_SUBNORMAL / 2, 0.0, -0.0, 449.0,
                     1e9, np.inf, -np.inf, np.nan, E4M3_MAX, 2.0**-6, 0.3, 240.0], dtype=np.float32)
    rest = rng.standard_normal(n - ties.size * 2) * np.exp2(rng.uniform(-12, 10, n - ties.size * 2))
    return np.concatenate([ties, -ties, rest]).astype(np.float32)


def conversion_kernel():
    unpack_f16 = ptx.unpack("float16")

    @cuda.jit
    def kernel(x, pairs, back):
        """Lane i converts x[2i] (low byte) and x[2i + 1] (high byte), and widens the pair back to two floats."""
        i = cuda.threadIdx.x
        pair = fp8.pack_e4m3x2(x[2 * i], x[2 * i + 1])
        pairs[i] = pair
        lo, hi = unpack_f16(fp8.unpack_e4m3x2(pair))
        back[2 * i] = lo
        back[2 * i + 1] = hi

    return kernel


@pytest.mark.simulator
def test_e4m3_pack_and_unpack_in_a_kernel(rng):
    x = edge_values(rng, 64)  # (64,): 32 lanes, two values each
    pairs, back = np.zeros(32, np.uint16), np.zeros(64, np.float32)
    conversion_kernel()[1, 32](x, pairs, back)
    bytes_ = encode_e4m3(x)  # (64,) NumPy's rounding; every NaN 0x7F, as cvt writes it
    assert np.array_equal(pairs & 0xFF, bytes_[0::2]) and np.array_equal(pairs >> 8, bytes_[1::2])
    assert np.array_equal(back, round_e4m3(x), equal_nan=True)


def test_emulation_matches_numpy_on_many_values(rng):
    """The emulation alone (no kernel), on every byte's value and on ties and random floats."""
    x = np.concatenate([edge_values(rng, 4000), decode_e4m3(np.arange(256, dtype=np.uint8))])
    x = x[: x.size // 2 * 2]
    pairs = np.array([pack_e4m3x2(lo, hi) for lo, hi in zip(x[0::2], x[1::2])], dtype=np.uint16)
    assert np.array_equal(np.stack([pairs & 0xFF, pairs >> 8], axis=-1).reshape(-1), encode_e4m3(x))
    words = np.array([unpack_e4m3x2(p) for p in pairs], dtype=np.uint32)
    halves = np.stack([words & 0xFFFF, words >> 16], axis=-1).reshape(-1).astype(np.uint16).view(np.float16)
    assert np.array_equal(halves.astype(np.float32), round_e4m3(x), equal_nan=True)
