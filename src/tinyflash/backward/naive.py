"""Backward stage 0: the textbook gradients of attention, through the materialised P.

With S = scale · Q Kᵀ, P = softmax(S) row-wise and O = P V, and dO = ∂L/∂O given:

    dV = Pᵀ dO                        (Nk × dv)
    dP = dO Vᵀ                        (Nq × Nk)
    dS = P ∘ (dP − rowsum(dP ∘ P))    (Nq × Nk)  the softmax's Jacobian, row by row
    dQ = scale · dS K                 (Nq × d)
    dK = scale · dSᵀ Q                (Nk × d)

Four Nq × Nk arrays (S, P, dP, dS) exist along the way: the memory FlashAttention's backward
never spends. Run in float64, this is the reference every backward stage is checked against
(:func:`reference_attention_backward`); it is itself checked against finite differences.
"""

from __future__ import annotations

import numpy as np

from ..core.checks import as_array, check_attention_inputs, check_backward_inputs
from ..core.masks import allowed
from ..core.tolerance import to_host64


def naive_attention_backward(q, k, v, do, *, causal: bool = False, scale: float | None = None):
    """Backward stage 0: ``(dq, dk, dv)``, the gradients of a loss L given ``do`` = ∂L/∂o.

    q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv) as for :func:`tinyflash.naive_attention`;
    do (..., Nq, dv) in their dtype. Returns dq, dk, dv shaped and typed like q, k, v (float16
    inputs are computed in float32). A row that may attend no key (causal, Nq > Nk) has o = 0
    whatever q, k and v are: its P row is 0, and so is everything it contributes to a gradient.
    """
    q, k, v, do = as_array(q, "q"), as_array(k, "k"), as_array(v, "v"), as_array(do, "do")
    prob = check_backward_inputs(check_attention_inputs(q, k, v, causal=causal, scale=scale), do)
    ct = prob.compute_dtype
    Q, K, V, dO = (x.astype(ct, copy=False) for x in (q, k, v, do))

    S = prob.scale * (Q @ np.swapaxes(K, -1, -2))  # (..., Nq, Nk) scores
    if prob.causal:
        S = np.where(allowed(range(prob.n_q), np.arange(prob.n_k), prob.n_q, prob.n_k), S, -np.inf)
    m = S.max(axis=-1, keepdims=True)  # (..., Nq, 1)
    m = np.where(m == -np.inf, 0.0, m)  # a fully masked row: avoid -inf - -inf
    P = np.exp(S - m)  # (..., Nq, Nk)
    l = P.sum(axis=-1, keepdims=True)  # (..., Nq, 1)
    P = np.divide(P, l, out=np.zeros_like(P), where=l > 0)  # softmax; rows that see no key: 0

    dV = np.swapaxes(P, -1, -2) @ dO  # (..., Nk, dv)
    dP = dO @ np.swapaxes(V, -1, -2)  # (..., Nq, Nk)
    dS = P * (dP - (dP * P).sum(axis=-1, keepdims=True))  # (..., Nq, Nk)
    dQ = prob.scale * (dS @ K)  # (..., Nq, d)
    dK = prob.scale * (np.swapaxes(dS, -1, -2) @ Q)  # (..., Nk, d)
    return tuple(g.astype(prob.dtype, copy=False) for g in (dQ, dK, dV))


def reference_attention_backward(q, k, v, do, *, causal: bool = False, scale: float | None = None):
    """The float64 reference of the backward: stage 0 on float64 host copies (NumPy, CuPy or numba
    arrays); float64 results."""
    q, k, v, do = (to_host64(x) for x in (q, k, v, do))
    return naive_attention_backward(q, k, v, do, causal=causal, scale=scale)
