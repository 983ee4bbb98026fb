"""Stage 2: FlashAttention's forward pass as numba.cuda kernels, tiles in shared memory.

Two kernels compute the same thing as :func:`tinyflash.blocked_attention`, with its names:

* ``flash_fwd_simple`` — the first version to read: one thread per query row. Each thread keeps
  its row's m_i, l_i and acc in registers; the block loads K_j and V_j into shared memory once
  and all its threads share them.
* ``flash_fwd`` — the fast version: a block of NT threads computes a Br × Bc tile of scores, each
  thread a TM × TN piece of it held in registers (register tiling), then shares P_ij through
  shared memory for the product P_ij V_j. This is the one :func:`cuda_attention` runs.

How fast, on an H200 (B=1, H=32, float32; figures/data/kernel_versions_h200.csv and
bench_h200.csv, made by benchmarks/kernel_versions.py and ``python -m tinyflash.bench``): the
simple kernel reaches about 19 TFLOP/s at d=64 but about 7 at d=128, where its per-row arrays no
longer fit in registers; the fast kernel 32-37 at N=4096 and 37-41 at N=16384, against 45 for
PyTorch's memory-efficient kernel at d=128, which uses the tensor cores (the README has the
profile).

Both run on a real GPU and under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, set before
numba is imported), where tiny tile sizes keep the tests fast enough for a CPU.

Conventions inside the kernels:

* Scores are kept in base 2: S2 = S · log2(e), so exp(S - m) = exp2(S2 - m2), one hardware
  instruction (ex2.approx) per score. lse = (m2 + log2(l)) · ln(2) at the end.
* Indices are unsigned (``uint64``): numba adds a negative-index wraparound select to every
  signed index, which costs registers and hides the alignment that 16-byte vector loads need.
* Masked scores are -inf (no fastmath flags are used, so infinities and NaN behave as IEEE says);
  a row whose running max is still -inf uses 0 in its place so that exp2(-inf - -inf) never occurs.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


def _check_numpy_for_numba_cuda() -> None:
    """numba-cuda 0.30.4 calls np.row_stack, which numpy 2.5 removed: fail early and clearly."""
    major, minor = (int(p) for p in np.__version__.split(".")[:2])
    if (major, minor) >= (2, 5) and not hasattr(np, "row_stack"):
        raise ImportError(f"tinyflash's CUDA stage needs numpy < 2.5 (numba-cuda 0.30.4 calls np.row_stack, "
                          f"removed in numpy 2.5); this environment has numpy {np.__version__}. "
                          "Install it with: pip install 'numpy<2.5'")


_check_numpy_for_numba_cuda()

from numba import cuda, float32, uint64  # noqa: E402  (after the numpy check, on purpose)

from ._checks import as_array, check_attention_inputs  # noqa: E402

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x · LOG2E)
LN2 = 0.6931471805599453  # ln(2):   log(x) = log2(x) · LN2
NEG_INF = float32(-np.inf)
MAX_HEAD_DIM = 256  # the largest d (and dv) the kernels are built for
SUPPORTED = (np.dtype(np.float16), np.dtype(np.float32))


def simulator_enabled() -> bool:
    """True when numba runs kernels on its CPU simulator instead of a GPU."""
    from numba import config

    return bool(config.ENABLE_CUDASIM)


def _u(x: int):
    """A compile-time constant as an unsigned 64-bit integer (see the module docstring)."""
    return np.uint64(x)


ZERO_U, ONE_U = np.uint64(0), np.uint64(1)


# ---------------------------------------------------------------------------------------------
# Tile configuration
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TileConfig:
    """Compile-time shape of one thread block of ``flash_fwd``.

    BR (Br) query rows and BC (Bc) keys per tile; NT threads; each thread owns TM rows. The
    head dims are padded with zeros, which change no sum, to D (a multiple of 8) and DV.
    Derived: RG = BR/TM row groups of CT = NT/RG threads; in the score tile each thread owns
    TN = BC/CT keys, in the output TO = DV/CT columns (TO/4 groups of 4).
    """

    BR: int
    BC: int
    TM: int
    NT: int
    D: int
    DV: int

    @property
    def RG(self) -> int:
        return self.BR // self.TM

    @property
    def CT(self) -> int:
        return self.NT // self.RG

    @property
    def TN(self) -> int:
        return self.BC // self.CT

    @property
    def TO4(self) -> int:
        return self.DV // (4 * self.CT)

    # Shared memory, in float32 elements. Rows are padded by 4 floats: 16-byte aligned for vector
    # loads, and (for D, BR multiples of 8) consecutive rows start in different banks.
    @property
    def QS(self) -> int:  # row stride of Qs[row, kk]
        return self.D + 4

    @property
    def KS(self) -> int:  # row stride of Ks[key, kk]
        return self.D + 4

    @property
    def PS(self) -> int:  # row stride of Ps[key, row] (P_ij transposed)
        return self.BR + 4

    @property
    def smem_floats(self) -> int:
        q = self.BR * self.QS  # Q_i, loaded once
        kp = max(self.BC * self.KS, self.BC * self.PS)  # K_j, then P_ij in the same place
        v = self.BC * self.DV  # V_j
        red = self.BR * self.CT  # one partial row max (later row sum) per thread and row
        return q + kp + v + red

    @property
    def smem_bytes(self) -> int:
        return 4 * self.smem_floats

    def problems(self) -> list[str]:
        """What makes this tiling invalid (empty if nothing)."""
        problems = []
        if self.BR % self.TM or self.NT % self.RG:
            problems.append("BR must be a multiple of TM and NT a multiple of BR/TM")
        elif self.BC % self.CT or self.BC % 4 or self.DV % (4 * self.CT):
            problems.append("BC must be a multiple of 4 and of CT = NT·TM/BR, DV a multiple of 4·CT")
        if self.D % 8:
            problems.append("D must be a multiple of 8")
        return problems

    def validate(self) -> "TileConfig":
        problems = self.problems()
        if problems:
            raise ValueError(f"invalid tile configuration {self}: {'; '.join(problems)}")
        return self


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def default_config(d: int, d_v: int) -> TileConfig:
    """The tiling ``flash_fwd`` uses on a GPU for head dims d and dv.

    Chosen by measurement on an H200 (benchmarks/tile_sweep.py, results in
    figures/data/tile_sweep_h200.csv): 64 query rows per block and 128 threads, each thread
    owning 8 rows; 128 keys per tile for d <= 64, 64 for d <= 128 (102 KiB of shared memory, two
    blocks per SM). Beyond 128 a block owns 4 rows per thread with 256 threads, one block per SM.
    """
    D, DV = _round_up(d, 8), _round_up(d_v, 64)
    if max(D, DV) <= 64:
        return TileConfig(BR=64, BC=128, TM=8, NT=128, D=D, DV=DV).validate()
    if max(D, DV) <= 128:
        return TileConfig(BR=64, BC=64, TM=8, NT=128, D=D, DV=DV).validate()
    return TileConfig(BR=64, BC=64, TM=4, NT=256, D=D, DV=DV).validate()


# ---------------------------------------------------------------------------------------------
# Shared pieces: the dynamic shared-memory buffer, and loading a tile into it
# ---------------------------------------------------------------------------------------------

if simulator_enabled():  # the simulator rejects the alignment argument; its arrays are NumPy arrays

    @cuda.jit(device=True)
    def shared_floats():
        """The block's dynamic shared memory as one float32 array (its size is set at launch)."""
        return cuda.shared.array(0, float32)

else:

    @cuda.jit(device=True, inline="always")
    def shared_floats():
        """The block's dynamic shared memory as one float32 array (its size is set at launch).

        16-byte alignment lets the compiler turn 4 neighbouring float loads into one vector load.
        """
        return cuda.shared.array(0, float32, alignment=16)


# ---------------------------------------------------------------------------------------------
# Loading a tile of a (BH, N, d) array into shared memory
# ---------------------------------------------------------------------------------------------


def _vector_load(n: int):
    """A device function ``load(src, i)`` -> (src[i], ..., src[i+n-1]) in one vector load.

    A warp's load instruction moves the most data when each thread asks for several neighbouring
    elements at once (ld.global.v4: 4 elements). The GPU requires the address to be a multiple
    of the vector's size; numba cannot know that, so the code it generates reads global arrays
    one element at a time. This small intrinsic builds the vector load itself (LLVM IR: a
    pointer to n elements, aligned to n elements); the caller guarantees the alignment. On the
    simulator it is n ordinary loads.
    """
    if simulator_enabled():

        @cuda.jit(device=True)
        def load(src, i):
            return tuple(src[i + e] for e in range(n))

        return load

    from llvmlite import ir
    from numba import types
    from numba.core.extending import intrinsic

    @intrinsic
    def load(typingctx, src, i):
        ret = types.UniTuple(src.dtype, n)

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            elt = context.get_value_type(sig.args[0].dtype)
            ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), ir.VectorType(elt, n).as_pointer())
            vec = builder.load(ptr, align=n * context.get_abi_sizeof(elt))
            vals = [builder.extract_element(vec, ir.Constant(ir.IntType(32), k)) for k in range(n)]
            return context.make_tuple(builder, ret, vals)

        return ret(src, i), codegen

    return load


load4 = _vector_load(4)


def vector_width(dtype) -> int:
    """Elements each thread reads per global load in a full tile: 4 for float16 (8 bytes), 1 for float32.

    With one float16 per thread a warp's load covers only 64 bytes, half of a 128-byte cache
    line; one float32 per thread already covers a whole line. On an H200, 4 per thread made the
    float16 kernel faster and the float32 one slower (benchmarks/vector_loads.py; the README
    quotes the numbers).
    """
    return 4 if np.dtype(dtype).itemsize == 2 else 1


@cuda.jit(device=True, inline="always")
def _is_full(start, n_rows, n_cols, ROWS, COLS, NT, W):
    """Whether rows start .. start+ROWS of an (n_rows × n_cols) matrix are a full ROWS × COLS tile
    that NT threads can share evenly, W neighbouring elements each, NT·W/COLS rows at a time (the
    same answer for every thread of the block)."""
    G = COLS // W  # threads per row
    return start + ROWS <= n_rows and n_cols == COLS and NT % G == 0 and ROWS % (NT // G) == 0


@cuda.jit(device=True, inline="always")
def _fetch_tile(src, src_off, start, n_cols, ROWS, COLS, tid, NT, W, buf, b0):
    """A full tile, step 1 of 2: read this thread's ROWS·COLS/NT elements into ``buf[b0:]``.

    ``src`` is a whole input flattened to 1-D; this head's matrix, n_cols wide, begins at
    ``src_off``. Each thread reads W neighbouring columns at a time (W = 1, or 4 with one vector
    load), and consecutive threads the next ones, so a warp reads consecutive addresses
    (coalesced). ``buf`` is a register array: the loop has a constant length, the compiler
    unrolls it, and all the loads are in flight at once: a tile costs one memory latency, not
    one per row.
    """
    G = COLS // W  # threads per row
    r_step = NT // G  # rows between two loads of one thread
    g = src_off + (start + tid // G) * n_cols + (tid % G) * W  # index into src of its first element
    for e in range(ROWS // r_step):
        if W == ONE_U:
            buf[b0 + e] = float32(src[g + e * r_step * n_cols])
        else:
            x = load4(src, g + e * r_step * n_cols)
            for u in range(W):
                buf[b0 + e * W + u] = float32(x[u])


@cuda.jit(device=True, inline="always")
def _store_tile(dst, dst_off, stride, ROWS, COLS, tid, NT, W, buf, b0):
    """A full tile, step 2 of 2: write ``buf[b0:]`` to dst[dst_off + r·stride + c] (shared memory)."""
    G = COLS // W
    r_step = NT // G
    sh = dst_off + (tid // G) * stride + (tid % G) * W  # index into dst of its first element
    for e in range(ROWS // r_step):
        for u in range(W):
            dst[sh + e * r_step * stride + u] = buf[b0 + e * W + u]


@cuda.jit(device=True, inline="always")
def _load_tile_ragged(src, src_off, start, n_rows, n_cols, dst, dst_off, stride, ROWS, COLS, tid, NT):
    """Any tile, element by element: one bounds check (and a division) per element.

    Writes dst[dst_off + r·stride + c] = src[src_off + (start + r)·n_cols + c] for r < ROWS,
    c < COLS, and 0 where the tile runs past the matrix (the ragged last tile, or the head-dim
    padding c >= n_cols), so that those entries add nothing to any dot product.
    """
    for idx in range(tid, ROWS * COLS, NT):
        r = idx // COLS
        c = idx % COLS
        x = float32(0.0)
        if start + r < n_rows and c < n_cols:
            x = float32(src[src_off + (start + r) * n_cols + c])
        dst[dst_off + r * stride + c] = x


@cuda.jit(device=True, inline="always")
def _load_tile(src, src_off, start, n_rows, n_cols, dst, dst_off, stride, ROWS, COLS, tid, NT, W, buf):
    """Copy rows start .. start+ROWS of one head's (n_rows × n_cols) matrix into shared memory,
    as float32, zero-padded to ROWS × COLS: the fast path for a full tile (the usual case), the
    ragged path otherwise. ROWS, COLS, NT and W are constants: branches on them vanish at compile time.
    """
    if _is_full(start, n_rows, n_cols, ROWS, COLS, NT, W):
        _fetch_tile(src, src_off, start, n_cols, ROWS, COLS, tid, NT, W, buf, ZERO_U)
        _store_tile(dst, dst_off, stride, ROWS, COLS, tid, NT, W, buf, ZERO_U)
    else:
        _load_tile_ragged(src, src_off, start, n_rows, n_cols, dst, dst_off, stride, ROWS, COLS, tid, NT)


# ---------------------------------------------------------------------------------------------
# Version 1: one thread per query row
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=None)
def make_simple_kernel(BR: int, BC: int, D: int, DV: int):
    """``flash_fwd_simple`` for BR query rows per block (= threads), BC keys per tile, head dims
    padded to D and DV. Shared memory: K_j (BC × D) and V_j (BC × DV), 4·BC·(D + DV) bytes."""
    BR_, BC_, D_, DV_ = _u(BR), _u(BC), _u(D), _u(DV)
    K_OFF, V_OFF = _u(0), _u(BC * D)
    BUF = max(1, BC * max(D, DV) // BR)  # elements of one tile per thread

    @cuda.jit
    def flash_fwd_simple(Q, K, V, O, LSE, n_q, n_k, d, d_v, scale_log2, causal):
        smem = shared_floats()  # K_j then V_j: 4·BC·(D + DV) bytes
        tid = uint64(cuda.threadIdx.x)
        bh = uint64(cuda.blockIdx.y)  # which (batch, head)
        q_start = uint64(cuda.blockIdx.x) * BR_  # first query row of this block's tile Q_i
        row = q_start + tid  # this thread's query row
        n_q, n_k, d, d_v = uint64(n_q), uint64(n_k), uint64(d), uint64(d_v)
        q_off, k_off, v_off, o_off = bh * n_q * d, bh * n_k * d, bh * n_k * d_v, bh * n_q * d_v  # this head

        q_row = cuda.local.array(D, float32)  # Q[row, :] (registers or local memory)
        s_row = cuda.local.array(BC, float32)  # S_ij[row, :] for the current tile
        acc = cuda.local.array(DV, float32)  # unnormalised O_i[row, :]
        buf = cuda.local.array(BUF, float32)  # staging registers for tile loads
        for c in range(D_):
            q_row[c] = float32(Q[q_off + row * d + c]) if row < n_q and c < d else float32(0.0)
        for c in range(DV_):
            acc[c] = float32(0.0)
        m_i = NEG_INF  # running max of S2 = S·log2(e)
        l_i = float32(0.0)  # running denominator

        # Causal: the last query of this tile may see keys up to q_end - 1 + n_k - n_q (inclusive).
        q_end = min(q_start + BR_, n_q)
        k_stop = n_k if not causal else min(n_k, q_end + n_k - n_q) if q_end + n_k > n_q else uint64(0)
        for k_start in range(uint64(0), k_stop, BC_):
            cuda.syncthreads()  # all threads are done reading the previous K_j, V_j before we overwrite them
            _load_tile(K, k_off, k_start, n_k, d, smem, K_OFF, D_, BC_, D_, tid, BR_, ONE_U, buf)
            _load_tile(V, v_off, k_start, n_k, d_v, smem, V_OFF, DV_, BC_, DV_, tid, BR_, ONE_U, buf)
            cuda.syncthreads()  # K_j and V_j are fully written before any thread reads them

            m_new = m_i  # S_ij = scale · Q_i K_jᵀ, one row of it per thread
            for c in range(BC_):
                key = k_start + c
                s = float32(0.0)
                for kk in range(D_):
                    s += q_row[kk] * smem[K_OFF + c * D_ + kk]
                s *= scale_log2
                if key >= n_k or (causal and key + n_q > row + n_k):  # beyond Nk, or in the future
                    s = NEG_INF
                s_row[c] = s
                m_new = max(m_new, s)
            m_safe = m_new if m_new != NEG_INF else float32(0.0)
            alpha = math.exp2(m_i - m_safe)  # exp(m_old - m_new): rescales the old state
            l_i *= alpha
            for c in range(DV_):
                acc[c] *= alpha
            for c in range(BC_):
                p = math.exp2(s_row[c] - m_safe)  # P_ij[row, c]
                l_i += p
                for cc in range(DV_):
                    acc[cc] += p * smem[V_OFF + c * DV_ + cc]
            m_i = m_new

        if row < n_q:
            for c in range(d_v):
                O[o_off + row * d_v + c] = acc[c] / l_i if l_i != 0 else float32(0.0)  # fully masked row: O = 0
            LSE[bh * n_q + row] = (m_i + math.log2(l_i)) * LN2 if l_i != 0 else NEG_INF

    return flash_fwd_simple


# ---------------------------------------------------------------------------------------------
# Version 2: register tiling
# ---------------------------------------------------------------------------------------------


def _pipelined(load, fma, STEP, END):
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
        load(smem, xa, ya, row0, ct, ZERO_U)
        for k in range(ZERO_U, END - TWO_STEPS, TWO_STEPS):
            load(smem, xb, yb, row0, ct, k + STEP)
            fma(out, xa, ya)
            load(smem, xa, ya, row0, ct, k + TWO_STEPS)
            fma(out, xb, yb)
        load(smem, xb, yb, row0, ct, END - STEP)
        fma(out, xa, ya)
        fma(out, xb, yb)

    return product


@lru_cache(maxsize=None)
def make_kernel(cfg: TileConfig, vector: int = 1):
    """``flash_fwd`` for one :class:`TileConfig`, reading full tiles ``vector`` elements per
    thread and load (1, or 4: see :func:`vector_width`; 4 needs inputs aligned to 4 elements).

    Thread ``tid`` = (rg, ct) with rg = tid // CT, ct = tid % CT. In a tile it owns
      rows  row0 + i,            i < TM   (row0 = rg · TM; the same rows of S_ij, P_ij and O_i)
      keys  ct + CT · jj,        jj < TN  (strided: neighbouring threads read neighbouring keys)
      cols  (ct + CT · t)·4 + e, t < TO4, e < 4   (groups of 4 output columns, also strided)
    Shared memory: Qs[row, kk], Ks[key, kk] (reused for Ps[key, row] = P_ijᵀ), Vs[key, col],
    red[row, ct] for the row max (and at the end the row sum) across the CT threads of a row.
    """
    cfg.validate()
    # Every constant is unsigned (see the module docstring); array shapes must be plain ints.
    BR, BC, TM, NT, D, DV = (_u(x) for x in (cfg.BR, cfg.BC, cfg.TM, cfg.NT, cfg.D, cfg.DV))
    CT, TN, TO4, FOUR = _u(cfg.CT), _u(cfg.TN), _u(cfg.TO4), _u(4)
    QS, KS, PS = _u(cfg.QS), _u(cfg.KS), _u(cfg.PS)
    Q_OFF = _u(0)
    K_OFF = _u(cfg.BR * cfg.QS)  # K_j; P_ij overwrites it once S_ij is computed
    V_OFF = K_OFF + _u(max(cfg.BC * cfg.KS, cfg.BC * cfg.PS))
    R_OFF = V_OFF + _u(cfg.BC * cfg.DV)
    TM_, TN_, TO4_ = cfg.TM, cfg.TN, cfg.TO4  # for array shapes
    KB = cfg.BC * cfg.D // cfg.NT  # elements of K_j per thread (when NT divides evenly)
    BUF = max(1, cfg.BR * cfg.D // cfg.NT, KB + cfg.BC * cfg.DV // cfg.NT)  # Q_i, or K_j and V_j together
    KB = _u(KB)
    ZERO, ONE, TWO = _u(0), _u(1), _u(2)
    if vector not in (1, 4):
        raise ValueError(f"vector must be 1 or 4; got {vector!r}")
    W = _u(vector)

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
        for u in range(TWO):
            for i in range(TM):
                pf[u, i] = smem[K_OFF + (c + u) * PS + row0 + i]
            for t in range(TO4):
                for e in range(FOUR):
                    vf[u, t, e] = smem[V_OFF + (c + u) * DV + (ct + CT * t) * FOUR + e]

    @cuda.jit(device=True, inline="always")
    def fma_pv(acc, pf, vf):
        """acc += pf[u]ᵀ vf[u] for both keys u: 2·TM·TO4·4 multiply-adds on registers."""
        for u in range(TWO):
            for i in range(TM):
                for t in range(TO4):
                    for e in range(FOUR):
                        acc[i, t, e] += pf[u, i] * vf[u, t, e]

    qk_product = _pipelined(load_qk, fma_qk, FOUR, D)  # S_ij += Q_i K_jᵀ over d, 4 columns a step
    pv_product = _pipelined(load_pv, fma_pv, TWO, BC)  # acc += P_ij V_j over the keys, 2 a step

    @cuda.jit
    def flash_fwd(Q, K, V, O, LSE, n_q, n_k, d, d_v, scale_log2, causal):
        smem = shared_floats()  # Qs, Ks (then Ps), Vs, red: cfg.smem_bytes bytes
        tid = uint64(cuda.threadIdx.x)
        bh = uint64(cuda.blockIdx.y)  # which (batch, head)
        q_start = uint64(cuda.blockIdx.x) * BR  # first query row of Q_i
        n_q, n_k, d, d_v = uint64(n_q), uint64(n_k), uint64(d), uint64(d_v)
        q_off, k_off, v_off, o_off = bh * n_q * d, bh * n_k * d, bh * n_k * d_v, bh * n_q * d_v  # this head
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

        _load_tile(Q, q_off, q_start, n_q, d, smem, Q_OFF, QS, BR, D, tid, NT, W, buf)  # Q_i, once
        q_end = min(q_start + BR, n_q)
        k_stop = n_k if not causal else min(n_k, q_end + n_k - n_q) if q_end + n_k > n_q else ZERO
        for k_start in range(ZERO, k_stop, BC):
            cuda.syncthreads()  # Q_i is written (1st tile); no thread still reads Ps/Vs of the last tile
            if _is_full(k_start, n_k, d, BC, D, NT, W) and _is_full(k_start, n_k, d_v, BC, DV, NT, W):
                # all loads of both tiles in flight before the first store: one memory latency, not two
                _fetch_tile(K, k_off, k_start, d, BC, D, tid, NT, W, buf, ZERO)
                _fetch_tile(V, v_off, k_start, d_v, BC, DV, tid, NT, W, buf, KB)
                _store_tile(smem, K_OFF, KS, BC, D, tid, NT, W, buf, ZERO)
                _store_tile(smem, V_OFF, DV, BC, DV, tid, NT, W, buf, KB)
            else:  # the ragged last tile, or a padded head dim
                _load_tile_ragged(K, k_off, k_start, n_k, d, smem, K_OFF, KS, BC, D, tid, NT)
                _load_tile_ragged(V, v_off, k_start, n_k, d_v, smem, V_OFF, DV, BC, DV, tid, NT)
            cuda.syncthreads()  # K_j and V_j are fully written before any thread reads them

            # S_ij = Q_i K_jᵀ for this thread's TM × TN piece, 4 columns of d at a time, the loads of
            # the next 4 columns in flight while the current 4 are multiplied (see _pipelined)
            for i in range(TM):
                for jj in range(TN):
                    s[i, jj] = float32(0.0)
            qk_product(smem, s, qa, ka, qb, kb, row0, ct)

            # scale to base 2; mask (only tiles that reach past Nk or cross the diagonal need it)
            for i in range(TM):
                for jj in range(TN):
                    s[i, jj] *= scale_log2
            if k_start + BC > n_k or (causal and k_start + BC + n_q > q_start + n_k + ONE):
                for i in range(TM):
                    row = q_start + row0 + i
                    key_end = n_k  # keys < key_end are allowed for this row
                    if causal:
                        key_end = min(n_k, row + ONE + n_k - n_q) if row + ONE + n_k > n_q else ZERO
                    for jj in range(TN):
                        if k_start + ct + CT * jj >= key_end:
                            s[i, jj] = NEG_INF  # beyond Nk, or a future key
            for i in range(TM):  # this thread's max of each of its rows
                m_part = NEG_INF
                for jj in range(TN):
                    m_part = max(m_part, s[i, jj])
                smem[R_OFF + (row0 + i) * CT + ct] = m_part
            cuda.syncthreads()  # partial maxima are visible; every thread is done reading Ks (P overwrites it)

            for i in range(TM):
                m_new = m_i[i]
                for c in range(CT):
                    m_new = max(m_new, smem[R_OFF + (row0 + i) * CT + c])
                m_safe = m_new if m_new != NEG_INF else float32(0.0)
                alpha = math.exp2(m_i[i] - m_safe)  # exp(m_old - m_new): rescales the old state
                m_i[i] = m_new
                l_i[i] *= alpha
                for t in range(TO4):
                    for e in range(FOUR):
                        acc[i, t, e] *= alpha
                for jj in range(TN):
                    s[i, jj] = math.exp2(s[i, jj] - m_safe)  # P_ij, unnormalised
                    l_i[i] += s[i, jj]
            for jj in range(TN):  # store P_ijᵀ: TM consecutive floats per key (vector stores)
                for i in range(TM):
                    smem[K_OFF + (ct + CT * jj) * PS + row0 + i] = s[i, jj]
            cuda.syncthreads()  # P_ij is fully written before any thread reads it

            # O_i += P_ij V_j for this thread's TM rows × TO4·4 columns, two keys at a time, with
            # the same alternation of fragment registers
            pv_product(smem, acc, pa, va, pb, vb, row0, ct)

        # l_i so far is this thread's share; add the shares of the CT threads of each row
        cuda.syncthreads()  # every thread is done reading red (row maxima) before it is reused
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
                            O[o_off + row * d_v + col] = acc[i, t, e] * inv_l
                if ct == ZERO:
                    LSE[bh * n_q + row] = (m_i[i] + math.log2(l_row)) * LN2 if l_row != 0 else NEG_INF

    return flash_fwd


# ---------------------------------------------------------------------------------------------
# More than 48 KiB of shared memory
# ---------------------------------------------------------------------------------------------

STATIC_SMEM_LIMIT = 48 * 1024  # what any kernel may use without asking


def allow_large_shared_memory(kernel, args, nbytes: int) -> None:
    """Let ``kernel``, compiled for ``args``, launch with ``nbytes`` of dynamic shared memory.

    Above 48 KiB CUDA requires the function attribute MAX_DYNAMIC_SHARED_SIZE_BYTES to be raised
    first (up to 227 KiB on Hopper). numba has no public API for it, so this compiles the kernel
    for the argument types, takes the driver handle of the compiled function and calls
    cuKernelSetAttribute, as numba's own ``set_shared_memory_carveout`` does. Raises the driver's
    error if the device refuses.
    """
    if nbytes <= STATIC_SMEM_LIMIT or simulator_enabled():
        return
    from numba.cuda.cudadrv.driver import binding, driver

    compiled = kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))
    cufunc = compiled.library.get_cufunc()
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, int(nbytes), cufunc.handle, cufunc.device.id)


def small_config(d: int, d_v: int) -> TileConfig:
    """A tiling of at most 48 KiB of shared memory, for when more cannot be had."""
    D, DV = _round_up(d, 8), _round_up(d_v, 64)
    for BR, BC in ((64, 32), (32, 32), (32, 16), (16, 16), (16, 8)):
        for TM in (8, 4, 2, 1):
            for NT in (128, 64, 32):
                cfg = TileConfig(BR=BR, BC=BC, TM=TM, NT=NT, D=D, DV=DV)
                if not cfg.problems() and cfg.smem_bytes <= STATIC_SMEM_LIMIT:
                    return cfg
    raise ValueError(f"no tiling of at most 48 KiB of shared memory for d={d}, dv={d_v}")


# ---------------------------------------------------------------------------------------------
# The host wrapper: check inputs, allocate outputs, size the grid, launch
# ---------------------------------------------------------------------------------------------


def _is_device_array(x) -> bool:
    """CuPy, numba (also the simulator's) or any other array that lives on the GPU."""
    return hasattr(x, "__cuda_array_interface__") or bool(getattr(x, "__cuda_ndarray__", False))


def _to_device_flat(x):
    """A C-contiguous 1-D view of ``x`` on the GPU, its data 16-byte aligned: a view of a device
    array, a copy of a host one (or of a device view that starts at an unaligned address).

    The kernels index each head's (N × d) matrix inside this flat array themselves, and read
    float16 tiles 4 elements (8 bytes) at a time, which needs aligned addresses.
    """
    if not _is_device_array(x):
        return cuda.to_device(np.ascontiguousarray(x).reshape(-1))
    xp = _array_module(x)
    if xp is not None:  # CuPy: ascontiguousarray copies only non-contiguous arrays
        flat = xp.ascontiguousarray(x).reshape(-1)
        return flat if _aligned(flat) else flat.copy()
    if not hasattr(x, "is_c_contiguous"):  # another library's array (e.g. a PyTorch tensor)
        x = cuda.as_cuda_array(x)
    if not x.is_c_contiguous():
        raise ValueError(f"non-contiguous numba device arrays are not supported (got shape {x.shape}, strides "
                         f"{x.strides}); pass a contiguous array, or a CuPy array")
    flat = x.reshape(x.size)
    if not _aligned(flat):
        copy = cuda.device_array(flat.shape, dtype=flat.dtype)
        copy.copy_to_device(flat)
        flat = copy
    return flat


def _aligned(x) -> bool:
    """Whether a device array's data starts at a 16-byte boundary (always true on the simulator)."""
    return simulator_enabled() or x.__cuda_array_interface__["data"][0] % 16 == 0


def cuda_attention(q, k, v, *, causal: bool = False, scale: float | None = None, kernel: str = "fast",
                   config: TileConfig | None = None, vector: int | None = None):
    """Stage 2: FlashAttention's forward pass on the GPU. Returns ``(o, lse)``.

    Same contract as :func:`tinyflash.naive_attention`: q (..., Nq, d), k (..., Nk, d),
    v (..., Nk, dv); o (..., Nq, dv) in the input dtype, lse (..., Nq) in float32. Inputs are
    float16 or float32 (float16 is read from memory and computed in float32) with 1 <= d, dv <= 256.
    NumPy inputs are copied to the GPU and the results back; device arrays (CuPy, numba, anything
    with ``__cuda_array_interface__``) stay on the GPU and the results are device arrays of the
    same kind. ``kernel`` is ``"fast"`` (register-tiled ``flash_fwd``) or ``"simple"`` (one
    thread per query row); ``config`` overrides the fast kernel's tiling (tests use tiny ones) and
    ``vector`` the elements it reads per thread and global load (1 or 4; default
    :func:`vector_width` of the dtype).
    """
    on_device = _is_device_array(q)
    if not on_device:
        q, k, v = as_array(q, "q"), as_array(k, "k"), as_array(v, "v")
    prob = check_attention_inputs(q, k, v, causal=causal, scale=scale, allowed=SUPPORTED)
    for name, dim in (("d (head dim of q and k)", prob.d), ("dv (head dim of v)", prob.d_v)):
        if dim > MAX_HEAD_DIM:
            raise ValueError(f"cuda_attention supports head dims up to {MAX_HEAD_DIM}; got {name} = {dim}")
    if on_device != _is_device_array(k) or on_device != _is_device_array(v):
        raise TypeError("q, k and v must all be device arrays or all host arrays; got a mix")
    if kernel not in ("fast", "simple"):
        raise ValueError(f"kernel must be 'fast' or 'simple'; got {kernel!r}")
    if vector not in (None, 1, 4):
        raise ValueError(f"vector must be 1 or 4 (or None: the dtype's default); got {vector!r}")
    bh = math.prod(prob.lead)
    if bh > 65535:
        raise ValueError(f"the product of the leading dims (batch × heads) must be at most 65535; got {bh}")

    # allocate outputs (in the caller's array library for device inputs)
    xp = _array_module(q) if on_device else None
    empty = xp.empty if xp is not None else cuda.device_array
    o = empty(bh * prob.n_q * prob.d_v, dtype=prob.dtype)  # (BH·Nq·dv,) flat, C order
    lse = empty(bh * prob.n_q, dtype=np.float32)  # (BH·Nq,)
    if prob.n_q > 0 and bh > 0:
        args = (_to_device_flat(q), _to_device_flat(k), _to_device_flat(v), o, lse, prob.n_q, prob.n_k, prob.d,
                prob.d_v, np.float32(prob.scale * LOG2E), prob.causal)
        _launch(kernel, config, vector, prob, args)

    o = o.reshape(prob.out_shape)
    lse = lse.reshape(prob.lse_shape)
    if not on_device:
        return o.copy_to_host(), lse.copy_to_host()
    return o, lse


def _array_module(x):
    """CuPy for CuPy arrays, else None (numba device arrays and other CUDA arrays)."""
    mod = type(x).__module__.split(".")[0]
    if mod == "cupy":
        import cupy

        return cupy
    return None


def _launch(kernel: str, config, vector, prob, args) -> None:
    """Size the grid and launch; one thread block per (query tile, batch·head)."""
    if kernel == "simple":
        BR, BC = (16, 16) if simulator_enabled() else (64, 32)
        D, DV = _round_up(prob.d, 4), _round_up(prob.d_v, 4)
        fn = make_simple_kernel(BR, BC, D, DV)
        grid, block, smem = (-(-prob.n_q // BR), math.prod(prob.lead)), BR, 4 * BC * (D + DV)
        fn[grid, block, 0, smem](*args)
        return
    cfg = config or (default_config(prob.d, prob.d_v) if not simulator_enabled() else simulator_config(prob.d, prob.d_v))
    if cfg.D < prob.d or cfg.DV < prob.d_v:
        raise ValueError(f"config {cfg} is too small for d={prob.d}, dv={prob.d_v}")
    vector = vector_width(prob.dtype) if vector is None else vector
    fn = make_kernel(cfg, vector)
    try:
        allow_large_shared_memory(fn, args, cfg.smem_bytes)
    except Exception as exc:  # the driver refused: fall back to a tiling that needs no permission
        small = small_config(prob.d, prob.d_v)
        warnings.warn(f"could not enable {cfg.smem_bytes} bytes of shared memory ({exc}); "
                      f"falling back to the slower tiling {small}", RuntimeWarning, stacklevel=3)
        cfg, fn = small, make_kernel(small, vector)
    grid = (-(-prob.n_q // cfg.BR), math.prod(prob.lead))  # (query tiles, batch·heads)
    fn[grid, cfg.NT, 0, cfg.smem_bytes](*args)


def simulator_config(d: int, d_v: int) -> TileConfig:
    """A tiny tiling for the CUDA simulator, which runs one Python thread per CUDA thread."""
    return TileConfig(BR=8, BC=8, TM=2, NT=16, D=_round_up(d, 8), DV=_round_up(d_v, 16)).validate()
