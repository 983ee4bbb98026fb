"""tinyflash.flex_attention on a real GPU at real sizes: PyTorch tensors, float16 and bfloat16, the variants of
``tinyflash.core.variants`` compiled into v6 (softcap, ALiBi, a relative bias, a sliding window, packed documents),
with and without a block mask (FlexAttention's 128 × 128 tiles), grouped-query heads. v6 is named (``kernel="v6"``):
on Hopper flex_attention runs v10 by default (tests/test_flex_hopper_gpu.py).

Each result is checked on sampled query rows of every head against the float64 reference with the same functions
(``tinyflash.reference_attention(..., rows=)``), o by FlashAttention's rule against a naive computation that
stores S and P in the input's type (as ``tinyflash.bench.checking`` does for tensor_core_attention's GPU tests),
lse within F32_TOL. Skipped without a GPU (conftest).
Run: ``python -m pytest -m gpu tests/test_flex_tensor_cores_gpu.py``.
"""

import math

import numpy as np
import pytest

import tinyflash as tf
from tinyflash.core import variants
from tinyflash.core.mods import Mods, modified_scores
from tinyflash.core.tolerance import F32_TOL, assert_close, assert_fa_rule, round_to, to_host64

pytestmark = pytest.mark.gpu
ROWS = 48  # query rows checked per call


def random_qkv(torch, lead, kv_heads, n, d, dtype, seed):
    """q (*lead, N, d) and k, v with kv_heads heads, standard normal, on the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shapes = [(*lead, n, d), (*lead[:-1], kv_heads, n, d), (*lead[:-1], kv_heads, n, d)]
    return [torch.randn(s, device="cuda", dtype=torch.float32, generator=gen).to(dtype) for s in shapes]


def naive_low(q, k, v, rows, mods: Mods, scale: float, dtype: str):
    """o of the query ``rows`` with S and P stored in ``dtype`` (float32 sums), q (B, H, N, d) float64 host arrays
    of the inputs' values, k, v (B, H_kv, N, d)."""
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)  # (B, H, N, d)
    S = round_to(scale * (q[:, :, rows] @ np.swapaxes(k, -1, -2)), dtype)  # (B, H, rows, N)
    S, _ = modified_scores(mods, S, rows, np.arange(k.shape[2]))
    S = round_to(S, dtype)
    m = np.max(S, axis=-1, keepdims=True)
    P = round_to(np.exp(S - np.where(np.isfinite(m), m, 0)), dtype)  # (B, H, rows, N)
    l = P.sum(-1, keepdims=True)
    return round_to(np.where(l > 0, (P @ v) / np.where(l > 0, l, 1), 0), dtype)  # (B, H, rows, d)


def check(o, lse, q, k, v, rng, score_mod=None, mask_mod=None, causal=False, what=""):
    """o (B, H, N, d) on ROWS sampled rows by FlashAttention's rule, lse within F32_TOL."""
    q64, k64, v64 = (to_host64(x) for x in (q, k, v))
    n, d = q64.shape[-2:]
    rows = np.sort(rng.choice(n, size=min(ROWS, n), replace=False))
    ref_o, ref_lse = tf.reference_attention(q64, k64, v64, causal=causal, rows=rows, score_mod=score_mod,
                                            mask_mod=mask_mod)
    mods = Mods(score_mod, mask_mod, tuple(q64.shape[:2]), n, k64.shape[-2], causal)
    dtype = str(q.dtype).removeprefix("torch.")
    naive = naive_low(q64, k64, v64, rows, mods, 1 / math.sqrt(d), dtype)
    assert_fa_rule(to_host64(o)[:, :, rows], naive, ref_o, np.float16 if dtype == "float16" else dtype,
                   what=f"{what} o")
    assert_close(to_host64(lse)[:, :, rows], ref_lse, F32_TOL, f"{what} lse", is_lse=True)


def documents(n, count=8):
    """document_mask of ``count`` documents of uneven lengths packed into N tokens."""
    cuts = np.sort(np.random.default_rng(7).choice(np.arange(1, n), size=count - 1, replace=False))
    return variants.document_mask(np.repeat(np.arange(count), np.diff([0, *cuts, n])))


def cases(n, heads):
    """name -> (score_mod, mask_mod, causal) for N tokens and H query heads."""
    return {"softcap causal": (variants.softcap(30.0), None, True),
            "alibi causal": (variants.alibi(heads), None, True),
            "relative bias": (variants.relative_bias(np.linspace(-2, 2, heads * 65).reshape(heads, 65)), None, False),
            "sliding window": (None, variants.sliding_window(256), False),
            "softcap + sliding window": (variants.softcap(30.0), variants.sliding_window(256), False),
            "documents causal": (None, documents(n), True)}


# every case at d = 64 in float16 and at d = 128 in bfloat16, and the other two pairs of head dim and type on one
# case each: every pair of (case, d, dtype) values meets, with half the kernels of the whole product (each case,
# head dim, type and block mask or not is a kernel of its own, about half a minute of compiling; N is not)
GRID = ([(case, 64, "float16") for case in cases(1000, 4)] + [(case, 128, "bfloat16") for case in cases(1000, 4)]
        + [("softcap causal", 128, "float16"), ("documents causal", 64, "bfloat16")])


@pytest.mark.parametrize("n", [1000, 4096])
@pytest.mark.parametrize("case, d, dtype", GRID)
@pytest.mark.parametrize("block_mask", [False, True])
def test_variants(rng, case, n, d, dtype, block_mask):
    """(1, 4, N, d) with 2 K/V heads: each variant, with FlexAttention's block mask of 128 × 128 tiles or without."""
    torch = pytest.importorskip("torch")
    score_mod, mask_mod, causal = cases(n, 4)[case]
    q, k, v = random_qkv(torch, (1, 4), 2, n, d, getattr(torch, dtype), seed=int(rng.integers(2**31)))
    bm = tf.create_block_mask(mask_mod, 1, 1, n, n, causal=causal) if block_mask else None
    o, lse = tf.flex_attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod, block_mask=bm, causal=causal,
                               kernel="v6")
    assert o.dtype == q.dtype and o.shape == q.shape and lse.dtype == torch.float32 and lse.shape == q.shape[:-1]
    check(o, lse, q, k, v, rng, score_mod, mask_mod, causal, what=f"{case} N={n} d={d} {dtype} block mask={block_mask}")


@pytest.mark.smoke
def test_smoke(rng):
    """One run of every tier on a GPU: softcap and a sliding window through a block mask, float16."""
    torch = pytest.importorskip("torch")
    q, k, v = random_qkv(torch, (1, 4), 4, 1000, 64, torch.float16, seed=int(rng.integers(2**31)))
    window = variants.sliding_window(128)
    bm = tf.create_block_mask(window, 1, 1, 1000, 1000)
    o, lse = tf.flex_attention(q, k, v, score_mod=variants.softcap(20.0), block_mask=bm, kernel="v6")
    check(o, lse, q, k, v, rng, variants.softcap(20.0), window, what="smoke")


@pytest.mark.parametrize("kernel", ["v6", "v10"])
def test_device_arrays_through_the_driver_give_numbas_bits(rng, kernel):
    """PyTorch tensors go through the driver, the launch sized once per problem (``host.sized.sized_flex``; v10's
    tensor maps kept by the arrays' addresses), on the caller's stream; NumPy arrays through numba's launches. The
    same kernel on the same inputs gives the same bits, a second call reuses the sized launch, and a call on
    another stream waits for the work queued on it."""
    torch = pytest.importorskip("torch")
    from tinyflash.gpu.runtime import compute_capability
    from tinyflash.host.sized import sized_flex

    if kernel == "v10" and compute_capability() != (9, 0):
        pytest.skip("kernel v10 (wgmma, TMA) needs compute capability 9.0")
    n = 1000
    q, k, v = random_qkv(torch, (1, 4), 2, n, 128, torch.bfloat16, seed=int(rng.integers(2**31)))
    softcap, window = variants.softcap(30.0), variants.sliding_window(256)
    bm = tf.create_block_mask(window, 1, 1, n, n, causal=True)
    call = lambda *x: tf.flex_attention(*x, score_mod=softcap, block_mask=bm, causal=True, kernel=kernel)  # noqa: E731
    sized_flex.cache_clear()
    o, lse = call(q, k, v)
    bfloat16 = pytest.importorskip("ml_dtypes").bfloat16
    o_host, lse_host = call(*(x.cpu().view(torch.int16).numpy().view(bfloat16) for x in (q, k, v)))
    assert sized_flex.cache_info().currsize == 1  # NumPy inputs took numba's launches
    assert np.array_equal(o.float().cpu().numpy(), o_host.astype(np.float32))
    assert np.array_equal(lse.cpu().numpy(), lse_host)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        q2 = q * 1  # queued on the stream: the call must wait for it
        o2, _ = call(q2, k, v)
    stream.synchronize()
    assert sized_flex.cache_info().hits >= 1 and torch.equal(o2, o)
