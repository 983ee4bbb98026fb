"""Stage 1: FlashAttention in NumPy — tiles of Q, K, V and the online softmax.

The loops are written the way the GPU kernel of stage 2 runs them, with the same names:

    for each query tile Q_i (Br rows):                 <- one GPU thread block
        m_i = -inf, l_i = 0, acc = 0                   <- state kept on chip (registers)
        for each key/value tile K_j, V_j (Bc rows):    <- loaded into shared memory
            S_ij = scale · Q_i K_jᵀ                    (Br × Bc, never written to HBM)
            m_new = max(m_i, rowmax(S_ij))
            P_ij  = exp(S_ij - m_new)
            alpha = exp(m_i - m_new)                   <- rescales what came before
            l_i   = alpha · l_i + rowsum(P_ij)
            acc   = alpha · acc + P_ij V_j
            m_i   = m_new
        O_i = acc / l_i,  lse_i = m_i + log(l_i)       <- the only writes to HBM

Only Br × Bc scores exist at any time; nothing of size Nq × Nk is ever allocated.
"""

from __future__ import annotations

import numpy as np

from ._checks import as_array, check_attention_inputs, check_positive_int
from .naive import causal_mask


def last_allowed_key(i: int, n_q: int, n_k: int) -> int:
    """Causal (bottom-right aligned): the last key that query ``i`` may attend; -1 if none."""
    return min(i + (n_k - n_q), n_k - 1)


def blocked_attention(q, k, v, *, causal: bool = False, scale: float | None = None, block_q: int = 64,
                      block_k: int = 64, io=None):
    """Stage 1: FlashAttention's tiled loop with the online softmax, in NumPy. Returns ``(o, lse)``.

    Same contract as :func:`tinyflash.naive_attention`. ``block_q`` (Br) and ``block_k`` (Bc) are
    the tile sizes; they need not divide Nq or Nk (the last tile is ragged). With ``causal=True``,
    key tiles that lie entirely above the diagonal are skipped, not computed and masked.
    ``io``, if given, is a :class:`tinyflash.traffic.HBMCounter` told of every tile read from and
    written to main memory, as the GPU kernel would move them.
    """
    q, k, v = as_array(q, "q"), as_array(k, "k"), as_array(v, "v")
    prob = check_attention_inputs(q, k, v, causal=causal, scale=scale)
    Br, Bc = check_positive_int(block_q, "block_q"), check_positive_int(block_k, "block_k")
    ct, n_q, n_k = prob.compute_dtype, prob.n_q, prob.n_k
    Tr, Tc = -(-n_q // Br), -(-n_k // Bc)  # number of query tiles, of key/value tiles (ceil)

    O = np.empty(prob.out_shape, dtype=prob.dtype)  # (..., Nq, dv) the output, in HBM
    lse = np.empty(prob.lse_shape, dtype=ct)  # (..., Nq)     log-sum-exp per row, in HBM
    for i in range(Tr):  # one query tile: one thread block on the GPU
        q_start = i * Br
        q_end = min(q_start + Br, n_q)  # ragged last tile: q_end - q_start <= Br
        Q_i = q[..., q_start:q_end, :].astype(ct, copy=False)  # (..., Br, d)  load Q_i once
        if io is not None:
            io.read("Q", q[..., q_start:q_end, :])
        m_i = np.full((*prob.lead, q_end - q_start), -np.inf, dtype=ct)  # (..., Br) running row max
        l_i = np.zeros((*prob.lead, q_end - q_start), dtype=ct)  # (..., Br) running denominator
        acc = np.zeros((*prob.lead, q_end - q_start, prob.d_v), dtype=ct)  # (..., Br, dv) unnormalised O_i
        # Causal: the last key any row of this tile may see. Tiles starting after it are skipped.
        k_last = last_allowed_key(q_end - 1, n_q, n_k) if prob.causal else n_k - 1
        for j in range(Tc):  # one key/value tile
            k_start = j * Bc
            if k_start > k_last:
                break  # this tile and all later ones are entirely masked: skip, don't compute
            k_end = min(k_start + Bc, n_k)
            K_j = k[..., k_start:k_end, :].astype(ct, copy=False)  # (..., Bc, d)
            V_j = v[..., k_start:k_end, :].astype(ct, copy=False)  # (..., Bc, dv)
            if io is not None:
                io.read("K", k[..., k_start:k_end, :])
                io.read("V", v[..., k_start:k_end, :])

            S_ij = prob.scale * (Q_i @ np.swapaxes(K_j, -1, -2))  # (..., Br, Bc) scores, on chip only
            # Only tiles that cross the diagonal need the mask: for the others every pair is allowed.
            if prob.causal and k_end - 1 > last_allowed_key(q_start, n_q, n_k):
                S_ij = np.where(causal_mask(n_q, n_k, q_start, k_start, q_end - q_start, k_end - k_start),
                                S_ij, -np.inf)  # (..., Br, Bc)
            m_new = np.maximum(m_i, S_ij.max(axis=-1))  # (..., Br)
            m_safe = np.where(m_new == -np.inf, 0.0, m_new)  # rows with no allowed key yet: avoid -inf - -inf
            P_ij = np.exp(S_ij - m_safe[..., None])  # (..., Br, Bc) unnormalised probabilities
            alpha = np.exp(m_i - m_safe)  # (..., Br) exp(m_old - m_new): rescales the old state
            l_i = alpha * l_i + P_ij.sum(axis=-1)  # (..., Br)
            acc = alpha[..., None] * acc + P_ij @ V_j  # (..., Br, dv)
            m_i = m_new

        with np.errstate(invalid="ignore", divide="ignore"):  # l_i == 0 only for fully masked rows
            O[..., q_start:q_end, :] = np.where(l_i[..., None] == 0, 0.0, acc / l_i[..., None])  # (..., Br, dv)
            lse[..., q_start:q_end] = np.where(l_i == 0, -np.inf, m_i + np.log(l_i))  # (..., Br)
        if io is not None:
            io.write("O", O[..., q_start:q_end, :])
            io.write("lse", lse[..., q_start:q_end])
    return O, lse
