"""A warp's tile of attention on the tensor cores: the pieces every tensor-core kernel shares.

A warp owns 16 · ROW_TILES query rows (the rows of ROW_TILES ``mma.m16n8k16`` tiles) and walks the
keys in tiles of BC. A lane holds its part of rows g and g + 8 of each row tile (g = lane // 4): its
scores ``s[r, n, e]`` (row tile r, keys 8n .. 8n + 7, element e of the C fragment), its running
maximum ``m_i[r, half]`` and its share of the denominator ``l_i[r, half]`` (half 0: row g, 1: row
g + 8), its part of the unnormalised output ``acc[r, n, e]``. K_j and V_j (and Q_i, if it stays in
shared memory) are read by ``ldmatrix`` from rows padded by PAD_WORDS words. The fragment layouts
are ``tinyflash.gpu.ptx``'s. A row of d dims is DP wide in the fragments and in shared memory: d
padded with zero columns to a multiple of 32 (``padded_head_dim``), which add nothing to Q_i K_jᵀ.

:func:`warp_tile` builds, for one :class:`WarpTile`, the device functions of stage 1's loop on these
fragments (three pieces build them: :func:`products` on the tensor cores, :func:`softmax`, :func:`output`),
in the order a kernel calls them:

    lane_rows            each lane's ldmatrix offsets, computed once
    load_q / scores      S_ij = Q_i K_jᵀ (Q's A operands in registers, or read from shared memory)
    mask_row             S_ij = -inf for one row's keys at or past its stop
    softmax_step         the online softmax: row max, rescale (lazily or at every tile), P_ij = exp2(...)
                         (softmax_step_deferred and rescale_acc: the same, acc rescaled later, when a product
                         into acc runs meanwhile)
    p_times_v            acc += P_ij V_j, P_ij packed from S_ij's accumulators (never through shared memory)
    epilogue             O_i = acc / l_i, lse_i = m_i + log l_i, written to HBM

and, for FlexAttention's user functions (:func:`modifications`, built per pair of them), ``score_mods`` and
``mask_mods``: score_mod and mask_mod on each of the lane's scores, between ``scores`` and ``softmax_step``.

Kernel v6 (``forward/kernels/v6_tensor_cores.py``) and the decode split kernel
(``decode/kernels/tensor_cores.py``) are built from them; each kernel keeps what is its own: how a
block finds its work, how tiles reach shared memory, the loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace

import numpy as np
from numba import cuda, float32, int64, uint32, uint64

from .core.online_softmax import LN2, LOG2E
from .gpu import ptx
from .gpu.runtime import u

WARP = 32  # lanes per warp
MMA_M, MMA_N, MMA_K = 16, 8, 16  # one mma.sync: (16 × 16) · (16 × 8)
MIN_COMPUTE_CAPABILITY = (8, 0)  # mma.sync m16n8k16 on float16 and bfloat16, cp.async, ldmatrix: Ampere on
PAD_WORDS = 4  # 16 bytes of padding after each row in shared memory: ldmatrix without bank conflicts
ELEMENTS = ("float16", "bfloat16")  # the 16-bit input types the tensor cores multiply here
# d = dv that a warp's tile takes in the forward (v6), the backward (v2) and decode's split kernel: multiples of 8
# (rows of 16-byte pieces, one cp.async each) up to 256, as FlashAttention-2. In shared memory and in the
# fragments a row is padded with zero columns to DP, d rounded up to 32 (one ldmatrix of K_j covers 32 dims: two
# mma steps); only d columns are read from HBM and written back.
MAX_HEAD_DIM = 256
HEAD_DIMS = tuple(range(8, MAX_HEAD_DIM + 1, 8))
PAD_DIMS_TO = 2 * 16  # DP: d rounded up to a multiple of this
BACKWARD_HEAD_DIMS = HEAD_DIMS  # the backward's kernel v2 (mma.sync): the same head dims
# Fast approximate exp2 and division, fused multiply-adds, denormals flushed to zero; but not the flags that
# assume no inf or NaN ('ninf', 'nnan'): the mask and the rows that see no key rely on -inf.
FAST_MATH = {"afn", "arcp", "contract"}
# Lazy rescaling: a row keeps its reference max m_i until a tile's max exceeds it by more than this (base 2),
# so P_ij = exp2(scale · S_ij - m_i) stays at most 2^8 = 256: exact in float32, in range in float16 and bfloat16
RESCALE_LOG2 = 8.0
NEG_INF = float32(-np.inf)
ZERO, ONE, TWO, FOUR, EIGHT, SIXTEEN = u(0), u(1), u(2), u(4), u(8), u(16)


@dataclass(frozen=True)
class WarpTile:
    """What a warp's tile is made of: the 16-bit ``element`` type, head dim D, BC keys per tile, ROW_TILES
    16-row tiles per warp; Q_i's A operands read from shared memory per key tile (Q_IN_SMEM) or held in
    registers; the running state rescaled lazily (LAZY_RESCALE) or at every tile; ``out_packed``: the output
    written as 16-bit pairs (the input's type) or as float32; COLUMN_GROUPS warps share a row tile's acc, each
    holding DP / COLUMN_GROUPS of its columns (``p_times_v`` then reads V_j from the address of the warp's first
    column: the backward's dK_j and dV_j past d = 128, which would not fit in one warp's registers)."""

    element: str
    D: int
    BC: int
    ROW_TILES: int = 1
    Q_IN_SMEM: bool = False
    LAZY_RESCALE: bool = False
    out_packed: bool = True
    COLUMN_GROUPS: int = 1

    @property
    def DP(self) -> int:  # the head dim of the fragments and of a row in shared memory (d padded with zeros)
        return padded_head_dim(self.D)

    @property
    def ROW_WORDS(self) -> int:  # words (pairs of 16-bit values) of one padded row in shared memory
        return self.DP // 2 + PAD_WORDS

    @property
    def K_STEPS(self) -> int:  # mma steps over d (padded)
        return self.DP // MMA_K

    @property
    def S_TILES(self) -> int:  # 16 × 8 tiles of S_ij per row tile
        return self.BC // MMA_N

    @property
    def O_TILES(self) -> int:  # 16 × 8 tiles of O_i per row tile (padded) held by one warp
        return self.DP // (MMA_N * self.COLUMN_GROUPS)

    @property
    def OUT_TILES(self) -> int:  # those written to HBM: the d columns
        return self.D // MMA_N

    @property
    def P_STEPS(self) -> int:  # mma steps over the keys of P_ij V_j
        return self.BC // MMA_K


def padded_head_dim(d: int) -> int:
    """DP: the head dim ``d`` rounded up to a multiple of PAD_DIMS_TO (d itself at 32, 64, 96, 128, ..., 256)."""
    return -(-d // PAD_DIMS_TO) * PAD_DIMS_TO


def head_dims_text(dims: tuple) -> str:
    """The head dims ``dims`` in words, for error messages: 'one of (64, 128)', or 'a multiple of 8 up to 256'."""
    return f"a multiple of 8 up to {MAX_HEAD_DIM}" if tuple(dims) == HEAD_DIMS else f"one of {tuple(dims)}"


def tile_problems(D: int, ROW_TILES: int, rows: str, head_dims: tuple = HEAD_DIMS) -> list[str]:
    """What makes a tensor-core tiling's warp tile invalid (empty if nothing): its head dim (one of ``head_dims``),
    its 16-``rows`` tiles."""
    problems = [] if D in head_dims else [f"D must be {head_dims_text(head_dims)}"]
    if ROW_TILES not in (1, 2):
        problems.append(f"ROW_TILES (16-{rows} tiles per warp) must be 1 or 2")
    return problems


def products(spec: WarpTile):
    """The tensor-core pieces: ``lane_rows`` (each lane's ldmatrix offsets), ``load_q`` (Q_i's A operands into
    registers), ``scores`` (S_ij = Q_i K_jᵀ) and ``p_times_v`` (acc += P_ij V_j)."""
    mma, pack = ptx.mma_m16n8k16(spec.element), ptx.pack(spec.element)
    RW = u(spec.ROW_WORDS)  # words per row in shared memory (padded)
    KEYS8_BYTES = 8 * spec.ROW_WORDS * 4  # 8 rows of shared memory, in bytes
    ROW_TILES, K_STEPS, S_TILES, O_TILES, P_STEPS = (spec.ROW_TILES, spec.K_STEPS, spec.S_TILES, spec.O_TILES,
                                                     spec.P_STEPS)
    Q_IN_SMEM = spec.Q_IN_SMEM

    @cuda.jit(device=True, inline="always")
    def lane_rows(lane):
        """Byte offsets of the row each lane gives ldmatrix, computed once: for K_j, lanes 8i .. 8i+7 give
        keys 0-7 at dims 8i (8 keys × 32 dims: the B operands of 2 mma steps); for a 16 × 16 block of Q_i
        or V_j, lanes 0-15 give rows 0-15 and lanes 16-31 the same rows 8 columns on (an A operand's order).
        Each tile then adds a constant, which the compiler folds into the instruction."""
        k_lane = ((lane % EIGHT) * RW + (lane // EIGHT) * FOUR) * FOUR
        block_lane = ((lane % SIXTEEN) * RW + (lane // SIXTEEN) * FOUR) * FOUR
        return uint32(k_lane), uint32(block_lane)

    @cuda.jit(device=True, inline="always")
    def load_q(qf, q_warp, kk):
        """Q_i's A operands of mma steps kk and kk + 1 (dims 16kk .. 16kk+31) for each of the warp's row
        tiles, from shared memory by ldmatrix (one per row tile and step)."""
        for r in range(ROW_TILES):
            for h in range(2):  # rows 16r .. (16 rows: 2 · KEYS8_BYTES), dims 16(kk + h) .. (32 bytes)
                qf[r, kk + h, 0], qf[r, kk + h, 1], qf[r, kk + h, 2], qf[r, kk + h, 3] = ptx.ldmatrix_x4(
                    q_warp + uint32(r * 2 * KEYS8_BYTES + (kk + h) * 2 * MMA_K))

    @cuda.jit(device=True, inline="always")
    def two_steps(s, qf, n, kk, k_lane_addr):
        """s[r, n] += mma steps kk and kk + 1 (dims 16kk .. 16kk+31) for keys 8n .. 8n+7 and every row tile r:
        the A operands from qf, the B operands from one ldmatrix of K_j (8 keys × 32 dims)."""
        b = ptx.ldmatrix_x4(k_lane_addr + uint32(n * KEYS8_BYTES + kk * 2 * MMA_K))  # keys 8n.., dims 16kk..
        for r in range(ROW_TILES):  # the same b for every row tile: one read, 2 · ROW_TILES mma's
            for h in range(2):  # steps kk and kk + 1
                s[r, n, 0], s[r, n, 1], s[r, n, 2], s[r, n, 3] = mma(
                    qf[r, kk + h, 0], qf[r, kk + h, 1], qf[r, kk + h, 2], qf[r, kk + h, 3], b[2 * h],
                    b[2 * h + 1], s[r, n, 0], s[r, n, 1], s[r, n, 2], s[r, n, 3])

    def pairs_from(kk):
        """A device function: S_ij += mma steps kk .. K_STEPS - 1, two at a time, each pair's Q operands read
        from Q_i in shared memory (q_warp) and used by every S tile. Unrolled here, in Python: the compiler
        leaves a loop over the pairs rolled, and then qf, indexed by the loop's step, goes to local memory."""
        if kk == K_STEPS:
            return cuda.jit(device=True, inline="always")(lambda s, qf, q_warp, k_lane_addr: None)
        rest = pairs_from(kk + 2)

        @cuda.jit(device=True, inline="always")
        def pair(s, qf, q_warp, k_lane_addr):
            load_q(qf, q_warp, kk)  # only this pair's Q operands are live: 2 · ROW_TILES · 4 registers
            for n in range(S_TILES):
                two_steps(s, qf, n, kk, k_lane_addr)
            rest(s, qf, q_warp, k_lane_addr)

        return pair

    q_pairs = pairs_from(0)

    @cuda.jit(device=True, inline="always")
    def scores(s, qf, q_warp, k_lane_addr):
        """S_ij = Q_i K_jᵀ for the warp's rows, s[r, n] the lane's part of row tile r and keys 8n .. 8n+7
        (not yet scaled: the scale is folded into the exponent, one fused multiply-add per score).
        Q's operands in registers: S tile by S tile, each over all of d. Q_IN_SMEM: pair of mma steps by
        pair (all S tiles' accumulators live, as they are anyway), Q's operands read pair by pair."""
        for r in range(ROW_TILES):
            for n in range(S_TILES):
                for e in range(4):
                    s[r, n, e] = float32(0.0)
        if Q_IN_SMEM:
            q_pairs(s, qf, q_warp, k_lane_addr)
        else:
            for n in range(S_TILES):
                for kk in range(0, K_STEPS, 2):
                    two_steps(s, qf, n, kk, k_lane_addr)

    @cuda.jit(device=True, inline="always")
    def p_times_v(acc, s, v_lane_addr):
        """acc += P_ij V_j: P_ij packed from the S accumulators (their layout is the A operand's), V_j by
        ldmatrix.trans, 16 keys × 16 dims per instruction, each feeding every row tile's mma's."""
        a = cuda.local.array((ROW_TILES, 4), uint32)  # per row tile, the A operand of keys 16kk .. 16kk+15
        for kk in range(P_STEPS):
            for r in range(ROW_TILES):
                for h in range(2):  # keys 16kk + 8h ..: the S tile 2kk + h, rows g and g + 8
                    a[r, 2 * h] = pack(s[r, 2 * kk + h, 0], s[r, 2 * kk + h, 1])
                    a[r, 2 * h + 1] = pack(s[r, 2 * kk + h, 2], s[r, 2 * kk + h, 3])
            for n in range(0, O_TILES, 2):  # keys 16kk .., dims 8n ..: 16 bytes per 8 dims
                b = ptx.ldmatrix_x4_trans(v_lane_addr + uint32(kk * 2 * KEYS8_BYTES + n * MMA_K))
                for r in range(ROW_TILES):  # the same b for every row tile: one read, 2 · ROW_TILES mma's
                    for h in range(2):
                        acc[r, n + h, 0], acc[r, n + h, 1], acc[r, n + h, 2], acc[r, n + h, 3] = mma(
                            a[r, 0], a[r, 1], a[r, 2], a[r, 3], b[2 * h], b[2 * h + 1],
                            acc[r, n + h, 0], acc[r, n + h, 1], acc[r, n + h, 2], acc[r, n + h, 3])

    return lane_rows, load_q, scores, p_times_v


def softmax(spec: WarpTile):
    """The online softmax's pieces: ``mask_row``, ``softmax_step`` (row max, rescale, P_ij), and for a kernel whose
    product into acc runs meanwhile ``softmax_step_deferred`` and ``rescale_acc``."""
    ROW_TILES, S_TILES, O_TILES = spec.ROW_TILES, spec.S_TILES, spec.O_TILES
    LAZY_RESCALE = spec.LAZY_RESCALE

    @cuda.jit(device=True, inline="always")
    def mask_row(s, r, half, stop, k_start, t):
        """S_ij = -inf for the keys at or past ``stop`` of row g + 8·half of row tile r: the lane's keys are
        k_start + 8n + 2t (+1)."""
        for n in range(S_TILES):
            for e in range(2):
                if k_start + uint64(n) * EIGHT + TWO * t + uint64(e) >= stop:
                    s[r, n, 2 * half + e] = NEG_INF

    @cuda.jit(device=True, inline="always")
    def row_max(s, r, half, scale_log2):
        """rowmax(S_ij) of row g + 8·half of row tile r, scaled (base 2): the lane's keys, then over the 4
        lanes of its group."""
        m = NEG_INF
        for n in range(S_TILES):
            m = max(m, max(s[r, n, 2 * half], s[r, n, 2 * half + 1]))
        m = max(m, ptx.shfl_xor(m, 1))
        return max(m, ptx.shfl_xor(m, 2)) * scale_log2  # scale > 0: the max of the scaled scores

    @cuda.jit(device=True, inline="always")
    def grows(m_i, m_tile):
        """Lazy rescaling: whether the max of any of the lane's rows grows past its reference m_i by more than
        2^RESCALE_LOG2 in this tile (always true on a row's first allowed keys: m_i = -inf). One decision for
        the lane's 2 · ROW_TILES rows, so that the common case, no rescaling, is one branch per tile."""
        out = False
        for r in range(ROW_TILES):
            for half in range(2):
                out = out or m_tile[r, half] > m_i[r, half] + float32(RESCALE_LOG2)
        return out

    @cuda.jit(device=True, inline="always")
    def new_reference(m_i, l_i, r, half, m_tile):
        """m_new = max(m_i, m_tile) becomes m_i; alpha = exp(m_i - m_new) rescales l_i and is returned for acc
        (row g + 8·half of row tile r; base 2; l_i is the lane's share of the row sum)."""
        m_new = max(m_i[r, half], m_tile)
        m_safe = m_new if m_new != NEG_INF else float32(0.0)  # no allowed key yet: avoid -inf - -inf
        alpha = math.exp2(m_i[r, half] - m_safe)
        m_i[r, half] = m_new
        l_i[r, half] *= alpha
        return alpha

    @cuda.jit(device=True, inline="always")
    def rescale(m_i, l_i, acc, r, half, m_tile):
        """The row's new reference (:func:`new_reference`); its alpha rescales acc too."""
        alpha = new_reference(m_i, l_i, r, half, m_tile)
        for n in range(O_TILES):
            acc[r, n, 2 * half] *= alpha
            acc[r, n, 2 * half + 1] *= alpha

    @cuda.jit(device=True, inline="always")
    def exponentiate(s, m_i, l_i, r, half, scale_log2):
        """P_ij = exp(scale · S_ij - m_i) replaces S_ij, and l_i += rowsum(P_ij) (row g + 8·half of row tile r;
        base 2: one fused multiply-add and one exp2 per score)."""
        m_safe = m_i[r, half] if m_i[r, half] != NEG_INF else float32(0.0)
        for n in range(S_TILES):
            for e in range(2):
                s[r, n, 2 * half + e] = math.exp2(s[r, n, 2 * half + e] * scale_log2 - m_safe)  # P_ij, unnormalised
                l_i[r, half] += s[r, n, 2 * half + e]

    @cuda.jit(device=True, inline="always")
    def softmax_step(s, m_i, l_i, acc, m_tile, scale_log2):
        """Stage 1's online-softmax update for the warp's rows: the tile's row maxima; the running state
        rescaled to the new maxima (lazily: only when one of the lane's rows grows by more than
        2^RESCALE_LOG2, else m_i stays each row's reference and P_ij <= 2^RESCALE_LOG2; O_i = acc / l_i and
        lse_i = m_i + log l_i hold for any reference, as long as nothing overflows); then P_ij."""
        for r in range(ROW_TILES):
            for half in range(2):
                m_tile[r, half] = row_max(s, r, half, scale_log2)
        if not LAZY_RESCALE or grows(m_i, m_tile):
            for r in range(ROW_TILES):
                for half in range(2):
                    rescale(m_i, l_i, acc, r, half, m_tile[r, half])
        for r in range(ROW_TILES):
            for half in range(2):
                exponentiate(s, m_i, l_i, r, half, scale_log2)

    @cuda.jit(device=True, inline="always")
    def softmax_step_deferred(s, m_i, l_i, alpha, m_tile, scale_log2):
        """softmax_step with acc left alone, for a kernel whose product into acc is still running: the same
        row maxima, references, l_i and P_ij; each row's factor goes to alpha[r, half]. Returns whether the
        rows were rescaled: then :func:`rescale_acc` applies alpha once the product is waited for (the same
        arithmetic as softmax_step's, in another order: acc · alpha, then + P_ij V_j)."""
        for r in range(ROW_TILES):
            for half in range(2):
                m_tile[r, half] = row_max(s, r, half, scale_log2)
        rescaled = not LAZY_RESCALE or grows(m_i, m_tile)
        if rescaled:
            for r in range(ROW_TILES):
                for half in range(2):
                    alpha[r, half] = new_reference(m_i, l_i, r, half, m_tile[r, half])
        for r in range(ROW_TILES):
            for half in range(2):
                exponentiate(s, m_i, l_i, r, half, scale_log2)
        return rescaled

    @cuda.jit(device=True, inline="always")
    def rescale_acc(acc, alpha):
        """acc *= alpha, row by row: the rescaling that softmax_step_deferred left to do."""
        for r in range(ROW_TILES):
            for half in range(2):
                for n in range(O_TILES):
                    acc[r, n, 2 * half] *= alpha[r, half]
                    acc[r, n, 2 * half + 1] *= alpha[r, half]

    return mask_row, softmax_step, softmax_step_deferred, rescale_acc


def output(spec: WarpTile):
    """The epilogue, a kernel's only writes of O_i and lse_i to HBM: ``epilogue``."""
    pack = ptx.pack(spec.element)
    DW, D_ = u(spec.D // 2), u(spec.D)  # words per row in HBM, elements per row in HBM
    OUT_TILES = spec.OUT_TILES  # the 8-column tiles of O_i in HBM (the rest are padding)
    ROW_TILES, OUT_PACKED = spec.ROW_TILES, spec.out_packed

    @cuda.jit(device=True, inline="always")
    def store_pair(O, o_off, row, n, t, x0, x1):
        """Columns 8n + 2t, +1 of ``row``: one word of two 16-bit values (out_packed), or two float32 values."""
        if OUT_PACKED:
            O[o_off + row * DW + uint64(n) * FOUR + t] = pack(x0, x1)
        else:
            O[o_off + row * D_ + uint64(n) * EIGHT + TWO * t] = x0
            O[o_off + row * D_ + uint64(n) * EIGHT + TWO * t + ONE] = x1

    @cuda.jit(device=True, inline="always")
    def epilogue(acc, m_i, l_i, O, LSE, o_off, lse_off, row, t, n_rows):
        """O_i = acc / l_i, lse_i = m_i + log(l_i) for rows row + 16r + 8·half below ``n_rows``: each row's sum is
        4 lanes' shares, added first; a row that saw no key gets O = 0 and lse = -inf."""
        for r in range(ROW_TILES):
            for half in range(2):
                l_row = l_i[r, half] + ptx.shfl_xor(l_i[r, half], 1)
                l_row += ptx.shfl_xor(l_row, 2)
                q_row = row + uint64(r * MMA_M + half * 8)
                if q_row < n_rows:
                    inv_l = float32(1.0) / l_row if l_row != 0 else float32(0.0)
                    for n in range(OUT_TILES):  # the lane's 2 columns 8n + 2t, +1
                        store_pair(O, o_off, q_row, n, t, acc[r, n, 2 * half] * inv_l, acc[r, n, 2 * half + 1] * inv_l)
                    if t == ZERO:
                        LSE[lse_off + q_row] = (m_i[r, half] + math.log2(l_row)) * LN2 if l_row != 0 else NEG_INF

    return epilogue


def modifications(spec: WarpTile, score_mod, mask_mod):
    """FlexAttention's user functions on the lane's scores, ``score_mod(score, b, h, q_idx, kv_idx)`` and
    ``mask_mod(b, h, q_idx, kv_idx)``, each a device function compiled into the kernel (or None): ``score_mods``
    and ``mask_mods``, both ``(s, b, h, row, k_start, t, n_q, n_k, scale)``. The lane's scores are rows
    row + 16r + 8·half, keys k_start + 8n + 2t (+1), as in ``mask_row``; the functions see them as int64 (signed:
    q_idx - kv_idx may be negative). Neither is called for a row at or past n_q nor a key at or past n_k (the
    ragged tiles' padding, which the kernel masks anyway): a function that indexes a table of Nq or Nk entries
    never reads past it."""
    TO_BASE_2 = float32(LOG2E)

    @cuda.jit(device=True, inline="always")
    def score_tile(s, r, n, b, h, row, k_start, t, n_q, n_k, scale):
        """S_ij = score_mod(scale · S_ij, b, h, q_idx, kv_idx) · log2(e) on s[r, n]: the modified score, in the
        base 2 of the softmax step, which then takes it with a scale of 1."""
        for half in range(2):
            q_idx = row + uint64(r * MMA_M + half * 8)
            for e in range(2):
                kv_idx = k_start + uint64(n) * EIGHT + TWO * t + uint64(e)
                if q_idx < n_q and kv_idx < n_k:
                    x = s[r, n, 2 * half + e] * scale  # the scaled score, as FlexAttention gives it
                    s[r, n, 2 * half + e] = float32(score_mod(x, b, h, int64(q_idx), int64(kv_idx))) * TO_BASE_2

    @cuda.jit(device=True, inline="always")
    def mask_tile(s, r, n, b, h, row, k_start, t, n_q, n_k, scale):
        """S_ij = -inf on s[r, n] where mask_mod(b, h, q_idx, kv_idx) is False."""
        for half in range(2):
            q_idx = row + uint64(r * MMA_M + half * 8)
            for e in range(2):
                kv_idx = k_start + uint64(n) * EIGHT + TWO * t + uint64(e)
                if q_idx < n_q and kv_idx < n_k and not mask_mod(b, h, int64(q_idx), int64(kv_idx)):
                    s[r, n, 2 * half + e] = NEG_INF

    return (each_tile(spec, score_tile) if score_mod is not None else None,
            each_tile(spec, mask_tile) if mask_mod is not None else None)


def each_tile(spec: WarpTile, apply, first: int = 0):
    """A device function ``(s, *arguments)`` that calls ``apply(s, r, n, *arguments)`` on each of the lane's 16 × 8
    tiles of S_ij, r and n constants: unrolled here, in Python (a chain of device functions, as ``pairs_from``), for
    the compiler leaves a loop rolled when its body is long (a user's function, ``math.tanh``), and s, indexed by
    the loop's counters, then goes to local memory."""
    if first == spec.ROW_TILES * spec.S_TILES:
        return cuda.jit(device=True, inline="always")(lambda s, b, h, row, k_start, t, n_q, n_k, scale: None)
    R, N = divmod(first, spec.S_TILES)
    rest = each_tile(spec, apply, first + 1)

    @cuda.jit(device=True, inline="always")
    def tile(s, b, h, row, k_start, t, n_q, n_k, scale):
        apply(s, R, N, b, h, row, k_start, t, n_q, n_k, scale)
        rest(s, b, h, row, k_start, t, n_q, n_k, scale)

    return tile


@lru_cache(maxsize=None)
def warp_tile(spec: WarpTile) -> SimpleNamespace:
    """The device functions of a warp's tile (module docstring) for ``spec``, from the pieces :func:`products`,
    :func:`softmax` and :func:`output`."""
    lane_rows, load_q, scores, p_times_v = products(spec)
    mask_row, softmax_step, softmax_step_deferred, rescale_acc = softmax(spec)
    epilogue = output(spec)
    return SimpleNamespace(lane_rows=lane_rows, load_q=load_q, scores=scores, mask_row=mask_row,
                           softmax_step=softmax_step, softmax_step_deferred=softmax_step_deferred,
                           rescale_acc=rescale_acc, p_times_v=p_times_v, epilogue=epilogue)
