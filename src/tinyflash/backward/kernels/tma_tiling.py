"""The tiling of the warp-specialised backward kernel (v4): v3's block with a producer.

A block has v3's WARPGROUPS consumer warpgroups (64 keys each, Bc = 64 · WARPGROUPS; query tiles of Br = 64 or
128 rows) and one more, the first: the *producer*. Its first thread requests K_j, V_j once and then, for each query tile, Q_i and dO_i by TMA
(``tinyflash.gpu.tma``) into a ring of STAGES stages; its first warp's lanes put lse_i (base 2) and D_i beside
them. Each stage has a "full" mbarrier (the copies' bytes, and LSE_LANES + 1 arrivals: the lanes that stored
lse_i and D_i, and the thread that announced the bytes) and an "empty" one (the consumers' threads, once their
multiplies have read the stage). dSᵀ has two buffers, one per query-tile parity, so that the consumers meet at
one named barrier per query tile (module ``v4_warp_specialized``'s docstring says why one is enough).

Shared memory, every tile 128-byte swizzled and 1024-byte aligned (v3's layout): K_j, V_j, the stages of (Q_i,
dO_i, lse_i, D_i), the two dSᵀ buffers, with DQ_BY_TMA dQ_i, then the mbarriers: K_j and V_j's, one "full" per stage, one "empty"
per stage. :meth:`BackwardTmaTiling.smem_layout` is its one description.

With DQ_BY_TMA the consumers store dQ_i (float32) into shared memory instead of adding it to HBM by atomics,
and the producer's second warp adds it to dQ's accumulator by TMA reduce-adds (FlashAttention-3's way), one
named barrier saying the tile is stored, another that it has been read.

The kernel takes the tensor maps of Q, dO (boxes of Br rows), K, V (boxes of Bc rows) and dQ's float32
accumulator in a global array (``gpu/tensor_map.py``; :meth:`BackwardTmaTiling.maps`), not Q, K, V, dO: the host
layer makes them (``tinyflash.host``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...gpu.runtime import u
from ...gpu.tensor_map import MAX_BOX_ROWS, TensorMap
from ...gpu.tma import BARRIER_BYTES
from ...gpu.wgmma import WARPGROUP
from ...hardware import current
from ...warp_tile import WARP
from ...warpgroup_tile import BACKWARD_HEAD_DIMS as HEAD_DIMS, WGMMA_M
from .hopper_tiling import BackwardHopperTiling, aligned

Q_MAP, K_MAP, V_MAP, DO_MAP, DQ_MAP = 0, 1, 2, 3, 4  # the maps' order in the kernel's TMAPS array
LSE_LANES = WARP  # the producer's lanes that store lse_i and D_i: its first warp
DQ_BOX_COLUMNS = 32  # float32 columns of a box of dQ_i (128 bytes, the swizzle's row)


@dataclass(frozen=True)
class BackwardTmaTiling(BackwardHopperTiling):
    """v3's tiling (WARPGROUPS consumer warpgroups of 64 keys, head dim D) with query tiles of BR = 64 or 128
    rows, loaded by a producer warpgroup through TMA into STAGES stages; setmaxnreg gives the producer
    PRODUCER_REGISTERS per thread and the consumers CONSUMER_REGISTERS.

    dQ_i = dS K_j has 64 query rows per wgmma: with Br = 64 the warpgroups split dQ_i's columns (v3's way), with
    Br = 128 its rows (warpgroup w the queries 64w .., all D columns: two warpgroups at least)."""

    STAGES: int = 2
    BR: int = 64  # query rows per tile (v3's are 64)
    DQ_BY_TMA: bool = False  # dQ_i through shared memory and a TMA reduce-add (else paired atomics, v3's)
    LONGEST_FIRST: bool = True  # causal: blocks in the order of :func:`longest_first` (else key tiles head by head)
    PRODUCER_REGISTERS: int = 24
    CONSUMER_REGISTERS: int = 240
    WHAT = "warp-specialised backward tiling"

    @property
    def DQ_ROW_GROUPS(self) -> int:  # warpgroups side by side over dQ_i's rows (64 each)
        return self.BR // WGMMA_M

    @property
    def DQ_N(self) -> int:  # dQ_i's columns per warpgroup: the warpgroups of a row group split them
        return self.D * self.DQ_ROW_GROUPS // self.WARPGROUPS

    @property
    def DV_FIRST(self) -> bool:
        """dV_j += Pᵀ dO_i issued before dSᵀ is computed, and multiplied meanwhile (FlashAttention-3's order):
        with 64-row query tiles. With 128, Pᵀ's packed words beside Sᵀ's, dPᵀ's, dK_j's and dV_j's accumulators
        pass the consumers' 240 registers (ptxas spills and serialises the wgmma's): dV_j is issued with dK_j."""
        return self.BR == WGMMA_M

    @property
    def CONSUMERS(self) -> int:  # threads of the consumer warpgroups
        return WARPGROUP * self.WARPGROUPS

    @property
    def NT(self) -> int:  # threads per block: the producer's warpgroup and the consumers
        return WARPGROUP * (self.WARPGROUPS + 1)

    def smem_layout(self) -> dict:
        """Byte offsets from the block's 1024-byte-aligned base: K_j, V_j, STAGES stages of (Q_i, dO_i, lse_i,
        D_i), two dSᵀ buffers, with DQ_BY_TMA dQ_i (float32, boxes of 32 columns, 128-byte swizzled), then the
        mbarriers: K_j and V_j's, "full" per stage, "empty" per stage."""
        kv, rows = self.BC * self.D * 2, self.BR * self.D * 2
        stage = aligned(2 * rows + 2 * 4 * self.BR)
        stage0 = 2 * kv
        ds = stage0 + self.STAGES * stage
        ds_bytes = self.BC * self.BR * 2
        dq = ds + 2 * ds_bytes
        bars = dq + (self.BR * self.D * 4 if self.DQ_BY_TMA else 0)
        return {"K_j": 0, "V_j": kv, "stage 0": stage0, "stage 1": stage0 + stage, "dO_i in a stage": rows,
                "lse_i in a stage": 2 * rows, "D_i in a stage": 2 * rows + 4 * self.BR, "dS 0": ds,
                "dS 1": ds + ds_bytes, "dQ_i": dq, "K_j, V_j full": bars, "full 0": bars + BARRIER_BYTES,
                "empty 0": bars + (1 + self.STAGES) * BARRIER_BYTES,
                "end": bars + (1 + 2 * self.STAGES) * BARRIER_BYTES}

    def shape_problems(self) -> list[str]:
        problems = [] if self.D in HEAD_DIMS else [f"D must be one of {HEAD_DIMS}"]
        if self.WARPGROUPS not in (1, 2):
            problems.append("WARPGROUPS must be 1 or 2 (Bc = 64 or 128 keys)")
        elif self.BR not in (WGMMA_M, 2 * WGMMA_M) or self.WARPGROUPS % self.DQ_ROW_GROUPS:
            problems.append("BR must be 64 or 128, with a warpgroup for each 64 rows of dQ_i at least")
        elif self.DQ_N % 16:
            problems.append("each warpgroup's columns of dQ_i must be a multiple of 16")
        if not 2 <= self.STAGES <= 4:
            problems.append("STAGES must be 2, 3 or 4")
        if max(self.BR, self.BC) > MAX_BOX_ROWS:
            problems.append(f"Br and Bc must be at most {MAX_BOX_ROWS} (a TMA box)")
        if self.BR % LSE_LANES:
            problems.append(f"Br must be a multiple of the {LSE_LANES} lanes that store lse_i and D_i")
        registers = WARPGROUP * (self.PRODUCER_REGISTERS + self.WARPGROUPS * self.CONSUMER_REGISTERS)
        if registers > current().registers_per_sm:
            problems.append(f"the warpgroups' registers (setmaxnreg) must fit in {current().registers_per_sm}")
        return problems

    def maps(self, n_q: int, n_k: int, heads: int, kv_heads: int) -> tuple:
        """The tensor maps of Q, K, V, dO, dQ's accumulator (in the order of Q_MAP ..): Q and dO of ``heads``
        query heads of n_q rows, boxes of Br rows; K and V of ``kv_heads`` heads of n_k rows, boxes of Bc rows;
        the accumulator's float32, boxes of Br rows."""
        q, kv = TensorMap(self.D, n_q, heads, self.BR), TensorMap(self.D, n_k, kv_heads, self.BC)
        return q, kv, kv, q, TensorMap(self.D, n_q, heads, self.BR, element_bytes=4)

    def compile_options(self) -> dict:
        """On a GPU: one block of NT threads per multiprocessor (ptxas keeps setmaxnreg only with launch bounds),
        at most CONSUMER_REGISTERS registers a thread at launch (setmaxnreg.inc must not ask for fewer than a
        thread has), a multiple of 8 as setmaxnreg's counts are."""
        cap = min(self.CONSUMER_REGISTERS, current().registers_per_sm // self.NT // 8 * 8)
        return {"launch_bounds": (self.NT, 1), "max_registers": cap}


L2_SHARE_BYTES = u(40 * 1024 * 1024)  # what a group of K/V heads may keep in L2 (H100 and H200 have 50 MB)
HEAD_BYTES_PER_COLUMN = 2 + 2 + 4  # Q, dO (16-bit) and dQ's float32 accumulator, per query row and column
_ONE, _TWO = u(1), u(2)


def longest_first(block, tiles, kv_heads, head_bytes):
    """(K/V head, key tile) of the ``block``-th block (in launch order) of a causal backward over ``tiles`` key
    tiles and ``kv_heads`` K/V heads, the longest work first. ``head_bytes``: the Q, dO and dQ of one K/V
    head's query heads. All unsigned 64-bit (compiled into the kernel: ``v4_warp_specialized``).

    With causal masking key tile j sees the query tiles from j on: tile 0 has the most work, the last the least.
    Key tiles head by head (the launch's own order) start a heavy block wherever a head begins, up to the very
    end of the grid, and the last ones leave most SMs idle while they finish. This order (FlashAttention-3's
    "LPT" scheduler for its causal backward) takes the heads in groups: tile 0 of each head of the group, then
    tile 1 of each, and so on, so that the light tiles come last; a group has as many heads (a power of 2) as
    fit their Q, dO and dQ into L2_SHARE_BYTES, so the blocks running at once still read the same few heads.
    A bijection of 0 .. tiles · kv_heads - 1 onto the pairs (tested on the host)."""
    group = _ONE
    while group < kv_heads and _TWO * group * head_bytes <= L2_SHARE_BYTES:
        group *= _TWO
    first = block // (group * tiles) * group  # the group's first K/V head
    in_group = min(group, kv_heads - first)  # the last group may be smaller
    rest = block - first * tiles
    return first + rest % in_group, rest // in_group


def default_tiling(d: int) -> BackwardTmaTiling:
    """The tiling used on a GPU: two consumer warpgroups (Bc = 128 keys) and the producer (FlashAttention-3's 3
    warpgroups), two stages; query tiles of Br = 128 rows at d = 64 (the fixed work of a tile, its barriers and
    waits, spread over twice the multiplies; FlashAttention-2's and -3's block at d = 64), of 64 at d = 128
    (v3's: Sᵀ's and dPᵀ's accumulators of 128 queries beside dK_j's and dV_j's of 128 columns would pass the
    consumers' 240 registers)."""
    return BackwardTmaTiling(D=d, WARPGROUPS=2, BR=128 if d == 64 else 64).validate()


def simulator_tiling(d: int) -> BackwardTmaTiling:
    """One consumer warpgroup (Bc = 64 keys) and the producer: the smallest with both roles, for the simulator."""
    return BackwardTmaTiling(D=d, WARPGROUPS=1).validate()


def refuse_deterministic(deterministic, who: str) -> None:
    """A ValueError for ``deterministic=True``: the TMA kernels add dQ in any order (atomics or reduce-adds)."""
    if deterministic:
        raise ValueError(f"{who} has no deterministic mode (dQ is added by atomics in any order); got "
                         "deterministic=True: use kernel v2 for a bitwise-reproducible dq")
