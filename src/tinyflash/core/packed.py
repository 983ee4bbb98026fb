"""The packed ("varlen") layout's checks, shared by the forward and the backward over packed sequences.

q (total_q, H, d), k (total_k, H_kv, d), v (total_k, H_kv, dv), and per sequence s the tokens
cu_seqlens[s] .. cu_seqlens[s + 1] - 1 (``tinyflash.forward.varlen`` explains the layout).
"""

from __future__ import annotations

import numbers

import numpy as np

from .block_mask import EMPTY, FULL, PARTIAL
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


def check_packed(q, k, v, allowed=SUPPORTED_DTYPES):
    """q (total_q, H, d), k (total_k, H_kv, d), v (total_k, H_kv, dv): the shapes and dtypes (among ``allowed``) of
    the packed layout."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"{name} must be an array of shape (total, heads, d); got {type(x).__name__}")
        array_dtype(x, name, allowed)
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
                        scale, allowed=SUPPORTED_DTYPES) -> tuple[np.ndarray, np.ndarray, AttentionProblem]:
    """Every check of a packed call: returns ``(cu_q, cu_k, prob)``, the offsets as int64 and the problem of
    one sequence as the stages see it (heads first), whose ``n_q``, ``n_k`` are those of a stand-in token.
    ``allowed``: the dtypes the call takes (the NumPy stage's, or the tensor cores' 16-bit types)."""
    check_packed(q, k, v, allowed)
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
    prob = check_attention_inputs(heads_first(q1), heads_first(k1), heads_first(v1), causal=causal, scale=scale,
                                  allowed=allowed)
    return cu_q, cu_k, prob


# --- packed sequences as one long row: the rule a kernel applies, and its tiles ------------------------------------


def key_ranges(cu_q: np.ndarray, cu_k: np.ndarray, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per packed query, the packed keys it may see: ``(lo, hi)``, (total_q,) each, keys lo .. hi - 1 (hi <= lo: none).

    Query t of sequence s (cu_q[s] <= t < cu_q[s + 1]) sees the keys of s, cu_k[s] .. cu_k[s + 1] - 1, and with
    ``causal`` (bottom-right within the sequence, as the stages align it) those up to its own position counted
    from the sequence's end: key u is kept where u - cu_k[s + 1] <= t - cu_q[s + 1]."""
    rows = np.arange(int(cu_q[-1]))
    seq = np.searchsorted(cu_q, rows, side="right") - 1  # (total_q,) the last s with cu_q[s] <= t: t's sequence
    lo, hi = cu_k[seq], cu_k[seq + 1]
    if causal:
        hi = np.minimum(hi, rows - cu_q[seq + 1] + cu_k[seq + 1] + 1)
    return lo, np.maximum(hi, lo)


def packed_tile_classes(cu_q: np.ndarray, cu_k: np.ndarray, causal: bool, block_q: int, block_k: int,
                        masked: bool) -> np.ndarray:
    """The tiles of packed sequences seen as one (total_q, total_k) score matrix, (1, 1, Tr, Tc) int8: EMPTY where
    no query of the tile sees a key of it (two different sequences, or past the causal diagonal), FULL where every
    query sees every key, else PARTIAL (``core.block_mask``'s classes). ``masked``: a user's mask_mod applies on
    top, whose keys are not known here, so no tile is FULL, only PARTIAL. Computed from the offsets alone, a query
    tile at a time: no mask evaluated per element."""
    lo, hi = key_ranges(cu_q, cu_k, causal)
    total_q, total_k = lo.shape[0], int(cu_k[-1])
    Tr, Tc = -(-total_q // block_q), -(-total_k // block_k)
    starts = np.arange(Tc) * block_k  # (Tc,) each key tile's first key
    ends = np.minimum(starts + block_k, total_k)  # (Tc,) one past its last
    dense = np.zeros((1, 1, Tr, Tc), dtype=np.int8)
    for i in range(Tr):
        rows = slice(i * block_q, min((i + 1) * block_q, total_q))
        seen = np.minimum(hi[rows, None], ends) - np.maximum(lo[rows, None], starts)  # (rows, Tc) keys each sees
        full = (seen == ends - starts).all(axis=0) & (not masked)
        dense[0, 0, i] = np.where(full, FULL, np.where((seen > 0).any(axis=0), PARTIAL, EMPTY))
    return dense
