"""The GPU's facts, in one place: the H200's, and those of the GPU in hand.

Every number that a tiling rule, a cost model, a figure or a lesson needs about the hardware is
here. :data:`H200` holds NVIDIA's datasheet values for the GPU this project measures on;
:func:`current` asks the GPU that the kernels run on for what it can report (multiprocessors,
shared memory, registers, device memory) and keeps the H200's values where there is no GPU (on
numba's simulator, or on a machine without CUDA), so that a rule chosen for the H200 gives the
same answer in the tests as on the H200.

This module imports nothing of tinyflash, and numba only inside :func:`current`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

STATIC_SMEM_PER_BLOCK = 48 * 1024  # shared memory any kernel may use without asking the driver first
GIB = 2**30


@dataclass(frozen=True)
class GPU:
    """What the kernels and the models need to know of a GPU."""

    name: str
    sms: int  # streaming multiprocessors
    smem_per_sm: int  # bytes of shared memory per multiprocessor
    smem_per_block: int  # the most dynamic shared memory one block may ask for
    smem_reserved_per_block: int  # bytes of shared memory the system reserves per resident block
    registers_per_sm: int  # 32-bit registers per multiprocessor
    max_blocks_per_sm: int  # resident blocks per multiprocessor at most
    memory_bytes: int  # device memory (HBM)
    hbm_bytes_per_s: float  # memory bandwidth (datasheet)
    fp16_dense_flops: float  # dense float16 tensor-core throughput (datasheet; 2:4 sparsity would double it)

    def blocks_per_sm(self, smem_bytes: int, threads: int = 32, registers: int = 0) -> int:
        """Blocks of ``threads`` threads, ``registers`` registers each and ``smem_bytes`` of shared memory
        that fit on one multiprocessor at once."""
        fits = [self.max_blocks_per_sm, self.smem_per_sm // (smem_bytes + self.smem_reserved_per_block)]
        if registers:
            fits.append(self.registers_per_sm // (registers * threads))
        return max(0, min(fits))


# NVIDIA H200 SXM (compute capability 9.0): 132 SMs of 228 KiB shared memory (227 KiB for one block), 141 GB
# of HBM3e at 4.8 TB/s, 989 TFLOP/s dense float16 on the tensor cores.
H200 = GPU(name="NVIDIA H200", sms=132, smem_per_sm=228 * 1024, smem_per_block=227 * 1024,
           smem_reserved_per_block=1024, registers_per_sm=65_536, max_blocks_per_sm=32, memory_bytes=141 * 10**9,
           hbm_bytes_per_s=4.8e12, fp16_dense_flops=989e12)
CONSUMER_CARD_BYTES = 24 * GIB  # the device memory of a 24 GiB consumer card, drawn beside the H200's


@lru_cache(maxsize=1)
def current() -> GPU:
    """The GPU the kernels run on, as numba's current device reports it; :data:`H200` without one.

    The bandwidth and the float16 rate cannot be asked of a device: they stay the H200's datasheet values.
    """
    try:
        from numba import config, cuda

        if config.ENABLE_CUDASIM or not cuda.is_available():
            return H200
        dev = cuda.get_current_device()
        free_total = cuda.current_context().get_memory_info()
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        return replace(H200, name=name, sms=dev.MULTIPROCESSOR_COUNT,
                       smem_per_sm=dev.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
                       smem_per_block=dev.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                       smem_reserved_per_block=dev.RESERVED_SHARED_MEMORY_PER_BLOCK,
                       registers_per_sm=dev.MAX_REGISTERS_PER_MULTIPROCESSOR,
                       max_blocks_per_sm=dev.MAX_BLOCKS_PER_MULTIPROCESSOR, memory_bytes=int(free_total[1]))
    except ImportError:  # no numba: the models only
        return H200
