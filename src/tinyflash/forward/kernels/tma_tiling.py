"""The tiling and the host side of the TMA kernels (v8 on): stages, mbarriers, tensor maps, the producer.

A block's consumer warpgroups (WARPGROUPS of them, Br = 64 · WARPGROUPS query rows) compute as in v7; the
tiles come by TMA (``tinyflash.gpu.tma``) into a ring of STAGES stages of (K_j, V_j), each completed on its own
"full" mbarrier. With PRODUCER, one more warpgroup, the first, issues the copies and nothing else, and each
stage has an "empty" mbarrier on which the consumers say they are done with it (warp specialisation).
:meth:`TmaTiling.smem_layout` is where everything lives; :meth:`TmaTiling.maps` the tensor maps of a problem.

The kernels take O, LSE and the tensor maps of Q, K and V (``gpu/tensor_map.py``; :meth:`TmaTiling.maps` says
their boxes), not Q, K, V: the host layer makes them (``tinyflash.host``: through the driver a
:class:`~tinyflash.gpu.tensor_map.MapCache` keeps them by the arrays' addresses; through numba they are encoded for
each launch).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from ...gpu.runtime import u
from ...gpu.tensor_map import MAX_BOX_ROWS, TensorMap
from ...gpu.tma import BARRIER_BYTES
from ...gpu.wgmma import WARPGROUP
from ...warp_tile import MMA_K
from ...warpgroup_tile import tile_problems
from .hopper_tiling import GPU_BC, HopperTiling

Q_MAP, K_MAP, V_MAP = 0, 1, 2  # the maps' order in the kernels' TMAPS array
REGISTERS = 65536  # per multiprocessor (and per block at most): what setmaxnreg shares out


@dataclass(frozen=True)
class TmaTiling(HopperTiling):
    """v7's tiling (WARPGROUPS consumer warpgroups, BC keys a tile, head dim D), loaded by TMA into STAGES stages;
    with PRODUCER, one more warpgroup that loads, its registers per thread set to PRODUCER_REGISTERS and the
    consumers' to CONSUMER_REGISTERS (setmaxnreg)."""

    STAGES: int = 2
    PRODUCER: bool = False
    PRODUCER_REGISTERS: int = 24
    CONSUMER_REGISTERS: int = 240
    WHAT = "TMA tiling"

    @property
    def NT(self) -> int:  # threads per block: the consumers, and the producer's warpgroup
        return WARPGROUP * (self.WARPGROUPS + int(self.PRODUCER))

    def smem_layout(self) -> dict:
        """Byte offsets from the block's 1024-byte-aligned base: Q_i, STAGES stages of (K_j, V_j), then the
        mbarriers: Q_i's, one "full" per stage, one "empty" per stage."""
        q, kv = self.BR * self.D * 2, self.BC * self.D * 2
        bars = q + self.STAGES * 2 * kv
        return {"Q_i": 0, "stage 0": q, "stage 1": q + 2 * kv, "V_j in a stage": kv, "Q_i full": bars,
                "full 0": bars + BARRIER_BYTES, "empty 0": bars + (1 + self.STAGES) * BARRIER_BYTES,
                "end": bars + (1 + 2 * self.STAGES) * BARRIER_BYTES}

    def shape_problems(self) -> list[str]:
        problems = tile_problems(self.D, self.BC)
        if self.WARPGROUPS not in (1, 2, 3):
            problems.append("WARPGROUPS must be 1, 2 or 3")
        if not 2 <= self.STAGES <= 4:
            problems.append("STAGES must be 2, 3 or 4")
        if self.BR > MAX_BOX_ROWS:
            problems.append(f"Br = 64 · WARPGROUPS must be at most {MAX_BOX_ROWS} (a TMA box)")
        if self.HEAD_GROUP != 1:
            problems.append("HEAD_GROUP must be 1 (the wgmma kernels take one head at a time)")
        registers = WARPGROUP * (self.PRODUCER_REGISTERS + self.WARPGROUPS * self.CONSUMER_REGISTERS)
        if self.PRODUCER and registers > REGISTERS:
            problems.append(f"the warpgroups' registers (setmaxnreg) must fit in {REGISTERS}")
        return problems

    def maps(self, n_q: int, n_k: int, heads: int, kv_heads: int) -> tuple:
        """The tensor maps of Q (boxes of Br rows), K and V (boxes of Bc rows) of ``heads`` query heads of n_q
        rows and ``kv_heads`` K/V heads of n_k rows."""
        return (TensorMap(self.D, n_q, heads, self.BR), TensorMap(self.D, n_k, kv_heads, self.BC),
                TensorMap(self.D, n_k, kv_heads, self.BC))

    def for_block_mask(self, block_q: int, block_k: int) -> "TmaTiling | None":
        """This tiling for a block mask of block_q × block_k tiles (``tinyflash.flex_attention``): a block must lie
        in one of the mask's query tiles (Br divides block_q) and walk its key tiles in whole tiles of its own (Bc
        divides block_k). Where Br does not divide block_q, fewer consumer warpgroups (64 rows each); where Bc
        does not divide block_k, the largest key tile that does, a multiple of 16 up to Bc (at d = 256, 64 keys
        for FlexAttention's 128). None if nothing fits."""
        cfg = self
        if block_k % cfg.BC:
            fits = [bc for bc in range(min(cfg.BC, block_k) // MMA_K * MMA_K, 0, -MMA_K) if block_k % bc == 0]
            if not fits:
                return None
            cfg = replace(cfg, BC=fits[0])
        while block_q % cfg.BR and cfg.WARPGROUPS > 1:
            cfg = replace(cfg, WARPGROUPS=cfg.WARPGROUPS - 1)
        return cfg.validate() if not block_q % cfg.BR and not cfg.problems() else None

    def compile_options(self) -> dict:
        """The warp-specialised kernels' options on a GPU: one block of NT threads per multiprocessor (ptxas keeps
        setmaxnreg only with launch bounds), and at most CONSUMER_REGISTERS registers a thread at launch
        (setmaxnreg.inc must not ask for fewer than a thread has). none for the others."""
        if not self.PRODUCER:
            return {}
        cap = min(self.CONSUMER_REGISTERS, REGISTERS // self.NT // 8 * 8)  # a multiple of 8, as setmaxnreg's
        return {"launch_bounds": (self.NT, 1), "max_registers": cap}


class Offsets(NamedTuple):
    """The block's shared memory (:meth:`TmaTiling.smem_layout`) as unsigned byte offsets from its aligned base, as
    the warp-specialised kernels' producer and consumers address it (v9, v10)."""

    Q_OFF: np.uint64  # Q_i
    STAGE0: np.uint64  # stage 0 (its K_j)
    V_IN_STAGE: np.uint64  # V_j, from the start of its stage
    Q_FULL: np.uint64  # Q_i's barrier
    FULL0: np.uint64  # stage 0's "full" barrier
    EMPTY0: np.uint64  # stage 0's "empty" barrier
    STAGE: np.uint64  # from one stage to the next
    BAR: np.uint64  # from one stage's barrier to the next stage's


def offsets(cfg: TmaTiling) -> Offsets:
    """:class:`Offsets` for ``cfg``."""
    layout = {name: u(offset) for name, offset in cfg.smem_layout().items()}  # bytes
    return Offsets(*(layout[n] for n in ("Q_i", "stage 0", "V_j in a stage", "Q_i full", "full 0", "empty 0")),
                   STAGE=layout["stage 1"] - layout["stage 0"], BAR=u(BARRIER_BYTES))


@lru_cache(maxsize=None)
def default_tiling(d: int, causal: bool = False, n_q: int = 0) -> TmaTiling:
    """v8's tiling on a GPU: v7's (two warpgroups, GPU_BC[d] keys a tile), two stages."""
    return TmaTiling(D=d, WARPGROUPS=2, BC=GPU_BC.get(d, 128)).validate()


@lru_cache(maxsize=None)
def default_specialised_tiling(d: int, causal: bool = False, n_q: int = 0) -> TmaTiling:
    """v9's on a GPU: two consumer warpgroups and a producer (FlashAttention-3's 3 warpgroups), GPU_BC[d] keys a
    tile, two stages."""
    return TmaTiling(D=d, WARPGROUPS=2, BC=GPU_BC.get(d, 128), PRODUCER=True).validate()


@lru_cache(maxsize=None)
def ping_pong_tiling(d: int, causal: bool = False, n_q: int = 0) -> TmaTiling:
    """v10's on a GPU: v9's with three stages. v10 releases tile j's stage when the P·V that reads its V_j is
    waited for, in the middle of tile j + 1's step (v9: at the end of tile j's), so with two stages the copy of
    tile j + 2 would start about half a step before it is needed; with three, a step and a half. Three stages
    fit in shared memory at d = 128 (225 KiB); at d = 256 two (v9's, FlashAttention-3's there: three stages of
    80 keys would need 304 KiB)."""
    return TmaTiling(D=d, WARPGROUPS=2, BC=GPU_BC.get(d, 128), PRODUCER=True,
                     STAGES=3 if d <= 128 else 2).validate()


def simulator_tiling(d: int) -> TmaTiling:
    """One warpgroup, 16 keys per tile, two stages: the smallest, for numba's simulator."""
    return TmaTiling(D=d, WARPGROUPS=1, BC=16).validate()


def simulator_specialised_tiling(d: int) -> TmaTiling:
    """A producer and two consumers (the smallest that has both roles and two consumers), 16-key tiles."""
    return TmaTiling(D=d, WARPGROUPS=2, BC=16, PRODUCER=True).validate()
