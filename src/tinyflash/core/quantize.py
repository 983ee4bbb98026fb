"""Attention's inputs in FP8: scaling into e4m3's range, the descale factors, and the rotation that spreads outliers.

e4m3 (``e4m3.py``) keeps 3 mantissa bits over 2^-9 .. 448. A tensor is stored as x8 = round(x / descale) with
one float32 ``descale`` per group of entries, chosen so that the group's largest magnitude lands on 448:

    descale = max|x| / 448          (a group of zeros: descale 1)
    x8      = round_e4m3(x / descale)          x ≈ x8 · descale

Mapping the absolute maximum to 448, the top of the range, leaves the smallest entries as far above the
subnormals (below 2^-6, where e4m3 loses relative precision) as the group allows, and clips no entry (the
float32 descale is rounded up where it must be, so that |x| / descale stays <= 448). Every
normal entry then errs by at most 2^-4 of itself. The kernel multiplies the bytes as they are and applies the
descales to its float32 results: S = (Q8 K8ᵀ) · descale_q · descale_k · scale, and O's ``descale_v`` at the end.

Groups (``granularity``), FlashAttention-3's choices:

* ``"tensor"``: one descale for the whole tensor (shape ());
* ``"head"``: one per (batch, head) (the leading dims of x: (..., H));
* ``"block"``: one per block of ``block`` rows of each head ((..., H, ceil(N / block))): FlashAttention-3's block
  quantization, a descale per tile of Br query or Bc key rows, so a large entry costs precision only in its tile.

**Incoherent processing** (``rotate=True``). A few large entries (outlier features) set a group's descale and
squeeze the rest towards the subnormals. Multiplying Q and K by the same random orthogonal d × d matrix M spreads
each entry over the whole row and leaves the scores unchanged: (Q M)(K M)ᵀ = Q M Mᵀ Kᵀ = Q Kᵀ. FlashAttention-3
takes M = H · diag(±1) / √d, H the d × d Hadamard matrix (entries ±1, H Hᵀ = d·I) and random signs: applied as
the fast Walsh-Hadamard transform, log2(d) rounds of sums and differences, O(d log d) per row
(:func:`hadamard_rotate`). Sylvester's construction of H needs d a power of two; other head dims raise an error
(a head dim could be padded with zero columns to the next power of two first, which changes no score). V is not
rotated: its rotation would have to be undone on O.

:func:`outlier_inputs` draws FlashAttention-3's test input for all this: standard normal entries, 0.1% of them
drawn with ten times the scale (the outlier features).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .checks import BFLOAT16, SUPPORTED_DTYPES, array_dtype, as_array, check_kv_heads, check_positive_int
from .e4m3 import E4M3_MAX, encode_e4m3

GRANULARITIES = ("tensor", "head", "block")
OUTLIER_FRACTION, OUTLIER_SCALE = 1e-3, 10.0  # FlashAttention-3's outliers: 0.1% of the entries at 10× the scale


def hadamard_rotate(x, signs) -> np.ndarray:
    """x (..., d) times M = H · diag(signs) / √d, in float64, with H Sylvester's d × d Hadamard matrix (d a power
    of two) and ``signs`` (d,) of ±1: each row of x rotated by the same orthogonal M (M Mᵀ = I).

    x M = ((x · signs) H) / √d. The fast Walsh-Hadamard transform computes y H in log2(d) rounds: round h pairs
    entry i with entry i + h inside blocks of 2h entries and replaces them by their sum and difference (H is
    symmetric, so y H = (H y) row by row)."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    y = x * np.asarray(signs, dtype=np.float64)  # (..., d)  x · diag(signs)
    h = 1
    while h < d:  # one round of butterflies: [a, b] -> [a + b, a - b] for the halves of each block of 2h
        blocks = y.reshape(*y.shape[:-1], d // (2 * h), 2, h)  # (..., d / 2h, 2, h)
        a, b = blocks[..., 0, :], blocks[..., 1, :]
        y = np.stack([a + b, a - b], axis=-2).reshape(x.shape)  # (..., d)
        h *= 2
    return y / np.sqrt(d)  # (..., d)  H has rows of norm √d


def random_signs(d: int, seed=None) -> np.ndarray:
    """d random signs (±1.0) from ``np.random.default_rng(seed)``: diag(signs) of the randomized Hadamard rotation."""
    return np.random.default_rng(seed).choice([-1.0, 1.0], size=d)


def outlier_inputs(rng, shape, fraction=OUTLIER_FRACTION, scale=OUTLIER_SCALE):
    """q, k, v (float32) of ``shape`` drawn from the generator ``rng``: standard normal, each entry with probability
    ``fraction`` drawn from a normal of standard deviation ``scale`` instead (FlashAttention-3's FP8 experiment)."""
    def one():
        x = rng.standard_normal(shape)
        return np.where(rng.random(shape) < fraction, scale * rng.standard_normal(shape), x).astype(np.float32)

    return one(), one(), one()


def descales(x, granularity: str, block: int) -> np.ndarray:
    """The float32 descale of each group of ``x`` (..., N, d), in float64 values: max|x| / 448 over the group.
    Shape () for "tensor", x's leading dims (..., H) for "head", (..., H, ceil(N / block)) for "block"."""
    a = np.abs(x)
    if granularity == "tensor":
        amax = a.max(initial=0.0)  # ()
    elif granularity == "head":
        amax = a.max(axis=(-2, -1), initial=0.0)  # (..., H)
    else:
        n = x.shape[-2]
        t = -(-n // block)  # blocks per head (ceil); the last one may be short
        padded = np.zeros((*x.shape[:-2], t * block, x.shape[-1]))  # (..., T·block, d), zero rows after N
        padded[..., :n, :] = a
        amax = padded.reshape(*x.shape[:-2], t, block * x.shape[-1]).max(axis=-1)  # (..., H, T)
    exact = np.where(amax > 0, amax / E4M3_MAX, 1.0)  # float64; a group of zeros: any descale will do
    stored = exact.astype(np.float32)  # the kernel reads float32: round up where float32 rounded down, so that
    return np.where(stored < exact, np.nextafter(stored, np.float32(np.inf)), stored)  # |x| / descale <= 448


def quantize_e4m3(x, descale, granularity: str, block: int) -> np.ndarray:
    """The e4m3 bytes (uint8) of x / descale, each row divided by its group's descale (float64 arithmetic)."""
    d = np.asarray(descale, dtype=np.float64)
    if granularity == "block":
        d = np.repeat(d, block, axis=-1)[..., :x.shape[-2]]  # (..., H, N): each row's block's descale
        return encode_e4m3(x / d[..., None])
    if granularity == "head":
        d = d[..., None, None]  # (..., H, 1, 1)
    return encode_e4m3(x / d)


class FP8Inputs(NamedTuple):
    """q, k, v in e4m3 (ml_dtypes' ``float8_e4m3fn`` arrays, shaped as given) and their float32 descales:
    q ≈ q8 · descale_q, with the shapes of :func:`descales`. ``tinyflash.fp8_attention(*inputs, block_q=block,
    block_k=block)`` takes them as they are."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    descale_q: np.ndarray
    descale_k: np.ndarray
    descale_v: np.ndarray


def _float64(x, name: str) -> np.ndarray:
    """x as float64 (exact from float16, bfloat16 and float32), checked: floats, finite, (..., N, d)."""
    x = as_array(x, name)
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name} must be a NumPy array of shape (..., N, d); got {type(x).__name__}")
    array_dtype(x, name, (*SUPPORTED_DTYPES, BFLOAT16))
    if x.ndim < 2 or 0 in x.shape:
        raise ValueError(f"{name} must have shape (..., N, d) with N, d >= 1; got {x.shape}")
    x = np.asarray(x).astype(np.float64)
    if not np.isfinite(x).all():
        raise ValueError(f"{name} holds NaN or ±inf: an e4m3 scale needs a finite largest magnitude")
    return x


def quantize_fp8(q, k, v, *, granularity: str = "tensor", block: int = 64, rotate: bool = False,
                 seed=None) -> FP8Inputs:
    """Attention's inputs in e4m3 with their descale factors: an :class:`FP8Inputs` (q, k, v, descale_q,
    descale_k, descale_v).

    q (..., H, Nq, d), k (..., H_kv, Nk, d), v (..., H_kv, Nk, dv) in float16, bfloat16 (ml_dtypes), float32 or
    float64, finite. ``granularity``: one descale per "tensor", per "head" (each (batch, head)) or per "block" of
    ``block`` rows of a head (FlashAttention-3's block quantization; give the FP8 forward tiles of the same size).
    Each group's largest magnitude is mapped to 448, e4m3's largest number. ``rotate=True``: Q and K are first
    rotated by the same randomized Hadamard matrix (random signs from ``seed``; d a power of two), which leaves
    Q Kᵀ, and so the attention output, unchanged and spreads outlier entries (incoherent processing). The inputs
    are not modified.
    """
    import ml_dtypes  # the NumPy type of e4m3 bytes; imported here, since only this function returns them

    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {', '.join(map(repr, GRANULARITIES))}; got {granularity!r}")
    block = check_positive_int(block, "block")
    if not isinstance(rotate, (bool, np.bool_)):
        raise TypeError(f"rotate must be True or False; got {rotate!r}")
    q, k, v = _float64(q, "q"), _float64(k, "k"), _float64(v, "v")
    check_kv_heads(q.shape, k.shape, v.shape)
    d = q.shape[-1]
    if k.shape[-1] != d or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k must have q's head dim d and v's number of keys; got q {q.shape}, k {k.shape}, v {v.shape}")
    if rotate:
        if d & (d - 1):
            raise ValueError(f"rotate=True needs the head dim d to be a power of two (Sylvester's Hadamard matrix); "
                             f"got d={d}: pad q and k with zero columns to d={1 << d.bit_length()} or pass rotate=False")
        signs = random_signs(d, seed)  # one rotation for Q and K alike: Q Kᵀ is unchanged
        q, k = hadamard_rotate(q, signs), hadamard_rotate(k, signs)
    out = []
    for x in (q, k, v):
        scale = descales(x, granularity, block)
        out.append((quantize_e4m3(x, scale, granularity, block).view(ml_dtypes.float8_e4m3fn), scale))
    (q8, dq), (k8, dk), (v8, dv) = out
    return FP8Inputs(q8, k8, v8, dq, dk, dv)
