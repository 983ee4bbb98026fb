"""tinyflash: FlashAttention explained by running it.

Stages, each checked against the one before and against a float64 reference:

0. :func:`naive_attention` — the textbook formula, materialising S and P (NumPy).
1. :func:`blocked_attention` — FlashAttention's tiles and online softmax (NumPy).
2. :func:`cuda_attention` — the same loop as a numba.cuda kernel with shared-memory tiles.

All return ``(o, lse)`` for q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv).
"""

from .blocked import blocked_attention
from .memory import attention_memory, format_bytes, tile_bytes
from .naive import causal_mask, naive_attention, reference_attention
from .online_softmax import OnlineSoftmax, online_softmax

__all__ = [
    "OnlineSoftmax",
    "attention_memory",
    "blocked_attention",
    "causal_mask",
    "cuda_attention",
    "format_bytes",
    "naive_attention",
    "online_softmax",
    "reference_attention",
    "tile_bytes",
]
__version__ = "0.1.0"


def __getattr__(name):
    # The CUDA stage imports numba, which is slow and must see NUMBA_ENABLE_CUDASIM before it is
    # imported; load it only when asked for.
    if name == "cuda_attention":
        from .cuda_kernel import cuda_attention

        return cuda_attention
    raise AttributeError(f"module 'tinyflash' has no attribute {name!r}")
