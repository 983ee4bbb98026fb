"""Stage 4: FlashAttention-3's techniques on Hopper — the wgmma kernels (v7 on).

:func:`hopper_attention` has the contract of :func:`tinyflash.tensor_core_attention` and its steps (the host layer's,
``tinyflash.host.forward``: check the inputs, allocate the outputs, size the grid and launch; the checks and sizing
kept per shape for PyTorch and CuPy inputs), with kernel v10 by default (warp specialisation with ping-pong,
``tinyflash/forward/kernels/v10_ping_pong.py``; v7, wgmma alone, v8, TMA, and v9, warp specialisation, beside it:
the registry's rule for ``hopper_attention`` says which runs). Its instructions (``tinyflash/gpu/wgmma.py``) exist
on compute capability 9.0 only: elsewhere a call raises ``UnsupportedGPUError`` before anything is compiled. On
numba's simulator they are emulated.
"""

from __future__ import annotations

from ..host.forward import Entry, tensor_core_call
from .kernels import VERSIONS

HOPPER = Entry("hopper_attention", VERSIONS)


def hopper_attention(q, k, v, *, causal: bool = False, scale: float | None = None, kernel: str | None = None,
                     config=None):
    """Stage 4: FlashAttention's forward pass with Hopper's warpgroup multiplies. Returns ``(o, lse)``.

    q (..., Nq, d), k (..., Nk, d), v (..., Nk, d) in float16 or bfloat16 (all three alike), k and v with
    fewer heads than q for grouped-query attention, d = 64, 128 or 256, any Nq, Nk >= 1; o (..., Nq, d) in the
    input dtype, lse (..., Nq) in float32. Products accumulate in float32; P_ij is rounded to the input type
    before P·V. ``causal`` masks bottom-right (``tinyflash.core.masks``). NumPy float16 inputs are copied to
    the GPU and back; device arrays (CuPy, numba, PyTorch CUDA tensors) stay there. Needs a Hopper GPU
    (compute capability 9.0); :func:`tinyflash.tensor_core_attention` runs on 8.0 and newer.

    ``kernel`` names one of v7 to v10 (``tinyflash.forward.kernels.VERSIONS``; None: v10) or another version on the
    tensor cores; ``config`` a tiling of that version (None: its own for this GPU, or for numba's simulator).
    """
    return tensor_core_call(HOPPER, q, k, v, causal, scale, kernel, config)
