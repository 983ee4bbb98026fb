"""Kernel v6: the tensor cores. float16 and bfloat16 in, float32 accumulation; stage 3 of tinyflash.

What changed since v5 (stage 2's last CUDA-core kernel):

* Both products, S_ij = Q_i K_jᵀ and P_ij V_j, run on the tensor cores: one ``mma.sync``
  instruction multiplies a 16 × 16 tile by a 16 × 8 tile for a whole warp (``tinyflash.gpu.ptx``,
  which also says which lane holds which element).
* A warp owns 16 query rows, a block WARPS warps: Br = 16 · WARPS. A lane holds its pieces of
  rows g and g + 8 of the warp's S_ij (g = lane // 4), so a row's max and sum are shared by 4
  lanes (two shuffles), never through shared memory.
* Or 32 rows per warp, as FlashAttention-2 has (``ROW_TILES = 2``: two 16-row tiles, Br = 32 · WARPS):
  each K_j, V_j fragment read from shared memory then feeds two mma's instead of one, halving the
  shared-memory reads per mma, at the cost of twice the registers for Q_i, S_ij and acc.
* Q_i's A operands live in registers for the whole kernel, loaded once; or (``Q_IN_SMEM = True``, as
  FlashAttention-2 does at d = 128) they stay in shared memory and are read again by ldmatrix for every
  key tile, two mma steps over d at a time: more shared-memory reads, 2 · 4 · ROW_TILES registers for
  Q_i instead of K_STEPS · 4 · ROW_TILES (64 at d = 128 with two row tiles).
* P_ij stays in registers: the accumulator layout of S_ij, packed to 16-bit pairs, is the
  A-operand layout of P_ij V_j. v5 wrote P_ij to shared memory and read it back.
* Fragments come from shared memory by ``ldmatrix`` (four 8 × 8 matrices per instruction; ``.trans``
  turns V_j, stored key by key, into the column-wise operand the product wants).
* K_j and V_j are double-buffered with ``cp.async``: tile j + 1 is copied from HBM into the other half
  of shared memory while tile j is multiplied; rows are padded by 16 bytes (ldmatrix without bank conflicts).
* The order of the blocks (``block_work``): the GPU starts them in the order of their index; that order
  runs over groups of head_group heads and, in a group, from the last query tile to the first, head by head.
  When causal the last tiles have the longest rows, so the longest blocks start first and the short ones
  fill the gaps at the end; the blocks running together read the K, V of a group's heads only, which stay
  in L2. head_group = 1 (not causal: all blocks equally long) is one head after another, a kernel of its own.
* Lazy rescaling (``LAZY_RESCALE``, as FlashAttention-4 does): a row keeps its reference max until a
  tile's max exceeds it by more than 2^8; most tiles then skip the multiplications of acc and l_i.

FlexAttention (``tinyflash.flex_attention``) is v6 with three hooks in its loop, compiled away when absent:
a score_mod and a mask_mod, the user's Python functions compiled into the kernel, on each tile's scores
(``warp_tile.modifications``); and a block mask's key tiles, which a block visits instead of every tile up to
its causal bound, mask_mod on the partial ones only (``block_sparse.py``). :func:`make_kernel` builds that
kernel, ``flex_fwd``, when given them.

The kernel body reads like stage 1's loop (``tinyflash.forward.blocked``), one device function
per phase: scores, mask, softmax step (row max, rescale, exponentiate), P·V, epilogue; the phases are
a warp's tile on the tensor cores (``tinyflash.warp_tile``), which the decode kernel shares. This file
keeps what is v6's own: the order of its blocks, the copies of Q_i, K_j and V_j into shared memory, the
loop. Its limits: d = dv ∈ ``warp_tile.HEAD_DIMS`` (multiples of 8 up to 256; padded with zero
columns to DP, a multiple of 32, in shared memory).
"""

from __future__ import annotations

from functools import lru_cache

from numba import cuda, float32, int64, uint32, uint64
from numba.cuda import types

from ...core.masks import key_stop
from ...gpu import ptx
from ...gpu.loads import cp_async_rows
from ...gpu.runtime import device_function, u
from ...gpu.smem import shared_words
from ...warp_tile import FAST_MATH, MMA_M, NEG_INF, WARP, modifications, warp_tile
from .block_sparse import tile_walk
from .tensor_core_tiling import TensorCoreTiling

ZERO, ONE, TWO, FOUR = u(0), u(1), u(2), u(4)
key_stop = device_function(key_stop)  # the causal rule of tinyflash.core.masks, compiled for the GPU
WORDS, FLOATS = types.Array(types.uint32, 1, "C"), types.Array(types.float32, 1, "C")
# flash_fwd's argument types: Q, K, V, O as 16-bit pairs, LSE, then n_q, n_k, scale·log2(e), causal, kv_group,
# head_group
SIGNATURE = (WORDS,) * 4 + (FLOATS, types.int64, types.int64, types.float32, types.boolean, types.int64, types.int64)
# flex_fwd's: those, then the scale, the block mask's four lists (int32) and its seven numbers
# (block_sparse.BM_FIELDS), as numba's launch passes them
INTS = types.Array(types.int32, 1, "C")
FLEX_SIGNATURE = SIGNATURE + (types.float32,) + (INTS,) * 4 + (types.int64,) * 7


def block_order(cfg: TensorCoreTiling, grouped: bool):
    """``block_work(head_group)``: (head, first query row) of this block, in the order that ``grouped`` says."""
    BR = u(cfg.BR)

    @cuda.jit(device=True, inline="always")
    def one_head_at_a_time(head_group):
        """(head, first query row) of this block, for head_group = 1: blockIdx.y is the head, blockIdx.x counts
        its query tiles from the last to the first."""
        return uint64(cuda.blockIdx.y), (uint64(cuda.gridDim.x) - ONE - uint64(cuda.blockIdx.x)) * BR

    @cuda.jit(device=True, inline="always")
    def grouped_heads(head_group):
        """(head, first query row) of this block. The GPU starts blocks in the order of their index
        blockIdx.y · gridDim.x + blockIdx.x; read in that order, the blocks run over groups of head_group heads
        and, within a group, over the query tiles from the last to the first, taking each of the group's heads
        in turn (the last group may have fewer heads). In 32 bits (fewer registers than 64): the blocks of any
        problem whose arrays fit in memory are fewer than 2^32."""
        tiles, heads = uint32(cuda.gridDim.x), uint32(cuda.gridDim.y)
        block = uint32(cuda.blockIdx.y) * tiles + uint32(cuda.blockIdx.x)
        group = uint32(head_group)
        first = block // (group * tiles) * group  # the first head of the block's group
        rest = block - first * tiles  # the block's place in its group: tile by tile, head by head
        in_group = min(group, heads - first)  # the group's heads
        return uint64(first + rest % in_group), uint64(tiles - uint32(1) - rest // in_group) * BR

    # two kernels, not one: a run-time branch between the two orders lengthens the main loop of both, so each
    # order is compiled into a kernel of its own (docs/notes: the block orders)
    return grouped_heads if grouped else one_head_at_a_time


@lru_cache(maxsize=None)
def make_kernel(cfg: TensorCoreTiling, element: str, grouped: bool = False, score_mod=None, mask_mod=None,
                block_sparse: bool = False):
    """``flash_fwd`` for one tiling and one element type (float16 or bfloat16); ``grouped``: for head_group > 1
    (its blocks ordered by groups of heads), else for one head at a time (head_group must then be 1).

    With FlexAttention's user functions (``score_mod``, ``mask_mod``: ``gpu.user_code.UserFunction``, compiled
    into the kernel) or a block mask (``block_sparse``), ``flex_fwd`` instead: the same kernel with three hooks
    (the functions on each tile's scores; the key tiles that the block mask lists, partial ones masked by
    mask_mod, full ones not), which takes the scale and the block mask too (``block_sparse.BM_FIELDS``). Without
    them the hooks compile away, and ``flash_fwd`` is v6's kernel alone."""
    cfg.validate()
    spec = cfg.warp_tile(element)
    tile = warp_tile(spec)  # the warp's fragments, scores, softmax step, P·V and epilogue
    lane_rows, load_q, scores, mask_row = tile.lane_rows, tile.load_q, tile.scores, tile.mask_row
    softmax_step, p_times_v, epilogue = tile.softmax_step, tile.p_times_v, tile.epilogue  # (numba types no namespace)
    SCORE_MOD, MASK_MOD, BLOCK_SPARSE = score_mod is not None, mask_mod is not None, bool(block_sparse)
    FLEX = SCORE_MOD or MASK_MOD or BLOCK_SPARSE
    score_mods, mask_mods = modifications(spec, score_mod and score_mod.device, mask_mod and mask_mod.device)
    lists, visit = tile_walk(cfg.BC)  # the key tiles of a block mask
    BR, BC = u(cfg.BR), u(cfg.BC)
    DW = u(cfg.D // 2)  # words per row in HBM
    layout = {name: u(offset) for name, offset in cfg.smem_layout().items()}
    Q_OFF, STAGE0, V_IN_STAGE = layout["Q_i"], layout["stage 0"], layout["V_j in a stage"]
    STAGE = layout["stage 1"] - layout["stage 0"]
    ROW_TILES, WARP_ROWS = cfg.ROW_TILES, u(MMA_M * cfg.ROW_TILES)  # 16-row tiles per warp; its query rows
    WARP_Q_BYTES = cfg.ROW_TILES * 2 * 8 * cfg.ROW_WORDS * 4  # a warp's rows of Q_i in shared memory, in bytes
    K_STEPS, S_TILES, O_TILES, Q_IN_SMEM = spec.K_STEPS, spec.S_TILES, spec.O_TILES, cfg.Q_IN_SMEM
    Q_CHUNKS, KV_CHUNKS = cfg.BR * cfg.CHUNKS // cfg.NT, cfg.BC * cfg.CHUNKS // cfg.NT  # cp.async per thread
    block_work = block_order(cfg, grouped)
    copy_rows = cp_async_rows(cfg.ROW_WORDS, cfg.D // 2, cfg.NT, cfg.DP // 2)  # rows of Q, K, V into shared memory

    @cuda.jit(device=True, inline="always")
    def load_kv(K, V, kv_off, k_start, n_k, stage_addr, tid):
        """K_j and V_j into one stage of shared memory: cp.async, in flight until waited for."""
        copy_rows(K, kv_off, k_start, n_k, stage_addr, tid, KV_CHUNKS)
        copy_rows(V, kv_off, k_start, n_k, stage_addr + uint32(V_IN_STAGE * FOUR), tid, KV_CHUNKS)
        ptx.cp_async_commit()

    @cuda.jit(device=True, inline="always")
    def mask(s, row, k_start, t, n_q, n_k, causal):
        """S_ij = -inf for keys at or past Nk (the ragged last tile) and, if causal, after the diagonal;
        the lane's rows are row + 16r and row + 16r + 8 (row tile r), its keys k_start + 8n + 2t (+1)."""
        for r in range(ROW_TILES):
            for half in range(2):
                stop = key_stop(row + uint64(r * MMA_M + half * 8) + ONE, n_q, n_k, causal)  # keys < stop allowed
                mask_row(s, r, half, stop, k_start, t)

    @cuda.jit(device=True, inline="always")
    def attend(Q, K, V, O, LSE, n_q, n_k, scale_log2, causal, kv_group, head_group, scale, bm):
        """The kernel's body: one block's query tile, for flash_fwd and flex_fwd (``bm``: the block mask and the
        heads per batch, ``block_sparse.BM_FIELDS``; None for flash_fwd)."""
        smem = shared_words()  # cfg.smem_layout(): Q_i, then two stages of (K_j, V_j); 16-bit pairs
        tid = uint64(cuda.threadIdx.x)
        warp, lane = tid // uint64(WARP), tid % uint64(WARP)
        g, t = lane // FOUR, lane % FOUR  # the lane's group (its rows g, g + 8 of each row tile) and place in it
        head, q_start = block_work(head_group)  # which (batch, head), and its first query row
        kv_head = head // uint64(kv_group)  # the K, V head it reads (grouped-query attention)
        n_q, n_k = uint64(n_q), uint64(n_k)
        q_off, kv_off = head * n_q * DW, kv_head * n_k * DW  # this head's Q, O and its K, V (words)
        warp_row = q_start + warp * WARP_ROWS  # the warp's first query row
        base = ptx.shared_address(smem, ZERO)
        k_stop = key_stop(min(q_start + BR, n_q), n_q, n_k, causal)  # causal: later key tiles are skipped
        warp_stop = key_stop(warp_row + ONE, n_q, n_k, causal)  # keys that the warp's first row may see (fewest)
        n_tiles = (k_stop + BC - ONE) // BC
        if FLEX:  # the (b, h) that the user's functions see: the block's head is b · H + h
            b, h = int64(head // uint64(bm[10])), int64(head % uint64(bm[10]))
        if BLOCK_SPARSE:  # the key tiles the block mask lists: where the block's lists start, its visits
            first, partial, n_tiles = lists(bm, head, q_start, n_k)

        qf = cuda.local.array((ROW_TILES, K_STEPS, 4), uint32)  # Q_i's A operands per row tile and mma step
        # (Q_IN_SMEM: each pair of steps is loaded just before its use and dead after it: 2 · ROW_TILES · 4 live)
        s = cuda.local.array((ROW_TILES, S_TILES, 4), float32)  # the lane's part of S_ij, then of P_ij
        acc = cuda.local.array((ROW_TILES, O_TILES, 4), float32)  # its part of the unnormalised O_i
        m_i = cuda.local.array((ROW_TILES, 2), float32)  # running max (base 2) of rows 16r + g, 16r + g + 8
        l_i = cuda.local.array((ROW_TILES, 2), float32)  # the lane's share of their running denominators
        m_tile = cuda.local.array((ROW_TILES, 2), float32)  # the rows' maxima over one key tile (base 2)
        for r in range(ROW_TILES):
            for half in range(2):
                m_i[r, half], l_i[r, half] = NEG_INF, float32(0.0)
            for n in range(O_TILES):
                for e in range(4):
                    acc[r, n, e] = float32(0.0)

        k_start = ZERO  # the first key tile's first key
        if BLOCK_SPARSE:  # the block mask's first visit (none at all: a tile loaded and never used)
            k_start = visit(bm, first, partial, ZERO)[0]
        copy_rows(Q, q_off, q_start, n_q, base + uint32(Q_OFF * FOUR), tid, Q_CHUNKS)  # Q_i, once
        load_kv(K, V, kv_off, k_start, n_k, base + uint32(STAGE0 * FOUR), tid)  # K_0, V_0 into stage 0
        ptx.cp_async_wait_all()
        cuda.syncthreads()  # every thread's copies of Q_i, K_0, V_0 have landed before any warp reads them
        k_lane, block_lane = lane_rows(lane)
        q_warp = base + uint32(Q_OFF * FOUR) + uint32(warp) * uint32(WARP_Q_BYTES) + block_lane  # its first row
        # Q_i stays in shared memory for the whole kernel: the K_j, V_j copies write only the two stages after it
        if not Q_IN_SMEM:  # Q_i's A operands into registers, once
            for kk in range(0, K_STEPS, 2):
                load_q(qf, q_warp, kk)

        for j in range(n_tiles):
            k_start, masked = j * BC, True  # this tile's first key; whether mask_mod applies (all tiles)
            if BLOCK_SPARSE:  # the block mask's visit j: a partial tile is masked, a full one is not
                k_start, masked = visit(bm, first, partial, j)
            stage = base + uint32((STAGE0 + (j % TWO) * STAGE) * FOUR)  # where K_j, V_j are
            if j + ONE < n_tiles:  # K_j+1, V_j+1 into the other stage, in flight during this tile
                next_start = k_start + BC
                if BLOCK_SPARSE:
                    next_start = visit(bm, first, partial, j + ONE)[0]
                load_kv(K, V, kv_off, next_start, n_k, base + uint32((STAGE0 + ((j + ONE) % TWO) * STAGE) * FOUR), tid)
            scores(s, qf, q_warp, stage + k_lane)
            if SCORE_MOD:  # S_ij = score_mod(scale · S_ij, ...), in base 2: the softmax step's scale is 1
                score_mods(s, b, h, warp_row + g, k_start, t, n_q, n_k, scale)
            if k_start + BC > warp_stop:  # the tile reaches past the warp's first row's keys: some are masked
                mask(s, warp_row + g, k_start, t, n_q, n_k, causal)
            if MASK_MOD and masked:  # S_ij = -inf where mask_mod is False
                mask_mods(s, b, h, warp_row + g, k_start, t, n_q, n_k, scale)
            softmax_step(s, m_i, l_i, acc, m_tile, scale_log2)  # m_i, l_i, acc rescaled; P_ij replaces S_ij
            p_times_v(acc, s, stage + uint32(V_IN_STAGE * FOUR) + block_lane)  # P·V: acc += P_ij V_j
            ptx.cp_async_wait_all()  # this thread's copies of K_j+1, V_j+1 have landed
            cuda.syncthreads()  # everyone's have, and no warp still reads this stage before it is refilled

        epilogue(acc, m_i, l_i, O, LSE, q_off, head * n_q, warp_row + g, t, n_q)

    registers = {"max_registers": cfg.MAX_REGISTERS} if cfg.MAX_REGISTERS else {}

    @cuda.jit(fastmath=FAST_MATH, **registers)
    def flash_fwd(Q, K, V, O, LSE, n_q, n_k, scale_log2, causal, kv_group, head_group):
        attend(Q, K, V, O, LSE, n_q, n_k, scale_log2, causal, kv_group, head_group, scale_log2, None)

    @cuda.jit(fastmath=FAST_MATH, **registers)
    def flex_fwd(Q, K, V, O, LSE, n_q, n_k, scale_log2, causal, kv_group, head_group, scale, KV_NUM, KV_IDX, FULL_NUM,
                 FULL_IDX, bm_batch, bm_head, bm_tc, bm_block_q, bm_sub, bm_last_sub, heads):
        bm = (KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, bm_batch, bm_head, bm_tc, bm_block_q, bm_sub, bm_last_sub, heads)
        # with a score_mod, the scores reach the softmax step in base 2 already (warp_tile.modifications)
        attend(Q, K, V, O, LSE, n_q, n_k, float32(1.0) if SCORE_MOD else scale_log2, causal, kv_group, head_group,
               scale, bm)

    return flex_fwd if FLEX else flash_fwd


def build(cfg: TensorCoreTiling, element: str, head_group: int = 1, score_mod=None, mask_mod=None,
          block_sparse: bool = False):
    """What v6 builds: its kernel for the tiling ``cfg`` and ``element`` inputs, launched with ``head_group`` heads
    ordered together (``cfg.head_group(...)``): the kernel that orders its blocks by groups of heads for more than
    one; with FlexAttention's functions or a block mask, its ``flex_fwd`` (:func:`make_kernel`)."""
    return make_kernel(cfg, element, head_group > 1, score_mod, mask_mod, block_sparse)
