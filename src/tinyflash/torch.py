"""PyTorch autograd for tinyflash's kernels: train a model with them (needs PyTorch and a CUDA GPU).

    import tinyflash.torch
    o = tinyflash.torch.attention(q, k, v, causal=True)   # q, k, v: CUDA tensors (..., N, d)
    o.sum().backward()                                   # q.grad, k.grad, v.grad from the numba backward

The forward and the backward are PyTorch custom operators, ``tinyflash::attention_forward`` and
``tinyflash::attention_backward`` (``torch.library.custom_op``), each with a fake implementation that
gives the outputs' shapes without running anything, and the forward's autograd formula is the backward
operator. So ``torch.compile(fullgraph=True)`` traces a model through them without a graph break, and
on the tensor-core path a training step can be captured in a CUDA graph (``torch.cuda.graph``): the
kernels go to PyTorch's current stream, the outputs come from its allocator.

The forward saves (q, k, v, o, lse) — O(N) beyond the inputs, not the N × N matrix P — and the backward
recomputes P from them. float16 and bfloat16 with d = dv a multiple of 8 up to 256 go to the tensor cores
(:func:`tinyflash.tensor_core_attention` — on a Hopper GPU, compute capability 9.0,
:func:`tinyflash.hopper_attention` at d = 64, 128 and 256, the faster forward — and
:func:`tinyflash.tensor_core_attention_backward`), and may have fewer K/V heads than query heads
(grouped-query attention: k.grad and v.grad sum over each group); d ≠ dv, and float32, go to the CUDA cores
(:func:`tinyflash.cuda_attention` and :func:`tinyflash.cuda_attention_backward`, without grouped heads),
whose launches go to the default stream and cannot be captured in a graph. This module imports PyTorch; nothing else in tinyflash does unless a
tensor is passed in.

FlexAttention (:func:`flex_attention`): the same with a ``score_mod``, a ``mask_mod`` and a block mask, the user's
Python functions compiled into the kernels (:func:`tinyflash.flex_attention` and
:func:`tinyflash.flex_attention_backward`). A Python function cannot be an argument of a custom operator (its
schema takes tensors, numbers and strings), so this one is a ``torch.autograd.Function`` instead, which holds the
functions and the block mask beside the saved tensors. What works: eager mode, float16 and bfloat16, grouped-query
heads, q.grad, k.grad and v.grad through score_mod's derivative. What does not: ``torch.compile`` does not trace into
it (the call is a graph break, marked with ``torch.compiler.disable``: ``fullgraph=True`` refuses it), and a CUDA
graph cannot capture it (its kernels launch through numba on its own stream: a capture is refused with a clear error).

The causal mask is bottom-right aligned (the project's rule, :func:`tinyflash.core.masks.key_stop`: the
last query sees every key, as in FlashAttention-2 from version 2.1). SDPA's ``is_causal`` is top-left
aligned (query i sees keys 0..i). The two are the same mask when Nq == Nk, as in training; for Nq < Nk
(decoding, or a prompt's continuation) tinyflash's query i sees keys 0..i + Nk − Nq, SDPA's fewer.
"""

from typing import Optional

try:
    import torch
except ImportError as exc:  # say what is missing and what still works, not a bare ModuleNotFoundError
    raise ImportError("tinyflash.torch (PyTorch autograd over tinyflash's kernels) needs PyTorch, with CUDA for the "
                      "kernels: pip install torch. Everything else in tinyflash works without it.") from exc

from .backward.cuda import cuda_attention_backward
from .backward.tensor_cores import flex_attention_backward, tensor_core_attention_backward
from .forward.cuda import cuda_attention
from .forward.hopper import hopper_attention
from .forward.kernels.hopper_tiling import COMPUTE_CAPABILITY as HOPPER
from .forward.tensor_cores import flex_attention as flex_forward
from .forward.tensor_cores import tensor_core_attention
from .gpu.runtime import compute_capability
from .host.flex import user_function
from .host.flex_backward import check_derivative
from .warpgroup_tile import HEAD_DIMS as HOPPER_HEAD_DIMS
from .warp_tile import BACKWARD_HEAD_DIMS, HEAD_DIMS, head_dims_text

Tensor = torch.Tensor


def on_tensor_cores(q, k, v, head_dims: tuple = HEAD_DIMS) -> bool:
    """Whether the tensor-core kernels take these inputs: float16 or bfloat16, d = dv in ``head_dims`` (the
    forward's, HEAD_DIMS; the backward's, BACKWARD_HEAD_DIMS)."""
    return (q.dtype in (torch.float16, torch.bfloat16) and k.dtype == v.dtype == q.dtype
            and q.shape[-1] == k.shape[-1] == v.shape[-1] and q.shape[-1] in head_dims)


def on_hopper(q, k, v) -> bool:
    """Whether stage 4 (:func:`tinyflash.hopper_attention`, wgmma and TMA) takes the forward: tensor-core inputs
    at d = dv in its head dims, on a GPU of compute capability 9.0 (the current device, where the kernels run)."""
    return on_tensor_cores(q, k, v, HOPPER_HEAD_DIMS) and compute_capability() == HOPPER


def _refuse_capture_off_tensor_cores(q, head_dims: tuple) -> None:
    """The CUDA-core kernels launch through numba on the default stream, which a graph capture forbids: a
    clear error instead of the capture's."""
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"tinyflash.torch.attention can be captured in a CUDA graph only on the tensor cores "
                           f"(float16 or bfloat16, d = dv {head_dims_text(head_dims)}); got {q.dtype}, "
                           f"d = {q.shape[-1]}")


def _refuse_deterministic_off_tensor_cores(q, v, deterministic: bool) -> None:
    """Only the tensor-core backward has a deterministic dQ: a ValueError for inputs the CUDA cores take."""
    if deterministic:
        raise ValueError(f"deterministic=True needs the tensor cores (float16 or bfloat16, d = dv "
                         f"{head_dims_text(BACKWARD_HEAD_DIMS)}); got {q.dtype}, d = {q.shape[-1]}, "
                         f"dv = {v.shape[-1]}")


# Operands inside a custom operator are detached views: numba reads a tensor through
# __cuda_array_interface__, which PyTorch refuses for tensors that require grad.

@torch.library.custom_op("tinyflash::attention_forward", mutates_args=())
def attention_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: Optional[float],
                      deterministic: bool) -> tuple[Tensor, Tensor]:
    """(o, lse) of the numba forward: the tensor cores where they take the inputs, else the CUDA cores
    (``deterministic`` is the backward's: the forward is deterministic anyway); on Hopper, stage 4's."""
    if on_hopper(q, k, v):
        return hopper_attention(q.detach(), k.detach(), v.detach(), causal=causal, scale=scale)
    if on_tensor_cores(q, k, v):
        return tensor_core_attention(q.detach(), k.detach(), v.detach(), causal=causal, scale=scale)
    _refuse_capture_off_tensor_cores(q, HEAD_DIMS)
    return cuda_attention(q.detach(), k.detach(), v.detach(), causal=causal, scale=scale)


@attention_forward.register_fake
def _(q, k, v, causal, scale, deterministic):
    """The shapes and dtypes of (o, lse), for tracing: o (..., Nq, dv) like q, lse (..., Nq) float32."""
    return q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("tinyflash::attention_backward", mutates_args=())
def attention_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, causal: bool,
                       scale: Optional[float], deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of the numba backward, on the same kernels' path as the forward's; ``deterministic``: dq
    bitwise reproducible on the tensor cores (dk and dv always are)."""
    saved = [x.detach() for x in (q, k, v, o, lse)]
    if on_tensor_cores(q, k, v, BACKWARD_HEAD_DIMS):
        return tensor_core_attention_backward(*saved, do.detach().contiguous(), causal=causal, scale=scale,
                                              deterministic=deterministic)
    _refuse_deterministic_off_tensor_cores(q, v, deterministic)
    _refuse_capture_off_tensor_cores(q, BACKWARD_HEAD_DIMS)
    return cuda_attention_backward(*saved, do.detach().contiguous(), causal=causal, scale=scale)


@attention_backward.register_fake
def _(q, k, v, o, lse, do, causal, scale, deterministic):
    """dq, dk, dv: contiguous, of q's, k's and v's shapes and dtype."""
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, deterministic = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale, ctx.deterministic = causal, scale, deterministic
    ctx.mark_non_differentiable(lse)


def _backward(ctx, do, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward(q, k, v, o, lse, do, ctx.causal, ctx.scale, ctx.deterministic)
    return dq, dk, dv, None, None, None  # no gradient for causal, scale and deterministic


attention_forward.register_autograd(_backward, setup_context=_setup_context)


def attention(q, k, v, *, causal: bool = False, scale: Optional[float] = None, deterministic: bool = False):
    """Differentiable attention on CUDA tensors q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv): the numba
    kernels forward and backward, on the tensor cores for float16 and bfloat16 at d = dv a multiple of 8 up to
    256 (k and v may then have fewer heads than q), on the CUDA cores for float16, bfloat16 and float32 otherwise.
    Returns o (..., Nq, dv). ``causal`` is bottom-right aligned: SDPA's ``is_causal=True`` when Nq == Nk (module
    docstring). ``deterministic``: q.grad bitwise reproducible from run to run (tensor cores only; k.grad and
    v.grad always are), at a cost in time (docs/results.md). Works under ``torch.compile(fullgraph=True)``; a
    CUDA graph can capture it on the tensor cores."""
    _check_call(q, k, v, causal, scale)
    if type(deterministic) is not bool:
        raise TypeError(f"deterministic must be a bool; got {type(deterministic).__name__} {deterministic!r}")
    if not on_tensor_cores(q, k, v, BACKWARD_HEAD_DIMS):  # refused now, not after a forward pass
        _refuse_deterministic_off_tensor_cores(q, v, deterministic)
    o, _lse = attention_forward(q, k, v, causal, None if scale is None else float(scale), deterministic)
    return o


def _check_call(q, k, v, causal, scale) -> None:
    """The checks :func:`attention` and :func:`flex_attention` make first: CUDA tensors, a bool causal, a float or
    None scale (a TypeError naming the argument)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or not x.is_cuda:
            raise TypeError(f"{name} must be a CUDA torch.Tensor; got {type(x).__name__}"
                            f"{' on ' + str(x.device) if isinstance(x, torch.Tensor) else ''}")
    if type(causal) is not bool:
        raise TypeError(f"causal must be a bool; got {type(causal).__name__} {causal!r}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"scale must be a float or None; got {type(scale).__name__} {scale!r}")


class FlexAttention(torch.autograd.Function):
    """o = flex_attention(q, k, v, ...) with its backward: the forward saves (q, k, v, o, lse), the user's functions
    and the block mask, and the backward recomputes P from them (:func:`tinyflash.flex_attention_backward`)."""

    @staticmethod
    def forward(ctx, q, k, v, score_mod, mask_mod, block_mask, causal, scale):
        o, lse = flex_forward(q.detach(), k.detach(), v.detach(), score_mod=score_mod, mask_mod=mask_mod,
                              block_mask=block_mask, causal=causal, scale=scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.flex = {"score_mod": score_mod, "mask_mod": mask_mod, "block_mask": block_mask, "causal": causal,
                    "scale": scale}
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = (x.detach() for x in ctx.saved_tensors)
        dq, dk, dv = flex_attention_backward(q, k, v, o, lse, do.detach().contiguous(), **ctx.flex)
        return dq, dk, dv, None, None, None, None, None  # no gradient for the functions, the mask, causal, scale


# numba's launches cannot be traced: torch.compile leaves this call to eager mode (torch.compiler: PyTorch 2.1 on)
@getattr(getattr(torch, "compiler", None), "disable", lambda fn: fn)
def flex_attention(q, k, v, *, score_mod=None, mask_mod=None, block_mask=None, causal: bool = False,
                   scale: Optional[float] = None):
    """Differentiable FlexAttention on CUDA tensors q (Nq, d), (H, Nq, d) or (B, H, Nq, d), k and v (..., Nk, d),
    float16 or bfloat16, d = dv a multiple of 8 up to 256 (k, v may have fewer heads than q): the arguments and the
    result o of :func:`tinyflash.flex_attention` (module docstring: eager mode; a graph break under torch.compile;
    no CUDA graph). q.grad, k.grad and v.grad come from :func:`tinyflash.flex_attention_backward`, through
    score_mod's derivative (``tinyflash.core.dual_source``: score_mod's source must be readable)."""
    _check_call(q, k, v, causal, scale)
    if score_mod is not None and torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        check_derivative(user_function(score_mod, "score_mod", 5))  # a TypeError now, not in the backward
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("tinyflash.torch.flex_attention cannot be captured in a CUDA graph: its kernels launch "
                           "through numba (tinyflash.torch.attention can, on the tensor cores)")
    o, _lse = FlexAttention.apply(q, k, v, score_mod, mask_mod, block_mask, causal,
                                  None if scale is None else float(scale))
    return o
