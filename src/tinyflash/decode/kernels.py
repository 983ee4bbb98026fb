"""Split-KV decoding as numba.cuda kernels: a split kernel, then a combine kernel.

**Split kernel** (:func:`make_split_kernel`): one thread block per (split, K/V head of one
sequence, chunk of packed query rows). With grouped-query attention, the kv_group query heads that
share a K/V head (times Nq query rows each) are *packed* into the block's rows, so each K/V byte
is read from HBM once for all of them. The block walks its split's keys:

    threads:  lane = tid % TD  owns columns [lane·VEC, lane·VEC + VEC) of a key row
              slot = tid // TD owns keys  k_begin + slot, + KP, + 2·KP, ...   (KP = NT / TD slots)
    per step, each slot takes UNROLL keys (and the next step's loads are already in flight):
        K_j, V_j rows: one VEC-element vector load per thread (16 bytes: 8 float16 or 4 float32);
                       the TD lanes of a slot read one whole row, neighbouring slots the next rows
        S_ij = scale · q_r · K_j      partial dot product over the lane's columns, then a sum over
                                      the TD lanes of the slot (shuffles: tinyflash.gpu.warp)
        mask                           keys past the split, the sequence, or the diagonal: -inf
        m_new, alpha, P, l, acc        the online softmax, in registers, for each packed row r

No barrier and no shared memory in the loop: each slot keeps its own state (m, l, acc) for its
keys. After the loop the KP states are merged through shared memory with the online softmax's
rule (:func:`tinyflash.core.online_softmax.merge_weights`) and the block writes its partial
(O_s, lse_s). The keys are found through a block table when the cache is paged
(``decode/paged.py``), else at ``(b·H_kv + kv_head)·Nk + key``.

**Combine kernel** (:func:`make_combine_kernel`): one thread per (packed row, column) merges
the splits' partials with the same rule and writes O and lse.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, uint64

from ..core.masks import key_stop
from ..core.online_softmax import LN2, LOG2E, merge_weights
from ..gpu.loads import vector_load
from ..gpu.runtime import device_function, simulator_enabled, u
from ..gpu.smem import shared_floats
from ..gpu.warp import group_sum

NEG_INF = float32(-np.inf)
ZERO, ONE = u(0), u(1)
key_stop = device_function(key_stop)  # the causal rule of tinyflash.core.masks, compiled for the GPU
merge_weights = device_function(merge_weights)  # the online softmax's merge, from tinyflash.core

GPU_THREADS = 128  # threads per block on a GPU: 4 warps
SIMULATOR_THREADS = 32  # on the simulator (one Python thread per CUDA thread): one warp
MAX_ROWS = 8  # packed query rows per block at most (their q and acc live in registers)
UNROLL = 2  # keys per slot and step: their loads are in flight together
LOAD_BYTES = 16  # bytes per thread and vector load (ld.global.v4.b32)
COMBINE_THREADS = 128


def threads() -> int:
    return SIMULATOR_THREADS if simulator_enabled() else GPU_THREADS


def lanes(d: int, itemsize: int) -> tuple[int, int, int]:
    """(VEC, D, TD): elements per load, the head dim padded so that TD = D / VEC lanes per key
    row is a power of two (the shuffles sum over groups of TD lanes), and TD."""
    VEC = LOAD_BYTES // itemsize
    TD = 1 << max(0, math.ceil(math.log2(-(-d // VEC))))  # lanes per key row, a power of two
    return VEC, VEC * TD, TD


@lru_cache(maxsize=None)
def make_split_kernel(RB: int, D: int, VEC: int, NT: int, full: bool, page_size: int, unroll: int = UNROLL):
    """The split kernel for RB packed rows per block, head dim padded to D, VEC elements per load,
    NT threads (a multiple of 32), ``unroll`` keys per slot and step; ``full``: d == D (vector
    loads; else one bounds-checked load per element); ``page_size``: 0 for a contiguous cache,
    else the tokens per page of a paged one."""
    TD = D // VEC  # lanes per key row
    KP = NT // TD  # key slots: keys in flight per step and unrolled key
    RB_, D_, VEC_, TD_, KP_, NT_, UNROLL_ = u(RB), u(D), u(VEC), u(TD), u(KP), u(NT), u(unroll)
    STEP = u(KP * unroll)  # keys a block takes per step
    TWO_STEPS = STEP + STEP  # per loop trip (two register sets)
    PAGE = u(max(page_size, 1))
    M_OFF, L_OFF, A_OFF = u(0), u(KP * RB), u(2 * KP * RB)  # shared memory: m, l, acc of every slot
    load_vec = vector_load(VEC)
    lane_sum = group_sum(TD)

    @cuda.jit(device=True, inline="always")
    def row_offset(TABLE, b, bkv, kv_head, key, n_k, h_kv, max_pages, d):
        """Where key ``key`` of this K/V head starts in the flat K (and V) array."""
        if page_size == 0:  # contiguous (B, H_kv, Nk, d)
            return (bkv * n_k + key) * d
        page = uint64(TABLE[b * max_pages + key // PAGE])  # through the block table
        return ((page * h_kv + kv_head) * PAGE + key % PAGE) * d

    @cuda.jit(device=True, inline="always")
    def load_row(src, off, col0, d, out, t):
        """out[t, :] = src[off + col0 : off + col0 + VEC] as float32 (zero past d)."""
        if full:
            x = load_vec(src, off + col0)
            for e in range(VEC_):
                out[t, e] = float32(x[e])
        else:
            for e in range(VEC_):
                out[t, e] = float32(src[off + col0 + e]) if col0 + e < d else float32(0.0)

    @cuda.jit(device=True, inline="always")
    def load_keys(K, V, TABLE, b, bkv, kv_head, key, k_end, n_k, h_kv, max_pages, d, col0, kf, vf):
        """K and V rows of keys key, key + KP, ... (UNROLL of them), this thread's columns, into kf, vf.
        A key past the split reloads the split's last key (its score is masked): no bounds branch."""
        for t in range(UNROLL_):
            key_t = min(key + t * KP_, k_end - ONE)
            off = row_offset(TABLE, b, bkv, kv_head, key_t, n_k, h_kv, max_pages, d)
            load_row(K, off, col0, d, kf, t)
            load_row(V, off, col0, d, vf, t)

    @cuda.jit(device=True, inline="always")
    def update(s, kf, vf, q, m_i, l_i, acc, key, k_end, row_stop):
        """Scores of this step's UNROLL keys for every packed row, masked, folded into (m_i, l_i, acc)."""
        for r in range(RB_):
            m_new = m_i[r]
            for t in range(UNROLL_):
                part = float32(0.0)
                for e in range(VEC_):
                    part += q[r, e] * kf[t, e]
                s[t] = lane_sum(part)  # S_ij = scale · q_r K_j (base 2), summed over the TD lanes
                if key + t * KP_ >= k_end or key + t * KP_ >= row_stop[r]:
                    s[t] = NEG_INF  # mask: past the split or the sequence, or after the diagonal
                m_new = max(m_new, s[t])
            m_safe = m_new if m_new != NEG_INF else float32(0.0)  # no allowed key yet
            alpha = math.exp2(m_i[r] - m_safe)  # rescale: exp(m_old - m_new)
            l_i[r] *= alpha
            for e in range(VEC_):
                acc[r, e] *= alpha
            for t in range(UNROLL_):
                p = math.exp2(s[t] - m_safe)  # P_ij
                l_i[r] += p
                for e in range(VEC_):
                    acc[r, e] += p * vf[t, e]  # P·V
            m_i[r] = m_new

    @cuda.jit(device=True, inline="always")
    def merge_slots(smem, m_i, l_i, acc, O_PART, LSE_PART, part_row0, row0, rows, slot, lane, tid, d):
        """The KP slots' states, merged through shared memory; the block's partial (O_s, lse_s) written."""
        for r in range(RB_):
            if lane == ZERO:
                smem[M_OFF + slot * RB_ + r] = m_i[r]
                smem[L_OFF + slot * RB_ + r] = l_i[r]
            for e in range(VEC_):
                smem[A_OFF + (slot * RB_ + r) * D_ + lane * VEC_ + e] = acc[r, e]
        cuda.syncthreads()  # every slot's state is written before any thread merges them
        for idx in range(tid, RB_ * D_, NT_):
            r, c = idx // D_, idx % D_
            m, l_sum, o = NEG_INF, float32(0.0), float32(0.0)
            for sl in range(KP_):
                m, w_run, w_slot = merge_weights(m, smem[M_OFF + sl * RB_ + r])
                l_sum = float32(l_sum * w_run + smem[L_OFF + sl * RB_ + r] * w_slot)
                o = float32(o * w_run + smem[A_OFF + (sl * RB_ + r) * D_ + c] * w_slot)
            if row0 + r < rows and c < d:
                O_PART[(part_row0 + r) * d + c] = o / l_sum if l_sum != 0 else float32(0.0)
                if c == ZERO:  # lse_s = m + log(l), back from base 2; -inf for an empty split
                    LSE_PART[part_row0 + r] = (m + math.log2(l_sum)) * LN2 if l_sum != 0 else NEG_INF

    @cuda.jit
    def split_kv_decode(Q, K, V, TABLE, LENS, O_PART, LSE_PART, n_q, d, n_k, h_kv, max_pages, scale_log2, causal,
                        kv_group):
        smem = shared_floats()  # m, l, acc of every slot, for the merge at the end
        tid = uint64(cuda.threadIdx.x)
        split, n_splits, bkv = uint64(cuda.blockIdx.x), uint64(cuda.gridDim.x), uint64(cuda.blockIdx.y)
        n_q, d, n_k, h_kv, max_pages = uint64(n_q), uint64(d), uint64(n_k), uint64(h_kv), uint64(max_pages)
        b, kv_head = bkv // h_kv, bkv % h_kv  # which sequence, which of its K/V heads
        rows = uint64(kv_group) * n_q  # packed rows: the group's query heads × their Nq queries
        row0 = uint64(cuda.blockIdx.z) * RB_  # this block's first packed row
        lane, slot = tid % TD_, tid // TD_
        col0 = lane * VEC_  # this thread's first column

        seq_len = uint64(LENS[b])
        chunk = (seq_len + n_splits - ONE) // n_splits  # keys per split, rounded up to whole loop trips
        chunk = (chunk + TWO_STEPS - ONE) // TWO_STEPS * TWO_STEPS
        k_begin = min(split * chunk, seq_len)
        k_end = min(k_begin + chunk, seq_len)

        q = cuda.local.array((RB, VEC), float32)  # scale · log2(e) · q_r[its columns], packed rows r
        acc = cuda.local.array((RB, VEC), float32)  # unnormalised O_s[r, its columns]
        m_i = cuda.local.array(RB, float32)  # running max (base 2) of row r over this slot's keys
        l_i = cuda.local.array(RB, float32)  # running denominator
        row_stop = cuda.local.array(RB, uint64)  # row r may attend keys < row_stop[r]
        ka = cuda.local.array((unroll, VEC), float32)  # K rows of one step's keys, this thread's columns
        va = cuda.local.array((unroll, VEC), float32)  # their V rows
        kb = cuda.local.array((unroll, VEC), float32)  # the same for the next step
        vb = cuda.local.array((unroll, VEC), float32)
        s = cuda.local.array(unroll, float32)  # scores of this step's keys
        q_row0 = bkv * rows + row0  # packed rows of one K/V head are consecutive rows of q
        for r in range(RB_):
            real = row0 + r < rows
            i = (row0 + r) % n_q  # its query index: the last Nq tokens of the sequence
            row_stop[r] = key_stop(i + ONE, n_q, seq_len, causal) if real else ZERO
            for e in range(VEC_):
                ok = real and col0 + e < d
                q[r, e] = float32(Q[(q_row0 + r) * d + col0 + e]) * scale_log2 if ok else float32(0.0)
                acc[r, e] = float32(0.0)
            m_i[r] = NEG_INF
            l_i[r] = float32(0.0)

        # Two sets of K/V registers (a, b): one step's loads are in flight while the other is computed.
        # The loop has the same trip count in every thread of the block (the shuffles need it).
        load_keys(K, V, TABLE, b, bkv, kv_head, k_begin + slot, k_end, n_k, h_kv, max_pages, d, col0, ka, va)
        for base in range(k_begin, k_end, TWO_STEPS):
            load_keys(K, V, TABLE, b, bkv, kv_head, base + STEP + slot, k_end, n_k, h_kv, max_pages, d, col0, kb, vb)
            update(s, ka, va, q, m_i, l_i, acc, base + slot, k_end, row_stop)
            load_keys(K, V, TABLE, b, bkv, kv_head, base + TWO_STEPS + slot, k_end, n_k, h_kv, max_pages, d, col0,
                      ka, va)
            update(s, kb, vb, q, m_i, l_i, acc, base + STEP + slot, k_end, row_stop)

        merge_slots(smem, m_i, l_i, acc, O_PART, LSE_PART, (bkv * n_splits + split) * rows + row0, row0, rows,
                    slot, lane, tid, d)

    return split_kv_decode, 4 * KP * RB * (D + 2)  # the kernel, its shared memory in bytes


@lru_cache(maxsize=None)
def make_combine_kernel():
    """The combine kernel: O and lse from the splits' partials, one thread per (packed row, column)."""

    @cuda.jit
    def combine_splits(O_PART, LSE_PART, O, LSE, n_splits, rows, d):
        bkv = uint64(cuda.blockIdx.y)  # which (sequence, K/V head)
        n_splits, rows, d = uint64(n_splits), uint64(rows), uint64(d)
        idx = uint64(cuda.blockIdx.x) * uint64(cuda.blockDim.x) + uint64(cuda.threadIdx.x)
        if idx < rows * d:
            r, c = idx // d, idx % d
            m, l_sum, o = NEG_INF, float32(0.0), float32(0.0)
            for sp in range(n_splits):  # the online softmax over the splits, each one state (lse_s, 1, O_s)
                part = (bkv * n_splits + sp) * rows + r
                m, w_run, w_split = merge_weights(m, LSE_PART[part] * float32(LOG2E))  # lse_s in base 2
                l_sum = float32(l_sum * w_run + w_split)
                o = float32(o * w_run + O_PART[part * d + c] * w_split)
            O[(bkv * rows + r) * d + c] = o / l_sum if l_sum != 0 else float32(0.0)
            if c == ZERO:
                LSE[bkv * rows + r] = (m + math.log2(l_sum)) * LN2 if l_sum != 0 else NEG_INF

    return combine_splits
