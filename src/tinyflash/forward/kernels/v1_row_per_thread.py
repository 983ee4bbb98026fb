"""Kernel v1: one thread per query row, the first kernel to read.

Stage 1's loop (``tinyflash.forward.blocked``) with each query row given to one thread: the
thread keeps its row of Q_i, its m_i, l_i and acc in registers (or, when they do not fit, in
local memory); the block's BR threads load each K_j and V_j into shared memory together, once,
and all of them read it. Nothing is shared between the threads of a row, so there is no row max
to exchange and one barrier pair per tile is all the synchronisation there is.

It is slow where a row does not fit in a thread's registers: at d = 128 its per-thread arrays
spill to local memory. v2 splits a tile of scores over the threads instead (register tiling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numba import cuda, float32, uint64

from ...core.masks import key_stop
from ...core.online_softmax import LN2
from ...gpu.launch import Tiling
from ...gpu.loads import load_tile
from ...gpu import elements
from ...gpu.runtime import device_function, simulator_enabled, u
from ...gpu.smem import shared_floats

NEG_INF = float32(-np.inf)
ZERO, ONE = u(0), u(1)
key_stop = device_function(key_stop)  # the causal rule of tinyflash.core.masks, compiled for the GPU


GPU_TILE = (64, 32)  # (BR, BC) on a GPU
SIMULATOR_TILE = (16, 16)  # (BR, BC) on the simulator, which runs one Python thread per CUDA thread


@dataclass(frozen=True)
class RowTiling(Tiling):
    """v1's tiling: BR query rows (= threads) per block, BC keys per tile, head dims padded to D and DV (multiples
    of 4). Shared memory: K_j (BC × D) then V_j (BC × DV), 4·BC·(D + DV) bytes (64 KiB for d = dv = 256 on a GPU:
    more than a kernel may use without asking)."""

    BR: int
    BC: int
    D: int
    DV: int
    WHAT = "row tiling"

    @property
    def NT(self) -> int:  # threads per block: one per query row
        return self.BR

    @property
    def smem_bytes(self) -> int:
        return 4 * self.BC * (self.D + self.DV)


def tiling(d: int, d_v: int, simulator: bool | None = None) -> RowTiling:
    """v1's tiling for head dims d and dv: GPU_TILE on a GPU, SIMULATOR_TILE on numba's simulator (``simulator``:
    which one; None: where this process runs kernels)."""
    BR, BC = SIMULATOR_TILE if (simulator_enabled() if simulator is None else simulator) else GPU_TILE
    return RowTiling(BR, BC, -(-d // 4) * 4, -(-d_v // 4) * 4)


@lru_cache(maxsize=None)
def make_kernel(BR: int, BC: int, D: int, DV: int, element: str | None = None):
    """``flash_fwd_simple`` for BR query rows per block (= threads), BC keys per tile, head dims
    padded to D and DV; ``element`` 'bfloat16' for inputs of bfloat16 patterns (``gpu/elements.py``)."""
    widen, narrow = elements.widen(element), elements.narrow(element)  # an element as float32, and back
    BR_, BC_, D_, DV_ = u(BR), u(BC), u(D), u(DV)
    K_OFF, V_OFF = u(0), u(BC * D)
    BUF = max(1, BC * max(D, DV) // BR)  # elements of one tile per thread

    @cuda.jit
    def flash_fwd_simple(Q, K, V, O, LSE, n_q, n_k, d, d_v, scale_log2, causal, kv_group):
        smem = shared_floats()  # K_j then V_j: 4·BC·(D + DV) bytes
        tid = uint64(cuda.threadIdx.x)
        bh = uint64(cuda.blockIdx.y)  # which (batch, head)
        q_start = uint64(cuda.blockIdx.x) * BR_  # first query row of this block's tile Q_i
        row = q_start + tid  # this thread's query row
        n_q, n_k, d, d_v = uint64(n_q), uint64(n_k), uint64(d), uint64(d_v)
        kv_head = bh // uint64(kv_group)  # the K/V head this query head reads (GQA: kv_group heads share one)
        q_off, o_off = bh * n_q * d, bh * n_q * d_v  # this query head
        k_off, v_off = kv_head * n_k * d, kv_head * n_k * d_v  # its K/V head

        q_row = cuda.local.array(D, float32)  # Q[row, :] (registers or local memory)
        s_row = cuda.local.array(BC, float32)  # S_ij[row, :] for the current tile
        acc = cuda.local.array(DV, float32)  # unnormalised O_i[row, :]
        buf = cuda.local.array(BUF, float32)  # staging registers for tile loads
        for c in range(D_):
            q_row[c] = widen(Q[q_off + row * d + c]) if row < n_q and c < d else float32(0.0)
        for c in range(DV_):
            acc[c] = float32(0.0)
        m_i = NEG_INF  # running max of S2 = S·log2(e)
        l_i = float32(0.0)  # running denominator
        row_stop = key_stop(row + ONE, n_q, n_k, causal)  # this row may attend keys < row_stop

        k_stop = key_stop(min(q_start + BR_, n_q), n_q, n_k, causal)  # causal: later key tiles are skipped
        for k_start in range(ZERO, k_stop, BC_):
            cuda.syncthreads()  # all threads are done reading the previous K_j, V_j before we overwrite them
            load_tile(K, k_off, k_start, n_k, d, smem, K_OFF, D_, BC_, D_, tid, BR_, ONE, buf, widen)
            load_tile(V, v_off, k_start, n_k, d_v, smem, V_OFF, DV_, BC_, DV_, tid, BR_, ONE, buf, widen)
            cuda.syncthreads()  # K_j and V_j are fully written before any thread reads them

            m_new = m_i  # scores and row max: S_ij = scale · Q_i K_jᵀ, one row of it per thread
            for c in range(BC_):
                s = float32(0.0)
                for kk in range(D_):
                    s += q_row[kk] * smem[K_OFF + c * D_ + kk]
                s *= scale_log2
                if k_start + c >= row_stop:  # mask: beyond Nk, or in the future
                    s = NEG_INF
                s_row[c] = s
                m_new = max(m_new, s)
            m_safe = m_new if m_new != NEG_INF else float32(0.0)
            alpha = math.exp2(m_i - m_safe)  # rescale: exp(m_old - m_new)
            l_i *= alpha
            for c in range(DV_):
                acc[c] *= alpha
            for c in range(BC_):  # P·V
                p = math.exp2(s_row[c] - m_safe)  # P_ij[row, c]
                l_i += p
                for cc in range(DV_):
                    acc[cc] += p * smem[V_OFF + c * DV_ + cc]
            m_i = m_new

        if row < n_q:  # epilogue
            for c in range(d_v):
                O[o_off + row * d_v + c] = narrow(acc[c] / l_i if l_i != 0 else float32(0.0))  # fully masked: 0
            LSE[bh * n_q + row] = (m_i + math.log2(l_i)) * LN2 if l_i != 0 else NEG_INF

    return flash_fwd_simple


def build(cfg: RowTiling, dtype: str):
    """What v1 builds: its kernel for the tiling ``cfg`` and inputs of ``dtype`` ('float16', 'bfloat16', 'float32')."""
    return make_kernel(cfg.BR, cfg.BC, cfg.D, cfg.DV, elements.kernel_element(dtype))
