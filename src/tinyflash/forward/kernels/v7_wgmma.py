"""Kernel v7: Hopper's warpgroup multiplies (``wgmma``). float16 and bfloat16 in, float32 accumulation;
the first step of stage 4 (FlashAttention-3's techniques, ``tinyflash.hopper_attention``).

What changed since v6 (FlashAttention-2's design on ``mma.sync``):

* A **warpgroup** (4 warps, 128 threads) owns 64 query rows and multiplies as one: S_ij = Q_i K_jᵀ is
  d / 16 ``wgmma.mma_async`` m64n{Bc}k16 instructions, each 64 · Bc · 16 multiply-adds, where a v6 warp
  issued one ``ldmatrix`` and two ``mma.sync`` per 16 × 8 × 16 piece. A block has WARPGROUPS of them
  (Br = 64 · WARPGROUPS).
* The operands come **from shared memory through descriptors**: no ldmatrix, no fragment registers for
  Q_i or K_j. Q_i, K_j and V_j are stored **128-byte swizzled** (``tinyflash.gpu.wgmma``), the layout the
  descriptors describe, instead of v6's padded rows; the copies (still ``cp.async``, still double-buffered)
  put each 16-byte chunk at its swizzled place.
* P_ij V_j takes P_ij **from registers** (S_ij's accumulators packed, as v6 does) and V_j from shared memory,
  read transposed by the instruction itself (``trans_b``: V_j is stored key by key, the product wants it
  column by column; v6 used ``ldmatrix.trans``).
* The multiplies are **asynchronous**: each product is a batch (fence, multiplies, commit) and the warpgroup
  waits for it before the softmax reads S_ij, or before V_j's stage is refilled. Here every batch is waited
  for at once; overlapping them with the softmax is the next steps' work.
* After the copies land, ``fence.proxy.async`` makes them visible to the tensor cores, which read shared
  memory through the async proxy.
* The blocks take one head at a time, its query tiles from the last to the first (v6's order without its
  groups of heads).

Unchanged, and shared with v6 through ``tinyflash.warp_tile``: the lane's S_ij accumulators are a warp
tile's (wgmma's m64nN accumulator is mma.m16n8's repeated per warp), so the mask, the online softmax's step
(lazy rescaling included) and the epilogue are the same device functions. Limits: d = dv ∈ {64, 128, 256};
compute capability 9.0 exactly (``sm_90a``).
"""

from __future__ import annotations

from functools import lru_cache

from numba import cuda, float32, uint32, uint64
from numba.cuda import types

from ...core.masks import key_stop
from ...gpu import ptx, wgmma
from ...gpu.loads import cp_async_swizzled_rows
from ...gpu.runtime import device_function, simulator_enabled, u
from ...gpu.smem import shared_words
from ...warp_tile import FAST_MATH, MMA_M, NEG_INF, WARP, warp_tile
from ...warpgroup_tile import warpgroup_tile
from .hopper_tiling import HopperTiling

ZERO, ONE, TWO = u(0), u(1), u(2)
ALIGN = u(wgmma.SWIZZLE_ATOM_BYTES)  # tiles start at multiples of the swizzle's period
key_stop = device_function(key_stop)  # the causal rule of tinyflash.core.masks, compiled for the GPU
WORDS, FLOATS = types.Array(types.uint32, 1, "C"), types.Array(types.float32, 1, "C")
# flash_fwd's argument types, v6's: Q, K, V, O as 16-bit pairs, LSE, then n_q, n_k, scale·log2(e), causal, kv_group,
# head_group (1 here)
SIGNATURE = (WORDS,) * 4 + (FLOATS, types.int64, types.int64, types.float32, types.boolean, types.int64, types.int64)


@lru_cache(maxsize=None)
def make_kernel(cfg: HopperTiling, element: str):
    """``flash_fwd`` for one tiling and one element type (float16 or bfloat16)."""
    cfg.validate()
    tile, group = warp_tile(cfg.warp_tile(element)), warpgroup_tile(cfg.warpgroup_tile(element))
    mask_row, softmax_step, epilogue = tile.mask_row, tile.softmax_step, tile.epilogue
    descriptors, scores, p_times_v = group.descriptors, group.scores, group.p_times_v
    BR, BC = u(cfg.BR), u(cfg.BC)
    DW = u(cfg.D // 2)  # words per row in HBM
    layout = {name: u(offset) for name, offset in cfg.smem_layout().items()}  # bytes
    Q_OFF, STAGE0, V_IN_STAGE = layout["Q_i"], layout["stage 0"], layout["V_j in a stage"]
    STAGE = layout["stage 1"] - layout["stage 0"]
    S_TILES, O_TILES, P_STEPS = cfg.BC // 8, cfg.D // 8, cfg.BC // 16
    Q_CHUNKS, KV_CHUNKS = cfg.BR * cfg.CHUNKS // cfg.NT, cfg.BC * cfg.CHUNKS // cfg.NT  # cp.async per thread
    copy_q = cp_async_swizzled_rows(cfg.D // 2, cfg.NT, cfg.BR)  # rows of Q into a swizzled tile of Br rows
    copy_kv = cp_async_swizzled_rows(cfg.D // 2, cfg.NT, cfg.BC)  # rows of K or V into one of Bc rows

    # on a GPU, ptxas keeps the registers within what one block of NT threads may hold (3 warpgroups: 168)
    BOUNDS = {} if simulator_enabled() else {"launch_bounds": (cfg.NT, 1)}

    @cuda.jit(device=True, inline="always")
    def load_kv(K, V, kv_off, k_start, n_k, stage_addr, tid):
        """K_j and V_j into one stage of shared memory: cp.async, in flight until waited for."""
        copy_kv(K, kv_off, k_start, n_k, stage_addr, tid, KV_CHUNKS)
        copy_kv(V, kv_off, k_start, n_k, stage_addr + uint32(V_IN_STAGE), tid, KV_CHUNKS)
        ptx.cp_async_commit()

    @cuda.jit(device=True, inline="always")
    def landed():
        """Wait for this thread's copies, make them visible to the tensor cores (the async proxy), then for
        every thread's: after this barrier the stages hold what was copied, and no warpgroup still reads a
        stage that the next copies overwrite (each waited for its multiplies)."""
        ptx.cp_async_wait_all()
        wgmma.fence_proxy_async()
        cuda.syncthreads()

    @cuda.jit(device=True, inline="always")
    def mask(s, row, k_start, t, n_q, n_k, causal):
        """S_ij = -inf for keys at or past Nk (the ragged last tile) and, if causal, after the diagonal;
        the lane's rows are row and row + 8, its keys k_start + 8n + 2t (+1)."""
        for half in range(2):
            stop = key_stop(row + uint64(half * 8) + ONE, n_q, n_k, causal)  # keys < stop allowed
            mask_row(s, 0, half, stop, k_start, t)

    @cuda.jit(fastmath=FAST_MATH, **BOUNDS)
    def flash_fwd(Q, K, V, O, LSE, n_q, n_k, scale_log2, causal, kv_group, head_group):
        smem = shared_words()  # cfg.smem_layout() from a 1024-byte-aligned base: Q_i, two stages of (K_j, V_j)
        tid = uint64(cuda.threadIdx.x)
        warp, lane = tid // uint64(WARP), tid % uint64(WARP)
        g, t = lane // uint64(4), lane % uint64(4)  # the lane's group (its rows g, g + 8) and place in it
        # head_group is 1 (HopperTiling): blockIdx.y is the head, blockIdx.x its query tiles from the last
        head, q_start = uint64(cuda.blockIdx.y), (uint64(cuda.gridDim.x) - ONE - uint64(cuda.blockIdx.x)) * BR
        kv_head = head // uint64(kv_group)  # the K, V head it reads (grouped-query attention)
        n_q, n_k = uint64(n_q), uint64(n_k)
        q_off, kv_off = head * n_q * DW, kv_head * n_k * DW  # this head's Q, O and its K, V (words)
        warp_row = q_start + warp * uint64(MMA_M)  # the warp's first query row: warpgroup w's rows are 64w ..
        raw = ptx.shared_address(smem, ZERO)
        base = (raw + uint32(ALIGN - ONE)) & ~uint32(ALIGN - ONE)  # the swizzle is of absolute address bits
        k_stop = key_stop(min(q_start + BR, n_q), n_q, n_k, causal)  # causal: later key tiles are skipped
        warp_stop = key_stop(warp_row + ONE, n_q, n_k, causal)  # keys that the warp's first row may see (fewest)
        n_tiles = (k_stop + BC - ONE) // BC

        s = cuda.local.array((1, S_TILES, 4), float32)  # the lane's part of S_ij, then of P_ij
        p = cuda.local.array((P_STEPS, 4), uint32)  # P_ij packed: the A words of each 16-key step
        acc = cuda.local.array((1, O_TILES, 4), float32)  # its part of the unnormalised O_i
        m_i = cuda.local.array((1, 2), float32)  # running max (base 2) of rows g, g + 8
        l_i = cuda.local.array((1, 2), float32)  # the lane's share of their running denominators
        m_tile = cuda.local.array((1, 2), float32)  # the rows' maxima over one key tile (base 2)
        for half in range(2):
            m_i[0, half], l_i[0, half] = NEG_INF, float32(0.0)
        for n in range(O_TILES):
            for e in range(4):
                acc[0, n, e] = float32(0.0)

        copy_q(Q, q_off, q_start, n_q, base + uint32(Q_OFF), tid, Q_CHUNKS)  # Q_i, once
        load_kv(K, V, kv_off, ZERO, n_k, base + uint32(STAGE0), tid)  # K_0, V_0 into stage 0
        landed()  # Q_i, K_0, V_0 are in shared memory for every warpgroup
        for j in range(n_tiles):
            k_start = j * BC
            stage = base + uint32(STAGE0 + (j % TWO) * STAGE)  # where K_j, V_j are
            if j + ONE < n_tiles:  # K_j+1, V_j+1 into the other stage, in flight during this tile
                load_kv(K, V, kv_off, k_start + BC, n_k, base + uint32(STAGE0 + ((j + ONE) % TWO) * STAGE), tid)
            q_desc, k_desc, v_desc = descriptors(base + uint32(Q_OFF), warp // uint64(4), stage,
                                                 stage + uint32(V_IN_STAGE))
            scores(s, q_desc, k_desc)  # S_ij = Q_i K_jᵀ, waited for
            if k_start + BC > warp_stop:  # the tile reaches past the warp's first row's keys: some are masked
                mask(s, warp_row + g, k_start, t, n_q, n_k, causal)
            softmax_step(s, m_i, l_i, acc, m_tile, scale_log2)  # m_i, l_i, acc rescaled; P_ij replaces S_ij
            p_times_v(acc, s, p, v_desc)  # acc += P_ij V_j, waited for
            landed()  # K_j+1, V_j+1 are in; this stage may be refilled

        epilogue(acc, m_i, l_i, O, LSE, q_off, head * n_q, warp_row + g, t, n_q)

    return flash_fwd


def build(cfg: HopperTiling, element: str, head_group: int = 1):
    """What v7 builds: its kernel for the tiling ``cfg`` and ``element`` inputs (one head at a time: the wgmma
    tilings' ``head_group`` is 1)."""
    return make_kernel(cfg, element)
