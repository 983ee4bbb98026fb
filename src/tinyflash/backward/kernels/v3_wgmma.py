"""Backward kernel v3: Hopper's warpgroup multiplies (``wgmma``), FlashAttention-3's backward. float16 and
bfloat16 in, float32 accumulation.

What changed since v2 (FlashAttention-2's design on ``mma.sync``):

* A **warpgroup** (4 warps, 128 threads) owns 64 keys of the block's key tile, the M rows of its multiplies;
  a block has WARPGROUPS of them (Bc = 64 · WARPGROUPS) and walks query tiles of Br = 64 rows. Each product is
  a handful of ``wgmma.mma_async`` instructions where a v2 warp issued a ldmatrix and an mma.sync per
  16 × 8 × 16 piece:

      Sᵀ  = K_j Q_iᵀ     d / 16 wgmma m64n64k16, both operands from shared memory (K-major)
      dPᵀ = V_j dO_iᵀ    the same, a second batch, multiplied while the warpgroup computes Pᵀ
      dV_j += Pᵀ dO_i    Br / 16 wgmma m64n{d}k16: Pᵀ packed from Sᵀ's accumulators (A from registers, as P·V in
                         the forward), dO_i read transposed (MN-major, ``trans_b``)
      dK_j += dSᵀ Q_i    the same with dSᵀ and Q_i, in the same batch
      dQ_i  = dS K_j     Bc / 16 wgmma m64n{d / WARPGROUPS}k16 (M = queries): dS read from the dSᵀ the
                         warpgroups stored in shared memory, transposed by the instruction (``trans_a``), K_j
                         transposed (``trans_b``); each warpgroup takes d / WARPGROUPS of dQ_i's columns

* K_j, V_j, Q_i, dO_i and dSᵀ are stored **128-byte swizzled** (``tinyflash.gpu.wgmma``): one copy of Q_i
  serves as Sᵀ's K-major B and as dK_j's MN-major B (the same rows of 128 bytes, read along either side).
* Stores of dSᵀ and copies by cp.async reach the tensor cores through ``fence.proxy.async`` and a barrier.

Unchanged from v2: one block per (key tile, K/V head), the query heads of a group walked by the block
(dK_j, dV_j summed in registers, K and V never repeated), Q_i, dO_i, lse_i, D_i in two stages, P recomputed
from lse, dS = P ∘ (dP − D), dQ added to a float32 accumulator in HBM by paired atomics
(``red.global.add.v2.f32``); the launch, the arguments and the two row kernels around it. Not here: v2's
deterministic mode (dQ in key-tile order): ``launch`` refuses it. Limits: d = dv ∈ {64, 128}; compute
capability 9.0 exactly (``sm_90a``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda, float32, uint32, uint64

from ...core.masks import key_stop
from ...core.online_softmax import LOG2E
from ...gpu import ptx, wgmma
from ...gpu.loads import cp_async_swizzled_rows
from ...gpu.runtime import device_function, simulator_enabled, u
from ...gpu.smem import shared_floats, shared_words
from ...warp_tile import FAST_MATH, MMA_K, MMA_M, WARP
from ...warpgroup_tile import ROW_BYTES
from .hopper_tiling import BackwardHopperTiling
from .tensor_core_tiling import SIGNATURE  # noqa: F401 (its argument types: v2's)
from .wgmma_steps import STEP_BYTES, key_writes, operands, query_gradients, scores

ZERO, ONE, TWO, FOUR = u(0), u(1), u(2), u(4)
POS_INF = float32(np.inf)
ALIGN = u(wgmma.SWIZZLE_ATOM_BYTES)  # tiles start at multiples of the swizzle's period
key_stop = device_function(key_stop)  # the causal rule of tinyflash.core.masks, compiled for the GPU


def loads(cfg: BackwardHopperTiling):
    """``(load_query_tile, landed)``: a query tile's Q_i, dO_i (cp.async), lse_i and D_i into a stage, and the
    wait that makes every thread's copies visible to the tensor cores."""
    NT, BR, DW = cfg.NT, u(cfg.BR), u(cfg.D // 2)  # threads; query rows; words per row in HBM
    layout = {name: u(offset) for name, offset in cfg.smem_layout().items()}  # bytes
    DO_IN, LSE_IN, D_IN = layout["dO_i in a stage"], layout["lse_i in a stage"], layout["D_i in a stage"]
    Q_CHUNKS = cfg.BR * cfg.CHUNKS // NT  # cp.async per thread
    copy_q = cp_async_swizzled_rows(cfg.D // 2, NT, cfg.BR)  # rows of Q or dO into a swizzled tile of Br rows
    LOG2E_ = float32(LOG2E)

    @cuda.jit(device=True, inline="always")
    def load_query_tile(Q, dO, LSE, Dvec, smemf, stage, stage_word, head, q_start, n_q, tid):
        """Q_i and dO_i of ``head`` into one stage (cp.async, in flight until waited for); lse_i (base 2) and D_i
        beside them, one row a thread; rows past Nq get lse = +inf, so that their P is 0."""
        q_off = head * n_q * DW
        copy_q(Q, q_off, q_start, n_q, stage, tid, Q_CHUNKS)
        copy_q(dO, q_off, q_start, n_q, stage + uint32(DO_IN), tid, Q_CHUNKS)
        ptx.cp_async_commit()
        if tid < BR:
            row = q_start + tid
            inside = row < n_q
            smemf[stage_word + LSE_IN // FOUR + tid] = LSE[head * n_q + row] * LOG2E_ if inside else POS_INF
            smemf[stage_word + D_IN // FOUR + tid] = Dvec[head * n_q + row] if inside else float32(0.0)

    @cuda.jit(device=True, inline="always")
    def landed():
        """Wait for this thread's copies, make them and its shared stores visible to the tensor cores (the async
        proxy), then for every thread's."""
        ptx.cp_async_wait_all()
        wgmma.fence_proxy_async()
        cuda.syncthreads()

    return load_query_tile, landed


def key_products(cfg: BackwardHopperTiling, element: str):
    """``key_gradients``: dV_j += Pᵀ dO_i and dK_j += dSᵀ Q_i, one batch of wgmma's with A from registers."""
    Q_STEPS, DO_IN = cfg.BR // MMA_K, u(cfg.smem_layout()["dO_i in a stage"])  # k-steps over the queries
    mma_kv = wgmma.mma_async_rs(element, cfg.D, trans_b=True)  # dV_j, dK_j: Pᵀ or dSᵀ in registers, B MN-major
    fence_o, fence_w = wgmma.fence_operands(cfg.D // 2), wgmma.fence_operands(4 * Q_STEPS)
    ROWS_MN = u(wgmma.descriptor_bits(cfg.BR * ROW_BYTES, 8 * ROW_BYTES))  # Q_i, dO_i as dK's and dV's B: MN-major

    @cuda.jit(device=True, inline="always")
    def key_gradients(dv, dk, p, ds, stage):
        """dV_j += Pᵀ dO_i and dK_j += dSᵀ Q_i: one batch, committed, not waited for (the next wait retires it)."""
        fence_w(p)
        fence_w(ds)
        fence_o(dv)
        fence_o(dk)
        wgmma.fence()
        for kk in range(Q_STEPS):
            mma_kv(dv, p[kk, 0], p[kk, 1], p[kk, 2], p[kk, 3],
                   wgmma.descriptor(stage + uint32(DO_IN) + uint32(kk) * uint32(STEP_BYTES), ROWS_MN), uint32(1))
        for kk in range(Q_STEPS):
            mma_kv(dk, ds[kk, 0], ds[kk, 1], ds[kk, 2], ds[kk, 3],
                   wgmma.descriptor(stage + uint32(kk) * uint32(STEP_BYTES), ROWS_MN), uint32(1))
        wgmma.commit_group()

    return key_gradients


@lru_cache(maxsize=None)
def make_kernel(cfg: BackwardHopperTiling, element: str):
    """``flash_bwd_wgmma`` for one tiling and one element type (float16 or bfloat16): the loop over query tiles,
    composed of :func:`loads`, ``wgmma_steps``' scores, operands, query gradients and writes, and
    :func:`key_products`."""
    cfg.validate()
    BR, BC, NT = u(cfg.BR), u(cfg.BC), cfg.NT
    DW, D_ = u(cfg.D // 2), u(cfg.D)  # words and elements per row in HBM
    Q_STEPS, S_TILES, O_TILES, DQ_TILES = cfg.BR // MMA_K, cfg.BR // 8, cfg.D // 8, cfg.DQ_N // 8  # accumulators' sizes
    layout = {name: u(offset) for name, offset in cfg.smem_layout().items()}  # bytes
    K_OFF, V_OFF, STAGE0, DS_OFF = layout["K_j"], layout["V_j"], layout["stage 0"], layout["dS"]
    STAGE, LSE_IN, D_IN = layout["stage 1"] - layout["stage 0"], layout["lse_i in a stage"], layout["D_i in a stage"]
    WG_KEY_BYTES = u(MMA_M * 4 * ROW_BYTES)  # a warpgroup's 64 rows of K_j or V_j
    DQ_N = u(cfg.DQ_N)
    HALF_COLUMNS, KEY_HALF_BYTES = u(wgmma.SWIZZLE_ROW_VALUES), u(cfg.BC * ROW_BYTES)  # a 64-column half of K_j
    KV_CHUNKS = cfg.BC * cfg.CHUNKS // NT  # cp.async per thread
    copy_kv = cp_async_swizzled_rows(cfg.D // 2, NT, cfg.BC)  # rows of K or V into a swizzled tile of Bc rows
    fence_o, fence_q = wgmma.fence_operands(cfg.D // 2), wgmma.fence_operands(cfg.DQ_N // 2)
    load_query_tile, landed = loads(cfg)
    transposed_scores, probabilities, score_gradients = scores(cfg, element)
    pack_a, store_ds = operands(cfg, element)
    ds_times_k, add_dq = query_gradients(cfg, element)
    key_gradients, write_dk_dv = key_products(cfg, element), key_writes(cfg, element)
    # on a GPU, ptxas keeps the registers within what one block of NT threads may hold (2 warpgroups: 255)
    BOUNDS = {} if simulator_enabled() else {"launch_bounds": (NT, 1)}

    @cuda.jit(fastmath=FAST_MATH, **BOUNDS)
    def flash_bwd_wgmma(Q, K, V, dO, LSE, Dvec, dQ_acc, dK, dV, dQ_turn, n_q, n_k, scale, scale_log2, causal,
                        kv_group):
        smem, smemf = shared_words(), shared_floats()  # cfg.smem_layout() from a 1024-byte-aligned base
        tid = uint64(cuda.threadIdx.x)
        group, lane = tid // uint64(wgmma.WARPGROUP), tid % uint64(WARP)  # the warpgroup: 64 keys of the tile
        warp4, g, t = (tid // uint64(WARP)) % FOUR, lane // FOUR, lane % FOUR  # the warp in its warpgroup
        kv_head, k_start = uint64(cuda.blockIdx.y), uint64(cuda.blockIdx.x) * BC
        n_q, n_k, heads = uint64(n_q), uint64(n_k), uint64(kv_group)
        kv_off = kv_head * n_k * DW
        tile_key = group * uint64(4 * MMA_M) + warp4 * uint64(MMA_M) + g  # the lane's first key, in the tile
        raw = ptx.shared_address(smem, ZERO)
        base = (raw + uint32(ALIGN - ONE)) & ~uint32(ALIGN - ONE)  # the swizzle is of absolute address bits
        base_word = uint64(base - raw) // FOUR
        # the query tiles that see this key tile: causal, queries below k_start - (Nk - Nq) see none of its keys
        q_first = k_start + n_q - n_k if causal and k_start + n_q > n_k else ZERO
        tiles = (n_q + BR - ONE) // BR - q_first // BR if q_first < n_q else ZERO  # per query head
        steps = tiles * heads  # (query head, query tile) pairs, head by head

        copy_kv(K, kv_off, k_start, n_k, base + uint32(K_OFF), tid, KV_CHUNKS)  # K_j, V_j, once
        copy_kv(V, kv_off, k_start, n_k, base + uint32(V_OFF), tid, KV_CHUNKS)
        if steps > ZERO:
            load_query_tile(Q, dO, LSE, Dvec, smemf, base + uint32(STAGE0), base_word + STAGE0 // FOUR,
                            kv_head * heads, q_first // BR * BR, n_q, tid)
        ptx.cp_async_commit()
        landed()  # K_j, V_j and the first query tile are in shared memory, visible to the tensor cores

        k_rows = base + uint32(K_OFF) + uint32(group * WG_KEY_BYTES)  # the warpgroup's rows of K_j, V_j
        v_rows = base + uint32(V_OFF) + uint32(group * WG_KEY_BYTES)
        dq_col = group * DQ_N  # the warpgroup's columns of dQ_i: in K_j, its 64-column half, then 2 bytes each
        k_columns = base + uint32(K_OFF + dq_col // HALF_COLUMNS * KEY_HALF_BYTES + dq_col % HALF_COLUMNS * TWO)
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

        for step in range(steps):
            head = kv_head * heads + step // tiles
            q_start = (q_first // BR + step % tiles) * BR
            stage_off = STAGE0 + (step % TWO) * STAGE
            stage = base + uint32(stage_off)
            if step + ONE < steps:  # the next query tile into the other stage, in flight during this one
                nxt = STAGE0 + ((step + ONE) % TWO) * STAGE
                load_query_tile(Q, dO, LSE, Dvec, smemf, base + uint32(nxt), base_word + nxt // FOUR,
                                kv_head * heads + (step + ONE) // tiles, (q_first // BR + (step + ONE) % tiles) * BR,
                                n_q, tid)
            transposed_scores(s, dp, k_rows, v_rows, stage)  # Sᵀ waited for, dPᵀ in flight
            # a mask where some (key, query) of the tile is not allowed: the ragged last tiles, the diagonal
            masked = (k_start + BC > n_k or q_start + BR > n_q
                      or k_start + BC > key_stop(q_start + ONE, n_q, n_k, causal))
            stage_word = base_word + stage_off // FOUR
            probabilities(s, smemf, stage_word + LSE_IN // FOUR, k_start + tile_key, q_start, t, n_q, n_k, causal,
                          masked, scale_log2)
            score_gradients(dp, s, smemf, stage_word + D_IN // FOUR, t)
            pack_a(p, s)
            pack_a(ds, dp)
            store_ds(smem, ds, base_word + DS_OFF // FOUR, tile_key, t)
            key_gradients(dv, dk, p, ds, stage)  # dV_j += Pᵀ dO_i, dK_j += dSᵀ Q_i, in flight
            wgmma.fence_proxy_async()  # this thread's dSᵀ is visible to the tensor cores
            cuda.syncthreads()  # every warpgroup's dSᵀ is in shared memory
            ds_times_k(dq, base + uint32(DS_OFF), k_columns)  # dQ_i = dS K_j; both batches waited for
            fence_q(dq)
            add_dq(dQ_acc, dq, head * n_q * D_, q_start + warp4 * uint64(MMA_M) + g, dq_col, t, n_q)
            landed()  # the next query tile is in; no warpgroup still reads this stage or dSᵀ

        fence_o(dk)
        fence_o(dv)
        write_dk_dv(dK, dV, dk, dv, kv_off, k_start + tile_key, t, n_k, scale)

    return flash_bwd_wgmma


def refuse_deterministic(deterministic) -> None:
    if deterministic:
        raise ValueError("backward kernel v3 (wgmma) has no deterministic mode (dQ is added by atomics in any "
                         "order); got deterministic=True: use kernel v2 for a bitwise-reproducible dq")


def build(cfg: BackwardHopperTiling, element: str, deterministic: bool = False):
    """What v3 builds: its kernel for the tiling ``cfg`` and ``element`` inputs (it has no deterministic mode:
    ``deterministic=True`` is a ValueError)."""
    refuse_deterministic(deterministic)
    return make_kernel(cfg, element)
