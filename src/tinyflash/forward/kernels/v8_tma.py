"""Kernel v8: Hopper's tensor memory accelerator (TMA) loads the tiles. float16 and bfloat16 in, float32
accumulation; the second step of stage 4 (``tinyflash.hopper_attention``).

What changed since v7 (wgmma, tiles copied by ``cp.async``):

* **One thread loads a whole tile.** ``tma.tma_load_3d`` asks the copy engine for a box of 64 columns × Bc rows
  of one head of K (then V; d = 128 is two boxes each) and it lands in shared memory already 128-byte swizzled,
  rows past Nk as zeros. v7's 128 threads each computed the swizzled place of their 16-byte chunks and issued
  Bc · d / 8 / NT ``cp.async`` each; here no thread computes an address and the other threads never wait for
  their own copies to be issued. What the copy engine needs to know (addresses, shape, strides, box, swizzle)
  is in the tensor maps the host encodes (``gpu/tensor_map.py``): the kernel takes them instead of Q, K, V.
* **Copies complete on mbarriers.** A stage's copies announce their bytes on its "full" barrier
  (``arrive_expect_tx``) and the copy engine counts them down; the warpgroups wait for the barrier's phase
  (``tma.wait``) instead of ``cp.async.wait`` and a barrier of the block. Stage s holds tiles s, s + S, ...:
  tile j waits for parity (j // S) % 2.
* **A ring of STAGES stages** (``TmaTiling``): tile j + STAGES − 1 is requested while tile j is multiplied.
  The block's barrier at the end of each tile still says "every warpgroup is done with this stage"
  (next step: an "empty" barrier per stage, and a warpgroup that only loads).
* Q_i comes by TMA too (one box of Br rows per 64 columns), on its own barrier.

Unchanged from v7: the products (``tinyflash.warpgroup_tile``), the mask, the online softmax and the epilogue
(``tinyflash.warp_tile``). Limits: d = dv ∈ {64, 128, 256}; compute capability 9.0 exactly (``sm_90a``).
"""

from __future__ import annotations

from functools import lru_cache

from numba import cuda, float32, int32, uint32, uint64
from numba.cuda import types

from ...core.masks import key_stop
from ...gpu import ptx, tma, wgmma
from ...gpu.runtime import device_function, u
from ...gpu.smem import shared_words
from ...gpu.tensor_map import BOX_COLUMNS
from ...warp_tile import FAST_MATH, MMA_M, NEG_INF, WARP, warp_tile
from ...warpgroup_tile import ROW_BYTES, warpgroup_tile
from .tma_tiling import K_MAP, Q_MAP, V_MAP, TmaTiling

ZERO, ONE, TWO = u(0), u(1), u(2)
ALIGN = u(wgmma.SWIZZLE_ATOM_BYTES)  # tiles start at multiples of the swizzle's period
key_stop = device_function(key_stop)  # the causal rule of tinyflash.core.masks, compiled for the GPU
WORDS, FLOATS, MAPS = (types.Array(types.uint32, 1, "C"), types.Array(types.float32, 1, "C"),
                       types.Array(types.uint64, 1, "C"))
# flash_fwd's argument types: O as 16-bit pairs, LSE, the tensor maps of Q, K, V; then n_q, n_k, scale·log2(e),
# causal, kv_group, head_group (1 here)
SIGNATURE = (WORDS, FLOATS, MAPS, types.int64, types.int64, types.float32, types.boolean, types.int64, types.int64)


@lru_cache(maxsize=None)
def make_kernel(cfg: TmaTiling, element: str):
    """``flash_fwd`` for one tiling and one element type (float16 or bfloat16)."""
    cfg.validate()
    tile, group = warp_tile(cfg.warp_tile(element)), warpgroup_tile(cfg.warpgroup_tile(element))
    mask_row, softmax_step, epilogue = tile.mask_row, tile.softmax_step, tile.epilogue
    descriptors, scores, p_times_v = group.descriptors, group.scores, group.p_times_v
    BR, BC, STAGES, N_STAGES = u(cfg.BR), u(cfg.BC), u(cfg.STAGES), cfg.STAGES
    DW = u(cfg.D // 2)  # words per row of O in HBM
    layout = {name: u(offset) for name, offset in cfg.smem_layout().items()}  # bytes
    Q_OFF, STAGE0, V_IN_STAGE, Q_FULL, FULL0 = (layout[n] for n in ("Q_i", "stage 0", "V_j in a stage", "Q_i full",
                                                                      "full 0"))
    STAGE, BAR = layout["stage 1"] - layout["stage 0"], u(tma.BARRIER_BYTES)
    S_TILES, O_TILES, P_STEPS, PIECES = cfg.BC // 8, cfg.D // 8, cfg.BC // 16, cfg.D // BOX_COLUMNS
    Q_PIECE, KV_PIECE = u(cfg.BR * ROW_BYTES), u(cfg.BC * ROW_BYTES)  # from a tile's 64-column piece to the next
    Q_BYTES, KV_BYTES = u(cfg.BR * cfg.D * 2), u(2 * cfg.BC * cfg.D * 2)  # what Q_i's, a stage's copies complete

    @cuda.jit(device=True, inline="always")
    def load_q(maps, base, q_start, head):
        """Q_i by TMA, completing on its barrier: one box of Br rows per 64 columns."""
        bar = base + uint32(Q_FULL)
        tma.arrive_expect_tx(bar, uint32(Q_BYTES))
        for h in range(PIECES):
            tma.tma_load_3d(base + uint32(Q_OFF + uint64(h) * Q_PIECE), maps, uint64(Q_MAP), int32(h * BOX_COLUMNS),
                            int32(q_start), int32(head), bar)

    @cuda.jit(device=True, inline="always")
    def load_kv(maps, base, j, kv_head):
        """K_j and V_j by TMA into stage j % STAGES, completing on its "full" barrier."""
        stage = j % STAGES
        bar, tile = base + uint32(FULL0 + stage * BAR), base + uint32(STAGE0 + stage * STAGE)
        tma.arrive_expect_tx(bar, uint32(KV_BYTES))
        for h in range(PIECES):
            col, piece = int32(h * BOX_COLUMNS), uint32(uint64(h) * KV_PIECE)
            tma.tma_load_3d(tile + piece, maps, uint64(K_MAP), col, int32(j * BC), int32(kv_head), bar)
            tma.tma_load_3d(tile + uint32(V_IN_STAGE) + piece, maps, uint64(V_MAP), col, int32(j * BC), int32(kv_head),
                            bar)

    @cuda.jit(device=True, inline="always")
    def start(maps, base, q_start, head, kv_head, n_tiles):
        """One thread: the barriers (one arrival each: its own), made visible to the copy engine; the maps
        acquired; Q_i and the first STAGES - 1 tiles requested."""
        tma.mbarrier_init(base + uint32(Q_FULL), uint32(1))
        for s in range(N_STAGES):
            tma.mbarrier_init(base + uint32(FULL0 + uint64(s) * BAR), uint32(1))
        wgmma.fence_proxy_async()  # the barriers' initialisation, before the copy engine completes them
        for m in range(3):
            tma.acquire_map(maps, uint64(m))
        load_q(maps, base, q_start, head)
        for j in range(min(STAGES - ONE, n_tiles)):
            load_kv(maps, base, uint64(j), kv_head)

    @cuda.jit(device=True, inline="always")
    def mask(s, row, k_start, t, n_q, n_k, causal):
        """S_ij = -inf for keys at or past Nk and, if causal, after the diagonal (v7's)."""
        for half in range(2):
            stop = key_stop(row + uint64(half * 8) + ONE, n_q, n_k, causal)  # keys < stop allowed
            mask_row(s, 0, half, stop, k_start, t)

    @cuda.jit(fastmath=FAST_MATH)
    def flash_fwd(O, LSE, TMAPS, n_q, n_k, scale_log2, causal, kv_group, head_group):
        smem = shared_words()  # cfg.smem_layout() from a 1024-byte-aligned base: Q_i, the stages, the barriers
        tid = uint64(cuda.threadIdx.x)
        warp, lane = tid // uint64(WARP), tid % uint64(WARP)
        g, t = lane // uint64(4), lane % uint64(4)  # the lane's group (its rows g, g + 8) and place in it
        head, q_start = uint64(cuda.blockIdx.y), (uint64(cuda.gridDim.x) - ONE - uint64(cuda.blockIdx.x)) * BR
        kv_head = head // uint64(kv_group)  # the K, V head it reads (grouped-query attention)
        n_q, n_k = uint64(n_q), uint64(n_k)
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

        if tid == ZERO:
            start(TMAPS, base, q_start, head, kv_head, n_tiles)
        cuda.syncthreads()  # the barriers are initialised before any thread waits on them
        tma.wait(base + uint32(Q_FULL), uint32(0))  # Q_i has landed (its barrier's one phase)
        for j in range(n_tiles):
            k_start, stage = j * BC, j % STAGES
            if tid == ZERO and j + STAGES - ONE < n_tiles:  # into the stage every warpgroup left at the last barrier
                load_kv(TMAPS, base, j + STAGES - ONE, kv_head)
            tile = base + uint32(STAGE0 + stage * STAGE)
            tma.wait(base + uint32(FULL0 + stage * BAR), uint32((j // STAGES) % TWO))  # K_j, V_j have landed
            q_desc, k_desc, v_desc = descriptors(base + uint32(Q_OFF), warp // uint64(4), tile,
                                                 tile + uint32(V_IN_STAGE))
            scores(s, q_desc, k_desc)  # S_ij = Q_i K_jᵀ, waited for
            if k_start + BC > warp_stop:  # the tile reaches past the warp's first row's keys: some are masked
                mask(s, warp_row + g, k_start, t, n_q, n_k, causal)
            softmax_step(s, m_i, l_i, acc, m_tile, scale_log2)  # m_i, l_i, acc rescaled; P_ij replaces S_ij
            p_times_v(acc, s, p, v_desc)  # acc += P_ij V_j, waited for
            cuda.syncthreads()  # every warpgroup's multiplies have read this stage: it may be refilled

        epilogue(acc, m_i, l_i, O, LSE, head * n_q * DW, head * n_q, warp_row + g, t, n_q)

    return flash_fwd


def build(cfg: TmaTiling, element: str, head_group: int = 1):
    """What v8 builds: its kernel for the tiling ``cfg`` and ``element`` inputs (one head at a time: the wgmma
    tilings' ``head_group`` is 1)."""
    return make_kernel(cfg, element)
