"""FlexAttention's hooks in the tensor-core backward (v2's ``flex_bwd_tc``): the user's functions on a warp's
transposed tile, and the query tiles a block mask lists for a key tile.

**The functions on the tile.** A warp of the backward holds Sᵀ: its rows are keys, its columns queries (the lane's
keys warp_key + 16r + 8·half, its queries q_start + 8n + 2t (+1)). :func:`flex_softmax_backward` recomputes Pᵀ and
dSᵀ as ``softmax_backward`` does, with the two functions in between, element by element:

    x     = scale · Sᵀ                                   the score, as FlexAttention gives it
    z, f' = score_mod(x, b, h, q_idx, kv_idx), its derivative   (``core.dual_source``: one rewritten function)
    Pᵀ    = exp(z − lse), 0 where causal, the ragged edges or mask_mod masks the key (mask_mod: on partial tiles)
    dSᵀ   = Pᵀ ∘ (dPᵀ − D) · f'                           0 where Pᵀ is (a masked key's f' may be anything)

so dK_j += dSᵀ Q_i and dQ_i += dS K_j take the gradient of the raw score, as the NumPy stages do
(``tinyflash.backward.blocked``). The calls are unrolled in Python, one device function per 16 × 8 tile with
constant indices (as ``warp_tile.each_tile`` does for the forward): a loop over the tiles, left rolled around a long
user function, would index the fragments by its counters and send them to local memory. The function of one
element is compiled once and inlined by LLVM (``forceinline``), which still sees constant indices and keeps the
fragments in registers.

**The block mask, transposed.** The backward's block owns a key tile and walks the query tiles that see it. A
block mask lists them per (b, h) and key tile of block_k keys (``tinyflash.core.block_mask``'s transposed lists):

    Q_NUM (Bm · Hm · Tc,)       Q_IDX (Bm · Hm · Tc · Tr,)        partial query tiles, ascending, then padding
    FULL_Q_NUM (Bm · Hm · Tc,)  FULL_Q_IDX (Bm · Hm · Tc · Tr,)   full query tiles

A kernel key tile of Bc keys lies in one of the mask's key tiles (block_k is a multiple of Bc); each of the mask's
query tiles of block_q rows is SUB = block_q / Br kernel query tiles (LAST_SUB in its last one, past which no row
is read), visited partial ones first, then full ones; unlisted (empty) query tiles are never loaded. The block
walks them for every query head of its K/V head's group: :func:`query_walk`'s ``group_steps`` counts the visits
and ``group_visit`` says which (head, query tile, partial?) visit ``step`` is. It is the forward's walk
(``forward/kernels/block_sparse.py``) with the roles of queries and keys swapped. The block mask reaches the
kernel as one tuple, ``bm`` (:data:`BM_FIELDS`), which the host fills.
"""

from __future__ import annotations

import math

from numba import cuda, float32, int64, uint64

from ...core.masks import key_stop
from ...core.online_softmax import LOG2E
from ...gpu.runtime import device_function, simulator_enabled, u
from ...warp_tile import MMA_M

# what the backward kernel reads of a block mask, in this order, as the tuple bm: the four transposed lists; the
# strides of a batch and a head in Q_NUM (0 where the mask broadcasts), Tr (one list's length), block_k, SUB and
# LAST_SUB (above), and the query heads per batch H, from which a flat query head gives (b, h)
BM_FIELDS = ("Q_NUM", "Q_IDX", "FULL_Q_NUM", "FULL_Q_IDX", "bm_batch", "bm_head", "bm_tr", "bm_block_k", "bm_sub",
             "bm_last_sub", "heads")
ZERO, ONE, TWO, EIGHT = u(0), u(1), u(2), u(8)
key_stop = device_function(key_stop)
import os
FORCE = os.environ.get("FLEX_FORCE") == "1"  # the causal rule of tinyflash.core.masks, compiled for the GPU


def query_walk(BR: int):
    """``group_steps(bm, kv_head, group, k_start, n_q)`` and ``group_visit(bm, kv_head, group, k_start, n_q, step)``
    for a kernel of query tiles of BR rows."""
    BR_ = u(BR)

    @cuda.jit(device=True, inline="always")
    def visits_of(NUM, IDX, row, tr, sub, last_sub, last_tile):
        """The kernel query tiles of one list (partial or full) of the mask's row ``row``: SUB per listed query tile,
        less those of the last query tile past Nq, if it is listed (then it is the list's last)."""
        n = uint64(NUM[row])
        if n == 0:
            return uint64(0)
        short = sub - last_sub if uint64(IDX[row * tr + n - ONE]) == last_tile else uint64(0)
        return n * sub - short

    @cuda.jit(device=True, inline="always")
    def lists(bm, head, k_start, n_q):
        """(where query head ``head``'s lists for the key tile at ``k_start`` start, its partial visits, all its
        visits)."""
        Q_NUM, Q_IDX, FULL_Q_NUM, FULL_Q_IDX, bm_batch, bm_head, tr, block_k, sub, last_sub, heads = bm
        b, h = head // uint64(heads), head % uint64(heads)
        row = b * uint64(bm_batch) + h * uint64(bm_head) + k_start // uint64(block_k)  # the mask's (b, h, j)
        block_q = uint64(sub) * BR_
        last_tile = (n_q + block_q - ONE) // block_q - ONE  # the mask's last query tile
        partial = visits_of(Q_NUM, Q_IDX, row, uint64(tr), uint64(sub), uint64(last_sub), last_tile)
        full = visits_of(FULL_Q_NUM, FULL_Q_IDX, row, uint64(tr), uint64(sub), uint64(last_sub), last_tile)
        return row * uint64(tr), partial, partial + full

    @cuda.jit(device=True, inline="always")
    def group_steps(bm, kv_head, group, k_start, n_q):
        """The visits of the key tile at ``k_start`` over the ``group`` query heads of ``kv_head``."""
        steps = ZERO
        for gh in range(group):
            steps += lists(bm, kv_head * group + uint64(gh), k_start, n_q)[2]
        return steps

    @cuda.jit(device=True, inline="always")
    def group_visit(bm, kv_head, group, k_start, n_q, step):
        """(query head, first query row, partial?) of visit ``step``: the group's heads in turn, each its partial
        visits, then its full ones; a visit is kernel tile p % SUB of the (p // SUB)-th query tile of its list."""
        head, first, partial, p = kv_head * group, ZERO, ZERO, step
        for gh in range(group):
            first, partial, count = lists(bm, kv_head * group + uint64(gh), k_start, n_q)
            if p < count:
                head = kv_head * group + uint64(gh)
                break
            p -= count
        IDX = bm[1] if p < partial else bm[3]
        place = p if p < partial else p - partial  # the visit's place in its list, in kernel tiles
        sub = uint64(bm[8])
        tile = uint64(IDX[first + place // sub])
        return head, (tile * sub + place % sub) * BR_, p < partial

    return group_steps, group_visit


def flex_softmax_backward(cfg, element: str, score_mod, mask_mod):
    """``flex_probabilities``: Pᵀ and dSᵀ of the warp's tile with ``score_mod`` (the device function of
    ``core.dual_source.value_and_derivative``: value and derivative) and ``mask_mod`` (a device function), each None
    where the call has none (module docstring)."""
    ROW_TILES, S_TILES = cfg.ROW_TILES, cfg.warp_tile(element).S_TILES
    layout = cfg.smem_layout()
    LSE_IN, D_IN = u(layout["lse_i in a stage"]), u(layout["D_i in a stage"])
    SCORE_MOD, MASK_MOD = score_mod is not None, mask_mod is not None
    # one_score compiled once and inlined by LLVM: numba's own inlining (inline="always") of its IR into each of
    # the 4 · ROW_TILES · S_TILES calls makes the compile take minutes
    INLINED = {} if simulator_enabled() else {"forceinline": True}
    TO_BASE_2, P_ZERO, NEG_INF = float32(LOG2E), float32(0.0), float32(-math.inf)

    @cuda.jit(device=True, **INLINED)
    def one_score(s, dp, r, n, e, ctx):
        """Pᵀ and dSᵀ of the lane's element e of tile (r, n): its key and query, score_mod, the masks."""
        smemf, stage_word, warp_key, q_start, t, n_q, n_k, causal, masked, partial, scale, scale_log2, b, h = ctx
        col = uint64(n) * EIGHT + TWO * t + uint64(e % 2)  # the query, in the tile
        key, query = warp_key + uint64(r * MMA_M + (e // 2) * 8), q_start + col
        inside = query < n_q and key < n_k  # the user's functions see only real (query, key) pairs
        z, slope = s[r, n, e] * scale_log2, float32(1.0)
        if SCORE_MOD:
            if inside:  # the modified score, in base 2 as the forward has it, and d score_mod / d score
                value, slope = score_mod(s[r, n, e] * scale, b, h, int64(query), int64(key))
                z = float32(value) * TO_BASE_2
        lse = smemf[stage_word + LSE_IN + col]  # base 2; -inf: a row that saw no key (a score_mod of -inf), P = 0
        p = math.exp2(z - lse) if lse != NEG_INF else P_ZERO
        if masked:
            if key >= key_stop(query + ONE, n_q, n_k, causal):
                p = P_ZERO
        if MASK_MOD:
            if partial and inside:
                if not mask_mod(b, h, int64(query), int64(key)):
                    p = P_ZERO
        s[r, n, e] = p
        ds = p * (dp[r, n, e] - smemf[stage_word + D_IN + col])
        if SCORE_MOD:  # through score_mod: the gradient of the raw score; 0 where P is (masked keys)
            ds = ds * float32(slope) if p != P_ZERO else P_ZERO
        dp[r, n, e] = ds

    def each_tile(first: int):
        """A device function ``(s, dp, ctx)`` over the lane's tiles from ``first`` on, unrolled (module docstring)."""
        if first == ROW_TILES * S_TILES:
            return cuda.jit(device=True, inline="always")(lambda s, dp, ctx: None)
        R, N = divmod(first, S_TILES)
        rest = each_tile(first + 1)

        @cuda.jit(device=True, inline="always")
        def tile(s, dp, ctx):
            one_score(s, dp, R, N, 0, ctx)  # the C fragment's four elements, each with constant indices
            one_score(s, dp, R, N, 1, ctx)
            one_score(s, dp, R, N, 2, ctx)
            one_score(s, dp, R, N, 3, ctx)
            rest(s, dp, ctx)

        return tile

    every_tile = each_tile(0)

    @cuda.jit(device=True, inline="always")
    def flex_probabilities(s, dp, smemf, stage_word, warp_key, q_start, t, n_q, n_k, causal, masked, partial, scale,
                           scale_log2, b, h):
        """Pᵀ replaces Sᵀ and dSᵀ replaces dPᵀ, as ``softmax_backward``'s ``probabilities`` with the functions;
        ``partial``: whether mask_mod applies to this tile (a block mask's partial tile, or any without one)."""
        every_tile(s, dp, (smemf, stage_word, warp_key, q_start, t, n_q, n_k, causal, masked, partial, scale,
                           scale_log2, b, h))

    return flex_probabilities
