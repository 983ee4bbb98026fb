"""The wgmma instructions of ``wgmma.py``, emulated in Python for numba's CUDA simulator.

A warpgroup's multiply reads its shared-memory operands through descriptors; each emulated thread
decodes the descriptors itself (the address of every element, :func:`operand_addresses`, with the
128-, 64- or 32-byte swizzle applied to the address bits as the hardware does), multiplies the whole
64 × N tile in float64 with NumPy, and keeps its own N / 2 accumulators: no exchange between threads.
With A in registers (``rs``), a warp's rows of A are spread over its 32 lanes: they are gathered by the
warp-synchronous exchange of ``ptx_emulation`` (every lane of the block calls the instruction together).

The asynchrony is emulated too, so that a kernel that breaks its rules fails on the simulator:

* an mma_async without a :func:`fence` since the last :func:`commit_group` raises RuntimeError;
* its result is kept aside and written to the accumulator array only when a :func:`make_wait_group`
  wait retires its group: a kernel that reads D before waiting reads the old values. Multiplies into
  the same accumulators chain in issue order, as on the tensor cores.

What is not emulated: the shared memory is read when mma_async is issued, not some time before the wait
(a kernel that overwrites an operand in between is wrong on a GPU and not caught here); the base-offset
field of a descriptor (every tile here starts 1024-byte aligned; a non-zero field raises); the
async proxy (``fence.proxy.async``: the simulator has one coherent shared memory, so it does nothing).
Each product is exact in float64 and rounded once to float32 per instruction, as ``ptx_emulation``'s mma.

FP8 (``e4m3``, m64nNk32) reads one byte per element through the same descriptors and swizzle (a k-step is 32
one-byte values instead of 16 two-byte ones) and decodes the bytes with ``fp8_emulation``. Its 32 products
and their sum are exact in float64 too (each product has at most 8 significant bits, between 2^-18 and
448², so the sum needs fewer than 53 bits). The hardware's FP8 accumulation keeps fewer bits than float32 (about
13: ``tests/test_wgmma_fp8_ptx.py``), which this emulation does not model: it is exact where the GPU is not.
"""

from __future__ import annotations

import threading
from functools import lru_cache

import numpy as np

from .fp8_emulation import e4m3_values
from .ptx_emulation import _exchange, a_fragment, from_bits

M, K = 64, 16  # m64nNk16
ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "e4m3": 1}
K_STEP_BYTES = 32  # every form reads 32 bytes of k per row: k = 16 two-byte or 32 one-byte values


def _state():
    """This thread's wgmma state: whether a fence opened the batch, the open batch, the committed groups, and
    the newest pending value of each accumulator array."""
    thread = threading.current_thread()
    state = thread.__dict__.get("_tinyflash_wgmma")
    if state is None:
        state = thread._tinyflash_wgmma = {"fenced": False, "open": [], "groups": [], "latest": {}}
    return state


def decode(desc: int) -> dict:
    """The fields of a shared-memory matrix descriptor (``wgmma.py``'s docstring)."""
    desc = int(desc)
    return {"start": (desc & 0x3FFF) << 4, "leading": ((desc >> 16) & 0x3FFF) << 4,
            "stride": ((desc >> 32) & 0x3FFF) << 4, "base_offset": (desc >> 49) & 0x7, "swizzle": (desc >> 62) & 0x3}


SWIZZLE_CHUNKS = {0: 1, 1: 8, 2: 4, 3: 2}  # 16-byte chunks per swizzled row, by the descriptor's code


@lru_cache(maxsize=4096)
def operand_addresses(desc: int, mn: int, k_major: bool, element_bytes: int = 2) -> np.ndarray:
    """(mn, k): the shared byte address of element (i, k) of an operand that a descriptor names: A (i a row of
    the 64 × k A) or Bᵀ (i a column of the k × N B); K-major or MN-major. CUTLASS's canonical layouts
    (``make_gmma_desc``), in bytes, for 16-bit values (k = 16, 8 per 16-byte chunk), W chunks per swizzled row:

        K-major, no swizzle:  (i % 8)·16 + (i // 8)·SBO + (k // 8)·LBO + 2(k % 8)
        K-major, swizzled:    (i % 8)·16W + (i // 8)·SBO + 2k
        MN-major, no swizzle: 2(i % 8) + (i // 8)·SBO + (k % 8)·16 + (k // 8)·LBO
        MN-major, swizzled:   2(i % 8W) + (i // 8W)·LBO + (k % 8)·16W + (k // 8)·SBO

    then, swizzled, bits 4 .. 4 + log2(W) of the address XOR its bits 7 .. 7 + log2(W). One-byte values
    (``element_bytes=1``, e4m3: k = 32, K-major only) take the K-major rows with the byte of k, kb = k, in
    place of 2k: (kb // 16)·LBO + kb % 16 unswizzled, kb swizzled."""
    f = decode(desc)
    if f["base_offset"]:
        raise NotImplementedError("a descriptor's base offset is not emulated: start tiles 1024-byte aligned")
    if element_bytes == 1 and not k_major:
        raise ValueError("one-byte operands (e4m3) are K-major only: wgmma has no transpose for them")
    w = SWIZZLE_CHUNKS[f["swizzle"]]
    i, k = np.arange(mn)[:, None], np.arange(K_STEP_BYTES // element_bytes)[None, :]  # (mn, 1), (1, k)
    if k_major:
        kb = element_bytes * k  # the byte of k in the row
        offset = ((i % 8) * 16 * w + (i // 8) * f["stride"] + kb if f["swizzle"] else
                  (i % 8) * 16 + (i // 8) * f["stride"] + (kb // 16) * f["leading"] + kb % 16)
    else:
        offset = (2 * (i % (8 * w)) + (i // (8 * w)) * f["leading"] + (k % 8) * 16 * w + (k // 8) * f["stride"]
                  if f["swizzle"] else
                  2 * (i % 8) + (i // 8) * f["stride"] + (k % 8) * 16 + (k // 8) * f["leading"])
    address = f["start"] + offset  # (mn, k)
    if f["swizzle"]:
        address = address ^ (((address >> 7) & (w - 1)) << 4)
    return address


def read_operand(desc, mn: int, k_major: bool, element: str) -> np.ndarray:
    """(mn, k) float64: the operand a descriptor names, read from this thread's shared memory (the array its
    last ``ptx.shared_address`` was given; addresses are byte offsets into it); k = 16, or 32 for e4m3."""
    smem = threading.current_thread()._tinyflash_smem
    size = ELEMENT_BYTES[element]
    values = np.asarray(smem).view(np.uint16 if size == 2 else np.uint8)  # little-endian: low bytes first
    address = operand_addresses(int(desc), mn, k_major, size)
    if (address % size).any() or address.max() // size >= values.size:
        raise IndexError(f"wgmma operand outside shared memory (descriptor {int(desc):#x}, {values.nbytes} bytes)")
    bits = values[address // size]
    return (e4m3_values(bits) if size == 1 else from_bits(bits, element)).astype(np.float64)


def a_fragment_e4m3(lane: int) -> list[tuple[int, int]]:
    """A (16 × 32, row-major, one byte each) of a warp's rows of wgmma m64nNk32 in registers: the 16 elements of
    ``lane`` in register order a0.byte0 .. a0.byte3, a1.byte0, .., a3.byte3 (``wgmma.py``'s docstring;
    CUTLASS's ``ALayout_64x32``): word j holds row g + 8·(j % 2), columns 4t + 16·(j // 2) + byte."""
    g, t = lane // 4, lane % 4
    return [(g + 8 * (j % 2), 4 * t + 16 * (j // 2) + byte) for j in range(4) for byte in range(4)]


def _warp_rows_of_a(words: np.ndarray, element: str) -> np.ndarray:
    """(64, k) float64: A with the 16 rows of this thread's warp filled from ``words``, the (32 lanes, 4) words
    of its lanes (the other rows zero: the warp holds only its rows of D)."""
    warp = (threading.current_thread().thread_id % 128) // 32
    if element == "e4m3":
        values = e4m3_values(words.astype("<u4").view(np.uint8).reshape(-1))  # lane, word, byte (low first)
        table, k = a_fragment_e4m3, 32
    else:
        values = from_bits(np.stack([words & 0xFFFF, words >> 16], axis=-1).reshape(-1), element)
        table, k = a_fragment, K
    rows, cols = map(np.array, zip(*[place for lane in range(32) for place in table(lane)]))
    a = np.zeros((M, k))
    a[16 * warp + rows, cols] = values
    return a


def accumulator_place(tid: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols), each (n / 2,): where thread ``tid``'s accumulators sit in the 64 × n D, in register order."""
    warp, lane = (tid % 128) // 32, tid % 32
    g, t = lane // 4, lane % 4
    r = np.arange(n // 2)
    blocks, e = r // 4, r % 4
    return 16 * warp + g + 8 * (e // 2), 8 * blocks + 2 * t + e % 2


def _issue(acc, product, scale_d, n):
    """Queue ``acc`` (+)= this thread's part of ``product`` (64 × n) in the open batch."""
    state = _state()
    if not state["fenced"]:
        raise RuntimeError("wgmma.mma_async without a wgmma.fence since the last commit_group: the tensor cores "
                           "could read registers before their last writes")
    thread = threading.current_thread()
    rows, cols = accumulator_place(thread.thread_id, n)
    flat = acc.reshape(-1)
    value = product[rows, cols]
    if int(scale_d):  # D = A·B + D; with scale_d = 0, D's old registers (never set, perhaps) are not read
        before = state["latest"].get(id(acc))  # chained multiplies see the newest value in flight
        value = value + (flat[:n // 2].astype(np.float64) if before is None else before)
    value = value.astype(np.float32)
    state["latest"][id(acc)] = value
    state["open"].append((flat, id(acc), value))


def make_mma(element: str, n: int, from_registers: bool, trans_b: bool, trans_a: bool = False):
    """Emulated ``wgmma.mma_async.sync.aligned.m64n{n}k16.f32.<element>.<element>`` (ss or rs form; A read
    MN-major with ``trans_a``, B with ``trans_b``), or ``m64n{n}k32.f32.e4m3.e4m3`` (both K-major)."""
    b_major_k = not trans_b

    def b_operand(desc_b):
        return read_operand(desc_b, n, b_major_k, element).T  # (k, n)

    if from_registers:
        def mma_async_rs(acc, a0, a1, a2, a3, desc_b, scale_d):
            lanes, _ = _exchange((a0, a1, a2, a3))  # the warp's words of its 16 rows of A
            a = _warp_rows_of_a(np.array(lanes, dtype=np.uint32), element)  # (64, k); words (32 lanes, 4)
            _issue(acc, a @ b_operand(desc_b), scale_d, n)

        return mma_async_rs

    def mma_async_ss(acc, desc_a, desc_b, scale_d):
        _issue(acc, read_operand(desc_a, M, not trans_a, element) @ b_operand(desc_b), scale_d, n)

    return mma_async_ss


def fence():
    """Emulated ``wgmma.fence``: the batch that follows may be issued."""
    _state()["fenced"] = True


def commit_group():
    """Emulated ``wgmma.commit_group``: the open batch becomes the newest group; the next needs a fence."""
    state = _state()
    state["groups"].append(state["open"])
    state["open"], state["fenced"] = [], False


def make_wait_group(pending: int):
    """Emulated ``wgmma.wait_group N``: the groups older than the newest N write their accumulators."""

    def wait():
        state = _state()
        while len(state["groups"]) > pending:
            for flat, key, value in state["groups"].pop(0):
                flat[:value.size] = value
                if state["latest"].get(key) is value:  # no newer multiply into these accumulators in flight
                    del state["latest"][key]

    return wait


def make_fence_operands(count: int):
    """Emulated register fence: nothing moves on the simulator."""

    def fence_operands(acc):
        pass

    return fence_operands


def fence_proxy_async():
    """Emulated ``fence.proxy.async.shared::cta``: one coherent shared memory, nothing to order."""
