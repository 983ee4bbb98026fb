"""The tiling of the tensor-core kernel v6: who computes what, where tiles live, in which order the blocks take
the heads. (``tiling.py`` beside this is the same for the CUDA-core kernels v2 to v5; what a warp owns and how its
fragments are laid out is ``tinyflash.warp_tile``; how a tiling is launched is the host layer's,
``tinyflash.host.launch``.)

A block of WARPS warps owns Br = 16 · ROW_TILES · WARPS query rows: warp w the rows
32w .. 32w + 31 (two row tiles of 16) or 16w .. 16w + 15 (one); it walks the keys in tiles K_j, V_j of
Bc = BC keys. Shared memory holds Q_i, then two stages of (K_j, V_j), every row padded by 16 bytes:
:meth:`TensorCoreTiling.smem_layout` is its one description. A lane's place in a warp's fragments is
``tinyflash.gpu.ptx``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from ...gpu.launch import Tiling
from ...warp_tile import MMA_K, MMA_M, PAD_WORDS, WARP, WarpTile, padded_head_dim, tile_problems


# causal: the K and V of the heads ordered together, at most this many bytes (head_group): they stay in the L2 cache
# while the group's blocks read them. The docs' tests check the rule's group against the sweep's fastest.
L2_KV_BYTES = 16 * 2**20


@dataclass(frozen=True)
class TensorCoreTiling(Tiling):
    """Who computes what: WARPS warps of 16 · ROW_TILES query rows each, key tiles of BC keys, head dim D;
    and where Q_i's A operands are held: in registers, loaded once (Q_IN_SMEM False), or read from Q_i in
    shared memory for every key tile, two mma steps over d at a time (True: fewer registers, more ldmatrix)."""

    D: int  # head dim (d = dv)
    WARPS: int  # warps per block
    BC: int  # keys per tile K_j, V_j (Bc)
    MAX_REGISTERS: int | None = None  # a cap on registers per thread (more blocks per multiprocessor), or None
    ROW_TILES: int = 1  # 16-row tiles per warp (1 or 2): 2 feeds each K_j, V_j fragment to two mma's
    Q_IN_SMEM: bool = False  # read Q_i's A operands from shared memory per key tile instead of holding them
    LAZY_RESCALE: bool = False  # rescale acc and l_i only when a row's max grows by more than 2^RESCALE_LOG2
    HEAD_GROUP: int | None = None  # heads whose blocks are ordered together (v6's block_work); None: head_group's rule
    WHAT = "tensor-core tiling"

    @property
    def BR(self) -> int:  # query rows per block (Br): 16 per row tile
        return MMA_M * self.ROW_TILES * self.WARPS

    @property
    def NT(self) -> int:  # threads per block
        return WARP * self.WARPS

    @property
    def DP(self) -> int:  # the head dim of a row in shared memory: D padded with zero columns (tinyflash.warp_tile)
        return padded_head_dim(self.D)

    @property
    def ROW_WORDS(self) -> int:  # words (pairs of 16-bit values) of one padded row in shared memory
        return self.DP // 2 + PAD_WORDS

    @property
    def CHUNKS(self) -> int:  # 16-byte chunks per row in shared memory (one cp.async each)
        return self.DP // 8

    def warp_tile(self, element: str) -> WarpTile:
        """What each warp of this tiling owns, for inputs of ``element`` (``tinyflash.warp_tile``)."""
        return WarpTile(element, self.D, self.BC, self.ROW_TILES, self.Q_IN_SMEM, self.LAZY_RESCALE)

    def smem_layout(self) -> dict:
        """Word offsets in shared memory: Q_i, then two stages of (K_j, V_j)."""
        tile = self.BC * self.ROW_WORDS
        return {"Q_i": 0, "stage 0": self.BR * self.ROW_WORDS, "stage 1": self.BR * self.ROW_WORDS + 2 * tile,
                "V_j in a stage": tile, "end": self.BR * self.ROW_WORDS + 4 * tile}

    @property
    def smem_bytes(self) -> int:
        return 4 * self.smem_layout()["end"]

    def shape_problems(self) -> list[str]:
        problems = tile_problems(self.D, self.ROW_TILES, "row")
        if self.BC % MMA_K or (self.BC * self.CHUNKS) % self.NT or (self.BR * self.CHUNKS) % self.NT:
            problems.append("BC must be a multiple of 16, and each tile's 16-byte chunks a multiple of the threads")
        if self.HEAD_GROUP is not None and self.HEAD_GROUP < 1:
            problems.append("HEAD_GROUP must be None or at least 1")
        return problems

    def for_block_mask(self, block_q: int, block_k: int) -> "TensorCoreTiling | None":
        """This tiling for a block mask of block_q × block_k tiles (``tinyflash.flex_attention``): a block must lie
        in one of the mask's query tiles (Br divides block_q) and walk its key tiles in whole tiles of its own (Bc
        divides block_k). Where Br does not divide block_q, fewer warps, then one row tile per warp; where Bc does
        not divide block_k, key tiles of block_k (if a multiple of 16 up to Bc). None if nothing fits."""
        cfg = self
        if block_k % cfg.BC:
            if block_k % MMA_K or block_k > cfg.BC:
                return None
            cfg = replace(cfg, BC=block_k)
        while block_q % cfg.BR and (cfg.WARPS > 1 or cfg.ROW_TILES > 1):
            cfg = replace(cfg, WARPS=cfg.WARPS // 2) if cfg.WARPS > 1 else replace(cfg, ROW_TILES=1)
        return cfg.validate() if not block_q % cfg.BR and not cfg.shape_problems() else None

    def head_group(self, n_k: int, n_heads: int, kv_group: int, causal: bool) -> int:
        """How many heads v6 orders together, longest query tiles first (its ``block_work``). Not causal: 1, one
        head after another (every block is as long as every other; the blocks running together share one head's
        K and V in L2). Causal: the query tiles differ in length, and the blocks started last must be short ones,
        not a head's longest tile; so the heads whose K and V fit in L2_KV_BYTES together (at least one K/V head:
        kv_group query heads) start their longest tiles first, then the next-longest, and so on."""
        if self.HEAD_GROUP is not None:
            return min(self.HEAD_GROUP, n_heads)
        if not causal:
            return 1
        kv_bytes = 2 * n_k * self.D * 2  # one K/V head's K and V, 16-bit elements
        return min(n_heads, kv_group * max(1, L2_KV_BYTES // kv_bytes))


SHORT_CAUSAL = 8192  # causal with fewer query rows than this: blocks of 128 rows (see default_tiling)


@lru_cache(maxsize=256)  # built and validated once per (d, causal, n_q), for the last 256 of them
def default_tiling(d: int, causal: bool, n_q: int = SHORT_CAUSAL) -> TensorCoreTiling:
    """The tiling used on a GPU: for each (d, causal, N) of the H200's tiling sweep, the fastest
    (``python -m tinyflash.bench tensor-core-tiles``, figures/data/tensor_core_tiles_h200.csv: with the causal
    mask the kernel that orders its blocks by groups of heads, each tiling at its best group; without it the
    kernel that takes one head at a time, which is the one that runs there); the docs' tests check that these
    are still the record's fastest. Every warp owns 2 row tiles (32 query rows) of 64-key tiles. d = 128: 8 warps,
    Q_i read from shared memory for each key tile, rescaled lazily; causal with fewer than SHORT_CAUSAL query
    rows, 4 warps, so that blocks of uneven length are finer pieces of work to share out (the switch lies
    between the two lengths of the sweep). d = 64: 4 warps, Q_i in registers; rescaled lazily when causal, at
    every tile when not.

    Other head dims take the tiling of the next of these by DP (d padded to a multiple of 32): up to 64, d = 64's;
    up to 128, d = 128's. Past 128 a warp's accumulators of two row tiles would not fit in its 255 registers
    (DP / 2 · 8 of them), so a warp owns one row tile: 8 warps (Br = 128), Q_i in shared memory, 64-key tiles,
    as FlashAttention-2 does at d = 256 (``python -m tinyflash.bench head-dims`` times them)."""
    dp = padded_head_dim(d)
    if dp <= 64:
        return TensorCoreTiling(D=d, WARPS=4, BC=64, ROW_TILES=2, LAZY_RESCALE=causal).validate()
    if dp <= 128:
        warps = 4 if causal and n_q < SHORT_CAUSAL else 8
        return TensorCoreTiling(D=d, WARPS=warps, BC=64, ROW_TILES=2, Q_IN_SMEM=True, LAZY_RESCALE=True).validate()
    return TensorCoreTiling(D=d, WARPS=8, BC=64, ROW_TILES=1, Q_IN_SMEM=True, LAZY_RESCALE=True).validate()


def simulator_tiling(d: int) -> TensorCoreTiling:
    """One warp and 16 keys per tile: the smallest tiling, for numba's CUDA simulator."""
    return TensorCoreTiling(D=d, WARPS=1, BC=16).validate()
