"""The instructions of ``tma.py`` emulated in Python for numba's CUDA simulator: mbarriers, TMA copies and
reduce-adds, named barriers, setmaxnreg.

An mbarrier is kept in Python, per block, by its shared address: its phase, the arrivals still expected and the
bytes of copies still expected, as the hardware counts them (``tma.py``'s docstring). A copy reads its tensor map's
description (``tensor_map.simulated_map``), writes the box into the block's shared memory at once, 128-byte
swizzled (bits 4-6 of each shared address XOR its bits 7-9, as the hardware does; a map with the 64-byte swizzle:
bits 4-5 XOR bits 7-8), zeros outside the tensor, and
completes its bytes on the barrier. A waiting thread sleeps on the block's condition variable until an arrival
or a copy changes a barrier. So a kernel that waits on the wrong parity, announces the wrong number of bytes or
arrives too few times hangs or reads a stage too early here too. A hang is told from a slow kernel (hundreds of
Python threads on a few cores can take minutes between two arrivals) by looking at the whole block: once every
live thread of it has waited, at a barrier of this module or at ``syncthreads``, with no barrier changing, for
``STALL_SECONDS``, none can ever go on, and the wait raises, naming the barrier.

Checked besides: a barrier used before ``mbarrier_init``; more arrivals than a phase expects; a copy whose box
would land on an mbarrier, or outside shared memory; a destination that is not 128-byte aligned.

Not emulated: time. A copy lands when it is issued, so a stage that is overwritten while a warpgroup's
multiplies still read it (a missing wait on an "empty" barrier) is caught only when the threads happen to
run in that order; a reduce-add reads its box when it is issued (the bulk groups' waits do nothing);
``fence.proxy.*`` and the tensor-map fences do nothing (one coherent memory); setmaxnreg does nothing
(registers are Python's). Named barriers count threads (the hardware counts warps: the same when every
lane of a warp calls them, as ``.aligned`` requires).
"""

from __future__ import annotations

import threading
import time

import numpy as np

from .tensor_map import MAP_WORDS, simulated_map

STALL_SECONDS = 10.0  # every live thread of a block waiting this long, with no barrier changing: a deadlock
LOOK_SECONDS = 0.5  # how often a block's threads are looked at (by whichever waiting thread comes first)
ROW_BYTES, CHUNK_BYTES = 128, 16  # a swizzled row; one 16-byte chunk (8 elements)


class _Block:
    """One block's mbarriers and named barriers, and the condition its waiting threads sleep on."""

    def __init__(self):
        self.changed = threading.Condition()
        self.barriers = {}  # shared address -> [count, arrivals pending, bytes pending, phase]
        self.named = {}  # id -> [threads arrived, generation]
        self.changes = 0  # arrivals, completed bytes and barrier generations so far
        self.looked = (0.0, -1)  # when the block's threads were last looked at, and ``changes`` then
        self.stalled_since = None  # since when every live thread has been seen waiting, with no change


def _waits(thread) -> bool:
    return "_tinyflash_waiting" in thread.__dict__ or getattr(thread, "syncthreads_blocked", False)


def _deadlocked(block: _Block) -> bool:
    """True once every live thread of the calling thread's block has waited for STALL_SECONDS while no barrier
    changed (called with ``block.changed`` held; the threads are looked at once per LOOK_SECONDS)."""
    now, me = time.monotonic(), threading.current_thread()
    if now - block.looked[0] >= LOOK_SECONDS:
        manager, key = me._manager, tuple(me.blockIdx)
        everyone = all(_waits(t) for t in threading.enumerate()
                       if getattr(t, "_manager", None) is manager and tuple(t.blockIdx) == key)
        if not everyone or block.changes != block.looked[1]:
            block.stalled_since = now if everyone else None
        elif block.stalled_since is None:
            block.stalled_since = now
        block.looked = (now, block.changes)
    return block.stalled_since is not None and now - block.stalled_since > STALL_SECONDS


def _block() -> _Block:
    thread = threading.current_thread()
    blocks = thread._manager.__dict__.setdefault("_tinyflash_tma", {})
    key = tuple(thread.blockIdx)
    return blocks.get(key) or blocks.setdefault(key, _Block())


def _barrier(block: _Block, bar) -> list:
    state = block.barriers.get(int(bar))
    if state is None:
        raise RuntimeError(f"mbarrier at shared byte {int(bar)} used before mbarrier_init")
    return state


def _settle(state: list) -> None:
    """Complete the phase if no arrival and no byte is pending: flip the phase, expect the next one's arrivals."""
    if state[1] == 0 and state[2] == 0:
        state[1], state[3] = state[0], state[3] + 1


def mbarrier_init(bar, count):
    """Emulated ``mbarrier.init``: phase 0 in progress, ``count`` arrivals expected, no bytes."""
    if int(bar) % 8:
        raise ValueError(f"an mbarrier is 8-byte aligned; got shared byte {int(bar)}")
    block = _block()
    with block.changed:
        block.barriers[int(bar)] = [int(count), int(count), 0, 0]


def _arrive(bar, nbytes: int) -> None:
    block = _block()
    with block.changed:
        state = _barrier(block, bar)
        if state[1] == 0:
            raise RuntimeError(f"mbarrier at shared byte {int(bar)}: an arrival beyond its count of {state[0]} while "
                               f"its phase waits for {state[2]} bytes")
        state[1] -= 1
        state[2] += nbytes
        _settle(state)
        block.changes += 1
        block.changed.notify_all()


def arrive(bar):
    """Emulated ``mbarrier.arrive``."""
    _arrive(bar, 0)


def arrive_expect_tx(bar, nbytes):
    """Emulated ``mbarrier.arrive.expect_tx``: ``nbytes`` more expected, and an arrival."""
    _arrive(bar, int(nbytes))


def try_wait(bar, parity):
    """Emulated ``mbarrier.try_wait.parity``: 1 if the phase of that parity is over; else sleep until a barrier of
    the block changes (or 50 ms) and answer again; raise once the whole block is stalled (``_deadlocked``)."""
    block, thread = _block(), threading.current_thread()
    with block.changed:
        state = _barrier(block, bar)
        if state[3] % 2 != int(parity):
            thread.__dict__.pop("_tinyflash_waiting", None)
            return np.uint32(1)
        thread.__dict__["_tinyflash_waiting"] = True
        block.changed.wait(0.05)
        if state[3] % 2 != int(parity):
            thread.__dict__.pop("_tinyflash_waiting", None)
            return np.uint32(1)
        if getattr(thread, "abort", False):
            raise RuntimeError("another thread of the block failed")
        if _deadlocked(block):
            raise RuntimeError(f"mbarrier at shared byte {int(bar)}: every thread of the block has waited "
                               f"{STALL_SECONDS:.0f} s, this one for the phase of parity {int(parity)} (arrivals "
                               f"pending {state[1]} of {state[0]}, bytes pending {state[2]}): a deadlock, a wrong "
                               "parity, or copies that never complete the bytes announced")
    return np.uint32(0)


def tma_load_3d(dst, maps, index, col, row, head, bar):
    """Emulated ``cp.async.bulk.tensor.3d ... mbarrier::complete_tx::bytes``: the box lands now."""
    tmap, elements = simulated_map(maps[int(index) * MAP_WORDS:(int(index) + 1) * MAP_WORDS])
    if tmap.element_bytes != 2:
        raise ValueError(f"tma_load_3d copies boxes of 16-bit elements; got a map of {tmap.element_bytes}-byte ones")
    smem = np.asarray(threading.current_thread()._tinyflash_smem).view(np.uint16)  # the block's shared memory
    dst, col, row, head = int(dst), int(col), int(row), int(head)
    if dst % ROW_BYTES:
        raise ValueError(f"a swizzled TMA box must land 128-byte aligned; got shared byte {dst}")
    width, chunks = tmap.box_columns, tmap.swizzle_bytes // CHUNK_BYTES  # 64 columns, 8 chunks (64-byte: 32, 4)
    box = np.zeros((tmap.box_rows, width), np.uint16)  # (box rows, width): zeros outside the tensor
    cube = elements[:tmap.heads * tmap.rows * tmap.columns].reshape(tmap.heads, tmap.rows, tmap.columns)
    if 0 <= head < tmap.heads:
        rows = cube[head, max(row, 0):max(min(row + tmap.box_rows, tmap.rows), 0), max(col, 0):col + width]
        box[max(-row, 0):max(-row, 0) + rows.shape[0], max(-col, 0):max(-col, 0) + rows.shape[1]] = rows
    r, c = np.arange(tmap.box_rows)[:, None], np.arange(chunks)[None, :]  # (rows, 1), (1, chunks)
    address = dst + r * tmap.swizzle_bytes + c * CHUNK_BYTES  # (rows, chunks): each chunk's place before the swizzle
    address = address ^ (((address >> 7) & (chunks - 1)) << 4)  # 128-byte: bits 4-6 ^= 7-9; 64-byte: 4-5 ^= 7-8
    end = dst + tmap.box_bytes
    block = _block()
    if end > smem.size * 2 or any(dst <= b < end for b in block.barriers):
        raise IndexError(f"a TMA box of {tmap.box_bytes} bytes at shared byte {dst} would overwrite an mbarrier or "
                         f"pass the end of shared memory ({smem.size * 2} bytes)")
    halves = (address // 2)[..., None] + np.arange(8)  # (rows, 8 chunks, 8 elements)
    smem[halves] = box.reshape(tmap.box_rows, chunks, 8)
    with block.changed:
        state = _barrier(block, bar)
        state[2] -= tmap.box_bytes
        _settle(state)
        block.changes += 1
        block.changed.notify_all()


def tma_reduce_add_3d(src, maps, index, col, row, head):
    """Emulated ``cp.reduce.async.bulk.tensor.3d ... add``: the swizzled float32 box at ``src`` is added now to the
    elements of the map's box that are inside the tensor (under a lock: blocks may add to the same elements)."""
    tmap, elements = simulated_map(maps[int(index) * MAP_WORDS:(int(index) + 1) * MAP_WORDS])
    if tmap.element_bytes != 4:
        raise ValueError(f"tma_reduce_add_3d adds float32 boxes; got a map of {tmap.element_bytes}-byte elements")
    smem = np.asarray(threading.current_thread()._tinyflash_smem).view(np.float32)  # the block's shared memory
    src, col, row, head = int(src), int(col), int(row), int(head)
    if src % ROW_BYTES or src + tmap.box_bytes > smem.size * 4:
        raise ValueError(f"a 128-byte-swizzled TMA box must lie 128-byte aligned in shared memory; got shared byte "
                         f"{src} for {tmap.box_bytes} bytes")
    per_chunk = CHUNK_BYTES // 4  # floats of a 16-byte chunk
    r, c = np.arange(tmap.box_rows)[:, None], np.arange(ROW_BYTES // CHUNK_BYTES)[None, :]  # (rows, 1), (1, 8)
    address = src + r * ROW_BYTES + c * CHUNK_BYTES
    address = address ^ (((address >> 7) & 7) << 4)  # each chunk's place after the swizzle
    box = smem[(address // 4)[..., None] + np.arange(per_chunk)].reshape(tmap.box_rows, tmap.box_columns)
    cube = elements[:tmap.heads * tmap.rows * tmap.columns].reshape(tmap.heads, tmap.rows, tmap.columns)
    if 0 <= head < tmap.heads:
        rows = slice(max(row, 0), max(min(row + tmap.box_rows, tmap.rows), 0))
        columns = slice(max(col, 0), max(min(col + tmap.box_columns, tmap.columns), 0))
        with _REDUCE_LOCK:
            cube[head, rows, columns] += box[rows.start - row:rows.stop - row, columns.start - col:columns.stop - col]


_REDUCE_LOCK = threading.Lock()


def bulk_commit_group():
    """Emulated ``cp.async.bulk.commit_group``: nothing (a reduce-add is done when it is issued)."""


bulk_wait_read = bulk_wait = bulk_commit_group  # emulated ``cp.async.bulk.wait_group(.read) 0``: nothing to wait for


def acquire_map(maps, index):
    """Emulated ``fence.proxy.tensormap``: checks that the map is one, nothing to order."""
    simulated_map(maps[int(index) * MAP_WORDS:(int(index) + 1) * MAP_WORDS])


prefetch_map = acquire_map  # emulated ``prefetch.tensormap``: nothing to fetch


def make_setmaxnreg(grow: bool, count: int):
    """Emulated ``setmaxnreg``: nothing (registers are Python's)."""

    def setmaxnreg():
        pass

    return setmaxnreg


def _named_barrier(arrive_only: bool, ident: int, threads: int) -> None:
    """Emulated ``bar.sync`` / ``bar.arrive`` of ``threads`` threads on barrier ``ident``."""
    if not 1 <= ident <= 15:
        raise ValueError(f"a named barrier's id is 1 .. 15 (0 is __syncthreads's); got {ident}")
    block, thread = _block(), threading.current_thread()
    with block.changed:
        state = block.named.setdefault(ident, [0, 0])
        state[0] += 1
        block.changes += 1
        generation = state[1]
        if state[0] == threads:
            state[0], state[1] = 0, state[1] + 1
            block.changed.notify_all()
            return
        if arrive_only:
            return
        thread.__dict__["_tinyflash_waiting"] = True
        try:
            while state[1] == generation:
                block.changed.wait(0.05)
                if getattr(thread, "abort", False):
                    raise RuntimeError("another thread of the block failed")
                if state[1] == generation and _deadlocked(block):
                    raise RuntimeError(f"named barrier {ident} of {threads} threads: {state[0]} arrived, and every "
                                       f"thread of the block has waited {STALL_SECONDS:.0f} s: a deadlock")
        finally:
            thread.__dict__.pop("_tinyflash_waiting", None)


def make_named_barrier(arrive_only: bool, ident: int, threads: int):
    """Emulated ``bar.sync`` / ``bar.arrive`` of ``threads`` threads on barrier ``ident``."""

    def barrier():
        _named_barrier(arrive_only, ident, threads)

    return barrier


def make_named_barrier_by_id(arrive_only: bool, threads: int):
    """Emulated ``bar.sync`` / ``bar.arrive`` of ``threads`` threads, on the barrier whose id it is given."""

    def barrier(ident):
        _named_barrier(arrive_only, int(ident), threads)

    return barrier
