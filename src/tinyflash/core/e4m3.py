"""The 8-bit float e4m3 (``float8_e4m3fn``): what its 256 bit patterns mean, and rounding to it.

Hopper's tensor cores multiply 8-bit floats at twice the 16-bit rate. Of the two 8-bit formats, attention's
inputs use e4m3 (more precision, less range; e5m2 is the other way round). Its byte, from the top bit down::

    s eeee mmm        1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits

    e = 1 .. 15   normal:     (-1)^s · 1.mmm (binary) · 2^(e - 7)     (1 + m/8) · 2^(e-7)
    e = 0         subnormal:  (-1)^s · 0.mmm (binary) · 2^-6          m · 2^-9: 0, 2^-9, ..., 7 · 2^-9
    s 1111 111    NaN (0x7F, 0xFF): the only patterns given up, so that e = 15 still holds 7 numbers

There is no infinity (the "fn" of the name: finite, and NaN). The largest number is 1.110 · 2^8 = 448
(``s 1111 110``), the smallest normal 2^-6, the smallest subnormal 2^-9. Between 2^e and 2^(e+1) lie 8 numbers
spaced 2^(e-3) apart: rounding to nearest errs by at most half of that, 2^(e-4) <= 2^-4 · |x|, a relative error
of 1/16 (3 mantissa bits; float16 has 10, bfloat16 7). Below 2^-6 the spacing stays 2^-9, and the error at most
2^-10 absolute.

:func:`round_e4m3` rounds as the GPU's ``cvt.rn.satfinite.e4m3x2.f32`` does: to the nearest e4m3 number, ties
to the one whose last mantissa bit is 0 (round half to even), magnitudes beyond 448 (infinities too) to ±448
(``satfinite``: saturate to the largest finite number), NaN to NaN. :func:`encode_e4m3` gives the bytes,
:func:`decode_e4m3` their values. Plain NumPy: the spacing of the numbers around x comes from ``np.frexp`` (x's
binary exponent), and ``np.rint`` rounds x / spacing to an integer, half to even. ml_dtypes'
``float8_e4m3fn`` (the NumPy type PyTorch's ``torch.float8_e4m3fn`` matches bit for bit) implements the same
format; the tests check these functions against it for every byte, every tie and a million random floats.
"""

from __future__ import annotations

import numpy as np

EXPONENT_BIAS = 7  # the stored exponent e means 2^(e - 7)
MANTISSA_BITS = 3  # 8 numbers per binade
MIN_EXPONENT = -6  # the smallest normal number is 2^-6; below it the spacing stays 2^(-6 - 3) = 2^-9
E4M3_MAX = 448.0  # 1.110 (binary) · 2^8, the largest finite number: what satfinite saturates to
SMALLEST_SUBNORMAL = 2.0 ** -9  # 0 0000 001
NAN_BITS = 0x7F  # 0 1111 111; 0xFF (the sign set) is NaN too
E4M3_EPSILON = 2.0 ** -MANTISSA_BITS  # the spacing just above 1: 1.125 - 1
UNIT_ROUNDOFF = 2.0 ** -(MANTISSA_BITS + 1)  # half of it: rounding to nearest errs by at most 2^-4 · |x| (normal x)


def _float_array(x, name: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype.kind != "f":
        raise TypeError(f"{name} must hold floats (float16, float32 or float64); got dtype {x.dtype}")
    return x


def spacing_e4m3(x) -> np.ndarray:
    """The distance between the two e4m3 numbers around |x| (float64): 2^(E - 3) for |x| in [2^E, 2^(E+1)),
    and 2^-9 below 2^-6, where the subnormals keep the spacing of the smallest binade."""
    a = np.abs(_float_array(x, "x").astype(np.float64))
    _, e = np.frexp(a)  # a = f · 2^e with f in [0.5, 1): a lies in the binade [2^(e-1), 2^e)
    binade = np.maximum(e - 1, MIN_EXPONENT)  # subnormals (and 0) share the smallest normal binade's spacing
    return np.ldexp(1.0, binade - MANTISSA_BITS)


@np.errstate(invalid="ignore", over="ignore")
def round_e4m3(x) -> np.ndarray:
    """``x`` (float16, float32 or float64) rounded to the nearest e4m3 number, in x's dtype (every e4m3 number is
    exact in each): ties to even, beyond ±448 (and ±inf) saturated to ±448, NaN kept, the sign of zero kept."""
    x = _float_array(x, "x")
    a = np.abs(x.astype(np.float64))  # exact: float64 holds every float16 and float32
    step = spacing_e4m3(a)  # the spacing of e4m3 numbers around a, a power of two
    # a / step is exact (a power of two); np.rint rounds it to the nearest integer, half to even: an even
    # integer is a last mantissa bit of 0. An integer of 16 is the next binade's first number, which is right.
    rounded = np.rint(a / step) * step
    rounded = np.minimum(rounded, E4M3_MAX)  # satfinite: 464 and beyond (inf too) would overflow; keep 448
    rounded = np.where(np.isnan(a), np.nan, rounded)  # NaN stays NaN (np.minimum keeps it too: said twice)
    return np.copysign(rounded, x).astype(x.dtype, copy=False)


def encode_e4m3(x) -> np.ndarray:
    """The e4m3 byte (uint8) of ``x`` rounded by :func:`round_e4m3`; every NaN becomes 0x7F."""
    r = round_e4m3(x).astype(np.float64)
    a = np.abs(r)
    sign = np.signbit(r).astype(np.uint8) << 7  # s . . . . . . .
    _, e = np.frexp(a)  # a in [2^(e-1), 2^e)
    normal = a >= 2.0 ** MIN_EXPONENT
    exponent = np.where(normal, e - 1 + EXPONENT_BIAS, 0)  # . e e e e . . .   (0 for subnormals and 0)
    # the mantissa: a / 2^(e-1) = 1.mmm for a normal number, a / 2^-9 = mmm for a subnormal one
    mantissa = np.where(normal, np.ldexp(a, MANTISSA_BITS - (e - 1)) - 2 ** MANTISSA_BITS,
                        a / SMALLEST_SUBNORMAL)
    with np.errstate(invalid="ignore"):  # NaN entries, replaced just below
        bits = sign | (exponent.astype(np.uint8) << MANTISSA_BITS) | np.nan_to_num(mantissa).astype(np.uint8)
    return np.where(np.isnan(r), np.uint8(NAN_BITS), bits).astype(np.uint8)


def decode_e4m3(bits) -> np.ndarray:
    """The values (float32, exact) of e4m3 bytes: a uint8 array, or anything NumPy can view as one."""
    bits = np.asarray(bits)
    if bits.dtype.itemsize != 1:
        raise TypeError(f"bits must be e4m3 bytes (uint8 or float8_e4m3fn); got dtype {bits.dtype}")
    bits = bits.view(np.uint8).astype(np.int32)
    sign = np.where(bits & 0x80, -1.0, 1.0)
    e, m = (bits >> MANTISSA_BITS) & 0xF, bits & 0x7  # exponent field, mantissa field
    magnitude = np.where(e == 0, m * SMALLEST_SUBNORMAL,  # 0.mmm · 2^-6
                         np.ldexp(1.0 + m / 2 ** MANTISSA_BITS, e - EXPONENT_BIAS))  # 1.mmm · 2^(e-7)
    value = np.where((bits & 0x7F) == NAN_BITS, np.nan, sign * magnitude)
    return value.astype(np.float32)
