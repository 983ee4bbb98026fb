"""Device arrays in and out of the kernels.

A kernel reads each input as one flat, C-contiguous array on the GPU and writes its outputs to flat
arrays. The host wrapper of a stage accepts:

* NumPy arrays: copied to the GPU, results copied back (NumPy in, NumPy out);
* CuPy arrays, numba device arrays, PyTorch CUDA tensors, or anything else with
  ``__cuda_array_interface__``: used where they are, results allocated by the same library
  (CuPy in, CuPy out; PyTorch in, PyTorch out; anything else: numba device arrays).

PyTorch is never imported unless the caller passed a tensor. The ways in and out:

* :func:`numba_flat`: an input or output as a launch through numba takes it;
* :func:`dense`: an array as a launch through the driver reads it (its address and size);
* :func:`to_device`: a host array copied to the GPU in the caller's library;
* :func:`empty`, :func:`zeros`: an output, allocated in the caller's library; :func:`result`: an output in the caller's form;
* :func:`bfloat16_bits`: a bfloat16 array seen as its 16-bit patterns, which numba can take;
* :func:`current_stream`: the caller's library's stream, which the launches through the driver go to;
* :func:`array_library`: for PyTorch and CuPy, the few operations a planned call makes (:class:`ArrayLibrary`),
  each one call into the library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from numba import cuda

from .elements import BFLOAT16
from .runtime import simulator_enabled


def is_device_array(x) -> bool:
    """CuPy, numba (also the simulator's), PyTorch CUDA tensors, or any other array on the GPU.
    (PyTorch and CuPy are asked directly: a PyTorch tensor builds its whole ``__cuda_array_interface__``
    each time it is read, a few µs that add up in a call made of several checks.)"""
    lib = library(x)
    if lib == "torch":
        return x.is_cuda
    if lib == "cupy":
        return True
    return hasattr(x, "__cuda_array_interface__") or bool(getattr(x, "__cuda_ndarray__", False))


_LIBRARY_OF_TYPE: dict = {}  # type -> 'cupy', 'torch' or 'numba': asked at every check, so remembered


def library(x) -> str:
    """'cupy', 'torch' or 'numba' (numba device arrays, and any other library's GPU arrays)."""
    kind = type(x)
    lib = _LIBRARY_OF_TYPE.get(kind)
    if lib is None:
        top = kind.__module__.split(".")[0]
        lib = _LIBRARY_OF_TYPE[kind] = top if top in ("cupy", "torch") else "numba"
    return lib


def numba_flat(x):
    """What a launch through numba takes: a C-contiguous, 16-byte-aligned 1-D array on the GPU. A host array is
    copied to the GPU (a numba device array); a device array is viewed flat (CuPy stays CuPy, a PyTorch tensor
    becomes a numba view of its memory), copied only if it is not contiguous or not aligned.

    The kernels index each head's (N × d) matrix inside this flat array themselves, and read tiles several
    elements at a time, which needs aligned addresses."""
    if not is_device_array(x):
        return cuda.to_device(np.ascontiguousarray(x).reshape(-1))
    flat = dense(x)
    return cuda.as_cuda_array(flat.detach().reshape(-1)) if library(flat) == "torch" else flat.reshape(flat.size)


def dense(x):
    """What a launch through the driver reads (``gpu/driver_launch.py``: the address and the size): the device
    array ``x`` itself when it is C-contiguous and 16-byte aligned (PyTorch and CuPy asked directly, in well
    under a µs), else a flat copy of it in the same library. A numba device array must be contiguous."""
    lib = library(x)
    if lib == "torch":
        if x.is_contiguous() and x.data_ptr() % 16 == 0:
            return x
        flat = x.detach().reshape(-1)  # copies only a non-contiguous tensor
        return flat if flat.data_ptr() % 16 == 0 else flat.clone()
    if lib == "cupy":
        if x.flags.c_contiguous and x.data.ptr % 16 == 0:
            return x
        import cupy

        flat = cupy.ascontiguousarray(x).reshape(-1)  # copies only a non-contiguous array
        return flat if _aligned(flat) else flat.copy()
    if not hasattr(x, "is_c_contiguous"):  # another library's array
        x = cuda.as_cuda_array(x)
    if not x.is_c_contiguous():
        raise ValueError(f"non-contiguous numba device arrays are not supported (got shape {x.shape}, strides "
                         f"{x.strides}); pass a contiguous array, or a CuPy array")
    flat = x.reshape(x.size)
    if not _aligned(flat):
        copy = cuda.device_array(flat.shape, dtype=flat.dtype)
        copy.copy_to_device(flat)
        flat = copy
    return flat


def to_device(x, like=None):
    """The host array ``x``, flat, copied to the GPU by the library of ``like`` (a device array; None: numba's).
    A small array that a kernel reads (a block table, the sequences' lengths) then lives where the call's
    outputs live (:func:`empty`): in that library's memory pool, without a numba allocation in every call."""
    lib = None if like is None else library(like)
    if lib == "cupy":
        import cupy

        return cupy.asarray(np.ascontiguousarray(x).reshape(-1))
    if lib == "torch":
        import torch

        return torch.from_numpy(np.ascontiguousarray(x).reshape(-1)).to(like.device)
    return cuda.to_device(np.ascontiguousarray(x).reshape(-1))


def _aligned(x) -> bool:
    """Whether a device array's data starts at a 16-byte boundary (always true on the simulator)."""
    return simulator_enabled() or x.__cuda_array_interface__["data"][0] % 16 == 0


_TORCH_NAMES = {np.dtype(t): np.dtype(t).name for t in (np.float16, np.float32, np.float64, np.int32, np.uint32)}


def bfloat16_bits(x):
    """A bfloat16 array (a PyTorch tensor, or an array of ml_dtypes' bfloat16) as its 16-bit patterns: the same
    memory as uint16 (int16 for PyTorch, whose unsigned 16-bit type is recent), which numba can take (it has no
    bfloat16; a kernel widens them: ``gpu/elements.py``)."""
    if library(x) == "torch":
        import torch

        return x.detach().view(torch.int16)
    return x.view(np.uint16)


def empty(like, shape, dtype=None):
    """An uninitialised device array of ``shape`` (an int: 1-D), from the library of ``like`` (a device
    array), or numba's for host inputs (``like=None``); of ``dtype``, or of ``like``'s dtype if None
    (then any dtype that library has, PyTorch's bfloat16 too). ``dtype`` 'bfloat16': ``like``'s dtype (a
    bfloat16 tensor or CuPy array), or uint16 patterns in numba's arrays (which have no bfloat16)."""
    lib = None if like is None else library(like)
    if isinstance(dtype, str) and dtype == BFLOAT16:
        dtype = None if lib in ("torch", "cupy") else np.uint16
    if lib == "cupy":
        import cupy

        return cupy.empty(shape, dtype=like.dtype if dtype is None else dtype)
    if lib == "torch":  # like.new_empty: on like's device, without parsing a device argument (µs a call)
        import torch

        dtype = like.dtype if dtype is None else getattr(torch, _TORCH_NAMES.get(dtype) or np.dtype(dtype).name)
        return like.new_empty(shape, dtype=dtype)
    return cuda.device_array(shape, dtype=dtype)


def zeros(like, shape, dtype):
    """A device array of zeros, as :func:`empty` allocates it (on ``like``'s library's current stream)."""
    lib = None if like is None else library(like)
    if lib == "cupy":
        import cupy

        return cupy.zeros(shape, dtype=dtype)
    if lib == "torch":
        import torch

        return like.new_zeros(shape, dtype=getattr(torch, np.dtype(dtype).name))
    return cuda.to_device(np.zeros(shape, dtype=dtype))


def current_stream(x) -> int:
    """The stream the library of device array ``x`` is working on now, as a CUstream handle (an int; 0 is the
    default stream): PyTorch's ``torch.cuda.current_stream``, CuPy's ``get_current_stream``, else 0. A launch on
    it is ordered with the caller's own work on that stream, and is recorded when PyTorch captures a CUDA graph
    (which refuses launches on the default stream while it captures)."""
    lib = library(x)
    if lib == "torch":
        import torch

        return torch.cuda.current_stream(x.device).cuda_stream
    if lib == "cupy":
        import cupy

        return cupy.cuda.get_current_stream().ptr
    return 0


def result(x, shape: tuple, to_host: bool, host_dtype=None):
    """An output in the caller's form: reshaped, and copied to a NumPy array if the inputs were (seen as
    ``host_dtype`` if given: bfloat16 patterns as the caller's ml_dtypes bfloat16)."""
    x = x.reshape(shape)
    if not to_host:
        return x
    x = x.copy_to_host()
    return x if host_dtype is None else x.view(host_dtype)


def host_copy(x) -> np.ndarray:
    """A NumPy copy of ``x``, wherever it lives (NumPy, CuPy, PyTorch, numba): for small arrays a host check reads."""
    if not is_device_array(x):
        return np.asarray(x)
    lib = library(x)
    if lib == "cupy":
        return x.get()
    if lib == "torch":
        return x.detach().cpu().numpy()
    return x.copy_to_host()


@dataclass(frozen=True)
class ArrayLibrary:
    """What a call planned once per shape (``decode.cuda.DecodePlan``) asks of the inputs' library at every call,
    each a direct call into the library (no dispatch on the library inside):

    * ``key(q, k, v)``: what a plan depends on: the shapes, dtypes, whether each is C-contiguous (all a plan reads
      of the strides: a strided input is copied at each call) and the devices (an int: the GPU's ordinal, -1 for
      host memory);
    * ``empty(like, shape, dtype)``: an array on ``like``'s device, of a ``dtypes`` value (None: ``like``'s dtype);
    * ``address(x)``: the device address of ``x``'s first element;
    * ``stream(device)``: the library's current stream on that GPU, a CUstream handle as an int;
    * ``device()``: the library's current GPU;
    * ``contiguous(x)``: whether ``x`` is C-contiguous (its shape and strides say);
    * ``dtypes``: 'float16', 'float32' -> the library's dtype.
    """

    key: Callable
    empty: Callable
    address: Callable
    stream: Callable
    device: Callable
    contiguous: Callable
    dtypes: dict


def _torch_library() -> ArrayLibrary:
    import torch

    def key(q, k, v):
        return (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.is_contiguous(), k.is_contiguous(),
                v.is_contiguous(), q.get_device(), k.get_device(), v.get_device())

    # the raw stream handle, as PyTorch's compiler asks for it (torch.cuda.current_stream builds a Stream object)
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    stream = raw_stream or (lambda device: torch.cuda.current_stream(device).cuda_stream)
    device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
    def empty(like, shape, dtype):  # like.new_empty: on like's device, no device argument parsed
        return like.new_empty(shape) if dtype is None else like.new_empty(shape, dtype=dtype)

    return ArrayLibrary(key, empty, torch.Tensor.data_ptr, stream, device, torch.Tensor.is_contiguous,
                        {"float16": torch.float16, "float32": torch.float32})


def _cupy_library() -> ArrayLibrary:
    import cupy

    def key(q, k, v):
        return (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.flags.c_contiguous, k.flags.c_contiguous,
                v.flags.c_contiguous, q.device.id, k.device.id, v.device.id)

    return ArrayLibrary(key, lambda like, shape, dtype: cupy.empty(shape, dtype=like.dtype if dtype is None else dtype),
                        lambda x: x.data.ptr, lambda device: cupy.cuda.get_current_stream().ptr,
                        cupy.cuda.runtime.getDevice, lambda x: x.flags.c_contiguous,
                        {n: np.dtype(n) for n in ("float16", "float32")})


_ARRAY_LIBRARIES: dict = {"torch": _torch_library, "cupy": _cupy_library}  # name -> ArrayLibrary, made on first use


def array_library(lib: str) -> ArrayLibrary | None:
    """The :class:`ArrayLibrary` of 'torch' or 'cupy' (a name :func:`library` gives); None for any other."""
    found = _ARRAY_LIBRARIES.get(lib)
    if callable(found):
        found = _ARRAY_LIBRARIES[lib] = found()
    return found
