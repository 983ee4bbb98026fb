"""The register tiling shared by kernel versions v2 to v5: who computes what, and where tiles live.

A thread block of NT threads computes a BR × BC tile of scores S_ij (Br × Bc in the paper's
notation). Its threads are arranged as RG = BR/TM row groups of CT = NT/RG threads:

    thread tid = (rg, ct) with rg = tid // CT, ct = tid % CT. In a tile it owns
      rows  row0 + i,             i < TM   (row0 = rg · TM; the same rows of S_ij, P_ij and O_i)
      keys  ct + CT · jj,         jj < TN  (TN = BC/CT, strided: neighbouring threads, neighbouring keys)
      cols  (ct + CT · t)·4 + e,  t < TO4, e < 4   (TO4 = DV/(4·CT) groups of 4 output columns)

The head dims are padded with zeros, which change no sum, to D (a multiple of 8) and DV.
:meth:`TileConfig.smem_layout` is the one description of the block's shared memory: every
kernel, the launch and lesson 05 read their offsets and sizes from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...gpu.launch import Tiling
from ...gpu.smem import Region, layout, layout_bytes
from ...hardware import STATIC_SMEM_PER_BLOCK


@dataclass(frozen=True)
class TileConfig(Tiling):
    """Compile-time shape of one thread block: BR query rows and BC keys per tile, NT threads,
    TM rows per thread, head dims padded to D and DV (see the module docstring)."""

    WHAT = "tile configuration"

    BR: int
    BC: int
    TM: int
    NT: int
    D: int
    DV: int

    @property
    def RG(self) -> int:  # row groups
        return self.BR // self.TM

    @property
    def CT(self) -> int:  # threads per row group
        return self.NT // self.RG

    @property
    def TN(self) -> int:  # keys per thread
        return self.BC // self.CT

    @property
    def TO4(self) -> int:  # groups of 4 output columns per thread
        return self.DV // (4 * self.CT)

    # Row strides in shared memory, in float32 elements. Rows are padded by 4 floats: 16-byte
    # aligned for vector loads, and (for D, BR multiples of 8) consecutive rows start in different banks.
    @property
    def QS(self) -> int:  # Qs[row, kk]
        return self.D + 4

    @property
    def KS(self) -> int:  # Ks[key, kk]
        return self.D + 4

    @property
    def PS(self) -> int:  # Ps[key, row] (P_ij transposed)
        return self.BR + 4

    def smem_layout(self) -> tuple[Region, Region, Region, Region]:
        """The block's shared memory, in order: Q_i (loaded once), K_j then P_ij in the same place
        (once S_ij is in registers, K_j is not read again in this tile), V_j, and one partial row
        max (at the end, row sum) per row and thread of the row group."""
        sizes = (("Q_i", self.BR * self.QS), ("K_j, then P_ij", max(self.BC * self.KS, self.BC * self.PS)),
                 ("V_j", self.BC * self.DV), ("row max / row sum exchange", self.BR * self.CT))
        return layout(sizes)

    @property
    def smem_bytes(self) -> int:
        return layout_bytes(self.smem_layout())

    def shape_problems(self) -> list[str]:
        """What makes this tiling's shape invalid (empty if nothing)."""
        problems = []
        if self.BR % self.TM or self.NT % self.RG:
            problems.append("BR must be a multiple of TM and NT a multiple of BR/TM")
        elif self.BC % self.CT or self.BC % 4 or self.DV % (4 * self.CT):
            problems.append("BC must be a multiple of 4 and of CT = NT·TM/BR, DV a multiple of 4·CT")
        if self.D % 8:
            problems.append("D must be a multiple of 8")
        return problems


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def default_config(d: int, d_v: int) -> TileConfig:
    """The tiling used on a GPU for head dims d and dv.

    The fastest of the H200's tile sweep (``python -m tinyflash.bench tiles``, figures/data/tile_sweep_h200.csv):
    64 query rows per block and 128 threads, each thread owning 8 rows; 128 keys per tile for d <= 64, 64 for
    d <= 128 (102 KiB of shared memory, two blocks per SM). Beyond 128 a block owns 4 rows per thread with
    256 threads, one block per SM.
    """
    D, DV = round_up(d, 8), round_up(d_v, 64)
    if max(D, DV) <= 64:
        return TileConfig(BR=64, BC=128, TM=8, NT=128, D=D, DV=DV).validate()
    if max(D, DV) <= 128:
        return TileConfig(BR=64, BC=64, TM=8, NT=128, D=D, DV=DV).validate()
    return TileConfig(BR=64, BC=64, TM=4, NT=256, D=D, DV=DV).validate()


def simulator_config(d: int, d_v: int) -> TileConfig:
    """A tiny tiling for the CUDA simulator, which runs one Python thread per CUDA thread."""
    return TileConfig(BR=8, BC=8, TM=2, NT=16, D=round_up(d, 8), DV=round_up(d_v, 16)).validate()


def small_config(d: int, d_v: int) -> TileConfig:
    """A tiling of at most 48 KiB of shared memory, for when more cannot be had."""
    D, DV = round_up(d, 8), round_up(d_v, 64)
    for BR, BC in ((64, 32), (32, 32), (32, 16), (16, 16), (16, 8)):
        for TM in (8, 4, 2, 1):
            for NT in (128, 64, 32):
                cfg = TileConfig(BR=BR, BC=BC, TM=TM, NT=NT, D=D, DV=DV)
                if not cfg.problems() and cfg.smem_bytes <= STATIC_SMEM_PER_BLOCK:
                    return cfg
    raise ValueError(f"no tiling of at most 48 KiB of shared memory for d={d}, dv={d_v}")
