"""Each wgmma instruction of tinyflash.gpu.wgmma against NumPy, one warpgroup (128 threads) at a time.

The kernels copy their operands into 128-byte-swizzled shared memory (``gpu.loads.cp_async_swizzled_rows``),
name them by descriptors and check every lane's accumulators at the place the table of ``wgmma.py``'s
docstring gives, written out here by hand. Without a GPU they run the simulator's emulations
(``wgmma_emulation.py``); on a Hopper GPU the same tests run the real instructions, so the tables, the
descriptors' fields and the swizzle are checked against the hardware there. The last tests check the
emulation's own rules (a batch needs a fence; results appear at the wait) and run on the simulator only.
"""

import numpy as np
import pytest
from numba import cuda, float32, uint32, uint64

from tinyflash.gpu import ptx, wgmma
from tinyflash.gpu.loads import cp_async_swizzled_rows
from tinyflash.gpu.ptx_emulation import from_bits, to_bits
from tinyflash.gpu.runtime import simulator_enabled

ELEMENTS = ["float16", "bfloat16"]
ALIGN = 1024  # the swizzle's period: tiles start at multiples of it


def needs_hopper():
    if simulator_enabled():
        return
    from tinyflash.gpu.runtime import compute_capability

    if compute_capability() < (9, 0):
        pytest.skip("wgmma needs compute capability 9.0 (Hopper)")


def words(x, element):
    """(rows, cols) floats -> (rows · cols / 2,) uint32 words of 16-bit pairs, low half first, row by row."""
    bits = to_bits(x, element).astype(np.uint32)  # (rows, cols)
    return np.ascontiguousarray(bits[:, 0::2] | (bits[:, 1::2] << 16)).reshape(-1)


def rounded(x, element):
    """What the tensor cores see of x: its values rounded to the element type, in float64."""
    return from_bits(to_bits(x, element), element).astype(np.float64)


def expected_place(tid, n):
    """Where thread tid's accumulator i sits in the 64 × n D: the table of wgmma.py, by hand."""
    warp, g, t = tid // 32, (tid % 32) // 4, tid % 4
    return [(16 * warp + g + 8 * ((i % 4) // 2), 8 * (i // 4) + 2 * t + i % 2) for i in range(n // 2)]


def lanes_to_matrix(out, n):
    """(128, n / 2) accumulators, thread by thread -> the 64 × n D (each element once)."""
    d = np.full((64, n), np.nan)
    for tid in range(128):
        for i, (r, c) in enumerate(expected_place(tid, n)):
            assert np.isnan(d[r, c])
            d[r, c] = out[tid, i]
    return d


def test_descriptor_bits_and_decode():
    from tinyflash.gpu.wgmma_emulation import decode

    bits = wgmma.descriptor_bits(8192, 1024)
    assert bits == (512 << 16) | (64 << 32) | (1 << 62)
    assert decode(bits | (0x1230 >> 4)) == {"start": 0x1230, "leading": 8192, "stride": 1024, "base_offset": 0,
                                            "swizzle": 1}
    with pytest.raises(ValueError, match="stride_bytes"):
        wgmma.descriptor_bits(16, 1000)


@pytest.mark.parametrize("k_major", [True, False])
def test_swizzled_tile_read_back_by_descriptor(k_major):
    """Values written by swizzled_chunk's rule come back in order through a descriptor's addresses, every k-step
    of a d = 128 tile (two 64-column halves): the writer and the reader agree on the layout."""
    from tinyflash.gpu.wgmma_emulation import operand_addresses

    rows, d = 32, 128
    where = np.zeros((rows, d), np.int64)  # byte address of element (row, column)
    for r in range(rows):
        for c in range(d):
            chunk = c // 8
            where[r, c] = ((chunk // 8) * rows + r) * 128 + ((chunk % 8) ^ (r % 8)) * 16 + 2 * (c % 8)
    assert len(np.unique(where)) == rows * d and where.max() < rows * d * 2
    if k_major:  # operand rows = tile rows, k = 16 columns from 16kk
        for kk in range(d // 16):
            desc = wgmma.descriptor_bits(16, 1024) | (((kk // 4) * rows * 128 + (kk % 4) * 32) >> 4)
            assert np.array_equal(operand_addresses(desc, rows, True), where[:, 16 * kk:16 * kk + 16])
    else:  # operand k = 16 tile rows from 16kk, n = all d columns (LBO: the halves' distance)
        for kk in range(rows // 16):
            desc = wgmma.descriptor_bits(rows * 128, 1024) | ((kk * 16 * 128) >> 4)
            assert np.array_equal(operand_addresses(desc, d, False), where[16 * kk:16 * kk + 16, :].T)


def ss_kernel(element, n, d):
    """A (64 × d) and B (n × d) rows into swizzled shared memory; D = A Bᵀ by d / 16 wgmma's, the first with
    scale_d = 0 (D's registers are never initialised); each thread writes its n / 2 accumulators."""
    mma, wait_all, fence_acc = wgmma.mma_async_ss(element, n), wgmma.wait_group(0), wgmma.fence_operands(n // 2)
    copy_a, copy_b = cp_async_swizzled_rows(d // 2, 128, 64), cp_async_swizzled_rows(d // 2, 128, n)
    bits, B_OFF, K_STEPS, HALF = wgmma.descriptor_bits(16, 1024), 64 * d * 2, d // 16, n // 2

    @cuda.jit
    def kernel(A, B, D):
        smem = cuda.shared.array(0, uint32)
        tid = uint64(cuda.threadIdx.x)
        raw = ptx.shared_address(smem, uint64(0))
        base = (raw + uint32(ALIGN - 1)) & ~uint32(ALIGN - 1)
        copy_a(A, uint64(0), uint64(0), uint64(64), base, tid, 64 * d // 8 // 128)
        copy_b(B, uint64(0), uint64(0), uint64(n), base + uint32(B_OFF), tid, max(1, n * d // 8 // 128))
        ptx.cp_async_commit()
        ptx.cp_async_wait_all()
        wgmma.fence_proxy_async()
        cuda.syncthreads()  # every thread's copies have landed, visible to the tensor cores, before the multiply
        acc = cuda.local.array(HALF, float32)
        wgmma.fence()
        for kk in range(K_STEPS):
            mma(acc, wgmma.descriptor(base + uint32((kk // 4) * 64 * 128 + (kk % 4) * 32), bits),
                wgmma.descriptor(base + uint32(B_OFF + (kk // 4) * n * 128 + (kk % 4) * 32), bits), uint32(kk > 0))
        wgmma.commit_group()
        wait_all()
        fence_acc(acc)
        for i in range(HALF):
            D[tid, i] = acc[i]

    return kernel


@pytest.mark.simulator
@pytest.mark.grid
@pytest.mark.parametrize("element", ELEMENTS)
@pytest.mark.parametrize("n, d", [(16, 64), (24, 128)])
def test_mma_async_ss(rng, element, n, d):
    needs_hopper()
    a, b = rng.standard_normal((64, d)), rng.standard_normal((n, d))  # (64, d), (n, d)
    out = np.zeros((128, n // 2), np.float32)
    smem = 64 * d * 2 + max(n, 8) * d * 2 + ALIGN
    ss_kernel(element, n, d)[1, 128, 0, smem](words(a, element), words(b, element), out)
    expected = rounded(a, element) @ rounded(b, element).T  # (64, n)
    got = lanes_to_matrix(out, n)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max(), np.abs(got - expected).max()


def rs_kernel(element, d, keys):
    """A (keys / 16 steps of 64 × 16) from global memory into registers by the A table; V (keys × d) rows into
    swizzled shared memory, read MN-major (trans_b); D = sum over steps of A_step V[16 step ..]."""
    mma, wait_all = wgmma.mma_async_rs(element, d, trans_b=True), wgmma.wait_group(0)
    copy_v = cp_async_swizzled_rows(d // 2, 128, keys)
    bits = wgmma.descriptor_bits(keys * 128, 1024)  # LBO: from columns 0-63 to 64-127; SBO: 8 keys
    HALF = d // 2

    @cuda.jit
    def kernel(A, V, D):  # A (steps, 64, 8) words
        smem = cuda.shared.array(0, uint32)
        tid = uint64(cuda.threadIdx.x)
        raw = ptx.shared_address(smem, uint64(0))
        base = (raw + uint32(ALIGN - 1)) & ~uint32(ALIGN - 1)
        copy_v(V, uint64(0), uint64(0), uint64(keys), base, tid, keys * d // 8 // 128)
        ptx.cp_async_commit()
        ptx.cp_async_wait_all()
        wgmma.fence_proxy_async()
        cuda.syncthreads()  # V has landed, visible to the tensor cores
        warp, lane = tid // uint64(32), tid % uint64(32)
        row, t = warp * uint64(16) + lane // uint64(4), lane % uint64(4)
        acc = cuda.local.array(HALF, float32)
        for i in range(HALF):
            acc[i] = float32(1.0)  # D = A V + 1
        wgmma.fence()
        for s in range(keys // 16):
            mma(acc, A[s, row, t], A[s, row + 8, t], A[s, row, t + 4], A[s, row + 8, t + 4],
                wgmma.descriptor(base + uint32(s * 16 * 128), bits), uint32(1))
        wgmma.commit_group()
        wait_all()
        for i in range(HALF):
            D[tid, i] = acc[i]

    return kernel


@pytest.mark.simulator
@pytest.mark.grid
@pytest.mark.parametrize("element", ELEMENTS)
@pytest.mark.parametrize("d", [64, 128])
def test_mma_async_rs_trans_b(rng, element, d):
    needs_hopper()
    keys = 32
    a, v = rng.standard_normal((keys // 16, 64, 16)), rng.standard_normal((keys, d))  # (steps, 64, 16), (keys, d)
    out = np.zeros((128, d // 2), np.float32)
    a_words = np.stack([words(x, element).reshape(64, 8) for x in a])  # (steps, 64, 8)
    rs_kernel(element, d, keys)[1, 128, 0, keys * d * 2 + ALIGN](a_words, words(v, element), out)
    expected = 1.0 + sum(rounded(a[s], element) @ rounded(v[16 * s:16 * s + 16], element) for s in range(keys // 16))
    got = lanes_to_matrix(out, d)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max(), np.abs(got - expected).max()


def ss_transposed_kernel(element, d, keys, n, c0):
    """dSᵀ (keys × 64) and K (keys × d) rows into swizzled shared memory; D = dS K[:, c0 : c0 + n] by keys / 16
    wgmma's reading both MN-major (trans_a, trans_b), K from column c0 on (64 bytes into its rows at c0 = 32,
    its second half at c0 = 64): the backward's dQ_i = dS K_j, a warpgroup's share of the columns."""
    mma, wait_all = wgmma.mma_async_ss(element, n, trans_b=True, trans_a=True), wgmma.wait_group(0)
    copy_ds, copy_k = cp_async_swizzled_rows(32, 128, keys), cp_async_swizzled_rows(d // 2, 128, keys)
    bits = wgmma.descriptor_bits(keys * 128, 1024)  # LBO: from columns 0-63 to 64-127; SBO: 8 keys
    K_OFF, HALF = keys * 128, n // 2
    K_COLUMNS = K_OFF + (c0 // 64) * keys * 128 + (c0 % 64) * 2

    @cuda.jit
    def kernel(DS, K, D):
        smem = cuda.shared.array(0, uint32)
        tid = uint64(cuda.threadIdx.x)
        raw = ptx.shared_address(smem, uint64(0))
        base = (raw + uint32(ALIGN - 1)) & ~uint32(ALIGN - 1)
        copy_ds(DS, uint64(0), uint64(0), uint64(keys), base, tid, keys * 64 // 8 // 128)
        copy_k(K, uint64(0), uint64(0), uint64(keys), base + uint32(K_OFF), tid, keys * d // 8 // 128)
        ptx.cp_async_commit()
        ptx.cp_async_wait_all()
        wgmma.fence_proxy_async()
        cuda.syncthreads()  # both tiles have landed, visible to the tensor cores
        acc = cuda.local.array(HALF, float32)
        wgmma.fence()
        for s in range(keys // 16):
            mma(acc, wgmma.descriptor(base + uint32(s * 16 * 128), bits),
                wgmma.descriptor(base + uint32(K_COLUMNS + s * 16 * 128), bits), uint32(s > 0))
        wgmma.commit_group()
        wait_all()
        for i in range(HALF):
            D[tid, i] = acc[i]

    return kernel


@pytest.mark.simulator
@pytest.mark.grid
@pytest.mark.parametrize("element", ELEMENTS)
@pytest.mark.parametrize("d, n, c0", [(64, 32, 32), (128, 64, 64), (128, 128, 0)])
def test_mma_async_ss_trans_a(rng, element, d, n, c0):
    needs_hopper()
    keys = 32
    ds_t, k = rng.standard_normal((keys, 64)), rng.standard_normal((keys, d))  # dSᵀ (keys, 64), K (keys, d)
    out = np.zeros((128, n // 2), np.float32)
    ss_transposed_kernel(element, d, keys, n, c0)[1, 128, 0, keys * (64 + d) * 2 + ALIGN](
        words(ds_t, element), words(k, element), out)
    expected = rounded(ds_t, element).T @ rounded(k, element)[:, c0:c0 + n]  # (64, n)
    got = lanes_to_matrix(out, n)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max(), np.abs(got - expected).max()


def async_kernel(fenced):
    """One wgmma into accumulators set to 7: their values read before the wait, and after it."""
    mma, wait_all = wgmma.mma_async_ss("float16", 8), wgmma.wait_group(0)
    bits = wgmma.descriptor_bits(16, 1024)

    @cuda.jit
    def kernel(before, after):
        smem = cuda.shared.array(0, uint32)
        tid = cuda.threadIdx.x
        for i in range(tid, 2304, 128):  # A: 64 rows of 128 bytes, B: 8 rows
            smem[i] = uint32(0x3C003C00)  # float16 ones
        base = ptx.shared_address(smem, uint64(0))
        wgmma.fence_proxy_async()
        cuda.syncthreads()  # the ones are written before the multiply reads them
        acc = cuda.local.array(4, float32)
        for i in range(4):
            acc[i] = float32(7.0)
        if fenced:
            wgmma.fence()
        mma(acc, wgmma.descriptor(base, bits), wgmma.descriptor(base + uint32(8192), bits), uint32(1))
        wgmma.commit_group()
        before[tid] = acc[0]
        wait_all()
        after[tid] = acc[0]

    return kernel


@pytest.mark.simulator
@pytest.mark.grid
@pytest.mark.skipif(not simulator_enabled(), reason="the emulation's rules; on a GPU reading D early is undefined")
def test_emulation_writes_at_the_wait():
    before, after = np.zeros(128, np.float32), np.zeros(128, np.float32)
    async_kernel(True)[1, 128, 0, 9216](before, after)
    assert np.all(before == 7) and np.all(after == 7 + 16)  # 16 products of ones, added at the wait


@pytest.mark.simulator
@pytest.mark.grid
@pytest.mark.skipif(not simulator_enabled(), reason="the emulation's rules; a GPU does not check the fence")
def test_emulation_wants_a_fence():
    before, after = np.zeros(128, np.float32), np.zeros(128, np.float32)
    with pytest.raises(RuntimeError, match="wgmma.fence"):
        async_kernel(False)[1, 128, 0, 9216](before, after)


def two_groups_kernel(peek):
    """Two wgmma groups into two accumulator arrays set to 7, then ``wait_group 1`` and ``wait_group 0``: the first
    array read after the first wait, the second after the second (and, with ``peek``, before it: the emulation's
    rule; on a GPU that read is undefined)."""
    mma, wait_one, wait_all = wgmma.mma_async_ss("float16", 8), wgmma.wait_group(1), wgmma.wait_group(0)
    fence_acc = wgmma.fence_operands(4)
    bits = wgmma.descriptor_bits(16, 1024)

    @cuda.jit
    def kernel(first, second, second_early):
        smem = cuda.shared.array(0, uint32)
        tid = cuda.threadIdx.x
        for i in range(tid, 2304, 128):  # A: 64 rows of 128 bytes, B: 8 rows
            smem[i] = uint32(0x3C003C00)  # float16 ones
        base = ptx.shared_address(smem, uint64(0))
        wgmma.fence_proxy_async()
        cuda.syncthreads()  # the ones are written before the multiplies read them
        acc1, acc2 = cuda.local.array(4, float32), cuda.local.array(4, float32)
        for i in range(4):
            acc1[i], acc2[i] = float32(7.0), float32(7.0)
        a, b = wgmma.descriptor(base, bits), wgmma.descriptor(base + uint32(8192), bits)
        for acc in (acc1, acc2):  # one group each
            fence_acc(acc)
            wgmma.fence()
            mma(acc, a, b, uint32(1))
            wgmma.commit_group()
        wait_one()  # the older group (acc1's) is done; acc2's may still run
        fence_acc(acc1)
        first[tid] = acc1[0]
        if peek:
            second_early[tid] = acc2[0]
        wait_all()
        fence_acc(acc2)
        second[tid] = acc2[0]

    return kernel


def test_wait_group_1_retires_all_but_the_newest():
    """wait_group 1 after two groups: the first group's accumulators are written; wait_group 0: the second's. On
    the simulator, the second's are still the old values between the two waits."""
    needs_hopper()
    first, second, early = (np.zeros(128, np.float32) for _ in range(3))
    two_groups_kernel(simulator_enabled())[1, 128, 0, 9216](first, second, early)
    assert np.all(first == 7 + 16) and np.all(second == 7 + 16)  # 16 products of ones each
    if simulator_enabled():
        assert np.all(early == 7)
