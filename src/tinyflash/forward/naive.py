"""Stage 0: attention exactly as the textbook writes it, materialising S and P.

    S = scale · Q Kᵀ          (Nq × Nk scores: the matrix FlashAttention never stores)
    P = softmax(S) row-wise   (Nq × Nk probabilities)
    O = P V                   (Nq × dv output)

Run in float64, this is the trusted reference of the project, :func:`reference_attention`, and
the only one: every later stage, the lessons and the benchmarks are checked against it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..core.checks import as_array, check_attention_inputs
from ..core.heads import group_query_heads, kv_heads_view, ungroup_heads
from ..core.masks import allowed
from ..core.mods import make_mods, modified_scores
from ..core.sinks import check_sinks, sink_scores


def naive_attention(q, k, v, *, causal: bool = False, scale: float | None = None, score_mod=None, mask_mod=None,
                    sinks=None, _index_base=None):
    """Stage 0: textbook softmax attention. Returns ``(o, lse)``.

    q: (..., Nq, d), k: (..., Nk, d), v: (..., Nk, dv), identical leading dims, one float dtype;
    or, grouped-query attention, q (..., H, Nq, d) with k, v (..., H_kv, Nk, ·), H a multiple of H_kv.
    o: (..., Nq, dv) in the input dtype; lse: (..., Nq), the natural-log logsumexp of each row of
    the scaled, masked scores, in float32 (float64 for float64 inputs). float16 inputs are
    computed in float32. ``scale=None`` means 1/sqrt(d). Rows that may attend no key (causal with
    Nq > Nk) give o = 0 and lse = -inf. NaN and ±inf inputs: see docs/using.md, "NaN and ±inf"
    (a NaN or +inf score makes its row NaN; a -inf score gives its key weight 0).

    ``score_mod(score, b, h, q_idx, kv_idx)`` replaces each scaled score; ``mask_mod(b, h, q_idx,
    kv_idx)`` says whether the key is kept, together with ``causal`` (both must keep it); ``sinks``
    (H,) adds one logit per query head to each row's softmax, without a value. All three: docs/using.md,
    "Masks, score modifications and sinks"; None changes nothing. ``_index_base``: see tinyflash.core.mods.
    """
    q, k, v = as_array(q, "q"), as_array(k, "k"), as_array(v, "v")
    prob = check_attention_inputs(q, k, v, causal=causal, scale=scale)
    mods = make_mods(score_mod, mask_mod, prob, _index_base)
    return _textbook(q, k, v, prob, rows=np.arange(prob.n_q), mods=mods, sinks=check_sinks(sinks, prob.lead))


@np.errstate(invalid="ignore")  # NaN and ±inf inputs give NaN rows, as docs/using.md says: no warnings
def _textbook(q, k, v, prob, rows, mods=None, sinks=None):
    """The formula for the query ``rows`` (indices into Nq, which the causal mask needs) of q.

    With grouped-query attention, each query head meets its K/V head through broadcasting views
    (``tinyflash.core.heads``): K and V are never repeated."""
    g = prob.kv_group
    O, lse = _formula(group_query_heads(q, g), kv_heads_view(k, g), kv_heads_view(v, g), prob, rows, mods, sinks)
    return ungroup_heads(O, (*q.shape[:-1], prob.d_v)), ungroup_heads(lse, q.shape[:-1])


def _formula(q, k, v, prob, rows, mods, sinks):
    ct = prob.compute_dtype
    Q, K, V = q.astype(ct, copy=False), k.astype(ct, copy=False), v.astype(ct, copy=False)

    # Written so that exactly two N×N arrays exist at the peak, S and P, as in a plain GPU
    # implementation that stores the logits and the probabilities (in-place steps avoid temporaries).
    S = Q @ np.swapaxes(K, -1, -2)  # (..., Nq, Nk)  <- the N×N score matrix
    S *= prob.scale
    if mods is not None:  # score_mod, then -inf where causal AND mask_mod drop the key (tinyflash.core.mods)
        S, _ = modified_scores(mods, S, rows, np.arange(prob.n_k))
    elif prob.causal:
        # masked pairs get probability 0 (the (Nq, Nk) mask is freed at once: no third N×N array at the peak)
        np.copyto(S, -np.inf, where=~allowed(rows, np.arange(prob.n_k), prob.n_q, prob.n_k))
    m = S.max(axis=-1, keepdims=True)  # (..., Nq, 1) row maxima
    if sinks is not None:  # the sink is one more score per row (core/sinks.py)
        sink = sink_scores(sinks, prob.lead, prob.kv_group, ct)  # (..., 1, 1)
        m = np.maximum(m, sink)  # (..., Nq, 1)
    m_safe = np.where(m == -np.inf, 0.0, m)  # a fully masked row has m = -inf; avoid -inf - -inf
    P = S - m_safe  # (..., Nq, Nk)  <- the second N×N matrix; subtracting the max keeps exp finite
    np.exp(P, out=P)
    l = P.sum(axis=-1, keepdims=True)  # (..., Nq, 1) softmax denominators
    if sinks is not None:
        l += np.exp(sink - m_safe)  # the sink's term: in the denominator, with no value in O
    with np.errstate(invalid="ignore", divide="ignore"):
        P /= l  # P = softmax(S), row by row
        np.copyto(P, 0.0, where=(l == 0))  # rows that may attend no key: probabilities 0, not 0/0
        lse = np.where(l == 0, -np.inf, m_safe + np.log(l))[..., 0]  # (..., Nq)
    O = P @ V  # (..., Nq, dv)
    return O.astype(prob.dtype, copy=False), lse.astype(ct, copy=False)


def reference_attention(q, k, v, *, causal: bool = False, scale: float | None = None, rows=None, score_mod=None,
                        mask_mod=None, sinks=None):
    """The float64 reference every stage is measured against: stage 0 on float64 copies.

    ``score_mod``, ``mask_mod`` and ``sinks`` as for :func:`naive_attention` (sinks in float64).

    Returns ``(o, lse)`` in float64 whatever the input dtype. ``rows``, if given, is a 1-D array
    of query indices (into axis -2 of q): only those rows are computed, against every key, with
    the causal mask of their true positions; o is then (..., len(rows), dv). The benchmarks check
    a sample of rows this way at sequence lengths where all of S would not fit.
    """
    q, k, v = as_array(q, "q"), as_array(k, "k"), as_array(v, "v")
    prob = check_attention_inputs(q, k, v, causal=causal, scale=scale)  # the same errors as every stage
    mods = make_mods(score_mod, mask_mod, prob)
    sinks = check_sinks(sinks, prob.lead)
    if rows is None:
        rows = np.arange(prob.n_q)
    else:
        rows = np.asarray(rows)
        inside = rows.size == 0 or 0 <= rows.min() <= rows.max() < prob.n_q
        if rows.ndim != 1 or rows.dtype.kind not in "iu" or not inside:
            raise ValueError(f"rows must be a 1-D array of query indices in [0, {prob.n_q}); got {rows!r}")
        q = q[..., rows, :]  # (..., rows, d)
    f64 = np.dtype(np.float64)
    prob64 = replace(prob, dtype=f64, compute_dtype=f64)  # the same problem, computed and returned in float64
    sinks = None if sinks is None else sinks.astype(f64)
    return _textbook(q.astype(f64), k.astype(f64), v.astype(f64), prob64, rows, mods, sinks)
