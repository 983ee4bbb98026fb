"""Kernel v5: register tiling with branch-free inner loops, K_j and V_j loaded together, and
float16 tiles read 4 elements per thread. The version ``cuda_attention`` runs by default.

What changed since v4:

* The last step of both inner products (S_ij = Q_i K_jᵀ over d, P_ij V_j over the keys) is
  peeled out of the loop (:func:`pipelined`), so the loop body has no branch. Nsight Compute
  showed that v4's warps waited most at the first multiply-add after that branch: the loads of
  the next step could only be issued behind it.
* All global loads of K_j and V_j are issued before the first store to shared memory: a tile
  pair costs one memory latency instead of two.
* float16 tiles are read 4 elements (one 8-byte vector load) per thread and load; float32 ones
  1 per thread (:func:`vector_width`).

The kernel body reads like stage 1's loop (``tinyflash.forward.blocked``), one device function
per phase: scores, mask, row max, rescale, P·V, epilogue. Who owns which rows, keys and columns,
and where each tile lives in shared memory, is in ``tiling.py``.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, uint64

from ...core.masks import key_stop
from ...core.online_softmax import LN2
from ...gpu.loads import fetch_tile, is_full_tile, load_tile, load_tile_ragged, store_tile, vector_width
from ...gpu import elements
from ...gpu.runtime import device_function, u
from ...gpu.smem import shared_floats
from .tiling import TileConfig

NEG_INF = float32(-np.inf)
ZERO, ONE, TWO, FOUR = u(0), u(1), u(2), u(4)
key_stop = device_function(key_stop)  # the causal rule of tinyflash.core.masks, compiled for the GPU


def pipelined(load, fma, STEP, END):
    """A device function that accumulates a product over END columns, STEP at a time, from shared memory.

    ``load(smem, x, y, row0, ct, k)`` reads one step's operand fragments into registers x, y;
    ``fma(out, x, y)`` multiplies them into ``out``. Two sets of fragment registers (a, b) alternate:
    the loads of the next step are in flight while the current one is multiplied, which hides the
    shared-memory latency. The last step is outside the loop so that the loop body has no branch:
    a branch would keep the compiler from moving the next loads up among the multiply-adds.
    END is a multiple of 2·STEP; both are unsigned constants.
    """
    TWO_STEPS = STEP + STEP

    @cuda.jit(device=True, inline="always")
    def product(smem, out, xa, ya, xb, yb, row0, ct):
        load(smem, xa, ya, row0, ct, ZERO)
        for k in range(ZERO, END - TWO_STEPS, TWO_STEPS):
            load(smem, xb, yb, row0, ct, k + STEP)
            fma(out, xa, ya)
            load(smem, xa, ya, row0, ct, k + TWO_STEPS)
            fma(out, xb, yb)
        load(smem, xb, yb, row0, ct, END - STEP)
        fma(out, xa, ya)
        fma(out, xb, yb)

    return product


def staging(cfg: TileConfig) -> tuple[int, int]:
    """The staging registers of the tile loads, ``buf``: KB, the elements of K_j per thread (V_j's
    follow them, when NT divides evenly), and BUF, its length (Q_i, or K_j and V_j together)."""
    KB = cfg.BC * cfg.D // cfg.NT  # elements of K_j per thread (when NT divides evenly)
    BUF = max(1, cfg.BR * cfg.D // cfg.NT, KB + cfg.BC * cfg.DV // cfg.NT)  # Q_i, or K_j and V_j together
    return KB, BUF


def loads(cfg: TileConfig, vector: int, widen):
    """The loads of each key tile: ``load_kv``, K_j and V_j from HBM into shared memory as float32
    (``widen``), ``vector`` elements per thread and load, all of a full tile pair's loads (into
    ``buf``, :func:`staging`) before the first store. Q_i's load, once per block, is the kernel's."""
    BC, NT, D, DV, KS, W = (u(x) for x in (cfg.BC, cfg.NT, cfg.D, cfg.DV, cfg.KS, vector))
    _, K_OFF, V_OFF, _ = (u(region.offset) for region in cfg.smem_layout())
    KB = u(staging(cfg)[0])  # where V_j's elements start in buf

    @cuda.jit(device=True, inline="always")
    def load_kv(K, V, k_off, v_off, k_start, n_k, d, d_v, smem, tid, buf):
        """K_j and V_j into shared memory; for full tiles all loads in flight before the first store."""
        if is_full_tile(k_start, n_k, d, BC, D, NT, W) and is_full_tile(k_start, n_k, d_v, BC, DV, NT, W):
            fetch_tile(K, k_off, k_start, d, BC, D, tid, NT, W, buf, ZERO, widen)
            fetch_tile(V, v_off, k_start, d_v, BC, DV, tid, NT, W, buf, KB, widen)
            store_tile(smem, K_OFF, KS, BC, D, tid, NT, W, buf, ZERO)
            store_tile(smem, V_OFF, DV, BC, DV, tid, NT, W, buf, KB)
        else:  # the ragged last tile, or a padded head dim
            load_tile_ragged(K, k_off, k_start, n_k, d, smem, K_OFF, KS, BC, D, tid, NT, widen)
            load_tile_ragged(V, v_off, k_start, n_k, d_v, smem, V_OFF, DV, BC, DV, tid, NT, widen)

    return load_kv


def products(cfg: TileConfig):
    """The two inner products, from shared memory into registers: ``scores`` (S_ij = scale · Q_i K_jᵀ
    over d, 4 columns a step) and ``pv_product`` (acc += P_ij V_j over the keys, 2 a step), each
    with two sets of fragment registers that alternate (:func:`pipelined`)."""
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
        """pf[u, i] = P_ij[row0 + i, c + u] and vf[u, t, :] = V_j[c + u, its column group t], u < 2."""
        for step in range(TWO):
            for i in range(TM):
                pf[step, i] = smem[K_OFF + (c + step) * PS + row0 + i]
            for t in range(TO4):
                for e in range(FOUR):
                    vf[step, t, e] = smem[V_OFF + (c + step) * DV + (ct + CT * t) * FOUR + e]

    @cuda.jit(device=True, inline="always")
    def fma_pv(acc, pf, vf):
        """acc += pf[u]ᵀ vf[u] for both keys u: 2·TM·TO4·4 multiply-adds on registers."""
        for step in range(TWO):
            for i in range(TM):
                for t in range(TO4):
                    for e in range(FOUR):
                        acc[i, t, e] += pf[step, i] * vf[step, t, e]

    qk_product = pipelined(load_qk, fma_qk, FOUR, D)  # S_ij += Q_i K_jᵀ over d, 4 columns a step
    pv_product = pipelined(load_pv, fma_pv, TWO, BC)  # acc += P_ij V_j over the keys, 2 a step

    @cuda.jit(device=True, inline="always")
    def scores(smem, s, qa, ka, qb, kb, row0, ct, scale_log2):
        """S_ij = scale · Q_i K_jᵀ (in base 2) for this thread's TM × TN piece, in registers."""
        for i in range(TM):
            for jj in range(TN):
                s[i, jj] = float32(0.0)
        qk_product(smem, s, qa, ka, qb, kb, row0, ct)
        for i in range(TM):
            for jj in range(TN):
                s[i, jj] *= scale_log2

    return scores, pv_product


def softmax(cfg: TileConfig):
    """The online softmax of a tile, from S_ij in registers to P_ij in shared memory: ``mask``
    (only on a tile that needs it), ``row_max`` (each thread's share, exchanged), ``rescale``
    (m_i, l_i and acc to the new row max; P_ij replaces S_ij) and ``store_p``."""
    TM, CT, TN, TO4, PS = u(cfg.TM), u(cfg.CT), u(cfg.TN), u(cfg.TO4), u(cfg.PS)
    _, K_OFF, _, R_OFF = (u(region.offset) for region in cfg.smem_layout())  # P_ij reuses K_OFF

    @cuda.jit(device=True, inline="always")
    def mask(s, q_start, k_start, row0, ct, n_q, n_k, causal):
        """S_ij = -inf for keys at or past Nk (the ragged last tile) and, if causal, after the diagonal."""
        for i in range(TM):
            stop = key_stop(q_start + row0 + i + ONE, n_q, n_k, causal)  # keys < stop are allowed for this row
            for jj in range(TN):
                if k_start + ct + CT * jj >= stop:
                    s[i, jj] = NEG_INF

    @cuda.jit(device=True, inline="always")
    def row_max(smem, s, row0, ct):
        """rowmax(S_ij), step 1 of 2: each thread's max of its keys, exchanged through shared memory
        (step 2, the max over the CT threads of a row, is the first line of :func:`rescale`)."""
        for i in range(TM):
            m_part = NEG_INF
            for jj in range(TN):
                m_part = max(m_part, s[i, jj])
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

    return mask, row_max, rescale, store_p


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
def make_kernel(cfg: TileConfig, vector: int = 1, element: str | None = None):
    """``flash_fwd`` for one :class:`TileConfig`, reading full tiles ``vector`` elements per
    thread and load (1, or 4: see :func:`vector_width`; 4 needs inputs aligned to 4 elements);
    ``element`` 'bfloat16' for inputs of bfloat16 patterns (``gpu/elements.py``).

    The kernel is stage 1's loop over the pieces above: :func:`loads`, :func:`products`,
    :func:`softmax` and :func:`output`."""
    cfg.validate()
    widen, narrow = elements.widen(element), elements.narrow(element)  # an element as float32, and back
    if vector not in (1, 4):
        raise ValueError(f"vector must be 1 or 4; got {vector!r}")
    load_kv = loads(cfg, vector, widen)
    scores, pv_product = products(cfg)
    mask, row_max, rescale, store_p = softmax(cfg)
    epilogue = output(cfg, narrow)
    # Every constant is unsigned (tinyflash.gpu.runtime.u); array shapes must be plain ints.
    BR, BC, TM, NT, D, W = (u(x) for x in (cfg.BR, cfg.BC, cfg.TM, cfg.NT, cfg.D, vector))
    CT, TO4, QS = u(cfg.CT), u(cfg.TO4), u(cfg.QS)
    Q_OFF, _, _, _ = (u(region.offset) for region in cfg.smem_layout())
    TM_, TN_, TO4_ = cfg.TM, cfg.TN, cfg.TO4  # for array shapes
    _, BUF = staging(cfg)

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
        qa = cuda.local.array((TM_, 4), float32)  # Q_i[its rows, kk:kk+4]: one vector load per row
        ka = cuda.local.array((TN_, 4), float32)  # K_j[its keys, kk:kk+4]
        qb = cuda.local.array((TM_, 4), float32)  # the same for the next 4 columns
        kb = cuda.local.array((TN_, 4), float32)
        pa = cuda.local.array((2, TM_), float32)  # P_ij[its rows, c:c+2]
        va = cuda.local.array((2, TO4_, 4), float32)  # V_j[c:c+2, its columns]
        pb = cuda.local.array((2, TM_), float32)  # the same for the next 2 keys
        vb = cuda.local.array((2, TO4_, 4), float32)
        buf = cuda.local.array(BUF, float32)  # staging registers for tile loads
        for i in range(TM):
            m_i[i] = NEG_INF
            l_i[i] = float32(0.0)
            for t in range(TO4):
                for e in range(FOUR):
                    acc[i, t, e] = float32(0.0)

        load_tile(Q, q_off, q_start, n_q, d, smem, Q_OFF, QS, BR, D, tid, NT, W, buf, widen)  # Q_i, once
        k_stop = key_stop(min(q_start + BR, n_q), n_q, n_k, causal)  # causal: later key tiles are skipped
        first_row_stop = key_stop(q_start + ONE, n_q, n_k, causal)  # the keys that Q_i's first row may see
        for k_start in range(ZERO, k_stop, BC):
            cuda.syncthreads()  # Q_i is written (1st tile); no thread still reads Ps/Vs of the last tile
            load_kv(K, V, k_off, v_off, k_start, n_k, d, d_v, smem, tid, buf)
            cuda.syncthreads()  # K_j and V_j are fully written before any thread reads them
            scores(smem, s, qa, ka, qb, kb, row0, ct, scale_log2)
            if k_start + BC > first_row_stop:  # the tile reaches past them: some pair is masked
                mask(s, q_start, k_start, row0, ct, n_q, n_k, causal)
            row_max(smem, s, row0, ct)  # (has a barrier: after it, Ks may be overwritten)
            rescale(smem, s, m_i, l_i, acc, row0)
            store_p(smem, s, row0, ct)
            cuda.syncthreads()  # P_ij is fully written before any thread reads it
            pv_product(smem, acc, pa, va, pb, vb, row0, ct)  # P·V: acc += P_ij V_j

        epilogue(smem, acc, m_i, l_i, O, LSE, o_off, bh * n_q, q_start, row0, ct, n_q, d_v)

    return flash_fwd


def build(cfg: TileConfig, dtype: str, vector: int | None = None):
    """What v5 builds: its kernel for the tiling ``cfg`` and inputs of ``dtype`` ('float16', 'bfloat16', 'float32'),
    ``vector`` elements per thread and global load (None: :func:`vector_width`'s default for the dtype)."""
    return make_kernel(cfg, vector_width(dtype, vector), elements.kernel_element(dtype))
