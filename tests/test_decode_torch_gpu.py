"""Decoding as a PyTorch model calls it (``pytest -m gpu``): bfloat16, the whole-call path (checked and planned
once per shape), a decode step captured in a CUDA graph, and the kernels on PyTorch's current stream."""

import numpy as np
import pytest

import tinyflash as tf
from tinyflash.core.tolerance import F32_TOL, assert_close, assert_fa_rule
from tinyflash.decode import cuda as decode_cuda
from tinyflash.decode.paged import PagedKVCache
from tinyflash.host.plans import PLANS

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def decode_tensors(seed, batch, heads, kv_heads, n_q, n_k, d, dtype):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, heads, n_q, d, device="cuda", generator=gen).to(dtype)
    k, v = (torch.randn(batch, kv_heads, n_k, d, device="cuda", generator=gen).to(dtype) for _ in range(2))
    return q, k, v


def reference(q, k, v, causal):
    """float64 (o, lse) and the same-precision naive o (SDPA's math backend in q's dtype, K/V heads repeated)."""
    g = q.shape[1] // k.shape[1]
    kr, vr = (x.repeat_interleave(g, dim=1) for x in (k, v))
    n_q, n_k = q.shape[-2], k.shape[-2]
    keep = torch.ones(n_q, n_k, dtype=torch.bool, device="cuda")
    if causal:  # bottom-right: query i sees keys up to i + Nk - Nq
        keep = torch.arange(n_k, device="cuda")[None, :] <= torch.arange(n_q, device="cuda")[:, None] + (n_k - n_q)
    s = (q.double() @ kr.double().transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = s.masked_fill(~keep, float("-inf"))
    ref_o, ref_lse = torch.softmax(s, -1) @ vr.double(), torch.logsumexp(s, -1)
    naive = torch.softmax((q @ kr.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
                          + torch.where(keep, 0.0, float("-inf")), -1).to(q.dtype) @ vr
    return ref_o, ref_lse, naive


@pytest.mark.parametrize("n_q, causal", [(1, False), (4, True)])
@pytest.mark.parametrize("d", [32, 40, 64, 96, 128, 200, 256])
def test_bfloat16_split_kv(rng, n_q, causal, d):
    q, k, v = decode_tensors(int(rng.integers(2**31)), 2, 32, 8, n_q, 9_001, d, torch.bfloat16)
    o, lse = tf.cuda_split_kv_attention(q, k, v, causal=causal)
    assert o.dtype == torch.bfloat16 and o.shape == q.shape and lse.dtype == torch.float32
    ref_o, ref_lse, naive = reference(q, k, v, causal)
    assert_fa_rule(o, naive, ref_o, "bfloat16", what="bfloat16 split-KV o")
    assert_close(lse.cpu().numpy(), ref_lse.cpu().numpy(), F32_TOL, "bfloat16 split-KV lse", is_lse=True)


def test_bfloat16_paged_matches_contiguous(rng):
    """A bfloat16 cache in pages of 16 tokens, shuffled in the pool: the same o as the contiguous cache."""
    batch, kv_heads, n_k, d, size = 4, 8, 4_096, 128, 16
    q, k, v = decode_tensors(int(rng.integers(2**31)), batch, 32, kv_heads, 1, n_k, d, torch.bfloat16)
    perm = torch.as_tensor(rng.permutation(batch * n_k // size), dtype=torch.int32, device="cuda")

    def pool(x):  # (B, H_kv, Nk, d) -> pages (B·Nk/size, H_kv, size, d), page i at pool page perm[i]
        pages = x.reshape(batch, kv_heads, n_k // size, size, d).permute(0, 2, 1, 3, 4).reshape(-1, kv_heads, size, d)
        out = torch.empty_like(pages)
        out[perm.long()] = pages
        return out

    cache = PagedKVCache(pool(k), pool(v), perm.reshape(batch, n_k // size),
                         torch.full((batch,), n_k, dtype=torch.int32, device="cuda"))
    o, lse = tf.cuda_paged_attention(q, cache)
    o_c, lse_c = tf.cuda_split_kv_attention(q, k, v)
    assert torch.equal(o, o_c) and torch.allclose(lse, lse_c, rtol=0, atol=1e-5)


@pytest.mark.parametrize("d, n_q, causal", [(100, 1, False), (84, 3, True), (252, 1, False)])
def test_bfloat16_at_the_cuda_cores_head_dims(rng, d, n_q, causal):
    """bfloat16 at head dims the tensor cores do not take (not multiples of 8): the CUDA-core split kernel
    (float32 arithmetic), element by element; the paged cache (its last page partly filled) gives the same o."""
    q, k, v = decode_tensors(int(rng.integers(2**31)), 2, 8, 2, n_q, 3_001, d, torch.bfloat16)
    o, lse = tf.cuda_split_kv_attention(q, k, v, causal=causal, num_splits=4)
    assert o.dtype == torch.bfloat16 and o.shape == q.shape and lse.dtype == torch.float32
    ref_o, ref_lse, naive = reference(q, k, v, causal)
    assert_fa_rule(o, naive, ref_o, "bfloat16", what=f"bfloat16 split-KV d={d} o")
    assert_close(lse.cpu().numpy(), ref_lse.cpu().numpy(), F32_TOL, f"bfloat16 split-KV d={d} lse", is_lse=True)
    size = 16  # tokens per page: the cache in pages, in order, the last one partly filled
    pages = -(-3_001 // size)
    pad = pages * size - 3_001

    def pool(x):  # (2, H_kv, Nk, d) -> (2·pages, H_kv, size, d)
        x = torch.nn.functional.pad(x, (0, 0, 0, pad))
        return x.reshape(2, 2, pages, size, d).permute(0, 2, 1, 3, 4).reshape(-1, 2, size, d).contiguous()

    table = torch.arange(2 * pages, dtype=torch.int32, device="cuda").reshape(2, pages)
    cache = PagedKVCache(pool(k), pool(v), table, torch.full((2,), 3_001, dtype=torch.int32, device="cuda"))
    o_p, lse_p = tf.cuda_paged_attention(q, cache, causal=causal, num_splits=4)  # the same splits of each sequence
    assert torch.equal(o_p, o) and torch.allclose(lse_p, lse, rtol=0, atol=1e-5)


def test_the_whole_call_is_planned_once_per_shape(rng):
    """The second call of a shape reuses its DecodePlan; both calls give the prepared run's o, bit for bit."""
    q, k, v = decode_tensors(int(rng.integers(2**31)), 8, 32, 8, 1, 32_768, 128, torch.float16)
    first = tf.cuda_split_kv_attention(q, k, v)
    count = len(PLANS)
    second = tf.cuda_split_kv_attention(q, k, v)
    assert len(PLANS) == count and torch.equal(first[0], second[0])
    run, o, lse, prob = decode_cuda.prepare_split_kv(q, k, v)
    run()
    torch.cuda.synchronize()
    assert torch.equal(first[0], o.reshape(prob.out_shape)) and torch.equal(first[1], lse.reshape(prob.lse_shape))


def test_strided_and_misaligned_inputs_give_the_same_o(rng):
    """k, v as a transposed view (B, Nk, H_kv, d) -> (B, H_kv, Nk, d) and q starting 2 bytes into its memory: the
    planned path copies them (at each call) and gives the contiguous inputs' o and lse, bit for bit."""
    q, k, v = decode_tensors(int(rng.integers(2**31)), 2, 32, 8, 1, 3_001, 128, torch.bfloat16)
    expected = tf.cuda_split_kv_attention(q, k, v)
    k_t, v_t = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (k, v))  # (B, H_kv, Nk, d), strided
    q_off = torch.empty(q.numel() + 1, dtype=q.dtype, device="cuda")[1:].view(q.shape)  # 2 bytes off 16
    q_off.copy_(q)
    assert not k_t.is_contiguous() and q_off.data_ptr() % 16 == 2
    for _ in range(2):  # planning, then planned
        got = tf.cuda_split_kv_attention(q_off, k_t, v_t)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_a_decode_step_captured_in_a_cuda_graph(rng):
    """cuda_split_kv_attention captured once, replayed on a new query copied into the captured one."""
    seed = int(rng.integers(2**31))
    q, k, v = decode_tensors(seed, 8, 32, 8, 1, 16_384, 128, torch.bfloat16)
    static_q = q.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up: compile, size
        tf.cuda_split_kv_attention(static_q, k, v)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_o, static_lse = tf.cuda_split_kv_attention(static_q, k, v)
    new_q = decode_tensors(seed + 1, 8, 32, 8, 1, 16, 128, torch.bfloat16)[0]
    static_q.copy_(new_q)
    graph.replay()
    torch.cuda.synchronize()
    o, lse = tf.cuda_split_kv_attention(new_q, k, v)
    assert torch.equal(static_o, o) and torch.equal(static_lse, lse)


def test_decode_runs_on_pytorch_s_current_stream(rng):
    """A query written on a busy side stream and decoded there at once: right only if the kernels follow it."""
    q, k, v = decode_tensors(int(rng.integers(2**31)), 1, 32, 8, 1, 4_096, 128, torch.float16)
    expected = tf.cuda_split_kv_attention(q, k, v)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        q_side = q * 1  # written after the sleep, on the side stream
        got = tf.cuda_split_kv_attention(q_side, k, v)
    torch.cuda.synchronize()
    assert torch.equal(got[0], expected[0])


@pytest.mark.smoke  # the GPU smoke tier: this entry point on device arrays
def test_cupy_whole_call_matches_numpy(rng):
    """CuPy inputs take the whole-call path too; NumPy inputs the general one: the same o."""
    cupy = pytest.importorskip("cupy")
    gen = np.random.default_rng(int(rng.integers(2**31)))
    q, k, v = (gen.standard_normal(s).astype(np.float16) for s in ((2, 8, 1, 64), (2, 2, 999, 64), (2, 2, 999, 64)))
    o_host, _ = tf.cuda_split_kv_attention(q, k, v)
    o_dev, _ = tf.cuda_split_kv_attention(*(cupy.asarray(x) for x in (q, k, v)))
    assert np.array_equal(cupy.asnumpy(o_dev), o_host)
