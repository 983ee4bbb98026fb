"""The FP8 forward emulated in NumPy (forward/fp8.py) against the float64 reference, with a bound derived from e4m3.

The reference is attention on the inputs the e4m3 bytes stand for, x8 · descale, in float64: what is left is the
forward's own error, the rounding of P to e4m3 and the float32 arithmetic. Per output element (row r, column c):

* P rounded: the forward rounds P' = 2^offset · exp(S - m) (its largest entry 2^offset) to e4m3, each entry off
  by at most 2^-4 · P' where P' is normal and 2^-10 where it is subnormal (e4m3.py); l sums the unrounded P'.
  So |O - O_ref| <= (2^-4 · Σ_j P'_j |v_jc| + 2^-10 · Σ_j |v_jc|) / l', that is
  (2^-4 · (P @ |V|)_rc + 2^-(10 + offset) · Σ_j |v_jc|) / l_r with the reference's P = exp(S - m) and l >= 1.
* float32: the products of e4m3 numbers are exact in float32; the sum of d of them, the descale factors, the
  base-2 scaling and the max's subtraction put S2 off by at most (d + 6) · 2^-24 · max_j |S2|_rj, where |S2| is
  S2 computed with |q| and |k|; S2 - m then by twice that, and P' by ln 2 times that (relative), plus exp2's
  and the subtraction's own rounding; l and P V sum Nk terms (Nk · 2^-24 relative each). A relative
  perturbation δ of every P'_j moves O by at most 2δ · (P @ |V|)_rc / l_r.
* lse = m + log l: the same S2 error (in natural units, ln 2 · S2's), the sum of l, and lse's own rounding.
"""

import ml_dtypes
import numpy as np
import pytest

from tinyflash import fp8_attention, quantize_fp8, reference_attention
from tinyflash.core.online_softmax import LOG2E
from tinyflash.forward.fp8 import P_OFFSET

U = 2.0**-24  # float32's unit roundoff


def dequantized(x8, descale, block):
    d = np.asarray(descale, dtype=np.float64)
    if d.ndim == x8.ndim - 1:  # per block: one descale per `block` rows
        d = np.repeat(d, block, axis=-1)[..., :x8.shape[-2]]
    elif d.ndim:
        d = d[..., None]
    return x8.astype(np.float64) * (d[..., None] if d.ndim else d)


def bound(q, k, v, causal, scale, offset=P_OFFSET):
    """The derived bound of |O - O_ref| (per element) and of |lse - lse_ref| (per row), from float64 inputs."""
    g = q.shape[-3] // k.shape[-3] if q.ndim >= 3 else 1
    k, v = np.repeat(k, g, axis=-3) if g > 1 else k, np.repeat(v, g, axis=-3) if g > 1 else v
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    s = scale * q @ np.swapaxes(k, -1, -2)  # (..., Nq, Nk)
    s_abs = scale * LOG2E * np.abs(q) @ np.swapaxes(np.abs(k), -1, -2)  # |S2| with |q|, |k|
    if causal:
        allowed = np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + (n_k - n_q)
        s, s_abs = np.where(allowed, s, -np.inf), np.where(allowed, s_abs, 0.0)
    p = np.exp(s - s.max(axis=-1, keepdims=True))  # (..., Nq, Nk), largest entry 1
    l = p.sum(axis=-1)[..., None]  # (..., Nq, 1) >= 1
    pv = p @ np.abs(v)  # (..., Nq, dv)
    e_s2 = (d + 6) * U * s_abs.max(axis=-1)[..., None]  # (..., Nq, 1)  S2's float32 error, base 2
    delta = np.log(2) * 2 * e_s2 + 4 * U  # relative error of each P' from float32
    o_bound = (2.0**-4 * pv + 2.0**-(10 + offset) * np.abs(v).sum(axis=-2)[..., None, :]) / l \
        + (2 * delta + 2 * (n_k + 2) * U) * pv / l
    lse_ref = (s.max(axis=-1) + np.log(l[..., 0]))
    lse_bound = np.log(2) * 2 * e_s2[..., 0] + (n_k + 4) * U + 4 * U * np.abs(lse_ref)
    return o_bound, lse_bound


def check(inputs, block_q, block_k, causal, scale=None):
    q, k, v = (dequantized(x, dx, b) for x, dx, b in ((inputs.q, inputs.descale_q, block_q),
                                                       (inputs.k, inputs.descale_k, block_k),
                                                       (inputs.v, inputs.descale_v, block_k)))
    o, lse = fp8_attention(*inputs, causal=causal, scale=scale, block_q=block_q, block_k=block_k)
    assert o.dtype == lse.dtype == np.float32
    ref, lse_ref = reference_attention(q, k, v, causal=causal, scale=scale)
    o_bound, lse_bound = bound(q, k, v, causal, 1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    ratio = np.abs(o - ref) / o_bound
    worst = np.unravel_index(np.argmax(ratio), ratio.shape)
    assert ratio.max() <= 1, f"o: error {abs(o - ref)[worst]:.3e} > bound {o_bound[worst]:.3e} at {worst}"
    assert (np.abs(lse - lse_ref) <= lse_bound).all(), np.abs(lse - lse_ref).max()
    return ratio.max()


def inputs_with_uneven_blocks(rng, lead, n_q, n_k, d, block):
    """Standard normal inputs whose blocks of rows differ in size by up to 2^6, so that a descale applied to the
    wrong block shows."""
    def one(n):
        x = rng.standard_normal((*lead, n, d))
        return x * np.exp2(rng.integers(-3, 4, size=(*lead, -(-n // block)))).repeat(block, axis=-1)[..., :n, None]

    return one(n_q), one(n_k), one(n_k)


@pytest.mark.parametrize("granularity", ["tensor", "head", "block"])
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_forward_within_the_derived_bound(rng, granularity, causal):
    q, k, v = inputs_with_uneven_blocks(rng, (2, 3), 45, 70, 32, 16)  # ragged tiles of 16 rows
    check(quantize_fp8(q, k, v, granularity=granularity, block=16), 16, 16, causal)


def test_fp8_forward_grouped_heads_rotation_and_a_scale(rng):
    q, _, _ = inputs_with_uneven_blocks(rng, (2, 4), 33, 50, 64, 32)
    _, k, v = inputs_with_uneven_blocks(rng, (2, 2), 33, 50, 64, 32)  # 2 query heads per K/V head
    check(quantize_fp8(q, k, v, granularity="block", block=32, rotate=True, seed=3), 32, 32, True, scale=0.3)
    check(quantize_fp8(q, k, v, granularity="head"), 16, 32, False)


def test_fp8_forward_rows_that_see_no_key(rng):
    q, k, v = inputs_with_uneven_blocks(rng, (1,), 20, 7, 16, 8)  # causal with Nq > Nk: 13 rows see no key
    o, lse = fp8_attention(*quantize_fp8(q, k, v), causal=True, block_q=8, block_k=8)
    assert (o[:, :13] == 0).all() and (lse[:, :13] == -np.inf).all() and np.isfinite(lse[:, 13:]).all()


@pytest.mark.grid
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("n", [1, 63, 129])
def test_fp8_forward_grid(rng, d, n):
    q, k, v = inputs_with_uneven_blocks(rng, (2, 2), n, n + 5, d, 64)
    for granularity in ("tensor", "block"):
        for causal in (False, True):
            check(quantize_fp8(q, k, v, granularity=granularity, block=64, rotate=True), 64, 64, causal)


def test_fp8_forward_refuses_bad_inputs(rng):
    q, k, v = inputs_with_uneven_blocks(rng, (2,), 8, 8, 16, 8)
    fp8 = quantize_fp8(q, k, v, granularity="block", block=8)
    with pytest.raises(TypeError, match="q must be an array of e4m3 numbers"):
        fp8_attention(q, fp8.k, fp8.v)
    with pytest.raises(TypeError, match="v must be an array of e4m3 numbers"):
        fp8_attention(fp8.q, fp8.k, fp8.v.view(np.uint8))
    with pytest.raises(ValueError, match=r"descale_k must have shape \(\) \(per tensor\), \(2,\) \(per head\) or "
                                         r"\(2, 2\) \(per block of 4 rows"):
        fp8_attention(*fp8, block_k=4)
    with pytest.raises(ValueError, match="descale_v must be finite and > 0"):
        fp8_attention(fp8.q, fp8.k, fp8.v, 1.0, 1.0, -1.0)
    with pytest.raises(ValueError, match="p_offset must be an integer from 0 to 8"):
        fp8_attention(*fp8, block_q=8, block_k=8, p_offset=9)
    with pytest.raises(ValueError, match="q and k must have the same head dimension"):
        fp8_attention(fp8.q, fp8.k[..., :8], fp8.v)
    assert fp8.q.dtype == ml_dtypes.float8_e4m3fn  # what the refusals above were about
