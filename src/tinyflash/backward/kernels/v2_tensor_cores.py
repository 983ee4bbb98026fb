"""Backward kernel v2: the tensor cores. float16 and bfloat16 in, float32 accumulation.

What changed since v1 (the CUDA-core backward):

* Every product runs on the tensor cores (``mma.sync``, as in the forward kernel v6): Sᵀ = K_j Q_iᵀ,
  dPᵀ = V_j dO_iᵀ, dV_j += Pᵀ dO_i, dK_j += dSᵀ Q_i and dQ_i += dS K_j.
* A warp owns 16 keys of the block's key tile: the rows of its mma tiles are keys, its columns queries. So
  Sᵀ's accumulators, packed to 16-bit pairs, are the A operand of Pᵀ dO_i, and dSᵀ's that of dSᵀ Q_i: P and
  dS never leave the registers for dK and dV (the forward's trick, ``tinyflash.warp_tile``, read sideways).
  lse_i and D_i are per query: per column of the lane's fragments, read from shared memory.
* dQ_i wants dS by query rows: each warp writes its dSᵀ to shared memory, and after a barrier takes 16 query
  rows of dQ_i (with more warps than dQ_i's row tiles, a share of its columns too), reading dS by
  ``ldmatrix.trans`` and K_j by ``ldmatrix.trans``, and adds its partial dQ_i to the float32 accumulator in HBM
  with atomics: two neighbouring columns per request where the GPU has them (``red.global.add.v2.f32``), else
  one per element, as v1.
* The grid runs over K/V heads; a block walks the query tiles of every query head of its group, so dK_j and
  dV_j sum over grouped-query heads in registers, K and V read once.
* Q_i, dO_i (cp.async), lse_i and D_i come in two stages: the next query tile is in flight while one is
  computed.
* Any head dim d = dv, a multiple of 8 up to 256: rows padded with zero columns to DP (a multiple of 32) in shared
  memory and in the fragments, only d columns read and written; past DP = 128 two warps on the same keys, each
  with half of dK_j's and dV_j's columns (the tiling's DKV_COLUMN_GROUPS).

FlexAttention's backward (``tinyflash.flex_attention_backward``) is v2 with three hooks in its loop, compiled away
when absent, as v6 has them in the forward: score_mod with its derivative and mask_mod, the user's functions
compiled into the kernel, on each tile's Pᵀ and dSᵀ; and a block mask's query tiles (its transposed lists), which
a block visits instead of every query tile of its causal bound, mask_mod on the partial ones only
(``flex_tile.py``). :func:`make_kernel` builds that kernel, ``flex_bwd_tc``, when given them.

The loop reads like FlashAttention-2's backward (``tinyflash.backward.blocked``): for each query tile that
sees the key tile, S and P recomputed from lse, dP, dS = P ∘ (dP − D), then dV, dK, dQ. Its tiling is
``tensor_core_tiling.py``; its limits: d = dv ∈ ``tensor_core_tiling.HEAD_DIMS`` (every multiple of 8 up to
256), 16-bit inputs.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, int64, uint32, uint64
from numba.cuda import types

from ...core.dual_source import value_and_derivative
from ...core.masks import key_stop
from ...core.online_softmax import LOG2E
from ...gpu import ptx
from ...gpu.loads import cp_async_rows
from ...gpu.runtime import compute_capability, device_function, simulator_enabled, u
from ...gpu.smem import shared_floats, shared_words
from ...gpu.user_code import compiled
from ...warp_tile import FAST_MATH, MMA_K, MMA_M, MMA_N, WARP, warp_tile
from .flex_tile import flex_softmax_backward, query_walk
from .tensor_core_tiling import SIGNATURE, BackwardTensorCoreTiling  # noqa: F401 (SIGNATURE: its argument types)

ZERO, ONE, TWO, FOUR, EIGHT = u(0), u(1), u(2), u(4), u(8)
# flex_bwd_tc's argument types: flash_bwd_tc's (SIGNATURE), then the block mask's four lists (int32) and its seven
# numbers (flex_tile.BM_FIELDS), as numba's launch passes them
FLEX_SIGNATURE = SIGNATURE + (types.Array(types.int32, 1, "C"),) * 4 + (types.int64,) * 7
POS_INF = float32(np.inf)
key_stop = device_function(key_stop)  # the causal rule of tinyflash.core.masks, compiled for the GPU


def layout_words(cfg: BackwardTensorCoreTiling) -> dict:
    """``cfg.smem_layout()``'s offsets as compile-time constants (32-bit words), by region."""
    return {name: u(offset) for name, offset in cfg.smem_layout().items()}


def loads(cfg: BackwardTensorCoreTiling):
    """``load_query_tile``: a query tile's Q_i, dO_i (cp.async), lse_i and D_i into a stage."""
    BR, DW = u(cfg.BR), u(cfg.D // 2)  # query rows; words per row in HBM
    layout = layout_words(cfg)
    DO_IN, LSE_IN, D_IN = layout["dO_i in a stage"], layout["lse_i in a stage"], layout["D_i in a stage"]
    Q_CHUNKS = cfg.BR * cfg.CHUNKS // cfg.NT  # cp.async per thread
    copy_rows = cp_async_rows(cfg.ROW_WORDS, cfg.D // 2, cfg.NT, cfg.DP // 2)  # zero columns from d up to DP
    LOG2E_ = float32(LOG2E)

    @cuda.jit(device=True, inline="always")
    def load_query_tile(Q, dO, LSE, Dvec, smemf, stage_addr, stage_word, head, q_start, n_q, tid):
        """Q_i and dO_i of ``head`` into one stage (cp.async, in flight until waited for); lse_i (base 2) and D_i
        beside them, one row a thread; rows past Nq get lse = +inf, so that their P is 0."""
        q_off = head * n_q * DW
        copy_rows(Q, q_off, q_start, n_q, stage_addr, tid, Q_CHUNKS)
        copy_rows(dO, q_off, q_start, n_q, stage_addr + uint32(DO_IN * FOUR), tid, Q_CHUNKS)
        ptx.cp_async_commit()
        if tid < BR:
            row = q_start + tid
            inside = row < n_q
            smemf[stage_word + LSE_IN + tid] = LSE[head * n_q + row] * LOG2E_ if inside else POS_INF
            smemf[stage_word + D_IN + tid] = Dvec[head * n_q + row] if inside else float32(0.0)

    return load_query_tile


def softmax_backward(cfg: BackwardTensorCoreTiling, element: str):
    """``probabilities``: Pᵀ recomputed from Sᵀ and lse_i, and dSᵀ = Pᵀ ∘ (dPᵀ − D), in the lanes' fragments."""
    ROW_TILES, S_TILES = cfg.ROW_TILES, cfg.warp_tile(element).S_TILES
    layout = layout_words(cfg)
    LSE_IN, D_IN = layout["lse_i in a stage"], layout["D_i in a stage"]

    @cuda.jit(device=True, inline="always")
    def probabilities(s, dp, smemf, stage_word, warp_key, q_start, t, n_q, n_k, causal, masked, scale_log2):
        """Pᵀ = exp2(scale · Sᵀ − lse) replaces Sᵀ (0 where masked) and dSᵀ = Pᵀ ∘ (dPᵀ − D) replaces dPᵀ. The
        lane holds keys warp_key + 16r + 8·half (rows) and queries 8n + 2t (+1) of the tile (columns)."""
        for r in range(ROW_TILES):
            for n in range(S_TILES):
                for e in range(4):
                    col = uint64(n) * EIGHT + TWO * t + uint64(e % 2)  # the query, in the tile
                    p = math.exp2(s[r, n, e] * scale_log2 - smemf[stage_word + LSE_IN + col])
                    if masked:
                        key = warp_key + uint64(r * MMA_M + (e // 2) * 8)
                        if key >= key_stop(q_start + col + ONE, n_q, n_k, causal):
                            p = float32(0.0)
                    s[r, n, e] = p
                    dp[r, n, e] = p * (dp[r, n, e] - smemf[stage_word + D_IN + col])

    return probabilities


def query_gradients(cfg: BackwardTensorCoreTiling, element: str):
    """``(store_ds, ds_times_k)``: the warps' dSᵀ into shared memory, then each warp's share of dQ_i = dS K_j."""
    ROW_TILES, DQ_TILES, S_TILES = cfg.ROW_TILES, cfg.DQ_TILES, cfg.warp_tile(element).S_TILES
    KEY_STEPS = cfg.BC // MMA_K  # mma steps over the keys of dS K_j
    DQ_N = cfg.DP // MMA_N // cfg.DQ_COLUMN_GROUPS  # 8-column tiles of dQ_i per warp
    GROUPS, SHARED = cfg.DKV_COLUMN_GROUPS, cfg.DKV_COLUMN_GROUPS > 1  # warps on the same keys
    DS_OFF, DS_WORDS = layout_words(cfg)["dS"], cfg.DS_WORDS  # a row of dSᵀ (words)
    DSW = u(DS_WORDS)
    KEYS8_BYTES = 8 * cfg.ROW_WORDS * 4  # 8 rows of K_j
    mma, pack = ptx.mma_m16n8k16(element), ptx.pack(element)

    @cuda.jit(device=True, inline="always")
    def store_ds(smem, dp, key_warp, dkv_group, g, t):
        """The warp's dSᵀ, packed to 16-bit pairs, into shared memory: row = key of the tile, columns = queries.
        Warps on the same keys (``key_warp``) hold the same dSᵀ: each stores every GROUPS-th 8-query tile."""
        for r in range(ROW_TILES):
            for half in range(2):
                row = key_warp * uint64(ROW_TILES * MMA_M) + uint64(r * MMA_M + half * 8) + g
                for n in range(S_TILES):
                    if not SHARED or uint64(n % GROUPS) == dkv_group:
                        smem[DS_OFF + row * DSW + uint64(n) * FOUR + t] = pack(dp[r, n, 2 * half],
                                                                               dp[r, n, 2 * half + 1])

    @cuda.jit(device=True, inline="always")
    def ds_times_k(dq, ds_lane_addr, k_lane_addr):
        """dq[qt] = dS K_j for the warp's 16-row tiles qt of dQ_i and its DQ_N · 8 columns (k_lane_addr: K_j at
        the first of them): dS's A operands by ldmatrix.trans from dSᵀ (16 keys × 16 queries per instruction),
        K_j's B operands by ldmatrix.trans (16 keys × 16 dims), as V_j in P·V."""
        for qt in range(DQ_TILES):
            for n in range(DQ_N):
                for e in range(4):
                    dq[qt, n, e] = float32(0.0)
        for kk in range(KEY_STEPS):
            for qt in range(DQ_TILES):
                a = ptx.ldmatrix_x4_trans(ds_lane_addr + uint32((kk * MMA_K * DS_WORDS + qt * MMA_M // 2) * 4))
                for n in range(0, DQ_N, 2):
                    b = ptx.ldmatrix_x4_trans(k_lane_addr + uint32(kk * 2 * KEYS8_BYTES + n * MMA_K))
                    for h in range(2):
                        dq[qt, n + h, 0], dq[qt, n + h, 1], dq[qt, n + h, 2], dq[qt, n + h, 3] = mma(
                            a[0], a[1], a[2], a[3], b[2 * h], b[2 * h + 1],
                            dq[qt, n + h, 0], dq[qt, n + h, 1], dq[qt, n + h, 2], dq[qt, n + h, 3])

    return store_ds, ds_times_k


def dq_additions(cfg: BackwardTensorCoreTiling, element: str, deterministic: bool, pair_atomics: bool):
    """``(wait_turn, add_dq, pass_turn)``: a warp's dQ_i added to dQ's float32 accumulator by atomics; in
    deterministic mode in the key tiles' order."""
    D_, DQ_TILES = u(cfg.D), cfg.DQ_TILES  # elements per row in HBM
    DQ_N = cfg.DP // MMA_N // cfg.DQ_COLUMN_GROUPS  # 8-column tiles of dQ_i per warp
    DETERMINISTIC, PAIR_ATOMICS, PADDED = bool(deterministic), bool(pair_atomics), cfg.DP > cfg.D

    @cuda.jit(device=True, inline="always")
    def wait_turn(dQ_turn, at, rank, tid):
        """Deterministic mode: wait until the key tiles before this one have added their dQ_i (``dQ_turn[at]``
        counts them), so that the float32 sums of dQ happen in one order, key tile 0 first. The key tiles
        that see a query tile are 0, 1, ... up to the last one (causal: a later key tile's first query is never
        earlier), and blocks start in order, so the tile waited for has started."""
        if DETERMINISTIC:
            if tid == ZERO:
                while cuda.atomic.add(dQ_turn, at, 0) != rank:  # an atomic read: from L2, never a stale copy
                    pass
            cuda.syncthreads()

    @cuda.jit(device=True, inline="always")
    def pass_turn(dQ_turn, at, tid):
        """Deterministic mode, after a barrier that follows this block's atomics and fence: the next key tile's turn."""
        if DETERMINISTIC and tid == ZERO:
            cuda.atomic.add(dQ_turn, at, 1)

    @cuda.jit(device=True, inline="always")
    def add_pair(dQ_acc, at, x0, x1):
        """dQ_acc[at] += x0 and dQ_acc[at + 1] += x1: one atomic request, or one per element."""
        if PAIR_ATOMICS:
            ptx.red_add_f32x2(dQ_acc, at, x0, x1)
        else:
            cuda.atomic.add(dQ_acc, at, x0)
            cuda.atomic.add(dQ_acc, at + ONE, x1)

    @cuda.jit(device=True, inline="always")
    def add_dq(dQ_acc, dq, dq_row0, dq_col0, q_off, g, t, n_q):
        """dQ_acc += the warp's dq (rows dq_row0 + 16qt + g, + 8; columns dq_col0 + 8n + 2t, +1), rows below Nq
        and columns below d (the rest is the padding to DP), by atomics: one per pair of columns, or one per
        element."""
        for qt in range(DQ_TILES):
            for half in range(2):
                row = dq_row0 + uint64(qt * MMA_M + half * 8) + g
                if row < n_q:
                    for n in range(DQ_N):
                        col = dq_col0 + uint64(n) * EIGHT + TWO * t
                        if not PADDED or col < D_:
                            add_pair(dQ_acc, q_off + row * D_ + col, dq[qt, n, 2 * half], dq[qt, n, 2 * half + 1])

    return wait_turn, add_dq, pass_turn


def key_writes(cfg: BackwardTensorCoreTiling, element: str):
    """``write_dk_dv``: the block's only writes of dK_j and dV_j, from the warps' accumulators."""
    DW, ROW_TILES, O_TILES = u(cfg.D // 2), cfg.ROW_TILES, cfg.warp_tile(element).O_TILES  # words per row in HBM
    D_, PADDED = u(cfg.D), cfg.DP > cfg.D  # elements per row in HBM; zero columns in the fragments from d to DP
    pack = ptx.pack(element)

    @cuda.jit(device=True, inline="always")
    def write_dk_dv(dK, dV, dk, dv, kv_off, warp_key, dkv_col0, g, t, n_k, scale):
        """dK_j = scale · Σ dSᵀ Q_i and dV_j = Σ Pᵀ dO_i for the warp's keys below Nk and its columns dkv_col0 ..
        below d, as 16-bit pairs."""
        for r in range(ROW_TILES):
            for half in range(2):
                key = warp_key + uint64(r * MMA_M + half * 8)
                if key < n_k:
                    for n in range(O_TILES):
                        if not PADDED or dkv_col0 + uint64(n) * EIGHT < D_:
                            at = kv_off + key * DW + dkv_col0 // TWO + uint64(n) * FOUR + t
                            dK[at] = pack(dk[r, n, 2 * half] * scale, dk[r, n, 2 * half + 1] * scale)
                            dV[at] = pack(dv[r, n, 2 * half], dv[r, n, 2 * half + 1])

    return write_dk_dv


@lru_cache(maxsize=None)
def make_kernel(cfg: BackwardTensorCoreTiling, element: str, deterministic: bool = False, pair_atomics: bool = False,
                score_mod=None, mask_mod=None, block_sparse: bool = False):
    """``flash_bwd_tc`` for one tiling and one element type (float16 or bfloat16); ``deterministic``: the key
    tiles add their dQ_i in turn (:func:`dq_additions`), so that dQ is the same, bit for bit, at every run;
    ``pair_atomics``: dQ's neighbouring columns added by one ``red.global.add.v2.f32`` (compute capability 9.0
    on: :func:`pair_atomics_available`), else by two scalar atomics. The loop over query tiles is composed of
    :func:`loads`, the warp tile's products, :func:`softmax_backward`, :func:`query_gradients`,
    :func:`dq_additions` and :func:`key_writes`.

    With FlexAttention's user functions (``score_mod``, ``mask_mod``: ``gpu.user_code.UserFunction``) or a block
    mask (``block_sparse``), ``flex_bwd_tc`` instead: the same loop with three hooks, compiled away without them
    (module docstring): Pᵀ and dSᵀ through the functions (``flex_tile.flex_softmax_backward``), the query tiles
    the block mask lists (``flex_tile.query_walk``), mask_mod on its partial tiles only. It takes the block mask
    too (``flex_tile.BM_FIELDS``), and has no deterministic mode."""
    cfg.validate()
    spec = cfg.warp_tile(element)
    tile = warp_tile(spec)
    lane_rows, scores, p_times_v = tile.lane_rows, tile.scores, tile.p_times_v  # (numba types no namespace)
    BR, BC = u(cfg.BR), u(cfg.BC)
    DW, D_ = u(cfg.D // 2), u(cfg.D)  # words and elements per row in HBM
    ROW_TILES, DQ_TILES = cfg.ROW_TILES, cfg.DQ_TILES
    DQ_ROW_WARPS = u(cfg.DQ_ROW_WARPS)  # warp w: dQ_i's row tiles from w mod DQ_ROW_WARPS, column group w div it
    K_STEPS, S_TILES, O_TILES = spec.K_STEPS, spec.S_TILES, spec.O_TILES
    DQ_N = cfg.DP // MMA_N // cfg.DQ_COLUMN_GROUPS  # 8-column tiles of dQ_i per warp
    GROUPS = u(cfg.DKV_COLUMN_GROUPS)  # warps on the same keys: warp w the keys of w div GROUPS, columns of w mod it
    layout = layout_words(cfg)
    K_OFF, V_OFF, STAGE0, DS_OFF = layout["K_j"], layout["V_j"], layout["stage 0"], layout["dS"]
    STAGE, DO_IN = layout["stage 1"] - layout["stage 0"], layout["dO_i in a stage"]
    DSW = u(cfg.DS_WORDS)  # a row of dSᵀ (words)
    WARP_KEY_BYTES = ROW_TILES * MMA_M * cfg.ROW_WORDS * 4  # a warp's 16 · ROW_TILES rows of K_j or V_j
    KV_CHUNKS = cfg.BC * cfg.CHUNKS // cfg.NT  # cp.async per thread
    copy_rows = cp_async_rows(cfg.ROW_WORDS, cfg.D // 2, cfg.NT, cfg.DP // 2)  # zero columns from d up to DP
    DETERMINISTIC = bool(deterministic)
    load_query_tile, probabilities = loads(cfg), softmax_backward(cfg, element)
    store_ds, ds_times_k = query_gradients(cfg, element)
    wait_turn, add_dq, pass_turn = dq_additions(cfg, element, deterministic, pair_atomics)
    write_dk_dv = key_writes(cfg, element)
    SCORE_MOD, MASK_MOD, BLOCK_SPARSE = score_mod is not None, mask_mod is not None, bool(block_sparse)
    FLEX = SCORE_MOD or MASK_MOD or BLOCK_SPARSE
    if FLEX:  # the user's functions compiled in: score_mod as (value, derivative) (core.dual_source)
        dual = compiled(value_and_derivative(score_mod.fn, "score_mod", compiled)) if SCORE_MOD else None
        flex_probabilities = flex_softmax_backward(cfg, element, dual, mask_mod and mask_mod.device)
    group_steps, visit_at = query_steps(cfg, block_sparse)  # the query tiles a block walks

    @cuda.jit(device=True, inline="always")
    def attend(Q, K, V, dO, LSE, Dvec, dQ_acc, dK, dV, dQ_turn, n_q, n_k, scale, scale_log2, causal, kv_group, bm):
        """The kernel's body: one block's key tile, for flash_bwd_tc and flex_bwd_tc (``bm``: the block mask and the
        query heads per batch, ``flex_tile.BM_FIELDS``; None for flash_bwd_tc)."""
        smem, smemf = shared_words(), shared_floats()  # cfg.smem_layout(), as words and as floats (one memory)
        tid = uint64(cuda.threadIdx.x)
        warp, lane = tid // uint64(WARP), tid % uint64(WARP)
        g, t = lane // FOUR, lane % FOUR
        kv_head, k_start = uint64(cuda.blockIdx.y), uint64(cuda.blockIdx.x) * BC
        n_q, n_k, group = uint64(n_q), uint64(n_k), uint64(kv_group)
        kv_off = kv_head * n_k * DW
        key_warp, dkv_group = warp // GROUPS, warp % GROUPS  # the warp's keys; its columns of dK_j and dV_j
        dkv_col0 = dkv_group * uint64(O_TILES * MMA_N)  # the first of those columns
        warp_key = k_start + key_warp * uint64(ROW_TILES * MMA_M)  # the warp's first key; +g: the lane's
        base = ptx.shared_address(smem, ZERO)
        # the query tiles that see this key tile: causal, queries below k_start - (Nk - Nq) see none of its keys
        q_first = k_start + n_q - n_k if causal and k_start + n_q > n_k else ZERO
        tiles = (n_q + BR - ONE) // BR - q_first // BR if q_first < n_q else ZERO  # per query head
        steps = tiles * group  # (query head, query tile) pairs, head by head
        q_tiles = (n_q + BR - ONE) // BR  # query tiles per query head
        if BLOCK_SPARSE:  # the query tiles the block mask lists for this key tile, over the group's query heads
            steps = group_steps(bm, kv_head, group, k_start, n_q)

        copy_rows(K, kv_off, k_start, n_k, base + uint32(K_OFF * FOUR), tid, KV_CHUNKS)  # K_j, V_j, once
        copy_rows(V, kv_off, k_start, n_k, base + uint32(V_OFF * FOUR), tid, KV_CHUNKS)
        if steps > ZERO:
            head, q_start, _ = visit_at(bm, kv_head, group, k_start, q_first, tiles, n_q, ZERO)
            load_query_tile(Q, dO, LSE, Dvec, smemf, base + uint32(STAGE0 * FOUR), STAGE0, head, q_start, n_q, tid)
        ptx.cp_async_commit()
        ptx.cp_async_wait_all()
        cuda.syncthreads()  # K_j, V_j and the first query tile have landed

        k_lane, block_lane = lane_rows(lane)
        k_warp = base + uint32(K_OFF * FOUR) + uint32(key_warp) * uint32(WARP_KEY_BYTES) + block_lane  # A operands
        v_warp = base + uint32(V_OFF * FOUR) + uint32(key_warp) * uint32(WARP_KEY_BYTES) + block_lane
        dkv_lane = block_lane + uint32(dkv_col0 * TWO)  # Q_i's, dO_i's B operands at the warp's columns of dK, dV
        dq_warp, dq_group = warp % DQ_ROW_WARPS, warp // DQ_ROW_WARPS  # the warp's share of dQ_i: rows, columns
        k_block = base + uint32(K_OFF * FOUR) + block_lane + uint32(dq_group * uint64(DQ_N * MMA_K))  # dQ's B operands
        # dSᵀ as dQ's A operands (ldmatrix.trans): lanes 0-7 keys 0-7 and lanes 16-23 keys 8-15 at the warp's first
        # query; lanes 8-15 and 24-31 the same keys 8 queries on
        ds_lane = base + uint32(DS_OFF * FOUR) + uint32(((lane % EIGHT + (lane // uint64(16)) * EIGHT) * DSW
                                                         + ((lane // EIGHT) % TWO) * FOUR
                                                         + dq_warp * uint64(DQ_TILES * MMA_M // 2)) * FOUR)

        kf = cuda.local.array((ROW_TILES, K_STEPS, 4), uint32)  # A operands of K_j or V_j, a pair of steps at a time
        s = cuda.local.array((ROW_TILES, S_TILES, 4), float32)  # the lane's part of Sᵀ, then of Pᵀ
        dp = cuda.local.array((ROW_TILES, S_TILES, 4), float32)  # its part of dPᵀ, then of dSᵀ
        dk = cuda.local.array((ROW_TILES, O_TILES, 4), float32)  # its part of dK_j (unscaled)
        dv = cuda.local.array((ROW_TILES, O_TILES, 4), float32)  # its part of dV_j
        dq = cuda.local.array((DQ_TILES, DQ_N, 4), float32)  # its part of dQ_i, one query tile
        for r in range(ROW_TILES):
            for n in range(O_TILES):
                for e in range(4):
                    dk[r, n, e], dv[r, n, e] = float32(0.0), float32(0.0)

        for step in range(steps):
            head, q_start, partial = visit_at(bm, kv_head, group, k_start, q_first, tiles, n_q, step)
            stage_word = STAGE0 + (step % TWO) * STAGE
            stage = base + uint32(stage_word * FOUR)
            if step + ONE < steps:  # the next query tile into the other stage, in flight during this one
                nxt = step + ONE
                nxt_stage, nxt_word = base + uint32((STAGE0 + (nxt % TWO) * STAGE) * FOUR), STAGE0 + (nxt % TWO) * STAGE
                nxt_head, nxt_start, _ = visit_at(bm, kv_head, group, k_start, q_first, tiles, n_q, nxt)
                load_query_tile(Q, dO, LSE, Dvec, smemf, nxt_stage, nxt_word, nxt_head, nxt_start, n_q, tid)
            scores(s, kf, k_warp, stage + k_lane)  # Sᵀ = K_j Q_iᵀ for the warp's keys
            scores(dp, kf, v_warp, stage + uint32(DO_IN * FOUR) + k_lane)  # dPᵀ = V_j dO_iᵀ
            # a mask where some (key, query) of the tile is not allowed: the ragged last tiles, the diagonal
            masked = (k_start + BC > n_k or q_start + BR > n_q
                      or k_start + BC > key_stop(q_start + ONE, n_q, n_k, causal))
            if FLEX:  # the user's functions: (b, h) of the query head, b · H + h
                b, h = int64(head // uint64(bm[10])), int64(head % uint64(bm[10]))
                flex_probabilities(s, dp, smemf, stage_word, warp_key + g, q_start, t, n_q, n_k, causal, masked,
                                   partial, scale, scale_log2, b, h)
            else:
                probabilities(s, dp, smemf, stage_word, warp_key + g, q_start, t, n_q, n_k, causal, masked, scale_log2)
            p_times_v(dv, s, stage + uint32(DO_IN * FOUR) + dkv_lane)  # dV_j += Pᵀ dO_i
            p_times_v(dk, dp, stage + dkv_lane)  # dK_j += dSᵀ Q_i
            store_ds(smem, dp, key_warp, dkv_group, g, t)
            cuda.syncthreads()  # every warp's dSᵀ is in shared memory
            ds_times_k(dq, ds_lane, k_block)
            turn = head * q_tiles + q_start // BR  # deterministic mode: this query tile's counter
            wait_turn(dQ_turn, turn, cuda.blockIdx.x, tid)
            add_dq(dQ_acc, dq, q_start + dq_warp * uint64(DQ_TILES * MMA_M), dq_group * uint64(DQ_N * 8),
                   head * n_q * D_, g, t, n_q)
            if DETERMINISTIC:
                cuda.threadfence()  # this thread's additions are seen before the next key tile's turn
            ptx.cp_async_wait_all()  # this thread's copies of the next query tile have landed
            cuda.syncthreads()  # everyone's have, and no warp still reads this stage or dSᵀ
            pass_turn(dQ_turn, turn, tid)

        write_dk_dv(dK, dV, dk, dv, kv_off, warp_key + g, dkv_col0, g, t, n_k, scale)

    return entries(attend, FLEX)


def entries(attend, flex: bool):
    """The kernel around the body ``attend``: ``flash_bwd_tc``, or with FlexAttention's hooks ``flex_bwd_tc``, which
    takes the block mask too."""

    @cuda.jit(fastmath=FAST_MATH)
    def flash_bwd_tc(Q, K, V, dO, LSE, Dvec, dQ_acc, dK, dV, dQ_turn, n_q, n_k, scale, scale_log2, causal, kv_group):
        attend(Q, K, V, dO, LSE, Dvec, dQ_acc, dK, dV, dQ_turn, n_q, n_k, scale, scale_log2, causal, kv_group, None)

    @cuda.jit(fastmath=FAST_MATH)
    def flex_bwd_tc(Q, K, V, dO, LSE, Dvec, dQ_acc, dK, dV, dQ_turn, n_q, n_k, scale, scale_log2, causal, kv_group,
                    Q_NUM, Q_IDX, FULL_Q_NUM, FULL_Q_IDX, bm_batch, bm_head, bm_tr, bm_block_k, bm_sub, bm_last_sub,
                    heads):
        bm = (Q_NUM, Q_IDX, FULL_Q_NUM, FULL_Q_IDX, bm_batch, bm_head, bm_tr, bm_block_k, bm_sub, bm_last_sub, heads)
        attend(Q, K, V, dO, LSE, Dvec, dQ_acc, dK, dV, dQ_turn, n_q, n_k, scale, scale_log2, causal, kv_group, bm)

    return flex_bwd_tc if flex else flash_bwd_tc


def query_steps(cfg: BackwardTensorCoreTiling, block_sparse: bool):
    """``(group_steps, visit_at)``: how many (query head, query tile) steps a block walks under a block mask
    (``flex_tile.query_walk``), and which step ``step`` is: ``visit_at(bm, kv_head, group, k_start, q_first, tiles,
    n_q, step)`` -> (query head, first query row, partial?). Without a block mask, the group's heads one after
    another, each its ``tiles`` query tiles from the one of ``q_first`` on, mask_mod (if any) on every one."""
    BR, BLOCK_SPARSE = u(cfg.BR), bool(block_sparse)
    group_steps, group_visit = query_walk(cfg.BR)

    @cuda.jit(device=True, inline="always")
    def visit_at(bm, kv_head, group, k_start, q_first, tiles, n_q, step):
        if BLOCK_SPARSE:
            return group_visit(bm, kv_head, group, k_start, n_q, step)
        return kv_head * group + step // tiles, (q_first // BR + step % tiles) * BR, True

    return group_steps, visit_at


def pair_atomics_available() -> bool:
    """Whether this GPU adds two floats in one atomic request (``red.global.add.v2.f32``: compute capability 9.0
    on); on the simulator the emulation takes the same path as the GPU's."""
    return simulator_enabled() or compute_capability() >= (9, 0)


def build(cfg: BackwardTensorCoreTiling, element: str, deterministic: bool = False, pair_atomics: bool | None = None,
          score_mod=None, mask_mod=None, block_sparse: bool = False):
    """What v2 builds: its kernel for the tiling ``cfg`` and ``element`` inputs; ``deterministic``: dQ added in one
    order (:func:`make_kernel`); ``pair_atomics`` None: where :func:`pair_atomics_available`; with FlexAttention's
    functions or a block mask, its ``flex_bwd_tc`` (:func:`make_kernel`)."""
    if deterministic and (score_mod is not None or mask_mod is not None or block_sparse):
        raise ValueError("flex_bwd_tc has no deterministic mode (a block mask's key tiles add to dQ_i in no fixed "
                         "turn)")
    pairs = pair_atomics_available() if pair_atomics is None else pair_atomics
    return make_kernel(cfg, element, deterministic, pairs, score_mod, mask_mod, block_sparse)
