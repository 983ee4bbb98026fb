"""Kernel v9: warp specialisation. float16 and bfloat16 in, float32 accumulation; the third step of stage 4
(``tinyflash.hopper_attention``).

What changed since v8 (TMA into a ring of stages, every warpgroup loading and computing in turn):

* **A producer and consumers.** The block has one more warpgroup, the first: the *producer*. One of its threads
  requests Q_i and then every tile K_j, V_j by TMA, as soon as a stage is free, and does nothing else; the
  other warpgroups, the *consumers*, only multiply and take the softmax (FlashAttention-3's structure: 3
  warpgroups, 2 of them consumers, Br = 128). The loads run ahead of the products by up to STAGES tiles
  without any consumer spending an instruction on them.
* **Full and empty barriers per stage.** A consumer waits on a stage's "full" barrier (the copies have landed)
  and, when its multiplies have read the stage, arrives on its "empty" barrier (all 128 · WARPGROUPS consumer
  threads); the producer waits on "empty" before it refills the stage. No barrier of the whole block after the
  start: v8's ``syncthreads`` at every tile is gone, and a consumer warpgroup may run a tile ahead of the other.
  The producer waits for tile j's stage with parity ((j // S) + 1) % 2: the phase in which the consumers
  released tile j − S; on a fresh barrier that parity counts as completed, so the first S tiles go at once.
* **Registers move to the consumers** (``setmaxnreg``): the producer keeps PRODUCER_REGISTERS per thread (24),
  the consumers take CONSUMER_REGISTERS (240) for S_ij, P_ij and O_i's accumulators. ptxas keeps the
  instruction only with launch bounds: the kernel is compiled for NT threads and one block per multiprocessor.

Unchanged from v8: the tensor maps and the copies, the products (``tinyflash.warpgroup_tile``), the mask, the
online softmax and the epilogue (``tinyflash.warp_tile``). Limits: d = dv ∈ {64, 128, 256}; compute capability 9.0
exactly (``sm_90a``).
"""

from __future__ import annotations

from functools import lru_cache

from numba import cuda, float32, int32, uint32, uint64
from numba.cuda import types

from ...core.masks import key_stop
from ...gpu import ptx, tma, wgmma
from ...gpu.runtime import device_function, simulator_enabled, u
from ...gpu.smem import shared_words
from ...gpu.tensor_map import BOX_COLUMNS
from ...warp_tile import FAST_MATH, MMA_M, NEG_INF, WARP, warp_tile
from ...warpgroup_tile import ROW_BYTES, warpgroup_tile
from .tma_tiling import K_MAP, Q_MAP, V_MAP, TmaTiling, offsets

ZERO, ONE, TWO = u(0), u(1), u(2)
ALIGN = u(wgmma.SWIZZLE_ATOM_BYTES)  # tiles start at multiples of the swizzle's period
key_stop = device_function(key_stop)  # the causal rule of tinyflash.core.masks, compiled for the GPU
WORDS, FLOATS, MAPS = (types.Array(types.uint32, 1, "C"), types.Array(types.float32, 1, "C"),
                       types.Array(types.uint64, 1, "C"))
# flash_fwd's argument types: O as 16-bit pairs, LSE, the tensor maps of Q, K, V; then n_q, n_k, scale·log2(e),
# causal, kv_group, head_group (1 here)
SIGNATURE = (WORDS, FLOATS, MAPS, types.int64, types.int64, types.float32, types.boolean, types.int64, types.int64)


def producer(cfg: TmaTiling):
    """The producer warpgroup's pieces: ``init_barriers`` (the stages' barriers, by one thread before the block's
    barrier) and ``produce``, the one thread that requests Q_i and each K_j, V_j by TMA (``load_q``, ``load_kv``)."""
    BC, STAGES, N_STAGES = u(cfg.BC), u(cfg.STAGES), cfg.STAGES
    Q_OFF, STAGE0, V_IN_STAGE, Q_FULL, FULL0, EMPTY0, STAGE, BAR = offsets(cfg)
    CONSUMERS = u(cfg.NT - wgmma.WARPGROUP)  # threads of the consumer warpgroups: each arrives on "empty"
    PIECES = cfg.D // BOX_COLUMNS
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
    def init_barriers(base):
        """One thread: Q_i's and each stage's "full" barrier expect one arrival (the producer's, with the bytes),
        each "empty" barrier the consumers' threads; made visible to the copy engine."""
        tma.mbarrier_init(base + uint32(Q_FULL), uint32(1))
        for s in range(N_STAGES):
            tma.mbarrier_init(base + uint32(FULL0 + uint64(s) * BAR), uint32(1))
            tma.mbarrier_init(base + uint32(EMPTY0 + uint64(s) * BAR), uint32(CONSUMERS))
        wgmma.fence_proxy_async()  # the barriers' initialisation, before the copy engine completes them

    @cuda.jit(device=True, inline="always")
    def produce(maps, base, q_start, head, kv_head, n_tiles):
        """The producer's one thread: Q_i, then each K_j, V_j as soon as the consumers have left its stage."""
        for m in range(3):
            tma.prefetch_map(maps, uint64(m))
            tma.acquire_map(maps, uint64(m))
        load_q(maps, base, q_start, head)
        for j in range(n_tiles):
            stage = j % STAGES
            # the phase in which the consumers released tile j - STAGES (before the first round: completed)
            tma.wait(base + uint32(EMPTY0 + stage * BAR), uint32((j // STAGES + ONE) % TWO))
            load_kv(maps, base, j, kv_head)

    return init_barriers, produce


def consumer(cfg: TmaTiling, element: str):
    """The consumer warpgroups' pieces: ``consume``, a consumer thread's loop over the key tiles (the products by
    ``warpgroup_tile``, the mask, the online softmax and the epilogue by ``warp_tile``)."""
    tile, group = warp_tile(cfg.warp_tile(element)), warpgroup_tile(cfg.warpgroup_tile(element))
    mask_row, softmax_step, epilogue = tile.mask_row, tile.softmax_step, tile.epilogue
    descriptors, scores, p_times_v = group.descriptors, group.scores, group.p_times_v
    BC, STAGES = u(cfg.BC), u(cfg.STAGES)
    DW = u(cfg.D // 2)  # words per row of O in HBM
    Q_OFF, STAGE0, V_IN_STAGE, Q_FULL, FULL0, EMPTY0, STAGE, BAR = offsets(cfg)
    S_TILES, O_TILES, P_STEPS = cfg.BC // 8, cfg.D // 8, cfg.BC // 16

    @cuda.jit(device=True, inline="always")
    def mask(s, row, k_start, t, n_q, n_k, causal):
        """S_ij = -inf for keys at or past Nk and, if causal, after the diagonal (v7's)."""
        for half in range(2):
            stop = key_stop(row + uint64(half * 8) + ONE, n_q, n_k, causal)  # keys < stop allowed
            mask_row(s, 0, half, stop, k_start, t)

    @cuda.jit(device=True, inline="always")
    def consume(O, LSE, base, tid, q_start, head, n_q, n_k, scale_log2, causal, n_tiles):
        """A consumer thread (``tid`` counted from the first consumer): its warp's 16 rows of O_i, tile by tile as
        the stages fill, each stage released once its multiplies are waited for."""
        warp, lane = tid // uint64(WARP), tid % uint64(WARP)
        g, t = lane // uint64(4), lane % uint64(4)  # the lane's group (its rows g, g + 8) and place in it
        warp_row = q_start + warp * uint64(MMA_M)  # the warp's first query row: consumer w's rows are 64w ..
        warp_stop = key_stop(warp_row + ONE, n_q, n_k, causal)  # keys that the warp's first row may see (fewest)
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

        tma.wait(base + uint32(Q_FULL), uint32(0))  # Q_i has landed (its barrier's one phase)
        for j in range(n_tiles):
            k_start, stage = j * BC, j % STAGES
            tile = base + uint32(STAGE0 + stage * STAGE)
            tma.wait(base + uint32(FULL0 + stage * BAR), uint32((j // STAGES) % TWO))  # K_j, V_j have landed
            q_desc, k_desc, v_desc = descriptors(base + uint32(Q_OFF), warp // uint64(4), tile,
                                                 tile + uint32(V_IN_STAGE))
            scores(s, q_desc, k_desc)  # S_ij = Q_i K_jᵀ, waited for
            if k_start + BC > warp_stop:  # the tile reaches past the warp's first row's keys: some are masked
                mask(s, warp_row + g, k_start, t, n_q, n_k, causal)
            softmax_step(s, m_i, l_i, acc, m_tile, scale_log2)  # m_i, l_i, acc rescaled; P_ij replaces S_ij
            p_times_v(acc, s, p, v_desc)  # acc += P_ij V_j, waited for
            tma.arrive(base + uint32(EMPTY0 + stage * BAR))  # this thread is done with the stage

        epilogue(acc, m_i, l_i, O, LSE, head * n_q * DW, head * n_q, warp_row + g, t, n_q)

    return consume


@lru_cache(maxsize=None)
def make_kernel(cfg: TmaTiling, element: str):
    """``flash_fwd`` for one tiling and one element type (float16 or bfloat16): the warpgroups' roles, from the
    pieces :func:`producer` and :func:`consumer`."""
    cfg.validate()
    init_barriers, produce = producer(cfg)
    consume = consumer(cfg, element)
    BR, BC = u(cfg.BR), u(cfg.BC)
    WG = u(wgmma.WARPGROUP)
    producer_registers = tma.setmaxnreg(False, cfg.PRODUCER_REGISTERS)
    consumer_registers = tma.setmaxnreg(True, cfg.CONSUMER_REGISTERS)
    options = {} if simulator_enabled() else cfg.compile_options()  # launch bounds; the simulator takes none

    @cuda.jit(fastmath=FAST_MATH, **options)
    def flash_fwd(O, LSE, TMAPS, n_q, n_k, scale_log2, causal, kv_group, head_group):
        smem = shared_words()  # cfg.smem_layout() from a 1024-byte-aligned base: Q_i, the stages, the barriers
        tid = uint64(cuda.threadIdx.x)
        head, q_start = uint64(cuda.blockIdx.y), (uint64(cuda.gridDim.x) - ONE - uint64(cuda.blockIdx.x)) * BR
        kv_head = head // uint64(kv_group)  # the K, V head it reads (grouped-query attention)
        n_q, n_k = uint64(n_q), uint64(n_k)
        raw = ptx.shared_address(smem, ZERO)
        base = (raw + uint32(ALIGN - ONE)) & ~uint32(ALIGN - ONE)  # the swizzle is of absolute address bits
        k_stop = key_stop(min(q_start + BR, n_q), n_q, n_k, causal)  # causal: later key tiles are skipped
        n_tiles = (k_stop + BC - ONE) // BC

        if tid == ZERO:
            init_barriers(base)
        cuda.syncthreads()  # the barriers are initialised before any thread waits on them; the last block barrier
        if tid < WG:  # the producer warpgroup: few registers, one thread issues every copy
            producer_registers()
            if tid == ZERO:
                produce(TMAPS, base, q_start, head, kv_head, n_tiles)
        else:  # the consumers: the registers the producer gave up
            consumer_registers()
            consume(O, LSE, base, tid - WG, q_start, head, n_q, n_k, scale_log2, causal, n_tiles)

    return flash_fwd


def build(cfg: TmaTiling, element: str, head_group: int = 1):
    """What v9 builds: its kernel for the tiling ``cfg`` and ``element`` inputs (one head at a time: the wgmma
    tilings' ``head_group`` is 1)."""
    return make_kernel(cfg, element)
