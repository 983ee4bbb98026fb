"""The tiling of the tensor-core backward kernel (v2): who computes what, where tiles live.

A block of WARPS warps owns one key tile K_j, V_j of Bc = 16 · ROW_TILES · WARPS / DKV_COLUMN_GROUPS keys of one
K/V head: warp w the keys 16·ROW_TILES·(w div DKV_COLUMN_GROUPS) .. of the tile, the rows of its mma tiles. The
grid runs over (key tiles, K/V heads), and each block walks the query tiles Q_i (BR rows) that see its keys, for
every query head of its group, so that dK_j and dV_j are summed over the group in registers and K, V are never
repeated (grouped-query heads).

For each Q_i a warp computes, for its keys and all BR queries, Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ on the
tensor cores (K_j's and V_j's A operands read from shared memory by ldmatrix, as v6 reads Q_i with
``Q_IN_SMEM``), Pᵀ and dSᵀ in registers, then dV_j += Pᵀ dO_i and dK_j += dSᵀ Q_i with Pᵀ and dSᵀ packed from
the accumulators (``tinyflash.warp_tile``'s ``scores`` and ``p_times_v``). dQ_i += dS_ij K_j needs dS by query
rows: the warps write dSᵀ to shared memory, and each warp then takes BR / WARPS query rows of dQ_i, added to
a float32 accumulator in HBM with atomics (every key tile adds to every dQ_i that sees it). With more warps
than 16-row tiles of dQ_i (8 warps, BR = 64), the warps also split dQ_i's columns: warp w takes row tile
w mod (BR / 16) and column group w div (BR / 16), so that every warp holds an equal share of dQ_i.

The head dim: a row of d dims is DP wide in shared memory and in the fragments, d padded with zero columns to a
multiple of 32 (``tinyflash.warp_tile.padded_head_dim``); the zeros add nothing to any product, and only d columns
of dQ, dK and dV are written. A warp's dK_j and dV_j for 16 keys are DP float32 registers per lane: past
DP = 128 they would not fit beside Sᵀ and dPᵀ, so DKV_COLUMN_GROUPS = 2 warps share 16 keys, each holding dK_j
and dV_j for half of the columns (FlashAttention-2 at d = 256 splits them the same way). Both warps of a pair
compute the pair's Sᵀ and dPᵀ (their 2 of the 5 products twice), so that Pᵀ and dSᵀ still never leave the
registers for dV_j and dK_j.

Shared memory, every row padded by 16 bytes: K_j and V_j (copied once), two stages of (Q_i, dO_i, lse_i, D_i)
so that the next query tile is in flight while one is computed, and dSᵀ (Bc rows of BR 16-bit values).
:meth:`BackwardTensorCoreTiling.smem_layout` is its one description.
"""

from __future__ import annotations

from dataclasses import dataclass

from numba.cuda import types

from ...gpu.launch import Tiling
from ...warp_tile import (BACKWARD_HEAD_DIMS as HEAD_DIMS, MMA_K, MMA_M, PAD_WORDS, WARP, WarpTile,
                          padded_head_dim, tile_problems)
from .rows import FLOATS, WORDS


@dataclass(frozen=True)
class BackwardTensorCoreTiling(Tiling):
    """WARPS warps, DKV_COLUMN_GROUPS of them on each 16 · ROW_TILES keys (the key tile, Bc), query tiles of BR
    rows, head dim D."""

    D: int  # head dim (d = dv)
    WARPS: int  # warps per block
    BR: int  # query rows per tile Q_i
    ROW_TILES: int = 1  # 16-key tiles per warp
    DKV_COLUMN_GROUPS: int = 1  # warps on the same keys, each holding dK_j and dV_j for DP / this many columns
    WHAT = "tensor-core backward tiling"

    @property
    def BC(self) -> int:  # keys per block (Bc)
        return MMA_M * self.ROW_TILES * self.WARPS // self.DKV_COLUMN_GROUPS

    @property
    def DP(self) -> int:  # the head dim of a row in shared memory and in the fragments: D padded with zero columns
        return padded_head_dim(self.D)

    @property
    def NT(self) -> int:  # threads per block
        return WARP * self.WARPS

    @property
    def ROW_WORDS(self) -> int:  # words of one padded row of Q_i, dO_i, K_j or V_j in shared memory
        return self.DP // 2 + PAD_WORDS

    @property
    def DS_WORDS(self) -> int:  # words of one padded row of dSᵀ (one key, BR queries)
        return self.BR // 2 + PAD_WORDS

    @property
    def CHUNKS(self) -> int:  # 16-byte chunks per row of Q, K, V, dO in shared memory (one cp.async each)
        return self.DP // 8

    @property
    def DQ_ROW_WARPS(self) -> int:  # warps side by side over dQ_i's rows (16 · DQ_TILES rows each)
        return min(self.WARPS, self.BR // MMA_M)

    @property
    def DQ_TILES(self) -> int:  # 16-row tiles of dQ_i per warp
        return self.BR // (MMA_M * self.DQ_ROW_WARPS)

    @property
    def DQ_COLUMN_GROUPS(self) -> int:  # warps side by side over dQ_i's columns (d / DQ_COLUMN_GROUPS each)
        return self.WARPS // self.DQ_ROW_WARPS

    def warp_tile(self, element: str) -> WarpTile:
        """A warp's tile: its keys as the mma rows, BR query columns, the A operands read from shared memory, its
        share of dK_j's and dV_j's columns."""
        return WarpTile(element, self.D, self.BR, self.ROW_TILES, Q_IN_SMEM=True,
                        COLUMN_GROUPS=self.DKV_COLUMN_GROUPS)

    def smem_layout(self) -> dict:
        """Word offsets in shared memory: K_j, V_j, two stages of (Q_i, dO_i, lse_i, D_i), dSᵀ."""
        tile, rows = self.BC * self.ROW_WORDS, self.BR * self.ROW_WORDS
        stage = 2 * rows + 2 * self.BR
        stage0 = 2 * tile
        return {"K_j": 0, "V_j": tile, "stage 0": stage0, "stage 1": stage0 + stage, "dO_i in a stage": rows,
                "lse_i in a stage": 2 * rows, "D_i in a stage": 2 * rows + self.BR, "dS": stage0 + 2 * stage,
                "end": stage0 + 2 * stage + self.BC * self.DS_WORDS}

    @property
    def smem_bytes(self) -> int:
        return 4 * self.smem_layout()["end"]

    def shape_problems(self) -> list[str]:
        problems = tile_problems(self.D, self.ROW_TILES, "key", HEAD_DIMS)
        tiles = self.BR // MMA_M  # 16-row tiles of dQ_i, shared by the warps: by rows, then by columns
        if self.BR % MMA_M or self.BR > self.NT or (tiles % self.WARPS if tiles >= self.WARPS else self.WARPS % tiles):
            problems.append("BR must be a multiple of 16, at most NT, and its 16-row tiles a multiple or a divisor "
                            "of WARPS (dQ_i's tiles shared evenly by the warps)")
        elif (self.DP // 8) % (2 * self.DQ_COLUMN_GROUPS):
            problems.append("each warp's columns of dQ_i must be a multiple of 16 (DP / (16 · column groups) whole)")
        groups = self.DKV_COLUMN_GROUPS
        if groups < 1 or self.WARPS % groups or (self.DP // 8) % (2 * groups):
            problems.append("DKV_COLUMN_GROUPS must divide WARPS, and each warp's columns of dK_j and dV_j must be "
                            "a multiple of 16 (DP / (16 · DKV_COLUMN_GROUPS) whole)")
        if (self.BC * self.CHUNKS) % self.NT or (self.BR * self.CHUNKS) % self.NT:
            problems.append("each tile's 16-byte chunks must be a multiple of the threads")
        return problems


def default_tiling(d: int) -> BackwardTensorCoreTiling:
    """The tiling used on a GPU. At DP = 32, 64 and 128 (d padded to a multiple of 32): 8 warps of 16 keys
    (Bc = 128), query tiles of 64 rows, each warp a quarter of dQ_i's rows and half of its columns;
    FlashAttention-2's block shape at d = 128, and on an H200 the fastest of those tried at d = 64 and 128
    (``python -m tinyflash.bench backward-tensor-core-tiles``): a key tile twice as long as with 4 warps reads Q_i
    and dO_i and adds to dQ half as often.

    At the other head dims, query tiles of 32 rows, which keep every lane's registers within ptxas's 255 without
    spills (``benchmarks/ptxas_report.py``: at 64 rows the kernel spills at DP = 96, 192 and 256); past DP = 128
    two warps on each 16 keys, each with half of dK_j's and dV_j's columns. 8 warps where DP is a multiple of 64
    (DP = 192, 256: Bc = 64, FlashAttention-2's at d = 256; 141 KB of shared memory at d = 256, within an A100's
    163 KB a block), else 4, so that dQ_i's 8-column tiles split among the warps in groups of an even size (a
    warp's ldmatrix takes them in pairs) and each tile's 16-byte pieces among the threads."""
    dp = padded_head_dim(d)
    if dp in (32, 64, 128):
        return BackwardTensorCoreTiling(D=d, WARPS=8, BR=64).validate()
    return BackwardTensorCoreTiling(D=d, WARPS=8 if dp % 64 == 0 else 4, BR=32,
                                    DKV_COLUMN_GROUPS=1 if dp <= 128 else 2).validate()


def simulator_tiling(d: int) -> BackwardTensorCoreTiling:
    """The smallest tiling of the GPU's kind, for numba's CUDA simulator: one warp of 16 keys, query tiles of 16
    rows; past DP = 128 two warps on the same 16 keys, each with half of dK_j's and dV_j's columns."""
    if padded_head_dim(d) <= 128:
        return BackwardTensorCoreTiling(D=d, WARPS=1, BR=16).validate()
    return BackwardTensorCoreTiling(D=d, WARPS=2, BR=16, DKV_COLUMN_GROUPS=2).validate()


# the main kernels' argument types (v2, v3): Q, K, V, dO as 16-bit pairs; LSE, Dvec, dQ_acc; dK, dV as pairs;
# dQ_turn (int32); n_q, n_k, scale, scale·log2(e), causal, kv_group
SIGNATURE = ((WORDS,) * 4 + (FLOATS,) * 3 + (WORDS,) * 2 + (types.Array(types.int32, 1, "C"),)
             + (types.int64, types.int64, types.float32, types.float32, types.boolean, types.int64))
