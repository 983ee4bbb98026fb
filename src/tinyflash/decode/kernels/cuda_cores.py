"""The split kernel of decoding on the CUDA cores: float32 arithmetic on float16, bfloat16 or float32 inputs,
at any head dim up to 256 (the tensor cores take two).

One thread block per (split, K/V head of one sequence, chunk of packed query rows). With
grouped-query attention, the kv_group query heads that share a K/V head (times Nq query rows each)
are *packed* into the block's rows, so each K/V byte is read from HBM once for all of them. The
block walks its split's keys (``keys.split_keys``) in tiles of BK keys:

    threads:  lane = tid % TD  owns columns [lane·VEC, lane·VEC + VEC) of a key row (16 bytes; or 32)
              slot = tid // TD owns keys  tile + slot, + KP, ..., + (U - 1)·KP   (KP = NT / TD slots,
                                          U keys per slot and tile, BK = KP · U)
    a ring of STAGES tiles in shared memory, filled by cp.async (HBM -> shared memory directly):
        tile j + STAGES - 1 is requested, then tile j is waited for and computed:
        S_ij = scale · q_r · K_j      partial dot product over the lane's columns, then a sum over
                                      the TD lanes of the slot (shuffles: tinyflash.gpu.warp)
        mask                           keys past the split, the sequence, or the diagonal: -inf
        m_new, alpha, P, l, acc        the online softmax, in registers, once per tile and row

Why a ring of shared memory, not loads into registers: a load in flight in registers holds those
registers until it lands, so fewer blocks fit on an SM and fewer bytes are in flight than HBM
needs: an H200 needs about 4.8 TB/s × ~1 µs / 132 SMs ≈ 36 KB in flight per SM (Little's law). A
cp.async holds no register: in flight per block = (STAGES - 1) tiles = 2 × 32 keys × 512 bytes (K
and V rows of d = 128, float16) = 32 KB. Each thread copies exactly the 16-byte pieces it later
reads (its slot's keys, its lane's columns), so it waits only for its own copies: no barrier in the
loop. What limits it then is the instructions per key it issues (products and shuffles for the
packed rows, conversions, the softmax repeated in each of the TD lanes): the tensor-core split
kernel (``tensor_cores.py``) issues far fewer, and takes float16 and bfloat16 at its head dims.

After the loop the KP slots' states are merged through shared memory (the ring's space) with the
online softmax's rule (:func:`tinyflash.core.online_softmax.merge_weights`) and the block writes its
partial (O_s, lse_s); ``combine.py`` merges the splits.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, types, uint32, uint64

from ...core.masks import key_stop
from ...core.online_softmax import LN2, merge_weights
from ...gpu import elements, ptx
from ...gpu.driver_launch import flat_type
from ...gpu.loads import vector_load
from ...gpu.runtime import device_function, simulator_enabled, u
from ...gpu.smem import shared_floats, shared_words
from ...gpu.warp import group_sum
from .split import NO_PAGE, SplitKernel, key_row_offset, split_keys

NEG_INF = float32(-np.inf)
ZERO, ONE = u(0), u(1)
key_stop = device_function(key_stop)  # the causal rule of tinyflash.core.masks, compiled for the GPU
merge_weights = device_function(merge_weights)  # the online softmax's merge, from tinyflash.core

GPU_THREADS = 128  # threads per block on a GPU: 4 warps
SIMULATOR_THREADS = 32  # on the simulator (one Python thread per CUDA thread): one warp
MAX_ROWS = 8  # packed query rows per block at most (their q and acc live in registers)
UNROLL = 4  # U: keys per slot and tile (a tile is KP · U keys: 32 at d = 128, float16)
STAGES = 3  # tiles in the shared-memory ring: STAGES - 1 in flight while one is computed
LOAD_BYTES = 16  # bytes per thread and copy (one cp.async, or one vector load)
ELEMENT_TYPES = {2: types.float16, 4: float32}  # itemsize -> the element type of K, V and the ring
BITS = types.uint16  # ... and for bfloat16, held as its 16-bit patterns (gpu/elements.py)


def default_threads() -> int:
    """Threads per block: a warp on the simulator (one Python thread per CUDA thread), 4 on a GPU."""
    return SIMULATOR_THREADS if simulator_enabled() else GPU_THREADS


# Resident blocks per SM of the default shape (d = 128, float16; ptxas for sm_90): 128 threads × 127 registers
# (4 blocks fit in 65,536 registers) and a 48 KB ring of K/V tiles (4 fit in the 228 KB of shared memory)
BLOCKS_PER_SM = 4


def split_kernel(prob, page_size: int, threads: int | None = None, unroll: int | None = None,
                 row_bytes: int | None = None, max_registers: int | None = None) -> SplitKernel:
    """The split kernel for one call (``prob``: the checked problem; ``page_size`` 0 for a contiguous cache);
    its block size ``threads``, keys per slot and tile ``unroll``, bytes per thread and key row ``row_bytes`` (a
    multiple of 16) and a cap on registers per thread other than the defaults (:func:`default_threads`, UNROLL,
    LOAD_BYTES, none)."""
    d = prob.d
    row_bytes = row_bytes or LOAD_BYTES
    if row_bytes % LOAD_BYTES:
        raise ValueError(f"row_bytes must be a multiple of {LOAD_BYTES}; got {row_bytes}")
    itemsize, element = elements.itemsize(prob.dtype), elements.kernel_element(prob.dtype)
    VEC, D, TD = lanes(d, itemsize, row_bytes)
    if TD > 32:
        raise ValueError(f"the CUDA-core decode kernel supports head dims up to {32 * VEC} for {prob.dtype}; got d={d}")
    nt, unroll = threads or default_threads(), unroll or UNROLL
    if nt % 32 or nt < TD or unroll < 1:
        raise ValueError(f"threads must be a multiple of 32 and at least {TD}, unroll at least 1; got {nt}, {unroll}")
    full = d == D  # whole 16-byte pieces per row: K and V are copied by cp.async, as uint32 words

    def build(rb):
        return make_split_kernel(rb, D, VEC, nt, full, page_size, unroll, itemsize, max_registers, element)

    return SplitKernel(build, nt, MAX_ROWS, BLOCKS_PER_SM, split_signature(prob.dtype, full), ("K", "V") if full else ())


def lanes(d: int, itemsize: int, row_bytes: int = LOAD_BYTES) -> tuple[int, int, int]:
    """(VEC, D, TD): elements per thread and key row (``row_bytes`` of them: one 16-byte copy, or
    several), the head dim padded so that TD = D / VEC lanes per key row is a power of two (the
    shuffles sum over groups of TD lanes), and TD. Fewer lanes per row (more bytes each) mean fewer
    shuffles and less of the softmax repeated per lane, but more registers (q and acc: VEC per row)."""
    VEC = row_bytes // itemsize
    TD = 1 << max(0, math.ceil(math.log2(-(-d // VEC))))  # lanes per key row, a power of two
    return VEC, VEC * TD, TD


def split_smem_bytes(RB: int, D: int, VEC: int, NT: int, itemsize: int, unroll: int = UNROLL) -> int:
    """Shared memory of the split kernel: the ring (STAGES tiles of K_j and V_j), reused after the
    loop for the slots' states (m, l and acc of every slot and row) when they are merged."""
    KP = NT // (D // VEC)
    ring = STAGES * 2 * KP * unroll * D * itemsize
    return max(ring, 4 * KP * RB * (D + 2))


def shared_elements(element):
    """The block's dynamic shared memory seen as ``element`` values (the ring of K/V tiles); it is
    the same memory as :func:`~tinyflash.gpu.smem.shared_words` (the cp.async side)."""
    if simulator_enabled():

        @cuda.jit(device=True)
        def elements():
            return cuda.shared.array(0, element)

        return elements

    @cuda.jit(device=True, inline="always")
    def elements():
        return cuda.shared.array(0, element, alignment=16)

    return elements


def slots(D: int, VEC: int, NT: int, unroll: int) -> tuple:
    """``(TD, KP, BK, TILE)``: lanes per key row, key slots, keys per tile (uint64) and elements of one K_j (or
    V_j) tile in the ring (uint64), for head dim D padded, VEC elements per thread and key row, NT threads."""
    TD = D // VEC  # lanes per key row
    KP = NT // TD  # key slots
    BK = u(KP * unroll)  # keys per tile
    return TD, KP, BK, BK * u(D)


def ring_copies(D: int, VEC: int, NT: int, full: bool, page_size: int, unroll: int, itemsize: int,
                element: str | None):
    """``copy_tile``: a thread's pieces of one tile's K and V rows into a stage of the ring, by cp.async (``full``
    rows) or element by element."""
    BF16 = element == elements.BFLOAT16  # bfloat16 patterns, held as they are
    _, KP, _, TILE = slots(D, VEC, NT, unroll)
    PIECES = u(VEC * itemsize // LOAD_BYTES)  # 16-byte copies per thread and key row
    PIECE = u(LOAD_BYTES // itemsize)  # elements per copy
    D_, VEC_, KP_, U_ = u(D), u(VEC), u(KP), u(unroll)
    WORD = u(4 // itemsize)  # elements per 32-bit word
    row_offset = key_row_offset(page_size)

    @cuda.jit(device=True, inline="always")
    def copy_tile(K, V, ring_w, ring, TABLE, b, bkv, kv_head, tile0, seq_len, stage_loc, slot, col0, n_k, h_kv,
                  max_pages, d, seen):
        """Request this thread's pieces of tile ``tile0``'s K and V rows (keys tile0 + slot + t·KP,
        columns col0 ..) into the ring at element ``stage_loc`` (+ t·KP·D); keys at or past the
        sequence's end become zeros (their scores are masked). Full rows: one cp.async each, in
        flight until waited for; else element by element, at once."""
        for t in range(U_):
            key = tile0 + slot + t * KP_
            inside = key < seq_len
            off = row_offset(TABLE, b, bkv, kv_head, min(key, seq_len - ONE), n_k, h_kv, max_pages, d, seen)
            dst = stage_loc + t * KP_ * D_  # the key's row in the tile, this thread's columns
            if full:  # VEC elements: PIECES copies of 16 bytes
                nbytes = uint32(LOAD_BYTES) if inside else uint32(0)
                for c in range(PIECES):
                    src, at = (off + col0 + c * PIECE) // WORD, dst + c * PIECE
                    ptx.cp_async_16(ptx.shared_address(ring_w, at // WORD), K, src, nbytes)
                    ptx.cp_async_16(ptx.shared_address(ring_w, (at + TILE) // WORD), V, src, nbytes)
            else:
                for e in range(VEC_):
                    ok = inside and col0 + e < d
                    if BF16:  # the patterns as they are (a zero pattern is 0.0)
                        ring[dst + e] = K[off + col0 + e] if ok else 0
                        ring[dst + TILE + e] = V[off + col0 + e] if ok else 0
                    else:
                        ring[dst + e] = float32(K[off + col0 + e]) if ok else float32(0.0)
                        ring[dst + TILE + e] = float32(V[off + col0 + e]) if ok else float32(0.0)
        ptx.cp_async_commit()  # one group per tile (an empty one on the element path)

    return copy_tile


def slot_steps(RB: int, D: int, VEC: int, NT: int, unroll: int, element: str | None):
    """``(scores, mask, update)``: a key slot's step of the online softmax over its U keys of a tile, for RB
    packed rows: scores summed over the slot's lanes, the mask, then m, l and acc updated with P·V."""
    widen = elements.widen(element)  # an element as float32
    TD, KP, _, TILE = slots(D, VEC, NT, unroll)
    RB_, D_, VEC_, KP_, U_ = u(RB), u(D), u(VEC), u(KP), u(unroll)
    load_vec = vector_load(VEC)
    lane_sum = group_sum(TD)

    @cuda.jit(device=True, inline="always")
    def scores(s, kf, ring, loc, q):
        """s[r, t] = scale · log2(e) · q_r · K_key for the slot's U keys of this tile (base 2)."""
        for t in range(U_):
            x = load_vec(ring, loc + t * KP_ * D_)  # the lane's VEC elements of the key's K row
            for e in range(VEC_):
                kf[e] = widen(x[e])
            for r in range(RB_):
                part = float32(0.0)
                for e in range(VEC_):
                    part += q[r, e] * kf[e]
                s[r, t] = lane_sum(part)  # summed over the TD lanes of the slot

    @cuda.jit(device=True, inline="always")
    def mask(s, key0, k_end, row_stop):
        """S_ij = -inf for keys past the split or the sequence, or after the diagonal (causal)."""
        for t in range(U_):
            key = key0 + t * KP_
            for r in range(RB_):
                if key >= k_end or key >= row_stop[r]:
                    s[r, t] = NEG_INF

    @cuda.jit(device=True, inline="always")
    def update(s, ring, loc, m_i, l_i, acc):
        """The online softmax over this tile's U keys, once per row: m_new, alpha, then P and P·V."""
        for r in range(RB_):
            m_new = m_i[r]
            for t in range(U_):
                m_new = max(m_new, s[r, t])
            m_safe = m_new if m_new != NEG_INF else float32(0.0)  # no allowed key yet
            alpha = math.exp2(m_i[r] - m_safe)  # rescale: exp(m_old - m_new)
            l_i[r] *= alpha
            for e in range(VEC_):
                acc[r, e] *= alpha
            m_i[r] = m_new
            for t in range(U_):
                s[r, t] = math.exp2(s[r, t] - m_safe)  # P_ij
                l_i[r] += s[r, t]
        for t in range(U_):
            x = load_vec(ring, loc + TILE + t * KP_ * D_)  # the lane's VEC elements of the key's V row
            for e in range(VEC_):
                v = widen(x[e])
                for r in range(RB_):
                    acc[r, e] += s[r, t] * v  # P·V

    return scores, mask, update


def slot_merge(RB: int, D: int, VEC: int, NT: int):
    """``merge_slots``: the KP slots' states merged through shared memory, and the block's partial written."""
    KP = slots(D, VEC, NT, 1)[1]
    RB_, D_, VEC_, KP_, NT_ = u(RB), u(D), u(VEC), u(KP), u(NT)
    M_OFF, L_OFF, A_OFF = u(0), u(KP * RB), u(2 * KP * RB)  # merge: m, l, acc of every slot (floats)

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

    return merge_slots


@lru_cache(maxsize=None)
def make_split_kernel(RB: int, D: int, VEC: int, NT: int, full: bool, page_size: int, unroll: int = UNROLL,
                      itemsize: int = 2, max_registers: int | None = None, element: str | None = None):
    """The split kernel for RB packed rows per block, head dim padded to D, VEC elements of
    ``itemsize`` bytes per thread and key row (whole 16-byte copies), NT threads (a multiple of 32),
    ``unroll`` keys per slot and tile, registers per thread capped at ``max_registers`` (None: no
    cap; fewer registers, more resident blocks, perhaps spills; a compiler option, which the
    simulator does not have); ``full``: d == D (K and V arrive as uint32 words and are copied by
    cp.async; else element by element, zero past d); ``page_size``: 0 for a contiguous cache, else
    the tokens per page of a paged one; ``element`` 'bfloat16' for inputs of bfloat16 patterns, which the ring
    holds as they are and the arithmetic widens (``gpu/elements.py``). The ring's loop is composed of
    :func:`ring_copies` and :func:`slot_steps`, the end of :func:`slot_merge`."""
    widen, BF16 = elements.widen(element), element == elements.BFLOAT16  # an element as float32; bfloat16?
    TD, _, BK, TILE = slots(D, VEC, NT, unroll)
    RB_, D_, VEC_, TD_ = u(RB), u(D), u(VEC), u(TD)
    STAGE = TILE + TILE  # one stage: K_j, then V_j
    STAGES_, AHEAD = u(STAGES), u(STAGES - 1)  # tiles in the ring; tiles requested ahead of the one computed
    ring_elements = shared_elements(BITS if BF16 else ELEMENT_TYPES[itemsize])
    wait_oldest = ptx.cp_async_wait_group(STAGES - 1)  # all but the STAGES - 1 newest tiles have landed
    copy_tile = ring_copies(D, VEC, NT, full, page_size, unroll, itemsize, element)
    scores, mask, update = slot_steps(RB, D, VEC, NT, unroll, element)
    merge_slots = slot_merge(RB, D, VEC, NT)

    # The SMs' on-chip memory as shared memory first (228 KB; L1 gets the rest): room for 4 rings of
    # 48 KB, whatever the driver would otherwise choose. The ring's copies bypass L1 (cp.async.cg).
    @cuda.jit(shared_memory_carveout="MaxShared",
              **({"max_registers": max_registers} if max_registers and not simulator_enabled() else {}))
    def split_kv_decode(Q, K, V, TABLE, LENS, O_PART, LSE_PART, n_q, d, n_k, h_kv, max_pages, scale_log2, causal,
                        kv_group):
        ring_w, ring = shared_words(), ring_elements()  # the ring of K/V tiles: cp.async's side, the reads' side
        tid = uint64(cuda.threadIdx.x)
        split, n_splits, bkv = uint64(cuda.blockIdx.x), uint64(cuda.gridDim.x), uint64(cuda.blockIdx.y)
        n_q, d, n_k, h_kv, max_pages = uint64(n_q), uint64(d), uint64(n_k), uint64(h_kv), uint64(max_pages)
        b, kv_head = bkv // h_kv, bkv % h_kv  # which sequence, which of its K/V heads
        rows = uint64(kv_group) * n_q  # packed rows: the group's query heads × their Nq queries
        row0 = uint64(cuda.blockIdx.z) * RB_  # this block's first packed row
        lane, slot = tid % TD_, tid // TD_
        col0 = lane * VEC_  # this thread's first column
        loc = slot * D_ + col0  # its first element in a tile of the ring (key slot, column col0)

        seq_len = uint64(LENS[b])
        k_begin, k_end, n_tiles = split_keys(seq_len, split, n_splits, BK)  # n_tiles: the same in every thread

        q = cuda.local.array((RB, VEC), float32)  # scale · log2(e) · q_r[its columns], packed rows r
        acc = cuda.local.array((RB, VEC), float32)  # unnormalised O_s[r, its columns]
        m_i = cuda.local.array(RB, float32)  # running max (base 2) of row r over this slot's keys
        l_i = cuda.local.array(RB, float32)  # running denominator
        row_stop = cuda.local.array(RB, uint64)  # row r may attend keys < row_stop[r]
        s = cuda.local.array((RB, unroll), float32)  # scores, then P, of this tile's keys of the slot
        kf = cuda.local.array(VEC, float32)  # one K row's VEC elements of this thread, as float32
        seen = cuda.local.array(2, uint64)  # paged: the last page looked up in the block table, its pool page
        seen[0] = NO_PAGE
        unmasked = k_end  # keys below it are allowed for every row: tiles below it need no mask
        q_row0 = bkv * rows + row0  # packed rows of one K/V head are consecutive rows of q
        for r in range(RB_):
            real = row0 + r < rows
            i = (row0 + r) % n_q  # its query index: the last Nq tokens of the sequence
            row_stop[r] = key_stop(i + ONE, n_q, seq_len, causal) if real else seq_len  # (padding: not written)
            for e in range(VEC_):
                ok = real and col0 + e < d
                q[r, e] = widen(Q[(q_row0 + r) * d + col0 + e]) * scale_log2 if ok else float32(0.0)
                acc[r, e] = float32(0.0)
            m_i[r] = NEG_INF
            l_i[r] = float32(0.0)
            unmasked = min(unmasked, row_stop[r])

        for j in range(AHEAD):  # the ring's first STAGES - 1 tiles requested (an empty group past the split)
            if j < n_tiles:
                copy_tile(K, V, ring_w, ring, TABLE, b, bkv, kv_head, k_begin + j * BK, seq_len, j * STAGE + loc,
                          slot, col0, n_k, h_kv, max_pages, d, seen)
            else:
                ptx.cp_async_commit()
        for j in range(n_tiles):
            ahead = j + AHEAD  # its stage is the one tile j - 1 used: this thread has read it already
            if ahead < n_tiles:
                copy_tile(K, V, ring_w, ring, TABLE, b, bkv, kv_head, k_begin + ahead * BK, seq_len,
                          (ahead % STAGES_) * STAGE + loc, slot, col0, n_k, h_kv, max_pages, d, seen)
            else:
                ptx.cp_async_commit()  # an empty group: the wait below still counts STAGES - 1 groups
            wait_oldest()  # tile j has landed (this thread's own copies: no barrier needed)
            stage_loc = (j % STAGES_) * STAGE + loc
            scores(s, kf, ring, stage_loc, q)
            if k_begin + (j + ONE) * BK > unmasked:  # the same for the whole block: most tiles skip the mask
                mask(s, k_begin + j * BK + slot, k_end, row_stop)
            update(s, ring, stage_loc, m_i, l_i, acc)

        ptx.cp_async_wait_all()  # nothing may still land in the ring once it holds the merge's states
        cuda.syncthreads()  # every thread has read its last tile before the merge overwrites the ring
        merge_slots(shared_floats(), m_i, l_i, acc, O_PART, LSE_PART, (bkv * n_splits + split) * rows + row0, row0,
                    rows, slot, lane, tid, d)

    return split_kv_decode, split_smem_bytes(RB, D, VEC, NT, itemsize, unroll)  # the kernel, its shared memory


@lru_cache(maxsize=None)  # one tuple per (dtype, full): driver_kernel looks kernels up by its identity
def split_signature(dtype, full: bool) -> tuple:
    """split_kv_decode's argument types, for inputs of ``dtype`` (uint16 patterns for 'bfloat16'): Q; K, V
    (uint32 words if ``full``); TABLE, LENS; O_PART, LSE_PART; n_q, d, n_k, h_kv, max_pages; scale·log2(e);
    causal; kv_group."""
    element = flat_type(np.uint16) if str(dtype) == elements.BFLOAT16 else flat_type(dtype)
    kv = flat_type(np.uint32) if full else element
    return ((element, kv, kv, flat_type(np.int32), flat_type(np.int32), flat_type(np.float32),
             flat_type(np.float32))
            + (types.int64,) * 5 + (types.float32, types.boolean, types.int64))
