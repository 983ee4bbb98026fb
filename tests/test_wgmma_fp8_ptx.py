"""The FP8 warpgroup multiply of tinyflash.gpu.wgmma (``wgmma.mma_async.m64nNk32.f32.e4m3.e4m3``) against NumPy.

One warpgroup (128 threads) copies e4m3 bytes into 128-byte-swizzled shared memory
(``gpu.loads.cp_async_swizzled_rows``: a row of d e4m3 values is d / 4 words), names the tiles by descriptors,
multiplies in k-steps of 32 and writes each lane's float32 accumulators, which the test places in the 64 × N D
by the table of ``wgmma.py``'s docstring (``test_wgmma_ptx.lanes_to_matrix``). Both operands are K-major (FP8 has
no transpose): A is 64 × d, B is given as its transpose, N × d. With A in registers (``rs``), each lane loads its
four words by the FP8 A table (the same bytes as the 16-bit one) and B plays Vᵀ of O = P V.

The reference is the float64 product of the decoded e4m3 values (``core.e4m3.decode_e4m3``). Tolerance, per element
of D, after ``steps`` instructions from D_0: |error| <= steps · UNIT · (|D_0| + Σ_k |a_ik||b_kj|), UNIT the error of
one instruction relative to that bound on its partial sum (every partial sum is at most it in magnitude):

* simulator: the products of two e4m3 numbers and their sum over one instruction's 32 are exact in float64 (at
  most 8 significant bits each, between 2^-18 and 448², fewer than 53 bits in all); the emulation rounds once
  per instruction to float32, by at most 2^-24 of the partial sum; float64's own roundings (2^-53) and the
  second-order terms stay far below another 2^-24: UNIT = 2^-23.
* Hopper GPU: the FP8 tensor cores do not accumulate in full float32. NVIDIA documents no figure; DeepSeek-V3's
  report (arXiv 2412.19437, section 3.3.2) finds about 14 bits kept on an H800. On one H100 (numba-cuda 0.30.4,
  kernels like these at N = 64 to 256, 1 to 8 instructions, 4 seeds) the worst element erred by 2^-13.0 of the
  bound after one instruction and by 2^-12.0 after several: UNIT = 2^-12 leaves a factor of 2 or more (8 other
  seeds at each of this file's sizes then came to at most 0.4 of the bound).

A wrong fragment, descriptor or swizzle moves whole products: the emulation broken on purpose (the A table's rows
and column halves swapped; 2k in place of k in the descriptor's addresses) erred by over a third of |A||B| at its
worst element, far above either bound.
"""

import numpy as np
import pytest
from numba import cuda, float32, uint32, uint64
from test_wgmma_ptx import ALIGN, lanes_to_matrix, needs_hopper

from tinyflash.core.e4m3 import decode_e4m3, encode_e4m3
from tinyflash.gpu import ptx, wgmma
from tinyflash.gpu.loads import cp_async_swizzled_rows
from tinyflash.gpu.runtime import simulator_enabled

ROW_BYTES = 128  # a row of a 128-byte-swizzled tile: 128 e4m3 values
K_STEP = wgmma.WGMMA_K_FP8  # 32 e4m3 values, 32 bytes, per instruction
UNIT = 2.0 ** -23 if simulator_enabled() else 2.0 ** -12  # one instruction's error over its bound (docstring)


def e4m3_operand(rng, shape):
    """Random e4m3 bytes (uint8) of standard-normal values times 8 (so that both ends of the format, subnormals and
    values past 16, appear), and their float64 values. Bytes of 0 (zeros) stay, as rounding gives them."""
    x = 8.0 * rng.standard_normal(shape)
    code = encode_e4m3(x)  # (shape) uint8
    return code, decode_e4m3(code).astype(np.float64)


def as_words(code):
    """(rows, cols) uint8 -> (rows · cols / 4,) uint32: four e4m3 per word, the first in the low byte."""
    return np.ascontiguousarray(code).view("<u4").reshape(-1)


def tile_bytes(rows, d):
    """Shared bytes of a swizzled tile of rows × d e4m3: 128-byte rows even where d < 128, in 128-column pieces."""
    return rows * ROW_BYTES * -(-d // ROW_BYTES)


@cuda.jit(device=True, inline="always")
def k_step_offset(kk, rows):
    """Byte offset in a K-major tile of its kk-th 32 columns: their 128-column piece, then 32 bytes a step."""
    return uint32(kk // 4) * uint32(rows * ROW_BYTES) + uint32(kk % 4) * uint32(K_STEP)


def copy_plan(d, rows):
    """The copier of a rows × d e4m3 tile, its chunks per thread, and the rows it writes (zeros past ``rows``):
    the tile's room must hold them all."""
    words = d // 4
    rows_per_pass = 128 // (words // 4)  # one 16-byte chunk per thread
    chunks_per_thread = -(-rows // rows_per_pass)
    return cp_async_swizzled_rows(words, 128, rows), chunks_per_thread, max(rows, rows_per_pass * chunks_per_thread)


def ss_kernel(n, d):
    """A (64 × d) and Bᵀ (n × d) into swizzled shared memory; D = A B by d / 32 FP8 wgmma's, the first with
    scale_d = 0 (D's registers are never initialised); each thread writes its n / 2 accumulators."""
    mma, wait_all, fence_acc = wgmma.mma_async_ss("e4m3", n), wgmma.wait_group(0), wgmma.fence_operands(n // 2)
    (copy_a, a_chunks, a_rows), (copy_b, b_chunks, _) = copy_plan(d, 64), copy_plan(d, n)
    bits, B_OFF, K_STEPS, HALF = wgmma.descriptor_bits(16, 1024), tile_bytes(a_rows, d), d // K_STEP, n // 2

    @cuda.jit
    def kernel(A, B, D):
        smem = cuda.shared.array(0, uint32)
        tid = uint64(cuda.threadIdx.x)
        raw = ptx.shared_address(smem, uint64(0))
        base = (raw + uint32(ALIGN - 1)) & ~uint32(ALIGN - 1)
        copy_a(A, uint64(0), uint64(0), uint64(64), base, tid, a_chunks)
        copy_b(B, uint64(0), uint64(0), uint64(n), base + uint32(B_OFF), tid, b_chunks)
        ptx.cp_async_commit()
        ptx.cp_async_wait_all()
        wgmma.fence_proxy_async()
        cuda.syncthreads()  # every thread's copies have landed, visible to the tensor cores, before the multiply
        acc = cuda.local.array(HALF, float32)
        wgmma.fence()
        for kk in range(K_STEPS):
            mma(acc, wgmma.descriptor(base + k_step_offset(kk, 64), bits),
                wgmma.descriptor(base + uint32(B_OFF) + k_step_offset(kk, n), bits), uint32(kk > 0))
        wgmma.commit_group()
        wait_all()
        fence_acc(acc)
        for i in range(HALF):
            D[tid, i] = acc[i]

    return kernel


def check(got, expected, bound):
    """got within the module docstring's bound of expected, element by element; the worst element on failure."""
    excess = np.abs(got - expected) - bound
    worst = tuple(int(i) for i in np.unravel_index(np.argmax(excess), excess.shape))
    assert excess.max() <= 0, (f"D{worst}: got {got[worst]}, expected {expected[worst]}, "
                               f"error {abs(got[worst] - expected[worst]):.3g} > bound {bound[worst]:.3g}")


def run_ss(rng, n, d):
    needs_hopper()
    (a_code, a), (b_code, b) = e4m3_operand(rng, (64, d)), e4m3_operand(rng, (n, d))  # A (64, d), Bᵀ (n, d)
    out = np.zeros((128, n // 2), np.float32)
    smem = tile_bytes(copy_plan(d, 64)[2], d) + tile_bytes(copy_plan(d, n)[2], d) + ALIGN
    ss_kernel(n, d)[1, 128, 0, smem](as_words(a_code), as_words(b_code), out)
    steps = d // K_STEP
    check(lanes_to_matrix(out, n), a @ b.T, steps * UNIT * (np.abs(a) @ np.abs(b).T))


@pytest.mark.simulator
def test_mma_async_ss_e4m3_smoke(rng):
    """First tier: one instruction, N = 64."""
    run_ss(rng, 64, 32)


@pytest.mark.simulator
@pytest.mark.grid
@pytest.mark.parametrize("n, d", [(8, 32), (256, 32), (24, 128), (64, 256)])
def test_mma_async_ss_e4m3(rng, n, d):
    """N from the least to the most; d = 128 and 256: k-steps across a 128-byte row and into the next piece."""
    run_ss(rng, n, d)


def rs_kernel(n, keys):
    """P (keys / 32 steps of 64 × 32) from global memory into registers by the FP8 A table; Vᵀ (n × keys) into
    swizzled shared memory, K-major; D = 1 + sum over steps of P_step V[32 step ..]."""
    mma, wait_all = wgmma.mma_async_rs("e4m3", n), wgmma.wait_group(0)
    copy_v, v_chunks, _ = copy_plan(keys, n)
    bits, HALF = wgmma.descriptor_bits(16, 1024), n // 2

    @cuda.jit
    def kernel(P, VT, D):  # P (steps, 64, 8) words: a row's 32 e4m3 of a step, four a word
        smem = cuda.shared.array(0, uint32)
        tid = uint64(cuda.threadIdx.x)
        raw = ptx.shared_address(smem, uint64(0))
        base = (raw + uint32(ALIGN - 1)) & ~uint32(ALIGN - 1)
        copy_v(VT, uint64(0), uint64(0), uint64(n), base, tid, v_chunks)
        ptx.cp_async_commit()
        ptx.cp_async_wait_all()
        wgmma.fence_proxy_async()
        cuda.syncthreads()  # Vᵀ has landed, visible to the tensor cores
        warp, lane = tid // uint64(32), tid % uint64(32)
        row, t = warp * uint64(16) + lane // uint64(4), lane % uint64(4)
        acc = cuda.local.array(HALF, float32)
        for i in range(HALF):
            acc[i] = float32(1.0)  # D = P V + 1
        wgmma.fence()
        for s in range(keys // K_STEP):  # words t and t + 4: columns 4t .. 4t + 3 and 16 on
            mma(acc, P[s, row, t], P[s, row + 8, t], P[s, row, t + 4], P[s, row + 8, t + 4],
                wgmma.descriptor(base + k_step_offset(s, n), bits), uint32(1))
        wgmma.commit_group()
        wait_all()
        for i in range(HALF):
            D[tid, i] = acc[i]

    return kernel


def run_rs(rng, n, keys):
    needs_hopper()
    (p_code, p), (vt_code, vt) = e4m3_operand(rng, (64, keys)), e4m3_operand(rng, (n, keys))  # P (64, keys), Vᵀ
    steps = keys // K_STEP
    p_words = np.stack([as_words(p_code[:, K_STEP * s:K_STEP * (s + 1)]).reshape(64, 8) for s in range(steps)])
    out = np.zeros((128, n // 2), np.float32)
    rs_kernel(n, keys)[1, 128, 0, tile_bytes(copy_plan(keys, n)[2], keys) + ALIGN](p_words, as_words(vt_code), out)
    check(lanes_to_matrix(out, n), 1.0 + p @ vt.T, steps * UNIT * (1.0 + np.abs(p) @ np.abs(vt).T))


@pytest.mark.simulator
def test_mma_async_rs_e4m3_smoke(rng):
    """First tier: P in registers, two k-steps, N = 64."""
    run_rs(rng, 64, 64)


@pytest.mark.simulator
@pytest.mark.grid
@pytest.mark.parametrize("n, keys", [(8, 32), (256, 32), (128, 128)])
def test_mma_async_rs_e4m3(rng, n, keys):
    run_rs(rng, n, keys)


def test_one_byte_tile_read_back_by_descriptor():
    """e4m3 bytes written by swizzled_chunk's rule (16-byte chunks of 16 values) come back in order through a
    descriptor's one-byte addresses, every 32-column k-step of a d = 256 tile (two 128-column pieces)."""
    from tinyflash.gpu.wgmma_emulation import operand_addresses

    rows, d = 32, 256
    where = np.zeros((rows, d), np.int64)  # byte address of element (row, column)
    for r in range(rows):
        for c in range(d):
            chunk = c // 16
            where[r, c] = ((chunk // 8) * rows + r) * ROW_BYTES + ((chunk % 8) ^ (r % 8)) * 16 + c % 16
    assert len(np.unique(where)) == rows * d
    for kk in range(d // K_STEP):
        start = (kk // 4) * rows * ROW_BYTES + (kk % 4) * K_STEP  # k_step_offset, on the host
        desc = wgmma.descriptor_bits(16, 1024) | (start >> 4)
        assert np.array_equal(operand_addresses(desc, rows, True, 1), where[:, K_STEP * kk:K_STEP * (kk + 1)])


def test_e4m3_is_k_major_only():
    """The transposes exist for 16-bit types alone: asking for one with e4m3 is a ValueError before any kernel."""
    with pytest.raises(ValueError, match="K-major"):
        wgmma.mma_async_ss("e4m3", 64, trans_b=True)
    with pytest.raises(ValueError, match="K-major"):
        wgmma.mma_async_rs("e4m3", 64, trans_b=True)
    with pytest.raises(ValueError, match="multiple of 8"):
        wgmma.mma_async_ss("e4m3", 12)
