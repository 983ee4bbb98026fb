"""The tiling of the FP8 kernel (v11) and its pass before the kernel: V transposed into Vᵀ, keys renumbered.

v11 is v10 on e4m3 bytes (``tinyflash.warpgroup_tile.fp8_warpgroup_tile``). Its tiles are v10's with one byte an
element: Q_i (Br rows of d bytes), and per stage K_j (Bc rows of d bytes) and Vᵀ_j (d rows of Bc bytes), each in
128-byte swizzled pieces (at d = 64, Q_i and K_j in 64-byte rows with the 64-byte swizzle), so a stage at d = 128
is 32 KiB where v10's is 64 KiB. Three stages fit at every d: at d = 64 (56 KiB), d = 128 (112 KiB) and d = 256
(224 of the 227 KiB a block may have); v11 takes two at d = 256, v10's choice there.

**The tensor maps move bytes as 16-bit pairs.** ``gpu.tensor_map`` makes maps of 16-bit elements; a row of d e4m3
bytes is d / 2 such elements, and a box of 64 of them is the 128 bytes of a swizzled piece (at d = 64, a box of 32
is the whole 64-byte row). Out of bounds the copy writes 16-bit zeros: two e4m3 zeros.

**Vᵀ.** FP8 wgmma reads its B operand K-major only, and for O += P V the reduction runs over keys: the tensor cores
need V_j transposed, d rows of keys. :func:`transpose_v` writes Vᵀ in one pass on the GPU before the kernel (it reads
and writes N · d bytes per K/V head, a small part of the kernel's time at long sequences); FlashAttention-3
transposes each V_j tile inside the kernel instead (``ldmatrix.trans`` and byte permutes in shared memory), which
saves the pass and its memory. The pass also renumbers the keys of each 32-key step as the P operand's registers
have them (``warpgroup_tile.fp8_key_of_column``), and pads the keys with zeros to a whole tile: Vᵀ has
:func:`padded_keys` columns, whose padding P multiplies by zeros (those keys are masked).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from numba import cuda, int64, uint8, uint64
from numba.cuda import types

from ...gpu.runtime import device_function, u
from ...gpu.tensor_map import MAX_BOX_ROWS, TensorMap
from ...gpu.tma import BARRIER_BYTES
from ...warpgroup_tile import FP8_BC, FP8_HEAD_DIMS, FP8_K, WarpgroupTile, fp8_key_of_column, fp8_row_bytes
from .tma_tiling import TmaTiling

key_of_column = device_function(fp8_key_of_column)  # the renumbering of warpgroup_tile, compiled for the GPU
TRANSPOSE_KEYS = FP8_K  # keys a block of the transpose takes: one 32-key step
TRANSPOSE_THREADS = 128


def padded_keys(n_k: int) -> int:
    """Vᵀ's columns: n_k rounded up to a whole key tile (Bc = 128)."""
    return -(-n_k // FP8_BC) * FP8_BC


@dataclass(frozen=True)
class Fp8Tiling(TmaTiling):
    """v10's tiling on e4m3 bytes (module docstring): WARPGROUPS consumer warpgroups and a producer, BC = 128 keys a
    tile, STAGES stages of (K_j, Vᵀ_j); the running state rescaled at every tile (P_ij <= 2^8 must hold for e4m3)."""

    BC: int = FP8_BC
    PRODUCER: bool = True
    LAZY_RESCALE: bool = False
    WHAT = "FP8 tiling"

    def warpgroup_tile(self, element: str = "e4m3") -> WarpgroupTile:
        return WarpgroupTile("e4m3", self.D, self.BC, self.BR)

    def smem_layout(self) -> dict:
        """Byte offsets from the block's 1024-byte-aligned base: Q_i, STAGES stages of (K_j, Vᵀ_j), the barriers."""
        q, kv = self.BR * self.D, self.BC * self.D  # bytes: one an element
        bars = q + self.STAGES * 2 * kv
        return {"Q_i": 0, "stage 0": q, "stage 1": q + 2 * kv, "V_j in a stage": kv, "Q_i full": bars,
                "full 0": bars + BARRIER_BYTES, "empty 0": bars + (1 + self.STAGES) * BARRIER_BYTES,
                "end": bars + (1 + 2 * self.STAGES) * BARRIER_BYTES}

    def shape_problems(self) -> list[str]:
        problems = [p for p in super().shape_problems() if not p.startswith("D must")]
        if self.D not in FP8_HEAD_DIMS:
            problems.append(f"D must be one of {FP8_HEAD_DIMS} (128-byte pieces of e4m3 rows, or one 64-byte row)")
        if self.BC != FP8_BC:
            problems.append(f"BC must be {FP8_BC} (Vᵀ_j's rows: one 128-byte piece of keys)")
        if not self.PRODUCER or self.LAZY_RESCALE:
            problems.append("v11 needs a producer warpgroup and no lazy rescaling")
        if self.D > MAX_BOX_ROWS:
            problems.append(f"D must be at most {MAX_BOX_ROWS} (a TMA box of Vᵀ's rows)")
        return problems

    def maps(self, n_q: int, n_k: int, heads: int, kv_heads: int) -> tuple:
        """The tensor maps of Q (boxes of Br rows), K (Bc rows) and Vᵀ (d rows of 128 keys), in 16-bit pairs; Q's
        and K's swizzled by rows of fp8_row_bytes(d)."""
        swizzle = fp8_row_bytes(self.D)
        return (TensorMap(self.D // 2, n_q, heads, self.BR, swizzle_bytes=swizzle),
                TensorMap(self.D // 2, n_k, kv_heads, self.BC, swizzle_bytes=swizzle),
                TensorMap(padded_keys(n_k) // 2, self.D, kv_heads, self.D))


@lru_cache(maxsize=None)
def fp8_tiling(d: int, causal: bool = False, n_q: int = 0) -> Fp8Tiling:
    """v11's on a GPU: v10's (a producer, two consumer warpgroups ping-ponging), 128 keys a tile, three stages at
    d = 128 and two at d = 256."""
    return Fp8Tiling(D=d, WARPGROUPS=2, STAGES=3 if d <= 128 else 2).validate()


def simulator_fp8_tiling(d: int) -> Fp8Tiling:
    """A producer and one consumer warpgroup, two stages: the smallest, for numba's simulator."""
    return Fp8Tiling(D=d, WARPGROUPS=1).validate()


# transpose's argument types, for a launch through the driver: V and Vᵀ as bytes, n_k, nkp
TRANSPOSE_SIGNATURE = (types.Array(types.uint8, 1, "C"), types.Array(types.uint8, 1, "C"), types.int64, types.int64)


@lru_cache(maxsize=None)
def transpose_v(d: int):
    """The pass before v11: ``transpose(V, VT, n_k, nkp)`` writes, for each K/V head (``blockIdx.y``), VT (d × nkp
    bytes) from V (n_k × d bytes): VT[n, 32b + c] = V[32b + key_of_column(c), n], zero past n_k. One block per 32
    keys (``blockIdx.x``): their rows read whole (consecutive threads, consecutive bytes), kept in shared memory,
    and written as d rows of 32 bytes."""
    TILE = TRANSPOSE_KEYS * d
    KEYS, THREADS, D = u(TRANSPOSE_KEYS), u(TRANSPOSE_THREADS), u(d)

    @cuda.jit
    def transpose(V, VT, n_k, nkp):
        tile = cuda.shared.array(TILE, uint8)  # 32 keys × d bytes, as V has them
        head, k0, tid = uint64(cuda.blockIdx.y), uint64(cuda.blockIdx.x) * KEYS, uint64(cuda.threadIdx.x)
        n_k, nkp = uint64(n_k), uint64(nkp)
        for i in range(tid, KEYS * D, THREADS):  # byte i of the 32 rows: key i // d, dim i % d
            key = k0 + i // D
            tile[i] = V[(head * n_k + key) * D + i % D] if key < n_k else uint8(0)
        cuda.syncthreads()  # every row of the tile has landed before any column is read
        for i in range(tid, KEYS * D, THREADS):  # byte i of the output: dim i // 32, column i % 32
            n, c = i // KEYS, i % KEYS
            VT[(head * D + n) * nkp + k0 + c] = tile[uint64(key_of_column(int64(c))) * D + n]  # signed: no float

    return transpose
