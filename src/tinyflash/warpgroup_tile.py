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
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace

from numba import cuda, uint32, uint64

from .gpu import ptx, wgmma
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
