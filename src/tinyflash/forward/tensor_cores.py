"""Stage 3: FlashAttention's forward pass on the tensor cores (kernel v6).

:func:`tensor_core_attention` does what :func:`tinyflash.cuda_attention` does (check the inputs, allocate the
outputs, size the grid and launch), for what the tensor cores multiply: 16-bit inputs, float16 or bfloat16, with
float32 accumulation. Its steps are the host layer's (``tinyflash.host.forward``), shared with stage 4; the kernel is
``tinyflash/forward/kernels/v6_tensor_cores.py``, its PTX instructions in ``tinyflash/gpu/ptx.py``.

:func:`flex_attention` is the same stage with FlexAttention's user functions and block mask compiled into v6
(its ``flex_fwd``), through the host layer's ``tinyflash.host.flex``; on a Hopper GPU into stage 4's v10 (its own
``flex_fwd``), the registry's rule for ``flex_attention``.

The kernel never converts an element: it moves 16-bit patterns, two per 32-bit word; only the tensor cores and the
final rounding know which format they are (``tinyflash.host.inputs`` says how bfloat16 arrives).
"""

from __future__ import annotations

from ..host.flex import flex_call
from ..host.forward import Entry, tensor_core_call
from .kernels import VERSIONS

TENSOR_CORES = Entry("tensor_core_attention", VERSIONS)
FLEX = Entry("flex_attention", VERSIONS)


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


def flex_attention(q, k, v, *, score_mod=None, mask_mod=None, block_mask=None, causal: bool = False,
                   scale: float | None = None, kernel: str | None = None, config=None):
    """FlexAttention on the tensor cores: attention with a score modification and a mask written as plain Python
    functions, compiled into the kernel (``flex_fwd``: stage 4's v10 on a Hopper GPU, compute capability 9.0, at
    d = 64, 128, 256; stage 3's v6 elsewhere and at the other head dims). Returns ``(o, lse)``.

    Inputs as :func:`tensor_core_attention`'s (float16 or bfloat16; d = dv a multiple of 8 up to 256; grouped-query
    heads), with q (Nq, d), (H, Nq, d) or (B, H, Nq, d), which defines b and h below.

    * ``score_mod(score, b, h, q_idx, kv_idx) -> score``: the score to use in place of ``score`` = scale · q·k
      (float32), for batch b, QUERY head h, query q_idx and key kv_idx (absolute positions, signed ints).
    * ``mask_mod(b, h, q_idx, kv_idx) -> bool``: whether the key is kept. ``causal`` (bottom-right,
      ``tinyflash.core.masks``) applies too: a key is kept where both keep it. A row left with no key gives
      o = 0 and lse = -inf.
    * ``block_mask``: a ``tinyflash.BlockMask`` (``tinyflash.create_block_mask``, built from the same mask_mod and
      causal; its B or H may be 1): each query tile visits only the key tiles it lists, the empty ones never
      loaded, and evaluates mask_mod only on its partial tiles. Its block_q must be a multiple of the kernel's
      query tile Br and its block_k of its key tile Bc (the default tiling is shrunk to fit where it can; a
      ValueError says so where it cannot). Without a mask_mod, the block mask's own (``block_mask.mask_mod``) is
      used. Without a block mask, mask_mod is evaluated on every key tile (all of them, or up to the diagonal).

    Both functions are plain Python of scalars (arithmetic, comparisons, ``&``, ``|``, ``math``), as numba compiles
    them for the GPU; they may read numbers, NumPy arrays (copied into the kernel as constants: small tables) and
    other such functions from outside. A kernel is built per function and kept: two functions with the same code
    that read equal values share it (``tinyflash.gpu.user_code``). ``kernel`` and ``config`` as for
    :func:`tensor_core_attention` (the versions that take these functions: v6, and v10 on Hopper; None: the
    registry's rule, ``VERSIONS.default("flex_attention", ...)``).
    """
    return flex_call(FLEX, q, k, v, score_mod, mask_mod, block_mask, causal, scale, kernel, config)
