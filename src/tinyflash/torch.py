"""PyTorch autograd for tinyflash's kernels: train a model with them (needs PyTorch and a CUDA GPU).

    import tinyflash.torch
    o = tinyflash.torch.attention(q, k, v, causal=True)   # q, k, v: CUDA tensors (..., N, d)
    o.sum().backward()                                   # q.grad, k.grad, v.grad from the numba backward

:class:`FlashAttentionFunction` runs the numba forward, saves (q, k, v, o, lse) — O(N) beyond the inputs, not
the N × N matrix P — and runs the numba backward on them. float16 and bfloat16 with d = dv = 64 or 128 go to
the tensor cores (:func:`tinyflash.tensor_core_attention` and :func:`tinyflash.tensor_core_attention_backward`),
and may have fewer K/V heads than query heads (grouped-query attention: k.grad and v.grad sum over each group);
float16 at other head dims, and float32, to the CUDA cores (:func:`tinyflash.cuda_attention` and
:func:`tinyflash.cuda_attention_backward`, without grouped heads). This module imports PyTorch; nothing else
in tinyflash does unless a tensor is passed in. The causal mask is bottom-right aligned (the project's rule,
:func:`tinyflash.core.masks.key_stop`: the last query sees every key); PyTorch's ``is_causal`` is top-left
aligned, so the two agree only for Nq == Nk.
"""

from __future__ import annotations

try:
    import torch
except ImportError as exc:  # say what is missing and what still works, not a bare ModuleNotFoundError
    raise ImportError("tinyflash.torch (PyTorch autograd over tinyflash's kernels) needs PyTorch, with CUDA for the "
                      "kernels: pip install torch. Everything else in tinyflash works without it.") from exc

from .backward.cuda import cuda_attention_backward
from .backward.tensor_cores import tensor_core_attention_backward
from .forward.cuda import cuda_attention
from .forward.kernels.tensor_core_tiling import HEAD_DIMS
from .forward.tensor_cores import tensor_core_attention


def on_tensor_cores(q, k, v) -> bool:
    """Whether the tensor-core kernels take these inputs: float16 or bfloat16, d = dv in HEAD_DIMS."""
    return (q.dtype in (torch.float16, torch.bfloat16) and k.dtype == v.dtype == q.dtype
            and q.shape[-1] == k.shape[-1] == v.shape[-1] and q.shape[-1] in HEAD_DIMS)


class FlashAttentionFunction(torch.autograd.Function):
    """o = softmax(scale · q kᵀ) v with tinyflash's numba kernels forward and backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        # numba reads a tensor through __cuda_array_interface__, which PyTorch refuses for tensors that
        # require grad: the kernels get detached views of the same memory.
        ctx.tensor_cores = on_tensor_cores(q, k, v)
        forward = tensor_core_attention if ctx.tensor_cores else cuda_attention
        o, lse = forward(q.detach(), k.detach(), v.detach(), causal=causal, scale=scale)  # (..., Nq, dv), (..., Nq)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = (x.detach() for x in ctx.saved_tensors)
        backward = tensor_core_attention_backward if ctx.tensor_cores else cuda_attention_backward
        dq, dk, dv = backward(q, k, v, o, lse, do.detach().contiguous(), causal=ctx.causal, scale=ctx.scale)
        return dq, dk, dv, None, None  # no gradient for causal and scale


def attention(q, k, v, *, causal: bool = False, scale: float | None = None):
    """Differentiable attention on CUDA tensors q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv): the numba
    kernels forward and backward, on the tensor cores for float16 and bfloat16 at d = dv = 64 or 128 (k and v
    may then have fewer heads than q), on the CUDA cores for float16 and float32 otherwise. Returns o
    (..., Nq, dv). ``causal`` is bottom-right aligned (module docstring)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or not x.is_cuda:
            raise TypeError(f"{name} must be a CUDA torch.Tensor; got {type(x).__name__}"
                            f"{' on ' + str(x.device) if isinstance(x, torch.Tensor) else ''}")
    return FlashAttentionFunction.apply(q, k, v, causal, scale)
