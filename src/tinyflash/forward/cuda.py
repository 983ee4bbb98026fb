"""Stage 2: FlashAttention's forward pass as numba.cuda kernels — the host wrapper.

:func:`cuda_attention` does what every kernel's host side does, in this order: check the inputs, choose the
kernel version, allocate the outputs, size the grid and launch. The kernels themselves, one file per version, are
in ``tinyflash/forward/kernels/``; which one runs is chosen by name from its registry (by default, the registry's
rule for ``cuda_attention``); the launch, the grid over (query tiles × heads), is the host layer's
(``tinyflash.host.launch``).

Kernels run on a real GPU, or under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, set
before numba is imported), where tiny tile sizes keep the tests fast enough for a CPU. With
neither, ``require_gpu()``, once the arguments are checked, raises one error that says so.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.checks import BFLOAT16, check_attention_inputs
from ..core.online_softmax import LOG2E
from ..gpu.arrays import empty, numba_flat, result
from ..gpu.launch import LaunchArgs
from ..gpu.runtime import require_gpu
from ..host.inputs import CUDA_CORES, bits, placed
from ..host.launch import launch_cuda_cores, launch_tensor_cores
from .kernels import VERSIONS, WIDER_VERSIONS


def cuda_attention(q, k, v, *, causal: bool = False, scale: float | None = None, kernel: str | None = None,
                   **options):
    """Stage 2: FlashAttention's forward pass on the GPU. Returns ``(o, lse)``.

    Same contract as :func:`tinyflash.naive_attention`: q (..., Nq, d), k (..., Nk, d),
    v (..., Nk, dv), or k and v with fewer heads (axis -3) than q (grouped-query attention);
    o (..., Nq, dv) in the input dtype, lse (..., Nq) in float32. Inputs are float16, bfloat16 or
    float32 (16-bit inputs are read from memory as they are and computed in float32) with 1 <= d, dv <= 256.
    bfloat16 has no NumPy dtype: it comes as PyTorch tensors (or arrays of ml_dtypes' bfloat16).
    NumPy inputs are copied to the GPU and the results back; device arrays (CuPy, numba, PyTorch
    CUDA tensors, anything with ``__cuda_array_interface__``) stay on the GPU and the results are
    device arrays of the same library. ``kernel`` names a version of
    :data:`tinyflash.forward.kernels.VERSIONS` (default: the registry's rule, v5, the fastest on the CUDA cores; the
    tensor cores' versions, v6 on, take their 16-bit inputs and head dims); ``options`` are that version's
    (``config``: its tiling, a :class:`~tinyflash.forward.kernels.tiling.TileConfig` for v2 to v5; ``vector``:
    elements per thread and load, 1 or 4, for v5).
    """
    # 1. check the inputs and choose the version
    arrays, on_device = placed({"q": q, "k": k, "v": v})
    q, k, v = arrays.values()
    prob = check_attention_inputs(q, k, v, causal=causal, scale=scale, allowed=CUDA_CORES)
    version = VERSIONS.choose(kernel, "cuda_attention", among=WIDER_VERSIONS)
    for name, dim in (("d (head dim of q and k)", prob.d), ("dv (head dim of v)", prob.d_v)):
        if dim > version.max_head_dim:
            raise ValueError(f"cuda_attention supports head dims up to {version.max_head_dim}; got {name} = {dim}")
    unknown = sorted(set(options) - set(version.options))
    if unknown:
        raise TypeError(f"kernel {version.name} takes the options {list(version.options)}; got {unknown}")
    require_gpu()  # a GPU, or numba's simulator; else one clear error (before anything touches CUDA)
    if version.requirement:
        version.requirement(f"kernel {version.name}")  # the GPU has its instructions

    # 2. allocate the outputs (for device inputs, in the caller's array library)
    heads = math.prod(prob.lead)  # batch · heads: one row of thread blocks each
    like = q if on_device else None
    o = empty(like, heads * prob.n_q * prob.d_v, prob.dtype)  # (BH·Nq·dv,) flat, C order
    lse = empty(like, heads * prob.n_q, np.float32)  # (BH·Nq,)
    bits_as = q.dtype if prob.dtype == BFLOAT16 and not on_device else None  # host bfloat16 (ml_dtypes), for o
    q, k, v, o_bits = (bits(x, prob.dtype) for x in (q, k, v, o))  # numba has no bfloat16: its 16-bit patterns

    # 3. size the grid and launch (the host layer: one block per query tile and head)
    if prob.n_q > 0 and heads > 0:
        n_q, n_k, d, d_v = prob.n_q, prob.n_k, prob.d, prob.d_v
        args = LaunchArgs(arrays={"Q": (numba_flat(q), n_q * d), "K": (numba_flat(k), n_k * d),
                                  "V": (numba_flat(v), n_k * d_v), "O": (numba_flat(o_bits), n_q * d_v),
                                  "LSE": (numba_flat(lse), n_q)},  # K and V: one matrix per K/V head (GQA)
                          scalars={"n_q": n_q, "n_k": n_k, "d": d, "d_v": d_v, "scale_log2": np.float32(prob.scale * LOG2E),
                                   "causal": prob.causal, "kv_group": prob.kv_group},
                          n_heads=heads, kv_group=prob.kv_group)
        if version.arguments == "elements":  # the CUDA cores: arrays of the inputs' type
            launch_cuda_cores(version, args, prob, **options)
        else:  # a version on the tensor cores, on its 16-bit arrays
            launch_tensor_cores(version, args, prob, who=f"kernel {version.name}", **options)
    return result(o, prob.out_shape, not on_device, bits_as), result(lse, prob.lse_shape, not on_device)
