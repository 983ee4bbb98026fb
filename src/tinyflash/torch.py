"""PyTorch autograd for tinyflash's kernels: train a model with them (needs PyTorch and a CUDA GPU).

    import tinyflash.torch
    o = tinyflash.torch.attention(q, k, v, causal=True)   # q, k, v: CUDA tensors (..., N, d)
    o.sum().backward()                                   # q.grad, k.grad, v.grad from the numba backward

:class:`FlashAttentionFunction` runs the numba forward (:func:`tinyflash.cuda_attention`), saves
(q, k, v, o, lse) — O(N) beyond the inputs, not the N × N matrix P — and runs the numba backward
(:func:`tinyflash.cuda_attention_backward`) on them. This module imports PyTorch; nothing else in
tinyflash does unless a tensor is passed in. The causal mask is bottom-right aligned (the
project's rule, :func:`tinyflash.core.masks.key_stop`); PyTorch's ``is_causal`` is top-left
aligned, so the two agree only for Nq == Nk.
"""

from __future__ import annotations

try:
    import torch
except ImportError as exc:  # say what is missing and what still works, not a bare ModuleNotFoundError
    raise ImportError("tinyflash.torch (PyTorch autograd over tinyflash's kernels) needs PyTorch, with CUDA for the "
                      "kernels: pip install torch. Everything else in tinyflash works without it.") from exc

from .backward.cuda import cuda_attention_backward
from .forward.cuda import cuda_attention


class FlashAttentionFunction(torch.autograd.Function):
    """o = softmax(scale · q kᵀ) v with tinyflash's numba kernels forward and backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        # numba reads a tensor through __cuda_array_interface__, which PyTorch refuses for tensors that
        # require grad: the kernels get detached views of the same memory.
        o, lse = cuda_attention(q.detach(), k.detach(), v.detach(), causal=causal, scale=scale)  # (..., Nq, dv), (..., Nq)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = (x.detach() for x in ctx.saved_tensors)
        dq, dk, dv = cuda_attention_backward(q, k, v, o, lse, do.detach().contiguous(), causal=ctx.causal,
                                             scale=ctx.scale)
        return dq, dk, dv, None, None  # no gradient for causal and scale


def attention(q, k, v, *, causal: bool = False, scale: float | None = None):
    """Differentiable attention on CUDA tensors q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv),
    float16 or float32: the numba kernels forward and backward. Returns o (..., Nq, dv)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or not x.is_cuda:
            raise TypeError(f"{name} must be a CUDA torch.Tensor; got {type(x).__name__}"
                            f"{' on ' + str(x.device) if isinstance(x, torch.Tensor) else ''}")
    return FlashAttentionFunction.apply(q, k, v, causal, scale)
