"""tinyflash.flex_attention on Hopper (kernel v10's flex_fwd) at real sizes: PyTorch tensors, bfloat16 and float16,
the variants of ``tinyflash.core.variants`` compiled in (softcap, ALiBi, a relative bias, a sliding window, packed
documents), with and without FlexAttention's 128 × 128 block mask, grouped-query heads; and the registry's rule,
which runs v10 on this GPU without ``kernel=``.

Each result is checked as tests/test_flex_tensor_cores_gpu.py checks v6's (whose helpers this file takes): sampled
query rows of every head against the float64 reference with the same functions, o by FlashAttention's rule against
a naive computation in the input's type, lse within F32_TOL. Skipped without a GPU (conftest), and on a GPU other
than compute capability 9.0.
Run: ``python -m pytest -m gpu --grid tests/test_flex_hopper_gpu.py``.
"""

import pytest
from test_flex_tensor_cores_gpu import cases, check, random_qkv

import tinyflash as tf
from tinyflash.core import variants
from tinyflash.forward.kernels import VERSIONS

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def hopper():
    from tinyflash.gpu.runtime import compute_capability

    if compute_capability() != (9, 0):
        pytest.skip("kernel v10 (wgmma, TMA) needs compute capability 9.0")


@pytest.mark.parametrize("case", list(cases(1000, 4)))
@pytest.mark.parametrize("block_mask", [False, True])
def test_variants(rng, case, block_mask):
    """(1, 4, 4096, 128) bfloat16 with 2 K/V heads: each variant, with FlexAttention's block mask of 128 × 128
    tiles or without (mask_mod then on every key tile)."""
    torch = pytest.importorskip("torch")
    n = 4096
    score_mod, mask_mod, causal = cases(n, 4)[case]
    q, k, v = random_qkv(torch, (1, 4), 2, n, 128, torch.bfloat16, seed=int(rng.integers(2**31)))
    bm = tf.create_block_mask(mask_mod, 1, 1, n, n, causal=causal) if block_mask else None
    o, lse = tf.flex_attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod, block_mask=bm, causal=causal,
                               kernel="v10")
    assert o.dtype == q.dtype and o.shape == q.shape and lse.dtype == torch.float32 and lse.shape == q.shape[:-1]
    check(o, lse, q, k, v, rng, score_mod, mask_mod, causal, what=f"v10 {case} block mask={block_mask}")


@pytest.mark.parametrize("d", [64, 256])
def test_other_head_dims_float16_ragged(rng, d):
    """d = 64 and 256 (whose 80-key tiles become 64 for the 128-key block mask), float16, N = 1000 (ragged on
    both sides), a softcap through a sliding window's block mask, causal."""
    torch = pytest.importorskip("torch")
    window, softcap = variants.sliding_window(300), variants.softcap(20.0)
    q, k, v = random_qkv(torch, (2, 4), 4, 1000, d, torch.float16, seed=int(rng.integers(2**31)))
    bm = tf.create_block_mask(window, 1, 1, 1000, 1000, causal=True)
    o, lse = tf.flex_attention(q, k, v, score_mod=softcap, block_mask=bm, causal=True, kernel="v10")
    check(o, lse, q, k, v, rng, softcap, window, True, what=f"v10 d={d} float16")


@pytest.mark.smoke
def test_smoke_the_default_is_v10(rng):
    """One run of every tier on a Hopper GPU: without ``kernel=`` flex_attention runs v10 here; ALiBi with packed
    documents through a block mask, float16, grouped-query heads."""
    torch = pytest.importorskip("torch")
    assert VERSIONS.default("flex_attention", "float16", 128, 128).name == "v10"
    q, k, v = random_qkv(torch, (1, 8), 2, 2000, 128, torch.float16, seed=int(rng.integers(2**31)))
    score_mod, mask_mod = variants.alibi(8), cases(2000, 8)["documents causal"][1]
    bm = tf.create_block_mask(mask_mod, 1, 1, 2000, 2000, causal=True)
    o, lse = tf.flex_attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod, block_mask=bm, causal=True)
    check(o, lse, q, k, v, rng, score_mod, mask_mod, True, what="v10 smoke")
