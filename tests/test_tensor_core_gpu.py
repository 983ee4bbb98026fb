"""Stage 3 on a real GPU at real sizes: tensor_core_attention on PyTorch tensors, float16 and bfloat16.

Each result is checked on sampled query rows of the first and last head against the float64
reference, by FlashAttention's rule against naive attention computed in the same precision by
PyTorch (``tinyflash.bench.checking.check_output``). Skipped without a GPU (conftest).
Run: ``python -m pytest -m gpu tests/test_tensor_core_gpu.py``.
"""

import time

import numpy as np
import pytest

import tinyflash as tf
from tinyflash.core.tolerance import fa_rule

pytestmark = pytest.mark.gpu
NS = [1, 17, 128, 1000, 4096, 16384]


def random_qkv(torch, n_q, n_k, d, dtype, heads=2, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn((1, heads, n, d), device="cuda", dtype=torch.float32, generator=gen).to(dtype)
            for n in (n_q, n_k, n_k)]  # (1, H, N, d) each


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", NS)
def test_lengths(rng, n, d, causal, dtype):
    check_lengths(rng, n, d, causal, dtype)


def check_lengths(rng, n, d, causal, dtype):
    """tensor_core_attention on (1, 2, N, d) inputs: o and lse typed and shaped, o by the rule, lse within F32_TOL."""
    torch = pytest.importorskip("torch")
    from tinyflash.bench.checking import check_output

    q, k, v = random_qkv(torch, n, n, d, getattr(torch, dtype), seed=int(rng.integers(2**31)))
    o, lse = tf.tensor_core_attention(q, k, v, causal=causal)
    assert o.dtype == q.dtype and o.shape == q.shape and lse.dtype == torch.float32 and lse.shape == q.shape[:-1]
    verdict = check_output(o, q, k, v, causal=causal, rng=rng, lse=lse)
    assert verdict.ok, verdict


NEW_HEAD_DIMS = [32, 40, 96, 200, 256]  # beside 64 and 128: 40 and 200 padded with zero columns (to 64, 224)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", NEW_HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 17, 128, 1000, 4096])
def test_head_dims(rng, n, d, causal, dtype):
    """Every head dim up to 256 on the tensor cores: multiples of 32 as they are, others padded to DP."""
    check_lengths(rng, n, d, causal, dtype)


@pytest.mark.parametrize("d", [96, 256])
def test_head_dims_unequal_lengths(rng, d):
    torch = pytest.importorskip("torch")
    from tinyflash.bench.checking import check_output

    for n_q, n_k in ((1000, 777), (300, 4096)):
        for causal in (False, True):
            for dtype in (torch.float16, torch.bfloat16):
                q, k, v = random_qkv(torch, n_q, n_k, d, dtype, seed=int(rng.integers(2**31)))
                o, lse = tf.tensor_core_attention(q, k, v, causal=causal)
                verdict = check_output(o, q, k, v, causal=causal, rng=rng, lse=lse)
                assert verdict.ok, (n_q, n_k, causal, dtype, verdict)


@pytest.mark.parametrize("n_q, n_k", [(1000, 777), (300, 4096), (4097, 129)])
def test_unequal_lengths(rng, n_q, n_k):
    torch = pytest.importorskip("torch")
    from tinyflash.bench.checking import check_output

    for causal in (False, True):
        for dtype in (torch.float16, torch.bfloat16):
            q, k, v = random_qkv(torch, n_q, n_k, 128, dtype, seed=int(rng.integers(2**31)))
            o, lse = tf.tensor_core_attention(q, k, v, causal=causal)
            verdict = check_output(o, q, k, v, causal=causal, rng=rng, lse=lse)
            assert verdict.ok, (causal, dtype, verdict)


def test_deterministic(rng):
    """The same inputs give bitwise the same outputs: no atomics, a fixed order of every sum."""
    torch = pytest.importorskip("torch")
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = random_qkv(torch, 3000, 3000, 128, dtype, heads=4)
        first = tf.tensor_core_attention(q, k, v, causal=True)
        for _ in range(3):
            again = tf.tensor_core_attention(q, k, v, causal=True)
            assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_cupy_and_numpy_float16(rng):
    """CuPy in, CuPy out; NumPy in, NumPy out; the same numbers as PyTorch in."""
    cupy = pytest.importorskip("cupy")
    q, k, v = (rng.standard_normal((2, 300, 64)).astype(np.float16) for _ in range(3))
    o_np, lse_np = tf.tensor_core_attention(q, k, v, causal=True)
    o_cp, lse_cp = tf.tensor_core_attention(*(cupy.asarray(x) for x in (q, k, v)), causal=True)
    assert isinstance(o_np, np.ndarray) and isinstance(o_cp, cupy.ndarray)
    assert np.array_equal(o_np, o_cp.get()) and np.array_equal(lse_np, lse_cp.get())
    ref_o = tf.reference_attention(q, k, v, causal=True)[0]
    assert fa_rule(o_np, tf.naive_attention(q, k, v, causal=True)[0], ref_o, np.float16).ok


def test_example_32k(rng):
    """B = 1, H = 32, N = 32,768, d = 128, causal, float16 and bfloat16: time, memory, error."""
    torch = pytest.importorskip("torch")
    from tinyflash.bench.checking import check_output

    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = random_qkv(torch, 32768, 32768, 128, dtype, heads=32)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        start = time.perf_counter()
        o, lse = tf.tensor_core_attention(q, k, v, causal=True)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start  # the first call: compile included
        extra = torch.cuda.max_memory_allocated() - before
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        tf.tensor_core_attention(q, k, v, causal=True)
        end.record()
        end.synchronize()
        verdict = check_output(o, q, k, v, causal=True, rng=rng, lse=lse)
        ms = begin.elapsed_time(end)
        tflops = 4 * 32 * 32768**2 * 128 / 2 / (ms * 1e9)
        print(f"32k example {dtype}: first call {seconds:.2f} s, then {ms:.1f} ms ({tflops:.1f} TFLOP/s); "
              f"inputs {3 * q.numel() * 2 / 2**30:.2f} GiB, extra memory {extra / 2**30:.3f} GiB "
              f"(o + lse: {(o.numel() * 2 + lse.numel() * 4) / 2**30:.3f} GiB); max rel. error "
              f"{verdict.error:.2e} (allowed {verdict.tolerance:.2e})")
        assert verdict.ok, verdict
        assert extra <= o.numel() * 2 + lse.numel() * 4 + 2**20  # nothing beyond the outputs


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_the_rule_holds_over_20_seeds(rng, d, causal, dtype):
    """FlashAttention's rule on every element of o, for 20 fresh inputs per configuration (N = 2,048, 4 heads):
    the largest error at most 2× naive attention's in the same type plus the output's rounding
    (``benchmarks/accuracy.py`` records the same errors beside SDPA flash's)."""
    torch = pytest.importorskip("torch")
    from tinyflash.bench.checking import naive_attention

    first = int(rng.integers(2**31))
    for seed in range(first, first + 20):
        q, k, v = random_qkv(torch, 2048, 2048, d, getattr(torch, dtype), heads=4, seed=seed)
        o, _ = tf.tensor_core_attention(q, k, v, causal=causal)
        ref = tf.reference_attention(*(x.double().cpu().numpy() for x in (q, k, v)), causal=causal)[0]
        naive = torch.stack([naive_attention(q[0, h], k[0, h], v[0, h], causal=causal) for h in range(4)])[None]
        check = fa_rule(o, naive, ref, dtype)
        assert check.ok, (seed, str(check))
