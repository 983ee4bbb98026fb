"""Backward stage 2: FlashAttention-2's backward as numba.cuda kernels — the host wrapper.

:func:`cuda_attention_backward` checks the inputs, allocates the outputs, sizes the grids and
launches three kernels: ``rows.row_dot`` (D = rowsum(dO ∘ O), dQ's accumulator zeroed), the main
kernel of :data:`tinyflash.backward.kernels.VERSIONS` (one block per key tile), ``rows.finish_dq``.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.checks import BFLOAT16, check_attention_inputs, check_backward_inputs
from ..core.online_softmax import LOG2E
from ..gpu.arrays import empty, numba_flat, result
from ..gpu.launch import LaunchArgs, launch
from ..gpu.runtime import require_gpu
from ..host.inputs import CUDA_CORES, bits, placed
from ..host.launch import launch_backward_tensor_cores, launch_cuda_cores
from .kernels import VERSIONS
from .kernels.rows import ROW_DOT_ROWS, ROWS_PER_BLOCK, element_rows


def cuda_attention_backward(q, k, v, o, lse, do, *, causal: bool = False, scale: float | None = None,
                            kernel: str | None = None, **options):
    """Backward stage 2 on the GPU: ``(dq, dk, dv)`` from the forward's ``o`` and ``lse`` and ``do`` = ∂L/∂o.

    The contract of :func:`tinyflash.blocked_attention_backward`; inputs float16, bfloat16 or float32
    (computed in float32; bfloat16 as PyTorch tensors, NumPy has no bfloat16), lse float32 as
    :func:`tinyflash.cuda_attention` returns it, head dims up to 256. NumPy in, NumPy out; device arrays (CuPy, numba, PyTorch) in, the same library's
    out. dk and dv are bitwise reproducible; dq, added by atomics, only up to rounding.
    ``kernel`` names a version of :data:`tinyflash.backward.kernels.VERSIONS` (None: the registry's rule, v1; the
    tensor cores' main kernels, v2 on, take their 16-bit inputs and head dims); ``options`` are its (``config``: its
    tiling, a :class:`~tinyflash.backward.kernels.tiling.BackwardTileConfig` for v1; ``vector``: 1 or 4;
    ``deterministic``).
    """
    # 1. check the inputs and choose the version
    found, on_device = placed({"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do})
    q, k, v, o, lse, do = found.values()
    prob = check_attention_inputs(q, k, v, causal=causal, scale=scale, allowed=CUDA_CORES)
    check_backward_inputs(prob, do, o, lse)
    version = VERSIONS.choose(kernel, "cuda_attention_backward")
    for name, dim in (("d (head dim of q and k)", prob.d), ("dv (head dim of v)", prob.d_v)):
        if dim > version.max_head_dim:
            raise ValueError(f"cuda_attention_backward supports head dims up to {version.max_head_dim}; got "
                             f"{name} = {dim}")
    unknown = sorted(set(options) - set(version.options))
    if unknown:
        raise TypeError(f"kernel {version.name} takes the options {list(version.options)}; got {unknown}")
    require_gpu()  # a GPU, or numba's simulator; else one clear error (before anything touches CUDA)
    if version.requirement:
        version.requirement(f"backward kernel {version.name}")  # the GPU has its instructions

    # 2. allocate the outputs and the O(N) scratch (for device inputs, in the caller's array library)
    heads, n_q, n_k, d, d_v = math.prod(prob.lead), prob.n_q, prob.n_k, prob.d, prob.d_v
    like = q if on_device else None
    dq = empty(like, heads * n_q * d, prob.dtype)  # (BH·Nq·d,) flat
    dk = empty(like, heads * n_k * d, prob.dtype)  # (BH·Nk·d,)
    dv = empty(like, heads * n_k * d_v, prob.dtype)  # (BH·Nk·dv,)
    D = empty(like, heads * n_q, np.float32)  # (BH·Nq,)  rowsum(dO ∘ O)
    dq_acc = empty(like, heads * n_q * d, np.float32)  # (BH·Nq·d,) dQ before its scale, added by atomics
    grads, shapes = (dq, dk, dv), (q.shape, k.shape, v.shape)  # what the caller gets: dq, dk, dv as q, k, v
    bits_as = q.dtype if prob.dtype == BFLOAT16 and not on_device else None  # host bfloat16 (ml_dtypes)
    q, k, v, o, do, dq, dk, dv = (bits(x, prob.dtype) for x in (q, k, v, o, do, dq, dk, dv))  # bfloat16: patterns
    row_dot, finish_dq = element_rows(BFLOAT16 if prob.dtype == BFLOAT16 else None)

    # 3. size the grids and launch the three kernels
    if heads > 0:
        Qf, Kf, Vf, Of, Lf, dOf, Dv, dQa = (numba_flat(x) for x in (q, k, v, o, lse, do, D, dq_acc))
        if n_q > 0:
            row_args = LaunchArgs(arrays={"dO": (dOf, n_q * d_v), "O": (Of, n_q * d_v), "D": (Dv, n_q),
                                          "dQ_acc": (dQa, n_q * d)}, scalars={"n_q": n_q, "d": d, "d_v": d_v},
                                  n_heads=heads)
            launch(row_dot, -(-n_q // ROW_DOT_ROWS), ROWS_PER_BLOCK, 0, row_args)
        main_args = LaunchArgs(arrays={"Q": (Qf, n_q * d), "K": (Kf, n_k * d), "V": (Vf, n_k * d_v),
                                       "dO": (dOf, n_q * d_v), "LSE": (Lf, n_q), "Dvec": (Dv, n_q),
                                       "dQ_acc": (dQa, n_q * d), "dK": (numba_flat(dk), n_k * d),
                                       "dV": (numba_flat(dv), n_k * d_v)},
                               scalars={"n_q": n_q, "n_k": n_k, "d": d, "d_v": d_v, "scale": np.float32(prob.scale),
                                        "scale_log2": np.float32(prob.scale * LOG2E), "causal": prob.causal},
                               n_heads=heads, kv_arrays=("K", "V", "dK", "dV"))
        if version.arguments == "elements":  # the CUDA cores: one block per key tile and head
            launch_cuda_cores(version, main_args, prob, over_keys=True, **options)
        else:  # a main kernel on the tensor cores, on 16-bit arrays; deterministic mode's counters unread here
            main_args.arrays["dQ_turn"] = (numba_flat(np.zeros(1, np.int32)), 0)
            launch_backward_tensor_cores(version, main_args, prob, who=f"backward kernel {version.name}", **options)
        if n_q > 0:
            finish_args = LaunchArgs(arrays={"dQ_acc": (dQa, n_q * d), "dQ": (numba_flat(dq), n_q * d)},
                                     scalars={"n": n_q * d, "scale": np.float32(prob.scale)}, n_heads=heads)
            launch(finish_dq, -(-(n_q * d) // ROWS_PER_BLOCK), ROWS_PER_BLOCK, 0, finish_args)
    return tuple(result(g, shape, not on_device, bits_as) for g, shape in zip(grads, shapes))
