"""Backward kernel v4: warp specialisation, FlashAttention-3's backward structure. float16 and bfloat16 in,
float32 accumulation. What changed since v3 (every thread copying Q_i, dO_i by cp.async, two block barriers per
query tile):

* **A producer and consumers** (as in forward kernel v9). One more warpgroup, the first, the *producer*: its
  first thread requests K_j, V_j once and then each query tile's Q_i, dO_i by TMA (``tinyflash.gpu.tma``) into
  a ring of STAGES stages as soon as one is free; its first warp's lanes store lse_i (base 2) and D_i beside
  them. The *consumers* only multiply (v3's products).
* **Full and empty barriers per stage.** A consumer waits on a stage's "full" mbarrier (Q_i's and dO_i's bytes
  landed, the lanes that stored lse_i and D_i arrived) and, once the multiplies that read the stage are waited
  for, arrives on its "empty" one, which the producer waits on (tile s: parity (s // STAGES + 1) % 2, completed
  on a fresh barrier) before it refills the stage.
* **One barrier per query tile, among the consumers.** dQ_i = dS K_j needs every warpgroup's dSᵀ: the consumers
  meet at a named barrier (the producer runs ahead) after storing theirs. dSᵀ has two buffers, by the tile's
  parity: a warpgroup writes buffer b again two tiles later, after the barrier of the tile in between, which
  the other warpgroup reaches only once its dQ product that read b is waited for (v3 needs a second barrier).
* **Registers move to the consumers** (``setmaxnreg``: 24 per thread for the producer, 240 for the consumers;
  launch bounds of NT threads and one block per multiprocessor, which it needs).
* **dV_j's product first, with 64-row query tiles** (the tiling's DV_FIRST, FlashAttention-3's order), multiplied
  while the warpgroup computes dSᵀ. **Query tiles of 128 rows at d = 64**: m64n128 Sᵀ and dPᵀ, dQ_i split by
  rows (each warpgroup its 64 queries), a tile's waits, barrier, lse_i and D_i spread over twice the multiplies.
* **dQ_i by TMA** (DQ_BY_TMA, off by default): the consumers store dQ_i in shared memory, the producer's second
  warp adds it to the accumulator by TMA reduce-adds. **Causal blocks longest first** (LONGEST_FIRST): a block
  takes its (K/V head, key tile) from ``tma_tiling.longest_first``, not the grid's order.

Unchanged from v3: the products, P recomputed from lse, dS = P ∘ (dP − D), the launch over (key tiles, K/V
heads), the row kernels around it, no deterministic mode. Limits: d = dv ∈ {64, 128}; compute capability 9.0.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda, float32, int32, uint32, uint64
from numba.cuda import types

from ...core.masks import key_stop
from ...core.online_softmax import LOG2E
from ...gpu import ptx, tma, wgmma
from ...gpu.runtime import device_function, simulator_enabled, u
from ...gpu.smem import shared_floats, shared_words
from ...gpu.tensor_map import BOX_COLUMNS
from ...warp_tile import FAST_MATH, MMA_K, MMA_M, WARP
from ...warpgroup_tile import ROW_BYTES
from .rows import FLOATS, WORDS
from .tma_tiling import (DO_MAP, DQ_BOX_COLUMNS, DQ_MAP, HEAD_BYTES_PER_COLUMN, K_MAP, LSE_LANES, Q_MAP, V_MAP,
                         BackwardTmaTiling, longest_first, refuse_deterministic)
from .wgmma_steps import STEP_BYTES, key_writes, operands, query_gradients, scores

ZERO, ONE, TWO, FOUR, EIGHT = u(0), u(1), u(2), u(4), u(8)
POS_INF = float32(np.inf)
ALIGN = u(wgmma.SWIZZLE_ATOM_BYTES)  # tiles start at multiples of the swizzle's period
DS_BARRIER, DQ_FULL, DQ_EMPTY = 1, 2, 3  # the named barriers (0 is __syncthreads's): dSᵀ stored; dQ_i stored, read
key_stop = device_function(key_stop)  # the causal rule of tinyflash.core.masks, compiled for the GPU
longest_first = device_function(longest_first)  # the causal order of the blocks (tma_tiling), compiled
# flash_bwd_ws's argument types: LSE, Dvec, dQ_acc (float32); dK, dV as 16-bit pairs; the tensor maps of Q, K, V,
# dO; then n_q, n_k, scale, scale·log2(e), causal, kv_group
SIGNATURE = ((FLOATS,) * 3 + (WORDS,) * 2 + (types.Array(types.uint64, 1, "C"),)
             + (types.int64, types.int64, types.float32, types.float32, types.boolean, types.int64))


def layout_bytes(cfg: BackwardTmaTiling) -> dict:
    """``cfg.smem_layout()``'s offsets as compile-time constants (bytes from the aligned base), by region."""
    return {name: u(offset) for name, offset in cfg.smem_layout().items()}


def loads(cfg: BackwardTmaTiling):
    """``(init_barriers, load_kv, load_query_tile, store_rows)``: the mbarriers, and what the producer's first
    warp puts in shared memory: K_j, V_j and each query tile's Q_i, dO_i by TMA, lse_i and D_i by its lanes."""
    layout = layout_bytes(cfg)
    K_OFF, V_OFF, N_STAGES = layout["K_j"], layout["V_j"], cfg.STAGES
    DO_IN, LSE_IN, D_IN = layout["dO_i in a stage"], layout["lse_i in a stage"], layout["D_i in a stage"]
    KV_FULL, FULL0, EMPTY0, BAR = layout["K_j, V_j full"], layout["full 0"], layout["empty 0"], u(tma.BARRIER_BYTES)
    CONSUMERS, LANES = u(cfg.CONSUMERS), u(LSE_LANES)
    HALVES, ROWS_PER_LANE = cfg.D // BOX_COLUMNS, cfg.BR // LSE_LANES
    Q_HALF, KV_HALF = u(cfg.BR * ROW_BYTES), u(cfg.BC * ROW_BYTES)  # from a tile's columns 0-63 to 64-127
    Q_BYTES, KV_BYTES = u(2 * cfg.BR * cfg.D * 2), u(2 * cfg.BC * cfg.D * 2)  # what a stage's, K_j V_j's copies complete
    LOG2E_ = float32(LOG2E)

    @cuda.jit(device=True, inline="always")
    def init_barriers(base):
        """One thread: K_j, V_j's and each "full" barrier expect the producer's arrival with the bytes (and "full"
        the LANES that store lse_i, D_i), each "empty" one the consumers'; made visible to the copy engine."""
        tma.mbarrier_init(base + uint32(KV_FULL), uint32(1))
        for s in range(N_STAGES):
            tma.mbarrier_init(base + uint32(FULL0 + uint64(s) * BAR), uint32(LANES + ONE))
            tma.mbarrier_init(base + uint32(EMPTY0 + uint64(s) * BAR), uint32(CONSUMERS))
        wgmma.fence_proxy_async()  # the barriers' initialisation, before the copy engine completes them

    @cuda.jit(device=True, inline="always")
    def load_kv(maps, base, k_start, kv_head):
        """K_j and V_j by TMA, completing on their barrier: one box of Bc rows per 64 columns each."""
        bar = base + uint32(KV_FULL)
        tma.arrive_expect_tx(bar, uint32(KV_BYTES))
        for h in range(HALVES):
            col, half = int32(h * BOX_COLUMNS), uint32(uint64(h) * KV_HALF)
            tma.tma_load_3d(base + uint32(K_OFF) + half, maps, uint64(K_MAP), col, int32(k_start), int32(kv_head), bar)
            tma.tma_load_3d(base + uint32(V_OFF) + half, maps, uint64(V_MAP), col, int32(k_start), int32(kv_head), bar)

    @cuda.jit(device=True, inline="always")
    def load_query_tile(maps, bar, stage, q_start, head):
        """Q_i, dO_i of ``head`` by TMA into a stage, on its "full" barrier ``bar``; rows past Nq land as zeros."""
        tma.arrive_expect_tx(bar, uint32(Q_BYTES))
        for h in range(HALVES):
            col, half = int32(h * BOX_COLUMNS), uint32(uint64(h) * Q_HALF)
            tma.tma_load_3d(stage + half, maps, uint64(Q_MAP), col, int32(q_start), int32(head), bar)
            tma.tma_load_3d(stage + uint32(DO_IN) + half, maps, uint64(DO_MAP), col, int32(q_start), int32(head), bar)

    @cuda.jit(device=True, inline="always")
    def store_rows(LSE, Dvec, smemf, stage_word, head, q_start, n_q, lane):
        """lse_i (base 2), D_i into a stage, rows lane, lane + LANES, ..; past Nq lse = +inf, so that P is 0."""
        for r in range(ROWS_PER_LANE):
            at = lane + uint64(r) * LANES  # the row, in the tile
            row = q_start + at
            inside = row < n_q
            smemf[stage_word + LSE_IN // FOUR + at] = LSE[head * n_q + row] * LOG2E_ if inside else POS_INF
            smemf[stage_word + D_IN // FOUR + at] = Dvec[head * n_q + row] if inside else float32(0.0)

    return init_barriers, load_kv, load_query_tile, store_rows


def producer(cfg: BackwardTmaTiling):
    """``(produce, write_dq)``: the producer warpgroup's first warp fills the stages as the consumers free them;
    with DQ_BY_TMA its second warp adds each query tile's dQ_i to the accumulator."""
    BR, STAGES = u(cfg.BR), u(cfg.STAGES)
    layout = layout_bytes(cfg)
    STAGE0, STAGE = layout["stage 0"], layout["stage 1"] - layout["stage 0"]
    FULL0, EMPTY0, BAR = layout["full 0"], layout["empty 0"], u(tma.BARRIER_BYTES)
    DQ_OFF, DQ_BOXES, DQ_BOX_BYTES = layout["dQ_i"], cfg.D // DQ_BOX_COLUMNS, u(cfg.BR * ROW_BYTES)  # box: Br rows
    # DQ_BY_TMA: the consumers (first) and the producer's second warp, the dQ writer, meet at DQ_FULL and DQ_EMPTY
    dq_wait_stored = tma.named_barrier(DQ_FULL, cfg.CONSUMERS + WARP)
    dq_read = tma.named_barrier(DQ_EMPTY, cfg.CONSUMERS + WARP, arrive_only=True)
    _, load_kv, load_query_tile, store_rows = loads(cfg)

    @cuda.jit(device=True, inline="always")
    def next_tile(head, q_start, q_first, n_q):
        """The (query head, first row) after (head, q_start), counted (a division needs more than 24 registers)."""
        if q_start + BR < n_q:
            return head, q_start + BR
        return head + ONE, q_first // BR * BR

    @cuda.jit(device=True, inline="always")
    def produce(maps, LSE, Dvec, smemf, base, base_word, lane, kv_head, k_start, heads, q_first, tiles, steps, n_q):
        """The producer's first warp: K_j, V_j, then each query tile as soon as the consumers have left its stage
        (lane 0 issues the copies; every lane stores its rows of lse_i and D_i and arrives)."""
        if lane == ZERO:
            for m in range(4):
                tma.prefetch_map(maps, uint64(m))
                tma.acquire_map(maps, uint64(m))
            load_kv(maps, base, k_start, kv_head)
        for step in range(steps):
            head, q_start = kv_head * heads + step // tiles, (q_first // BR + step % tiles) * BR
            stage = step % STAGES
            # the phase in which the consumers released tile step - STAGES (before the first round: completed)
            tma.wait(base + uint32(EMPTY0 + stage * BAR), uint32((step // STAGES + ONE) % TWO))
            full, stage_off = base + uint32(FULL0 + stage * BAR), STAGE0 + stage * STAGE
            if lane == ZERO:
                load_query_tile(maps, full, base + uint32(stage_off), q_start, head)
            store_rows(LSE, Dvec, smemf, base_word + stage_off // FOUR, head, q_start, n_q, lane)
            tma.arrive(full)  # this lane's rows are stored (the arrival releases them to the consumers)

    @cuda.jit(device=True, inline="always")
    def write_dq(maps, base, lane, kv_head, heads, q_first, steps, n_q):
        """The producer's second warp: as each tile's dQ_i is stored, lane 0 adds it to the accumulator by TMA
        reduce-adds (rows past Nq left out); once they have read it, the buffer is free (the last: done)."""
        if lane == ZERO:
            tma.prefetch_map(maps, uint64(DQ_MAP))
            tma.acquire_map(maps, uint64(DQ_MAP))
        head, q_start = kv_head * heads, q_first // BR * BR  # step 0's
        for step in range(steps):
            dq_wait_stored()  # every consumer's dQ_i is in shared memory, visible to the copy engine
            if lane == ZERO:
                for b in range(DQ_BOXES):
                    tma.tma_reduce_add_3d(base + uint32(DQ_OFF + uint64(b) * DQ_BOX_BYTES), maps, uint64(DQ_MAP),
                                          int32(b * DQ_BOX_COLUMNS), int32(q_start), int32(head))
                tma.bulk_commit_group()
                tma.bulk_wait_read()
            if step + ONE < steps:
                dq_read()  # the buffer may be written again
            head, q_start = next_tile(head, q_start, q_first, n_q)
        if lane == ZERO:
            tma.bulk_wait()  # the last adds are done before the block ends

    return produce, write_dq


def key_products(cfg: BackwardTmaTiling, element: str):
    """``(value_gradients, key_gradients)``: dV_j += Pᵀ dO_i and dK_j += dSᵀ Q_i, wgmma's with A from registers,
    issued apart so that with DV_FIRST dV_j's batch runs while dSᵀ is computed."""
    Q_STEPS, DO_IN = cfg.BR // MMA_K, layout_bytes(cfg)["dO_i in a stage"]  # k-steps over the queries
    mma_kv = wgmma.mma_async_rs(element, cfg.D, trans_b=True)  # dV_j, dK_j: Pᵀ or dSᵀ in registers, B MN-major
    fence_o, fence_w = wgmma.fence_operands(cfg.D // 2), wgmma.fence_operands(4 * Q_STEPS)
    ROWS_MN = u(wgmma.descriptor_bits(cfg.BR * ROW_BYTES, 8 * ROW_BYTES))  # Q_i, dO_i as dK's and dV's B: MN-major

    @cuda.jit(device=True, inline="always")
    def value_gradients(dv, p, stage):
        """dV_j += Pᵀ dO_i, issued (the caller commits the batch)."""
        fence_w(p)
        fence_o(dv)
        wgmma.fence()
        for kk in range(Q_STEPS):
            mma_kv(dv, p[kk, 0], p[kk, 1], p[kk, 2], p[kk, 3],
                   wgmma.descriptor(stage + uint32(DO_IN) + uint32(kk) * uint32(STEP_BYTES), ROWS_MN), uint32(1))

    @cuda.jit(device=True, inline="always")
    def key_gradients(dk, ds, stage):
        """dK_j += dSᵀ Q_i, issued, committed with what came before, not waited for (dQ's wait retires it)."""
        fence_w(ds)
        fence_o(dk)
        wgmma.fence()
        for kk in range(Q_STEPS):
            mma_kv(dk, ds[kk, 0], ds[kk, 1], ds[kk, 2], ds[kk, 3],
                   wgmma.descriptor(stage + uint32(kk) * uint32(STEP_BYTES), ROWS_MN), uint32(1))
        wgmma.commit_group()

    return value_gradients, key_gradients


def consumer(cfg: BackwardTmaTiling, element: str):
    """``consume``: a consumer warpgroup's loop over the query tiles, of ``wgmma_steps``' scores, operands, query
    gradients and writes and :func:`key_products`; dQ_i added by atomics, or with DQ_BY_TMA stored in shared memory
    for the producer's second warp."""
    BR, BC, STAGES, DQ_BY_TMA, DV_FIRST = u(cfg.BR), u(cfg.BC), u(cfg.STAGES), cfg.DQ_BY_TMA, cfg.DV_FIRST
    DW, D_ = u(cfg.D // 2), u(cfg.D)  # words and elements per row in HBM
    Q_STEPS, S_TILES, O_TILES, DQ_TILES = cfg.BR // MMA_K, cfg.BR // 8, cfg.D // 8, cfg.DQ_N // 8  # accumulators
    layout = layout_bytes(cfg)
    K_OFF, V_OFF, STAGE0, DS0 = layout["K_j"], layout["V_j"], layout["stage 0"], layout["dS 0"]
    STAGE, DS_BYTES = layout["stage 1"] - layout["stage 0"], layout["dS 1"] - layout["dS 0"]
    LSE_IN, D_IN, DQ_OFF = layout["lse_i in a stage"], layout["D_i in a stage"], layout["dQ_i"]
    KV_FULL, FULL0, EMPTY0, BAR = layout["K_j, V_j full"], layout["full 0"], layout["empty 0"], u(tma.BARRIER_BYTES)
    WG, WG_KEY_BYTES = u(wgmma.WARPGROUP), u(MMA_M * 4 * ROW_BYTES)  # a warpgroup's 64 rows of K_j or V_j
    DQ_N, ROW_GROUPS, KV_HALF = u(cfg.DQ_N), u(cfg.DQ_ROW_GROUPS), u(cfg.BC * ROW_BYTES)
    HALF_COLUMNS = u(wgmma.SWIZZLE_ROW_VALUES)  # a 64-column half of K_j
    DQ_BOX_BYTES, CHUNK_FLOATS = u(cfg.BR * ROW_BYTES), u(4)  # a box of dQ_i: Br rows of 32 floats; a 16-byte chunk
    fence_o, fence_q = wgmma.fence_operands(cfg.D // 2), wgmma.fence_operands(cfg.DQ_N // 2)
    ds_stored = tma.named_barrier(DS_BARRIER, cfg.CONSUMERS)  # the consumers only: the producer runs ahead
    # DQ_BY_TMA: the consumers (first) and the producer's second warp, the dQ writer, meet at DQ_FULL and DQ_EMPTY
    dq_stored = tma.named_barrier(DQ_FULL, cfg.CONSUMERS + WARP, arrive_only=True)
    dq_taken = tma.named_barrier(DQ_EMPTY, cfg.CONSUMERS + WARP)
    transposed_scores, probabilities, score_gradients = scores(cfg, element, DV_FIRST)
    pack_a, store_ds = operands(cfg, element)
    ds_times_k, add_dq = query_gradients(cfg, element)
    value_gradients, key_gradients = key_products(cfg, element)
    write_dk_dv = key_writes(cfg, element)

    @cuda.jit(device=True, inline="always")
    def store_dq(smemf, dq, dq_word, dq_row, dq_col, t):
        """The lane's dq into dQ_i's swizzled float32 boxes (box: 32 columns; row: 128 bytes of 8 chunks of 4
        floats, chunk c at c XOR row % 8), rows dq_row, dq_row + 8 of the tile, columns dq_col + 8n + 2t, +1."""
        for half in range(2):
            row = dq_row + uint64(half * 8)
            for n in range(DQ_TILES):
                col = dq_col + uint64(n) * EIGHT + TWO * t
                box, chunk = col // uint64(DQ_BOX_COLUMNS), col % uint64(DQ_BOX_COLUMNS) // CHUNK_FLOATS
                at = (dq_word + box * DQ_BOX_BYTES // FOUR + row * uint64(ROW_BYTES // 4)
                      + (chunk ^ (row % EIGHT)) * CHUNK_FLOATS + col % CHUNK_FLOATS)
                smemf[at], smemf[at + ONE] = dq[n, 2 * half], dq[n, 2 * half + 1]

    @cuda.jit(device=True, inline="always")
    def consume(dQ_acc, dK, dV, smem, smemf, base, base_word, tid, kv_head, k_start, heads, q_first, tiles, steps,
                n_q, n_k, scale, scale_log2, causal):
        """A consumer thread (``tid`` from the first consumer): its warpgroup's 64 keys of dK_j, dV_j over every
        query tile as the stages fill, each released once its multiplies are waited for; then dQ_i added."""
        group, lane = tid // WG, tid % uint64(WARP)  # the warpgroup: 64 keys of the tile
        warp4, g, t = (tid // uint64(WARP)) % FOUR, lane // FOUR, lane % FOUR  # the warp in its warpgroup
        tile_key = group * uint64(4 * MMA_M) + warp4 * uint64(MMA_M) + g  # the lane's first key, in the tile
        k_rows = base + uint32(K_OFF) + uint32(group * WG_KEY_BYTES)  # the warpgroup's rows of K_j, V_j
        v_rows = base + uint32(V_OFF) + uint32(group * WG_KEY_BYTES)
        row_group = group % ROW_GROUPS  # the warpgroup's 64 rows of dQ_i: in dSᵀ, that 64-query half
        dq_row, ds_half = row_group * uint64(4 * MMA_M), uint32(row_group * KV_HALF)
        dq_col = group // ROW_GROUPS * DQ_N  # its columns of dQ_i: in K_j, their 64-column half, then 2 bytes each
        k_columns = base + uint32(K_OFF + dq_col // HALF_COLUMNS * KV_HALF + dq_col % HALF_COLUMNS * TWO)
        s = cuda.local.array((S_TILES, 4), float32)  # the lane's part of Sᵀ, then of Pᵀ
        dp = cuda.local.array((S_TILES, 4), float32)  # its part of dPᵀ, then of dSᵀ
        p = cuda.local.array((Q_STEPS, 4), uint32)  # Pᵀ packed: the A words of each 16-query step
        ds = cuda.local.array((Q_STEPS, 4), uint32)  # dSᵀ packed
        dk = cuda.local.array((O_TILES, 4), float32)  # its part of dK_j (unscaled)
        dv = cuda.local.array((O_TILES, 4), float32)  # its part of dV_j
        dq = cuda.local.array((DQ_TILES, 4), float32)  # its part of dQ_i, one query tile
        for n in range(O_TILES):
            for e in range(4):
                dk[n, e], dv[n, e] = float32(0.0), float32(0.0)
        if steps > ZERO:
            tma.wait(base + uint32(KV_FULL), uint32(0))  # K_j, V_j have landed (their barrier's one phase)

        for step in range(steps):
            head, q_start = kv_head * heads + step // tiles, (q_first // BR + step % tiles) * BR
            stage_off = STAGE0 + (step % STAGES) * STAGE
            tma.wait(base + uint32(FULL0 + (step % STAGES) * BAR), uint32((step // STAGES) % TWO))  # Q_i .. landed
            transposed_scores(s, dp, k_rows, v_rows, base + uint32(stage_off))  # Sᵀ waited for, dPᵀ in flight
            # a mask where some (key, query) of the tile is not allowed: the ragged last tiles, the diagonal
            masked = (k_start + BC > n_k or q_start + BR > n_q
                      or k_start + BC > key_stop(q_start + ONE, n_q, n_k, causal))
            stage_word = base_word + stage_off // FOUR
            probabilities(s, smemf, stage_word + LSE_IN // FOUR, k_start + tile_key, q_start, t, n_q, n_k, causal,
                          masked, scale_log2)
            if DV_FIRST:  # dV_j += Pᵀ dO_i, a batch in flight while dSᵀ is computed
                pack_a(p, s)
                value_gradients(dv, p, base + uint32(stage_off))
                wgmma.commit_group()
            score_gradients(dp, s, smemf, stage_word + D_IN // FOUR, t)
            if not DV_FIRST:  # Pᵀ packed once Sᵀ's registers are free
                pack_a(p, s)
            pack_a(ds, dp)
            ds_off = DS0 + (step % TWO) * DS_BYTES  # dSᵀ's buffer of this tile's parity
            store_ds(smem, ds, base_word + ds_off // FOUR, tile_key, t)
            if not DV_FIRST:  # dV_j += Pᵀ dO_i, in dK_j's batch
                value_gradients(dv, p, base + uint32(stage_off))
            key_gradients(dk, ds, base + uint32(stage_off))  # dK_j += dSᵀ Q_i, in flight
            wgmma.fence_proxy_async()  # this thread's dSᵀ is visible to the tensor cores
            ds_stored()  # every warpgroup's dSᵀ is in its buffer
            ds_times_k(dq, base + uint32(ds_off) + ds_half, k_columns)  # dQ_i = dS K_j; both batches waited for
            tma.arrive(base + uint32(EMPTY0 + (step % STAGES) * BAR))  # this thread is done with the stage
            fence_q(dq)
            if DQ_BY_TMA:  # into shared memory, once the writer has read the last tile's
                if step > ZERO:
                    dq_taken()
                store_dq(smemf, dq, base_word + DQ_OFF // FOUR, dq_row + warp4 * uint64(MMA_M) + g, dq_col, t)
                wgmma.fence_proxy_async()  # this thread's dQ_i is visible to the copy engine
                dq_stored()
            else:
                add_dq(dQ_acc, dq, head * n_q * D_, q_start + dq_row + warp4 * uint64(MMA_M) + g, dq_col, t, n_q)

        fence_o(dk)
        fence_o(dv)
        write_dk_dv(dK, dV, dk, dv, kv_head * n_k * DW, k_start + tile_key, t, n_k, scale)

    return consume


@lru_cache(maxsize=None)
def make_kernel(cfg: BackwardTmaTiling, element: str):
    """``flash_bwd_ws`` for one tiling and one element type (float16 or bfloat16): the block's key tile, its
    barriers initialised, then the producer's warps (:func:`producer`) and the consumers (:func:`consumer`)."""
    cfg.validate()
    BR, BC, WG, LANES, DQ_BY_TMA = u(cfg.BR), u(cfg.BC), u(wgmma.WARPGROUP), u(LSE_LANES), cfg.DQ_BY_TMA
    LONGEST_FIRST, HEAD_BYTES = cfg.LONGEST_FIRST, u(HEAD_BYTES_PER_COLUMN * cfg.D)
    producer_registers = tma.setmaxnreg(False, cfg.PRODUCER_REGISTERS)
    consumer_registers = tma.setmaxnreg(True, cfg.CONSUMER_REGISTERS)
    init_barriers = loads(cfg)[0]
    produce, write_dq = producer(cfg)
    consume = consumer(cfg, element)
    options = {} if simulator_enabled() else cfg.compile_options()  # launch bounds; the simulator takes none

    @cuda.jit(fastmath=FAST_MATH, **options)
    def flash_bwd_ws(LSE, Dvec, dQ_acc, dK, dV, TMAPS, n_q, n_k, scale, scale_log2, causal, kv_group):
        smem, smemf = shared_words(), shared_floats()  # cfg.smem_layout() from a 1024-byte-aligned base
        tid = uint64(cuda.threadIdx.x)
        n_q, n_k, heads = uint64(n_q), uint64(n_k), uint64(kv_group)
        key_tiles, kv_heads = uint64(cuda.gridDim.x), uint64(cuda.gridDim.y)
        if LONGEST_FIRST and causal:  # the heavy key tiles first (tma_tiling.longest_first says why)
            kv_head, k_tile = longest_first(uint64(cuda.blockIdx.y) * key_tiles + uint64(cuda.blockIdx.x), key_tiles,
                                            kv_heads, n_q * heads * HEAD_BYTES)
        else:
            kv_head, k_tile = uint64(cuda.blockIdx.y), uint64(cuda.blockIdx.x)
        k_start = k_tile * BC
        raw = ptx.shared_address(smem, ZERO)
        base = (raw + uint32(ALIGN - ONE)) & ~uint32(ALIGN - ONE)  # the swizzle is of absolute address bits
        base_word = uint64(base - raw) // FOUR
        # the query tiles that see this key tile: causal, queries below k_start - (Nk - Nq) see none of its keys
        q_first = k_start + n_q - n_k if causal and k_start + n_q > n_k else ZERO
        tiles = (n_q + BR - ONE) // BR - q_first // BR if q_first < n_q else ZERO  # per query head
        steps = tiles * heads  # (query head, query tile) pairs, head by head

        if tid == ZERO:
            init_barriers(base)
        cuda.syncthreads()  # the barriers are initialised before any thread waits on them; the last block barrier
        if tid < WG:  # the producer warpgroup: few registers, its first warp loads, its second writes dQ_i
            producer_registers()
            if tid < LANES and steps > ZERO:
                produce(TMAPS, LSE, Dvec, smemf, base, base_word, tid, kv_head, k_start, heads, q_first, tiles, steps,
                        n_q)
            elif DQ_BY_TMA and tid < LANES + uint64(WARP) and steps > ZERO:
                write_dq(TMAPS, base, tid - LANES, kv_head, heads, q_first, steps, n_q)
        else:  # the consumers: the registers the producer gave up
            consumer_registers()
            consume(dQ_acc, dK, dV, smem, smemf, base, base_word, tid - WG, kv_head, k_start, heads, q_first, tiles,
                    steps, n_q, n_k, scale, scale_log2, causal)

    return flash_bwd_ws


WHO = "backward kernel v4 (warp-specialised)"


def build(cfg: BackwardTmaTiling, element: str, deterministic: bool = False):
    """What v4 builds: its kernel for the tiling ``cfg`` and ``element`` inputs (it has no deterministic mode:
    ``deterministic=True`` is a ValueError)."""
    refuse_deterministic(deterministic, WHO)
    return make_kernel(cfg, element)
