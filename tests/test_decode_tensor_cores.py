"""The tensor-core split kernel of decoding (decode/kernels/tensor_cores.py): tiny on numba's simulator
(its mma, ldmatrix and cp.async emulated with the real fragment layouts), real sizes on a GPU.

Float16 results are checked by FlashAttention's rule (error at most 2× that of standard attention
in float16, both against the float64 reference), the lse within F32_TOL.
"""

import numpy as np
import pytest

import tinyflash as tf
from tinyflash.core.checks import check_attention_inputs
from tinyflash.core.tolerance import F32_TOL, assert_close
from tinyflash.decode import kernels
from tinyflash.decode.cuda import prepare_paged, prepare_split_kv
from tinyflash.host.inputs import CUDA_CORES as F16_F32
from tinyflash.decode.kernels import tensor_cores as tc
from tinyflash.decode.paged import to_paged
from tinyflash.gpu import arrays

from test_decode_kernels import check, decode_inputs


def run_prepared(prepared):
    run, o, lse, prob = prepared
    run()
    return arrays.result(o, prob.out_shape, True), arrays.result(lse, prob.lse_shape, True), run.plan


@pytest.mark.simulator
@pytest.mark.grid
@pytest.mark.parametrize("n_q, n_k, d, num_splits, causal, tiling", [
    (3, 100, 64, 1, True, (16, 3)),  # speculative decoding, causal; 7 tiles through a ring of 3; ragged last tile
    (1, 20, 64, 5, False, (16, 2)),  # 5 splits of one tile (16 keys) for 20 keys: empty splits
    (2, 45, 128, 2, True, (32, 2)),  # d = 128, tiles of 32 keys
    (3, 45, 96, 2, True, (16, 2)),  # d = 96: a row's 12 pieces among 32 lanes (2 rows per pass, 8 lanes wait)
    (1, 37, 40, 2, False, (16, 3)),  # d = 40: padded with zero columns to 64
    (2, 29, 200, 2, True, (16, 2)),  # d = 200: padded to 224, 28 pieces a row (one row per pass)
    (3, 40, 256, 3, True, (16, 2)),  # d = 256: 16 mma steps over d
])
def test_tensor_core_split_kernel_on_the_simulator(rng, n_q, n_k, d, num_splits, causal, tiling):
    q, k, v = decode_inputs(rng, 1, 2, 1, n_q, n_k, d, np.float16)  # GQA: 2 query heads on 1 K/V head
    cfg = tc.DecodeTiling(D=d, BC=tiling[0], STAGES=tiling[1])
    o, lse, plan = run_prepared(prepare_split_kv(q, k, v, num_splits=num_splits, causal=causal, tiling=cfg))
    assert plan["rb"] == 2 * n_q and plan["num_splits"] == num_splits  # packed rows: 2 heads × Nq
    check(o, lse, q, k, v, causal, f"tensor-core split kernel, {cfg}")


@pytest.mark.simulator
@pytest.mark.grid
@pytest.mark.parametrize("h, n_q, n_k, d, num_splits, causal, paged", [
    (4, 1, 40, 64, 3, False, False),  # GQA 2 per K/V head, 3 splits: the last to finish merges
    (4, 2, 45, 128, 8, True, False),  # causal, 8 splits (the most), some of them empty
    (4, 3, 21, 64, 1, True, False),  # one split: its block merges alone
    (18, 1, 30, 64, 2, False, False),  # MQA with 18 query heads: two row sets of 16 and 2 rows
    (4, 2, 30, 64, 3, True, True),  # a paged cache, ragged lengths
])
# slow on the simulator (three calls: merged twice, then apart): the counters must be back at zero after a call
def test_a_split_kernel_that_merges_its_row_sets(rng, h, n_q, n_k, d, num_splits, causal, paged):
    """merge=True: no combine kernel; the last block of each row set merges the partials. The result is the
    combine kernel's up to rounding (the weights are divided by their sum before the sum over the splits, not
    after it: o may differ in its float16 rounding), and the same twice in a row from one prepared call: the
    arrival counters are back at zero after each call."""
    h_kv = 2 if h == 4 else 1
    q, k, v = decode_inputs(rng, 2 if paged else 1, h, h_kv, n_q, n_k, d, np.float16)  # two sequences: in pages
    cfg = tc.DecodeTiling(D=d, BC=16, STAGES=2)
    if paged:
        lens = [n_k, 11]
        cache = to_paged(k, v, lens, page_size=4, rng=rng)
        prepare = lambda **merge: prepare_paged(q, cache, num_splits=num_splits, causal=causal, tiling=cfg, **merge)
    else:
        lens = [n_k]
        prepare = lambda **merge: prepare_split_kv(q, k, v, num_splits=num_splits, causal=causal, tiling=cfg, **merge)
    merged = prepare(merge=True)
    first = run_prepared(merged)
    second = run_prepared(merged)
    assert np.array_equal(first[0], second[0]) and np.array_equal(first[1], second[1])
    apart = run_prepared(prepare())
    assert_close(first[0], apart[0], 2.0**-10, "merged against combined o")  # float16: 2⁻¹¹ a rounding
    assert_close(first[1], apart[1], F32_TOL, "merged against combined lse", is_lse=True)
    for b, n in enumerate(lens):
        check(first[0][b], first[1][b], q[b], k[b, :, :n], v[b, :, :n], causal, f"merged, sequence {b}")


def test_merge_is_refused_past_its_limits(rng):
    """More splits than the merge takes, or a merge that is not a bool: a clear error before any launch."""
    q, k, v = decode_inputs(rng, 1, 4, 2, 1, 200, 64, np.float16)
    with pytest.raises(ValueError, match="merge=True takes at most 8 splits; got 9"):
        prepare_split_kv(q, k, v, num_splits=9, merge=True)
    with pytest.raises(TypeError, match="merge must be a bool; got str 'yes'"):
        prepare_split_kv(q, k, v, num_splits=2, merge="yes")


@pytest.mark.simulator
@pytest.mark.grid
def test_tensor_core_kernel_row_chunks(rng):
    """MQA with 18 query heads: 18 packed rows, two chunks of the mma's 16 rows (the second with 2)."""
    q, k, v = decode_inputs(rng, 1, 18, 1, 1, 21, 64, np.float16)
    o, lse, plan = run_prepared(prepare_split_kv(q, k, v, num_splits=2, tiling=tc.DecodeTiling(64, 16, 2)))
    assert plan["grid"] == (2, 1, 2)
    check(o, lse, q, k, v, False, "18 packed rows")


@pytest.mark.simulator
@pytest.mark.grid
@pytest.mark.parametrize("page_size, d", [(4, 64), (5, 64), (4, 96), (5, 40)])
def test_tensor_core_paged_kernel_on_the_simulator(rng, page_size, d):
    """Ragged lengths through a random block table, causal with 2 queries: pages of 4 tokens (a tile
    holds whole pages: its pages are read once per tile) and of 5 (each row's page looked up); at d = 96
    (12 pieces a row for 32 lanes) and d = 40 (padded to 64)."""
    q, k, v = decode_inputs(rng, 3, 2, 1, 2, 40, d, np.float16)  # 2 query heads on 1 K/V head
    lens = [40, 6, 17]
    cache = to_paged(k, v, lens, page_size=page_size, rng=rng)
    o, lse, _ = run_prepared(prepare_paged(q, cache, num_splits=2, causal=True, tiling=tc.DecodeTiling(d, 16, 2)))
    for b, n in enumerate(lens):
        check(o[b], lse[b], q[b], k[b, :, :n], v[b, :, :n], True, f"paged ({page_size} tokens), sequence {b}")


def test_which_split_kernel(rng):
    """float16 at d a multiple of 8 up to 256 runs on the tensor cores (16 packed rows per block, one warp), other
    inputs on the CUDA cores (the registry's first kernel that takes them); asking for the tensor cores where
    they do not apply is a clear error."""
    q, k, v = decode_inputs(rng, 1, 4, 2, 1, 8, 64, np.float16)
    prob = check_attention_inputs(q, k, v, causal=False, scale=None, allowed=F16_F32)
    assert kernels.choose(prob).name == "tensor_cores" and kernels.choose(prob, "cuda_cores").name == "cuda_cores"
    for d in (8, 32, 96, 256):
        other = check_attention_inputs(*decode_inputs(rng, 1, 4, 2, 1, 8, d, np.float16), causal=False, scale=None,
                                       allowed=F16_F32)
        assert kernels.choose(other).name == "tensor_cores"
    for dtype, d in ((np.float32, 64), (np.float16, 20), (np.float16, 264)):
        other = check_attention_inputs(*decode_inputs(rng, 1, 4, 2, 1, 8, d, dtype), causal=False, scale=None,
                                       allowed=F16_F32)
        assert kernels.choose(other).name == "cuda_cores"
        with pytest.raises(ValueError, match="the tensor_cores decode kernel takes float16 or bfloat16 with d = dv a "
                                             "multiple of 8 up to 256"):
            kernels.choose(other, "tensor_cores")
    with pytest.raises(ValueError, match="kernel must be one of tensor_cores, cuda_cores"):
        kernels.choose(prob, "tensor cores")


def test_tensor_core_decode_bad_settings(rng):
    q, k, v = decode_inputs(rng, 1, 4, 2, 1, 8, 64, np.float16)
    with pytest.raises(ValueError, match="BC .keys per tile. must be a positive multiple of 16"):
        tc.DecodeTiling(64, 24, 2).validate()
    with pytest.raises(ValueError, match="STAGES must be at least 2"):
        tc.DecodeTiling(64, 16, 1).validate()
    with pytest.raises(ValueError, match="PREFETCH must be 0, 64, 128 or 256 bytes"):
        tc.DecodeTiling(64, 16, 2, PREFETCH=32).validate()
    with pytest.raises(ValueError, match="D must be a multiple of 8 up to 256"):
        tc.DecodeTiling(100, 16, 2).validate()
    with pytest.raises(ValueError, match="tiling .* is for d = 128; got d = 64"):
        prepare_split_kv(q, k, v, tiling=tc.DecodeTiling(128, 16, 2))
    with pytest.raises(ValueError, match=r"the tensor_cores decode kernel takes the options \['tiling', 'merge'\]; got \['unroll'\]"):
        prepare_split_kv(q, k, v, unroll=2)
    with pytest.raises(ValueError, match=r"the cuda_cores decode kernel takes the options .*; got \['tiling'\]"):
        prepare_split_kv(q, k, v, kernel="cuda_cores", tiling=tc.DecodeTiling(64, 16, 2))


def test_blocks_per_sm():
    """Shared memory sets the blocks per SM: 228 KB per SM, 1 KB reserved per block."""
    cfg = tc.DecodeTiling(128, 32, 4)  # 4 stages × (K, V) × 32 rows × 272 bytes
    assert cfg.smem_bytes == 4 * 2 * 32 * 272 == 69_632
    assert cfg.blocks_per_sm() == 228 * 1024 // (69_632 + 1024) == 3
    assert tc.DecodeTiling(40, 32, 4).smem_bytes == 4 * 2 * 32 * (64 * 2 + 16)  # rows padded to 64 dims
    for d in range(8, 257, 8):  # past d = 128, 16-key tiles: at least 3 blocks per SM at every head dim
        assert tc.default_tiling(d).blocks_per_sm() >= 3 and tc.default_tiling(d).BC == (32 if d <= 128 else 16)


# ---- on a real GPU, at decode sizes ----------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("tiling", [(16, 4), (16, 3), (32, 3), (32, 4), (64, 2), (32, 4, 0), (32, 4, 256)])
@pytest.mark.parametrize("d", [64, 128])
def test_tensor_core_tilings_on_the_gpu(rng, tiling, d):
    """Every tiling the benchmark times (and d = 64), with each prefetch to L2 (the default's 128 bytes, none, 256),
    Nq = 1 and 3 (causal), a ragged Nk."""
    cfg = tc.DecodeTiling(d, *tiling)
    for n_q, causal in ((1, False), (3, True)):
        q, k, v = decode_inputs(rng, 2, 32, 8, n_q, 9_001, d, np.float16)
        o, lse, _ = run_prepared(prepare_split_kv(q, k, v, causal=causal, tiling=cfg))
        check(o, lse, q, k, v, causal, f"{cfg}, Nq={n_q}")


@pytest.mark.gpu
@pytest.mark.parametrize("d", [32, 40, 96, 200, 256])
def test_tensor_core_head_dims_on_the_gpu(rng, d):
    """The default tiling at head dims beside 64 and 128 (40 and 200 padded with zero columns), Nq = 1 and 3
    (causal), a ragged Nk; contiguous and in pages of 16 tokens (a random block table, ragged lengths)."""
    for n_q, causal in ((1, False), (3, True)):
        q, k, v = decode_inputs(rng, 2, 32, 8, n_q, 9_001, d, np.float16)
        o, lse, _ = run_prepared(prepare_split_kv(q, k, v, causal=causal))
        check(o, lse, q, k, v, causal, f"d={d}, Nq={n_q}")
    q, k, v = decode_inputs(rng, 3, 8, 2, 1, 3_000, d, np.float16)
    lens = [3_000, 17, 1_234]
    o, lse, _ = run_prepared(prepare_paged(q, to_paged(k, v, lens, page_size=16, rng=rng), causal=True))
    for b, n in enumerate(lens):
        check(o[b], lse[b], q[b], k[b, :, :n], v[b, :, :n], True, f"paged d={d}, sequence {b}")


@pytest.mark.gpu
@pytest.mark.parametrize("batch, n_k", [(1, 4_096), (8, 4_096), (8, 32_768)])
def test_tensor_core_paged_kernel_with_device_pages(rng, batch, n_k):
    """The paged kernel on a cache built on the GPU as the benchmark builds it (pages of 16 tokens,
    shuffled in the pool by pages_from_contiguous), at the benchmark's sizes: against the
    contiguous kernel on the same keys, and the first and last sequence against the reference."""
    import cupy

    from tinyflash.decode.paged import pages_from_contiguous

    q, k, v = decode_inputs(rng, batch, 32, 8, 1, n_k, 128, np.float16)
    dq, dk, dv = (cupy.asarray(x) for x in (q, k, v))
    perm = cupy.asarray(rng.permutation(batch * (n_k // 16)), dtype=np.int32)
    o, lse = tf.cuda_paged_attention(dq, pages_from_contiguous(dk, dv, 16, perm))
    o_c, lse_c = tf.cuda_split_kv_attention(dq, dk, dv)
    assert_close(cupy.asnumpy(o), cupy.asnumpy(o_c), F32_TOL, "paged vs contiguous o")
    for b in sorted({0, batch - 1}):
        check(cupy.asnumpy(o[b]), cupy.asnumpy(lse[b]), q[b], k[b], v[b], False, f"device pages, sequence {b}")
    assert_close(cupy.asnumpy(lse), cupy.asnumpy(lse_c), F32_TOL, "paged vs contiguous lse", is_lse=True)


def overlapped_calls_equal_the_plain_one(rng, kernel, batch, heads, kv_heads, n_k, d, calls):
    """The combine kernel launched to overlap the split kernel's end (programmatic dependent launch, on Hopper)
    against the plain launch, on the same inputs. Before each of ``calls`` calls the splits' partials (and the
    output) are set to NaN, so that a combine block that read one before the split kernel wrote it would give a NaN;
    each call's output must equal the plain launch's bit for bit (the same sums in the same order)."""
    q, k, v = decode_inputs(rng, batch, heads, kv_heads, 1, n_k, d, np.float16)
    plain, o_plain, _, _ = prepare_split_kv(q, k, v, kernel=kernel, overlap_combine=False)
    plain()
    expected = o_plain.copy_to_host()
    assert np.isfinite(expected).all()
    run, o, _, _ = prepare_split_kv(q, k, v, kernel=kernel, overlap_combine=True)
    o_part, lse_part = run.arrays[5], run.arrays[6]  # (B·H_kv·S·rows·d,), (B·H_kv·S·rows,) float32
    for i in range(calls):
        o_part.copy_to_device(np.full(o_part.shape, np.nan, np.float32))
        lse_part.copy_to_device(np.full(lse_part.shape, np.nan, np.float32))
        o.copy_to_device(np.full(o.shape, np.nan, np.float16))  # and the output: this call must write all of it
        run()
        assert np.array_equal(o.copy_to_host(), expected), f"call {i}: the overlapped call differs from the plain one"


@pytest.mark.simulator
@pytest.mark.grid  # slow on the simulator (three calls, five key tiles each): the NaN-filled partials of two calls
def test_the_overlapping_combine_on_the_simulator(rng):
    """The kernel that waits for the split kernel (its wait emulated: the simulator runs one grid after another)."""
    overlapped_calls_equal_the_plain_one(rng, "tensor_cores", 1, 2, 1, 70, 64, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel, batch", [("tensor_cores", 8), ("tensor_cores", 1), ("cuda_cores", 8)])
def test_the_overlapping_combine_reads_the_finished_partials(rng, kernel, batch):
    """On the GPU, where the combine kernel may start before the split kernel ends: 50 calls."""
    from tinyflash.decode.cuda import overlaps_combine

    if not overlaps_combine():
        pytest.skip("the GPU has no programmatic dependent launch (compute capability 9.0 on)")
    overlapped_calls_equal_the_plain_one(rng, kernel, batch, 32, 8, 4_099, 128, 50)


@pytest.mark.gpu
@pytest.mark.parametrize("batch, n_k", [(1, 32_768), (4, 4_099)])
def test_cuda_core_kernel_still_on_the_gpu(rng, batch, n_k):
    """The CUDA-core split kernel (kernel="cuda_cores") at the shapes the tensor cores take."""
    for n_q, causal in ((1, False), (4, True)):
        q, k, v = decode_inputs(rng, batch, 32, 8, n_q, n_k, 128, np.float16)
        o, lse, _ = run_prepared(prepare_split_kv(q, k, v, causal=causal, kernel="cuda_cores"))
        check(o, lse, q, k, v, causal, f"CUDA cores, B={batch} Nk={n_k} Nq={n_q}")

