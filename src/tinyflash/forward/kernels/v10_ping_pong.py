"""Kernel v10: the softmax overlapped with the products, and two consumer warpgroups that take turns at the
tensor cores (ping-pong). float16 and bfloat16 in, float32 accumulation; the fourth step of stage 4
(``tinyflash.hopper_attention``).

What changed since v9 (a producer warpgroup; consumers that wait for each product before anything else):

* **The softmax of one tile runs while the tensor cores multiply** (FlashAttention-3's intra-warpgroup
  overlap). At key tile j a consumer issues S_ij = Q_i K_jᵀ and then acc += P_i,j-1 V_j-1, the previous
  tile's product: two wgmma groups, in that order, neither waited for (``warpgroup_tile``'s issue halves).
  ``wait_group 1`` then retires S_ij's group while P·V may still run; the warpgroup takes the softmax of S_ij
  without touching acc (``softmax_step_deferred``: m_i, l_i, P_ij, and each row's factor alpha), and only then
  waits for P·V (``wait_group 0``), releases tile j − 1's stage, rescales acc by alpha and packs P_ij into the
  A words for the next step. So S_ij (in s) and P_i,j-1 (in p) are live together. The first tile's S_i0 is
  waited for at once, and the last tile's P·V after the loop: nothing is left to overlap them with.
* **Ping-pong.** A step's two issues are the warpgroup's *turn* at the tensor cores. Consumer warpgroup w waits
  on its own named barrier (``bar.sync``, 256 threads: its own 128 and the arrivals of the warpgroup before
  it) and, its products issued, lets the next one go (``bar.arrive`` on that one's barrier); warpgroup 0
  lets itself go first. So while one warpgroup's products occupy the tensor cores, the other takes its
  softmax (FlashAttention-3's ``warp_scheduler_barrier_sync`` / ``_arrive``, barriers ``WarpSchedulerWG1``
  on). With one consumer warpgroup there are no turns.

The arithmetic is v9's, in the same order for every value (acc · alpha, then + P_ij V_j), so v10's outputs
are v9's, bit for bit. A stage is held half a step longer (until its V_j's product is waited for): on a GPU
the ring has three stages (``tma_tiling.ping_pong_tiling``). Unchanged from v9: the producer, the copies and
the stages' "full" and "empty" barriers, the mask, the epilogue, setmaxnreg. Limits: d = dv ∈ {64, 128, 256};
compute capability 9.0 exactly (``sm_90a``).

FlexAttention (``tinyflash.flex_attention`` on compute capability 9.0) is v10 with v6's three hooks, compiled away
when absent: the user's score_mod and mask_mod on each tile's scores once its wait retires them (a warpgroup's
accumulator holds, per warp, the m16n8 fragments of a warp's tile, so ``warp_tile.modifications`` applies as in
v6); and a block mask's key tiles (``block_sparse.py``), which the producer loads and the consumers take by one
rule (:func:`key_tiles`), in the same order: the stages' barriers count tiles, not keys. :func:`make_kernel`
builds that kernel, ``flex_fwd``, when given them.

On numba's simulator every instruction here is emulated, ``wait_group 1`` and the named barriers included,
and a product reaches its registers only when a wait retires its group: a kernel that read S_ij or acc
before its wait would compute wrong numbers there. Time is not emulated: the products are computed when
issued and the threads take turns as Python schedules them, so whether the softmax actually runs under the
products is seen only on a GPU (tests/test_hopper_gpu.py, ``python -m tinyflash.bench hopper``).
"""

from __future__ import annotations

from functools import lru_cache

from numba import cuda, float32, int32, int64, uint32, uint64
from numba.cuda import types

from ...core.masks import key_stop
from ...gpu import ptx, tma, wgmma
from ...gpu.runtime import device_function, simulator_enabled, u
from ...gpu.smem import shared_words
from ...gpu.tensor_map import BOX_COLUMNS
from ...warp_tile import FAST_MATH, MMA_M, NEG_INF, WARP, modifications, warp_tile
from ...warpgroup_tile import ROW_BYTES, warpgroup_tile
from .block_sparse import tile_walk
from .tma_tiling import K_MAP, Q_MAP, V_MAP, TmaTiling, offsets

ZERO, ONE, TWO = u(0), u(1), u(2)
ALIGN = u(wgmma.SWIZZLE_ATOM_BYTES)  # tiles start at multiples of the swizzle's period
key_stop = device_function(key_stop)  # the causal rule of tinyflash.core.masks, compiled for the GPU
WORDS, FLOATS, MAPS = (types.Array(types.uint32, 1, "C"), types.Array(types.float32, 1, "C"),
                       types.Array(types.uint64, 1, "C"))
# flash_fwd's argument types: O as 16-bit pairs, LSE, the tensor maps of Q, K, V; then n_q, n_k, scale·log2(e),
# causal, kv_group, head_group (1 here)
SIGNATURE = (WORDS, FLOATS, MAPS, types.int64, types.int64, types.float32, types.boolean, types.int64, types.int64)
# flex_fwd's: those, then the scale, the block mask's four lists (int32) and its seven numbers
# (block_sparse.BM_FIELDS), as numba's launch passes them
INTS = types.Array(types.int32, 1, "C")
FLEX_SIGNATURE = SIGNATURE + (types.float32,) + (INTS,) * 4 + (types.int64,) * 7


def key_tiles(cfg: TmaTiling, block_sparse: bool):
    """``key_tile(bm, first, partial, j)``: (first key, mask_mod applies?) of the block's j-th key tile, the one
    rule by which the producer loads its tiles and the consumers take them, in the same order (each stage's
    barriers count tiles). Every tile up to the causal bound, all masked; or, with a block mask, its visits
    (``block_sparse.tile_walk``: the partial tiles, masked, then the full ones, not)."""
    BC = u(cfg.BC)
    _, visit = tile_walk(cfg.BC)

    @cuda.jit(device=True, inline="always")
    def key_tile(bm, first, partial, j):
        if block_sparse:
            return visit(bm, first, partial, j)
        return j * BC, True

    return key_tile


def producer(cfg: TmaTiling, block_sparse: bool = False):
    """The producer warpgroup's pieces: ``init_barriers`` (the stages' barriers, by one thread before the block's
    barrier) and ``produce``, the one thread that requests Q_i and each K_j, V_j by TMA (``load_q``, ``load_kv``);
    with ``block_sparse``, the key tiles a block mask lists (:func:`key_tiles`)."""
    BC, STAGES, N_STAGES = u(cfg.BC), u(cfg.STAGES), cfg.STAGES
    key_tile = key_tiles(cfg, block_sparse)
    Q_OFF, STAGE0, V_IN_STAGE, Q_FULL, FULL0, EMPTY0, STAGE, BAR = offsets(cfg)
    CONSUMERS = u(cfg.NT - wgmma.WARPGROUP)  # threads of the consumer warpgroups: each arrives on "empty"
    PIECES = cfg.D // BOX_COLUMNS
    Q_PIECE, KV_PIECE = u(cfg.BR * ROW_BYTES), u(cfg.BC * ROW_BYTES)  # from a tile's 64-column piece to the next
    Q_BYTES, KV_BYTES = u(cfg.BR * cfg.D * 2), u(2 * cfg.BC * cfg.D * 2)  # what Q_i's, a stage's copies complete

    @cuda.jit(device=True, inline="always")
    def load_q(maps, base, q_start, head):
        """Q_i by TMA, completing on its barrier: one box of Br rows per 64 columns."""
        bar = base + uint32(Q_FULL)
        tma.arrive_expect_tx(bar, uint32(Q_BYTES))
        for h in range(PIECES):
            tma.tma_load_3d(base + uint32(Q_OFF + uint64(h) * Q_PIECE), maps, uint64(Q_MAP), int32(h * BOX_COLUMNS),
                            int32(q_start), int32(head), bar)

    @cuda.jit(device=True, inline="always")
    def load_kv(maps, base, j, k_start, kv_head):
        """K_j and V_j (keys k_start ..) by TMA into stage j % STAGES, completing on its "full" barrier."""
        stage = j % STAGES
        bar, tile = base + uint32(FULL0 + stage * BAR), base + uint32(STAGE0 + stage * STAGE)
        tma.arrive_expect_tx(bar, uint32(KV_BYTES))
        for h in range(PIECES):
            col, piece = int32(h * BOX_COLUMNS), uint32(uint64(h) * KV_PIECE)
            tma.tma_load_3d(tile + piece, maps, uint64(K_MAP), col, int32(k_start), int32(kv_head), bar)
            tma.tma_load_3d(tile + uint32(V_IN_STAGE) + piece, maps, uint64(V_MAP), col, int32(k_start),
                            int32(kv_head), bar)

    @cuda.jit(device=True, inline="always")
    def init_barriers(base):
        """One thread: Q_i's and each stage's "full" barrier expect one arrival (the producer's, with the bytes),
        each "empty" barrier the consumers' threads; made visible to the copy engine."""
        tma.mbarrier_init(base + uint32(Q_FULL), uint32(1))
        for s in range(N_STAGES):
            tma.mbarrier_init(base + uint32(FULL0 + uint64(s) * BAR), uint32(1))
            tma.mbarrier_init(base + uint32(EMPTY0 + uint64(s) * BAR), uint32(CONSUMERS))
        wgmma.fence_proxy_async()  # the barriers' initialisation, before the copy engine completes them

    @cuda.jit(device=True, inline="always")
    def produce(maps, base, q_start, head, kv_head, n_tiles, bm, first, partial):
        """The producer's one thread: Q_i, then each K_j, V_j as soon as the consumers have left its stage (with a
        block mask ``bm``, the tiles of its visits: ``first``, ``partial`` from ``block_sparse``'s lists)."""
        for m in range(3):
            tma.prefetch_map(maps, uint64(m))
            tma.acquire_map(maps, uint64(m))
        load_q(maps, base, q_start, head)
        for j in range(n_tiles):
            stage = j % STAGES
            # the phase in which the consumers released tile j - STAGES (before the first round: completed)
            tma.wait(base + uint32(EMPTY0 + stage * BAR), uint32((j // STAGES + ONE) % TWO))
            load_kv(maps, base, j, key_tile(bm, first, partial, j)[0], kv_head)  # the consumers' tile j

    return init_barriers, produce


def consumer(cfg: TmaTiling, element: str, score_mod=None, mask_mod=None, block_sparse: bool = False):
    """The consumer warpgroups' pieces: ``consume``, a consumer thread's loop over the key tiles (the products by
    ``warpgroup_tile``, the mask, the online softmax and the epilogue by ``warp_tile``), with the tiles' stages
    (``stage_of``) and the warpgroups' turns at the tensor cores (``my_turn``, ``next_turn``). With FlexAttention's
    functions (``score_mod``, ``mask_mod``: device functions, or None) each tile's scores are modified, then masked
    (``warp_tile.modifications``); with ``block_sparse``, the key tiles are a block mask's (:func:`key_tiles`)."""
    tile, group = warp_tile(cfg.warp_tile(element)), warpgroup_tile(cfg.warpgroup_tile(element))
    SCORE_MOD, MASK_MOD = score_mod is not None, mask_mod is not None
    FLEX = SCORE_MOD or MASK_MOD or block_sparse
    score_mods, mask_mods = modifications(cfg.warp_tile(element), score_mod, mask_mod)
    key_tile = key_tiles(cfg, block_sparse)
    mask_row, epilogue = tile.mask_row, tile.epilogue
    softmax_step, softmax_step_deferred, rescale_acc = tile.softmax_step, tile.softmax_step_deferred, tile.rescale_acc
    descriptors, scores, p_times_v = group.descriptors, group.scores, group.p_times_v
    issue_scores, pack_p, issue_p_times_v = group.issue_scores, group.pack_p, group.issue_p_times_v
    scores_ready, products_ready = group.scores_ready, group.products_ready
    BC, STAGES = u(cfg.BC), u(cfg.STAGES)
    DW = u(cfg.D // 2)  # words per row of O in HBM
    Q_OFF, STAGE0, V_IN_STAGE, Q_FULL, FULL0, EMPTY0, STAGE, BAR = offsets(cfg)
    WG = u(wgmma.WARPGROUP)
    # the turns: consumer warpgroup w waits on barrier TURN0 + w, of its 128 threads and the 128 of the one
    # before it (FlashAttention-3's WarpSchedulerWG1 ..: 1 .. 3 after CUTLASS's reserved ids; 0 is syncthreads's)
    PING_PONG, WARPGROUPS, TURN0 = cfg.WARPGROUPS > 1, u(cfg.WARPGROUPS), u(1)
    turn_wait = tma.named_barrier_by_id(2 * wgmma.WARPGROUP)
    turn_pass = tma.named_barrier_by_id(2 * wgmma.WARPGROUP, arrive_only=True)
    S_TILES, O_TILES, P_STEPS = cfg.BC // 8, cfg.D // 8, cfg.BC // 16

    @cuda.jit(device=True, inline="always")
    def mask(s, row, k_start, t, n_q, n_k, causal):
        """S_ij = -inf for keys at or past Nk and, if causal, after the diagonal (v7's)."""
        for half in range(2):
            stop = key_stop(row + uint64(half * 8) + ONE, n_q, n_k, causal)  # keys < stop allowed
            mask_row(s, 0, half, stop, k_start, t)

    @cuda.jit(device=True, inline="always")
    def stage_of(base, j):
        """Tile j's stage: the address of its K_j (V_j is V_IN_STAGE on), its "full" and its "empty" barrier."""
        stage = j % STAGES
        return (base + uint32(STAGE0 + stage * STAGE), base + uint32(FULL0 + stage * BAR),
                base + uint32(EMPTY0 + stage * BAR))

    @cuda.jit(device=True, inline="always")
    def my_turn(warpgroup):
        """Wait until the warpgroup before this one has issued its products (warpgroup 0's first turn: until it
        has let itself go)."""
        if PING_PONG:
            turn_wait(uint32(TURN0 + warpgroup))

    @cuda.jit(device=True, inline="always")
    def next_turn(warpgroup):
        """This warpgroup's products are issued: the next warpgroup may issue its own."""
        if PING_PONG:
            turn_pass(uint32(TURN0 + (warpgroup + ONE) % WARPGROUPS))

    @cuda.jit(device=True, inline="always")
    def consume(O, LSE, base, tid, q_start, head, n_q, n_k, scale_log2, causal, n_tiles, scale, bm, first, partial):
        """A consumer thread (``tid`` counted from the first consumer): its warp's 16 rows of O_i. Tile 0's S_i0
        waited for; then at each tile j, S_ij and P_i,j-1 V_j-1 issued in the warpgroup's turn, the softmax of
        S_ij while P·V runs; the last tile's P·V at the end. A stage is released once the wait that retires
        its P·V (the last product reading it) is over. (``scale``, ``bm``, ``first``, ``partial``: flex_fwd's.)"""
        warpgroup, warp, lane = tid // WG, tid // uint64(WARP), tid % uint64(WARP)
        g, t = lane // uint64(4), lane % uint64(4)  # the lane's group (its rows g, g + 8) and place in it
        warp_row = q_start + warp * uint64(MMA_M)  # the warp's first query row: consumer w's rows are 64w ..
        warp_stop = key_stop(warp_row + ONE, n_q, n_k, causal)  # keys that the warp's first row may see (fewest)
        s = cuda.local.array((1, S_TILES, 4), float32)  # the lane's part of S_ij, then of P_ij
        p = cuda.local.array((P_STEPS, 4), uint32)  # P_i,j-1 packed: the A words of the P·V in flight
        acc = cuda.local.array((1, O_TILES, 4), float32)  # its part of the unnormalised O_i
        m_i = cuda.local.array((1, 2), float32)  # running max (base 2) of rows g, g + 8
        l_i = cuda.local.array((1, 2), float32)  # the lane's share of their running denominators
        m_tile = cuda.local.array((1, 2), float32)  # the rows' maxima over one key tile (base 2)
        alpha = cuda.local.array((1, 2), float32)  # the rows' rescaling factors, applied to acc after P·V's wait
        if FLEX:  # the (b, h) that the user's functions see: the block's head is b · H + h
            b, h = int64(head // uint64(bm[10])), int64(head % uint64(bm[10]))
        for half in range(2):
            m_i[0, half], l_i[0, half] = NEG_INF, float32(0.0)
        for n in range(O_TILES):
            for e in range(4):
                acc[0, n, e] = float32(0.0)
        if PING_PONG and warpgroup == ZERO:
            turn_pass(uint32(TURN0))  # warpgroup 0 goes first: half of its own barrier's count, now (the last
            # warpgroup's last pass is left unmatched: the block ends with it, as FlashAttention-3's do)

        tma.wait(base + uint32(Q_FULL), uint32(0))  # Q_i has landed (its barrier's one phase)
        if n_tiles > ZERO:  # tile 0: S_i0 waited for, as in v9 (no product of this warpgroup runs yet)
            tile, full, _ = stage_of(base, ZERO)
            tma.wait(full, uint32(0))  # K_0, V_0 have landed
            q_desc, k_desc, _ = descriptors(base + uint32(Q_OFF), warpgroup, tile, tile + uint32(V_IN_STAGE))
            scores(s, q_desc, k_desc)  # S_i0 = Q_i K_0ᵀ
            k_start, masked = key_tile(bm, first, partial, ZERO)  # the first tile's first key (flex_fwd's hooks)
            if SCORE_MOD:  # S_i0 = score_mod(scale · S_i0, ...), in base 2: the softmax step's scale is 1
                score_mods(s, b, h, warp_row + g, k_start, t, n_q, n_k, scale)
            if k_start + BC > warp_stop:
                mask(s, warp_row + g, k_start, t, n_q, n_k, causal)
            if MASK_MOD and masked:  # S_i0 = -inf where mask_mod is False
                mask_mods(s, b, h, warp_row + g, k_start, t, n_q, n_k, scale)
            softmax_step(s, m_i, l_i, acc, m_tile, scale_log2)  # P_i0 replaces S_i0
        for j in range(ONE, n_tiles):
            k_start, masked = key_tile(bm, first, partial, j)  # the key tile the producer loaded as tile j
            tile, full, _ = stage_of(base, j)
            previous, _, previous_empty = stage_of(base, j - ONE)
            tma.wait(full, uint32((j // STAGES) % TWO))  # K_j, V_j have landed
            q_desc, k_desc, v_desc = descriptors(base + uint32(Q_OFF), warpgroup, tile, previous + uint32(V_IN_STAGE))
            pack_p(s, p)  # P_i,j-1 into the A words: s is free for S_ij
            my_turn(warpgroup)  # an order for speed, not a race: no warpgroup reads another's registers or rows
            issue_scores(s, q_desc, k_desc)  # S_ij = Q_i K_jᵀ
            issue_p_times_v(acc, p, v_desc)  # acc += P_i,j-1 V_j-1, after it
            next_turn(warpgroup)
            scores_ready(s)  # wait_group 1: S_ij is done, P·V may still run
            if SCORE_MOD:
                score_mods(s, b, h, warp_row + g, k_start, t, n_q, n_k, scale)
            if k_start + BC > warp_stop:  # the tile reaches past the warp's first row's keys: some are masked
                mask(s, warp_row + g, k_start, t, n_q, n_k, causal)
            if MASK_MOD and masked:
                mask_mods(s, b, h, warp_row + g, k_start, t, n_q, n_k, scale)
            rescaled = softmax_step_deferred(s, m_i, l_i, alpha, m_tile, scale_log2)  # P_ij replaces S_ij
            products_ready(acc)  # wait_group 0: acc holds P_i,j-1 V_j-1
            tma.arrive(previous_empty)  # V_j-1 is read (the wait above): the producer may refill its stage
            if rescaled:
                rescale_acc(acc, alpha)  # to the rows' new references, before P_ij V_j is added
        if n_tiles > ZERO:  # the last tile's product: nothing left to overlap it with
            tile, _, empty = stage_of(base, n_tiles - ONE)
            _, _, v_desc = descriptors(base + uint32(Q_OFF), warpgroup, tile, tile + uint32(V_IN_STAGE))
            p_times_v(acc, s, p, v_desc)  # acc += P_ij V_j, waited for
            tma.arrive(empty)

        epilogue(acc, m_i, l_i, O, LSE, head * n_q * DW, head * n_q, warp_row + g, t, n_q)

    return consume


@lru_cache(maxsize=None)
def make_kernel(cfg: TmaTiling, element: str, score_mod=None, mask_mod=None, block_sparse: bool = False):
    """``flash_fwd`` for one tiling and one element type (float16 or bfloat16): the warpgroups' roles, from the
    pieces :func:`producer` and :func:`consumer`.

    With FlexAttention's user functions (``score_mod``, ``mask_mod``: ``gpu.user_code.UserFunction``, compiled
    into the kernel) or a block mask (``block_sparse``), ``flex_fwd`` instead: the same kernel with v6's three hooks
    (the functions on each tile's scores; the key tiles that the block mask lists, walked by the producer and the
    consumers alike, partial ones masked by mask_mod, full ones not), which takes the scale and the block mask too
    (``block_sparse.BM_FIELDS``). Without them the hooks compile away, and ``flash_fwd`` is v10's kernel alone."""
    cfg.validate()
    if not cfg.PRODUCER:
        raise ValueError(f"kernel v10 needs a producer warpgroup (PRODUCER=True); got {cfg}")
    SCORE_MOD, BLOCK_SPARSE = score_mod is not None, bool(block_sparse)
    FLEX = SCORE_MOD or mask_mod is not None or BLOCK_SPARSE
    init_barriers, produce = producer(cfg, BLOCK_SPARSE)
    consume = consumer(cfg, element, score_mod and score_mod.device, mask_mod and mask_mod.device, BLOCK_SPARSE)
    lists, _ = tile_walk(cfg.BC)  # the key tiles of a block mask
    BR, BC = u(cfg.BR), u(cfg.BC)
    WG = u(wgmma.WARPGROUP)
    producer_registers = tma.setmaxnreg(False, cfg.PRODUCER_REGISTERS)
    consumer_registers = tma.setmaxnreg(True, cfg.CONSUMER_REGISTERS)
    options = {} if simulator_enabled() else cfg.compile_options()  # launch bounds; the simulator takes none

    @cuda.jit(device=True, inline="always")
    def attend(O, LSE, TMAPS, n_q, n_k, scale_log2, causal, kv_group, scale, bm):
        """The kernel's body: one block's query tile, for flash_fwd and flex_fwd (``bm``: the block mask and the
        heads per batch, ``block_sparse.BM_FIELDS``; None for flash_fwd)."""
        smem = shared_words()  # cfg.smem_layout() from a 1024-byte-aligned base: Q_i, the stages, the barriers
        tid = uint64(cuda.threadIdx.x)
        head, q_start = uint64(cuda.blockIdx.y), (uint64(cuda.gridDim.x) - ONE - uint64(cuda.blockIdx.x)) * BR
        kv_head = head // uint64(kv_group)  # the K, V head it reads (grouped-query attention)
        n_q, n_k = uint64(n_q), uint64(n_k)
        raw = ptx.shared_address(smem, ZERO)
        base = (raw + uint32(ALIGN - ONE)) & ~uint32(ALIGN - ONE)  # the swizzle is of absolute address bits
        k_stop = key_stop(min(q_start + BR, n_q), n_q, n_k, causal)  # causal: later key tiles are skipped
        n_tiles = (k_stop + BC - ONE) // BC
        first, partial = ZERO, ZERO
        if BLOCK_SPARSE:  # the key tiles the block mask lists: where the block's lists start, its visits
            first, partial, n_tiles = lists(bm, head, q_start, n_k)

        if tid == ZERO:
            init_barriers(base)
        cuda.syncthreads()  # the barriers are initialised before any thread waits on them; the last block barrier
        if tid < WG:  # the producer warpgroup: few registers, one thread issues every copy
            producer_registers()
            if tid == ZERO:
                produce(TMAPS, base, q_start, head, kv_head, n_tiles, bm, first, partial)
        else:  # the consumers: the registers the producer gave up; the same n_tiles tiles as the producer's
            consumer_registers()
            consume(O, LSE, base, tid - WG, q_start, head, n_q, n_k, scale_log2, causal, n_tiles, scale, bm, first,
                    partial)

    @cuda.jit(fastmath=FAST_MATH, **options)
    def flash_fwd(O, LSE, TMAPS, n_q, n_k, scale_log2, causal, kv_group, head_group):
        attend(O, LSE, TMAPS, n_q, n_k, scale_log2, causal, kv_group, scale_log2, None)

    @cuda.jit(fastmath=FAST_MATH, **options)
    def flex_fwd(O, LSE, TMAPS, n_q, n_k, scale_log2, causal, kv_group, head_group, scale, KV_NUM, KV_IDX, FULL_NUM,
                 FULL_IDX, bm_batch, bm_head, bm_tc, bm_block_q, bm_sub, bm_last_sub, heads):
        bm = (KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, bm_batch, bm_head, bm_tc, bm_block_q, bm_sub, bm_last_sub, heads)
        # with a score_mod, the scores reach the softmax step in base 2 already (warp_tile.modifications)
        attend(O, LSE, TMAPS, n_q, n_k, float32(1.0) if SCORE_MOD else scale_log2, causal, kv_group, scale, bm)

    return flex_fwd if FLEX else flash_fwd


def build(cfg: TmaTiling, element: str, head_group: int = 1, score_mod=None, mask_mod=None,
          block_sparse: bool = False):
    """What v10 builds: its kernel for the tiling ``cfg`` and ``element`` inputs (one head at a time: the wgmma
    tilings' ``head_group`` is 1); with FlexAttention's functions or a block mask, its ``flex_fwd``
    (:func:`make_kernel`)."""
    return make_kernel(cfg, element, score_mod, mask_mod, block_sparse)
