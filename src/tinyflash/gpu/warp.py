"""Sums across the threads of a warp, with shuffles, and what the simulator does instead.

On a GPU, ``cuda.shfl_xor_sync(mask, x, lane_mask)`` gives each thread the value ``x`` of the
thread whose lane number differs by ``lane_mask`` (an XOR), straight from register to register.
Adding it for lane_mask = WIDTH/2, WIDTH/4, ..., 1 (a butterfly) leaves in every thread of each
group of WIDTH consecutive lanes the sum over its group: :func:`group_sum`.

numba's CUDA simulator has no shuffles, so there :func:`shfl_xor` goes through a shared array
with two block-wide barriers: the same values, much slower, and only correct when every thread of
the block calls it together (the decode kernels do: their loops have the same length in every
thread). The kernels must in any case call it from all 32 lanes of a warp at once (mask: all).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float64

from .runtime import simulator_enabled

ALL_LANES = 0xFFFFFFFF  # the shuffle's mask: every lane of the warp takes part
MAX_SIM_THREADS = 1024  # the simulator's scratch array: one slot per thread of a block

if simulator_enabled():

    @cuda.jit(device=True)
    def shfl_xor(x, lane_mask):
        """x of the thread tid ^ lane_mask (simulated: through shared memory; all threads call it)."""
        scratch = cuda.shared.array(MAX_SIM_THREADS, float64)
        tid = cuda.threadIdx.x
        scratch[tid] = x
        cuda.syncthreads()  # every thread has written x before any reads its partner's
        other = scratch[tid ^ int(lane_mask)]
        cuda.syncthreads()  # every thread has read before the next call overwrites the scratch
        return type(x)(other)

else:

    @cuda.jit(device=True, inline="always")
    def shfl_xor(x, lane_mask):
        """x of the thread whose lane is this lane XOR lane_mask, register to register."""
        return cuda.shfl_xor_sync(ALL_LANES, x, lane_mask)


def group_sum(width: int):
    """A device function ``sum(x)``: the sum of x over each group of ``width`` consecutive lanes
    (a power of two up to 32), returned to every lane of the group: log2(width) shuffles."""
    if width & (width - 1) or not 1 <= width <= 32:
        raise ValueError(f"width must be a power of two from 1 to 32; got {width}")
    masks = tuple(np.int32(width >> s) for s in range(1, width.bit_length()))  # width/2, ..., 1
    if not masks:  # one lane per group: nothing to add

        @cuda.jit(device=True, inline="always")
        def identity(x):
            return x

        return identity

    @cuda.jit(device=True, inline="always")
    def lane_sum(x):
        for lane_mask in masks:
            x += shfl_xor(x, lane_mask)
        return x

    return lane_sum
