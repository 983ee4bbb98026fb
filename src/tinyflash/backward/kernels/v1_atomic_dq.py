"""Backward kernel v1: one block per key tile K_j, V_j and head; dQ added with atomics.

The loop of ``tinyflash.backward.blocked``, with its names, one device function per line, each made by a
piece of ``make_kernel`` (:func:`score_products`, :func:`softmax_backward`, :func:`key_gradients`,
:func:`query_gradients`):

    load K_j, V_j; dK_j = dV_j = 0 (registers)
    for each query tile Q_i that sees K_j:
        load Q_i, dO_i, lse_i, D_i                  load_tile, load_row_stats (shared memory)
        S_ij = Q_i K_jᵀ, dP_ij = dO_i V_jᵀ          scores, dp_product (registers, BR × BC)
        P_ij = exp(S_ij − lse_i), masked; dS_ij     probabilities      (then into shared memory)
        dV_j += P_ijᵀ dO_i, dK_j += dS_ijᵀ Q_i      key_products       (registers, BC × D, BC × DV)
        dQ_i += dS_ij K_j                           add_dq             (atomics into HBM, float32)
    write scale · dK_j, dV_j                        write_dk_dv

dQ_i gets a contribution from every key tile, that is from every block of the head, and they
run at the same time: each adds its BR × D piece with ``atomicAdd`` into a float32 accumulator
(zeroed by ``rows.row_dot``, scaled and converted by ``rows.finish_dq``). Floating-point addition
is not associative, and the order in which blocks' additions land changes from run to run: dQ
is reproducible only up to rounding, while dK and dV, each written by one block, are bitwise
identical from run to run. (A second pass over key tiles, one block per query tile, would make
dQ deterministic too, at the price of recomputing S_ij and dP_ij: 7 products instead of 5.)
Who owns which rows, keys and columns, and where tiles live: ``tiling.py``.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from numba import cuda, float32, uint64

from ...core.masks import key_stop
from ...core.online_softmax import LOG2E
from ...gpu.loads import load_tile, vector_width
from ...gpu import elements
from ...gpu.runtime import device_function, u
from ...gpu.smem import shared_floats
from .tiling import BackwardTileConfig

POS_INF = float32(np.inf)
ZERO, ONE, FOUR = u(0), u(1), u(4)
key_stop = device_function(key_stop)  # the causal rule of tinyflash.core.masks, compiled for the GPU


def region_offsets(cfg: BackwardTileConfig) -> dict:
    """``cfg.smem_layout()``'s offsets (floats) as compile-time constants, by region name."""
    return {r.name: u(r.offset) for r in cfg.smem_layout()}


def score_products(cfg: BackwardTileConfig):
    """``(scores, dp_product)``: S_ij = Q_i K_jᵀ (unscaled) and dP_ij = dO_i V_jᵀ, a thread's TM rows × TN keys
    of each, from shared memory."""
    TM, TN, CT, D, DV, QS, OS = (u(x) for x in (cfg.TM, cfg.TN, cfg.CT, cfg.D, cfg.DV, cfg.QS, cfg.OS))
    at = region_offsets(cfg)
    Q_OFF, O_OFF, K_OFF, V_OFF = at["Q_i"], at["dO_i"], at["K_j"], at["V_j"]

    def row_key_product(A_OFF, A_STRIDE, B_OFF, B_STRIDE, END):
        """out[i, jj] = Σ_c A[row0 + i, c] · B[ct + CT·jj, c] over END columns, 4 at a time (shared memory)."""

        @cuda.jit(device=True, inline="always")
        def product(smem, out, af, bf, row0, ct):
            for i in range(TM):
                for jj in range(TN):
                    out[i, jj] = float32(0.0)
            for c in range(ZERO, END, FOUR):
                for i in range(TM):
                    for e in range(FOUR):
                        af[i, e] = smem[A_OFF + (row0 + i) * A_STRIDE + c + e]
                for jj in range(TN):
                    for e in range(FOUR):
                        bf[jj, e] = smem[B_OFF + (ct + CT * jj) * B_STRIDE + c + e]
                for e in range(FOUR):
                    for i in range(TM):
                        for jj in range(TN):
                            out[i, jj] += af[i, e] * bf[jj, e]

        return product

    return row_key_product(Q_OFF, QS, K_OFF, QS, D), row_key_product(O_OFF, OS, V_OFF, OS, DV)


def softmax_backward(cfg: BackwardTileConfig):
    """``(load_row_stats, probabilities)``: lse_i and D_i into shared memory, then P_ij recomputed from them and
    dS_ij = P_ij ∘ (dP_ij − D_i), both into shared memory."""
    BR, NT, TM, TN, CT, PS = (u(x) for x in (cfg.BR, cfg.NT, cfg.TM, cfg.TN, cfg.CT, cfg.PS))
    at = region_offsets(cfg)
    P_OFF, S_OFF, L_OFF, D_OFF = at["P_ij"], at["dS_ij"], at["lse_i (base 2)"], at["D_i"]

    @cuda.jit(device=True, inline="always")
    def load_row_stats(smem, LSE, Dvec, lse_off, q_start, n_q, tid):
        """lse_i in base 2 (+inf for rows past Nq or that see no key: their P is 0) and D_i, into shared memory."""
        for r in range(tid, BR, NT):
            row = q_start + r
            lse2, D_row = POS_INF, float32(0.0)
            if row < n_q:
                D_row = Dvec[lse_off + row]
                if LSE[lse_off + row] != -POS_INF:
                    lse2 = LSE[lse_off + row] * float32(LOG2E)
            smem[L_OFF + r] = lse2
            smem[D_OFF + r] = D_row

    @cuda.jit(device=True, inline="always")
    def probabilities(smem, s, dp, q_start, k_start, row0, ct, n_q, n_k, causal, masked, scale_log2):
        """P_ij = exp2(scale·log2e·S_ij − lse_i·log2e), 0 where masked; dS_ij = P_ij ∘ (dP_ij − D_i);
        both into shared memory as [row, key]."""
        for i in range(TM):
            stop = key_stop(q_start + row0 + i + ONE, n_q, n_k, causal)  # keys < stop are allowed for this row
            lse2 = smem[L_OFF + row0 + i]
            D_row = smem[D_OFF + row0 + i]
            for jj in range(TN):
                p = math.exp2(s[i, jj] * scale_log2 - lse2)
                if masked and k_start + ct + CT * jj >= stop:
                    p = float32(0.0)
                smem[P_OFF + (row0 + i) * PS + ct + CT * jj] = p
                smem[S_OFF + (row0 + i) * PS + ct + CT * jj] = p * (dp[i, jj] - D_row)

    return load_row_stats, probabilities


def key_gradients(cfg: BackwardTileConfig, element: str | None):
    """``(key_products, write_dk_dv)``: dV_j and dK_j summed over the query tiles in registers, then written."""
    narrow = elements.narrow(element)  # a float32 as an element
    BR, TK, CC, TD4, TV4 = (u(x) for x in (cfg.BR, cfg.TK, cfg.CC, cfg.TD4, cfg.TV4))
    QS, OS, PS = u(cfg.QS), u(cfg.OS), u(cfg.PS)
    at = region_offsets(cfg)
    Q_OFF, O_OFF, P_OFF, S_OFF = at["Q_i"], at["dO_i"], at["P_ij"], at["dS_ij"]

    @cuda.jit(device=True, inline="always")
    def key_products(smem, dk, dv, pf, sf, xf, k0, cc):
        """dV_j += P_ijᵀ dO_i and dK_j += dS_ijᵀ Q_i for this thread's TK keys and columns, over BR rows."""
        for r in range(BR):
            for kk in range(TK):
                pf[kk] = smem[P_OFF + r * PS + k0 + kk]
                sf[kk] = smem[S_OFF + r * PS + k0 + kk]
            for t in range(TV4):
                for e in range(FOUR):
                    xf[e] = smem[O_OFF + r * OS + (cc + CC * t) * FOUR + e]
                for kk in range(TK):
                    for e in range(FOUR):
                        dv[kk, t, e] += pf[kk] * xf[e]
            for t in range(TD4):
                for e in range(FOUR):
                    xf[e] = smem[Q_OFF + r * QS + (cc + CC * t) * FOUR + e]
                for kk in range(TK):
                    for e in range(FOUR):
                        dk[kk, t, e] += sf[kk] * xf[e]

    @cuda.jit(device=True, inline="always")
    def write_dk_dv(dk, dv, dK, dV, k_off, v_off, k_start, k0, cc, n_k, d, d_v, scale):
        """dK_j = scale · dK_j and dV_j: the block's only writes of them."""
        for kk in range(TK):
            key = k_start + k0 + kk
            if key < n_k:
                for t in range(TD4):
                    for e in range(FOUR):
                        col = (cc + CC * t) * FOUR + e
                        if col < d:
                            dK[k_off + key * d + col] = narrow(dk[kk, t, e] * scale)
                for t in range(TV4):
                    for e in range(FOUR):
                        col = (cc + CC * t) * FOUR + e
                        if col < d_v:
                            dV[v_off + key * d_v + col] = narrow(dv[kk, t, e])

    return key_products, write_dk_dv


def query_gradients(cfg: BackwardTileConfig):
    """``add_dq``: dQ_i += dS_ij K_j, a thread's piece added to dQ's float32 accumulator in HBM by atomics."""
    BC, TM, CT, TQ4 = (u(x) for x in (cfg.BC, cfg.TM, cfg.CT, cfg.TQ4))
    QS, PS = u(cfg.QS), u(cfg.PS)
    at = region_offsets(cfg)
    K_OFF, S_OFF = at["K_j"], at["dS_ij"]

    @cuda.jit(device=True, inline="always")
    def add_dq(smem, dq, af, kf, dQ_acc, dq_off, q_start, row0, ct, n_q, d):
        """dQ_i += dS_ij K_j: this thread's TM rows × TQ4·4 columns over the BC keys, then atomically into HBM."""
        for i in range(TM):
            for t in range(TQ4):
                for e in range(FOUR):
                    dq[i, t, e] = float32(0.0)
        for c in range(ZERO, BC, FOUR):  # 4 keys a step: one vector load per row of dS_ij
            for i in range(TM):
                for e in range(FOUR):
                    af[i, e] = smem[S_OFF + (row0 + i) * PS + c + e]
            for e in range(FOUR):
                for t in range(TQ4):
                    for w in range(FOUR):
                        kf[t, w] = smem[K_OFF + (c + e) * QS + (ct + CT * t) * FOUR + w]
                for i in range(TM):
                    for t in range(TQ4):
                        for w in range(FOUR):
                            dq[i, t, w] += af[i, e] * kf[t, w]
        for i in range(TM):
            row = q_start + row0 + i
            for t in range(TQ4):
                for e in range(FOUR):
                    col = (ct + CT * t) * FOUR + e
                    if row < n_q and col < d:
                        cuda.atomic.add(dQ_acc, dq_off + row * d + col, dq[i, t, e])

    return add_dq


@cache
def make_kernel(cfg: BackwardTileConfig, vector: int = 1, element: str | None = None):
    """``flash_bwd`` for one :class:`BackwardTileConfig`, reading tiles ``vector`` elements per thread;
    ``element`` 'bfloat16' for inputs of bfloat16 patterns (``gpu/elements.py``). The loop over query tiles is
    composed of :func:`score_products`, :func:`softmax_backward`, :func:`key_gradients` and
    :func:`query_gradients`."""
    cfg.validate()
    widen = elements.widen(element)  # an element as float32
    BR, BC, NT, TM, TK, D, DV, W = (u(x) for x in (cfg.BR, cfg.BC, cfg.NT, cfg.TM, cfg.TK, cfg.D, cfg.DV, vector))
    CT, CC, TD4, TV4 = (u(x) for x in (cfg.CT, cfg.CC, cfg.TD4, cfg.TV4))
    QS, OS = u(cfg.QS), u(cfg.OS)
    at = region_offsets(cfg)
    Q_OFF, O_OFF, K_OFF, V_OFF = at["Q_i"], at["dO_i"], at["K_j"], at["V_j"]
    TM_, TN_, TK_, TQ4_, TD4_, TV4_ = cfg.TM, cfg.TN, cfg.TK, cfg.TQ4, cfg.TD4, cfg.TV4  # for array shapes
    BUF = max(1, max(cfg.BR, cfg.BC) * max(cfg.D, cfg.DV) // cfg.NT)  # staging registers for one tile
    scores, dp_product = score_products(cfg)
    load_row_stats, probabilities = softmax_backward(cfg)
    key_products, write_dk_dv = key_gradients(cfg, element)
    add_dq = query_gradients(cfg)

    @cuda.jit
    def flash_bwd(Q, K, V, dO, LSE, Dvec, dQ_acc, dK, dV, n_q, n_k, d, d_v, scale, scale_log2, causal):
        smem = shared_floats()  # the regions of cfg.smem_layout()
        tid = uint64(cuda.threadIdx.x)
        bh = uint64(cuda.blockIdx.y)  # which (batch, head)
        kv_head = bh  # its K/V head: the same (grouped-query attention has no backward yet)
        k_start = uint64(cuda.blockIdx.x) * BC  # first key of K_j
        n_q, n_k, d, d_v = uint64(n_q), uint64(n_k), uint64(d), uint64(d_v)
        q_off, o_off = bh * n_q * d, bh * n_q * d_v  # this head's Q, dO (and dQ)
        k_off, v_off = kv_head * n_k * d, kv_head * n_k * d_v  # its K, V (and dK, dV)
        ct, row0 = tid % CT, (tid // CT) * TM  # its keys and rows in S_ij (and dQ_i's columns, rows)
        cc, k0 = tid % CC, (tid // CC) * TK  # its columns and keys in dK_j, dV_j

        s = cuda.local.array((TM_, TN_), float32)  # its piece of S_ij
        dp = cuda.local.array((TM_, TN_), float32)  # its piece of dP_ij
        dk = cuda.local.array((TK_, TD4_, 4), float32)  # its piece of dK_j, for the whole loop
        dv = cuda.local.array((TK_, TV4_, 4), float32)  # its piece of dV_j, for the whole loop
        dq = cuda.local.array((TM_, TQ4_, 4), float32)  # its piece of dQ_i, for one query tile
        af = cuda.local.array((TM_, 4), float32)  # fragments read from shared memory
        bf = cuda.local.array((TN_, 4), float32)
        pf = cuda.local.array(TK_, float32)
        sf = cuda.local.array(TK_, float32)
        xf = cuda.local.array(4, float32)
        kf = cuda.local.array((TQ4_, 4), float32)
        buf = cuda.local.array(BUF, float32)  # staging registers for tile loads
        for kk in range(TK):
            for e in range(FOUR):
                for t in range(TD4):
                    dk[kk, t, e] = float32(0.0)
                for t in range(TV4):
                    dv[kk, t, e] = float32(0.0)

        load_tile(K, k_off, k_start, n_k, d, smem, K_OFF, QS, BC, D, tid, NT, W, buf, widen)  # K_j, once
        load_tile(V, v_off, k_start, n_k, d_v, smem, V_OFF, OS, BC, DV, tid, NT, W, buf, widen)  # V_j, once
        for q_start in range(ZERO, n_q, BR):
            q_end = min(q_start + BR, n_q)
            if key_stop(q_end, n_q, n_k, causal) <= k_start:
                continue  # causal: not even the tile's last row sees K_j (the same for every thread)
            cuda.syncthreads()  # no thread still reads Q_i, dO_i, P_ij, dS_ij of the last query tile
            load_tile(Q, q_off, q_start, n_q, d, smem, Q_OFF, QS, BR, D, tid, NT, W, buf, widen)
            load_tile(dO, o_off, q_start, n_q, d_v, smem, O_OFF, OS, BR, DV, tid, NT, W, buf, widen)
            load_row_stats(smem, LSE, Dvec, bh * n_q, q_start, n_q, tid)
            cuda.syncthreads()  # Q_i, dO_i, lse_i, D_i (and, first time, K_j, V_j) are written before reads
            scores(smem, s, af, bf, row0, ct)
            dp_product(smem, dp, af, bf, row0, ct)
            masked = k_start + BC > key_stop(q_start + ONE, n_q, n_k, causal)  # the forward's mask rule
            probabilities(smem, s, dp, q_start, k_start, row0, ct, n_q, n_k, causal, masked, scale_log2)
            cuda.syncthreads()  # P_ij and dS_ij are fully written before any thread reads them
            key_products(smem, dk, dv, pf, sf, xf, k0, cc)
            add_dq(smem, dq, af, kf, dQ_acc, q_off, q_start, row0, ct, n_q, d)

        write_dk_dv(dk, dv, dK, dV, k_off, v_off, k_start, k0, cc, n_k, d, d_v, scale)

    return flash_bwd


def build(cfg: BackwardTileConfig, dtype: str, vector: int | None = None):
    """What v1 builds: its kernel for the tiling ``cfg`` and inputs of ``dtype`` ('float16', 'bfloat16', 'float32'),
    ``vector`` elements per thread and global load (None: ``vector_width``'s default for the dtype)."""
    return make_kernel(cfg, vector_width(dtype, vector), elements.kernel_element(dtype))
