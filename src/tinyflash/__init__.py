"""tinyflash: FlashAttention explained by running it.

Stages, each checked against the one before and against a float64 reference:

0. :func:`naive_attention` — the textbook formula, materialising S and P (NumPy).
1. :func:`blocked_attention` — FlashAttention's tiles and online softmax (NumPy).
2. :func:`cuda_attention` — the same loop as numba.cuda kernels with shared-memory tiles.
3. :func:`tensor_core_attention` — the same loop on the tensor cores (float16, bfloat16), with
   PTX instructions emitted from numba.

All return ``(o, lse)`` for q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv).

The package, one home for each idea:

    core/      the rules of the mathematics, each written once: input checks, the causal mask,
               the online softmax, the tolerance rules
    forward/   the forward pass: naive.py (stage 0, and the float64 reference), blocked.py
               (stage 1), cuda.py (stage 2's host wrapper), tensor_cores.py (stage 3's), kernels/
               (the kernel versions)
    gpu/       the GPU runtime, no attention mathematics: device arrays, shared memory, tile
               loads, launches
    measure/   tooling, not teaching code: memory model, HBM traffic, the benchmark harness, figures
    backward/  the backward pass: naive.py, blocked.py (recomputation from lse), cuda.py, kernels/
    decode/    decoding with a KV cache: split-KV (Flash-Decoding), grouped-query attention, a paged cache

``python -m tinyflash.bench`` and ``python -m tinyflash.plots`` are the two commands of measure/.
"""

from .backward.blocked import blocked_attention_backward
from .backward.naive import naive_attention_backward, reference_attention_backward
from .core.masks import causal_mask
from .core.online_softmax import OnlineSoftmax, online_softmax
from .decode.cache_memory import kv_cache_bytes
from .decode.paged import paged_attention
from .decode.split_kv import split_kv_attention
from .forward.blocked import blocked_attention
from .forward.naive import naive_attention, reference_attention
from .measure.memory import attention_memory, format_bytes, tile_bytes

__all__ = [
    "OnlineSoftmax",
    "attention_memory",
    "blocked_attention",
    "blocked_attention_backward",
    "causal_mask",
    "cuda_attention",
    "cuda_attention_backward",
    "cuda_paged_attention",
    "cuda_split_kv_attention",
    "format_bytes",
    "kv_cache_bytes",
    "naive_attention",
    "naive_attention_backward",
    "online_softmax",
    "paged_attention",
    "reference_attention",
    "tensor_core_attention",
    "reference_attention_backward",
    "split_kv_attention",
    "tile_bytes",
]
__version__ = "0.1.0"


def __getattr__(name):
    # The CUDA stage imports numba, which is slow and must see NUMBA_ENABLE_CUDASIM before it is
    # imported; load it only when asked for.
    if name == "cuda_attention":
        from .forward.cuda import cuda_attention

        return cuda_attention
    if name == "tensor_core_attention":
        from .forward.tensor_cores import tensor_core_attention

        return tensor_core_attention
    if name == "cuda_attention_backward":
        from .backward.cuda import cuda_attention_backward

        return cuda_attention_backward
    if name in ("cuda_split_kv_attention", "cuda_paged_attention"):
        from .decode import cuda

        return getattr(cuda, name)
    raise AttributeError(f"module 'tinyflash' has no attribute {name!r}")
