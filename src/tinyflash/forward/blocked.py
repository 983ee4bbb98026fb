"""Stage 1: FlashAttention in NumPy — tiles of Q, K, V and the online softmax.

The loops are written the way the GPU kernels of stage 2 run them, with the same names:

    for each query tile Q_i (Br rows):                 <- one GPU thread block
        m_i = -inf, l_i = 0, acc = 0                   <- state kept on chip (registers)
        for each key/value tile K_j, V_j (Bc rows):    <- loaded into shared memory
            S_ij = scale · Q_i K_jᵀ                    scores (Br × Bc, never written to HBM)
            S_ij = -inf where masked                   mask (only tiles crossing the diagonal or Nk)
            m_new = max(m_i, rowmax(S_ij))             row max
            P_ij  = exp(S_ij - m_new)                  \\
            alpha = exp(m_i - m_new)                    | rescale: alpha puts what came before
            l_i   = alpha · l_i + rowsum(P_ij)          | on the scale of the new maximum
            acc   = alpha · acc + P_ij V_j             /  P·V
            m_i   = m_new
        O_i = acc / l_i,  lse_i = m_i + log(l_i)       epilogue: the only writes to HBM

The lines from "row max" to "P·V" are the online softmax, written once in
:func:`tinyflash.core.online_softmax.online_softmax_update`; the epilogue is
:func:`~tinyflash.core.online_softmax.online_softmax_finish`; the causal bounds are
:func:`tinyflash.core.masks.key_stop`. The kernels name their phases after these lines.
Only Br × Bc scores exist at any time; nothing of size Nq × Nk is ever allocated.

With a mask_mod (or a block mask), the key tiles a query tile visits are the block mask's
(``tinyflash.core.block_mask``): empty tiles skipped, partial ones masked per element, full ones
taken whole. A score_mod rewrites each tile's scores before the mask, and attention sinks join
the online softmax as a last chunk of one score per row with a zero value.
"""

from __future__ import annotations

import numpy as np

from ..core.checks import as_array, check_attention_inputs, check_positive_int
from ..core.heads import group_query_heads, kv_heads_view, ungroup_heads
from ..core.block_mask import call_block_mask, key_tile_schedule
from ..core.masks import causal_mask
from ..core.mods import make_mods, modified_scores
from ..core.online_softmax import online_softmax_finish, online_softmax_update
from ..core.sinks import check_sinks, sink_scores


@np.errstate(invalid="ignore")  # NaN and ±inf inputs: NaN rows as in stage 0, no warnings (docs/using.md)
def blocked_attention(q, k, v, *, causal: bool = False, scale: float | None = None, block_q: int = 64,
                      block_k: int = 64, io=None, score_mod=None, mask_mod=None, block_mask=None, sinks=None,
                      _index_base=None):
    """Stage 1: FlashAttention's tiled loop with the online softmax, in NumPy. Returns ``(o, lse)``.

    Same contract as :func:`tinyflash.naive_attention`. ``block_q`` (Br) and ``block_k`` (Bc) are
    the tile sizes; they need not divide Nq or Nk (the last tile is ragged). With ``causal=True``,
    key tiles that lie entirely above the diagonal are skipped, not computed and masked.
    ``io``, if given, is a :class:`tinyflash.cost.traffic.HBMCounter` told of every tile read
    from and written to main memory, as the GPU kernel would move them.

    ``score_mod``, ``mask_mod`` and ``sinks`` as for :func:`tinyflash.naive_attention`. With a
    mask_mod, the key tiles it empties are skipped and only the tiles it cuts are masked per
    element, as a :class:`tinyflash.BlockMask` says: ``block_mask`` if given (built with
    ``block_q``, ``block_k`` and ``causal`` equal to the call's; it brings its own mask_mod), else
    one built from mask_mod. ``_index_base``: see tinyflash.core.mods.
    """
    q, k, v = as_array(q, "q"), as_array(k, "k"), as_array(v, "v")
    prob = check_attention_inputs(q, k, v, causal=causal, scale=scale)
    Br, Bc = check_positive_int(block_q, "block_q"), check_positive_int(block_k, "block_k")
    mods = make_mods(score_mod, mask_mod, prob, _index_base, always=block_mask is not None)
    block_mask, mods = call_block_mask(block_mask, mods, Br, Bc)  # None: the causal rule's tiles
    sinks = check_sinks(sinks, prob.lead)
    compute, n_q, n_k = prob.compute_dtype, prob.n_q, prob.n_k
    Tr = -(-n_q // Br)  # number of query tiles (ceil)

    # Grouped-query attention: each query head meets its K/V head through views (core/heads.py).
    g, k_in, v_in = prob.kv_group, k, v  # k_in, v_in: the arrays in HBM, for the io counter
    q, k, v = group_query_heads(q, g), kv_heads_view(k, g), kv_heads_view(v, g)  # (..., H_kv, g, N, ·) or as given
    lead = q.shape[:-2]  # the leading dims of the (grouped) query heads

    O = np.empty((*lead, n_q, prob.d_v), dtype=prob.dtype)  # (..., Nq, dv) the output, in HBM
    lse = np.empty((*lead, n_q), dtype=compute)  # (..., Nq)     log-sum-exp per row, in HBM
    for i in range(Tr):  # one query tile: one thread block on the GPU
        q_start = i * Br
        q_end = min(q_start + Br, n_q)  # ragged last tile: q_end - q_start <= Br
        Q_i = q[..., q_start:q_end, :].astype(compute, copy=False)  # (..., Br, d)  load Q_i once
        if io is not None:
            io.read("Q", q[..., q_start:q_end, :])
        m_i = np.full((*lead, q_end - q_start), -np.inf, dtype=compute)  # (..., Br) running row max
        l_i = np.zeros((*lead, q_end - q_start), dtype=compute)  # (..., Br) running denominator
        acc = np.zeros((*lead, q_end - q_start, prob.d_v), dtype=compute)  # (..., Br, dv) unnormalised O_i
        # The key tiles this query tile visits, and which of them need the per-element mask: causal,
        # those up to the last row's key_stop (later ones skipped); with a mask_mod, the block mask's.
        for j, masked in key_tile_schedule(block_mask, i, n_q, n_k, Br, Bc, prob.causal):
            k_start = j * Bc
            k_end = min(k_start + Bc, n_k)
            K_j = k[..., k_start:k_end, :].astype(compute, copy=False)  # (..., Bc, d)
            V_j = v[..., k_start:k_end, :].astype(compute, copy=False)  # (..., Bc, dv)
            if io is not None:
                io.read("K", k_in[..., k_start:k_end, :])
                io.read("V", v_in[..., k_start:k_end, :])

            S_ij = prob.scale * (Q_i @ np.swapaxes(K_j, -1, -2))  # (..., Br, Bc) scores, on chip only
            if mods is not None:  # score_mod, then (masked tiles only) causal AND mask_mod
                S_ij, _ = modified_scores(mods, S_ij, np.arange(q_start, q_end), np.arange(k_start, k_end),
                                          mask=masked)  # (..., Br, Bc)
            elif masked:  # causal: a tile that reaches past the keys its first row may see
                S_ij = np.where(causal_mask(n_q, n_k, q_start, k_start, q_end - q_start, k_end - k_start),
                                S_ij, -np.inf)  # (..., Br, Bc)
            m_i, l_i, acc, _ = online_softmax_update(m_i, l_i, acc, S_ij, V_j)  # row max, rescale, P·V
        if sinks is not None:  # the sink: one more score per row, with a zero value (core/sinks.py)
            S_sink = np.broadcast_to(sink_scores(sinks, prob.lead, g, compute), (*lead, q_end - q_start, 1))
            m_i, l_i, acc, _ = online_softmax_update(m_i, l_i, acc, S_sink, np.zeros((1, prob.d_v), compute))

        # epilogue: O_i = acc / l_i (..., Br, dv) and lse_i = m_i + log(l_i) (..., Br), straight into HBM
        O[..., q_start:q_end, :], lse[..., q_start:q_end] = online_softmax_finish(m_i, l_i, acc)
        if io is not None:
            io.write("O", O[..., q_start:q_end, :])
            io.write("lse", lse[..., q_start:q_end])
    return ungroup_heads(O, prob.out_shape), ungroup_heads(lse, prob.lse_shape)
