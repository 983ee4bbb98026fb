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
