"""The TMA and mbarrier instructions of tinyflash.gpu.tma, one block at a time.

A box copied by TMA must land exactly where the wgmma descriptors read a tile (``wgmma.swizzled_chunk``: 64-column
halves one after the other, each row's 16-byte chunks permuted by the row's place among 8), with zeros for rows
past the end of the tensor; the expected layout is written out here by hand. Without a GPU these run the
simulator's emulations (``tma_emulation.py``); on a Hopper GPU the real instructions, so the tensor map's encoding
and the hardware's swizzle are checked there. ``tma_reduce_add_3d`` is checked the same way: a float32 box added
from its swizzled place in shared memory, rows past the end of the tensor left out. The last tests check the
emulation's own rules (simulator only).
"""

import numpy as np
import pytest
from numba import cuda, int32, uint32, uint64

from tinyflash.gpu import ptx, tma, wgmma
from tinyflash.gpu.runtime import simulator_enabled
from tinyflash.gpu.smem import shared_floats, shared_words
from tinyflash.gpu.tensor_map import TensorMap, tensor_maps

ALIGN = 1024


@pytest.fixture
def hopper_or_simulator():
    if not simulator_enabled():
        from tinyflash.gpu.runtime import compute_capability

        if compute_capability() != (9, 0):
            pytest.skip("TMA copies with the 128-byte swizzle, as here, need compute capability 9.0")


def make_copy_kernel(box_bytes: int, halves: int):
    """One block of 128 threads: thread 0 copies ``halves`` boxes (columns 0-63, 64-127) of head ``head`` from row
    ``row`` into shared memory, one after the other; everyone waits on the barrier, then copies shared memory out,
    and thread 0 writes what try_wait says of parity 0 (completed) and 1 (not yet)."""
    BAR = uint32(halves * box_bytes)
    WORDS = halves * box_bytes // 4

    @cuda.jit
    def copy(maps, row, head, out, flags):
        smem = shared_words()
        tid = cuda.threadIdx.x
        raw = ptx.shared_address(smem, uint64(0))
        base = (raw + uint32(ALIGN - 1)) & ~uint32(ALIGN - 1)
        if tid == 0:
            tma.mbarrier_init(base + BAR, uint32(1))
            wgmma.fence_proxy_async()
            tma.acquire_map(maps, uint64(0))
            tma.arrive_expect_tx(base + BAR, uint32(halves * box_bytes))
            for h in range(halves):
                tma.tma_load_3d(base + uint32(h * box_bytes), maps, uint64(0), int32(64 * h), int32(row), int32(head),
                                base + BAR)
        cuda.syncthreads()  # the barrier is initialised before anyone waits on it
        tma.wait(base + BAR, uint32(0))
        first = (base - raw) // uint32(4)
        for i in range(tid, WORDS, 128):
            out[i] = smem[first + uint32(i)]
        if tid == 0:
            flags[0], flags[1] = tma.try_wait(base + BAR, uint32(0)), tma.try_wait(base + BAR, uint32(1))

    return copy


def expected_tile(x, head, row, box_rows):
    """(halves · box_rows · 64,) uint16: the box as the descriptors read it, written out by hand."""
    heads, rows, cols = x.shape
    tile = np.zeros(cols // 64 * box_rows * 64, np.uint16)
    bits = x.view(np.uint16)
    for h in range(cols // 64):
        for r in range(box_rows):
            for c in range(8):  # 16-byte chunks of the row's 64 columns
                place = h * box_rows * 64 + r * 64 + (c ^ (r % 8)) * 8  # in 16-bit elements
                if row + r < rows:
                    tile[place:place + 8] = bits[head, row + r, 64 * h + 8 * c:64 * h + 8 * c + 8]
    return tile


@pytest.mark.parametrize("cols, rows, box_rows, row", [(64, 40, 32, 16), (128, 100, 64, 0), (128, 70, 16, 64)])
def test_a_box_lands_swizzled_with_zeros_past_the_end(rng, hopper_or_simulator, cols, rows, box_rows, row):
    """Rows row .. row + box_rows of head 1 (of 3), past the end for some: zeros there."""
    x = rng.standard_normal((3, rows, cols)).astype(np.float16)  # (heads, rows, cols), never zeros
    tmap = TensorMap(cols, rows, 3, box_rows)
    flat = cuda.to_device(x.reshape(-1).view(np.uint32))
    maps = tensor_maps([tmap], [flat])
    halves = cols // 64
    out, flags = cuda.device_array(halves * tmap.box_bytes // 4, np.uint32), cuda.device_array(2, np.uint32)
    make_copy_kernel(tmap.box_bytes, halves)[1, 128, 0, halves * tmap.box_bytes + 8 + ALIGN](maps, row, 1, out,
                                                                                               flags)
    got = out.copy_to_host().view(np.uint16)
    want = expected_tile(x, 1, row, box_rows)
    wrong = np.flatnonzero(got != want)
    assert wrong.size == 0, f"{wrong.size} elements differ, first at {wrong[:8]}"
    assert list(flags.copy_to_host()) == [1, 0]  # phase 0 completed; phase 1 in progress


@pytest.mark.parametrize("rows, box_rows, row", [(40, 32, 16), (100, 64, 0)])
def test_a_box_lands_64_byte_swizzled(rng, hopper_or_simulator, rows, box_rows, row):
    """A map with the 64-byte swizzle (the FP8 kernel's rows of 64 e4m3 bytes: 32 16-bit columns): row r's 16-byte
    chunk c lands at chunk c XOR ((r // 2) % 4) of its 64-byte row (bits 4-5 of the address XOR bits 7-8), as the
    wgmma descriptors' 64-byte swizzle reads it; zeros past the end."""
    x = rng.standard_normal((3, rows, 32)).astype(np.float16)  # (heads, rows, 32 columns)
    tmap = TensorMap(32, rows, 3, box_rows, swizzle_bytes=64)
    maps = tensor_maps([tmap], [cuda.to_device(x.reshape(-1).view(np.uint32))])
    out, flags = cuda.device_array(tmap.box_bytes // 4, np.uint32), cuda.device_array(2, np.uint32)
    make_copy_kernel(tmap.box_bytes, 1)[1, 128, 0, tmap.box_bytes + 8 + ALIGN](maps, row, 1, out, flags)
    want = np.zeros(box_rows * 32, np.uint16)
    bits = x.view(np.uint16)
    for r in range(min(box_rows, rows - row)):
        for c in range(4):
            place = r * 32 + (c ^ ((r // 2) % 4)) * 8
            want[place:place + 8] = bits[1, row + r, 8 * c:8 * c + 8]
    wrong = np.flatnonzero(out.copy_to_host().view(np.uint16) != want)
    assert wrong.size == 0, f"{wrong.size} elements differ, first at {wrong[:8]}"
    assert list(flags.copy_to_host()) == [1, 0]


def test_tensor_maps_are_checked():
    with pytest.raises(ValueError, match="multiple of 64"):
        TensorMap(96, 10, 1, 16)
    with pytest.raises(ValueError, match="1 .. 256 rows"):
        TensorMap(64, 10, 1, 320)
    with pytest.raises(ValueError, match="multiple of 32"):
        TensorMap(48, 10, 1, 16, element_bytes=4)
    with pytest.raises(ValueError, match="64 bytes of 16-bit elements"):
        TensorMap(32, 10, 1, 16, element_bytes=4, swizzle_bytes=64)


def test_map_cache_keeps_maps_by_address_but_not_those_written_into_a_graph(monkeypatch):
    """MapCache's bookkeeping, with the driver's parts replaced: a call at addresses seen before gets the same
    maps; on a stream that captures a CUDA graph, every call gets maps written on that stream
    (``captured_maps``), which are not kept; the map kernel is loaded when the cache is made (a capture cannot
    load a module). The writes themselves run on a GPU (``test_torch_gpu.py``'s capture tests)."""
    from tinyflash.gpu import tensor_map

    made, written, loaded = [], [], []
    monkeypatch.setattr(tensor_map, "_store_map_kernel", lambda: loaded.append(True))
    monkeypatch.setattr(tensor_map, "tensor_maps", lambda maps, arrays: made.append(arrays) or f"maps {len(made)}")
    monkeypatch.setattr(tensor_map, "captured_maps", lambda maps, arrays, stream: written.append(stream) or "graph")
    capturing = {7: True}
    monkeypatch.setattr(tensor_map, "stream_capturing", lambda stream: capturing.get(stream, False))
    monkeypatch.setattr(tensor_map, "device_address", lambda a: a)
    cache = tensor_map.MapCache([TensorMap(64, 10, 1, 16)])
    assert loaded == [True]
    assert cache(100, stream=3) == cache(100, stream=3) == "maps 1" and len(made) == 1
    assert cache(200, stream=7) == "graph" and cache(200, stream=7) == "graph" and written == [7, 7]
    assert cache(100, stream=7) == "graph" and written == [7, 7, 7]  # seen before: still the graph's own
    assert cache(200, stream=3) == "maps 2" and len(made) == 2  # the graph's maps were not kept


class _Words:
    """A device array stand-in (no GPU needed): an address and ``n`` int64 elements."""

    def __init__(self, n, address):
        self.shape, self.size = (n,), n
        self.__cuda_array_interface__ = {"shape": (n,), "strides": None, "typestr": "<i8", "data": (address, False),
                                         "version": 3}


def test_maps_written_into_a_graph_take_one_launch_of_one_block_each(monkeypatch):
    """captured_maps' host side, the driver replaced (a host-only kernel: its launches counted, its grid and
    parameters packed as for the driver; the maps' encoding): the maps' 16 words each into one int64 array from
    the inputs' library, one launch of the map-writing kernel per map."""
    from tinyflash.gpu import arrays, tensor_map
    from tinyflash.gpu.host_only import HostOnlyKernel

    kernel = HostOnlyKernel(tensor_map._STORE_MAP, tensor_map._STORE_MAP_SIGNATURE)
    monkeypatch.setattr(tensor_map, "_store_map_kernel", lambda: kernel)
    monkeypatch.setattr(arrays, "empty", lambda like, n, dtype: _Words(n, 1 << 24))
    monkeypatch.setattr(TensorMap, "encode", lambda self, address: address.to_bytes(8, "little") * 16)  # the driver's
    maps = [TensorMap(64, 100, 2, 64), TensorMap(64, 100, 2, 32, element_bytes=4)]
    inputs = [_Words(2 * 100 * 64, 1 << 30), _Words(2 * 100 * 64, 1 << 31)]
    before = HostOnlyKernel.launches
    out = tensor_map.captured_maps(maps, inputs, stream=5)
    assert out.size == 2 * tensor_map.MAP_WORDS and HostOnlyKernel.launches == before + 2


def make_reduce_kernel(box_rows: int, boxes: int):
    """One block of 128 threads: the threads store ``src`` (float32, already in the swizzled order) into shared
    memory; thread 0 adds it, ``boxes`` boxes of 32 columns side by side, to head ``head`` from row ``row`` by TMA
    reduce-adds and waits for them to complete."""
    BOX_BYTES = box_rows * 128

    @cuda.jit
    def reduce(maps, src, row, head):
        smem, smemf = shared_words(), shared_floats()
        tid = cuda.threadIdx.x
        raw = ptx.shared_address(smem, uint64(0))
        base = (raw + uint32(ALIGN - 1)) & ~uint32(ALIGN - 1)
        first = (base - raw) // uint32(4)
        for i in range(tid, boxes * BOX_BYTES // 4, 128):
            smemf[first + uint32(i)] = src[i]
        wgmma.fence_proxy_async()  # each thread's stores are visible to the copy engine
        cuda.syncthreads()  # every thread's are in shared memory before the adds read it
        if tid == 0:
            tma.acquire_map(maps, uint64(0))
            for b in range(boxes):
                tma.tma_reduce_add_3d(base + uint32(b * BOX_BYTES), maps, uint64(0), int32(32 * b), int32(row),
                                      int32(head))
            tma.bulk_commit_group()
            tma.bulk_wait()

    return reduce


@pytest.mark.parametrize("cols, rows, box_rows, row", [(64, 40, 32, 16), (128, 70, 64, 64)])
def test_a_box_is_added_from_its_swizzled_place_and_rows_past_the_end_left_out(rng, hopper_or_simulator, cols, rows,
                                                                               box_rows, row):
    """A float32 box of rows row .. row + box_rows (past the end for some) added to head 1 of 3 by
    ``tma_reduce_add_3d``: each 16-byte chunk read from its swizzled place (chunk c of row r at c XOR r % 8); the
    other heads, and the rows past the end (the next head's first rows), unchanged."""
    x = rng.standard_normal((3, rows, cols)).astype(np.float32)  # (heads, rows, cols), never zeros
    box = rng.standard_normal((cols // 32, box_rows, 32)).astype(np.float32)  # (boxes, rows, 32 columns)
    src = np.zeros(box.size, np.float32)
    for b in range(cols // 32):
        for r in range(box_rows):
            for c in range(8):  # 16-byte chunks of 4 floats
                place = b * box_rows * 32 + r * 32 + (c ^ (r % 8)) * 4
                src[place:place + 4] = box[b, r, 4 * c:4 * c + 4]
    tmap = TensorMap(cols, rows, 3, box_rows, element_bytes=4)
    flat = cuda.to_device(x.reshape(-1))
    maps = tensor_maps([tmap], [flat])
    make_reduce_kernel(box_rows, cols // 32)[1, 128, 0, src.nbytes + ALIGN](maps, cuda.to_device(src), row, 1)
    want = x.copy()
    inside = min(box_rows, rows - row)
    want[1, row:row + inside] += box[:, :inside].transpose(1, 0, 2).reshape(inside, cols)
    got = flat.copy_to_host().reshape(x.shape)
    assert np.array_equal(got, want), np.argwhere(got != want)[:8]


def turns_kernel(warpgroups: int, rounds: int):
    """``warpgroups`` warpgroups take ``rounds`` turns each through named barriers whose ids are given at run time,
    as kernel v10's consumers do: warpgroup w waits on barrier 1 + w (256 threads: its own and the previous
    warpgroup's arrivals) and then lets the next one go; warpgroup 0 lets itself go first. In its turn, each
    warpgroup's first thread writes the warpgroup's number at the next place of ``order``."""
    wait = tma.named_barrier_by_id(256)
    let_go = tma.named_barrier_by_id(256, arrive_only=True)

    @cuda.jit
    def turns(order):
        count = cuda.shared.array(1, uint32)
        tid = cuda.threadIdx.x
        w = uint32(tid // 128)
        if tid == 0:
            count[0] = uint32(0)
        cuda.syncthreads()  # the count is zero before any turn
        if w == 0:
            let_go(uint32(1))
        for _ in range(rounds):
            wait(uint32(1) + w)
            if tid % 128 == 0:
                order[count[0]] = w
                count[0] += uint32(1)
            let_go(uint32(1) + (w + uint32(1)) % uint32(warpgroups))

    return turns


@pytest.mark.parametrize("warpgroups", [2, 3])
def test_named_barriers_take_turns(hopper_or_simulator, warpgroups):
    """The warpgroups' turns come in order, round after round: 0, 1, (2,) 0, 1, ..."""
    rounds = 3
    order = np.full(warpgroups * rounds, 99, np.uint32)
    turns_kernel(warpgroups, rounds)[1, 128 * warpgroups](order)
    assert order.tolist() == list(range(warpgroups)) * rounds


# --- the emulation's own rules ----------------------------------------------------------------------------------

simulator_only = pytest.mark.skipif(not simulator_enabled(), reason="checks the simulator's emulation")


@simulator_only
def test_an_arrival_beyond_the_count_is_an_error():
    @cuda.jit
    def twice(out):
        smem = shared_words()
        bar = ptx.shared_address(smem, uint64(0))
        tma.mbarrier_init(bar, uint32(1))
        tma.arrive_expect_tx(bar, uint32(64))  # one arrival expected: this one, with 64 bytes still to come
        tma.arrive(bar)

    with pytest.raises(RuntimeError, match="an arrival beyond its count"):
        twice[1, 1, 0, 64](np.zeros(1, np.uint32))


@pytest.fixture
def quick_stall(monkeypatch):
    """The emulation calls a block deadlocked after 0.5 s of every thread waiting (not 10 s), looking every 0.05 s."""
    from tinyflash.gpu import tma_emulation

    monkeypatch.setattr(tma_emulation, "STALL_SECONDS", 0.5)
    monkeypatch.setattr(tma_emulation, "LOOK_SECONDS", 0.05)


@simulator_only
def test_a_wait_that_never_ends_is_reported(quick_stall):
    """Bytes announced that no copy completes: the wait raises once the block is stalled instead of hanging."""

    @cuda.jit
    def stuck(out):
        smem = shared_words()
        bar = ptx.shared_address(smem, uint64(0))
        tma.mbarrier_init(bar, uint32(1))
        tma.arrive_expect_tx(bar, uint32(1024))
        tma.wait(bar, uint32(0))

    with pytest.raises(RuntimeError, match="a deadlock, a wrong parity"):
        stuck[1, 1, 0, 64](np.zeros(1, np.uint32))


@simulator_only
def test_a_named_barrier_short_of_threads_is_reported(quick_stall):
    """64 threads meet at a barrier of 96: every thread waits, and the wait raises instead of hanging."""
    meet = tma.named_barrier(1, 96)

    @cuda.jit
    def short(out):
        meet()

    with pytest.raises(RuntimeError, match="named barrier 1 of 96 threads: 64 arrived.*a deadlock"):
        short[1, 64](np.zeros(1, np.uint32))


def slow_arrival_kernel(seconds: float):
    """Warp 1 waits on an mbarrier, then at a named barrier, while warp 0 works for ``seconds`` before it arrives
    at both: a slow block, not a stalled one."""
    import time

    meet = tma.named_barrier(1, 64)

    @cuda.jit
    def slow(out):
        smem = shared_words()
        bar = ptx.shared_address(smem, uint64(0))
        tid = cuda.threadIdx.x
        if tid == 0:
            tma.mbarrier_init(bar, uint32(32))
        cuda.syncthreads()
        if tid < 32:
            end = time.monotonic() + seconds
            while time.monotonic() < end:  # work (the simulator runs kernels as Python)
                pass
            tma.arrive(bar)
        else:
            tma.wait(bar, uint32(0))
        meet()
        out[tid] = tid

    return slow


@simulator_only
def test_a_slow_block_is_not_a_deadlock(quick_stall):
    """Warp 1 waits four times the stall limit for warp 0, which is working: no error."""
    out = np.zeros(64, np.uint32)
    slow_arrival_kernel(2.0)[1, 64](out)
    assert out.tolist() == list(range(64))


@simulator_only
def test_a_box_onto_a_barrier_is_an_error(rng):
    x = rng.standard_normal((1, 16, 64)).astype(np.float16)
    tmap = TensorMap(64, 16, 1, 16)
    maps = tensor_maps([tmap], [x.reshape(-1)])

    @cuda.jit
    def overlap(maps):
        smem = shared_words()
        base = ptx.shared_address(smem, uint64(0))
        tma.mbarrier_init(base + uint32(1024), uint32(1))
        tma.arrive_expect_tx(base + uint32(1024), uint32(2048))
        tma.tma_load_3d(base, maps, uint64(0), int32(0), int32(0), int32(0), base + uint32(1024))

    with pytest.raises(IndexError, match="overwrite an mbarrier"):
        overlap[1, 1, 0, 4096](maps)
