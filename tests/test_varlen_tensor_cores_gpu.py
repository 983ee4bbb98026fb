"""tinyflash.varlen_attention on a real GPU: packed documents of uneven lengths as PyTorch tensors (float16 and
bfloat16) and NumPy float16, causal per document, with a sliding window as mask_mod and a softcap as score_mod,
grouped-query heads; one flex_attention launch over the packed row.

Checked per document on sampled query rows against the float64 reference of that document alone
(``tinyflash.reference_attention(..., rows=)``, the mods called with b = the document's index), o by
FlashAttention's rule against the same rows computed with S and P stored in the input's type, lse within F32_TOL.
Skipped without a GPU (conftest). Run: ``python -m pytest -m gpu tests/test_varlen_tensor_cores_gpu.py``.
"""

import math

import numpy as np
import pytest

import tinyflash as tf
from tinyflash.core import variants
from tinyflash.core.tolerance import F32_TOL, assert_close, assert_fa_rule, round_to, to_host64

pytestmark = pytest.mark.gpu
ROWS = 24  # query rows checked per document


def offsets(rng, total, count):
    """int32 cumulative lengths of ``count`` documents of uneven lengths (at least one token each) over ``total``."""
    cuts = np.sort(rng.choice(np.arange(1, total), size=count - 1, replace=False))
    return np.array([0, *cuts, total], dtype=np.int32)


def low_precision_rows(q, k, v, rows, score_mod, mask_mod, causal, scale, dtype, b):
    """o of the query ``rows`` of one document (H, n, d float64 of the inputs' values), S and P stored in ``dtype``."""
    g = q.shape[0] // k.shape[0]
    k, v = np.repeat(k, g, axis=0), np.repeat(v, g, axis=0)  # (H, n_k, d)
    S = round_to(scale * (q[:, rows] @ np.swapaxes(k, -1, -2)), dtype)  # (H, rows, n_k)
    H, _, n_k = S.shape  # the mods element by element, as the reference calls them
    cols = np.arange(n_k)
    keep = np.ones(S.shape, dtype=bool)
    if causal:
        keep &= cols[None, None, :] <= (rows + n_k - q.shape[1])[None, :, None]
    for h in range(H):
        for r, i in enumerate(rows):
            for j in range(n_k):
                if score_mod is not None:
                    S[h, r, j] = score_mod(S[h, r, j], b, h, int(i), j)
                if mask_mod is not None:
                    keep[h, r, j] &= bool(mask_mod(b, h, int(i), j))
    S = round_to(np.where(keep, S, -np.inf), dtype)
    m = S.max(-1, keepdims=True)
    P = round_to(np.exp(S - np.where(np.isfinite(m), m, 0)), dtype)
    l = P.sum(-1, keepdims=True)
    return round_to(np.where(l > 0, (P @ v) / np.where(l > 0, l, 1), 0), dtype)  # (H, rows, d)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("mods", ["none", "window and softcap"])
def test_packed_documents(rng, dtype, mods):
    """8 documents over 3,000 tokens, H = 4 on 2 K/V heads, d = 64, causal: each document as if alone."""
    torch = pytest.importorskip("torch")
    total, heads, kv_heads, d = 3000, 4, 2, 64
    cu = offsets(rng, total, 8)
    gen = torch.Generator(device="cuda").manual_seed(int(rng.integers(2**31)))
    q, k, v = (torch.randn((total, h, d), device="cuda", generator=gen).to(getattr(torch, dtype))
               for h in (heads, kv_heads, kv_heads))
    score_mod, mask_mod = (None, None) if mods == "none" else (variants.softcap(30.0), variants.sliding_window(200))
    o, lse = tf.varlen_attention(q, k, v, cu, cu, causal=True, score_mod=score_mod, mask_mod=mask_mod)
    assert o.shape == q.shape and o.dtype == q.dtype and tuple(lse.shape) == (heads, total) and o.is_cuda
    q64, k64, v64, o64, lse64 = (to_host64(x) for x in (q, k, v, o, lse))
    for b in range(8):
        lo, hi = cu[b], cu[b + 1]
        qs, ks, vs = (np.swapaxes(x[lo:hi], 0, 1) for x in (q64, k64, v64))  # (H, n, d)
        rows = np.sort(rng.choice(hi - lo, size=min(ROWS, hi - lo), replace=False))
        ref_o, ref_lse = tf.reference_attention(qs, ks, vs, causal=True, rows=rows,
                                                score_mod=None if score_mod is None else
                                                (lambda s, _b, h, i, j: score_mod(s, b, h, i, j)),
                                                mask_mod=None if mask_mod is None else
                                                (lambda _b, h, i, j: mask_mod(b, h, i, j)))
        naive = low_precision_rows(qs, ks, vs, rows, score_mod, mask_mod, True, 1 / math.sqrt(d), dtype, b)
        got = np.swapaxes(o64[lo:hi], 0, 1)[:, rows]  # (H, rows, d)
        assert_fa_rule(got, naive, ref_o, np.float16 if dtype == "float16" else dtype, what=f"document {b} o")
        assert_close(lse64[:, lo:hi][:, rows], ref_lse, F32_TOL, f"document {b} lse", is_lse=True)


@pytest.mark.smoke
def test_smoke_numpy_float16(rng):
    """NumPy float16 in, NumPy out: three documents, causal, against the NumPy stage in float64."""
    cu = np.array([0, 300, 301, 1000], dtype=np.int32)
    q, k, v = (rng.standard_normal((1000, h, 64)).astype(np.float16) for h in (4, 2, 2))
    o, lse = tf.varlen_attention(q, k, v, cu, cu, causal=True)
    ref_o, ref_lse = tf.varlen_attention(*(x.astype(np.float64) for x in (q, k, v)), cu, cu, causal=True)
    naive = round_to(tf.varlen_attention(*(x.astype(np.float32) for x in (q, k, v)), cu, cu, causal=True)[0],
                     "float16")
    assert isinstance(o, np.ndarray) and o.dtype == np.float16
    assert_fa_rule(o.astype(np.float64), naive.astype(np.float64), ref_o, np.float16, what="o")
    assert_close(lse, ref_lse, F32_TOL, "lse", is_lse=True)
