"""The register tiling of the backward kernel: who computes what, and where tiles live.

One thread block of NT threads owns one key/value tile K_j, V_j (BC keys) of one head, and loops
over query tiles Q_i (BR rows). Its threads are arranged two ways, one per kind of product:

* over a BR × BC tile (S_ij, dP_ij; and dQ_i's BR × D): RG = BR/TM row groups of CT = NT/RG
  threads; thread (rg, ct) owns rows row0 + i (row0 = rg·TM, i < TM) and keys ct + CT·jj
  (jj < TN = BC/CT), or dQ_i's column groups (ct + CT·t)·4 + e (t < TQ4 = D/(4·CT), e < 4);
* over the BC keys of dK_j and dV_j: KG = BC/TK key groups of CC = NT/KG threads; thread
  (kg, cc) owns keys k0 + r (k0 = kg·TK, r < TK) and column groups (cc + CC·t)·4 + e of dK_j
  (t < TD4 = D/(4·CC)) and of dV_j (t < TV4 = DV/(4·CC)). These stay in its registers for the
  whole loop: the block writes dK_j and dV_j once, at the end.

The head dims are padded with zeros (which change no sum) to D and DV.
:meth:`BackwardTileConfig.smem_layout` is the one description of the block's shared memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...gpu.launch import Tiling
from ...gpu.smem import Region, layout, layout_bytes


@dataclass(frozen=True)
class BackwardTileConfig(Tiling):
    """Compile-time shape of one thread block of the backward (see the module docstring)."""

    WHAT = "backward tile configuration"

    BR: int  # query rows per tile (Br)
    BC: int  # keys per tile (Bc)
    NT: int  # threads
    TM: int  # rows per thread in S_ij, dP_ij, dQ_i
    TK: int  # keys per thread in dK_j, dV_j
    D: int  # head dim of q, k, padded
    DV: int  # head dim of v, padded

    RG = property(lambda self: self.BR // self.TM)  # row groups
    CT = property(lambda self: self.NT // self.RG)  # threads per row group
    TN = property(lambda self: self.BC // self.CT)  # keys per thread in S_ij
    TQ4 = property(lambda self: self.D // (4 * self.CT))  # column groups of dQ_i per thread
    KG = property(lambda self: self.BC // self.TK)  # key groups
    CC = property(lambda self: self.NT // self.KG)  # threads per key group
    TD4 = property(lambda self: self.D // (4 * self.CC))  # column groups of dK_j per thread
    TV4 = property(lambda self: self.DV // (4 * self.CC))  # column groups of dV_j per thread
    # Row strides in shared memory (floats), padded by 4: 16-byte aligned rows, starting in different banks.
    QS = property(lambda self: self.D + 4)  # Q_i[row, c] and K_j[key, c]
    OS = property(lambda self: self.DV + 4)  # dO_i[row, c] and V_j[key, c]
    PS = property(lambda self: self.BC + 4)  # P_ij[row, key] and dS_ij[row, key]

    def smem_layout(self) -> tuple[Region, ...]:
        """The block's shared memory, in order: the tiles of the current Q_i, then K_j, V_j (loaded once)."""
        sizes = (("Q_i", self.BR * self.QS), ("dO_i", self.BR * self.OS), ("K_j", self.BC * self.QS),
                 ("V_j", self.BC * self.OS), ("P_ij", self.BR * self.PS), ("dS_ij", self.BR * self.PS),
                 ("lse_i (base 2)", self.BR), ("D_i", self.BR))
        return layout(sizes)

    @property
    def smem_bytes(self) -> int:
        return layout_bytes(self.smem_layout())

    def shape_problems(self) -> list[str]:
        """What makes this tiling's shape invalid (empty if nothing)."""
        if self.BR % self.TM or self.NT % self.RG or self.BC % self.CT:
            return ["BR must be a multiple of TM, NT of BR/TM, BC of CT = NT·TM/BR"]
        if self.BC % self.TK or self.NT % self.KG:
            return ["BC must be a multiple of TK, NT of BC/TK"]
        if self.D % (4 * self.CT) or self.D % (4 * self.CC) or self.DV % (4 * self.CC):
            return ["D must be a multiple of 4·CT and 4·CC, DV of 4·CC"]
        return []

    def padded(self, d: int, d_v: int) -> BackwardTileConfig:
        """This tiling with D and DV the smallest valid padding of d and dv."""
        step_d = math.lcm(4 * self.CT, 4 * self.CC)
        return BackwardTileConfig(self.BR, self.BC, self.NT, self.TM, self.TK, -(-d // step_d) * step_d,
                                  -(-d_v // (4 * self.CC)) * (4 * self.CC)).validate()


def default_config(d: int, d_v: int) -> BackwardTileConfig:
    """The tiling used on a GPU: 64 × 64 tiles and 8 keys of dK_j, dV_j per thread; up to head dim
    64, 128 threads with 8 rows of S_ij each (8 × 4 scores); up to 128, 256 threads with 4 rows each
    (4 × 4 scores: a warp then spans two row groups, which reads fewer bytes of shared memory per
    multiply-add than 8 × 2); beyond, up to 256, 32 × 32 tiles. Chosen by counting shared-memory
    reads and registers (``benchmarks/ptxas_report.py`` reports the registers), not by a measured sweep."""
    if max(d, d_v) <= 64:
        return BackwardTileConfig(BR=64, BC=64, NT=128, TM=8, TK=8, D=0, DV=0).padded(d, d_v)
    if max(d, d_v) <= 128:
        return BackwardTileConfig(BR=64, BC=64, NT=256, TM=4, TK=8, D=0, DV=0).padded(d, d_v)
    return BackwardTileConfig(BR=32, BC=32, NT=256, TM=4, TK=4, D=0, DV=0).padded(d, d_v)


def simulator_config(d: int, d_v: int) -> BackwardTileConfig:
    """A tiny tiling for the CUDA simulator, which runs one Python thread per CUDA thread."""
    return BackwardTileConfig(BR=8, BC=8, NT=16, TM=2, TK=2, D=0, DV=0).padded(d, d_v)
