"""The steps of the wgmma backward's loop that kernels v3 and v4 share, as piece factories: each takes the tiling
(v3's :class:`~.hopper_tiling.BackwardHopperTiling`, or v4's, which extends it) and the element type, and returns
its device functions. Per query tile, for a warpgroup's 64 keys (rows) and Br queries (columns):

    Sᵀ = K_j Q_iᵀ, dPᵀ = V_j dO_iᵀ      scores: transposed_scores          two wgmma batches, K-major both
    Pᵀ = exp2(scale · Sᵀ − lse)         scores: probabilities              masked; replaces Sᵀ
    dSᵀ = Pᵀ ∘ (dPᵀ − D)                scores: score_gradients            replaces dPᵀ
    Pᵀ, dSᵀ as A words; dSᵀ stored      operands: pack_a, store_ds         registers; swizzled shared memory
    dQ_i = dS K_j, added to dQ_acc      query_gradients: ds_times_k, add_dq
    dK_j, dV_j written, once            key_writes: write_dk_dv

What differs between the versions stays in their files: the loads (cp.async or TMA), the batches of dV_j and
dK_j, the barriers, the loop.
"""

from __future__ import annotations

import math

from numba import cuda, float32, uint32, uint64

from ...core.masks import key_stop
from ...gpu import ptx, wgmma
from ...gpu.runtime import device_function, u
from ...warp_tile import MMA_K
from ...warpgroup_tile import HALF_STEPS, ROW_BYTES
from .hopper_tiling import BackwardHopperTiling

ONE, TWO, FOUR, EIGHT = u(1), u(2), u(4), u(8)
STEP_BYTES = u(MMA_K * ROW_BYTES)  # 16 rows of a swizzled tile: one k-step of an MN-major operand
key_stop = device_function(key_stop)  # the causal rule of tinyflash.core.masks, compiled for the GPU


@cuda.jit(device=True, inline="always")
def k_step(kk, rows):
    """Bytes from a swizzled tile of ``rows`` rows to columns 16kk .. 16kk + 15 (a K-major operand's k-step): its
    64-column half, then 32 bytes per step inside the half (``warpgroup_tile.k_step_offset``)."""
    return uint32(kk // HALF_STEPS) * uint32(rows) * uint32(ROW_BYTES) + uint32(kk % HALF_STEPS) * uint32(2 * MMA_K)


def scores(cfg: BackwardHopperTiling, element: str, dv_first: bool = False):
    """``(transposed_scores, probabilities, score_gradients)``: Sᵀ and dPᵀ on the tensor cores, then Pᵀ and dSᵀ
    in their registers. ``dv_first``: the caller commits a dV_j batch after dPᵀ's, which score_gradients leaves
    in flight."""
    BR, BC = u(cfg.BR), u(cfg.BC)
    K_STEPS, S_TILES = cfg.D // MMA_K, cfg.BR // 8  # k-steps over d; 8-column blocks of Sᵀ
    DO_IN = u(cfg.smem_layout()["dO_i in a stage"])  # bytes from a stage's Q_i to its dO_i
    mma_s = wgmma.mma_async_ss(element, cfg.BR)  # Sᵀ, dPᵀ: K_j or V_j by Q_iᵀ or dO_iᵀ, K-major both
    wait_all, wait_one, fence_s = wgmma.wait_group(0), wgmma.wait_group(1), wgmma.fence_operands(cfg.BR // 2)
    wait_dp = wait_one if dv_first else wait_all  # dPᵀ's batch: the one before dV's, or the last committed
    K_MAJOR = u(wgmma.descriptor_bits(16, 8 * ROW_BYTES))  # descriptors' fixed bits: SBO 8 rows; LBO unused

    @cuda.jit(device=True, inline="always")
    def transposed_scores(s, dp, k_rows, v_rows, stage):
        """Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ for the warpgroup's 64 keys (rows) and Br queries (columns): two
        batches; returns when Sᵀ's is done, dPᵀ's still in flight (:func:`score_gradients` waits for it). The
        first k-step of each overwrites its accumulators (scale_d = 0)."""
        wgmma.fence()
        for kk in range(K_STEPS):
            mma_s(s, wgmma.descriptor(k_rows + k_step(kk, BC), K_MAJOR), wgmma.descriptor(stage + k_step(kk, BR), K_MAJOR),
                  uint32(kk != 0))
        wgmma.commit_group()
        wgmma.fence()
        for kk in range(K_STEPS):
            mma_s(dp, wgmma.descriptor(v_rows + k_step(kk, BC), K_MAJOR),
                  wgmma.descriptor(stage + uint32(DO_IN) + k_step(kk, BR), K_MAJOR), uint32(kk != 0))
        wgmma.commit_group()
        wait_one()
        fence_s(s)  # the softmax reads s after the wait, not before

    @cuda.jit(device=True, inline="always")
    def probabilities(s, smemf, lse_word, lane_key, q_start, t, n_q, n_k, causal, masked, scale_log2):
        """Pᵀ = exp2(scale · Sᵀ − lse) replaces Sᵀ, 0 where masked (while dPᵀ is multiplied). The lane holds keys
        lane_key and lane_key + 8 (rows) and queries 8n + 2t (+1) of the tile (columns)."""
        for n in range(S_TILES):
            for e in range(4):
                col = uint64(n) * EIGHT + TWO * t + uint64(e % 2)  # the query, in the tile
                p = math.exp2(s[n, e] * scale_log2 - smemf[lse_word + col])
                if masked and lane_key + uint64((e // 2) * 8) >= key_stop(q_start + col + ONE, n_q, n_k, causal):
                    p = float32(0.0)
                s[n, e] = p

    @cuda.jit(device=True, inline="always")
    def score_gradients(dp, s, smemf, d_word, t):
        """Once dPᵀ's batch is done (dv_first: dV's may still run): dSᵀ = Pᵀ ∘ (dPᵀ − D) replaces dPᵀ (D per
        query, per column)."""
        wait_dp()
        fence_s(dp)
        for n in range(S_TILES):
            for e in range(4):
                col = uint64(n) * EIGHT + TWO * t + uint64(e % 2)
                dp[n, e] = s[n, e] * (dp[n, e] - smemf[d_word + col])

    return transposed_scores, probabilities, score_gradients


def operands(cfg: BackwardHopperTiling, element: str):
    """``(pack_a, store_ds)``: Pᵀ and dSᵀ as the A words of dV_j's and dK_j's products (registers), and dSᵀ in
    shared memory for dQ_i's."""
    BC, Q_STEPS = u(cfg.BC), cfg.BR // MMA_K  # keys; k-steps over the queries
    pack = ptx.pack(element)

    @cuda.jit(device=True, inline="always")
    def pack_a(words, acc):
        """An accumulator of 64 rows × Br columns as the A words of Br / 16 wgmma's (rows g, g + 8 of the warp's
        16; columns 16kk + 8h + 2t, +1): the accumulator layout is the A layout, packed to 16-bit pairs."""
        for kk in range(Q_STEPS):
            for h in range(2):
                words[kk, 2 * h] = pack(acc[2 * kk + h, 0], acc[2 * kk + h, 1])
                words[kk, 2 * h + 1] = pack(acc[2 * kk + h, 2], acc[2 * kk + h, 3])

    @cuda.jit(device=True, inline="always")
    def store_ds(smem, ds, ds_word, tile_key, t):
        """The lane's words of dSᵀ into a swizzled dSᵀ buffer (row: the key of the tile; 16-byte chunk n: queries
        8n ..), rows tile_key and tile_key + 8; ds_word: the buffer's first word."""
        for kk in range(Q_STEPS):
            for h in range(2):
                for half in range(2):
                    at = wgmma.swizzled_chunk(tile_key + uint64(8 * half), 2 * kk + h, BC) + uint32(t) * uint32(4)
                    smem[ds_word + uint64(at) // FOUR] = ds[kk, 2 * h + half]

    return pack_a, store_ds


def query_gradients(cfg: BackwardHopperTiling, element: str):
    """``(ds_times_k, add_dq)``: dQ_i = dS K_j on the tensor cores, then added to dQ's float32 accumulator."""
    D_, KEY_STEPS, DQ_TILES = u(cfg.D), cfg.BC // MMA_K, cfg.DQ_N // 8  # dQ's row; k-steps over keys; 8-col blocks
    mma_q = wgmma.mma_async_ss(element, cfg.DQ_N, trans_b=True, trans_a=True)  # dQ_i: dS from dSᵀ, K_j, MN-major
    wait_all = wgmma.wait_group(0)
    KEYS_MN = u(wgmma.descriptor_bits(cfg.BC * ROW_BYTES, 8 * ROW_BYTES))  # MN-major, LBO: columns 0-63 to 64-127

    @cuda.jit(device=True, inline="always")
    def ds_times_k(dq, ds_tile, k_columns):
        """dQ_i = dS K_j for the warpgroup's 64 rows and DQ_N columns (ds_tile: dSᵀ at the first of its queries;
        k_columns: K_j at the first of its columns): dS read from dSᵀ, MN-major (its rows are keys, the k of this
        product), K_j MN-major. Waits for every batch."""
        wgmma.fence()
        for kk in range(KEY_STEPS):
            step = uint32(kk) * uint32(STEP_BYTES)  # keys 16kk ..
            mma_q(dq, wgmma.descriptor(ds_tile + step, KEYS_MN), wgmma.descriptor(k_columns + step, KEYS_MN),
                  uint32(kk != 0))
        wgmma.commit_group()
        wait_all()

    @cuda.jit(device=True, inline="always")
    def add_dq(dQ_acc, dq, q_off, dq_row, dq_col, t, n_q):
        """dQ_acc += the lane's dq (rows dq_row, dq_row + 8; columns dq_col + 8n + 2t, +1), rows below Nq, two
        neighbouring columns per atomic."""
        for half in range(2):
            row = dq_row + uint64(half * 8)
            if row < n_q:
                for n in range(DQ_TILES):
                    ptx.red_add_f32x2(dQ_acc, q_off + row * D_ + dq_col + uint64(n) * EIGHT + TWO * t,
                                      dq[n, 2 * half], dq[n, 2 * half + 1])

    return ds_times_k, add_dq


def key_writes(cfg: BackwardHopperTiling, element: str):
    """``write_dk_dv``: the block's only writes of dK_j and dV_j, from the lanes' accumulators."""
    DW, O_TILES = u(cfg.D // 2), cfg.D // 8  # words per row in HBM; 8-column blocks of dK_j, dV_j
    pack = ptx.pack(element)

    @cuda.jit(device=True, inline="always")
    def write_dk_dv(dK, dV, dk, dv, kv_off, lane_key, t, n_k, scale):
        """dK_j = scale · Σ dSᵀ Q_i and dV_j = Σ Pᵀ dO_i for the lane's keys below Nk, as 16-bit pairs."""
        for half in range(2):
            key = lane_key + uint64(half * 8)
            if key < n_k:
                for n in range(O_TILES):
                    at = kv_off + key * DW + uint64(n) * FOUR + t
                    dK[at] = pack(dk[n, 2 * half] * scale, dk[n, 2 * half + 1] * scale)
                    dV[at] = pack(dv[n, 2 * half], dv[n, 2 * half + 1])

    return write_dk_dv
