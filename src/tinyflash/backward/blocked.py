"""Backward stage 1: FlashAttention-2's backward in NumPy — recompute P tile by tile from the saved lse.

The forward kept only O and lse (O(N) extra memory). The backward never rebuilds the Nq × Nk
matrices: it recomputes each tile of P from the scores and lse, P_ij = exp(S_ij − lse_i), which
needs neither m_i nor l_i. Written the way the kernel (``tinyflash.backward.kernels``) runs it:

    D = rowsum(dO ∘ O)                                  <- a first small kernel, (Nq,) per head
    for each key/value tile K_j, V_j (Bc rows):         <- one GPU thread block
        dK_j = 0, dV_j = 0                              <- accumulated on chip (registers)
        for each query tile Q_i (Br rows) that sees K_j:    (causal: earlier tiles are skipped)
            S_ij  = scale · Q_i K_jᵀ                    scores (Br × Bc, on chip only)
            S_ij  = -inf where masked                   mask (tiles crossing the diagonal or Nk)
            P_ij  = exp(S_ij − lse_i)                   recomputed probabilities
            dV_j += P_ijᵀ dO_i
            dP_ij = dO_i V_jᵀ
            dS_ij = P_ij ∘ (dP_ij − D_i)
            dK_j += dS_ijᵀ Q_i
            dQ_i += scale · dS_ij K_j                   <- added into HBM (atomics on the GPU)
        dK_j = scale · dK_j; write dK_j, dV_j           <- the block's only writes of dK, dV

Why D_i = rowsum(dO_i ∘ O_i) equals rowsum(dP_ij ∘ P_ij) summed over all tiles j: that sum is
Σ_k P[r, k] (dO[r] · V[k]) = dO[r] · Σ_k P[r, k] V[k] = dO[r] · O[r]. One (Nq,) vector replaces a
second pass over every key. The causal bounds are :func:`tinyflash.core.masks.key_stop`.

With a mask_mod (or a block mask), the query tiles a key tile meets are the block mask's
transposed lists (``tinyflash.core.block_mask``). With a score_mod f, S_ij is f(scale · Q_i K_jᵀ)
and dS_ij is multiplied by f'(scale · Q_i K_jᵀ), which dual numbers give from f alone
(``tinyflash.core.mods``). With sinks, dsink = −Σ_rows exp(sink − lse) · D, beside D
(``tinyflash.core.sinks``).
"""

from __future__ import annotations

import numpy as np

from ..core.checks import (
    as_array,
    check_attention_inputs,
    check_backward_inputs,
    check_positive_int,
)
from ..core.block_mask import call_block_mask, query_tile_schedule
from ..core.masks import causal_mask
from ..core.mods import make_mods, modified_scores
from ..core.sinks import check_sinks, sink_gradient


def blocked_attention_backward(q, k, v, o, lse, do, *, causal: bool = False, scale: float | None = None,
                               block_q: int = 64, block_k: int = 64, score_mod=None, mask_mod=None, block_mask=None,
                               sinks=None, _index_base=None):
    """Backward stage 1: FlashAttention-2's tiled backward in NumPy. Returns ``(dq, dk, dv)``.

    ``o`` and ``lse`` are what a forward stage returned for the same q, k, v, causal and scale;
    ``do`` = ∂L/∂o. ``block_q`` (Br) and ``block_k`` (Bc) are the tile sizes; they need not divide
    Nq or Nk. No array of size Nq × Nk is ever allocated.

    ``score_mod``, ``mask_mod``, ``block_mask`` and ``sinks`` as for the forward
    (:func:`tinyflash.blocked_attention`), the same as the forward was given; with ``sinks``, a
    fourth result: dsinks (H,), in the sinks' dtype.
    """
    q, k, v, o, lse, do = (as_array(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (o, "o"), (lse, "lse"),
                                                        (do, "do")))
    prob = check_backward_inputs(check_attention_inputs(q, k, v, causal=causal, scale=scale), do, o, lse)
    Br, Bc = check_positive_int(block_q, "block_q"), check_positive_int(block_k, "block_k")
    mods = make_mods(score_mod, mask_mod, prob, _index_base, always=block_mask is not None)
    block_mask, mods = call_block_mask(block_mask, mods, Br, Bc)  # None: the causal rule's tiles
    sinks = check_sinks(sinks, prob.lead)
    compute, n_q, n_k = prob.compute_dtype, prob.n_q, prob.n_k
    Tc = -(-n_k // Bc)  # number of key/value tiles (ceil)

    D = (do.astype(compute) * o.astype(compute)).sum(axis=-1)  # (..., Nq) rowsum(dO ∘ O)
    lse_safe = np.where(lse == -np.inf, np.inf, lse).astype(compute)  # (..., Nq) rows that see no key: P = 0
    dQ = np.zeros((*prob.lead, n_q, prob.d), dtype=compute)  # (..., Nq, d) accumulated over key tiles
    dK = np.empty(k.shape, dtype=prob.dtype)  # (..., Nk, d)
    dV = np.empty(v.shape, dtype=prob.dtype)  # (..., Nk, dv)
    for j in range(Tc):  # one key/value tile: one thread block on the GPU
        k_start = j * Bc
        k_end = min(k_start + Bc, n_k)  # ragged last tile
        K_j = k[..., k_start:k_end, :].astype(compute, copy=False)  # (..., Bc, d)
        V_j = v[..., k_start:k_end, :].astype(compute, copy=False)  # (..., Bc, dv)
        dK_j = np.zeros(K_j.shape, dtype=compute)  # (..., Bc, d)  on chip
        dV_j = np.zeros(V_j.shape, dtype=compute)  # (..., Bc, dv) on chip
        # the query tiles that see K_j, and which need the per-element mask (causal: key_stop; else the block mask)
        for i, masked in query_tile_schedule(block_mask, j, n_q, n_k, Br, Bc, prob.causal):
            q_start = i * Br
            q_end = min(q_start + Br, n_q)
            Q_i = q[..., q_start:q_end, :].astype(compute, copy=False)  # (..., Br, d)
            dO_i = do[..., q_start:q_end, :].astype(compute, copy=False)  # (..., Br, dv)

            S_ij = prob.scale * (Q_i @ np.swapaxes(K_j, -1, -2))  # (..., Br, Bc) on chip only
            slope = None  # d score_mod / d score (..., Br, Bc), with a score_mod
            if mods is not None:  # score_mod (and its derivative), then causal AND mask_mod on masked tiles
                S_ij, slope = modified_scores(mods, S_ij, np.arange(q_start, q_end), np.arange(k_start, k_end),
                                              mask=masked, derivative=True)
            elif masked:  # the mask rule of the forward
                S_ij = np.where(causal_mask(n_q, n_k, q_start, k_start, q_end - q_start, k_end - k_start),
                                S_ij, -np.inf)  # (..., Br, Bc)
            P_ij = np.exp(S_ij - lse_safe[..., q_start:q_end, None])  # (..., Br, Bc) recomputed P
            dV_j += np.swapaxes(P_ij, -1, -2) @ dO_i  # (..., Bc, dv)
            dP_ij = dO_i @ np.swapaxes(V_j, -1, -2)  # (..., Br, Bc)
            dS_ij = P_ij * (dP_ij - D[..., q_start:q_end, None])  # (..., Br, Bc)
            if slope is not None:  # through score_mod: dS of the raw score; 0 where P is 0 (masked keys)
                with np.errstate(invalid="ignore"):
                    dS_ij = np.where(P_ij != 0, dS_ij * slope, 0.0)  # (..., Br, Bc)
            dK_j += np.swapaxes(dS_ij, -1, -2) @ Q_i  # (..., Bc, d)
            dQ[..., q_start:q_end, :] += prob.scale * (dS_ij @ K_j)  # (..., Br, d) into HBM
        dK[..., k_start:k_end, :] = prob.scale * dK_j  # the tile's only writes
        dV[..., k_start:k_end, :] = dV_j
    if sinks is None:
        return dQ.astype(prob.dtype, copy=False), dK, dV
    return dQ.astype(prob.dtype, copy=False), dK, dV, sink_gradient(sinks, lse.astype(compute), D, prob.lead)
