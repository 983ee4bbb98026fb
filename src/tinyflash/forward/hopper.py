"""Stage 4: FlashAttention-3's techniques on Hopper — the host wrapper of the wgmma kernels (v7 on).

:func:`hopper_attention` has the contract of :func:`tinyflash.tensor_core_attention` and its steps
(check the inputs, allocate the outputs, size the grid and launch; the checks and sizing kept per shape for
PyTorch and CuPy inputs), with :data:`VERSION` (kernel v10, warp specialisation with ping-pong, ``tinyflash/forward/kernels/v10_ping_pong.py``;
v7, wgmma alone, v8, TMA, and v9, warp specialisation, beside it) instead of v6. Its
instructions (``tinyflash/gpu/wgmma.py``) exist on compute capability 9.0 only: elsewhere a call raises
``UnsupportedGPUError`` before anything is compiled. On numba's simulator they are emulated.
"""

from __future__ import annotations

from ..warpgroup_tile import HEAD_DIMS
from .kernels import hopper_tiling, tma_tiling
from .kernels.hopper_tiling import require_hopper
from .tensor_cores import Entry, attention_call

# each wgmma kernel's tiling on a GPU, (d, causal, n_q) -> tiling
TILINGS = {"v7": hopper_tiling.default_tiling, "v8": tma_tiling.default_tiling,
           "v9": tma_tiling.default_specialised_tiling, "v10": tma_tiling.ping_pong_tiling}
VERSION = "v10"  # the kernel hopper_attention runs (any key of TILINGS): the fastest in the hopper benchmark
HOPPER = Entry("hopper_attention", VERSION, require_hopper, TILINGS[VERSION], HEAD_DIMS)


def hopper_attention(q, k, v, *, causal: bool = False, scale: float | None = None):
    """Stage 4: FlashAttention's forward pass with Hopper's warpgroup multiplies. Returns ``(o, lse)``.

    q (..., Nq, d), k (..., Nk, d), v (..., Nk, d) in float16 or bfloat16 (all three alike), k and v with
    fewer heads than q for grouped-query attention, d = 64, 128 or 256, any Nq, Nk >= 1; o (..., Nq, d) in the
    input dtype, lse (..., Nq) in float32. Products accumulate in float32; P_ij is rounded to the input type
    before P·V. ``causal`` masks bottom-right (``tinyflash.core.masks``). NumPy float16 inputs are copied to
    the GPU and back; device arrays (CuPy, numba, PyTorch CUDA tensors) stay there. Needs a Hopper GPU
    (compute capability 9.0); :func:`tinyflash.tensor_core_attention` runs on 8.0 and newer.
    """
    return attention_call(q, k, v, causal, scale, HOPPER)
