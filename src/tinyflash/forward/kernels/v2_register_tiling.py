"""Kernel v2: register tiling, the first kernel whose threads split each tile of scores between
them, as of commit faa8b1f.

What changed since v1:

* A block of NT threads computes a BR × BC tile of scores S_ij, each thread a TM × TN piece of it
  in registers (TM rows, TN keys strided by CT; ``tiling.py``), from fragments of Q_i and K_j
  that it reads from shared memory, 4 columns of d at a time. v1 kept a whole row of S_ij, Q_i
  and O_i per thread, which at d = 128 spills to local memory.
* The CT threads of a row each hold part of it: the row max (at the end, the row sum) is
  exchanged through shared memory, and P_ij goes through shared memory too (over K_j, no longer
  needed), so that each thread multiplies its rows of P_ij by its columns of V_j, one key a step.
* Scaling, masking and each thread's share of the row max are one loop over its scores; the
  mask applies only to a tile that needs it, a flag that the loop tests at every score.
* Tiles are loaded by the "walk" loader of its time (:func:`load_tile_walk`): each thread keeps
  its columns and walks down the rows, advancing two indices by constant steps, each load
  followed by its store.

The kernel body reads like stage 1's loop (``tinyflash.forward.blocked``), one device function
per phase: scores, scale-mask-row max, rescale, P·V, epilogue. Who owns which rows, keys and
columns, and where each tile lives in shared memory, is in ``tiling.py``.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, uint64

from ...core.masks import key_stop
from ...core.online_softmax import LN2
from ...gpu.loads import load_tile_ragged
from ...gpu import elements
from ...gpu.runtime import device_function, u
from ...gpu.smem import shared_floats
from .tiling import TileConfig

NEG_INF = float32(-np.inf)
ZERO, ONE, FOUR = u(0), u(1), u(4)
key_stop = device_function(key_stop)  # the causal rule of tinyflash.core.masks, compiled for the GPU


@cuda.jit(device=True, inline="always")
def load_tile_walk(src, src_off, start, n_rows, n_cols, dst, dst_off, stride, ROWS, COLS, tid, NT, widen):
    """Copy rows start .. start+ROWS of one head's (n_rows × n_cols) matrix into shared memory, as
    float32 (``widen``), zero-padded to ROWS × COLS (what ``tinyflash.gpu.loads.load_tile`` does since v3).

    Consecutive threads take consecutive columns, so a warp reads consecutive addresses
    (coalesced). ROWS, COLS and NT are constants, so the branches on them vanish at compile time.
    When NT and COLS divide one another, each thread keeps its columns and walks down the rows,
    advancing two indices by constant steps: a few instructions per element, but the loop length
    is not a constant, so its loads are not all issued up front (in the PTX, each load is followed
    by its store). Other head dims: one bounds check and a division per element (``load_tile_ragged``).
    """
    if NT % COLS == 0 or COLS % NT == 0:
        r_step = NT // COLS if NT >= COLS else ONE  # rows between two loads of one thread
        for c_slot in range(COLS // NT if COLS > NT else ONE):  # columns per thread (1 unless COLS > NT)
            c = tid % COLS + c_slot * NT
            r = tid // COLS if NT >= COLS else ZERO
            rows_end = min(ROWS, n_rows - start) if c < n_cols else ZERO  # rows inside the matrix
            g = src_off + (start + r) * n_cols + c  # index into src
            sh = dst_off + r * stride + c  # index into dst
            while r < rows_end:
                dst[sh] = widen(src[g])
                r += r_step
                g += r_step * n_cols
                sh += r_step * stride
            while r < ROWS:  # past the end: zeros
                dst[sh] = float32(0.0)
                r += r_step
                sh += r_step * stride
    else:  # odd head dims: one division per element
        load_tile_ragged(src, src_off, start, n_rows, n_cols, dst, dst_off, stride, ROWS, COLS, tid, NT, widen)


def stepwise(load, fma, STEP, END):
    """A device function that accumulates a product over END columns, STEP at a time, from shared memory.

    ``load(smem, x, y, row0, ct, k)`` reads one step's operand fragments into registers x, y;
    ``fma(out, x, y)`` multiplies them into ``out``. One set of fragment registers: each step's
    loads, then its multiply-adds, which wait for those loads.
    END is a multiple of STEP; both are unsigned constants.
    """

    @cuda.jit(device=True, inline="always")
    def product(smem, out, x, y, row0, ct):
        for k in range(ZERO, END, STEP):
            load(smem, x, y, row0, ct, k)
            fma(out, x, y)

    return product


def loads(cfg: TileConfig, widen):
    """The loads of each key tile: ``load_kv``, K_j then V_j from HBM into shared memory as float32
    (``widen``), each by the walk loader. Q_i's load, once per block, is the kernel's."""
    BC, NT, D, DV, KS = u(cfg.BC), u(cfg.NT), u(cfg.D), u(cfg.DV), u(cfg.KS)
    _, K_OFF, V_OFF, _ = (u(region.offset) for region in cfg.smem_layout())

    @cuda.jit(device=True, inline="always")
    def load_kv(K, V, k_off, v_off, k_start, n_k, d, d_v, smem, tid):
        """K_j, then V_j, into shared memory."""
        load_tile_walk(K, k_off, k_start, n_k, d, smem, K_OFF, KS, BC, D, tid, NT, widen)
        load_tile_walk(V, v_off, k_start, n_k, d_v, smem, V_OFF, DV, BC, DV, tid, NT, widen)

    return load_kv


def products(cfg: TileConfig):
    """The two inner products, from shared memory into registers: ``scores`` (S_ij = Q_i K_jᵀ over d,
    4 columns a step) and ``pv_product`` (acc += P_ij V_j over the keys, 1 a step), each step's
    fragments loaded and then multiplied (:func:`stepwise`)."""
    TM, D, DV, BC = u(cfg.TM), u(cfg.D), u(cfg.DV), u(cfg.BC)
    CT, TN, TO4 = u(cfg.CT), u(cfg.TN), u(cfg.TO4)
    QS, KS, PS = u(cfg.QS), u(cfg.KS), u(cfg.PS)
    Q_OFF, K_OFF, V_OFF, _ = (u(region.offset) for region in cfg.smem_layout())  # P_ij reuses K_OFF

    @cuda.jit(device=True, inline="always")
    def load_qk(smem, qf, kf, row0, ct, kk):
        """qf[i, :] = Q_i[row0 + i, kk:kk+4] and kf[jj, :] = K_j[ct + CT·jj, kk:kk+4] from shared memory."""
        for i in range(TM):
            for e in range(FOUR):
                qf[i, e] = smem[Q_OFF + (row0 + i) * QS + kk + e]
        for jj in range(TN):
            for e in range(FOUR):
                kf[jj, e] = smem[K_OFF + (ct + CT * jj) * KS + kk + e]

    @cuda.jit(device=True, inline="always")
    def fma_qk(s, qf, kf):
        """s += qf kfᵀ: TM·TN·4 multiply-adds on registers."""
        for e in range(FOUR):
            for i in range(TM):
                for jj in range(TN):
                    s[i, jj] += qf[i, e] * kf[jj, e]

    @cuda.jit(device=True, inline="always")
    def load_pv(smem, pf, vf, row0, ct, c):
        """pf[i] = P_ij[row0 + i, c] and vf[t, :] = V_j[c, its column group t]."""
        for i in range(TM):
            pf[i] = smem[K_OFF + c * PS + row0 + i]
        for t in range(TO4):
            for e in range(FOUR):
                vf[t, e] = smem[V_OFF + c * DV + (ct + CT * t) * FOUR + e]

    @cuda.jit(device=True, inline="always")
    def fma_pv(acc, pf, vf):
        """acc += pfᵀ vf: TM·TO4·4 multiply-adds on registers."""
        for i in range(TM):
            for t in range(TO4):
                for e in range(FOUR):
                    acc[i, t, e] += pf[i] * vf[t, e]

    qk_product = stepwise(load_qk, fma_qk, FOUR, D)  # S_ij += Q_i K_jᵀ over d, 4 columns a step
    pv_product = stepwise(load_pv, fma_pv, ONE, BC)  # acc += P_ij V_j over the keys, 1 a step

    @cuda.jit(device=True, inline="always")
    def scores(smem, s, qf, kf, row0, ct):
        """S_ij = Q_i K_jᵀ (not yet scaled) for this thread's TM × TN piece, in registers."""
        for i in range(TM):
            for jj in range(TN):
                s[i, jj] = float32(0.0)
        qk_product(smem, s, qf, kf, row0, ct)

    return scores, pv_product


def softmax(cfg: TileConfig):
    """The online softmax of a tile, from S_ij in registers to P_ij in shared memory:
    ``scale_mask_row_max`` (scale, mask and each thread's share of the row max, in one loop),
    ``rescale`` (m_i, l_i and acc to the new row max; P_ij replaces S_ij) and ``store_p``."""
    TM, CT, TN, TO4, PS = u(cfg.TM), u(cfg.CT), u(cfg.TN), u(cfg.TO4), u(cfg.PS)
    _, K_OFF, _, R_OFF = (u(region.offset) for region in cfg.smem_layout())  # P_ij reuses K_OFF

    @cuda.jit(device=True, inline="always")
    def scale_mask_row_max(smem, s, q_start, k_start, row0, ct, n_q, n_k, causal, needs_mask, scale_log2):
        """In one loop over this thread's scores: S_ij = scale · S_ij (in base 2), -inf where masked
        (if the tile ``needs_mask``: keys at or past Nk and, if causal, after the diagonal), and
        each thread's max of its keys, exchanged through shared memory (the max over the CT threads
        of a row is the first line of :func:`rescale`)."""
        for i in range(TM):
            stop = key_stop(q_start + row0 + i + ONE, n_q, n_k, causal)  # keys < stop are allowed for this row
            m_part = NEG_INF
            for jj in range(TN):
                x = s[i, jj] * scale_log2
                if needs_mask and k_start + ct + CT * jj >= stop:
                    x = NEG_INF
                s[i, jj] = x
                m_part = max(m_part, x)
            smem[R_OFF + (row0 + i) * CT + ct] = m_part
        cuda.syncthreads()  # partial maxima are visible; every thread is done reading Ks (P overwrites it)

    @cuda.jit(device=True, inline="always")
    def rescale(smem, s, m_i, l_i, acc, row0):
        """m_new = max(m_i, rowmax(S_ij)); alpha = exp(m_i - m_new) rescales l_i and acc;
        P_ij = exp(S_ij - m_new) replaces S_ij."""
        for i in range(TM):
            m_new = m_i[i]
            for c in range(CT):
                m_new = max(m_new, smem[R_OFF + (row0 + i) * CT + c])
            m_safe = m_new if m_new != NEG_INF else float32(0.0)  # no allowed key yet: avoid -inf - -inf
            alpha = math.exp2(m_i[i] - m_safe)
            m_i[i] = m_new
            l_i[i] *= alpha
            for t in range(TO4):
                for e in range(FOUR):
                    acc[i, t, e] *= alpha
            for jj in range(TN):
                s[i, jj] = math.exp2(s[i, jj] - m_safe)  # P_ij, unnormalised
                l_i[i] += s[i, jj]  # this thread's share of the row sum

    @cuda.jit(device=True, inline="always")
    def store_p(smem, s, row0, ct):
        """P_ijᵀ into shared memory (over K_j): TM consecutive floats per key, one vector store."""
        for jj in range(TN):
            for i in range(TM):
                smem[K_OFF + (ct + CT * jj) * PS + row0 + i] = s[i, jj]

    return scale_mask_row_max, rescale, store_p


def output(cfg: TileConfig, narrow):
    """The epilogue, the block's only writes to HBM: ``epilogue`` (O_i = acc / l_i as the input's
    element type, ``narrow``; lse_i = m_i + log l_i)."""
    TM, CT, TO4 = u(cfg.TM), u(cfg.CT), u(cfg.TO4)
    _, _, _, R_OFF = (u(region.offset) for region in cfg.smem_layout())

    @cuda.jit(device=True, inline="always")
    def epilogue(smem, acc, m_i, l_i, O, LSE, o_off, lse_off, q_start, row0, ct, n_q, d_v):
        """O_i = acc / l_i, lse_i = m_i + log(l_i): the row sums are shares of CT threads, added first."""
        cuda.syncthreads()  # every thread is done reading the row maxima before their place is reused
        for i in range(TM):
            smem[R_OFF + (row0 + i) * CT + ct] = l_i[i]
        cuda.syncthreads()  # all shares are written before they are summed
        for i in range(TM):
            row = q_start + row0 + i
            l_row = float32(0.0)
            for c in range(CT):
                l_row += smem[R_OFF + (row0 + i) * CT + c]
            if row < n_q:
                inv_l = float32(1.0) / l_row if l_row != 0 else float32(0.0)  # fully masked row: O = 0
                for t in range(TO4):
                    for e in range(FOUR):
                        col = (ct + CT * t) * FOUR + e
                        if col < d_v:
                            O[o_off + row * d_v + col] = narrow(acc[i, t, e] * inv_l)
                if ct == ZERO:
                    LSE[lse_off + row] = (m_i[i] + math.log2(l_row)) * LN2 if l_row != 0 else NEG_INF

    return epilogue


@lru_cache(maxsize=None)
def make_kernel(cfg: TileConfig, element: str | None = None):
    """``flash_fwd`` for one :class:`TileConfig`; ``element`` 'bfloat16' for inputs of bfloat16 patterns (``gpu/elements.py``).

    The kernel is stage 1's loop over the pieces above: :func:`loads`, :func:`products`,
    :func:`softmax` and :func:`output`."""
    widen, narrow = elements.widen(element), elements.narrow(element)  # an element as float32, and back
    cfg.validate()
    load_kv = loads(cfg, widen)
    scores, pv_product = products(cfg)
    scale_mask_row_max, rescale, store_p = softmax(cfg)
    epilogue = output(cfg, narrow)
    # Every constant is unsigned (tinyflash.gpu.runtime.u); array shapes must be plain ints.
    BR, TM, NT, D = (u(x) for x in (cfg.BR, cfg.TM, cfg.NT, cfg.D))
    BC, CT, TO4, QS = u(cfg.BC), u(cfg.CT), u(cfg.TO4), u(cfg.QS)
    Q_OFF, _, _, _ = (u(region.offset) for region in cfg.smem_layout())
    TM_, TN_, TO4_ = cfg.TM, cfg.TN, cfg.TO4  # for array shapes

    @cuda.jit
    def flash_fwd(Q, K, V, O, LSE, n_q, n_k, d, d_v, scale_log2, causal, kv_group):
        smem = shared_floats()  # the regions of cfg.smem_layout(): Q_i, K_j (then P_ij), V_j, row max / sum
        tid = uint64(cuda.threadIdx.x)
        bh = uint64(cuda.blockIdx.y)  # which (batch, head)
        q_start = uint64(cuda.blockIdx.x) * BR  # first query row of Q_i
        n_q, n_k, d, d_v = uint64(n_q), uint64(n_k), uint64(d), uint64(d_v)
        kv_head = bh // uint64(kv_group)  # the K/V head this query head reads (GQA: kv_group heads share one)
        q_off, o_off = bh * n_q * d, bh * n_q * d_v  # this query head
        k_off, v_off = kv_head * n_k * d, kv_head * n_k * d_v  # its K/V head
        ct = tid % CT
        row0 = (tid // CT) * TM  # this thread's first row within the tile

        s = cuda.local.array((TM_, TN_), float32)  # this thread's piece of S_ij, then of P_ij
        acc = cuda.local.array((TM_, TO4_, 4), float32)  # its piece of the unnormalised O_i
        m_i = cuda.local.array(TM_, float32)  # running max (base 2) of its rows
        l_i = cuda.local.array(TM_, float32)  # its share of the running denominators
        qf = cuda.local.array((TM_, 4), float32)  # Q_i[its rows, kk:kk+4]: one vector load per row
        kf = cuda.local.array((TN_, 4), float32)  # K_j[its keys, kk:kk+4]
        pf = cuda.local.array(TM_, float32)  # P_ij[its rows, c]
        vf = cuda.local.array((TO4_, 4), float32)  # V_j[c, its columns]
        for i in range(TM):
            m_i[i] = NEG_INF
            l_i[i] = float32(0.0)
            for t in range(TO4):
                for e in range(FOUR):
                    acc[i, t, e] = float32(0.0)

        load_tile_walk(Q, q_off, q_start, n_q, d, smem, Q_OFF, QS, BR, D, tid, NT, widen)  # Q_i, once
        k_stop = key_stop(min(q_start + BR, n_q), n_q, n_k, causal)  # causal: later key tiles are skipped
        for k_start in range(ZERO, k_stop, BC):
            cuda.syncthreads()  # Q_i is written (1st tile); no thread still reads Ps/Vs of the last tile
            load_kv(K, V, k_off, v_off, k_start, n_k, d, d_v, smem, tid)
            cuda.syncthreads()  # K_j and V_j are fully written before any thread reads them
            scores(smem, s, qf, kf, row0, ct)
            needs_mask = k_start + BC > key_stop(q_start + ONE, n_q, n_k, causal)  # past the first row's keys
            scale_mask_row_max(smem, s, q_start, k_start, row0, ct, n_q, n_k, causal, needs_mask,
                               scale_log2)  # (has a barrier: after it, Ks may be overwritten)
            rescale(smem, s, m_i, l_i, acc, row0)
            store_p(smem, s, row0, ct)
            cuda.syncthreads()  # P_ij is fully written before any thread reads it
            pv_product(smem, acc, pf, vf, row0, ct)  # P·V: acc += P_ij V_j

        epilogue(smem, acc, m_i, l_i, O, LSE, o_off, bh * n_q, q_start, row0, ct, n_q, d_v)

    return flash_fwd


def build(cfg: TileConfig, dtype: str):
    """What v2 builds: its kernel for the tiling ``cfg`` and inputs of ``dtype`` ('float16', 'bfloat16', 'float32')."""
    return make_kernel(cfg, elements.kernel_element(dtype))
