"""e4m3 (core/e4m3.py) against ml_dtypes' float8_e4m3fn, and the FP8 quantization (core/quantize.py).

ml_dtypes rounds to nearest even but turns what overflows into NaN (e4m3 has no infinity); the GPU's
``cvt.rn.satfinite`` saturates to ±448 instead. So the reference for a float x is ml_dtypes' rounding of
clip(x, -448, 448): the same where x is within range, 448 where it is not (clipping moves no value within
range, and 448 is its own rounding).
"""

import ml_dtypes
import numpy as np
import pytest

from tinyflash import quantize_fp8
from tinyflash.core.e4m3 import (E4M3_MAX, SMALLEST_SUBNORMAL, UNIT_ROUNDOFF, decode_e4m3, encode_e4m3,
                                 round_e4m3)
from tinyflash.core.quantize import hadamard_rotate, random_signs

E4M3 = ml_dtypes.float8_e4m3fn
ALL_BYTES = np.arange(256, dtype=np.uint8)


def ml_round(x):
    """ml_dtypes' rounding with the GPU's saturation: the reference."""
    return np.clip(x, -E4M3_MAX, E4M3_MAX).astype(E4M3).astype(x.dtype)


def ties_and_neighbours(dtype):
    """Every midpoint between neighbouring e4m3 numbers (exact in float32), and the floats just beside each."""
    values = np.unique(decode_e4m3(ALL_BYTES)[~np.isnan(decode_e4m3(ALL_BYTES))].astype(np.float64))  # 253 values
    mids = (values[:-1] + values[1:]) / 2  # exact: neighbours differ by a power of two times a small integer
    mids = np.concatenate([mids, [464.0, -464.0]])  # 448's tie with 480, which e4m3 does not have
    mids = mids.astype(dtype)
    return np.concatenate([mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf)])


def test_every_byte_decodes_and_encodes_as_ml_dtypes():
    ours, ref = decode_e4m3(ALL_BYTES), ALL_BYTES.view(E4M3).astype(np.float32)
    assert np.array_equal(ours, ref, equal_nan=True)
    finite = ~np.isnan(ref)
    assert np.array_equal(encode_e4m3(ref[finite]), ALL_BYTES[finite])  # -0 too: 0x80
    assert set(ALL_BYTES[~finite]) == {0x7F, 0xFF} and (encode_e4m3(ref[~finite]) == 0x7F).all()
    assert np.nanmax(ours) == E4M3_MAX and ours[ours > 0].min() == SMALLEST_SUBNORMAL


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_rounding_matches_ml_dtypes_on_ties_and_edges(dtype):
    x = ties_and_neighbours(dtype)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 448, 449, 1e4, SMALLEST_SUBNORMAL / 2,
                         SMALLEST_SUBNORMAL / 2 * 1.001, -SMALLEST_SUBNORMAL * 1.5], dtype=dtype)
    x = np.concatenate([x, specials, -x])
    ours = round_e4m3(x)
    assert ours.dtype == dtype
    assert np.array_equal(ours, ml_round(x), equal_nan=True)
    assert np.array_equal(np.signbit(ours), np.signbit(ml_round(x)))  # -0 stays -0
    assert np.array_equal(encode_e4m3(x), np.where(np.isnan(x), 0x7F, ml_round(x).astype(E4M3).view(np.uint8)))


def test_rounding_matches_ml_dtypes_on_random_floats(rng):
    """A million float32 values from far below the subnormals to far beyond 448, and float64 ones."""
    n = 1_000_000
    x = (rng.standard_normal(n) * np.exp2(rng.uniform(-14, 12, n))).astype(np.float32)
    assert np.array_equal(round_e4m3(x), ml_round(x))
    assert np.array_equal(encode_e4m3(x), ml_round(x).astype(E4M3).view(np.uint8))
    x64 = rng.standard_normal(n // 10) * np.exp2(rng.uniform(-14, 12, n // 10))
    assert np.array_equal(round_e4m3(x64), ml_round(x64))  # one rounding from float64, not two through float32


def test_rounding_errs_by_at_most_half_a_spacing(rng):
    x = rng.standard_normal(100_000) * np.exp2(rng.uniform(-12, 8, 100_000))
    x = x[np.abs(x) <= E4M3_MAX]
    err = np.abs(round_e4m3(x) - x)
    assert (err <= np.maximum(UNIT_ROUNDOFF * np.abs(x), SMALLEST_SUBNORMAL / 2)).all()


def test_rounding_refuses_integers():
    with pytest.raises(TypeError, match="x must hold floats"):
        round_e4m3(np.arange(3))


# ---------------------------------------------------------------------------------- quantization

def outlier_qkv(rng, lead, n, d, scale=10.0, fraction=1e-3):
    """FlashAttention-3's accuracy input: standard normal, a fraction of the entries with ``scale`` times the spread."""
    def one():
        x = rng.standard_normal((*lead, n, d))
        return np.where(rng.random(x.shape) < fraction, scale * rng.standard_normal(x.shape), x)

    return one(), one(), one()


def dequantized(x8, descale, granularity, block, n):
    d = np.asarray(descale, dtype=np.float64)
    if granularity == "block":
        d = np.repeat(d, block, axis=-1)[..., :n, None]  # (..., H, N, 1)
    elif granularity == "head":
        d = d[..., None, None]
    return x8.astype(np.float64) * d


@pytest.mark.parametrize("granularity", ["tensor", "head", "block"])
@pytest.mark.parametrize("rotate", [False, True])
def test_quantize_round_trip_within_half_a_spacing(rng, granularity, rotate):
    """x8 · descale is x up to e4m3's rounding of x / descale: at most 2^-4 of |x| where x / descale is normal, and
    half the subnormals' spacing, 2^-10 · descale, below; the largest entry of each group becomes ±448."""
    block, n, d = 16, 37, 32  # 37 rows: a ragged last block
    q, k, v = outlier_qkv(rng, (2, 3), n, d)
    seed = int(rng.integers(2**31))
    out = quantize_fp8(q, k, v, granularity=granularity, block=block, rotate=rotate, seed=seed)
    signs = random_signs(d, seed)
    for x, x8, descale in ((q, out.q, out.descale_q), (k, out.k, out.descale_k), (v, out.v, out.descale_v)):
        assert x8.dtype == ml_dtypes.float8_e4m3fn and x8.shape == x.shape and descale.dtype == np.float32
        if rotate and x is not v:
            x = hadamard_rotate(x, signs)  # what was quantized
        back = dequantized(x8, descale, granularity, block, n)
        scale = dequantized(np.ones_like(x), descale, granularity, block, n)  # each entry's descale
        bound = np.maximum(UNIT_ROUNDOFF * np.abs(x), SMALLEST_SUBNORMAL / 2 * scale) * (1 + 2**-40)  # float64 slack
        assert (np.abs(back - x) <= bound).all(), np.abs(back - x).max()
        assert np.abs(x8.astype(np.float64)).max() == E4M3_MAX
        assert (np.abs(x) <= E4M3_MAX * scale).all()  # the float32 descale clips nothing
    assert out.descale_q.shape == {"tensor": (), "head": (2, 3), "block": (2, 3, 3)}[granularity]


def test_quantize_leaves_its_inputs_alone_and_takes_16_bit_floats(rng):
    q, k, v = outlier_qkv(rng, (2,), 20, 16)
    copies = [x.copy() for x in (q, k, v)]
    quantize_fp8(q, k, v, granularity="block", rotate=True, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip((q, k, v), copies))
    as_f16 = quantize_fp8(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16), granularity="head")
    as_bf16 = quantize_fp8(*(x.astype(ml_dtypes.bfloat16) for x in (q, k, v)), granularity="head")
    assert as_f16.q.shape == as_bf16.q.shape == q.shape


def sylvester(d):
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h


@pytest.mark.parametrize("d", [1, 2, 64, 256])
def test_the_rotation_is_orthogonal_and_keeps_q_kt(rng, d):
    signs = random_signs(d, int(rng.integers(2**31)))
    m = hadamard_rotate(np.eye(d), signs)  # the rows of I rotated: M itself
    assert np.allclose(m, sylvester(d) * signs[:, None] / np.sqrt(d), rtol=0, atol=1e-15)
    assert np.abs(m @ m.T - np.eye(d)).max() <= 4 * d * 2**-53
    q, k, _ = outlier_qkv(rng, (2,), 33, d)
    s, s_rot = q @ np.swapaxes(k, -1, -2), hadamard_rotate(q, signs) @ np.swapaxes(hadamard_rotate(k, signs), -1, -2)
    # float64 rounding: log2(d) butterfly rounds, the 1/√d and the dot products, each relative 2^-53 of |q|·|k|
    norms = np.linalg.norm(q, axis=-1)[..., :, None] * np.linalg.norm(k, axis=-1)[..., None, :]
    assert (np.abs(s_rot - s) <= 4 * (np.log2(d) + d + 2) * 2**-53 * norms).all()


@pytest.mark.parametrize("kwargs, error, words", [
    ({"granularity": "row"}, ValueError, "granularity must be one of"),
    ({"block": 0}, ValueError, "block must be a positive integer"),
    ({"rotate": 1}, TypeError, "rotate must be True or False"),
])
def test_quantize_refuses_bad_options(rng, kwargs, error, words):
    q, k, v = outlier_qkv(rng, (1,), 8, 16)
    with pytest.raises(error, match=words):
        quantize_fp8(q, k, v, **kwargs)


def test_quantize_refuses_bad_arrays(rng):
    q, k, v = outlier_qkv(rng, (2,), 8, 24)
    with pytest.raises(ValueError, match="rotate=True needs the head dim d to be a power of two.*d=24"):
        quantize_fp8(q, k, v, rotate=True)
    bad = q.copy()
    bad[0, 1, 2] = np.nan
    with pytest.raises(ValueError, match="q holds NaN"):
        quantize_fp8(bad, k, v)
    with pytest.raises(TypeError, match="k has dtype int64"):
        quantize_fp8(q, k.astype(np.int64), v)
    with pytest.raises(ValueError, match="v must have shape"):
        quantize_fp8(q, k, v[0, 0])
    with pytest.raises(ValueError, match="k must have q's head dim"):
        quantize_fp8(q, k[..., :8], v)
