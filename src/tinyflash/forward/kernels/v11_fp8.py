"""Kernel v11: v10 on float8_e4m3 Q, K, V (FlashAttention-3's FP8 forward). e4m3 in, float32 accumulation,
bfloat16 out; ``tinyflash.hopper_fp8_attention``. Stage 1 on e4m3 inputs, as this kernel runs it, is
``tinyflash.forward.fp8.fp8_attention``: it is the reference, line for line.

What changed since v10 (16-bit inputs):

* **The products are FP8 wgmma's** (``warpgroup_tile.fp8_warpgroup_tile``): m64nNk32 on bytes, twice the
  multiply-adds of a 16-bit instruction. Q_i, K_j come by TMA as v10's tiles with one byte an element; V_j comes
  transposed, Vᵀ_j, written by a pass before the kernel (``fp8_tiling.transpose_v``: FP8 wgmma reads B K-major
  only, and P V's reduction runs over keys).
* **P_ij enters P·V as e4m3, from registers.** P = exp2(S2 - m2 + 8) lies in [0, 2^8] (FlashAttention-3's fixed
  offset: the row maximum becomes 256, small entries stay normal numbers), is summed into l_i in float32 and
  rounded to e4m3 into the A words (``cvt.rn.satfinite.e4m3x2.f32``). The A fragment's columns are not the
  accumulators': the keys are renumbered in P and in Vᵀ alike, so no byte moves between lanes
  (``warpgroup_tile.fp8_key_of_column``).
* **No lazy rescaling.** Every tile's row maximum becomes m_i at once, so that P <= 2^8 holds (a lazy reference up
  to 2^8 below the maximum would push P past e4m3's 448).
* **Descales.** Q's and K's descale factors multiply the softmax's scale (one float per head, ``QK_SCALE``); V's
  multiplies O in the epilogue (``V_SCALE``); the lse takes the offset out: lse = (m2 + log2 l - 8) · ln 2.

Unchanged from v10: the producer and its ring of stages, the turns of the two consumer warpgroups (ping-pong), the
overlap of the softmax with P·V (``wait_group 1``), the mask and the epilogue's writes. Limits: d = dv ∈ {64, 128,
256} (Q_i and K_j in 128-byte pieces of e4m3 rows; at d = 64 in 64-byte rows, the 64-byte swizzle), Bc = 128;
compute capability 9.0.

On numba's simulator the FP8 products are exact in float64 and rounded once per instruction to float32; the
Hopper's FP8 tensor cores keep about 13 bits while they add (``gpu/wgmma.py``): a GPU's results differ more.
"""

from __future__ import annotations

from functools import lru_cache

import math

from numba import cuda, float32, int32, uint32, uint64
from numba.cuda import types

from ...core.masks import key_stop
from ...gpu import ptx, tma, wgmma
from ...gpu.runtime import device_function, simulator_enabled, u
from ...gpu.smem import shared_words
from ...gpu.tensor_map import BOX_COLUMNS
from ...warp_tile import FAST_MATH, MMA_M, NEG_INF, WARP, warp_tile
from ...warpgroup_tile import ROW_BYTES, fp8_warpgroup_tile
from .fp8_tiling import Fp8Tiling
from .tma_tiling import K_MAP, Q_MAP, V_MAP, offsets

ZERO, ONE, TWO = u(0), u(1), u(2)
ALIGN = u(wgmma.SWIZZLE_ATOM_BYTES)  # tiles start at multiples of the swizzle's period
key_stop = device_function(key_stop)  # the causal rule of tinyflash.core.masks, compiled for the GPU
P_OFFSET = float32(8.0)  # log2 of P's largest value: forward/fp8.py's P_OFFSET (FlashAttention-3's)
OUTPUT = "bfloat16"  # what the epilogue writes
WORDS, FLOATS, MAPS = (types.Array(types.uint32, 1, "C"), types.Array(types.float32, 1, "C"),
                       types.Array(types.uint64, 1, "C"))
# flash_fwd's argument types: O as bfloat16 pairs, LSE, QK_SCALE, V_SCALE, the tensor maps of Q, K, Vᵀ; then n_q,
# n_k, causal, kv_group
SIGNATURE = (WORDS, FLOATS, FLOATS, FLOATS, MAPS, types.int64, types.int64, types.boolean, types.int64)


def producer(cfg: Fp8Tiling):
    """The producer warpgroup's pieces (v10's): ``init_barriers`` and ``produce``, the one thread that requests Q_i
    and each K_j, Vᵀ_j by TMA (``load_q``, ``load_kv``). The maps count 16-bit pairs of bytes: a box of BOX_COLUMNS
    pairs is a 128-byte piece, 128 e4m3 columns (``fp8_tiling``)."""
    BC, STAGES, N_STAGES = u(cfg.BC), u(cfg.STAGES), cfg.STAGES
    Q_OFF, STAGE0, V_IN_STAGE, Q_FULL, FULL0, EMPTY0, STAGE, BAR = offsets(cfg)
    CONSUMERS = u(cfg.NT - wgmma.WARPGROUP)  # threads of the consumer warpgroups: each arrives on "empty"
    PIECES = -(-cfg.D // ROW_BYTES)  # 128-byte pieces of a row of Q_i, K_j (at d = 64 one of 64-byte rows)
    Q_PIECE, K_PIECE = u(cfg.BR * ROW_BYTES), u(cfg.BC * ROW_BYTES)  # from a tile's 128-byte piece to the next
    Q_BYTES, KV_BYTES = u(cfg.BR * cfg.D), u(2 * cfg.BC * cfg.D)  # what Q_i's, a stage's copies complete
    VT_COLUMN = BC // TWO  # Vᵀ_j's first column, in 16-bit pairs, per tile

    @cuda.jit(device=True, inline="always")
    def load_q(maps, base, q_start, head):
        """Q_i by TMA, completing on its barrier: one box of Br rows per 128-byte piece."""
        bar = base + uint32(Q_FULL)
        tma.arrive_expect_tx(bar, uint32(Q_BYTES))
        for h in range(PIECES):
            tma.tma_load_3d(base + uint32(Q_OFF + uint64(h) * Q_PIECE), maps, uint64(Q_MAP), int32(h * BOX_COLUMNS),
                            int32(q_start), int32(head), bar)

    @cuda.jit(device=True, inline="always")
    def load_kv(maps, base, j, kv_head):
        """K_j (a box of Bc rows per piece) and Vᵀ_j (one box: d rows of Bc keys) by TMA into stage j % STAGES,
        completing on its "full" barrier."""
        stage = j % STAGES
        bar, tile = base + uint32(FULL0 + stage * BAR), base + uint32(STAGE0 + stage * STAGE)
        tma.arrive_expect_tx(bar, uint32(KV_BYTES))
        for h in range(PIECES):
            tma.tma_load_3d(tile + uint32(uint64(h) * K_PIECE), maps, uint64(K_MAP), int32(h * BOX_COLUMNS),
                            int32(j * BC), int32(kv_head), bar)
        tma.tma_load_3d(tile + uint32(V_IN_STAGE), maps, uint64(V_MAP), int32(j * VT_COLUMN), int32(0),
                        int32(kv_head), bar)

    @cuda.jit(device=True, inline="always")
    def init_barriers(base):
        """One thread: Q_i's and each stage's "full" barrier expect one arrival, each "empty" the consumers'."""
        tma.mbarrier_init(base + uint32(Q_FULL), uint32(1))
        for s in range(N_STAGES):
            tma.mbarrier_init(base + uint32(FULL0 + uint64(s) * BAR), uint32(1))
            tma.mbarrier_init(base + uint32(EMPTY0 + uint64(s) * BAR), uint32(CONSUMERS))
        wgmma.fence_proxy_async()  # the barriers' initialisation, before the copy engine completes them

    @cuda.jit(device=True, inline="always")
    def produce(maps, base, q_start, head, kv_head, n_tiles):
        """The producer's one thread: Q_i, then each K_j, Vᵀ_j as soon as the consumers have left its stage."""
        for m in range(3):
            tma.prefetch_map(maps, uint64(m))
            tma.acquire_map(maps, uint64(m))
        load_q(maps, base, q_start, head)
        for j in range(n_tiles):
            stage = j % STAGES
            # the phase in which the consumers released tile j - STAGES (before the first round: completed)
            tma.wait(base + uint32(EMPTY0 + stage * BAR), uint32((j // STAGES + ONE) % TWO))
            load_kv(maps, base, j, kv_head)

    return init_barriers, produce


def fp8_softmax(cfg: Fp8Tiling):
    """``softmax_step(s, m_i, l_i, alpha, scale_log2)``: forward/fp8.py's step for the lane's rows g, g + 8, with
    acc left alone (a P·V may be running): m_new = max(m_i, rowmax(S2)), alpha = exp2(m_i - m_new) (to alpha, for
    acc once the product is waited for; l_i now), P = exp2(S2 - (m_new - 8)) in place of S, l_i += rowsum(P)."""
    S_TILES = cfg.BC // 8

    @cuda.jit(device=True, inline="always")
    def softmax_step(s, m_i, l_i, alpha, scale_log2):
        for half in range(2):
            m = NEG_INF
            for n in range(S_TILES):
                m = max(m, max(s[0, n, 2 * half], s[0, n, 2 * half + 1]))
            m = max(m, ptx.shfl_xor(m, 1))
            m = max(m, ptx.shfl_xor(m, 2)) * scale_log2  # the row's max over its 4 lanes, scaled (scale > 0)
            m_new = max(m_i[0, half], m)
            m_safe = m_new if m_new != NEG_INF else float32(0.0)  # no allowed key yet: avoid -inf - -inf
            alpha[0, half] = math.exp2(m_i[0, half] - m_safe)
            m_i[0, half] = m_new
            l_i[0, half] *= alpha[0, half]
            shift = m_safe - P_OFFSET  # P's largest entry: 2^8
            for n in range(S_TILES):
                for e in range(2):
                    x = math.exp2(s[0, n, 2 * half + e] * scale_log2 - shift)  # P_ij in [0, 2^8], float32
                    s[0, n, 2 * half + e] = x
                    l_i[0, half] += x

    return softmax_step


def consumer(cfg: Fp8Tiling):
    """The consumer warpgroups' pieces: ``consume``, a consumer thread's loop over the key tiles (v10's, with the
    FP8 products of ``warpgroup_tile`` and :func:`fp8_softmax`), with ``stage_of``, ``my_turn``, ``next_turn``."""
    tile, group = warp_tile(cfg.warp_tile(OUTPUT)), fp8_warpgroup_tile(cfg.warpgroup_tile())
    mask_row, epilogue, rescale_acc = tile.mask_row, tile.epilogue, tile.rescale_acc
    softmax_step = fp8_softmax(cfg)
    descriptors, scores, p_times_v = group.descriptors, group.scores, group.p_times_v
    issue_scores, pack_p, issue_p_times_v = group.issue_scores, group.pack_p, group.issue_p_times_v
    scores_ready, products_ready = group.scores_ready, group.products_ready
    BC, STAGES = u(cfg.BC), u(cfg.STAGES)
    DW = u(cfg.D // 2)  # words per row of O in HBM (bfloat16 pairs)
    Q_OFF, STAGE0, V_IN_STAGE, Q_FULL, FULL0, EMPTY0, STAGE, BAR = offsets(cfg)
    WG = u(wgmma.WARPGROUP)
    PING_PONG, WARPGROUPS, TURN0 = cfg.WARPGROUPS > 1, u(cfg.WARPGROUPS), u(1)  # v10's turns
    turn_wait = tma.named_barrier_by_id(2 * wgmma.WARPGROUP)
    turn_pass = tma.named_barrier_by_id(2 * wgmma.WARPGROUP, arrive_only=True)
    S_TILES, O_TILES, P_STEPS = cfg.BC // 8, cfg.D // 8, group.P_STEPS

    @cuda.jit(device=True, inline="always")
    def mask(s, row, k_start, t, n_q, n_k, causal):
        """S_ij = -inf for keys at or past Nk and, if causal, after the diagonal (v7's)."""
        for half in range(2):
            stop = key_stop(row + uint64(half * 8) + ONE, n_q, n_k, causal)  # keys < stop allowed
            mask_row(s, 0, half, stop, k_start, t)

    @cuda.jit(device=True, inline="always")
    def stage_of(base, j):
        """Tile j's stage: the address of its K_j (Vᵀ_j is V_IN_STAGE on), its "full" and its "empty" barrier."""
        stage = j % STAGES
        return (base + uint32(STAGE0 + stage * STAGE), base + uint32(FULL0 + stage * BAR),
                base + uint32(EMPTY0 + stage * BAR))

    @cuda.jit(device=True, inline="always")
    def my_turn(warpgroup):
        """Wait until the warpgroup before this one has issued its products."""
        if PING_PONG:
            turn_wait(uint32(TURN0 + warpgroup))

    @cuda.jit(device=True, inline="always")
    def next_turn(warpgroup):
        """This warpgroup's products are issued: the next warpgroup may issue its own."""
        if PING_PONG:
            turn_pass(uint32(TURN0 + (warpgroup + ONE) % WARPGROUPS))

    @cuda.jit(device=True, inline="always")
    def consume(O, LSE, base, tid, q_start, head, n_q, n_k, scale_log2, v_scale, causal, n_tiles):
        """A consumer thread: its warp's 16 rows of O_i, v10's loop (S_ij and P_i,j-1 V_j-1 issued in the
        warpgroup's turn, the softmax of S_ij while P·V runs); then V's descale and the offset out of lse."""
        warpgroup, warp, lane = tid // WG, tid // uint64(WARP), tid % uint64(WARP)
        g, t = lane // uint64(4), lane % uint64(4)  # the lane's group (its rows g, g + 8) and place in it
        warp_row = q_start + warp * uint64(MMA_M)  # the warp's first query row
        warp_stop = key_stop(warp_row + ONE, n_q, n_k, causal)  # keys that the warp's first row may see (fewest)
        s = cuda.local.array((1, S_TILES, 4), float32)  # the lane's part of S_ij, then of P_ij (float32)
        p = cuda.local.array((P_STEPS, 4), uint32)  # P_i,j-1 in e4m3: the A words of the P·V in flight
        acc = cuda.local.array((1, O_TILES, 4), float32)  # its part of the unnormalised O_i
        m_i = cuda.local.array((1, 2), float32)  # running max (base 2) of rows g, g + 8
        l_i = cuda.local.array((1, 2), float32)  # the lane's share of their running denominators
        alpha = cuda.local.array((1, 2), float32)  # the rows' rescaling factors, applied to acc after P·V's wait
        for half in range(2):
            m_i[0, half], l_i[0, half] = NEG_INF, float32(0.0)
        for n in range(O_TILES):
            for e in range(4):
                acc[0, n, e] = float32(0.0)
        if PING_PONG and warpgroup == ZERO:
            turn_pass(uint32(TURN0))  # warpgroup 0 goes first

        tma.wait(base + uint32(Q_FULL), uint32(0))  # Q_i has landed
        if n_tiles > ZERO:  # tile 0: S_i0 waited for (acc is 0: nothing to rescale)
            tile, full, _ = stage_of(base, ZERO)
            tma.wait(full, uint32(0))  # K_0, Vᵀ_0 have landed
            q_desc, k_desc, _ = descriptors(base + uint32(Q_OFF), warpgroup, tile, tile + uint32(V_IN_STAGE))
            scores(s, q_desc, k_desc)  # S_i0 = Q_i K_0ᵀ
            if BC > warp_stop:
                mask(s, warp_row + g, ZERO, t, n_q, n_k, causal)
            softmax_step(s, m_i, l_i, alpha, scale_log2)  # P_i0 replaces S_i0
        for j in range(ONE, n_tiles):
            k_start = j * BC
            tile, full, _ = stage_of(base, j)
            previous, _, previous_empty = stage_of(base, j - ONE)
            tma.wait(full, uint32((j // STAGES) % TWO))  # K_j, Vᵀ_j have landed
            q_desc, k_desc, v_desc = descriptors(base + uint32(Q_OFF), warpgroup, tile, previous + uint32(V_IN_STAGE))
            pack_p(s, p)  # P_i,j-1 rounded to e4m3 into the A words: s is free for S_ij
            my_turn(warpgroup)
            issue_scores(s, q_desc, k_desc)  # S_ij = Q_i K_jᵀ
            issue_p_times_v(acc, p, v_desc)  # acc += P_i,j-1 V_j-1, after it
            next_turn(warpgroup)
            scores_ready(s)  # wait_group 1: S_ij is done, P·V may still run
            if k_start + BC > warp_stop:
                mask(s, warp_row + g, k_start, t, n_q, n_k, causal)
            softmax_step(s, m_i, l_i, alpha, scale_log2)  # P_ij replaces S_ij
            products_ready(acc)  # wait_group 0: acc holds P_i,j-1 V_j-1
            tma.arrive(previous_empty)  # Vᵀ_j-1 is read: the producer may refill its stage
            rescale_acc(acc, alpha)  # to the rows' new maxima, before P_ij V_j is added
        if n_tiles > ZERO:  # the last tile's product
            tile, _, empty = stage_of(base, n_tiles - ONE)
            _, _, v_desc = descriptors(base + uint32(Q_OFF), warpgroup, tile, tile + uint32(V_IN_STAGE))
            p_times_v(acc, s, p, v_desc)  # acc += P_ij V_j, waited for
            tma.arrive(empty)

        for half in range(2):  # V's descale on acc; lse = m_i + log2 l_i with P's 2^8 taken out
            alpha[0, half] = v_scale
            m_i[0, half] -= P_OFFSET
        rescale_acc(acc, alpha)
        epilogue(acc, m_i, l_i, O, LSE, head * n_q * DW, head * n_q, warp_row + g, t, n_q)

    return consume


@lru_cache(maxsize=None)
def make_kernel(cfg: Fp8Tiling):
    """``flash_fwd`` for one FP8 tiling: v10's roles, from :func:`producer` and :func:`consumer`. Its arguments: O
    (bfloat16 pairs as uint32 words), LSE, QK_SCALE (one float per query head: scale · log2 e · Q's and K's
    descales), V_SCALE (one per query head: V's descale of its K/V head), the tensor maps of Q, K, Vᵀ."""
    cfg.validate()
    init_barriers, produce = producer(cfg)
    consume = consumer(cfg)
    BR, BC = u(cfg.BR), u(cfg.BC)
    WG = u(wgmma.WARPGROUP)
    producer_registers = tma.setmaxnreg(False, cfg.PRODUCER_REGISTERS)
    consumer_registers = tma.setmaxnreg(True, cfg.CONSUMER_REGISTERS)
    options = {} if simulator_enabled() else cfg.compile_options()  # launch bounds; the simulator takes none

    @cuda.jit(fastmath=FAST_MATH, **options)
    def flash_fwd(O, LSE, QK_SCALE, V_SCALE, TMAPS, n_q, n_k, causal, kv_group):
        smem = shared_words()  # cfg.smem_layout() from a 1024-byte-aligned base: Q_i, the stages, the barriers
        tid = uint64(cuda.threadIdx.x)
        head, q_start = uint64(cuda.blockIdx.y), (uint64(cuda.gridDim.x) - ONE - uint64(cuda.blockIdx.x)) * BR
        kv_head = head // uint64(kv_group)  # the K, V head it reads (grouped-query attention)
        n_q, n_k = uint64(n_q), uint64(n_k)
        raw = ptx.shared_address(smem, ZERO)
        base = (raw + uint32(ALIGN - ONE)) & ~uint32(ALIGN - ONE)  # the swizzle is of absolute address bits
        k_stop = key_stop(min(q_start + BR, n_q), n_q, n_k, causal)  # causal: later key tiles are skipped
        n_tiles = (k_stop + BC - ONE) // BC

        if tid == ZERO:
            init_barriers(base)
        cuda.syncthreads()  # the barriers are initialised before any thread waits on them
        if tid < WG:  # the producer warpgroup
            producer_registers()
            if tid == ZERO:
                produce(TMAPS, base, q_start, head, kv_head, n_tiles)
        else:  # the consumers
            consumer_registers()
            consume(O, LSE, base, tid - WG, q_start, head, n_q, n_k, QK_SCALE[head], V_SCALE[head], causal, n_tiles)

    return flash_fwd


def build(cfg: Fp8Tiling, element: str = "e4m3", head_group: int = 1):
    """What v11 builds: its kernel for the FP8 tiling ``cfg`` (e4m3 inputs, bfloat16 output; one head at a time)."""
    if element != "e4m3":
        raise ValueError(f"kernel v11 takes e4m3 inputs; got element {element!r}")
    return make_kernel(cfg)
