"""The tiling of the wgmma kernels (v7 on): who computes what and where tiles live in shared memory.

A block of WARPGROUPS warpgroups owns Br = 64 · WARPGROUPS query rows, warpgroup w the rows
64w .. 64w + 63; it walks the keys in tiles K_j, V_j of Bc = BC keys. Shared memory holds Q_i, then two
stages of (K_j, V_j), each a 128-byte-swizzled tile (``tinyflash.gpu.wgmma``) starting 1024-byte aligned:
:meth:`HopperTiling.smem_layout` is its one description. What a warpgroup does with them is
``tinyflash.warpgroup_tile``; how a tiling is launched is the host layer's (``tinyflash.host.launch``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ...gpu.launch import Tiling
from ...gpu.runtime import require_exact_compute_capability
from ...gpu.wgmma import SWIZZLE_ATOM_BYTES, WARPGROUP
from ...warp_tile import WarpTile
from ...warpgroup_tile import WGMMA_M, WarpgroupTile, tile_problems

COMPUTE_CAPABILITY = (9, 0)  # wgmma, sm_90a: Hopper only (its 'a' features do not carry to later GPUs)
# Bc on a GPU by head dim: 128 keys at d = 64 and 128; at d = 256, 80 (FlashAttention-3's 128 × 80 there), the
# most that fits: Q_i (64 KiB) and two stages of K_j, V_j (40 KiB each) are 224 of the 227 KiB a block may have
GPU_BC = {64: 128, 128: 128, 256: 80}


def require_hopper(who: str) -> None:
    """A clear error before a wgmma kernel is compiled for a GPU that is not Hopper (always fine on the simulator)."""
    require_exact_compute_capability(
        COMPUTE_CAPABILITY, who, "wgmma (warpgroup matrix multiply) exists on Hopper (H100, H200, GH200) only, "
        "through the sm_90a target", "tinyflash.tensor_core_attention (mma.sync) runs on compute capability 8.0 on")


@dataclass(frozen=True)
class HopperTiling(Tiling):
    """WARPGROUPS warpgroups of 64 query rows per block, key tiles of BC keys, head dim D (= dv); the running
    state rescaled lazily (LAZY_RESCALE) or at every tile. HEAD_GROUP = 1: blocks take one head at a time."""

    D: int
    WARPGROUPS: int
    BC: int
    LAZY_RESCALE: bool = True
    HEAD_GROUP: int = 1  # the blocks' order: one head after another (head_group)
    WHAT = "wgmma tiling"

    @property
    def BR(self) -> int:  # query rows per block
        return WGMMA_M * self.WARPGROUPS

    @property
    def NT(self) -> int:  # threads per block
        return WARPGROUP * self.WARPGROUPS

    @property
    def CHUNKS(self) -> int:  # 16-byte chunks per row (one cp.async each)
        return self.D // 8

    def head_group(self, n_k: int, n_heads: int, kv_group: int, causal: bool) -> int:
        """The heads the blocks take together: one (the wgmma kernels' blocks go one head after another)."""
        return self.HEAD_GROUP

    def warp_tile(self, element: str) -> WarpTile:
        """A warp's part (its 16 rows): the mask, softmax step and epilogue of ``tinyflash.warp_tile``."""
        return WarpTile(element, self.D, self.BC, 1, False, self.LAZY_RESCALE)

    def warpgroup_tile(self, element: str) -> WarpgroupTile:
        return WarpgroupTile(element, self.D, self.BC, self.BR)

    def smem_layout(self) -> dict:
        """Byte offsets from the block's 1024-byte-aligned base: Q_i, then two stages of (K_j, V_j)."""
        q, kv = self.BR * self.D * 2, self.BC * self.D * 2
        return {"Q_i": 0, "stage 0": q, "stage 1": q + 2 * kv, "V_j in a stage": kv, "end": q + 4 * kv}

    @property
    def smem_bytes(self) -> int:  # the layout, and room to align its base to 1024 bytes
        return self.smem_layout()["end"] + SWIZZLE_ATOM_BYTES

    def shape_problems(self) -> list[str]:
        problems = tile_problems(self.D, self.BC)
        if self.WARPGROUPS not in (1, 2, 3):
            problems.append("WARPGROUPS must be 1, 2 or 3")
        elif (self.BC * self.CHUNKS) % self.NT or (self.BR * self.CHUNKS) % self.NT:
            problems.append("each tile's 16-byte chunks must be a multiple of the threads (BC · D / 8 and Br · D / 8)")
        if self.HEAD_GROUP != 1:
            problems.append("HEAD_GROUP must be 1 (the wgmma kernels take one head at a time)")
        return problems


@lru_cache(maxsize=None)
def default_tiling(d: int, causal: bool = False, n_q: int = 0) -> HopperTiling:
    """The tiling used on a GPU: two warpgroups (Br = 128) and GPU_BC[d] keys a tile (128 as FlashAttention-3 has
    at d = 128 causal; 80 at d = 256); rescaled lazily. (causal and n_q are taken for the same call as v6's
    default_tiling.)"""
    return HopperTiling(D=d, WARPGROUPS=2, BC=GPU_BC.get(d, 128)).validate()


def simulator_tiling(d: int) -> HopperTiling:
    """One warpgroup and 16 keys per tile: the smallest tiling, for numba's CUDA simulator."""
    return HopperTiling(D=d, WARPGROUPS=1, BC=16).validate()
