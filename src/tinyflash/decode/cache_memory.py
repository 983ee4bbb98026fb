"""How many bytes a KV cache takes, for a model shape.

Each layer keeps, for every token of every sequence, one key and one value vector per K/V head:

    bytes = 2 (K and V) · layers · batch · context · H_kv · d · bytes per element

It grows linearly with the context and does not depend on the number of query heads: that is
what grouped-query attention (H_kv < H) and multi-query attention (H_kv = 1) shrink, by H / H_kv.
A quantised cache (int8: 1 byte per element, plus a scale per vector, ignored here) halves it again.
"""

from __future__ import annotations

from ..core.checks import check_positive_int


def kv_cache_bytes(*, layers: int, kv_heads: int, head_dim: int, context: int, batch: int = 1,
                   bytes_per_element: int = 2) -> int:
    """Bytes of K and V for ``batch`` sequences of ``context`` tokens (float16: 2 bytes per element)."""
    for name, value in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim), ("context", context),
                        ("batch", batch), ("bytes_per_element", bytes_per_element)):
        check_positive_int(value, name)
    return 2 * layers * batch * context * kv_heads * head_dim * bytes_per_element



def attention_intensity(*, heads: int, kv_heads: int, n_q: int, n_k: int, head_dim: int,
                        bytes_per_element: int = 2) -> float:
    """FLOPs per byte read or written of one attention call (one layer, one sequence).

    FLOPs: 4·H·Nq·Nk·d (Q Kᵀ and P V, a multiply-add counted as 2). Bytes: Q and O (H·Nq·d each)
    plus K and V (H_kv·Nk·d each), each moved once, as FlashAttention moves them. Decoding
    (Nq = 1) does about 2·H/H_kv FLOPs per element of K and V: 1 per byte in float16 without
    GQA, whatever Nk is, while an H200 can do about 200 per byte it reads.
    """
    flops = 4 * heads * n_q * n_k * head_dim
    elements = 2 * heads * n_q * head_dim + 2 * kv_heads * n_k * head_dim
    return flops / (elements * bytes_per_element)
