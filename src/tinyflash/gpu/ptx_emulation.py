"""The warp-level PTX instructions of ``ptx.py``, emulated in Python for numba's CUDA simulator.

numba's simulator runs one Python thread per CUDA thread and knows none of these instructions
(nor ``shfl_xor_sync``). A warp-level instruction combines values held by 32 lanes, so each
emulation is *warp-synchronous*: every lane deposits its part of the operands in a scratch area
shared by its warp, all lanes wait at a barrier, each lane reads back its part of the result,
and all wait once more before the scratch area can be reused. (The simulator's barrier is the
block's: the kernels call these instructions with every thread of the block, as the GPU needs.)

The fragment layouts are written here once, as functions from a lane to the (row, column)
elements it holds; the emulations use them, the tests check them against NumPy, and lesson 07
draws them. ``g = lane // 4`` (the lane's group) and ``t = lane % 4`` (its place in the group)
are the PTX ISA's names.

A 32-bit register holding two 16-bit values keeps the first in its low half: ``pack_halves``
and ``unpack_halves`` convert between such words and NumPy values, for float16 and bfloat16
(NumPy has no bfloat16: its bits are the top 16 bits of a float32, rounded to nearest even).
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager

import numpy as np

# ---------------------------------------------------------------------------------- layouts


def a_fragment(lane: int) -> list[tuple[int, int]]:
    """A (16 × 16, row-major) of mma.m16n8k16: the 8 elements of ``lane``, in register order
    a0.lo, a0.hi, a1.lo, a1.hi, a2.lo, a2.hi, a3.lo, a3.hi."""
    g, t = lane // 4, lane % 4
    return [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1),
            (g, 2 * t + 8), (g, 2 * t + 9), (g + 8, 2 * t + 8), (g + 8, 2 * t + 9)]


def b_fragment(lane: int) -> list[tuple[int, int]]:
    """B (16 × 8, column-major) of mma.m16n8k16: the 4 elements of ``lane``: b0.lo, b0.hi, b1.lo, b1.hi."""
    g, t = lane // 4, lane % 4
    return [(2 * t, g), (2 * t + 1, g), (2 * t + 8, g), (2 * t + 9, g)]


def c_fragment(lane: int) -> list[tuple[int, int]]:
    """C and D (16 × 8, float32) of mma.m16n8k16: the 4 elements of ``lane``: c0, c1, c2, c3."""
    g, t = lane // 4, lane % 4
    return [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]


def ldmatrix_fragment(lane: int, trans: bool) -> list[tuple[int, int]]:
    """ldmatrix .m8n8 .b16: the 2 elements of one 8 × 8 matrix that ``lane`` receives (low half,
    high half); with .trans, those of the transposed matrix."""
    g, t = lane // 4, lane % 4
    return [(2 * t, g), (2 * t + 1, g)] if trans else [(g, 2 * t), (g, 2 * t + 1)]


def draw(layout, rows: int, cols: int, lanes=range(32)) -> str:
    """A text picture of a fragment layout: each element of the rows × cols matrix shows the lane
    that holds it, and which of its elements it is (``L5.2``: lane 5, its element 2)."""
    cells = [["" for _ in range(cols)] for _ in range(rows)]
    for lane in lanes:
        for i, (r, c) in enumerate(layout(lane)):
            cells[r][c] = f"L{lane}.{i}"
    width = max(len(x) for row in cells for x in row) + 1
    return "\n".join("".join(x.rjust(width) for x in row) for row in cells)


# ---------------------------------------------------------------------------------- 16-bit words

ELEMENT_TYPES = ("float16", "bfloat16")


def to_bits(x, element: str) -> np.ndarray:
    """The 16-bit patterns (uint16) of ``x`` rounded to ``element`` (float16 or bfloat16)."""
    if element == "float16":
        return np.asarray(x, dtype=np.float16).view(np.uint16)
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)  # round to nearest, ties to even
    return (rounded >> 16).astype(np.uint16)


def from_bits(bits, element: str) -> np.ndarray:
    """The float32 values of 16-bit patterns of ``element`` (float16 or bfloat16)."""
    bits = np.asarray(bits, dtype=np.uint16)
    if element == "float16":
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def pack_halves(lo, hi, element: str = "float16") -> np.uint32:
    """One 32-bit word: ``lo`` rounded to ``element`` in the low half, ``hi`` in the high half."""
    return np.uint32(int(to_bits(lo, element)) | (int(to_bits(hi, element)) << 16))


def unpack_halves(word, element: str = "float16") -> tuple[float, float]:
    """(low half, high half) of a 32-bit word as floats."""
    word = int(word)
    return float(from_bits(word & 0xFFFF, element)), float(from_bits(word >> 16, element))


# ---------------------------------------------------------------------------------- warp scratch


def _exchange(value):
    """Every lane of the warp deposits ``value``; returns the 32 values, lane by lane, and this lane.

    One barrier per call: the scratch has two slots, used by turns. A lane writes a slot again
    two calls later, after the barrier of the call in between, which every lane reaches only
    once it has read this call's values.
    """
    thread = threading.current_thread()
    warps = thread._manager.__dict__.setdefault("_tinyflash_warps", {})  # one BlockManager per running block
    tid = thread.thread_id
    lane, warp = tid % 32, warps.setdefault((tuple(thread.blockIdx), tid // 32), [[None] * 32, [None] * 32])
    turn = thread.__dict__.get("_tinyflash_turn", 0)
    thread._tinyflash_turn = 1 - turn
    warp[turn][lane] = value
    if _warp_barriers:  # the warp's own barrier: its lanes, not the block's threads
        key = (tuple(thread.blockIdx), tid // 32, "barrier")
        (warps.get(key) or warps.setdefault(key, threading.Barrier(32))).wait(WARP_BARRIER_SECONDS)
    else:
        thread.syncthreads()  # every lane has deposited
    return list(warp[turn]), lane


_warp_barriers = False
WARP_BARRIER_SECONDS = 300.0  # a warp whose lanes do not all arrive: BrokenBarrierError instead of a hang


@contextmanager
def warp_barriers():
    """Inside, a warp's exchange waits for its own 32 lanes only, not for the block. For the warp-specialised
    kernels, whose warpgroups never meet at a block barrier between their instructions (a producer issues copies
    while consumers multiply): there a block-wide barrier would wait for threads that never come. The two-slot
    argument of :func:`_exchange` holds the same with a warp's barrier."""
    global _warp_barriers
    before, _warp_barriers = _warp_barriers, True
    try:
        yield
    finally:
        _warp_barriers = before


@contextmanager
def fast_barriers():
    """Run the simulator's barriers faster: its block manager polls the threads, and Python hands the interpreter
    from thread to thread every 5 ms by default; 0.5 ms while inside, so a waiting thread gives way ten times
    sooner."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, 5e-4))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


# ---------------------------------------------------------------------------------- instructions


def _index(layout):
    """(rows, cols), each (32, elements): where each lane's elements sit in the matrix."""
    cells = np.array([layout(lane) for lane in range(32)])  # (32, elements, 2)
    return cells[..., 0], cells[..., 1]


def make_mma(element: str):
    """Emulated ``mma.sync.aligned.m16n8k16.row.col.f32.<element>.<element>.f32``."""
    A_AT, B_AT, C_AT = _index(a_fragment), _index(b_fragment), _index(c_fragment)

    def mma_m16n8k16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        lanes, lane = _exchange((a0, a1, a2, a3, b0, b1))
        words = np.array(lanes, dtype=np.uint32)  # (32 lanes, 6 registers)
        halves = from_bits(np.stack([words & 0xFFFF, words >> 16], axis=-1).reshape(32, 12), element)
        A, B = np.zeros((16, 16)), np.zeros((16, 8))  # float64: the products are exact
        A[A_AT] = halves[:, :8]
        B[B_AT] = halves[:, 8:]
        D = A @ B  # (16, 8)
        rows, cols = C_AT[0][lane], C_AT[1][lane]
        return tuple(np.float32(c + D[r, col]) for c, r, col in zip((c0, c1, c2, c3), rows, cols))

    return mma_m16n8k16


def make_pack(element: str):
    """Emulated ``cvt.rn.<element>x2.f32``: two floats rounded into one word, ``lo`` in the low half."""

    def pack(lo, hi):
        return pack_halves(lo, hi, element)

    return pack


def make_unpack(element: str):
    """Emulated unpack (``mov.b32`` and ``cvt.f32.f16``, or shifts for bfloat16): a word's halves as floats."""

    def unpack(word):
        lo, hi = unpack_halves(word, element)
        return np.float32(lo), np.float32(hi)

    return unpack


def shared_address(smem, index):
    """The byte address of ``smem[index]`` (a uint32 array): here its offset, remembered with the array."""
    threading.current_thread()._tinyflash_smem = smem
    return np.uint32(int(index) * 4)


def _ldmatrix_x4(address, trans: bool):
    """Lanes 8i .. 8i+7 give the row addresses of matrix i; every lane gets one word of each."""
    smem = threading.current_thread()._tinyflash_smem
    rows, lane = _exchange(int(address) // 4)  # word index of each lane's row
    words = []
    for matrix in range(4):
        halves = []
        for r, c in ldmatrix_fragment(lane, trans):  # element (r, c) of this 8 × 8 matrix
            word = int(smem[rows[8 * matrix + r] + c // 2])
            halves.append((word >> (16 * (c % 2))) & 0xFFFF)
        words.append(np.uint32(halves[0] | (halves[1] << 16)))
    return tuple(words)


def ldmatrix_x4(address):
    """Emulated ``ldmatrix.sync.aligned.m8n8.x4.shared.b16``."""
    return _ldmatrix_x4(address, False)


def ldmatrix_x4_trans(address):
    """Emulated ``ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16``."""
    return _ldmatrix_x4(address, True)


def cp_async_16(address, src, index, nbytes):
    """Emulated ``cp.async.cg.shared.global`` of 16 bytes: words src[index:index+4] (``nbytes`` of
    them, 16 or 0) to the shared byte ``address``; the bytes past ``nbytes`` are zeros."""
    smem = threading.current_thread()._tinyflash_smem
    start, words = int(address) // 4, int(nbytes) // 4
    for i in range(4):
        smem[start + i] = src[int(index) + i] if i < words else 0


def make_cp_async_16(prefetch: int = 0):
    """Emulated ``cp.async.cg.shared.global.L2::128B``: the hint changes no result, so :func:`cp_async_16`."""
    return cp_async_16


def red_add_f32x2(array, index, a, b):
    """Emulated ``red.global.add.v2.f32``: both additions under the simulator's lock of ``cuda.atomic.add``."""
    from numba.cuda.simulator.kernelapi import addlock

    with addlock:
        array[int(index)] += a
        array[int(index) + 1] += b


def cp_async_commit():
    """Emulated ``cp.async.commit_group``: the copies above were done at once."""


def cp_async_wait_all():
    """Emulated ``cp.async.wait_group 0``: nothing is left in flight."""


def make_cp_async_wait_group(pending: int):
    """Emulated ``cp.async.wait_group N``: the copies were done at once, nothing to wait for."""

    def wait():
        pass

    return wait


def wait_for_prior_grids():
    """Emulated ``griddepcontrol.wait``: the simulator runs one grid after another, so the grid before has ended."""


def shfl_xor(value, lane_mask):
    """Emulated ``shfl.sync.bfly`` (``cuda.shfl_xor_sync`` over the full warp)."""
    values, lane = _exchange(value)
    return values[lane ^ int(lane_mask)]
