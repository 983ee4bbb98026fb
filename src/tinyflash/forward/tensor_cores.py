"""Stage 3: FlashAttention's forward pass on the tensor cores (kernel v6).

:func:`tensor_core_attention` does what :func:`tinyflash.cuda_attention` does (check the inputs, allocate the
outputs, size the grid and launch), for what the tensor cores multiply: 16-bit inputs, float16 or bfloat16, with
float32 accumulation. Its steps are the host layer's (``tinyflash.host.forward``), shared with stage 4; the kernel is
``tinyflash/forward/kernels/v6_tensor_cores.py``, its PTX instructions in ``tinyflash/gpu/ptx.py``.

The kernel never converts an element: it moves 16-bit patterns, two per 32-bit word; only the tensor cores and the
final rounding know which format they are (``tinyflash.host.inputs`` says how bfloat16 arrives).
"""

from __future__ import annotations

from ..host.forward import Entry, tensor_core_call
from .kernels import VERSIONS

TENSOR_CORES = Entry("tensor_core_attention", VERSIONS)


def tensor_core_attention(q, k, v, *, causal: bool = False, scale: float | None = None, kernel: str | None = None,
                          config=None):
    """Stage 3: FlashAttention's forward pass on the tensor cores. Returns ``(o, lse)``.

    q (..., Nq, d), k (..., Nk, d), v (..., Nk, d) in float16 or bfloat16 (all three alike), with
    d = dv a multiple of 8 up to 256 and any Nq, Nk >= 1; o (..., Nq, d) in the input dtype, lse (..., Nq) in
    float32. Products accumulate in float32 on the tensor cores; P_ij is rounded to the input type
    before P·V, as in FlashAttention. ``causal`` masks bottom-right (``tinyflash.core.masks``).
    NumPy float16 inputs are copied to the GPU and back; device arrays (CuPy, numba, PyTorch CUDA
    tensors) stay there and the results are of the same library. For float32 inputs, other head
    dims or different d and dv, use :func:`tinyflash.cuda_attention`.

    ``kernel`` names another version on the tensor cores (``tinyflash.forward.kernels.VERSIONS``: v6 by default;
    v7 to v10 on a Hopper GPU); ``config`` a tiling of that version (None: its own for this GPU, or for numba's
    simulator). For PyTorch and CuPy inputs the checks and the sizing of the launch are done once per combination
    of shapes, dtypes, GPUs, ``causal``, ``scale``, ``kernel`` and ``config``, and kept (``tinyflash.host.plans``).
    """
    return tensor_core_call(TENSOR_CORES, q, k, v, causal, scale, kernel, config)
