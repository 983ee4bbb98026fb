"""Stage 0: attention exactly as the textbook writes it, materialising S and P.

    S = scale · Q Kᵀ          (Nq × Nk scores: the matrix FlashAttention never stores)
    P = softmax(S) row-wise   (Nq × Nk probabilities)
    O = P V                   (Nq × dv output)

This is the trusted reference of the project: every later stage is checked against it, and
:func:`reference_attention` runs it in float64.
"""

from __future__ import annotations

import numpy as np

from ._checks import as_array, check_attention_inputs


def causal_mask(n_q: int, n_k: int, q_start: int = 0, k_start: int = 0, rows: int | None = None,
                cols: int | None = None) -> np.ndarray:
    """Boolean mask of allowed (query, key) pairs, True where query i may attend key j.

    Bottom-right alignment, as in FlashAttention >= 2.1 and PyTorch's ``is_causal`` for
    Nq == Nk: query i may attend key j iff ``j <= i + (n_k - n_q)``. The optional window
    (``q_start``, ``rows``) × (``k_start``, ``cols``) gives one tile of the full mask.
    """
    rows = n_q - q_start if rows is None else rows
    cols = n_k - k_start if cols is None else cols
    i = np.arange(q_start, q_start + rows)[:, None]  # (rows, 1) query indices
    j = np.arange(k_start, k_start + cols)[None, :]  # (1, cols) key indices
    return j <= i + (n_k - n_q)  # (rows, cols)


def naive_attention(q, k, v, *, causal: bool = False, scale: float | None = None):
    """Stage 0: textbook softmax attention. Returns ``(o, lse)``.

    q: (..., Nq, d), k: (..., Nk, d), v: (..., Nk, dv), identical leading dims, one float dtype.
    o: (..., Nq, dv) in the input dtype; lse: (..., Nq), the natural-log logsumexp of each row of
    the scaled, masked scores, in float32 (float64 for float64 inputs). float16 inputs are
    computed in float32. ``scale=None`` means 1/sqrt(d). Rows that may attend no key (causal with
    Nq > Nk) give o = 0 and lse = -inf.
    """
    q, k, v = as_array(q, "q"), as_array(k, "k"), as_array(v, "v")
    prob = check_attention_inputs(q, k, v, causal=causal, scale=scale)
    ct = prob.compute_dtype
    Q, K, V = q.astype(ct, copy=False), k.astype(ct, copy=False), v.astype(ct, copy=False)

    # Written so that exactly two N×N arrays exist at the peak, S and P, as in a plain GPU
    # implementation that stores the logits and the probabilities (in-place steps avoid temporaries).
    S = Q @ np.swapaxes(K, -1, -2)  # (..., Nq, Nk)  <- the N×N score matrix
    S *= prob.scale
    if prob.causal:
        np.copyto(S, -np.inf, where=~causal_mask(prob.n_q, prob.n_k))  # masked pairs get probability 0
    m = S.max(axis=-1, keepdims=True)  # (..., Nq, 1) row maxima
    m_safe = np.where(m == -np.inf, 0.0, m)  # a fully masked row has m = -inf; avoid -inf - -inf
    P = S - m_safe  # (..., Nq, Nk)  <- the second N×N matrix; subtracting the max keeps exp finite
    np.exp(P, out=P)
    l = P.sum(axis=-1, keepdims=True)  # (..., Nq, 1) softmax denominators
    with np.errstate(invalid="ignore", divide="ignore"):
        P /= l  # P = softmax(S), row by row
        np.copyto(P, 0.0, where=(l == 0))  # rows that may attend no key: probabilities 0, not 0/0
        lse = np.where(l == 0, -np.inf, m_safe + np.log(l))[..., 0]  # (..., Nq)
    O = P @ V  # (..., Nq, dv)
    return O.astype(prob.dtype, copy=False), lse.astype(ct, copy=False)


def reference_attention(q, k, v, *, causal: bool = False, scale: float | None = None):
    """The float64 reference every stage is measured against: stage 0 on float64 copies.

    Returns ``(o, lse)`` in float64 whatever the input dtype.
    """
    q, k, v = as_array(q, "q"), as_array(k, "k"), as_array(v, "v")
    check_attention_inputs(q, k, v, causal=causal, scale=scale)  # the same errors as every stage
    f64 = np.float64
    return naive_attention(q.astype(f64), k.astype(f64), v.astype(f64), causal=causal, scale=scale)
