"""Split-KV decoding on the tensor cores: the split kernel of ``decode/kernels.py`` with v6's products.

Why: the CUDA-core split kernel issues about 108 instructions per key (products and shuffles for
4 packed rows, conversions, the softmax repeated in 16 lanes). On an H200 that is nearly as long
as reading the key from HBM, so the two must overlap perfectly to reach the memory's speed. On
the tensor cores one warp multiplies 16 rows by 8 keys over 16 dims per ``mma.sync``, and the main
loop issues about 18 warp instructions per key at d = 128 (``benchmarks/decode_ptxas.py``): at
B = 1, where few blocks must each read fast, that brings K and V in closer to a copy's rate on
an H200 (the ``CUDA cores`` rows of ``figures/data/decode_h200.csv``); at B = 8 both kernels are
bound by memory alone.

The price: an mma has 16 rows, and a decode block has few. With grouped-query attention the
kv_group query heads that share a K/V head (× Nq rows each) are packed into the rows, as in the
CUDA-core kernel: 4 of 16 at H = 32, H_kv = 8, Nq = 1; the other 12 rows are zeros, multiplied for
nothing. That wastes tensor-core time, of which decoding has plenty (FlashAttention's decode path
does the same).

The layout, in the notation of v6 (``forward/kernels/v6_tensor_cores.py``, whose fragments this is):

    one thread block = one warp, per (split, K/V head of one sequence, chunk of 16 packed rows)
    Q (16 packed rows × d) -> A operands in registers, loaded once straight from HBM (zeros past the real rows)
    the split's keys in tiles of BC keys; a ring of STAGES tiles of (K_j, V_j) in shared memory,
    filled by cp.async, STAGES - 1 tiles in flight while one is computed:
        S_ij = Q K_jᵀ            mma.sync, B operands by ldmatrix         (16 × BC, in registers)
        mask                      keys past the split or the sequence, or after the diagonal: -inf
        m, alpha, P_ij, l         the online softmax; a row lives in 4 lanes (two shuffles)
        acc += P_ij V_j           P_ij packed from S's accumulators (the A layout), V_j by ldmatrix.trans
    the partial (O_s, lse_s) of the split's rows, in float32, for the combine kernel of kernels.py

One warp per block: the block's barrier is a warp's, the warp copies exactly the tiles it reads,
and each warp is its own split (no merge inside the block). Blocks per SM are set by the ring's
shared memory (:meth:`DecodeTiling.blocks_per_sm`), and the number of splits is chosen for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numba import cuda, float32, types, uint32, uint64

from ..core.masks import key_stop
from ..core.online_softmax import LN2
from ..forward.kernels.v6_tensor_cores import FAST_MATH, PAD_WORDS
from ..gpu import ptx
from ..gpu.runtime import device_function, u
from ..gpu.smem import shared_words
from .kernels import NO_PAGE, key_row_offset, split_keys
from ..hardware import current

HEAD_DIMS = (64, 128)  # d = dv
ROWS = 16  # packed query rows per block: the rows of one mma
WARP = 32
NEG_INF = float32(-np.inf)
ZERO, ONE, TWO, FOUR, EIGHT, SIXTEEN = u(0), u(1), u(2), u(4), u(8), u(16)
key_stop = device_function(key_stop)  # the causal rule of tinyflash.core.masks, compiled for the GPU


@dataclass(frozen=True)
class DecodeTiling:
    """Keys per tile (BC, a multiple of 16) and tiles in the ring (STAGES, at least 2), head dim D."""

    D: int
    BC: int = 32
    STAGES: int = 4

    @property
    def ROW_WORDS(self) -> int:  # one row of Q, K_j or V_j in shared memory: d / 2 words + 16 bytes of padding
        return self.D // 2 + PAD_WORDS

    @property
    def smem_bytes(self) -> int:  # the ring: STAGES × (K_j, V_j)
        return 4 * self.ROW_WORDS * self.STAGES * 2 * self.BC

    def blocks_per_sm(self) -> int:
        """Blocks resident per SM: as many rings as its shared memory holds (registers allow more)."""
        return max(1, current().blocks_per_sm(self.smem_bytes))

    def problems(self) -> list[str]:
        problems = []
        if self.D not in HEAD_DIMS:
            problems.append(f"D must be one of {HEAD_DIMS}")
        if self.BC < 16 or self.BC % 16:
            problems.append("BC (keys per tile) must be a positive multiple of 16")
        if self.STAGES < 2:
            problems.append("STAGES must be at least 2")
        if self.smem_bytes > current().smem_per_block:
            problems.append(f"needs {self.smem_bytes} bytes of shared memory; a block may have {current().smem_per_block}")
        return problems

    def validate(self) -> "DecodeTiling":
        if self.problems():
            raise ValueError(f"invalid decode tiling {self}: {'; '.join(self.problems())}")
        return self


def default_tiling(d: int) -> DecodeTiling:
    """Tiles of 32 keys in a ring of 4: 3 tiles (48 KB at d = 128) in flight per block, 3 blocks per
    SM at d = 128 (5 at d = 64)."""
    return DecodeTiling(D=d, BC=32, STAGES=4).validate()


@lru_cache(maxsize=None)
def make_split_kernel(cfg: DecodeTiling, page_size: int, element: str = "float16"):
    """The tensor-core split kernel for one tiling, a contiguous cache (``page_size`` 0) or pages of
    ``page_size`` tokens, and 16-bit ``element`` inputs. Returns ``(kernel, shared memory bytes)``."""
    cfg.validate()
    mma, pack = ptx.mma_m16n8k16(element), ptx.pack(element)
    D, BC, STAGES = cfg.D, cfg.BC, cfg.STAGES
    RW, DW = u(cfg.ROW_WORDS), u(D // 2)  # words per row: in shared memory (padded), in HBM
    CHUNKS = u(D // 8)  # 16-byte pieces per row: one cp.async each
    RPP = WARP // (D // 8)  # rows the warp copies with one cp.async per lane (rows per pass)
    KV_PASSES = BC * (D // 8) // WARP  # cp.async per lane for one K_j (and one V_j)
    ROW8 = 8 * cfg.ROW_WORDS * 4  # 8 rows of shared memory, in bytes
    TILE_BYTES = BC * cfg.ROW_WORDS * 4
    STAGE_BYTES = 2 * TILE_BYTES  # K_j, then V_j
    K_STEPS, S_TILES, P_STEPS, O_TILES = D // 16, BC // 8, BC // 16, D // 8
    STAGES_, AHEAD, D_, BC_ = u(STAGES), u(STAGES - 1), u(D), u(BC)
    u_STAGE_BYTES = u(STAGE_BYTES)
    row_offset = key_row_offset(page_size)
    PAGE = u(max(page_size, 1))
    # Pages that hold whole runs of a tile's rows (the tile in one page, or whole pages in the tile), and
    # each lane's rows (RPP apart) at the same place in every page: a few table reads per tile
    PAGE_ALIGNED = page_size > 0 and (BC % page_size == 0 or page_size % BC == 0) and page_size % RPP == 0
    TILE_PAGES = max(1, BC // page_size) if PAGE_ALIGNED else 1
    tile_landed = ptx.cp_async_wait_group(STAGES - 2)  # all but the STAGES - 2 newest groups: tile j

    @cuda.jit(device=True, inline="always")
    def copy_tile(K, V, TABLE, b, bkv, kv_head, k0, seq_len, stage, lane, n_k, h_kv, max_pages, seen, page_base):
        """Request K_j and V_j (keys k0 .. k0 + BC - 1, k0 a multiple of BC) into the ring stage at byte
        address ``stage``: lane copies column piece lane % CHUNKS of rows lane // CHUNKS, + RPP, ...;
        keys at or past the sequence's end become zeros (they are masked). One commit group per tile."""
        row, col = lane // CHUNKS, (lane % CHUNKS) * FOUR  # first row; word column
        rows_left = uint32(min(seq_len - k0, BC_))  # rows of the tile inside the sequence
        first = row_offset(TABLE, b, bkv, kv_head, min(k0 + row, seq_len - ONE), n_k, h_kv, max_pages, D_, seen) \
            if page_size == 0 else ZERO
        if PAGE_ALIGNED:  # the tile's pages, read from the block table once per tile (all lanes: one address)
            for p in range(TILE_PAGES):
                key = min(k0 + uint64(p * page_size), seq_len - ONE)  # clamped: a page of this sequence
                pool = uint64(TABLE[b * max_pages + key // PAGE])
                page_base[p] = ((pool * h_kv + kv_head) * PAGE + k0 % PAGE + row) * DW  # row `row` of its part
        for i in range(KV_PASSES):
            r = uint32(row) + uint32(i * RPP)
            inside = r < rows_left
            if page_size == 0:  # contiguous: the tile's rows follow its first row (small constant offsets)
                src = first // TWO + uint64(uint32(i * RPP * (D // 2)) if inside else uint32(0))
            elif PAGE_ALIGNED:  # row r is in the tile's page p, at a constant offset from that page's row `row`
                p = i * RPP // max(page_size, 1) if TILE_PAGES > 1 else 0
                src = page_base[p] + uint64((i * RPP - p * page_size) * (D // 2))
            else:  # any page size: each row's page through the block table (read again only when it changes)
                key = min(k0 + uint64(r), seq_len - ONE)
                src = row_offset(TABLE, b, bkv, kv_head, key, n_k, h_kv, max_pages, D_, seen) // TWO
            nbytes = uint32(16) if inside else uint32(0)
            dst = stage + (r * uint32(RW) + uint32(col)) * uint32(4)
            ptx.cp_async_16(dst, K, src + col, nbytes)
            ptx.cp_async_16(dst + uint32(TILE_BYTES), V, src + col, nbytes)
        ptx.cp_async_commit()

    @cuda.jit(device=True, inline="always")
    def scores(s, qf, k_addr):
        """S_ij = Q K_jᵀ, s[n] the lane's part of keys 8n .. 8n+7: per S tile, every mma step over d,
        two steps per ldmatrix of K_j (8 keys × 32 dims)."""
        for n in range(S_TILES):
            for e in range(4):
                s[n, e] = float32(0.0)
            for kk in range(0, K_STEPS, 2):
                b = ptx.ldmatrix_x4(k_addr + uint32(n * ROW8 + kk * 32))
                for h in range(2):
                    s[n, 0], s[n, 1], s[n, 2], s[n, 3] = mma(qf[kk + h, 0], qf[kk + h, 1], qf[kk + h, 2],
                                                             qf[kk + h, 3], b[2 * h], b[2 * h + 1],
                                                             s[n, 0], s[n, 1], s[n, 2], s[n, 3])

    @cuda.jit(device=True, inline="always")
    def softmax_update(s, m_i, l_i, acc, half, masked, stop, k0, t, scale_log2):
        """Row g + 8·half of the lane: if ``masked``, keys at or past ``stop`` masked; then the online softmax:
        m_new, alpha (rescales l and acc), P_ij = exp2(scale·S_ij - m_new) in place of S_ij."""
        m = NEG_INF
        for n in range(S_TILES):
            for e in range(2):
                if masked and k0 + uint64(8 * n + e) + TWO * t >= stop:
                    s[n, 2 * half + e] = NEG_INF
                m = max(m, s[n, 2 * half + e])
        m = max(m, ptx.shfl_xor(m, 1))
        m_new = max(m_i[half], max(m, ptx.shfl_xor(m, 2)) * scale_log2)  # scale > 0: the max of scaled scores
        m_safe = m_new if m_new != NEG_INF else float32(0.0)  # no allowed key yet: avoid -inf - -inf
        alpha = math.exp2(m_i[half] - m_safe)
        m_i[half] = m_new
        l_i[half] *= alpha
        for n in range(O_TILES):
            acc[n, 2 * half] *= alpha
            acc[n, 2 * half + 1] *= alpha
        for n in range(S_TILES):
            for e in range(2):
                s[n, 2 * half + e] = math.exp2(s[n, 2 * half + e] * scale_log2 - m_safe)
                l_i[half] += s[n, 2 * half + e]

    @cuda.jit(device=True, inline="always")
    def p_times_v(acc, s, v_addr):
        """acc += P_ij V_j, 16 keys per mma step: P_ij's A operand packed from two S tiles, V_j's B
        operands by ldmatrix.trans (16 keys × 16 dims: two O tiles)."""
        for kk in range(P_STEPS):
            a0, a1 = pack(s[2 * kk, 0], s[2 * kk, 1]), pack(s[2 * kk, 2], s[2 * kk, 3])
            a2, a3 = pack(s[2 * kk + 1, 0], s[2 * kk + 1, 1]), pack(s[2 * kk + 1, 2], s[2 * kk + 1, 3])
            for n in range(0, O_TILES, 2):
                b = ptx.ldmatrix_x4_trans(v_addr + uint32(kk * 2 * ROW8 + n * 16))
                for h in range(2):
                    acc[n + h, 0], acc[n + h, 1], acc[n + h, 2], acc[n + h, 3] = mma(
                        a0, a1, a2, a3, b[2 * h], b[2 * h + 1],
                        acc[n + h, 0], acc[n + h, 1], acc[n + h, 2], acc[n + h, 3])

    @cuda.jit(fastmath=FAST_MATH)
    def split_kv_decode_tc(Q, K, V, TABLE, LENS, O_PART, LSE_PART, n_q, n_k, h_kv, max_pages, scale_log2, causal,
                           kv_group):
        smem = shared_words()  # the ring: STAGES × (K_j, V_j); 16-bit pairs, rows padded by 16 bytes
        ring = ptx.shared_address(smem, ZERO)
        lane = uint64(cuda.threadIdx.x)
        g, t = lane // FOUR, lane % FOUR  # the lane's rows g, g + 8 of every fragment; its place in the group
        split, n_splits, bkv = uint64(cuda.blockIdx.x), uint64(cuda.gridDim.x), uint64(cuda.blockIdx.y)
        n_q, n_k, h_kv, max_pages = uint64(n_q), uint64(n_k), uint64(h_kv), uint64(max_pages)
        b, kv_head = bkv // h_kv, bkv % h_kv
        rows = uint64(kv_group) * n_q  # packed rows of this K/V head: its query heads × their Nq queries
        row0 = uint64(cuda.blockIdx.z) * SIXTEEN  # the block's first packed row
        seq_len = uint64(LENS[b])
        k_begin, k_end, n_tiles = split_keys(seq_len, split, n_splits, BC_)
        seen = cuda.local.array(2, uint64)  # paged: the last page looked up in the block table, its pool page
        seen[0] = NO_PAGE
        page_base = cuda.local.array(TILE_PAGES, uint64)  # paged, aligned: where each page of a tile starts (words)

        for j in range(AHEAD):  # the ring's first STAGES - 1 tiles (an empty group past the split)
            if j < n_tiles:
                copy_tile(K, V, TABLE, b, bkv, kv_head, k_begin + j * BC_, seq_len, ring + uint32(j * STAGE_BYTES),
                          lane, n_k, h_kv, max_pages, seen, page_base)
            else:
                ptx.cp_async_commit()
        # Q's A operands, straight from HBM into registers while the ring fills: lane (g, t) holds the word
        # of columns 2t, 2t+1 (and 2t+8, 2t+9) of packed rows g and g + 8 per mma step; zeros past the real rows
        qf = cuda.local.array((K_STEPS, 4), uint32)
        q_row = (bkv * rows + row0 + g) * DW + t  # row g's word of columns 2t, 2t+1 (rows of one K/V head follow)
        for kk in range(K_STEPS):
            for h in range(2):  # columns 16kk + 8h ..
                qf[kk, 2 * h] = Q[q_row + uint64(kk * 8 + h * 4)] if row0 + g < rows else uint32(0)
                qf[kk, 2 * h + 1] = Q[q_row + EIGHT * DW + uint64(kk * 8 + h * 4)] if row0 + g + EIGHT < rows \
                    else uint32(0)
        block_lane = uint32(((lane % SIXTEEN) * RW + (lane // SIXTEEN) * FOUR) * FOUR)  # rows 0-15, then +8 cols
        k_lane = uint32(((lane % EIGHT) * RW + (lane // EIGHT) * FOUR) * FOUR)  # keys 0-7, dims 8·(lane // 8)

        stop = cuda.local.array(2, uint64)  # rows g, g + 8 may attend keys < stop[half] (and < k_end)
        m_i = cuda.local.array(2, float32)  # running max (base 2) of rows g, g + 8
        l_i = cuda.local.array(2, float32)  # the lane's share of their running denominators
        acc = cuda.local.array((O_TILES, 4), float32)  # its part of the unnormalised O_s
        s = cuda.local.array((S_TILES, 4), float32)  # its part of S_ij, then of P_ij
        unmasked = k_end  # keys below it are allowed for both of the lane's rows
        for half in range(2):
            p = row0 + g + uint64(8 * half)  # packed row: query head (p // Nq) of the group, query p % Nq
            stop[half] = min(k_end, key_stop(p % n_q + ONE, n_q, seq_len, causal) if p < rows else seq_len)
            unmasked = min(unmasked, stop[half])
            m_i[half], l_i[half] = NEG_INF, float32(0.0)
        for n in range(O_TILES):
            for e in range(4):
                acc[n, e] = float32(0.0)

        for j in range(n_tiles):
            tile_landed()  # this lane's copies of tile j have landed
            cuda.syncthreads()  # ... and every lane's; every lane is done with tile j - 1, whose stage is refilled now
            ahead = j + AHEAD
            if ahead < n_tiles:
                copy_tile(K, V, TABLE, b, bkv, kv_head, k_begin + ahead * BC_, seq_len,
                          ring + uint32((ahead % STAGES_) * u_STAGE_BYTES), lane, n_k, h_kv, max_pages, seen,
                          page_base)
            else:
                ptx.cp_async_commit()  # an empty group: the waits count STAGES - 2 newer groups
            stage = ring + uint32((j % STAGES_) * u_STAGE_BYTES)
            k0 = k_begin + j * BC_
            scores(s, qf, stage + k_lane)
            masked = k0 + BC_ > unmasked  # some key of the tile is masked for one of this lane's rows
            for half in range(2):
                softmax_update(s, m_i, l_i, acc, half, masked, stop[half], k0, t, scale_log2)
            p_times_v(acc, s, stage + uint32(TILE_BYTES) + block_lane)

        # the partial (O_s, lse_s): each row's denominator is 4 lanes' shares, added first
        part_row0 = (bkv * n_splits + split) * rows + row0
        for half in range(2):
            l_row = l_i[half] + ptx.shfl_xor(l_i[half], 1)
            l_row += ptx.shfl_xor(l_row, 2)
            r = g + uint64(8 * half)
            if row0 + r < rows:
                inv_l = float32(1.0) / l_row if l_row != 0 else float32(0.0)  # an empty split: O_s = 0
                for n in range(O_TILES):
                    for e in range(2):
                        O_PART[(part_row0 + r) * D_ + uint64(8 * n + e) + TWO * t] = acc[n, 2 * half + e] * inv_l
                if t == ZERO:  # lse_s = m + log(l), back from base 2; -inf for an empty split
                    LSE_PART[part_row0 + r] = (m_i[half] + math.log2(l_row)) * LN2 if l_row != 0 else NEG_INF
        ptx.cp_async_wait_all()  # no copy may still be in flight when the block ends

    return split_kv_decode_tc, cfg.smem_bytes


def _flat(t):
    return types.Array(t, 1, "C")


# split_kv_decode_tc's argument types: Q, K, V as 16-bit pairs; TABLE, LENS; O_PART, LSE_PART; n_q, n_k,
# h_kv, max_pages; scale·log2(e); causal; kv_group
SIGNATURE = ((_flat(types.uint32),) * 3 + (_flat(types.int32),) * 2 + (_flat(types.float32),) * 2
             + (types.int64,) * 4 + (types.float32, types.boolean, types.int64))
