"""The split kernel of decoding on the tensor cores: float16 and bfloat16, a warp's tile of v6.

Why: a split kernel on the CUDA cores (``cuda_cores.py``) issues many instructions per key
(products and shuffles for the packed rows, conversions, the softmax repeated in each lane of a key
row); on an H200 that is nearly as long as reading the key from HBM, so the two must overlap
perfectly to reach the memory's speed. On the tensor cores one warp multiplies 16 rows by 8 keys
over 16 dims per ``mma.sync``, and far fewer instructions are issued per key.

The price: an mma has 16 rows, and a decode block has few. With grouped-query attention the
kv_group query heads that share a K/V head (× Nq rows each) are packed into the rows, as in the
CUDA-core kernel: 4 of 16 at H = 32, H_kv = 8, Nq = 1; the other 12 rows are zeros, multiplied for
nothing. That wastes tensor-core time, of which decoding has plenty (FlashAttention's decode path
does the same).

The layout: one row tile of ``tinyflash.warp_tile`` (v6's fragments, scores, softmax step, P·V and
epilogue), on the packed rows:

    one thread block = one warp, per (split, K/V head of one sequence, chunk of 16 packed rows)
    Q (16 packed rows × d) -> A operands in registers, loaded once straight from HBM (zeros past the real rows)
    the split's keys in tiles of BC keys; a ring of STAGES tiles of (K_j, V_j) in shared memory,
    filled by cp.async (L2 fetching 128 bytes around each copy), STAGES - 1 tiles in flight while one is computed:
        S_ij = Q K_jᵀ            mma.sync, B operands by ldmatrix         (16 × BC, in registers)
        mask                      keys past the split or the sequence, or after the diagonal: -inf
        m, alpha, P_ij, l         the online softmax; a row lives in 4 lanes (two shuffles)
        acc += P_ij V_j           P_ij packed from S's accumulators (the A layout), V_j by ldmatrix.trans
    the partial (O_s, lse_s) of the split's rows, in float32, for the combine kernel (combine.py)

One warp per block: the block's barrier is a warp's, the warp copies exactly the tiles it reads,
and each warp is its own split (no merge inside the block). With ``merge=True`` the block whose split of a row
set finishes last (an arrival counter per row set) merges that row set's partials into O and lse itself
(``combine.make_merge``), and the call launches no combine kernel. Blocks per SM are set by the ring's
shared memory (:meth:`DecodeTiling.blocks_per_sm`), and the number of splits is chosen for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numba import cuda, float32, types, uint32, uint64

from ...core.masks import key_stop
from ...gpu import ptx
from ...gpu.driver_launch import flat_type
from ...gpu.launch import Tiling
from ...gpu.runtime import device_function, u
from ...gpu.smem import shared_floats, shared_words
from ...hardware import current
from ...gpu.loads import row_passes
from ...warp_tile import (FAST_MATH, HEAD_DIMS, MMA_M, NEG_INF, PAD_WORDS, WARP, WarpTile, padded_head_dim, tile_problems,
                          warp_tile)
from .combine import make_merge
from .split import NO_PAGE, SplitKernel, key_row_offset, split_keys

ROWS = MMA_M  # packed query rows per block: the rows of one mma
ZERO, ONE, TWO, FOUR, EIGHT = u(0), u(1), u(2), u(4), u(8)
key_stop = device_function(key_stop)  # the causal rule of tinyflash.core.masks, compiled for the GPU


@dataclass(frozen=True)
class DecodeTiling(Tiling):
    """Keys per tile (BC, a multiple of 16) and tiles in the ring (STAGES, at least 2), head dim D; PREFETCH: the
    bytes (0, 64, 128 or 256) that L2 fetches from HBM around each 16-byte copy of the ring
    (:func:`tinyflash.gpu.ptx.make_cp_async_16`).

    Why 128 by default: a tile's row is read by 16-byte copies from several lanes, and with ``.L2::128B`` the
    first copy of a 128-byte run brings the whole run into L2, so HBM serves fewer, longer requests
    (docs/notes/2026-12-03-decode-overlap-prefetch.md measured what it gains)."""

    WHAT = "decode tiling"

    D: int
    BC: int = 32
    STAGES: int = 4
    PREFETCH: int = 128  # bytes L2 fetches from HBM around each copy's 16 (the .L2::128B qualifier)

    @property
    def DP(self) -> int:  # the head dim of a row in shared memory: D padded with zero columns (tinyflash.warp_tile)
        return padded_head_dim(self.D)

    @property
    def ROW_WORDS(self) -> int:  # one row of K_j or V_j in shared memory: DP / 2 words + 16 bytes of padding
        return self.DP // 2 + PAD_WORDS

    @property
    def smem_bytes(self) -> int:  # the ring: STAGES × (K_j, V_j)
        return 4 * self.ROW_WORDS * self.STAGES * 2 * self.BC

    def blocks_per_sm(self) -> int:
        """Blocks resident per SM: as many rings as its shared memory holds (registers allow more)."""
        return max(1, current().blocks_per_sm(self.smem_bytes))

    def shape_problems(self) -> list[str]:
        problems = tile_problems(self.D, 1, "row")  # one row tile of 16 packed rows
        if self.BC < 16 or self.BC % 16:
            problems.append("BC (keys per tile) must be a positive multiple of 16")
        if self.STAGES < 2:
            problems.append("STAGES must be at least 2")
        if self.PREFETCH not in (0, 64, 128, 256):
            problems.append("PREFETCH must be 0, 64, 128 or 256 bytes")
        return problems


def split_kernel(prob, page_size: int, tiling: DecodeTiling | None = None, merge: bool = False) -> SplitKernel:
    """The split kernel for one call (``prob``: the checked problem; ``page_size`` 0 for a contiguous cache), one
    warp per block of 16 packed rows; ``tiling`` (a :class:`DecodeTiling`) other than the default. ``merge``: the
    last block of each row set to finish merges the splits' partials itself (``combine.make_merge``), and the call
    launches no combine kernel: at most ``combine.MAX_MERGED_SPLITS`` splits."""
    cfg = (tiling or default_tiling(prob.d)).validate()
    if cfg.D != prob.d:
        raise ValueError(f"tiling {cfg} is for d = {cfg.D}; got d = {prob.d}")
    if type(merge) is not bool:
        raise TypeError(f"merge must be a bool; got {type(merge).__name__} {merge!r}")
    element = "bfloat16" if str(prob.dtype) == "bfloat16" else "float16"
    return SplitKernel(lambda rb: make_split_kernel(cfg, page_size, element, rb if merge else 0), WARP, ROWS,
                       cfg.blocks_per_sm(), merged_signature(element) if merge else SIGNATURE, ("Q", "K", "V"),
                       merged=merge)


def default_tiling(d: int) -> DecodeTiling:
    """Tiles of 32 keys in a ring of 4: 3 tiles (48 KB at d = 128) in flight per block, 3 blocks per
    SM at d = 128 (5 at d = 64). Past d = 128 (DP > 128) tiles of 16 keys, so that the ring stays near d = 128's
    size (3 blocks per SM at d = 256) and the scores' registers make room for the longer Q and acc (ptxas: 255
    registers and no spills at d = 256, where 32-key tiles spill when paged)."""
    return DecodeTiling(D=d, BC=32 if padded_head_dim(d) <= 128 else 16, STAGES=4).validate()


def page_runs(cfg: DecodeTiling, page_size: int) -> tuple[bool, int]:
    """``(PAGE_ALIGNED, TILE_PAGES)`` of a paged cache: whether its pages hold whole runs of a tile's rows (the
    tile in one page, or whole pages in the tile) and each lane's rows (RPP apart) at the same place in every
    page, so that a few table reads per tile serve the copies; and then the pages of one tile (else 1)."""
    RPP = row_passes(cfg.DP // 8, WARP, cfg.BC)[0]  # rows per pass (one cp.async per lane)
    aligned = page_size > 0 and (cfg.BC % page_size == 0 or page_size % cfg.BC == 0) and page_size % RPP == 0
    return aligned, max(1, cfg.BC // page_size) if aligned else 1


def ring_copies(cfg: DecodeTiling, page_size: int):
    """``copy_tile``: the warp's cp.async of one tile's K_j and V_j into a stage of the ring, from a contiguous
    cache or through the block table of a paged one."""
    D, BC = cfg.D, cfg.BC
    RW, DW = u(cfg.ROW_WORDS), u(D // 2)  # words per row: in shared memory (padded), in HBM
    CHUNKS = u(cfg.DP // 8)  # 16-byte pieces per row in shared memory: one cp.async each
    RPP, KV_PASSES = row_passes(cfg.DP // 8, WARP, BC)  # rows per pass (one cp.async per lane); passes per K_j
    ACTIVE = RPP * (cfg.DP // 8)  # lanes that copy (the rest, if any, wait)
    EVEN, PADDED = ACTIVE == WARP, cfg.DP > D  # every lane copies; zero columns after each row (d padded to DP)
    TILE_BYTES = BC * cfg.ROW_WORDS * 4
    D_, BC_ = u(D), u(BC)
    row_offset = key_row_offset(page_size)
    PAGE = u(max(page_size, 1))
    PAGE_ALIGNED, TILE_PAGES = page_runs(cfg, page_size)
    cp_async_16 = ptx.make_cp_async_16(cfg.PREFETCH)  # with the tiling's hint to L2

    @cuda.jit(device=True, inline="always")
    def copy_tile(K, V, TABLE, b, bkv, kv_head, k0, seq_len, stage, lane, n_k, h_kv, max_pages, seen, page_base):
        """Request K_j and V_j (keys k0 .. k0 + BC - 1, k0 a multiple of BC) into the ring stage at byte
        address ``stage``: lane copies column piece lane % CHUNKS of rows lane // CHUNKS, + RPP, ... (lanes past
        RPP · CHUNKS copy nothing); keys at or past the sequence's end become zeros (they are masked), and so do
        the padding columns past d. One commit group per tile."""
        row, col = lane // CHUNKS, (lane % CHUNKS) * FOUR  # first row; word column
        src_col = min(col, DW - FOUR) if PADDED else col  # a column inside the row (a padding column reads none)
        rows_left = uint32(min(seq_len - k0, BC_))  # rows of the tile inside the sequence
        first = row_offset(TABLE, b, bkv, kv_head, min(k0 + row, seq_len - ONE), n_k, h_kv, max_pages, D_, seen) \
            if page_size == 0 else ZERO
        if PAGE_ALIGNED:  # the tile's pages, read from the block table once per tile (all lanes: one address)
            for p in range(TILE_PAGES):
                key = min(k0 + uint64(p * page_size), seq_len - ONE)  # clamped: a page of this sequence
                pool = uint64(TABLE[b * max_pages + key // PAGE])
                page_base[p] = ((pool * h_kv + kv_head) * PAGE + k0 % PAGE + row) * DW  # row `row` of its part
        for i in range(KV_PASSES if EVEN or lane < ACTIVE else 0):
            r = uint32(row) + uint32(i * RPP)
            if not (EVEN or r < BC_):  # the last pass may reach past the tile
                break
            inside = r < rows_left and (not PADDED or col < DW)  # else 16 bytes of zeros
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
            cp_async_16(dst, K, src + src_col, nbytes)
            cp_async_16(dst + uint32(TILE_BYTES), V, src + src_col, nbytes)
        ptx.cp_async_commit()

    return copy_tile


def split_partial(cfg: DecodeTiling, page_size: int, element: str):
    """``split``: one split of one row set, its partial (O_s, lse_s): Q's operands, the ring filled by
    :func:`ring_copies`, and per tile the warp tile's scores, mask, softmax step and P·V, then its epilogue."""
    spec = WarpTile(element, cfg.D, cfg.BC, out_packed=False)  # one row tile of 16 packed rows; O_s in float32
    tile = warp_tile(spec)  # the warp's fragments, scores, softmax step, P·V and epilogue (v6's)
    lane_rows, scores, mask_row = tile.lane_rows, tile.scores, tile.mask_row  # (numba types no namespace)
    softmax_step, p_times_v, epilogue = tile.softmax_step, tile.p_times_v, tile.epilogue
    D, BC, STAGES = cfg.D, cfg.BC, cfg.STAGES
    DW, PADDED = u(D // 2), cfg.DP > D  # words per row in HBM; zero columns after each row (d padded to DP)
    TILE_BYTES = BC * cfg.ROW_WORDS * 4
    STAGE_BYTES = 2 * TILE_BYTES  # K_j, then V_j
    K_STEPS, S_TILES, O_TILES = spec.K_STEPS, spec.S_TILES, spec.O_TILES
    STAGES_, AHEAD, D_, BC_, ROWS_ = u(STAGES), u(STAGES - 1), u(D), u(BC), u(ROWS)
    u_STAGE_BYTES = u(STAGE_BYTES)
    TILE_PAGES = page_runs(cfg, page_size)[1]
    tile_landed = ptx.cp_async_wait_group(STAGES - 2)  # all but the STAGES - 2 newest groups: tile j
    copy_tile = ring_copies(cfg, page_size)

    @cuda.jit(device=True, inline="always")
    def split(Q, K, V, TABLE, LENS, O_PART, LSE_PART, n_q, n_k, h_kv, max_pages, scale_log2, causal, kv_group):
        """One split of one row set: its partial (O_s, lse_s) into O_PART, LSE_PART."""
        smem = shared_words()  # the ring: STAGES × (K_j, V_j); 16-bit pairs, rows padded by 16 bytes
        ring = ptx.shared_address(smem, ZERO)
        lane = uint64(cuda.threadIdx.x)
        g, t = lane // FOUR, lane % FOUR  # the lane's rows g, g + 8 of every fragment; its place in the group
        split, n_splits, bkv = uint64(cuda.blockIdx.x), uint64(cuda.gridDim.x), uint64(cuda.blockIdx.y)
        n_q, n_k, h_kv, max_pages = uint64(n_q), uint64(n_k), uint64(h_kv), uint64(max_pages)
        b, kv_head = bkv // h_kv, bkv % h_kv
        rows = uint64(kv_group) * n_q  # packed rows of this K/V head: its query heads × their Nq queries
        row0 = uint64(cuda.blockIdx.z) * ROWS_  # the block's first packed row
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
        qf = cuda.local.array((1, K_STEPS, 4), uint32)  # one row tile: the warp tile's (ROW_TILES, K_STEPS, 4)
        q_row = (bkv * rows + row0 + g) * DW + t  # row g's word of columns 2t, 2t+1 (rows of one K/V head follow)
        for kk in range(K_STEPS):
            for h in range(2):  # columns 16kk + 8h .. (zeros past d: the padding to DP)
                real = not PADDED or kk * 16 + h * 8 < D
                qf[0, kk, 2 * h] = Q[q_row + uint64(kk * 8 + h * 4)] if real and row0 + g < rows else uint32(0)
                qf[0, kk, 2 * h + 1] = Q[q_row + EIGHT * DW + uint64(kk * 8 + h * 4)] \
                    if real and row0 + g + EIGHT < rows else uint32(0)
        k_lane, block_lane = lane_rows(lane)  # keys 0-7 at dims 8·(lane // 8); rows 0-15, then +8 cols

        stop = cuda.local.array(2, uint64)  # rows g, g + 8 may attend keys < stop[half] (and < k_end)
        m_i = cuda.local.array((1, 2), float32)  # running max (base 2) of rows g, g + 8
        l_i = cuda.local.array((1, 2), float32)  # the lane's share of their running denominators
        m_tile = cuda.local.array((1, 2), float32)  # the rows' maxima over one key tile (base 2)
        acc = cuda.local.array((1, O_TILES, 4), float32)  # its part of the unnormalised O_s
        s = cuda.local.array((1, S_TILES, 4), float32)  # its part of S_ij, then of P_ij
        unmasked = k_end  # keys below it are allowed for both of the lane's rows
        for half in range(2):
            p = row0 + g + uint64(8 * half)  # packed row: query head (p // Nq) of the group, query p % Nq
            stop[half] = min(k_end, key_stop(p % n_q + ONE, n_q, seq_len, causal) if p < rows else seq_len)
            unmasked = min(unmasked, stop[half])
            m_i[0, half], l_i[0, half] = NEG_INF, float32(0.0)
        for n in range(O_TILES):
            for e in range(4):
                acc[0, n, e] = float32(0.0)

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
            scores(s, qf, ZERO, stage + k_lane)
            if k0 + BC_ > unmasked:  # some key of the tile is masked for one of this lane's rows
                for half in range(2):
                    mask_row(s, 0, half, stop[half], k0, t)
            softmax_step(s, m_i, l_i, acc, m_tile, scale_log2)  # m_i, l_i, acc rescaled; P_ij replaces S_ij
            p_times_v(acc, s, stage + uint32(TILE_BYTES) + block_lane)  # acc += P_ij V_j

        # the partial (O_s, lse_s) of the split's rows, float32: O_s = 0 and lse_s = -inf for an empty split
        epilogue(acc, m_i, l_i, O_PART, LSE_PART, (bkv * n_splits + split) * rows * D_,
                      (bkv * n_splits + split) * rows, row0 + g, t, rows)
        ptx.cp_async_wait_all()  # no copy may still be in flight when the block ends (or the ring is reused)

    return split


@lru_cache(maxsize=None)
def make_split_kernel(cfg: DecodeTiling, page_size: int, element: str = "float16", merge_rows: int = 0):
    """The tensor-core split kernel for one tiling, a contiguous cache (``page_size`` 0) or pages of
    ``page_size`` tokens, and 16-bit ``element`` inputs; with ``merge_rows`` (the packed rows of a block) the
    kernel that also merges its row set (``combine.make_merge``). Returns ``(kernel, shared memory bytes)``. The
    kernels call one split (:func:`split_partial`)."""
    cfg.validate()
    merge = make_merge(element, merge_rows, cfg.D) if merge_rows else None
    split = split_partial(cfg, page_size, element)
    ROWS_ = u(ROWS)

    @cuda.jit(fastmath=FAST_MATH)
    def split_kv_decode_tc(Q, K, V, TABLE, LENS, O_PART, LSE_PART, n_q, n_k, h_kv, max_pages, scale_log2, causal,
                           kv_group):
        split(Q, K, V, TABLE, LENS, O_PART, LSE_PART, n_q, n_k, h_kv, max_pages, scale_log2, causal, kv_group)

    @cuda.jit(fastmath=FAST_MATH)
    def split_kv_decode_tc_merged(Q, K, V, TABLE, LENS, O_PART, LSE_PART, O, LSE, ARRIVED, n_q, n_k, h_kv, max_pages,
                                  scale_log2, causal, kv_group):
        """The split kernel, and the merge of its row set by the block whose split is the last to finish
        (``ARRIVED``: one counter per row set, zero between calls; each block adds one, wrapping to zero at
        n_splits, so the block that reads n_splits - 1 knows every partial of its row set is written)."""
        split(Q, K, V, TABLE, LENS, O_PART, LSE_PART, n_q, n_k, h_kv, max_pages, scale_log2, causal, kv_group)
        smemf = shared_floats()  # the ring, free now: the flag, then the merge's weights
        lane, n_splits = uint64(cuda.threadIdx.x), uint64(cuda.gridDim.x)
        row_set = uint64(cuda.blockIdx.y) * uint64(cuda.gridDim.z) + uint64(cuda.blockIdx.z)
        cuda.threadfence()  # this lane's partial is visible to every block before the arrival is counted
        cuda.syncthreads()  # every lane's
        if lane == ZERO:
            arrived = cuda.atomic.inc(ARRIVED, row_set, uint32(n_splits - ONE))
            smemf[0] = float32(1.0) if uint64(arrived) == n_splits - ONE else float32(0.0)
        cuda.syncthreads()
        if smemf[0] != float32(0.0):  # the last split of the row set: every partial is written
            cuda.threadfence()  # ... and read after the count that said so
            cuda.syncthreads()  # every lane has read the flag before the weights overwrite it
            rows = uint64(kv_group) * uint64(n_q)
            merge(O_PART, LSE_PART, O, LSE, smemf, uint64(cuda.blockIdx.y), uint64(cuda.blockIdx.z) * ROWS_, rows,
                  n_splits, lane)

    return (split_kv_decode_tc_merged if merge_rows else split_kv_decode_tc), cfg.smem_bytes


# split_kv_decode_tc's argument types: Q, K, V as 16-bit pairs; TABLE, LENS; O_PART, LSE_PART; n_q, n_k,
# h_kv, max_pages; scale·log2(e); causal; kv_group
SIGNATURE = ((flat_type(np.uint32),) * 3 + (flat_type(np.int32),) * 2 + (flat_type(np.float32),) * 2
             + (types.int64,) * 4 + (types.float32, types.boolean, types.int64))


def merged_signature(element: str) -> tuple:
    """split_kv_decode_tc_merged's argument types: SIGNATURE's arrays, then O (float16, or uint16 bits of bfloat16),
    LSE (float32) and ARRIVED (uint32), then SIGNATURE's scalars."""
    out = flat_type(np.uint16) if element == "bfloat16" else flat_type(np.float16)
    return SIGNATURE[:7] + (out, flat_type(np.float32), flat_type(np.uint32)) + SIGNATURE[7:]
