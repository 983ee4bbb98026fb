"""The packed ("varlen") layout's checks, shared by the forward and the backward over packed sequences.

q (total_q, H, d), k (total_k, H_kv, d), v (total_k, H_kv, dv), and per sequence s the tokens
cu_seqlens[s] .. cu_seqlens[s + 1] - 1 (``tinyflash.forward.varlen`` explains the layout).
"""

from __future__ import annotations

import numbers

import numpy as np

from .checks import SUPPORTED_DTYPES, AttentionProblem, array_dtype, check_attention_inputs


def check_cu_seqlens(cu, name: str, total: int) -> np.ndarray:
    """``cu_seqlens_q`` or ``cu_seqlens_k``: a 1-D integer array (B + 1,) from 0 to ``total``, never decreasing.

    Returns it as int64 NumPy (a copy: the caller's array is left as it is)."""
    if not hasattr(cu, "__len__") and not hasattr(cu, "shape"):
        raise TypeError(f"{name} must be a 1-D integer array of cumulative sequence lengths (B + 1,); "
                        f"got {type(cu).__name__}")
    arr = np.asarray(cu)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers (int32, as FlashAttention's varlen layout has it); got dtype "
                        f"{arr.dtype}")
    if arr.ndim != 1 or arr.shape[0] < 2:
        raise ValueError(f"{name} must have shape (B + 1,) with B >= 1 sequences; got shape {arr.shape}")
    arr = arr.astype(np.int64)
    if arr[0] != 0:
        raise ValueError(f"{name} must start at 0; got {name}[0] = {arr[0]}")
    if np.any(np.diff(arr) < 0):
        s = int(np.argmax(np.diff(arr) < 0))
        raise ValueError(f"{name} must not decrease (sequence lengths >= 0); got {name}[{s}] = {arr[s]} > "
                         f"{name}[{s + 1}] = {arr[s + 1]}")
    if arr[-1] != total:
        raise ValueError(f"{name} must end at the number of packed tokens, {total} (axis 0 of "
                         f"{'q' if name.endswith('_q') else 'k and v'}); got {name}[-1] = {arr[-1]}")
    return arr


def check_max_seqlen(value, name: str, lengths: np.ndarray) -> None:
    """``max_seqlen_q`` / ``max_seqlen_k``: None, or an integer at least the longest sequence's length.

    FlashAttention's kernels size their grid by it; here it is checked against the lengths, so that code
    written for either runs the same."""
    if value is None:
        return
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer or None; got {value!r} of type {type(value).__name__}")
    longest = int(lengths.max())
    if value < longest:
        raise ValueError(f"{name} must be at least the longest sequence's length, {longest}; got {value}")


def check_packed(q, k, v):
    """q (total_q, H, d), k (total_k, H_kv, d), v (total_k, H_kv, dv): the shapes and dtypes of the packed layout."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"{name} must be an array of shape (total, heads, d); got {type(x).__name__}")
        array_dtype(x, name, SUPPORTED_DTYPES)
        if len(x.shape) != 3:
            raise ValueError(f"{name} must have shape (total_tokens, heads, d), FlashAttention's packed layout; "
                             f"got shape {tuple(x.shape)}")
    if k.shape[0] != v.shape[0]:
        raise ValueError(f"k and v must hold the same number of packed tokens (axis 0); got k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")


def heads_first(x):
    """A sequence's slice (n, H, c) as the stages' (H, n, c): a view."""
    return np.swapaxes(x, 0, 1)


def check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                        scale) -> tuple[np.ndarray, np.ndarray, AttentionProblem]:
    """Every check of a packed call: returns ``(cu_q, cu_k, prob)``, the offsets as int64 and the problem of
    one sequence as the stages see it (heads first), whose ``n_q``, ``n_k`` are those of a stand-in token."""
    check_packed(q, k, v)
    cu_q = check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.shape[0])
    cu_k = check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", k.shape[0])
    if cu_q.shape != cu_k.shape:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must describe the same number of sequences; got "
                         f"{cu_q.shape[0] - 1} and {cu_k.shape[0] - 1}")
    check_max_seqlen(max_seqlen_q, "max_seqlen_q", np.diff(cu_q))
    check_max_seqlen(max_seqlen_k, "max_seqlen_k", np.diff(cu_k))
    # The stages' own checks on a stand-in sequence of one token (head counts, head dims, dtype, scale,
    # causal), with a key of zeros when there are no keys at all, so that they run whatever the lengths.
    k1 = k[:1] if k.shape[0] else np.zeros((1, *k.shape[1:]), k.dtype)
    v1 = v[:1] if v.shape[0] else np.zeros((1, *v.shape[1:]), v.dtype)
    q1 = q[:1] if q.shape[0] else np.zeros((1, *q.shape[1:]), q.dtype)
    prob = check_attention_inputs(heads_first(q1), heads_first(k1), heads_first(v1), causal=causal, scale=scale)
    return cu_q, cu_k, prob
