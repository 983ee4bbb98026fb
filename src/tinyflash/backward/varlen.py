"""The backward over packed sequences: stage 1's backward, sequence by sequence (``tinyflash.forward.varlen``
explains the layout). Each sequence's gradients depend on its own tokens only, so the packed gradients are
the sequences' gradients side by side; a key of no sequence's query range, or of a sequence whose
queries see nothing, gets dk = dv = 0.
"""

from __future__ import annotations

import numpy as np

from ..core.checks import as_array, check_backward_inputs, check_like, check_positive_int
from ..core.mods import IndexBase, check_mod
from ..core.packed import check_varlen_inputs, heads_first
from ..core.sinks import check_sinks
from .blocked import blocked_attention_backward


def varlen_attention_backward(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q=None,
                              max_seqlen_k=None, causal: bool = False, score_mod=None, mask_mod=None, sinks=None,
                              scale: float | None = None, block_q: int = 64, block_k: int = 64):
    """The gradients ``(dq, dk, dv)`` of :func:`tinyflash.varlen_attention`, shaped and typed like q, k, v.

    ``o`` (total_q, H, dv) and ``lse`` (H, total_q) are what the forward returned for the same arguments;
    ``do`` (total_q, H, dv) = ∂L/∂o. The other arguments as for the forward. Like stage 1's backward, it takes
    one K/V head per query head (H_kv = H). With ``sinks`` (H,), a fourth value: dsinks (H,), summed over the
    sequences.
    """
    q, k, v, o, lse, do = (as_array(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (o, "o"), (lse, "lse"),
                                                        (do, "do")))
    cu_q, cu_k, prob = check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                           causal, scale)
    check_backward_inputs(prob, np.zeros(prob.out_shape, prob.dtype))  # grouped heads refused, as in stage 1
    packed_o = (q.shape[0], q.shape[1], prob.d_v)
    check_like(do, "do", packed_o, prob.dtype, "the gradient of o: (total_q, H, dv) in q's dtype")
    check_like(o, "o", packed_o, prob.dtype, "the forward's output: (total_q, H, dv) in q's dtype")
    check_like(lse, "lse", (q.shape[1], q.shape[0]), prob.compute_dtype,
               "the forward's lse: (H, total_q), float32 (float64 for float64 inputs)")
    block_q, block_k = check_positive_int(block_q, "block_q"), check_positive_int(block_k, "block_k")
    score_mod, mask_mod = check_mod(score_mod, "score_mod", 5), check_mod(mask_mod, "mask_mod", 4)
    sinks = check_sinks(sinks, (q.shape[1],))

    dq, dk, dv = np.zeros(q.shape, prob.dtype), np.zeros(k.shape, prob.dtype), np.zeros(v.shape, prob.dtype)
    dsinks = None if sinks is None else np.zeros(sinks.shape, sinks.dtype)  # (H,) a sequence without keys adds 0
    for s in range(cu_q.shape[0] - 1):  # one sequence: its gradients from its own tokens
        q0, q1, k0, k1 = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        if q1 == q0 or k1 == k0:
            continue  # nothing attends, nothing is attended: gradients 0
        grads = blocked_attention_backward(
            heads_first(q[q0:q1]), heads_first(k[k0:k1]), heads_first(v[k0:k1]), heads_first(o[q0:q1]),
            lse[:, q0:q1], heads_first(do[q0:q1]), causal=prob.causal, scale=prob.scale, block_q=block_q,
            block_k=block_k, score_mod=score_mod, mask_mod=mask_mod, sinks=sinks, _index_base=IndexBase(batch=s))
        for packed, g, (a, b) in zip((dq, dk, dv), grads, ((q0, q1), (k0, k1), (k0, k1))):
            packed[a:b] = heads_first(g)  # (n, H, c)
        if sinks is not None:
            dsinks += grads[3]
    return (dq, dk, dv) if sinks is None else (dq, dk, dv, dsinks)
