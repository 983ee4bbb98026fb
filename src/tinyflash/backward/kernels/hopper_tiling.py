"""The tiling of the wgmma backward kernel (v3): who computes what, where tiles live in shared memory.

A block of WARPGROUPS warpgroups owns one key tile K_j, V_j of Bc = 64 · WARPGROUPS keys of one K/V head:
warpgroup w the keys 64w .. 64w + 63, the M rows of its wgmma's (keys as rows, as in v2, so that Pᵀ and dSᵀ
stay in registers for dV_j and dK_j). The grid runs over (key tiles, K/V heads), and each block walks the
query tiles Q_i of Br = 64 rows (wgmma's M, which dQ_i = dS K_j takes as its rows) that see its keys, for
every query head of its group.

Shared memory, every tile 128-byte swizzled (``tinyflash.gpu.wgmma``) and 1024-byte aligned: K_j and V_j
(copied once; Bc rows), two stages of (Q_i, dO_i: Br rows each; lse_i and D_i: Br floats each) so that the
next query tile is in flight while one is computed, and dSᵀ (Bc rows of Br = 64 queries: one 128-byte
swizzled row a key). :meth:`BackwardHopperTiling.smem_layout` is its one description.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...gpu.launch import Tiling
from ...gpu.runtime import require_exact_compute_capability
from ...gpu.wgmma import SWIZZLE_ATOM_BYTES, WARPGROUP
from ...warpgroup_tile import BACKWARD_HEAD_DIMS as HEAD_DIMS, WGMMA_M

COMPUTE_CAPABILITY = (9, 0)  # wgmma, sm_90a: Hopper only
BR = WGMMA_M  # query rows per tile: dQ_i = dS K_j has them as its M


def require_hopper(who: str) -> None:
    """A clear error before a wgmma kernel is compiled for a GPU that is not Hopper (always fine on the simulator)."""
    require_exact_compute_capability(
        COMPUTE_CAPABILITY, who, "wgmma (warpgroup matrix multiply) exists on Hopper (H100, H200, GH200) only, "
        "through the sm_90a target", "backward kernel v2 (mma.sync) runs on compute capability 8.0 on")


def aligned(n: int) -> int:
    """n bytes rounded up to the swizzle's period (every tile starts at a multiple of it)."""
    return -(-n // SWIZZLE_ATOM_BYTES) * SWIZZLE_ATOM_BYTES


@dataclass(frozen=True)
class BackwardHopperTiling(Tiling):
    """WARPGROUPS warpgroups of 64 keys each (the key tile, Bc), query tiles of Br = 64 rows, head dim D (= dv)."""

    D: int
    WARPGROUPS: int
    WHAT = "wgmma backward tiling"

    @property
    def BC(self) -> int:  # keys per block
        return WGMMA_M * self.WARPGROUPS

    @property
    def BR(self) -> int:  # query rows per tile
        return BR

    @property
    def NT(self) -> int:  # threads per block
        return WARPGROUP * self.WARPGROUPS

    @property
    def CHUNKS(self) -> int:  # 16-byte chunks per row of Q, K, V, dO (one cp.async each)
        return self.D // 8

    @property
    def DQ_N(self) -> int:  # dQ_i's columns per warpgroup: the warpgroups split them
        return self.D // self.WARPGROUPS

    def smem_layout(self) -> dict:
        """Byte offsets from the block's 1024-byte-aligned base: K_j, V_j, two stages of (Q_i, dO_i, lse_i,
        D_i), dSᵀ."""
        kv, rows = self.BC * self.D * 2, self.BR * self.D * 2
        stage = aligned(2 * rows + 2 * 4 * self.BR)
        stage0 = 2 * kv
        ds = stage0 + 2 * stage
        return {"K_j": 0, "V_j": kv, "stage 0": stage0, "stage 1": stage0 + stage, "dO_i in a stage": rows,
                "lse_i in a stage": 2 * rows, "D_i in a stage": 2 * rows + 4 * self.BR, "dS": ds,
                "end": ds + self.BC * self.BR * 2}

    @property
    def smem_bytes(self) -> int:  # the layout, and room to align its base to 1024 bytes
        return self.smem_layout()["end"] + SWIZZLE_ATOM_BYTES

    def shape_problems(self) -> list[str]:
        problems = [] if self.D in HEAD_DIMS else [f"D must be one of {HEAD_DIMS}"]
        if self.WARPGROUPS not in (1, 2):
            problems.append("WARPGROUPS must be 1 or 2 (Bc = 64 or 128 keys)")
        elif (self.BR * self.CHUNKS) % self.NT:
            problems.append("each query tile's 16-byte chunks must be a multiple of the threads")
        elif self.DQ_N % 16:
            problems.append("each warpgroup's columns of dQ_i must be a multiple of 16")
        return problems


def default_tiling(d: int) -> BackwardHopperTiling:
    """The tiling used on a GPU: two warpgroups (Bc = 128 keys), query tiles of 64 rows, each warpgroup half of
    dQ_i's columns: FlashAttention-3's block shape at d = 128."""
    return BackwardHopperTiling(D=d, WARPGROUPS=2).validate()


def simulator_tiling(d: int) -> BackwardHopperTiling:
    """One warpgroup (Bc = 64 keys): the smallest tiling, for numba's CUDA simulator."""
    return BackwardHopperTiling(D=d, WARPGROUPS=1).validate()
