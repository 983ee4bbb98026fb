"""Grouped-query attention (GQA) and multi-query attention (MQA) without copying K and V.

With H query heads and H_kv K/V heads (H a multiple of H_kv), query head h reads K/V head

    kv_head = h // kv_group,     kv_group = H / H_kv

(the ``kv_group`` query heads h = kv_head·kv_group ... kv_head·kv_group + kv_group - 1 share
one K/V head). The NumPy stages compute it with two views, never a repeated K or V:

    q (..., H, Nq, d)      -> (..., H_kv, kv_group, Nq, d)   :func:`group_query_heads` (a reshape)
    k (..., H_kv, Nk, d)   -> (..., H_kv, 1, Nk, d)          :func:`kv_heads_view` (a new axis)

and NumPy's broadcasting pairs every query head of a group with its one K/V head; the results
are reshaped back with :func:`ungroup_heads`. The kernels do the same with an index:
``kv_head = head // kv_group``.
"""

from __future__ import annotations


def group_query_heads(x, kv_group: int):
    """(..., H, N, c) -> (..., H_kv, kv_group, N, c); unchanged when kv_group is 1."""
    if kv_group == 1:
        return x
    *lead, h, n, c = x.shape
    return x.reshape(*lead, h // kv_group, kv_group, n, c)  # (..., H_kv, kv_group, N, c)


def kv_heads_view(x, kv_group: int):
    """(..., H_kv, Nk, c) -> (..., H_kv, 1, Nk, c): a view that broadcasts over the group's query heads."""
    if kv_group == 1:
        return x
    return x[..., None, :, :]  # (..., H_kv, 1, Nk, c), no copy


def ungroup_heads(x, shape: tuple):
    """The inverse of :func:`group_query_heads` for a result: reshaped to ``shape`` (..., H, ...)."""
    return x.reshape(shape)
