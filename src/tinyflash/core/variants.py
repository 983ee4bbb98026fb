"""Ready-made masks and score modifications: each a few lines returning a plain Python closure.

Each closure captures only numbers and NumPy arrays and uses only arithmetic, comparisons,
``&``, ``|``, indexing and ``math``, so that a kernel can compile it as it stands. Masks
(``mask_mod``): :func:`sliding_window`, :func:`prefix_lm`, :func:`document_mask`. Score
modifications (``score_mod``): :func:`softcap`, :func:`alibi`, :func:`relative_bias`. Attention
sinks are an argument of the stages (``sinks=``), not a mod.

**Positions when Nq != Nk.** The causal rule aligns the Nq queries with the last Nq of the Nk keys
(bottom-right): query i stands at key position i + (Nk − Nq). The position-based variants take
that shift as ``offset``: 0 (the default) when Nq = Nk, ``Nk - Nq`` to align them as causal does
(a decode step's queries are the newest tokens).
"""

from __future__ import annotations

import math

import numpy as np


def sliding_window(window: int, *, offset: int = 0):
    """mask_mod: each query sees the ``window`` keys ending at its own position, itself included:
    ``kv_idx <= q_idx + offset`` and ``q_idx + offset - kv_idx < window`` (causal within the window).
    ``window = 1`` is the diagonal alone. Mistral's sliding window of W tokens is ``sliding_window(W)``.
    """
    window, offset = _int(window, "window", 1), _int(offset, "offset")

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx + offset) & (q_idx + offset - kv_idx < window)

    return mask_mod


def prefix_lm(prefix_length: int, *, offset: int = 0):
    """mask_mod: every query sees the first ``prefix_length`` keys (the prefix, bidirectional) and,
    beyond them, the keys up to its own position: ``kv_idx < prefix_length`` or ``kv_idx <= q_idx + offset``."""
    prefix_length, offset = _int(prefix_length, "prefix_length", 0), _int(offset, "offset")

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx < prefix_length) | (kv_idx <= q_idx + offset)

    return mask_mod


def document_mask(document_ids, kv_document_ids=None):
    """mask_mod for packed sequences: a query sees only the keys of its own document.

    ``document_ids``: int array (Nq,), the document of each query (of each token, when Nq = Nk);
    ``kv_document_ids`` (Nk,), the keys' documents, if they differ (default: the same array). Add
    ``causal=True`` to the call for causal attention within each document.
    """
    q_ids = _ids(document_ids, "document_ids")
    if kv_document_ids is None:  # one array, captured once: a kernel keeps what a function captures in its
        ids = q_ids  # constant memory (64 KiB), once per captured array

        def same_ids(b, h, q_idx, kv_idx):
            return ids[q_idx] == ids[kv_idx]

        return same_ids
    kv_ids = _ids(kv_document_ids, "kv_document_ids")

    def mask_mod(b, h, q_idx, kv_idx):
        return q_ids[q_idx] == kv_ids[kv_idx]

    return mask_mod


def softcap(cap: float):
    """score_mod: logit softcapping (Gemma 2, Grok), ``cap · tanh(score / cap)``: scores squashed into (−cap, cap).

    ``cap`` is taken at float32's precision (30, 50, 0.5 are exact). The division uses it as a float32, so that a
    kernel, whose scores are float32, computes ``tanh`` in float32 (a float64 ``tanh`` is a long software
    routine on a GPU); the product uses it as a Python float, so that the float64 reference stays float64."""
    cap = _positive(cap, "cap")
    low, high = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)
    if not low <= cap <= high:
        raise ValueError(f"cap must be finite and > 0 as a float32 (the kernels' scores are float32), between "
                         f"{low:.3g} and {high:.3g}; got {cap}")
    cap32 = np.float32(cap)
    cap = float(cap32)

    def score_mod(score, b, h, q_idx, kv_idx):
        return math.tanh(score / cap32) * cap

    return score_mod


def alibi_slopes(n_heads: int) -> np.ndarray:
    """ALiBi's slopes (H,), as in its paper and BLOOM: for H a power of two, 2^(−8(h+1)/H); otherwise
    those of the power of two below H, then every other slope of twice that power, to make H."""
    n_heads = _int(n_heads, "n_heads", 1)

    def powers(n):  # the geometric sequence for a power of two n: start, start², ..., start^n
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    below = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = powers(below) + powers(2 * below)[0::2][:n_heads - below]
    return np.array(slopes, dtype=np.float64)  # (H,)


def alibi(n_heads: int, *, offset: int = 0):
    """score_mod: ALiBi's linear bias, ``score + slope_h · (kv_idx − q_idx − offset)``: minus slope_h
    times the distance back from the query's position to the key (:func:`alibi_slopes`). h is the
    query head, so ``n_heads`` is H, the number of query heads.

    The slopes are taken at float32's precision and the bias is computed in float32 (the distance as a float32:
    exact below 2^24), so that a kernel, whose scores are float32, adds it without float64 arithmetic (a float64
    slope times an int64 distance is float64 on a GPU); the float64 reference adds the same float32 bias."""
    slopes, offset = alibi_slopes(n_heads).astype(np.float32), _int(offset, "offset")

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * np.float32(kv_idx - q_idx - offset)

    return score_mod


def relative_bias(table):
    """score_mod: a learned bias by head and relative position, ``score + table[h, c]``.

    ``table``: float array (H, 2R + 1). The column is the key's position relative to the query,
    clamped to [−R, R] and shifted to start at 0: ``c = min(max(kv_idx − q_idx, −R), R) + R``, so
    column R is the query's own position, R − 1 the key before it, and keys further than R away
    share the edge columns (T5's buckets, without the logarithmic ones).
    """
    table = np.asarray(table)
    if table.ndim != 2 or table.dtype.kind != "f" or table.shape[1] % 2 != 1:
        raise ValueError(f"table must be a float array (H, 2R + 1) (an odd number of columns); got "
                         f"{table.dtype} {table.shape}")
    reach = (table.shape[1] - 1) // 2  # R

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + table[h, min(max(kv_idx - q_idx, -reach), reach) + reach]

    return score_mod


def _int(value, name: str, lowest: int | None = None) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer; got {value!r} of type {type(value).__name__}")
    if lowest is not None and value < lowest:
        raise ValueError(f"{name} must be >= {lowest}; got {value}")
    return int(value)


def _positive(value, name: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number; got {value!r} of type {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be finite and > 0; got {value}")
    return float(value)


def _ids(ids, name: str) -> np.ndarray:
    """Document ids as the smallest signed integer type that holds them (int8 for up to 127 documents): a kernel
    keeps them in its constant memory, one byte a token where it can. A copy: the caller's array is left alone."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise ValueError(f"{name} must be a 1-D integer array (one document id per token); got {ids.dtype} "
                         f"{ids.shape}")
    low, high = (int(ids.min()), int(ids.max())) if ids.size else (0, 0)
    small = next(t for t in (np.int8, np.int16, np.int32, np.int64)
                 if np.iinfo(t).min <= low and high <= np.iinfo(t).max)
    return ids.astype(small)
