"""The FP8 conversions of ``fp8.py``, emulated for numba's CUDA simulator.

Each lane converts its own values, so no exchange between lanes is needed (unlike ``ptx_emulation``'s warp-level
instructions). The rounding to e4m3 is ml_dtypes' ``float8_e4m3fn`` (round to nearest, ties to even), after
clipping to ±448, which is the instruction's ``satfinite``: ``gpu/`` imports nothing of tinyflash's mathematics
(``core/``), and the tests check this emulation, in a kernel, against ``core.e4m3.round_e4m3``, so the two
independent roundings are checked against each other as well.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

E4M3_MAX = 448.0  # the largest e4m3 number: what .satfinite saturates to
NAN_BYTE = 0x7F  # the NaN that cvt writes


def to_e4m3_byte(x) -> int:
    """The e4m3 byte of the float32 ``x`` as ``cvt.rn.satfinite`` rounds it."""
    x = np.float32(x)
    if np.isnan(x):
        return NAN_BYTE
    return int(np.clip(np.array(x), -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn).view(np.uint8))


def pack_e4m3x2(lo, hi):
    """Emulated ``cvt.rn.satfinite.e4m3x2.f32``: ``lo`` in the low byte, ``hi`` in the high byte."""
    return np.uint16(to_e4m3_byte(lo) | (to_e4m3_byte(hi) << 8))


def unpack_e4m3x2(pair):
    """Emulated ``cvt.rn.f16x2.e4m3x2``: each byte's value as a float16 (exact), the low byte's in the low half."""
    pair = int(pair)
    halves = np.array([pair & 0xFF, pair >> 8], dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float16)
    bits = halves.view(np.uint16)
    return np.uint32(int(bits[0]) | (int(bits[1]) << 16))


def e4m3_values(bits) -> np.ndarray:
    """The float32 values of e4m3 bytes (an array of uint8): what the FP8 tensor cores read (``wgmma_emulation``)."""
    return np.asarray(bits, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
