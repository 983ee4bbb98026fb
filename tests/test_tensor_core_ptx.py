"""Each tensor-core instruction of tinyflash.gpu.ptx against NumPy, one warp at a time.

The kernels below place operands by the tables of ptx.py's docstrings, written out here by hand
(lane = 4g + t). Without a GPU they run the simulator's emulations, whose layouts are the
functions of ptx_emulation.py; on a GPU the very same tests run the real instructions, so the
tables are checked against the hardware there.
"""

import numpy as np
import pytest
from numba import cuda, float32, uint32

from tinyflash.gpu import ptx
from tinyflash.gpu.ptx_emulation import (a_fragment, b_fragment, c_fragment, draw, from_bits, ldmatrix_fragment,
                                         pack_halves, to_bits, unpack_halves)

ELEMENTS = ["float16", "bfloat16"]


def words(x, element):
    """(rows, cols) floats -> (rows, cols // 2) uint32 words of 16-bit pairs, low half first."""
    bits = to_bits(x, element).astype(np.uint32)  # (rows, cols)
    return np.ascontiguousarray(bits[:, 0::2] | (bits[:, 1::2] << 16))  # (rows, cols // 2)


def test_bits_round_to_nearest_even():
    assert to_bits(1.0, "bfloat16") == 0x3F80 and to_bits(-2.0, "bfloat16") == 0xC000
    assert to_bits(np.float32(1 + 2**-8), "bfloat16") == 0x3F80  # a tie: to the even neighbour
    assert to_bits(np.float32(1 + 3 * 2**-8), "bfloat16") == 0x3F82  # a tie the other way
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)  # (1000,)
    assert np.array_equal(from_bits(to_bits(x, "float16"), "float16"), x.astype(np.float16).astype(np.float32))
    assert np.abs(from_bits(to_bits(x, "bfloat16"), "bfloat16") - x).max() <= np.abs(x).max() * 2**-8
    assert unpack_halves(pack_halves(1.5, -3.0, "bfloat16"), "bfloat16") == (1.5, -3.0)


def test_layouts_cover_each_matrix_once():
    for layout, shape in ((a_fragment, (16, 16)), (b_fragment, (16, 8)), (c_fragment, (16, 8)),
                          (lambda lane: ldmatrix_fragment(lane, False), (8, 8)),
                          (lambda lane: ldmatrix_fragment(lane, True), (8, 8))):
        cells = sorted(cell for lane in range(32) for cell in layout(lane))
        assert cells == [(r, c) for r in range(shape[0]) for c in range(shape[1])]
    assert draw(c_fragment, 16, 8).splitlines()[0].split()[:3] == ["L0.0", "L0.1", "L1.0"]


def mma_kernel(element):
    mma = ptx.mma_m16n8k16(element)

    @cuda.jit
    def kernel(A, Bt, C, D):
        """A (16, 8) and Bᵀ (8, 8) words, C and D (16, 8) float32: D = A·B + C by one warp."""
        lane = cuda.threadIdx.x
        g, t = lane // 4, lane % 4
        d0, d1, d2, d3 = mma(A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4], Bt[g, t], Bt[g, t + 4],
                             C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1])
        D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1] = d0, d1, d2, d3

    return kernel


@pytest.mark.parametrize("element", ELEMENTS)
def test_mma_m16n8k16(rng, element):
    A, B = rng.standard_normal((16, 16)), rng.standard_normal((16, 8))  # (16, 16), (16, 8)
    C = rng.standard_normal((16, 8)).astype(np.float32)  # (16, 8)
    D = np.zeros((16, 8), np.float32)
    mma_kernel(element)[1, 32](words(A, element), words(B.T, element), C, D)
    A16, B16 = (from_bits(to_bits(x, element), element).astype(np.float64) for x in (A, B))  # what the cores see
    expected = A16 @ B16 + C  # (16, 8)
    assert np.abs(D - expected).max() <= 1e-5 * np.abs(expected).max(), np.abs(D - expected).max()


@pytest.mark.parametrize("element", ELEMENTS)
def test_pack(rng, element):
    pack = ptx.pack(element)

    @cuda.jit
    def kernel(x, out):
        i = cuda.threadIdx.x
        out[i] = pack(x[2 * i], x[2 * i + 1])

    x = rng.standard_normal(64).astype(np.float32) * 100  # (64,)
    out = np.zeros(32, np.uint32)
    kernel[1, 32](x, out)
    assert np.array_equal(out, words(x[None, :], element)[0])


@pytest.mark.parametrize("element", ELEMENTS)
def test_unpack_inverts_pack(rng, element):
    """unpack(word) gives back the two values a word holds, exactly: pack's rounding, and nothing else."""
    unpack = ptx.unpack(element)

    @cuda.jit
    def kernel(w, out):
        i = cuda.threadIdx.x
        out[2 * i], out[2 * i + 1] = unpack(w[i])

    x = rng.standard_normal(64).astype(np.float32) * 100  # (64,)
    out = np.zeros(64, np.float32)
    kernel[1, 32](words(x[None, :], element)[0], out)
    assert np.array_equal(out, from_bits(to_bits(x, element), element))


@cuda.jit
def ldmatrix_kernel(tile, plain, transposed):
    """tile (128,) words = 16 × 16 halves, row by row; cp.async it into shared memory (lane l: 16 bytes), then
    ldmatrix four 8 × 8 matrices: lane l gives row l % 16, columns 8·(l // 16) on."""
    smem = cuda.shared.array(0, uint32)
    lane = cuda.threadIdx.x
    base = ptx.shared_address(smem, np.uint64(0))
    ptx.cp_async_16(base + uint32(16 * lane), tile, np.uint64(4 * lane), uint32(16))
    ptx.cp_async_commit()
    ptx.cp_async_wait_all()
    cuda.syncthreads()  # every lane's copy has landed before the warp reads it
    address = base + uint32(((lane % 16) * 8 + (lane // 16) * 4) * 4)
    plain[lane, 0], plain[lane, 1], plain[lane, 2], plain[lane, 3] = ptx.ldmatrix_x4(address)
    r = ptx.ldmatrix_x4_trans(address)
    transposed[lane, 0], transposed[lane, 1], transposed[lane, 2], transposed[lane, 3] = r[0], r[1], r[2], r[3]


def test_ldmatrix_and_trans(rng):
    values = rng.integers(0, 2**16, size=(16, 16)).astype(np.uint16)  # (16, 16) any 16-bit patterns
    tile = np.ascontiguousarray(values[:, 0::2].astype(np.uint32) | (values[:, 1::2].astype(np.uint32) << 16))
    plain, transposed = np.zeros((32, 4), np.uint32), np.zeros((32, 4), np.uint32)
    ldmatrix_kernel[1, 32, 0, 16 * 16 * 2](tile.reshape(-1), plain, transposed)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i in range(4):  # matrix i: rows 8·(i % 2) .., columns 8·(i // 2) .. (the addresses given)
            m = values[8 * (i % 2):8 * (i % 2) + 8, 8 * (i // 2):8 * (i // 2) + 8]  # (8, 8)
            assert plain[lane, i] == int(m[g, 2 * t]) | int(m[g, 2 * t + 1]) << 16
            assert transposed[lane, i] == int(m[2 * t, g]) | int(m[2 * t + 1, g]) << 16


@pytest.mark.parametrize("prefetch", [None, 0, 64, 128, 256])
def test_cp_async_zero_fills_past_nbytes(prefetch):
    """cp.async, and with each prefetch size to L2 (None: the plain ptx.cp_async_16): the same bytes land."""
    copy = ptx.cp_async_16 if prefetch is None else ptx.make_cp_async_16(prefetch)

    @cuda.jit
    def kernel(src, out):
        smem = cuda.shared.array(0, uint32)
        base = ptx.shared_address(smem, np.uint64(0))
        lane = cuda.threadIdx.x
        copy(base + uint32(16 * lane), src, np.uint64(4 * lane), uint32(16 if lane % 2 == 0 else 0))
        ptx.cp_async_commit()
        ptx.cp_async_wait_all()
        cuda.syncthreads()  # the copies have landed before they are read
        for i in range(4):
            out[4 * lane + i] = smem[4 * lane + i]

    src = np.arange(1, 129, dtype=np.uint32)  # (128,) never zero
    out = np.full(128, 7, np.uint32)
    kernel[1, 32, 0, 512](src, out)
    even = (np.arange(128) // 4) % 2 == 0  # lanes 0, 2, 4, ...: 16 bytes read; odd lanes: zeros
    assert np.array_equal(out[even], src[even]) and not out[~even].any()


@pytest.mark.parametrize("prefetch", [32, 512, -128, "128"])
def test_cp_async_prefetch_sizes_are_those_of_ptx(prefetch):
    with pytest.raises(ValueError, match=r"prefetch must be 0, 64, 128 or 256 bytes; got"):
        ptx.make_cp_async_16(prefetch)


def test_waiting_for_prior_grids_in_a_kernel_launched_the_ordinary_way_returns():
    """griddepcontrol.wait in a kernel with no programmatic dependency: it returns at once, and the kernel's work
    is done (the decode GPU tests launch the combine kernel that waits this way after the split kernel)."""
    @cuda.jit
    def kernel(x, out):
        ptx.wait_for_prior_grids()
        i = cuda.grid(1)
        if i < x.size:
            out[i] = 2 * x[i]

    x = np.random.default_rng().random(100).astype(np.float32) + 1  # (100,) never zero
    out = np.zeros(100, np.float32)
    kernel[1, 128](x, out)
    assert np.array_equal(out, 2 * x)


def test_shfl_xor():
    @cuda.jit
    def kernel(out):
        lane = cuda.threadIdx.x
        x = float32(lane)
        out[lane, 0] = ptx.shfl_xor(x, 1)
        out[lane, 1] = ptx.shfl_xor(x, 2)

    out = np.zeros((32, 2), np.float32)
    kernel[1, 32](out)
    assert np.array_equal(out[:, 0], np.arange(32) ^ 1) and np.array_equal(out[:, 1], np.arange(32) ^ 2)
