"""The decode kernels (split kernel + combine kernel): tiny on numba's simulator, real sizes on a GPU.

Each result is compared with the float64 reference and with the NumPy split-KV stage: float32
within F32_TOL; float16 by FlashAttention's rule against the naive stage in float16. The simulator
runs one block of 32 threads at a time, one Python thread each, so the sizes there are tiny.
"""

import numpy as np
import pytest

import tinyflash as tf
from tinyflash.core.tolerance import F32_TOL, assert_close, assert_fa_rule
from tinyflash.decode.kernels import cuda_cores as kernels
from tinyflash.decode.cuda import prepare_paged, prepare_split_kv
from tinyflash.gpu import arrays
from tinyflash.decode.paged import to_paged


def decode_inputs(rng, batch, h, h_kv, n_q, n_k, d, dtype):
    q = rng.standard_normal((batch, h, n_q, d)).astype(dtype)  # (B, H, Nq, d)
    k = rng.standard_normal((batch, h_kv, n_k, d)).astype(dtype)  # (B, H_kv, Nk, d)
    v = rng.standard_normal((batch, h_kv, n_k, d)).astype(dtype)  # (B, H_kv, Nk, d)
    return q, k, v


def check(o, lse, q, k, v, causal, what):
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=causal)
    if q.dtype == np.float16:
        assert_fa_rule(o, tf.naive_attention(q, k, v, causal=causal)[0], ref_o, np.float16, what=f"{what} o")
    else:
        assert_close(o, ref_o, F32_TOL, f"{what} o")
    assert_close(lse, ref_lse, F32_TOL, f"{what} lse", is_lse=True)


@pytest.mark.simulator
@pytest.mark.grid
@pytest.mark.parametrize("n_q, n_k, d, num_splits, causal", [
    (3, 21, 8, 2, True),  # speculative decoding: 3 queries, bottom-right causal; a ragged last step
    (1, 5, 5, 4, False),  # d not a multiple of the vector width; more splits than steps: empty splits
])
def test_split_kernel_on_the_simulator(rng, n_q, n_k, d, num_splits, causal):
    q, k, v = decode_inputs(rng, 2, 4, 2, n_q, n_k, d, np.float32)  # GQA: 2 query heads per K/V head
    o, lse = tf.cuda_split_kv_attention(q, k, v, num_splits=num_splits, causal=causal)
    assert o.shape == q.shape and o.dtype == np.float32 and lse.shape == q.shape[:-1]
    check(o, lse, q, k, v, causal, f"split kernel, {num_splits} splits")


@pytest.mark.simulator
@pytest.mark.grid
def test_split_kernel_mqa_and_row_chunks(rng):
    """MQA (H_kv = 1) with 9 query heads: 9 packed rows, more than a block's MAX_ROWS (two row
    chunks); and another block shape, 3 keys per slot and tile (a register cap is accepted; the
    simulator ignores it)."""
    assert 9 > kernels.MAX_ROWS
    q, k, v = decode_inputs(rng, 1, 9, 1, 1, 19, 8, np.float32)
    o, lse = tf.cuda_split_kv_attention(q, k, v, num_splits=2)
    check(o, lse, q, k, v, False, "MQA")
    run, o, lse, prob = prepare_split_kv(q, k, v, num_splits=1, unroll=3, max_registers=168)
    run()
    check(arrays.result(o, prob.out_shape, True), arrays.result(lse, prob.lse_shape, True), q, k, v, False, "unroll=3")
    with pytest.raises(ValueError, match="threads must be a multiple of 32"):
        prepare_split_kv(q, k, v, threads=48)
    with pytest.raises(ValueError, match="row_bytes must be a multiple of 16"):
        prepare_split_kv(q, k, v, row_bytes=24)


@pytest.mark.simulator
@pytest.mark.grid
@pytest.mark.parametrize("paged, row_bytes", [(False, 16), (True, 16), (True, 32)])
def test_the_ring_wraps_on_the_simulator(rng, paged, row_bytes):
    """The CUDA-core split kernel (d = 32 in float16 goes to the tensor cores unless asked), one key per slot and
    tile (tiles of 8 keys at d = 32, float16, 16 bytes per thread and row;
    16 keys with 32 bytes, two copies each): 7 or 4 tiles per split, more than the ring's STAGES,
    so stages are reused; causal with 2 queries, a ragged last tile, and (paged) pages of 4 tokens
    read through the block table."""
    q, k, v = decode_inputs(rng, 1, 2, 1, 2, 50, 32, np.float16)
    tiles = -(-50 // (kernels.SIMULATOR_THREADS // kernels.lanes(32, 2, row_bytes)[2]))
    assert tiles > kernels.STAGES
    tuning = {"num_splits": 1, "causal": True, "kernel": "cuda_cores", "unroll": 1, "row_bytes": row_bytes}
    if paged:
        run, o, lse, prob = prepare_paged(q, to_paged(k, v, [50], page_size=4, rng=rng), **tuning)
    else:
        run, o, lse, prob = prepare_split_kv(q, k, v, **tuning)
    run()
    check(arrays.result(o, prob.out_shape, True), arrays.result(lse, prob.lse_shape, True), q, k, v, True,
          f"{tiles} tiles in a ring of {kernels.STAGES} stages, paged={paged}, {row_bytes} bytes per row and thread")


@pytest.mark.simulator
@pytest.mark.grid
# slow on the simulator (three sequences, two splits each): ragged lengths need several sequences
def test_paged_kernel_on_the_simulator(rng):
    """Ragged lengths through a random block table (pages of 4 tokens), causal, float16."""
    q, k, v = decode_inputs(rng, 3, 4, 2, 2, 30, 8, np.float16)
    lens = [30, 6, 13]
    cache = to_paged(k, v, lens, page_size=4, rng=rng)
    o, lse = tf.cuda_paged_attention(q, cache, num_splits=2, causal=True)
    _, ref_lse = tf.paged_attention(q, cache, causal=True)
    for b, n in enumerate(lens):
        check(o[b], lse[b], q[b], k[b, :, :n], v[b, :, :n], True, f"paged kernel, sequence {b}")
        assert_close(lse[b], ref_lse[b], F32_TOL, "paged kernel vs NumPy paged lse", is_lse=True)


def test_bad_inputs_to_the_kernels(rng):
    q, k, v = decode_inputs(rng, 1, 2, 1, 1, 4, 8, np.float32)
    with pytest.raises(ValueError, match="need dv == d"):
        tf.cuda_split_kv_attention(q, k, v[..., :4])
    with pytest.raises(TypeError, match="^q has dtype float64; expected one of float16, bfloat16, float32"):
        tf.cuda_split_kv_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    with pytest.raises(ValueError, match="head dims up to 128 for float32"):
        tf.cuda_split_kv_attention(*(np.zeros(x.shape[:-1] + (200,), np.float32) for x in (q, k, v)))


# ---- on a real GPU, at decode sizes ----------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("batch, n_k, num_splits", [(1, 32_768, None), (4, 4_099, None), (2, 8_192, 1),
                                                    (1, 1_000, 300)])
@pytest.mark.parametrize("causal", [False, True])
def test_split_kernel_on_the_gpu(rng, batch, n_k, num_splits, causal):
    """Llama-like heads (32 query heads, 8 K/V heads, d = 128), float16, Nq = 1 and 4."""
    for n_q in (1, 4):
        q, k, v = decode_inputs(rng, batch, 32, 8, n_q, n_k, 128, np.float16)
        o, lse = tf.cuda_split_kv_attention(q, k, v, num_splits=num_splits, causal=causal)
        check(o, lse, q, k, v, causal, f"B={batch} Nk={n_k} Nq={n_q}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, d", [(np.float32, 64), (np.float32, 128), (np.float16, 256), (np.float16, 80)])
def test_split_kernel_dtypes_and_head_dims_on_the_gpu(rng, dtype, d):
    q, k, v = decode_inputs(rng, 2, 8, 2, 1, 5_000, d, dtype)
    o, lse = tf.cuda_split_kv_attention(q, k, v)
    check(o, lse, q, k, v, False, f"{np.dtype(dtype).name} d={d}")


@pytest.mark.gpu
def test_paged_kernel_on_the_gpu(rng):
    q, k, v = decode_inputs(rng, 8, 32, 8, 1, 20_000, 128, np.float16)
    lens = rng.integers(1, 20_001, size=8)
    lens[0] = 20_000
    cache = to_paged(k, v, lens, page_size=16, rng=rng)
    o, lse = tf.cuda_paged_attention(q, cache)
    for b, n in enumerate(lens):
        check(o[b], lse[b], q[b], k[b, :, :n], v[b, :, :n], False, f"paged, sequence {b} of {n}")


@pytest.mark.gpu
def test_a_prepared_run_keeps_its_outputs_alive(rng):
    """prepare_split_kv's launches hold the addresses of o and lse: a caller that keeps only ``run``
    and ``o`` (as the benchmark does) must not let lse's memory go to another array that the
    combine kernel then overwrites (this once turned a later kernel's sequence lengths into
    float bits: an illegal address)."""
    import cupy

    q, k, v = (cupy.asarray(x) for x in decode_inputs(rng, 1, 32, 8, 1, 4_096, 128, np.float16))
    run, o, _, _ = prepare_split_kv(q, k, v)  # lse dropped at once
    others = [cupy.full(1, 7, dtype=np.int32) for _ in range(64)]  # small arrays, as a block table or lengths are
    run()
    cupy.cuda.Device().synchronize()
    assert all(int(x[0]) == 7 for x in others), "the combine kernel wrote into memory it does not own"
    q, k, v = q.get(), k.get(), v.get()
    assert_fa_rule(cupy.asnumpy(o).reshape(q.shape), tf.naive_attention(q, k, v)[0], tf.reference_attention(q, k, v)[0],
                   np.float16, what="the kept output")


def test_a_bad_paged_cache_never_reaches_the_kernel(rng):
    """cuda_paged_attention checks the cache before anything runs (on the simulator: no launch at all)."""
    from test_decode import bad_caches

    q, good, bad = bad_caches(rng)
    for what, cache, words in bad:
        with pytest.raises((ValueError, TypeError), match=words):
            tf.cuda_paged_attention(q.astype(np.float32), cache)


@pytest.mark.gpu
def test_the_process_keeps_working_after_a_refused_cache(rng):
    """A cache on the GPU (CuPy) with an entry past its pool is refused with a ValueError; the GPU is untouched,
    and the same call on the good cache, and CuPy itself, work after it."""
    import cupy

    from test_decode import bad_caches
    from tinyflash.decode.paged import PagedKVCache

    q, good, bad = bad_caches(rng)
    on_gpu = [PagedKVCache(cupy.asarray(c.k_pages, dtype=np.float32), cupy.asarray(c.v_pages, dtype=np.float32),
                           cupy.asarray(c.block_table), cupy.asarray(c.seq_lens)) for c in (good, bad[0][1], bad[3][1])]
    qg = cupy.asarray(q.astype(np.float32))
    for cache, (_, _, words) in zip(on_gpu[1:], (bad[0], bad[3])):
        with pytest.raises(ValueError, match=words):
            tf.cuda_paged_attention(qg, cache)
    o, _ = tf.cuda_paged_attention(qg, on_gpu[0])
    good32 = PagedKVCache(good.k_pages.astype(np.float32), good.v_pages.astype(np.float32), good.block_table,
                          good.seq_lens)
    ref, _ = tf.paged_attention(q.astype(np.float32), good32)
    assert np.abs(cupy.asnumpy(o) - ref).max() < 1e-4 and float(cupy.arange(3).sum()) == 3.0


@pytest.mark.simulator
@pytest.mark.grid
@pytest.mark.parametrize("n_splits", [1, 11, 2 * 128 + 9])
def test_combine_kernel_merges_any_number_of_splits(rng, n_splits):
    """float32 out: the combine kernel against a float64 softmax over the splits, for one split, a count that
    is not a multiple of its UNROLL, and more splits than its THREADS (three chunks of weights); a row whose
    splits are all empty gets O = 0 and lse = -inf, and a row with some empty splits ignores them."""
    from tinyflash.decode.kernels import combine as combine_kernel

    rows, d, heads = 3, 12, 2
    o_part = rng.standard_normal((heads, n_splits, rows, d)).astype(np.float32)
    lse_part = (3 * rng.standard_normal((heads, n_splits, rows))).astype(np.float32)
    lse_part[1, :, 0] = -np.inf  # every split of one row empty
    lse_part[0, ::2, 2] = -np.inf if n_splits > 1 else lse_part[0, ::2, 2]  # some splits of another
    O, LSE = np.full(heads * rows * d, np.nan, np.float32), np.full(heads * rows, np.nan, np.float32)
    kernel = combine_kernel.make_combine_kernel("float32")
    kernel[combine_kernel.grid(rows, d, heads), combine_kernel.THREADS](
        o_part.reshape(-1), lse_part.reshape(-1), O, LSE, n_splits, rows, d)
    lse64 = lse_part.astype(np.float64)
    with np.errstate(invalid="ignore"):
        lse = np.logaddexp.reduce(lse64, axis=1)  # (heads, rows)
        w = np.nan_to_num(np.exp(lse64 - lse[:, None]))  # 0 where the whole row is empty
    expected = (w[..., None] * o_part).sum(1)  # (heads, rows, d)
    got = O.reshape(heads, rows, d)
    assert np.all(got[1, 0] == 0) and LSE.reshape(heads, rows)[1, 0] == -np.inf
    assert np.abs(got - expected).max() / np.abs(expected).max() < 1e-5
    live = np.isfinite(lse)
    np.testing.assert_allclose(LSE.reshape(heads, rows)[live], lse[live], rtol=1e-5, atol=1e-5)


@pytest.mark.simulator
@pytest.mark.grid
def test_combine_kernel_writes_bfloat16_bits(rng):
    """The combine kernel for bfloat16 outputs: O as uint16 bit patterns, each the float32 merge rounded to
    nearest even (what to_bits does to the same float32 values), lse as float32."""
    from tinyflash.decode.kernels import combine as combine_kernel
    from tinyflash.gpu.ptx_emulation import to_bits

    n_splits, rows, d = 3, 5, 8
    o_part = rng.standard_normal((n_splits, rows, d)).astype(np.float32)
    lse_part = rng.standard_normal((n_splits, rows)).astype(np.float32)
    lse_part[1, 2] = -np.inf  # an empty split for one row
    O, LSE = np.zeros(rows * d, np.uint16), np.zeros(rows, np.float32)
    kernel = combine_kernel.make_combine_kernel("bfloat16")
    kernel[combine_kernel.grid(rows, d, 1), combine_kernel.THREADS](
        o_part.reshape(-1), lse_part.reshape(-1), O, LSE, n_splits, rows, d)
    w = np.exp(lse_part.astype(np.float64) - np.logaddexp.reduce(lse_part.astype(np.float64), axis=0))
    expected = (w[:, :, None] * o_part).sum(0)
    got = O.reshape(rows, d)
    assert np.abs(got.astype(np.int32) - to_bits(expected.astype(np.float32), "bfloat16").astype(np.int32)).max() <= 1
    np.testing.assert_allclose(LSE, np.logaddexp.reduce(lse_part.astype(np.float64), axis=0), rtol=1e-6, atol=1e-6)
