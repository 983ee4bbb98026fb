"""The block's shared memory: one dynamic buffer (float32, or uint32 words of 16-bit pairs for the
tensor cores), and the permission to make it large.

A kernel sees its dynamic shared memory as one array (:func:`shared_floats`) whose size is given at
launch; the kernel's tiling says where each tile lives inside it. Any kernel may use up to 48 KiB;
more (up to 227 KiB per block on Hopper) must be asked for first, per compiled kernel
(:func:`allow_large_shared_memory`).
"""

from __future__ import annotations

from typing import NamedTuple

from numba import cuda, float32, uint32

from ..hardware import STATIC_SMEM_PER_BLOCK
from .runtime import simulator_enabled



class Region(NamedTuple):
    """One part of the block's shared memory, in float32 elements."""

    name: str
    offset: int
    floats: int


def layout(sizes) -> tuple[Region, ...]:
    """Regions placed one after another, in the order given: ``sizes`` is ((name, floats), ...)."""
    regions, offset = [], 0
    for name, floats in sizes:
        regions.append(Region(name, offset, floats))
        offset += floats
    return tuple(regions)


def layout_bytes(regions) -> int:
    """Bytes of shared memory that regions placed by :func:`layout` take: up to the end of the last."""
    last = regions[-1]
    return 4 * (last.offset + last.floats)

if simulator_enabled():  # the simulator rejects the alignment argument; its arrays are NumPy arrays

    @cuda.jit(device=True)
    def shared_floats():
        """The block's dynamic shared memory as one float32 array (its size is set at launch)."""
        return cuda.shared.array(0, float32)

else:

    @cuda.jit(device=True, inline="always")
    def shared_floats():
        """The block's dynamic shared memory as one float32 array (its size is set at launch).

        16-byte alignment lets the compiler turn 4 neighbouring float loads into one vector load.
        """
        return cuda.shared.array(0, float32, alignment=16)


if simulator_enabled():

    @cuda.jit(device=True)
    def shared_words():
        """The block's dynamic shared memory as one uint32 array: pairs of 16-bit values (tensor cores)."""
        return cuda.shared.array(0, uint32)

else:

    @cuda.jit(device=True, inline="always")
    def shared_words():
        """The block's dynamic shared memory as one uint32 array: pairs of 16-bit values (tensor cores).

        16-byte alignment: ldmatrix reads 16-byte rows and cp.async writes 16-byte chunks.
        """
        return cuda.shared.array(0, uint32, alignment=16)


def allow_large_shared_memory(kernel, args, nbytes: int) -> None:
    """Let ``kernel``, compiled for ``args``, launch with ``nbytes`` of dynamic shared memory.

    Above 48 KiB CUDA requires the function attribute MAX_DYNAMIC_SHARED_SIZE_BYTES to be raised
    first. numba has no public API for it, so this compiles the kernel for the argument types,
    takes the driver handle of the compiled function and calls cuKernelSetAttribute, as numba's
    own ``set_shared_memory_carveout`` does. Raises the driver's error if the device refuses.
    (Kernels launched through the driver set it on their own handle: ``driver_launch.DriverKernel``.)
    """
    if nbytes <= STATIC_SMEM_PER_BLOCK or simulator_enabled():
        return
    from numba.cuda.cudadrv.driver import binding, driver

    cufunc = kernel.compile(tuple(kernel.typeof_pyval(a) for a in args)).library.get_cufunc()
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, int(nbytes), cufunc.handle, cufunc.device.id)
