"""The host's side of TMA: tensor maps, what a kernel's ``tma.tma_load_3d`` copies are read through.

A tensor map (CUDA's ``CUtensorMap``, 128 opaque bytes) holds a tensor's global address, its shape and strides,
the box one copy moves and the swizzle it lands in. The driver encodes it (``cuTensorMapEncodeTiled``); numba
has no ``__grid_constant__`` kernel parameter, so the kernels get their maps in a global array of 16 uint64
words each (``tma.MAP_WORDS``), which the copying thread makes visible to the copy engine (``tma.acquire_map``).

The maps here are 3-D, over a (heads, rows, columns) array of 16-bit elements (Q, K or V, flat, as the host
wrappers pass them): columns innermost, rows of ``columns · 2`` bytes, heads of ``rows`` rows. A box is 64
columns (128 bytes: the most the 128-byte swizzle takes) × ``box_rows`` rows × one head; a head of d = 128 is
two boxes side by side (d = 256: four), which is the layout of ``tinyflash.warpgroup_tile``'s tiles (d / 64
pieces of 64 columns, one after the other).
Rows past the end of a head are read as zeros: a ragged last tile needs no code. A map may take the 64-byte
swizzle instead (``swizzle_bytes=64``: boxes of 32 16-bit columns, 64-byte rows whose 16-byte chunks are permuted
by bits 7-8 of their address: the FP8 kernel's rows of 64 e4m3 bytes). A map of float32 elements
(``element_bytes=4``: the backward's dQ accumulator, which ``tma.tma_reduce_add_3d`` adds to) has boxes of 32
columns, 128 bytes too; rows past the end of a head are left alone.

**Maps hold addresses.** A map is for one array at one address, and a call's arrays are new ones (or the same
memory again: PyTorch's allocator hands out the same blocks over and over). :class:`MapCache` keeps the maps,
copied to the GPU, for the last calls' addresses: a call whose addresses it has seen pays a dictionary look-up;
another encodes its maps (a driver call each, on the host) and copies them to the GPU. FlashAttention-3 encodes
its maps at every call and passes them as ``__grid_constant__`` parameters, which costs no copy. While a stream
captures a CUDA graph neither an allocation of numba's nor a copy from the host is allowed, a graph's tensors
are new ones (from its own memory pool), and the graph may be replayed long after the cache has dropped a map:
there, a small kernel writes the maps into memory of the inputs' library, with the words as its parameters,
and the graph keeps them (:func:`captured_maps`).

**On numba's simulator** there is no driver and the map's bytes are not documented: :meth:`TensorMap.simulated`
keeps the map's Python description (this class, and the array itself) and puts its number in the words the
kernel gets; ``tma_emulation`` finds it there and copies what the hardware would.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from numba import cuda
from numba.cuda import types

from .runtime import simulator_enabled

BOX_COLUMNS = 64  # 16-bit elements of a box's row: 128 bytes, the 128-byte swizzle's row
MAX_BOX_ROWS = 256  # the driver's limit on each dimension of a box
ELEMENT_BYTES = 2
SIMULATED = 0x7E45_0001_7E45_0001  # the first word of a simulated map's 16, then its number
MAP_WORDS = 16


@dataclass(frozen=True)
class TensorMap:
    """A 3-D map over ``heads`` × ``rows`` × ``columns`` elements of ``element_bytes`` bytes (2: 16-bit, 4:
    float32), boxes of ``swizzle_bytes`` bytes of columns × ``box_rows`` rows × 1 head, swizzled by rows of that
    many bytes (128, or 64 for 16-bit elements), zeros out of bounds."""

    columns: int
    rows: int
    heads: int
    box_rows: int
    element_bytes: int = ELEMENT_BYTES
    swizzle_bytes: int = 128

    def __post_init__(self):
        if self.swizzle_bytes not in (64, 128) or (self.swizzle_bytes == 64 and self.element_bytes != 2):
            raise ValueError(f"a tensor map swizzles rows of 128 bytes, or of 64 bytes of 16-bit elements; got {self}")
        if (self.element_bytes not in (2, 4) or self.columns % self.box_columns or not 0 < self.box_rows <= MAX_BOX_ROWS
                or self.rows < 1 or self.heads < 1):
            raise ValueError(f"a tensor map needs 2- or 4-byte elements, columns a multiple of {self.box_columns} (a "
                             f"box's {self.swizzle_bytes} bytes), 1 .. {MAX_BOX_ROWS} rows a box and a non-empty "
                             f"tensor; got {self}")

    @property
    def box_columns(self) -> int:  # a box's row: the swizzle's row, 128 bytes (64 with swizzle_bytes=64)
        return self.swizzle_bytes // self.element_bytes

    @property
    def box_bytes(self) -> int:  # what one copy completes on its mbarrier (out-of-bounds zeros included)
        return self.box_columns * self.box_rows * self.element_bytes

    def encode(self, address: int) -> bytes:
        """The 128 bytes of the CUtensorMap for the array at device ``address`` (16-byte aligned), by the driver.
        (Data type uint16 for 16-bit elements: the copy moves 16-bit patterns, float16 or bfloat16 alike;
        out-of-bounds zeros are +0.0 in both. float32 for 4-byte ones: a reduce-add adds floats.)"""
        from cuda.bindings import driver

        u64, u32 = driver.cuuint64_t, driver.cuuint32_t
        row_bytes, head_bytes = self.columns * self.element_bytes, self.rows * self.columns * self.element_bytes
        kind = driver.CUtensorMapDataType
        err, tmap = driver.cuTensorMapEncodeTiled(
            kind.CU_TENSOR_MAP_DATA_TYPE_UINT16 if self.element_bytes == 2 else kind.CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
            3, address, [u64(self.columns), u64(self.rows), u64(self.heads)],  # sizes, innermost first
            [u64(row_bytes), u64(head_bytes)],  # strides of the outer two dimensions, in bytes
            [u32(self.box_columns), u32(self.box_rows), u32(1)], [u32(1)] * 3,
            driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B if self.swizzle_bytes == 128 else
            driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
            driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuTensorMapEncodeTiled failed for {self} at {address:#x}: {err}")
        import ctypes

        return ctypes.string_at(tmap.getPtr(), 128)

    def simulated(self, array) -> np.ndarray:
        """On the simulator: the 16 words of a map over ``array`` (its elements, heads · rows · columns of them):
        a marker and the number under which this description and the array are kept."""
        elements = np.asarray(array).reshape(-1).view(np.uint16 if self.element_bytes == 2 else np.float32)
        if elements.size < self.heads * self.rows * self.columns:
            raise ValueError(f"{self} is larger than its array of {elements.size} {8 * self.element_bytes}-bit elements")
        number = next(_numbers)
        if len(_SIMULATED_MAPS) >= 4096:  # a launch on the simulator is over when it returns: old maps are unused
            _SIMULATED_MAPS.clear()
        _SIMULATED_MAPS[number] = (self, elements)
        words = np.zeros(MAP_WORDS, np.uint64)
        words[0], words[1] = SIMULATED, number
        return words


_numbers = itertools.count(1)
_SIMULATED_MAPS: dict = {}  # number -> (TensorMap, its array's 16-bit elements)


def simulated_map(words) -> tuple:
    """(TensorMap, elements) of the simulated map whose 16 words are ``words`` (``tma_emulation`` reads them)."""
    if int(words[0]) != SIMULATED or int(words[1]) not in _SIMULATED_MAPS:
        raise ValueError("not a tensor map made by TensorMap.simulated (or one forgotten since): the kernel was "
                         "given the wrong words, or the wrong index into its maps")
    return _SIMULATED_MAPS[int(words[1])]


def device_address(array) -> int:
    """The device address of a CUDA array interface array (CuPy, numba, PyTorch: its ``data_ptr()``, which costs
    less than building its array interface)."""
    pointer = getattr(array, "data_ptr", None)
    return int(pointer()) if callable(pointer) else int(array.__cuda_array_interface__["data"][0])


def tensor_maps(maps, arrays):
    """The maps for ``arrays`` (one each, in order), as the kernel gets them: a device array of 16 words per map
    (a numba device array; on the simulator a NumPy array of :meth:`TensorMap.simulated` words)."""
    if simulator_enabled():
        return np.concatenate([m.simulated(a) for m, a in zip(maps, arrays)])
    from numba import cuda

    data = b"".join(m.encode(device_address(a)) for m, a in zip(maps, arrays))
    return cuda.to_device(np.frombuffer(data, np.uint64))  # 256-byte aligned: each map 64-byte aligned


def _store_map(dst, at, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15):
    """One map's 16 words into dst[at .. at + 15], by one thread: the words are the launch's parameters."""
    if cuda.threadIdx.x == 0:
        words = (w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15)
        for i in range(16):
            dst[at + i] = words[i]


_STORE_MAP = cuda.jit(_store_map)
_STORE_MAP_SIGNATURE = (types.Array(types.int64, 1, "C"), types.int64) + (types.int64,) * MAP_WORDS


def _store_map_kernel():
    """:func:`_store_map` compiled and loaded on the current device (``driver_kernel`` keeps one per device; the
    disk cache keeps its cubin)."""
    from .driver_launch import driver_kernel

    return driver_kernel(_STORE_MAP, _STORE_MAP_SIGNATURE)


def stream_capturing(stream: int) -> bool:
    """Whether ``stream`` (a CUstream handle as an int; 0: the default stream) is capturing a CUDA graph."""
    from cuda.bindings import driver

    err, status = driver.cuStreamIsCapturing(driver.CUstream(int(stream)))
    return err == driver.CUresult.CUDA_SUCCESS and status != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def captured_maps(maps, arrays, stream: int):
    """The maps for ``arrays`` written on ``stream`` while it captures a CUDA graph: in memory of the arrays'
    library (PyTorch's allocator gives a capture memory of the graph's own pool), by one small kernel per map
    whose parameters are the map's words, which the graph keeps. No allocation of numba's and no copy from the
    host, which a capture refuses."""
    from .arrays import empty

    words = np.frombuffer(b"".join(m.encode(device_address(a)) for m, a in zip(maps, arrays)), np.int64)
    out = empty(arrays[0], words.size, np.int64)
    store = _store_map_kernel()
    for i in range(0, words.size, MAP_WORDS):
        store(1, 1, 0, out, i, *(int(w) for w in words[i:i + MAP_WORDS]), stream=stream)
    return out


class MapCache:
    """Tensor maps on the GPU for the addresses of the last calls of one launch plan (module docstring): at most
    ``size``; when full, the device is synchronised (a kernel in flight may still read the maps) and it starts
    again empty. A call on a stream that captures a CUDA graph gets maps written into the graph
    (:func:`captured_maps`), neither taken from the cache nor kept: a graph's tensors are new ones (from its own
    memory pool), and a graph may outlive the cache's entries (one query of the driver, about a µs, per call)."""

    def __init__(self, maps, size: int = 64):
        self.maps, self.size, self._found = tuple(maps), size, {}
        _store_map_kernel()  # loaded now: a capture cannot load a module

    def __call__(self, *arrays, stream: int = 0):
        if stream_capturing(stream):  # the graph gets maps of its own: kept ones may be freed while it lives
            return captured_maps(self.maps, arrays, stream)
        key = tuple(map(device_address, arrays))
        found = self._found.get(key)
        if found is None:
            if len(self._found) >= self.size:
                from numba import cuda

                cuda.synchronize()
                self._found.clear()
            found = self._found[key] = tensor_maps(self.maps, arrays)
        return found
