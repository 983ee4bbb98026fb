"""A warpgroup's tile of attention on Hopper's tensor cores: the two products by ``wgmma``.

A warpgroup (4 warps, 128 threads) owns 64 query rows: warp w of the group rows 16w .. 16w + 15,
and a lane rows g and g + 8 of its warp's 16 (g = lane // 4), as in ``tinyflash.warp_tile`` with one
row tile. That is no accident: wgmma's m64nN accumulator is ``mma.m16n8``'s C fragment repeated, per
warp (``tinyflash.gpu.wgmma``), so the lane's part of S_ij is the array ``s[0, n, e]`` of a warp's tile,
and the mask, the online softmax's step and the epilogue of ``warp_tile`` apply unchanged. What changes
is how S_ij and P_ij V_j are computed:

    scores        S_ij = Q_i K_jᵀ: d / 16 wgmma's m64n{Bc}k16, both operands read from shared memory
                  through descriptors (Q_i and K_j stored 128-byte swizzled, K-major)
    p_times_v     acc += P_ij V_j: P_ij packed from S_ij's accumulators into the A words of Bc / 16 wgmma's
                  m64n{d}k16 (A from registers), V_j read through a descriptor, transposed (MN-major)

Each is one batch: fence, the multiplies, commit, wait. The tensor cores run a batch on their own, and
a warpgroup issues a whole tile's product with d / 16 (or Bc / 16) instructions where a warp's tile
needed a ldmatrix and an mma.sync per 16 × 8 × 16 piece. Waiting at once (``wait_group 0``) keeps the
order of stage 1 (v7 to v9). Each product also comes in halves, for a kernel that overlaps the softmax
with the products (v10):

    issue_scores      S_ij's batch, committed and not waited for
    pack_p            P_ij from S_ij's accumulators into the A words
    issue_p_times_v   acc += P_ij V_j's batch, committed and not waited for
    scores_ready      wait_group 1: the older batch (S_ij's) is done, the newest (P·V's) may still run
    products_ready    wait_group 0: every batch is done

Shared memory: a tile of R rows × d columns is 128-byte swizzled (``wgmma.swizzled_chunk``) in d / 64 pieces
of 64 columns (128 bytes a row, the most the swizzle takes): columns 0-63 of every row, then 64-127, and at
d = 256 128-191 and 192-255, R · 128 bytes each; Q_i's warpgroup rows start 64 · 128 bytes apart.

**FP8** (:func:`fp8_warpgroup_tile`, kernel v11): the same pieces on e4m3 bytes, by ``wgmma``'s m64nNk32. A row of
d e4m3 values is d bytes, so a 128-byte swizzled piece holds 128 columns and a k-step is 32 of them (still 32
bytes): Q_i and K_j are d / 128 pieces, or at d = 64 one piece of 64-byte rows with the 64-byte swizzle
(:func:`fp8_row_bytes`). FP8 operands are K-major only, so V_j is stored transposed, Vᵀ_j (d rows
of Bc keys), and P_ij enters from registers as e4m3. The accumulator layout is not the e4m3 A layout (a lane holds
keys 2t, 2t + 1 of each 8, the A fragment wants columns 4t .. 4t + 3 of each 16): instead of moving bytes among
lanes, the keys are renumbered, in P and in Vᵀ alike (:func:`fp8_key_of_column`): column c of a 32-key step holds
whichever key the lane that owns column c already has. P V is a sum over keys, so it does not see the order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace

from numba import cuda, uint32, uint64

from .gpu import fp8, ptx, wgmma
from .gpu.runtime import u
from .warp_tile import MMA_K, MMA_N

WGMMA_M = wgmma.WGMMA_M  # query rows of a warpgroup
ROW_BYTES = wgmma.SWIZZLE_ROW_BYTES  # a row of one 64-column piece of a swizzled tile
PIECE_STEPS = ROW_BYTES // (2 * MMA_K)  # k-steps of 16 columns in one 64-column piece: 4
HALF_STEPS = PIECE_STEPS  # the backward's name for it (at its d <= 128 a tile's pieces are its halves)
# d = dv that a warpgroup's tile takes: whole 64-column pieces of a swizzled tile, 1, 2 or 4 of them (256: wgmma's
# largest N, for P_ij V_j's m64n{d}k16)
HEAD_DIMS = (64, 128, 256)
BACKWARD_HEAD_DIMS = (64, 128)  # the backward's kernel v3 (its tilings are sized for these)


@dataclass(frozen=True)
class WarpgroupTile:
    """What a warpgroup's products are made of: the 16-bit ``element`` type, head dim D, BC keys per tile,
    and the rows of the Q_i tile in shared memory (BR: every warpgroup of the block reads its own 64)."""

    element: str
    D: int
    BC: int
    BR: int

    @property
    def K_STEPS(self) -> int:  # wgmma's over d for S_ij
        return self.D // MMA_K

    @property
    def P_STEPS(self) -> int:  # wgmma's over the keys for P_ij V_j
        return self.BC // MMA_K

    @property
    def S_TILES(self) -> int:  # 8-key blocks of a lane's S_ij accumulators
        return self.BC // MMA_N

    def descriptor_bits(self) -> dict:
        """The fixed bits of the three descriptors: Q_i and K_j K-major (SBO: 8 rows of 128 bytes; LBO unused),
        V_j MN-major (SBO: 8 keys; LBO: from one 64-column piece to the next, BC rows on)."""
        return {"Q": wgmma.descriptor_bits(16, 8 * ROW_BYTES), "K": wgmma.descriptor_bits(16, 8 * ROW_BYTES),
                "V": wgmma.descriptor_bits(self.BC * ROW_BYTES, 8 * ROW_BYTES)}


def tile_problems(D: int, BC: int) -> list[str]:
    """What makes a warpgroup tile invalid (empty if nothing)."""
    problems = [] if D in HEAD_DIMS else [f"D must be one of {HEAD_DIMS}"]
    if BC % MMA_K or not MMA_K <= BC <= 256:
        problems.append("BC must be a multiple of 16 from 16 to 256 (wgmma's N for S_ij, 16-key steps for P·V)")
    return problems


def k_step_offset(kk: int, rows: int) -> int:
    """Bytes from a swizzled tile of ``rows`` rows to the start of columns 16kk .. 16kk + 15: its 64-column piece,
    then 32 bytes per step inside the piece (the hardware swizzles the address it computes from there)."""
    return (kk // PIECE_STEPS) * rows * ROW_BYTES + (kk % PIECE_STEPS) * 2 * MMA_K


@lru_cache(maxsize=None)
def warpgroup_tile(spec: WarpgroupTile) -> SimpleNamespace:
    """The device functions of a warpgroup's tile (module docstring) for ``spec``."""
    K_STEPS, P_STEPS, S_TILES, HALF_D = spec.K_STEPS, spec.P_STEPS, spec.S_TILES, spec.D // 2
    mma_s = wgmma.mma_async_ss(spec.element, spec.BC)  # S_ij: Q_i, K_j from shared memory
    mma_o = wgmma.mma_async_rs(spec.element, spec.D, trans_b=True)  # O_i: P_ij from registers, V_j transposed
    pack, wait_all, wait_one = ptx.pack(spec.element), wgmma.wait_group(0), wgmma.wait_group(1)
    fence_s, fence_o, fence_p = (wgmma.fence_operands(spec.BC // 2), wgmma.fence_operands(HALF_D),
                                 wgmma.fence_operands(4 * P_STEPS))
    bits = spec.descriptor_bits()
    Q_BITS, K_BITS, V_BITS = u(bits["Q"]), u(bits["K"]), u(bits["V"])
    # descriptor steps (the start field counts 16 bytes): per k-step in Q_i and K_j, per 16 keys in V_j
    # (k_step_offset in 16-byte units: a 64-column piece of R rows is 8R, a step inside it 2)
    Q_PIECE, K_PIECE, STEP, PIECE = u(spec.BR * ROW_BYTES >> 4), u(spec.BC * ROW_BYTES >> 4), u(2), u(PIECE_STEPS)
    V_STEP = u(MMA_K * ROW_BYTES >> 4)
    WG_Q_BYTES = u(WGMMA_M * ROW_BYTES)  # from one warpgroup's rows of Q_i to the next's

    @cuda.jit(device=True, inline="always")
    def descriptors(q_tile, warpgroup, k_tile, v_tile):
        """The descriptors of the warpgroup's rows of Q_i and of K_j, V_j (tiles at shared byte addresses)."""
        return (wgmma.descriptor(q_tile + uint32(uint64(warpgroup) * WG_Q_BYTES), Q_BITS),
                wgmma.descriptor(k_tile, K_BITS), wgmma.descriptor(v_tile, V_BITS))

    @cuda.jit(device=True, inline="always")
    def issue_scores(s, q_desc, k_desc):
        """S_ij = Q_i K_jᵀ issued as one wgmma group and not waited for: fence, d / 16 multiplies, commit. The
        first step overwrites s (scale_d = 0), the others add to it; s is neither read nor written until a wait
        retires the group."""
        wgmma.fence()
        for kk in range(K_STEPS):
            piece, step = uint64(kk) // PIECE, uint64(kk) % PIECE  # k_step_offset(kk, rows)
            mma_s(s, q_desc + piece * Q_PIECE + step * STEP, k_desc + piece * K_PIECE + step * STEP, uint32(kk != 0))
        wgmma.commit_group()

    @cuda.jit(device=True, inline="always")
    def scores(s, q_desc, k_desc):
        """S_ij = Q_i K_jᵀ for the warpgroup's 64 rows, waited for: s[0, n, e] the lane's part of keys 8n .. 8n + 7
        (not yet scaled)."""
        issue_scores(s, q_desc, k_desc)
        wait_all()
        fence_s(s)  # the softmax reads s after the wait, not before

    @cuda.jit(device=True, inline="always")
    def pack_p(s, p):
        """P_ij (in s) packed into p, the A words of each 16-key step: the accumulator layout of keys
        16kk .. 16kk + 15, two 8-key blocks, is the A layout."""
        for kk in range(P_STEPS):
            for h in range(2):  # keys 16kk + 8h ..: rows g (e = 0, 1) and g + 8 (e = 2, 3)
                p[kk, 2 * h] = pack(s[0, 2 * kk + h, 0], s[0, 2 * kk + h, 1])
                p[kk, 2 * h + 1] = pack(s[0, 2 * kk + h, 2], s[0, 2 * kk + h, 3])

    @cuda.jit(device=True, inline="always")
    def issue_p_times_v(acc, p, v_desc):
        """acc += P_ij V_j issued as one wgmma group and not waited for: p and acc are written (packed,
        rescaled) before the batch's fence, so that no register the tensor cores read is written between the
        fence and the multiplies; neither is touched again until a wait retires the group."""
        fence_p(p)
        fence_o(acc)  # the rescaling of acc is done before the fence
        wgmma.fence()
        for kk in range(P_STEPS):
            mma_o(acc, p[kk, 0], p[kk, 1], p[kk, 2], p[kk, 3], v_desc + uint64(kk) * V_STEP, uint32(1))
        wgmma.commit_group()

    @cuda.jit(device=True, inline="always")
    def p_times_v(acc, s, p, v_desc):
        """acc += P_ij V_j, waited for: P_ij (in s) packed into p, then one wgmma group."""
        pack_p(s, p)
        issue_p_times_v(acc, p, v_desc)
        wait_all()  # V_j's stage may be refilled, and acc read, only after this
        fence_o(acc)

    @cuda.jit(device=True, inline="always")
    def scores_ready(s):
        """Wait until at most one wgmma group is in flight (``wait_group 1``): with S_ij's group issued before
        a P·V group, S_ij is written to s (and K_j read) while P·V may still run."""
        wait_one()
        fence_s(s)  # the softmax reads s after the wait, not before

    @cuda.jit(device=True, inline="always")
    def products_ready(acc):
        """Wait until no wgmma group is in flight (``wait_group 0``): acc holds every product issued, and the
        stages they read may be refilled."""
        wait_all()
        fence_o(acc)  # acc is rescaled and read after the wait, not before

    return SimpleNamespace(descriptors=descriptors, scores=scores, p_times_v=p_times_v, issue_scores=issue_scores,
                           pack_p=pack_p, issue_p_times_v=issue_p_times_v, scores_ready=scores_ready,
                           products_ready=products_ready, S_TILES=S_TILES)


FP8_K = wgmma.WGMMA_K_FP8  # e4m3 values (bytes) per k-step: 32
FP8_HEAD_DIMS = (64, 128, 256)  # e4m3 rows of 128-byte pieces, or one 64-byte row (the 64-byte swizzle)
FP8_BC = 128  # keys per tile: Vᵀ_j's rows are one 128-byte piece of keys


def fp8_row_bytes(d: int) -> int:
    """The bytes of a swizzled row of an FP8 Q_i or K_j tile: 128 (pieces of 128 columns), or d = 64's 64 (one
    piece, with the 64-byte swizzle: 16-byte chunks permuted by bits 7-8 of the address)."""
    return min(d, ROW_BYTES)


def fp8_key_of_column(c):
    """The key (0 .. 31, within its 32-key step) that column ``c`` of an FP8 A operand holds in kernel v11: the
    A fragment gives lane t of a group columns 4t .. 4t + 3 and 16 + 4t .. 16 + 4t + 3 (``wgmma.mma_async_rs``),
    and its accumulators hold keys 2t, 2t + 1 of each 8-key block, so

        column 4t + b       <- key 8·(b // 2) + 2t + b % 2           (blocks 0 and 1)
        column 16 + 4t + b  <- key 16 + 8·(b // 2) + 2t + b % 2      (blocks 2 and 3)

    Vᵀ's column c holds the same key's values (the host's transpose puts it there)."""
    return 16 * (c // 16) + 8 * ((c % 4) // 2) + 2 * ((c % 16) // 4) + c % 2


@lru_cache(maxsize=None)
def fp8_warpgroup_tile(spec: WarpgroupTile) -> SimpleNamespace:
    """The device functions of a warpgroup's FP8 tile (``spec.element == "e4m3"``; module docstring): the names
    and contracts of :func:`warpgroup_tile`'s, on e4m3 bytes. Q_i (Br rows), K_j (Bc rows) and Vᵀ_j (d rows of Bc
    keys) are K-major 128-byte-swizzled tiles of bytes; p holds the e4m3 A words of Bc / 32 steps."""
    if spec.element != "e4m3" or spec.D not in FP8_HEAD_DIMS or spec.BC % (4 * FP8_K):
        raise ValueError(f"an FP8 warpgroup tile needs element 'e4m3', D in {FP8_HEAD_DIMS} and BC a multiple of 128; "
                         f"got {spec}")
    K_STEPS, P_STEPS, HALF_D = spec.D // FP8_K, spec.BC // FP8_K, spec.D // 2
    mma_s, mma_o = wgmma.mma_async_ss("e4m3", spec.BC), wgmma.mma_async_rs("e4m3", spec.D)
    pack, wait_all, wait_one = fp8.pack_e4m3x2, wgmma.wait_group(0), wgmma.wait_group(1)
    fence_s, fence_o, fence_p = (wgmma.fence_operands(spec.BC // 2), wgmma.fence_operands(HALF_D),
                                 wgmma.fence_operands(4 * P_STEPS))
    QK_ROW = fp8_row_bytes(spec.D)  # a row of a piece of Q_i, K_j: 128 bytes, or at d = 64 the 64 of a row
    # every operand K-major, SBO 8 rows: Q_i, K_j in pieces of QK_ROW-byte rows (swizzle code 1: 128 bytes, 2: 64),
    # Vᵀ_j in 128-byte rows of keys
    QK_BITS = u(wgmma.descriptor_bits(16, 8 * QK_ROW, 1 if QK_ROW == ROW_BYTES else 2))
    V_BITS = u(wgmma.descriptor_bits(16, 8 * ROW_BYTES))
    # descriptor steps (16-byte units): a piece of R rows is R · row bytes / 16, a 32-byte step inside it 2
    Q_PIECE, K_PIECE, V_PIECE = (u(spec.BR * QK_ROW >> 4), u(spec.BC * QK_ROW >> 4), u(spec.D * ROW_BYTES >> 4))
    STEP, QK_PIECE_STEPS, V_PIECE_STEPS = u(FP8_K >> 4), u(QK_ROW // FP8_K), u(ROW_BYTES // FP8_K)
    WG_Q_BYTES = u(WGMMA_M * QK_ROW)

    @cuda.jit(device=True, inline="always")
    def descriptors(q_tile, warpgroup, k_tile, vt_tile):
        """The descriptors of the warpgroup's rows of Q_i and of K_j, Vᵀ_j (tiles at shared byte addresses)."""
        return (wgmma.descriptor(q_tile + uint32(uint64(warpgroup) * WG_Q_BYTES), QK_BITS),
                wgmma.descriptor(k_tile, QK_BITS), wgmma.descriptor(vt_tile, V_BITS))

    @cuda.jit(device=True, inline="always")
    def issue_scores(s, q_desc, k_desc):
        """S_ij = Q_i K_jᵀ issued as one group of d / 32 FP8 multiplies, not waited for."""
        wgmma.fence()
        for kk in range(K_STEPS):
            piece, step = uint64(kk) // QK_PIECE_STEPS, uint64(kk) % QK_PIECE_STEPS
            mma_s(s, q_desc + piece * Q_PIECE + step * STEP, k_desc + piece * K_PIECE + step * STEP, uint32(kk != 0))
        wgmma.commit_group()

    @cuda.jit(device=True, inline="always")
    def scores(s, q_desc, k_desc):
        """S_ij = Q_i K_jᵀ, waited for: s[0, n, e] the lane's part of keys 8n .. 8n + 7 (in float32, unscaled)."""
        issue_scores(s, q_desc, k_desc)
        wait_all()
        fence_s(s)

    @cuda.jit(device=True, inline="always")
    def pack_p(s, p):
        """P_ij (float32, in s) rounded to e4m3 into p[kk], the A words of keys 32kk .. 32kk + 31, in the columns
        of :func:`fp8_key_of_column`: word 0 row g, keys 2t, 2t + 1, 8 + 2t, 9 + 2t (s blocks 4kk, 4kk + 1);
        word 1 the same of row g + 8; words 2 and 3 those of blocks 4kk + 2, 4kk + 3. No lane reads another's."""
        for kk in range(P_STEPS):
            for h in range(2):  # columns 16h ..: blocks 4kk + 2h, 4kk + 2h + 1
                b = 4 * kk + 2 * h
                for row in range(2):  # row g (e = 0, 1) and g + 8 (e = 2, 3)
                    lo = pack(s[0, b, 2 * row], s[0, b, 2 * row + 1])
                    hi = pack(s[0, b + 1, 2 * row], s[0, b + 1, 2 * row + 1])
                    p[kk, 2 * h + row] = uint32(lo) | (uint32(hi) << uint32(16))

    @cuda.jit(device=True, inline="always")
    def issue_p_times_v(acc, p, vt_desc):
        """acc += P_ij V_j issued as one group of Bc / 32 FP8 multiplies (A from p, B = Vᵀ_j), not waited for."""
        fence_p(p)
        fence_o(acc)
        wgmma.fence()
        for kk in range(P_STEPS):
            piece, step = uint64(kk) // V_PIECE_STEPS, uint64(kk) % V_PIECE_STEPS
            mma_o(acc, p[kk, 0], p[kk, 1], p[kk, 2], p[kk, 3], vt_desc + piece * V_PIECE + step * STEP, uint32(1))
        wgmma.commit_group()

    @cuda.jit(device=True, inline="always")
    def p_times_v(acc, s, p, vt_desc):
        """acc += P_ij V_j, waited for."""
        pack_p(s, p)
        issue_p_times_v(acc, p, vt_desc)
        wait_all()
        fence_o(acc)

    @cuda.jit(device=True, inline="always")
    def scores_ready(s):
        """wait_group 1: S_ij is written, the P·V issued after it may still run."""
        wait_one()
        fence_s(s)

    @cuda.jit(device=True, inline="always")
    def products_ready(acc):
        """wait_group 0: every product is in acc."""
        wait_all()
        fence_o(acc)

    return SimpleNamespace(descriptors=descriptors, scores=scores, p_times_v=p_times_v, issue_scores=issue_scores,
                           pack_p=pack_p, issue_p_times_v=issue_p_times_v, scores_ready=scores_ready,
                           products_ready=products_ready, P_STEPS=P_STEPS)
