"""Packed sequences: a ragged batch without padding (FlashAttention's "varlen" layout).

A training batch of documents of different lengths is usually packed end to end into one long row of
tokens rather than padded to the longest. The batch is then described by cumulative lengths:

    q        (total_q, H, d)      every sequence's queries, one after another
    k, v     (total_k, H_kv, ·)   every sequence's keys and values, in the same order
    cu_seqlens_q  (B + 1,) int32  sequence s owns the queries cu_seqlens_q[s] .. cu_seqlens_q[s + 1] - 1
    cu_seqlens_k  (B + 1,) int32  and the keys cu_seqlens_k[s] .. cu_seqlens_k[s + 1] - 1

and sequence s attends only to its own keys: attention is computed per sequence, with no padding, no
score between two sequences and no work for one. Within a sequence everything is as in
:func:`tinyflash.blocked_attention` (stage 1, which runs each sequence here): ``causal`` is aligned
bottom-right within the sequence, and a query of a sequence without keys gets o = 0 and lse = -inf.
A ``score_mod`` or ``mask_mod`` (``tinyflash.core.mods``) sees b = the sequence's index and q_idx,
kv_idx counted from the sequence's start: a sliding window or a causal rule written as a mask_mod
means the same in a packed batch as in a sequence alone.

On 16-bit inputs the same call runs on the tensor cores, all sequences in one kernel launch
(``tinyflash.forward.varlen_tensor_cores``: the packed row as one long sequence, with a block mask that lists
each sequence's own tiles).

The layout is token-major (a token's heads side by side) where the stages are head-major
(..., H, N, d): a sequence's slice ``q[start:stop]`` is turned into a (H, n, d) view by a transpose,
without a copy.
"""

from __future__ import annotations

import numpy as np

from ..core.checks import BFLOAT16, as_array, check_positive_int
from ..core.mods import IndexBase, check_mod
from ..core.sinks import check_sinks
from ..core.packed import check_packed, check_varlen_inputs, heads_first
from .blocked import blocked_attention

SIXTEEN_BIT = (np.dtype(np.float16), BFLOAT16)  # the tensor cores' input types


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q=None, max_seqlen_k=None,
                     causal: bool = False, score_mod=None, mask_mod=None, sinks=None, scale: float | None = None,
                     block_q: int | None = None, block_k: int | None = None):
    """Attention over a packed batch of sequences of different lengths. Returns ``(o, lse)``.

    q (total_q, H, d), k (total_k, H_kv, d), v (total_k, H_kv, dv), one dtype; H a multiple of H_kv
    (grouped-query heads). Where it runs, the inputs say: float32 or float64 NumPy arrays on the NumPy stage
    (each sequence by :func:`tinyflash.blocked_attention`, in tiles of ``block_q`` × ``block_k``, 64 × 64 by
    default); float16 or bfloat16 (NumPy arrays, CuPy arrays or PyTorch CUDA tensors) on the tensor cores, in one
    launch of :func:`tinyflash.flex_attention` over the packed row with a block mask of ``block_q`` × ``block_k``
    tiles (128 × 128 by default) that lists only each sequence's own tiles
    (``tinyflash.forward.varlen_tensor_cores``): d = dv a multiple of 8 up to 256, no ``sinks``, at least one
    query and one key in the batch; NumPy arrays are copied to the GPU and back, device arrays stay there. ``cu_seqlens_q`` and ``cu_seqlens_k``
    (B + 1,) integers, from 0 to total_q and total_k, never decreasing: sequence s is
    q[cu_seqlens_q[s]:cu_seqlens_q[s + 1]] with k and v[cu_seqlens_k[s]:cu_seqlens_k[s + 1]].
    ``max_seqlen_q``/``max_seqlen_k``, if given, must be at least the longest sequence (as
    FlashAttention asks). o (total_q, H, dv) in the input dtype; lse (H, total_q) in the compute dtype
    (float32, float64 for float64 inputs), FlashAttention's layout. ``causal``, ``scale``, ``block_q`` and
    ``block_k`` as for :func:`tinyflash.blocked_attention`, which computes each sequence. ``score_mod``
    and ``mask_mod`` as there, with b the sequence's index and q_idx, kv_idx its own positions; ``sinks``
    (H,), one logit per query head, as there too.
    """
    q, k, v = as_array(q, "q"), as_array(k, "k"), as_array(v, "v")
    if on_tensor_cores(q, k, v):
        return packed_on_tensor_cores(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                      score_mod, mask_mod, sinks, scale, block_q, block_k)
    cu_q, cu_k, prob = check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                           causal, scale)
    block_q = 64 if block_q is None else check_positive_int(block_q, "block_q")
    block_k = 64 if block_k is None else check_positive_int(block_k, "block_k")
    score_mod, mask_mod = check_mod(score_mod, "score_mod", 5), check_mod(mask_mod, "mask_mod", 4)
    sinks = check_sinks(sinks, (q.shape[1],))

    n_heads = q.shape[1]
    o = np.zeros((q.shape[0], n_heads, prob.d_v), dtype=prob.dtype)  # (total_q, H, dv); rows without keys: 0
    lse = np.full((n_heads, q.shape[0]), -np.inf, dtype=prob.compute_dtype)  # (H, total_q); rows without keys: -inf
    for s in range(cu_q.shape[0] - 1):  # one sequence: its own queries against its own keys
        q0, q1, k0, k1 = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        if q1 == q0 or k1 == k0:  # no queries, or no keys: its queries keep o = 0, and lse = -inf or the sink's
            if sinks is not None:  # logit, the one term of their softmax
                lse[:, q0:q1] = sinks.astype(prob.compute_dtype)[:, None]
            continue
        o_s, lse_s = blocked_attention(heads_first(q[q0:q1]), heads_first(k[k0:k1]), heads_first(v[k0:k1]),
                                       causal=prob.causal, scale=prob.scale, block_q=block_q, block_k=block_k,
                                       score_mod=score_mod, mask_mod=mask_mod, sinks=sinks,
                                       _index_base=IndexBase(batch=s))
        o[q0:q1] = heads_first(o_s)  # (n_q, H, dv)
        lse[:, q0:q1] = lse_s  # (H, n_q)
    return o, lse


def on_tensor_cores(q, k, v) -> bool:
    """Whether a packed call runs on the tensor cores: any of q, k, v on the GPU (``as_array`` leaves only NumPy
    arrays and GPU arrays), or 16-bit (float16, bfloat16)."""
    return any(not isinstance(x, np.ndarray) or str(x.dtype) in ("float16", "bfloat16") for x in (q, k, v))


def packed_on_tensor_cores(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, score_mod,
                           mask_mod, sinks, scale, block_q, block_k):
    """The tensor cores' path of :func:`varlen_attention`: its checks, then one launch
    (``varlen_tensor_cores``, imported here: it reaches numba, which a NumPy call never imports)."""
    from .varlen_tensor_cores import varlen_tensor_cores

    check_packed(q, k, v, SIXTEEN_BIT)
    if q.shape[0] == 0 or k.shape[0] == 0:
        raise ValueError(f"varlen_attention on the tensor cores needs at least one query and one key in the batch; "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if sinks is not None:
        raise ValueError("sinks are taken on the NumPy stage only (float32 or float64 inputs); got sinks with "
                         "16-bit inputs")
    cu_q, cu_k, prob = check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                           scale, SIXTEEN_BIT)
    block_q = None if block_q is None else check_positive_int(block_q, "block_q")
    block_k = None if block_k is None else check_positive_int(block_k, "block_k")
    score_mod, mask_mod = check_mod(score_mod, "score_mod", 5), check_mod(mask_mod, "mask_mod", 4)
    return varlen_tensor_cores(q, k, v, cu_q, cu_k, causal=prob.causal, score_mod=score_mod, mask_mod=mask_mod,
                               scale=prob.scale, block_q=block_q, block_k=block_k)
