"""Launching a compiled kernel straight through the CUDA driver: the host's side of a fast call.

A launch through numba, ``kernel[grid, block, stream, smem](*args)``, does in Python, at every call:
find the compiled kernel for the arguments' types (typing each argument), make sure of the current
context, turn each array into a numba device array (for a PyTorch tensor or a CuPy array, by
reading its ``__cuda_array_interface__``) and flatten it into the fields of numba's array structure.
On the H200 that is tens of microseconds per launch (``benchmarks/launch_overhead.py`` measures
it), against kernels that take 20 µs (a decode step) to 1 ms (the tensor-core kernel at N = 4,096).

:class:`DriverKernel` compiles the kernel once for a fixed signature, and a call only writes the
arguments' bytes and calls the driver::

    params                  one 8-byte slot per kernel parameter, in numba's order (below)
    pointers[i]             the address of slot i: where the driver copies parameter i from
    cuLaunchKernel(kernel, grid, block, shared bytes, stream, pointers)

numba passes a 1-D array as 7 parameters, the fields of its array structure: meminfo and parent
(unused inside a kernel: 0), nitems, itemsize, data (the address), shape[0] and strides[0]. A
scalar is one parameter of its own type. (numba-cuda's ``_Kernel._prepare_args`` writes the same
list; ``tests/test_driver_launch.py`` compares the two.)

An array argument may be a PyTorch CUDA tensor, a CuPy array, a numba device array or any other
C-contiguous ``__cuda_array_interface__`` array, of any dtype: the kernel sees its bytes as the
signature's element type (nitems = bytes / itemsize). The caller keeps its arrays alive until the
kernel has run, and gives addresses aligned as the kernel needs (16 bytes for ``cp.async``).
Launches go to stream 0, as numba's do, unless the call names another (the host wrappers pass the
caller's library's current stream, ``gpu.arrays.current_stream``). Only for a GPU:
on numba's simulator, launch the dispatcher.

A launch that must overlap the end of the kernel before it on the stream (programmatic dependent launch, Hopper
on: decode's combine kernel) goes through ``cuLaunchKernelEx`` with that attribute instead (:class:`LaunchConfig`).

The kernel's code comes from the disk cache (``gpu/kernel_cache.py``) when a process before compiled
it, else from numba, which compiles it (seconds for the tensor-core kernels) and the cache keeps it;
either way it is loaded as a module of its own (``cuModuleLoadData``) and launched by its handle.
"""

from __future__ import annotations

import ctypes
import math
import struct
import threading
from dataclasses import dataclass

import numpy as np

from ..hardware import STATIC_SMEM_PER_BLOCK
from .arrays import library
from .launch import by_name, parameters

SLOT = 8  # bytes per parameter slot: every parameter here is at most 8 bytes


def flat_type(dtype):
    """numba's type of a flat, C-contiguous array of ``dtype`` (a kernel signature's array argument)."""
    from numba.cuda import types

    return types.Array(getattr(types, np.dtype(dtype).name), 1, "C")  # types.float16, types.uint32, ...


def slot_codes(ty) -> list[str]:
    """The ``struct`` codes of the parameters that numba passes for one argument of numba type ``ty``."""
    from numba.cuda import types

    if isinstance(ty, types.Array):
        if ty.ndim != 1 or ty.layout != "C":
            raise TypeError(f"driver launches take C-contiguous 1-D arrays (the kernels' flat arrays); got {ty}")
        return ["Q", "Q", "q", "q", "Q", "q", "q"]  # meminfo, parent, nitems, itemsize, data, shape, strides
    if isinstance(ty, types.Boolean):
        return ["?"]
    if isinstance(ty, types.Integer):
        code = {8: "b", 16: "h", 32: "i", 64: "q"}[ty.bitwidth]  # signed; upper case is unsigned
        return [code if ty.signed else code.upper()]
    if isinstance(ty, types.Float) and ty.bitwidth in (32, 64):
        return ["f" if ty.bitwidth == 32 else "d"]
    raise TypeError(f"driver launches take 1-D arrays, booleans, integers and float32/64; got {ty}")


def slot_format(argument_types) -> str:
    """One ``struct`` format for all parameters, each value at the start of its own 8-byte slot."""
    codes = [c for ty in argument_types for c in slot_codes(ty)]
    return "<" + "".join(c + "x" * (SLOT - struct.calcsize("<" + c)) for c in codes)


def address_and_bytes(x) -> tuple[int, int]:
    """(device address, size in bytes) of a C-contiguous device array of any library."""
    lib = library(x)
    if lib == "torch":
        if not (x.is_cuda and x.is_contiguous()):
            raise ValueError(f"expected a contiguous CUDA tensor; got device {x.device}, strides {tuple(x.stride())}")
        return x.data_ptr(), x.nbytes
    if lib == "cupy":
        if not x.flags.c_contiguous:
            raise ValueError(f"expected a C-contiguous CuPy array; got strides {x.strides}")
        return x.data.ptr, x.nbytes
    cai = x.__cuda_array_interface__  # numba device arrays and any other library's
    itemsize = np.dtype(cai["typestr"]).itemsize
    shape = tuple(cai["shape"])
    if cai.get("strides") is not None and math.prod(shape) > 1:
        contiguous = [itemsize * math.prod(shape[i + 1:]) for i in range(len(shape))]
        if any(s != c for s, c, n in zip(cai["strides"], contiguous, shape) if n > 1):
            raise ValueError(f"expected a C-contiguous device array; got shape {shape}, strides {cai['strides']}")
    return cai["data"][0] or 0, itemsize * math.prod(shape)


def item_sizes(argument_types) -> tuple:
    """For each argument: the element size in bytes of an array, 0 for a scalar."""
    from numba.cuda import types

    return tuple(ty.dtype.bitwidth // 8 if isinstance(ty, types.Array) else 0 for ty in argument_types)


def param_values(argument_types, args, sizes: tuple | None = None) -> list:
    """The parameters' values for ``args``, flattened the way numba flattens them (``sizes``:
    :func:`item_sizes` of ``argument_types``, if the caller keeps it)."""
    values = []
    for itemsize, a in zip(sizes or item_sizes(argument_types), args, strict=True):
        if itemsize:  # an array: numba's 7 fields
            address, nbytes = address_and_bytes(a)
            nitems = nbytes // itemsize
            values += [0, 0, nitems, itemsize, address, nitems, itemsize]
        else:
            values.append(a)
    return values


class PackedParams:
    """All parameters of one launch in one buffer, and the array of their addresses the driver reads."""

    def __init__(self, fmt: str):
        self.fmt = fmt
        n = struct.calcsize(fmt) // SLOT
        self.buffer = ctypes.create_string_buffer(max(1, n) * SLOT)
        base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * max(1, n))(*(base + SLOT * i for i in range(n)))
        self.address = ctypes.addressof(self.pointers)

    def pack(self, values) -> int:
        """Write ``values`` into the slots; returns the address of the pointer array (cuLaunchKernel's kernelParams)."""
        struct.pack_into(self.fmt, self.buffer, 0, *values)
        return self.address


def dims(shape) -> tuple:
    """A grid or block as cuLaunchKernel takes it, (x, y, z): from an int or a sequence of up to three ints, as
    numba takes them (missing dims are 1)."""
    return (int(shape), 1, 1) if isinstance(shape, (int, np.integer)) else (tuple(shape) + (1, 1))[:3]


class DriverKernel:
    """``dispatcher`` compiled once for ``signature`` (a tuple of numba types), with ``smem_bytes``
    of dynamic shared memory allowed, launched through ``cuLaunchKernel``.

    ``k(grid, block, smem_bytes, *args)`` launches now; ``k.bind(grid, block, smem_bytes, *args)``
    packs the parameters once and returns a function that only launches (for a benchmark, or a
    decode loop that calls the same kernel on the same buffers).
    """

    def __init__(self, dispatcher, signature: tuple, smem_bytes: int = 0):
        from cuda.bindings import driver

        self._driver = driver
        self.dispatcher = dispatcher
        self.signature = signature
        self.argument_types = tuple(signature)  # the types numba compiles for, and flattens as it passes them
        self._sizes = item_sizes(self.argument_types)
        self.handle = self._load_or_compile()  # the driver's function handle
        if smem_bytes > STATIC_SMEM_PER_BLOCK:
            attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            self._check(driver.cuFuncSetAttribute(self.handle, attr, int(smem_bytes))[0], "cuFuncSetAttribute")
        self.format = slot_format(self.argument_types)
        self._params = PackedParams(self.format)
        self._lock = threading.Lock()  # the slots are shared: one launch writes them at a time
        self._stream0 = driver.CUstream(0)

    def _load_or_compile(self):
        """The kernel's handle: its cubin from the disk cache, loaded as a module of this context; else compiled
        by numba (and its cubin kept for the next process), loaded the same way."""
        from numba import cuda

        from . import kernel_cache

        device = cuda.get_current_device()  # and numba's context, made current on this thread
        cuda.current_context()
        key, parts = kernel_cache.kernel_key(self.dispatcher, self.signature, device.compute_capability)
        found = kernel_cache.load(key)
        if found is not None:
            function = self._load(*found, strict=False)  # a damaged cubin: compile as without a cache
            if function is not None:
                kernel_cache.stats["hits"] += 1
                return function
        kernel_cache.stats["misses"] += 1
        library = self.dispatcher.compile(self.argument_types).library  # numba's compiled kernel
        cubin = kernel_cache.cubin_bytes(library.get_cubin())
        kernel_cache.store(key, cubin, library._entry_name, parts)
        return self._load(cubin, library._entry_name)

    def _load(self, cubin: bytes, entry: str, strict: bool = True):
        """``entry`` of ``cubin`` loaded as a module of its own (kept as long as this object); None if the driver
        refuses and not ``strict``, else its error."""
        driver = self._driver
        err, module = driver.cuModuleLoadData(cubin)
        if err == driver.CUresult.CUDA_SUCCESS:
            err, function = driver.cuModuleGetFunction(module, entry.encode())
            if err == driver.CUresult.CUDA_SUCCESS:
                self._module = module
                return function
        if strict:
            self._check(err, "loading the compiled kernel (cuModuleLoadData, cuModuleGetFunction)")
        return None

    def _check(self, err, what: str) -> None:
        if err != self._driver.CUresult.CUDA_SUCCESS:
            _, name = self._driver.cuGetErrorName(err)
            raise RuntimeError(f"{what} failed: {name.decode() if name else err}")

    def _launch(self, grid, block, smem_bytes: int, params_address: int, stream: int = 0) -> None:
        (gx, gy, gz), (bx, by, bz) = dims(grid), dims(block)
        handle = self._driver.CUstream(int(stream)) if stream else self._stream0
        args = (self.handle, gx, gy, gz, bx, by, bz, smem_bytes, handle, params_address, 0)
        checked_launch(self._driver, "cuLaunchKernel", args, grid, block, smem_bytes)

    def arguments(self, values: dict) -> tuple:
        """The kernel's arguments in the order of its parameters, taken from ``values`` by name."""
        return by_name(self.dispatcher, values)

    def __call__(self, grid, block, smem_bytes: int, *args, stream: int = 0) -> None:
        values = param_values(self.argument_types, args, self._sizes)
        with self._lock:
            self._launch(grid, block, smem_bytes, self._params.pack(values), stream)

    def bind(self, grid, block, smem_bytes: int, *args, after_previous: bool = False):
        """``launch(stream=0)``: this kernel on ``args`` (packed now, once), on ``stream`` (a CUstream
        handle as an int, e.g. CuPy's ``stream.ptr``; 0 is the default stream); ``after_previous``: launched
        with programmatic stream serialization (:class:`LaunchConfig`)."""
        params = PackedParams(self.format)
        address = params.pack(param_values(self.argument_types, args))
        if after_previous:
            config = LaunchConfig(self, grid, block, smem_bytes)

            def launch(stream: int = 0) -> None:
                config.launch(address, stream)
        else:
            def launch(stream: int = 0) -> None:
                self._launch(grid, block, smem_bytes, address, stream)

        launch.params = params  # keeps the packed parameters alive as long as the function
        return launch

    def _attribute(self, name: str) -> int:
        err, value = self._driver.cuFuncGetAttribute(getattr(self._driver.CUfunction_attribute, name), self.handle)
        self._check(err, "cuFuncGetAttribute")
        return int(value)

    @property
    def registers(self) -> int:
        """Registers per thread of the compiled kernel."""
        return self._attribute("CU_FUNC_ATTRIBUTE_NUM_REGS")

    @property
    def local_bytes(self) -> int:
        """Local memory per thread (registers spilled), in bytes."""
        return self._attribute("CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES")


@dataclass(frozen=True)
class GridLaunch:
    """A :class:`DriverKernel` with its grid, threads, shared memory and trailing scalar arguments fixed
    (they depend only on a problem's shape): a call passes the arrays, checked and packed at each call."""

    kernel: DriverKernel
    grid: tuple
    threads: int
    smem_bytes: int
    scalars: tuple  # the arguments after the arrays, in the kernel's order

    @classmethod
    def sized(cls, kernel: DriverKernel, grid, threads: int, smem_bytes: int, **scalars) -> "GridLaunch":
        """A launch whose calls pass the kernel's leading array parameters; its other parameters, ``scalars``
        by name, fixed now."""
        names = parameters(kernel.dispatcher)
        trailing = names[len(names) - len(scalars):]
        if set(trailing) != set(scalars):
            raise TypeError(f"{kernel.dispatcher.py_func.__name__}'s parameters after its arrays are "
                            f"{', '.join(trailing)}; got {', '.join(scalars)}")
        return cls(kernel, tuple(grid), threads, smem_bytes, tuple(scalars[n] for n in trailing))

    def __call__(self, *arrays, stream: int = 0) -> None:
        """Launch on ``arrays`` (the kernel's leading parameters), on ``stream`` (a CUstream handle as an int;
        0: the default stream)."""
        self.kernel(self.grid, self.threads, self.smem_bytes, *arrays, *self.scalars, stream=stream)


def checked_launch(driver, function: str, args: tuple, grid, block, smem_bytes: int) -> None:
    """``driver.<function>(*args)`` (cuLaunchKernel or cuLaunchKernelEx; the driver copies the parameters before it
    returns), made again once numba's context is current where the thread had none; a failure is a RuntimeError
    naming the driver's error and the launch's grid, block and shared memory."""
    launch = getattr(driver, function)
    (err,) = launch(*args)
    if err == driver.CUresult.CUDA_ERROR_INVALID_CONTEXT:  # a thread where numba made no context current
        from numba import cuda

        cuda.current_context()
        (err,) = launch(*args)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise RuntimeError(f"{function} failed: {name.decode() if name else err} (grid {grid}, block {block}, "
                           f"{smem_bytes} bytes of shared memory)")


class LaunchConfig:
    """A launch of ``kernel`` through ``cuLaunchKernelEx`` with programmatic stream serialization: the kernel may
    start before the kernel launched before it on the same stream has ended (once that kernel's blocks have
    ended, or called ``griddepcontrol.launch_dependents``), so that the driver's work for the launch and the start
    of its blocks overlap the end of the kernel before. The kernel must wait (``ptx.wait_for_prior_grids``)
    before it reads what that kernel writes. Compute capability 9.0 on. The ``CUlaunchConfig`` is made once;
    :meth:`launch` sets the stream and launches."""

    def __init__(self, kernel: "DriverKernel", grid, block, smem_bytes: int):
        driver = kernel._driver
        self.kernel, self.driver = kernel, driver
        after = driver.CUlaunchAttribute()
        after.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        after.value.programmaticStreamSerializationAllowed = 1
        c = driver.CUlaunchConfig()
        (c.gridDimX, c.gridDimY, c.gridDimZ), (c.blockDimX, c.blockDimY, c.blockDimZ) = dims(grid), dims(block)
        c.sharedMemBytes = int(smem_bytes)
        c.attrs, c.numAttrs = [after], 1
        self.config, self.shape = c, (grid, block, smem_bytes)

    def launch(self, params_address: int, stream: int = 0) -> None:
        """Launch with the parameters at ``params_address`` on ``stream`` (a CUstream handle as an int; 0: the
        default stream); a failed launch is a RuntimeError."""
        c = self.config
        c.hStream = self.driver.CUstream(int(stream))
        checked_launch(self.driver, "cuLaunchKernelEx", (c, self.kernel.handle, params_address, 0), *self.shape)


class PackedLaunch:
    """A :class:`DriverKernel` with every parameter packed once but the addresses of its arrays named in
    ``moving``: grid, threads, shared memory, scalars, and the size of every array (fixed by a problem's shape).
    A call writes those addresses into their slots (``slots[where[i]] = address``) and launches
    (:meth:`launch`); nothing else is packed again.

    ``args`` maps each parameter to its value; an array in ``moving`` may be a :class:`Bytes` (its size
    only). The slots are shared: a caller writes them and launches under one lock (the driver copies the
    parameters before ``cuLaunchKernel`` returns, so the next call may write them again at once).
    ``after_previous``: launched with programmatic stream serialization (:class:`LaunchConfig`)."""

    def __init__(self, kernel: DriverKernel, grid, threads: int, smem_bytes: int, args: dict, moving: tuple,
                 after_previous: bool = False):
        self.kernel = kernel
        names = parameters(kernel.dispatcher)
        self.params = PackedParams(kernel.format)
        self.params.pack(param_values(kernel.argument_types, [args[n] for n in names], kernel._sizes))
        self.slots = (ctypes.c_uint64 * (len(self.params.buffer) // SLOT)).from_buffer(self.params.buffer)
        first, start = {}, 0  # each parameter's first slot: an array takes 7 (its address is the 5th), a scalar 1
        for name, itemsize in zip(names, kernel._sizes):
            first[name], start = start, start + (7 if itemsize else 1)
        self.where = tuple(first[n] + 4 for n in moving)
        gx, gy, gz = (tuple(grid) + (1, 1))[:3]
        self.head = (kernel.handle, gx, gy, gz, threads, 1, 1, smem_bytes)  # cuLaunchKernel's leading arguments
        self.grid, self.threads, self.smem_bytes = tuple(grid), threads, smem_bytes
        self.config = LaunchConfig(kernel, grid, threads, smem_bytes) if after_previous else None

    def launch(self, stream: int = 0):
        """Launch with the slots as they are, on ``stream`` (a CUstream handle as an int; 0: the default
        stream); a failed launch is a RuntimeError."""
        if self.config is not None:
            return self.config.launch(self.params.address, stream)
        driver = self.kernel._driver
        checked_launch(driver, "cuLaunchKernel", (*self.head, driver.CUstream(stream), self.params.address, 0),
                       self.grid, self.threads, self.smem_bytes)


class Bytes:
    """A stand-in for a device array of ``nbytes`` bytes that does not exist yet (address 0): what
    :class:`PackedLaunch` packs for an array whose address every call writes."""

    def __init__(self, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (int(nbytes),), "typestr": "|u1", "data": (0, False), "version": 3}


_CACHE: dict = {}


def current_device() -> int:
    """The id of numba's current device (the one whose context a kernel is loaded into and launched in)."""
    from numba import cuda

    return cuda.get_current_device().id


def driver_kernel(dispatcher, signature: tuple, smem_bytes: int = 0) -> DriverKernel:
    """The :class:`DriverKernel` of ``dispatcher`` for ``signature`` on the current device, compiled on first use
    and kept (one per device: a kernel is loaded into one device's context).

    Looked up by the signature's identity (a module constant, or a cached function's result), not
    its value: hashing a tuple of numba types costs tens of µs, at every call."""
    key = (dispatcher, id(signature), smem_bytes, current_device())
    if key not in _CACHE:
        _CACHE[key] = DriverKernel(dispatcher, signature, smem_bytes)  # it holds the signature: the id stays unique
    return _CACHE[key]
