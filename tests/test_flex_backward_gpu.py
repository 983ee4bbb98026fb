"""tinyflash.flex_attention_backward and tinyflash.torch.flex_attention on a real GPU: PyTorch tensors, float16 and
bfloat16, the variants of ``tinyflash.core.variants`` compiled into backward v2 (softcap, ALiBi, a relative bias, a
sliding window, packed documents), with FlexAttention's block mask of 128 × 128 tiles or without, grouped-query
heads, ragged sizes.

Every gradient of every row is checked against the float64 reference backward with the same functions
(``tinyflash.reference_attention_backward``) by FlashAttention's rule for gradients: at most 3 × the error of a
naive backward that stores S, P, dP and dS in the input's type (:func:`naive_low`). The sizes are small enough for
the references, whose score_mod (math.tanh) NumPy evaluates element by element. Skipped without a GPU (conftest).
Run: ``python -m pytest -m gpu tests/test_flex_backward_gpu.py``.
"""

import math

import numpy as np
import pytest

import tinyflash as tf
from tinyflash.core import variants
from tinyflash.core.mods import Mods, modified_scores
from tinyflash.core.tolerance import assert_fa_rule, round_to, to_host64

pytestmark = pytest.mark.gpu
GRAD_FACTOR = 3.0  # FlashAttention's rule for 16-bit gradients


def random_inputs(torch, heads, kv_heads, n, d, dtype, seed):
    """q, do (1, heads, N, d) and k, v (1, kv_heads, N, d), standard normal, on the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda h: torch.randn(1, h, n, d, device="cuda", generator=gen).to(dtype)  # noqa: E731
    return make(heads), make(kv_heads), make(kv_heads), make(heads)


def naive_low(q, k, v, do, mods: Mods, scale: float, dtype: str):
    """The backward with S, P, dP and dS stored in ``dtype`` (float64 arithmetic between), q, do (B, H, N, d) and k, v
    (B, H, N, d) float64 host arrays of the inputs' values (K, V repeated over each group)."""
    rows, cols = np.arange(q.shape[-2]), np.arange(k.shape[-2])
    S = round_to(scale * (q @ np.swapaxes(k, -1, -2)), dtype)  # (B, H, Nq, Nk)
    S, slope = modified_scores(mods, S, rows, cols, derivative=True)  # score_mod, then -inf where masked
    S = round_to(S, dtype)
    m = S.max(-1, keepdims=True)
    P = np.exp(S - np.where(np.isfinite(m), m, 0))
    P = round_to(P / np.maximum(P.sum(-1, keepdims=True), 1e-300), dtype)  # (B, H, Nq, Nk)
    dP = round_to(do @ np.swapaxes(v, -1, -2), dtype)
    dS = P * (dP - (dP * P).sum(-1, keepdims=True))
    dS = round_to(np.where(P != 0, dS * (1.0 if slope is None else slope), 0.0), dtype)
    return (round_to(scale * (dS @ k), dtype), round_to(scale * (np.swapaxes(dS, -1, -2) @ q), dtype),
            round_to(np.swapaxes(P, -1, -2) @ do, dtype))


def check(grads, q, k, v, do, score_mod=None, mask_mod=None, causal=False, what=""):
    """dq, dk, dv (1, H, N, d) against the float64 reference by FlashAttention's rule for gradients."""
    q64, k64, v64, do64 = (to_host64(x) for x in (q, k, v, do))
    group = q64.shape[1] // k64.shape[1]
    kr, vr = (np.repeat(x, group, axis=1) for x in (k64, v64))
    mods = {"score_mod": score_mod, "mask_mod": mask_mod, "causal": causal}
    ref = tf.reference_attention_backward(q64, kr, vr, do64, **mods)
    n = q64.shape[-2]
    dtype = str(q.dtype).removeprefix("torch.")
    naive = naive_low(q64, kr, vr, do64, Mods(score_mod, mask_mod, q64.shape[:2], n, n, causal),
                      1 / math.sqrt(q64.shape[-1]), dtype)
    for name, g, r, lo, like in zip(("dq", "dk", "dv"), grads, ref, naive, (q, k, v)):
        assert g.shape == like.shape and g.dtype == like.dtype, (name, g.shape, g.dtype)
        if name != "dq" and group > 1:  # summed over each group of query heads
            r, lo = (x.reshape(1, -1, group, *x.shape[-2:]).sum(axis=2) for x in (r, lo))
        assert_fa_rule(to_host64(g), lo, r, np.float16 if dtype == "float16" else dtype, factor=GRAD_FACTOR,
                       what=f"{what} {name}")


def documents(n, count=5):
    """document_mask of ``count`` documents of uneven lengths packed into N tokens."""
    cuts = np.sort(np.random.default_rng(7).choice(np.arange(1, n), size=count - 1, replace=False))
    return variants.document_mask(np.repeat(np.arange(count), np.diff([0, *cuts, n])))


def cases(n, heads):
    """name -> (score_mod, mask_mod, causal, block mask?, N) for H query heads."""
    return {"softcap causal": (variants.softcap(5.0), None, True, False, 257),
            "alibi causal": (variants.alibi(heads), None, True, False, n),
            "relative bias": (variants.relative_bias(np.linspace(-2, 2, heads * 65).reshape(heads, 65)), None, False,
                              False, 257),
            "sliding window, block mask": (None, variants.sliding_window(200), False, True, n),
            "softcap + sliding window, block mask": (variants.softcap(5.0), variants.sliding_window(100), False, True,
                                                     257),
            "documents causal, block mask": (None, documents(n), True, True, n)}


# every case at d = 64 in float16; three at d = 128; the others' functions in bfloat16 (each case compiles a forward
# and a backward kernel)
GRID = ([(case, 64, "float16") for case in cases(700, 4)]
        + [(case, 128, "float16") for case in ("softcap causal", "softcap + sliding window, block mask",
                                              "documents causal, block mask")]
        + [(case, 64, "bfloat16") for case in ("alibi causal", "relative bias", "sliding window, block mask")]
        + [("softcap causal", 128, "bfloat16")])


@pytest.mark.parametrize("case, d, dtype", GRID)
def test_variants(rng, case, d, dtype):
    """(1, 4, N, d) with 2 K/V heads: each variant's gradients, N ragged (700 or 257)."""
    torch = pytest.importorskip("torch")
    score_mod, mask_mod, causal, sparse, n = cases(700, 4)[case]
    q, k, v, do = random_inputs(torch, 4, 2, n, d, getattr(torch, dtype), seed=int(rng.integers(2**31)))
    bm = tf.create_block_mask(mask_mod, 1, 1, n, n, causal=causal) if sparse else None
    # o and lse by v6, whose kernel compiles in about a third of v10's time (28 against 80 s to PTX on 2 CPU cores,
    # softcap at d = 64): the forwards are the flex files' tests, the backward is this one's
    o, lse = tf.flex_attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod, block_mask=bm, causal=causal,
                               kernel="v6")
    grads = tf.flex_attention_backward(q, k, v, o, lse, do, score_mod=score_mod, mask_mod=mask_mod, block_mask=bm,
                                       causal=causal)
    check(grads, q, k, v, do, score_mod, mask_mod, causal, what=f"{case} N={n} d={d} {dtype}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_autograd(rng, dtype):
    """tinyflash.torch.flex_attention: q.grad, k.grad, v.grad of sum(o · do) are the backward's, within the rule
    against the float64 reference; a softcap and a sliding window through a block mask, grouped-query heads."""
    torch = pytest.importorskip("torch")
    import tinyflash.torch as tft

    q, k, v, do = random_inputs(torch, 4, 2, 300, 64, getattr(torch, dtype), seed=int(rng.integers(2**31)))
    score_mod, mask_mod = variants.softcap(5.0), variants.sliding_window(100)
    bm = tf.create_block_mask(mask_mod, 1, 1, 300, 300)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    o = tft.flex_attention(*leaves, score_mod=score_mod, block_mask=bm)
    (o.float() * do.float()).sum().backward()
    check([x.grad for x in leaves], q, k, v, do, score_mod, mask_mod, what=f"autograd {dtype}")
    ref_o, _ = tf.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)
    assert torch.equal(o.detach(), ref_o)


@pytest.mark.smoke
def test_smoke(rng):
    """One run of every tier on a GPU: softcap and a sliding window through a block mask, float16."""
    torch = pytest.importorskip("torch")
    q, k, v, do = random_inputs(torch, 4, 4, 300, 64, torch.float16, seed=int(rng.integers(2**31)))
    score_mod, window = variants.softcap(5.0), variants.sliding_window(100)
    bm = tf.create_block_mask(window, 1, 1, 300, 300)
    o, lse = tf.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)
    grads = tf.flex_attention_backward(q, k, v, o, lse, do, score_mod=score_mod, block_mask=bm)
    check(grads, q, k, v, do, score_mod, window, what="smoke")


def test_device_arrays_through_the_driver_give_numbas_gradients(rng):
    """PyTorch tensors take the driver (the three kernels sized once per problem: ``host.sized.sized_flex_backward``),
    NumPy arrays numba's launches: dk and dv bit for bit (each key tile's sums in one order), dq (float32 atomics in
    any order) by the rule on both; a second call reuses the sized launch."""
    torch = pytest.importorskip("torch")
    from tinyflash.host.sized import sized_flex_backward

    q, k, v, do = random_inputs(torch, 4, 2, 300, 64, torch.float16, seed=int(rng.integers(2**31)))
    score_mod, window = variants.softcap(5.0), variants.sliding_window(100)
    bm = tf.create_block_mask(window, 1, 1, 300, 300)
    o, lse = tf.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, kernel="v6")
    sized_flex_backward.cache_clear()
    on_gpu = tf.flex_attention_backward(q, k, v, o, lse, do, score_mod=score_mod, block_mask=bm)
    host = tf.flex_attention_backward(*(x.cpu().numpy() for x in (q, k, v, o, lse, do)), score_mod=score_mod,
                                      block_mask=bm)
    assert sized_flex_backward.cache_info().currsize == 1  # NumPy arrays took numba's launches
    for name, a, b in zip(("dk", "dv"), on_gpu[1:], host[1:]):
        assert np.array_equal(a.cpu().numpy(), b), name
    check(on_gpu, q, k, v, do, score_mod, window, what="driver")
    check([torch.from_numpy(x).cuda() for x in host], q, k, v, do, score_mod, window, what="numba")
    tf.flex_attention_backward(q, k, v, o, lse, do, score_mod=score_mod, block_mask=bm)
    assert sized_flex_backward.cache_info().hits >= 1
