"""Backward stage 0: the textbook gradients of attention, through the materialised P.

With S = scale · Q Kᵀ, P = softmax(S) row-wise and O = P V, and dO = ∂L/∂O given:

    dV = Pᵀ dO                        (Nk × dv)
    dP = dO Vᵀ                        (Nq × Nk)
    dS = P ∘ (dP − rowsum(dP ∘ P))    (Nq × Nk)  the softmax's Jacobian, row by row
    dQ = scale · dS K                 (Nq × d)
    dK = scale · dSᵀ Q                (Nk × d)

Four Nq × Nk arrays (S, P, dP, dS) exist along the way: the memory FlashAttention's backward
never spends. With a score_mod f, S above is f(scale · Q Kᵀ) and dS is multiplied by f'
(from dual numbers, tinyflash.core.mods) before dQ and dK; with sinks, their gradient is
tinyflash.core.sinks's. Run in float64, this is the reference every backward stage is checked against
(:func:`reference_attention_backward`); it is itself checked against finite differences.
"""

from __future__ import annotations

import numpy as np

from ..core.checks import as_array, check_attention_inputs, check_backward_inputs
from ..core.masks import allowed
from ..core.mods import make_mods, modified_scores
from ..core.sinks import check_sinks, sink_gradient, sink_scores
from ..core.tolerance import to_host64


def naive_attention_backward(q, k, v, do, *, causal: bool = False, scale: float | None = None, score_mod=None,
                             mask_mod=None, sinks=None, _index_base=None):
    """Backward stage 0: ``(dq, dk, dv)``, the gradients of a loss L given ``do`` = ∂L/∂o.

    q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv) as for :func:`tinyflash.naive_attention`;
    do (..., Nq, dv) in their dtype. Returns dq, dk, dv shaped and typed like q, k, v (float16
    inputs are computed in float32). A row that may attend no key (causal, Nq > Nk) has o = 0
    whatever q, k and v are: its P row is 0, and so is everything it contributes to a gradient.

    ``score_mod``, ``mask_mod`` and ``sinks`` as for the forward (:func:`tinyflash.naive_attention`);
    with ``sinks``, a fourth result: dsinks (H,), in the sinks' dtype.
    """
    q, k, v, do = as_array(q, "q"), as_array(k, "k"), as_array(v, "v"), as_array(do, "do")
    prob = check_backward_inputs(check_attention_inputs(q, k, v, causal=causal, scale=scale), do)
    mods = make_mods(score_mod, mask_mod, prob, _index_base)
    sinks = check_sinks(sinks, prob.lead)
    ct = prob.compute_dtype
    Q, K, V, dO = (x.astype(ct, copy=False) for x in (q, k, v, do))

    S = prob.scale * (Q @ np.swapaxes(K, -1, -2))  # (..., Nq, Nk) scores
    slope = None  # d score_mod / d score, (..., Nq, Nk), with a score_mod
    if mods is not None:
        S, slope = modified_scores(mods, S, np.arange(prob.n_q), np.arange(prob.n_k), derivative=True)
    elif prob.causal:
        S = np.where(allowed(range(prob.n_q), np.arange(prob.n_k), prob.n_q, prob.n_k), S, -np.inf)
    m = S.max(axis=-1, keepdims=True)  # (..., Nq, 1)
    if sinks is not None:
        sink = sink_scores(sinks, prob.lead, 1, ct)  # (..., 1, 1) one more score per row, without a value
        m = np.maximum(m, sink)
    m = np.where(m == -np.inf, 0.0, m)  # a fully masked row: avoid -inf - -inf
    P = np.exp(S - m)  # (..., Nq, Nk)
    l = P.sum(axis=-1, keepdims=True)  # (..., Nq, 1)
    if sinks is not None:
        l = l + np.exp(sink - m)  # the sink's term of the denominator
    P = np.divide(P, l, out=np.zeros_like(P), where=l > 0)  # softmax; rows that see no key: 0

    dV = np.swapaxes(P, -1, -2) @ dO  # (..., Nk, dv)
    dP = dO @ np.swapaxes(V, -1, -2)  # (..., Nq, Nk)
    D = (dP * P).sum(axis=-1, keepdims=True)  # (..., Nq, 1) = rowsum(dO ∘ O)
    dS = P * (dP - D)  # (..., Nq, Nk) the gradient of the (modified) scores
    if slope is not None:  # chain rule through score_mod; 0 where P is (masked keys' slopes may be anything)
        with np.errstate(invalid="ignore"):
            dS = np.where(P != 0, dS * slope, 0.0)  # (..., Nq, Nk)
    dQ = prob.scale * (dS @ K)  # (..., Nq, d)
    dK = prob.scale * (np.swapaxes(dS, -1, -2) @ Q)  # (..., Nk, d)
    grads = tuple(g.astype(prob.dtype, copy=False) for g in (dQ, dK, dV))
    if sinks is None:
        return grads
    with np.errstate(divide="ignore"):
        lse = np.where(l > 0, m + np.log(l), -np.inf)[..., 0]  # (..., Nq)
    return (*grads, sink_gradient(sinks, lse, D[..., 0], prob.lead))


def reference_attention_backward(q, k, v, do, *, causal: bool = False, scale: float | None = None, score_mod=None,
                                 mask_mod=None, sinks=None):
    """The float64 reference of the backward: stage 0 on float64 host copies (NumPy, CuPy or numba
    arrays); float64 results (dsinks too, with ``sinks``)."""
    q, k, v, do = (to_host64(x) for x in (q, k, v, do))
    sinks = None if sinks is None else to_host64(sinks)
    return naive_attention_backward(q, k, v, do, causal=causal, scale=scale, score_mod=score_mod,
                                    mask_mod=mask_mod, sinks=sinks)
