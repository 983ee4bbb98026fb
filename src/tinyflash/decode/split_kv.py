"""Split-KV attention (Flash-Decoding) in NumPy: split the keys, attend each split, combine.

In decoding, Nq is 1 (or a few query rows, with speculative decoding) and Nk is the whole cache.
FlashAttention's kernels give each (query tile, head) one thread block; with one query tile per
head, B · H_kv blocks is all the parallelism there is (8 for one sequence of an 8-KV-head model),
on a GPU with 132 SMs. Split-KV cuts the keys into ``num_splits`` slices instead:

    for each split s (its keys [k_begin, k_end)):        <- one thread block each (in parallel)
        O_s, lse_s = attention of the queries on K[k_begin:k_end], V[k_begin:k_end]
    O, lse = combine(O_1, lse_1, ..., O_S, lse_S)          <- a second, small step

The combine is exact: a finished partial (O_s, lse_s) is the online-softmax state
(m = lse_s, l = 1, acc = O_s), so merging them is the online softmax's update once per split
(:func:`combine`, which calls :func:`tinyflash.core.online_softmax.online_softmax_update`):

    lse = log Σ_s exp(lse_s),       O = Σ_s exp(lse_s - lse) · O_s

A split whose keys are all masked (or that has no keys) has lse_s = -inf and weight 0.

How many splits (:func:`choose_num_splits`): enough thread blocks to fill the GPU, no more.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.checks import as_array, check_attention_inputs, check_positive_int
from ..core.heads import group_query_heads, kv_heads_view, ungroup_heads
from ..core.masks import allowed
from ..core.online_softmax import online_softmax_finish, online_softmax_update
from ..hardware import H200

# Split-kernel blocks resident per SM (d = 128, float16; ptxas for sm_90): 128 threads × 127 registers
# (4 blocks fit in 65,536 registers) and a 48 KB ring of K/V tiles (4 fit in the 228 KB of shared memory).
BLOCKS_PER_SM = 4
MIN_KEYS_PER_SPLIT = 128  # 4 tiles of 32 keys: shorter splits would spend most of their time filling the ring
MAX_SPLITS = 256  # the combine's loop over splits stays short
WAVE_EFFICIENCY = 0.85  # accept the fewest splits within 85% of the best wave efficiency


def wave_efficiency(blocks: int, slots: int) -> float:
    """Fraction of the GPU's block slots busy, on average over the waves: blocks / (waves · slots).

    ``slots`` = SMs × resident blocks per SM. 100 blocks on 132 slots: 0.76 (one wave, 32 idle);
    140 blocks: 140 / 264 = 0.53 (a second wave of 8).
    """
    return blocks / (math.ceil(blocks / slots) * slots)


def choose_num_splits(blocks: int, n_k: int, sm_count: int = H200.sms, blocks_per_sm: int = BLOCKS_PER_SM) -> int:
    """The number of splits for ``blocks`` = B · H_kv · row tiles thread blocks before splitting.

    Why one wave of resident blocks, not more: every block does the same work (equal runs of
    keys), so when the blocks fill the GPU's block slots once, all of them start and finish
    together: no tail wave with most SMs idle. More waves cost each block's fixed work again
    (q, filling the ring, the merge, one more partial for the combine) for no extra bandwidth: one
    resident block keeps 32 KB of loads in flight, so even 2 blocks per SM (64 KB) are more than
    HBM needs (~36 KB per SM); 3 or 4 per SM also hide the scores' shuffle and exp latencies.
    So at B = 1 (8 blocks before splitting) the rule takes about 57 splits (456 blocks on 528 slots)
    and at B = 8 (64 blocks) 8 splits (512 blocks), where Nk allows (at least MIN_KEYS_PER_SPLIT keys each).

    FlashAttention's rule (``num_splits_heuristic`` in flash-attn), with the wave counted in
    resident blocks (SMs × blocks per SM) rather than SMs, since a decode block is small: among
    1 .. max_splits splits (max_splits: at most one split per MIN_KEYS_PER_SPLIT keys, at most
    MAX_SPLITS), compute each one's :func:`wave_efficiency` and take the fewest splits whose
    efficiency is at least WAVE_EFFICIENCY of the best. Fewer splits mean less combine work and
    longer runs of keys per block; 0.85 of the best leaves little of the GPU idle. If the blocks
    already fill the GPU (efficiency ≥ 0.85 unsplit), no split.
    """
    slots = sm_count * blocks_per_sm  # blocks that run at once: one wave
    max_splits = max(1, min(MAX_SPLITS, n_k // MIN_KEYS_PER_SPLIT))
    efficiency = [wave_efficiency(blocks * s, slots) for s in range(1, max_splits + 1)]  # index s - 1
    best = max(efficiency)
    return next(s for s, e in enumerate(efficiency, start=1) if e >= WAVE_EFFICIENCY * best)


def split_bounds(n_k: int, num_splits: int, align: int = 1) -> list[tuple[int, int]]:
    """[k_begin, k_end) of each split: equal runs of keys, rounded up to a multiple of ``align``.

    The last splits may be short or empty (k_begin >= k_end) when num_splits · align > Nk: an
    empty split is computed like any other and contributes weight 0 to the combine.
    """
    chunk = -(-max(1, -(-n_k // num_splits)) // align) * align  # keys per split, a multiple of align
    return [(min(s * chunk, n_k), min((s + 1) * chunk, n_k)) for s in range(num_splits)]


def partial_attention(q, k, v, prob, k_begin: int, k_end: int):
    """(O_s, lse_s) of the queries against keys [k_begin, k_end) only, masked by their true
    positions in the whole cache (causal). q (..., Nq, d) and k, v (..., Nk, ·) may be the
    broadcasting views of grouped-query attention. Empty or fully masked: O_s = 0, lse_s = -inf.
    """
    ct, lead = prob.compute_dtype, np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    m_i = np.full((*lead, prob.n_q), -np.inf, dtype=ct)  # (..., Nq)
    l_i = np.zeros((*lead, prob.n_q), dtype=ct)  # (..., Nq)
    acc = np.zeros((*lead, prob.n_q, prob.d_v), dtype=ct)  # (..., Nq, dv)
    if k_begin < k_end:
        K_s = k[..., k_begin:k_end, :].astype(ct)  # (..., keys, d)
        V_s = v[..., k_begin:k_end, :].astype(ct)  # (..., keys, dv)
        S = prob.scale * (q.astype(ct) @ np.swapaxes(K_s, -1, -2))  # (..., Nq, keys)
        if prob.causal:
            S = np.where(allowed(range(prob.n_q), np.arange(k_begin, k_end), prob.n_q, prob.n_k), S, -np.inf)
        m_i, l_i, acc, _ = online_softmax_update(m_i, l_i, acc, S, V_s)
    return online_softmax_finish(m_i, l_i, acc)  # (..., Nq, dv), (..., Nq)


def combine(o_parts, lse_parts):
    """Merge partial results exactly: o_parts (S, ..., Nq, dv), lse_parts (S, ..., Nq) -> (O, lse).

    Each split is one step of the online softmax, with its lse as the only score of the chunk and
    its O as that score's value row (one "tile" of 1 × 1 per query row), so the rescaling is
    :func:`~tinyflash.core.online_softmax.online_softmax_update`'s, written once.
    """
    o_parts, lse_parts = np.asarray(o_parts), np.asarray(lse_parts)
    lead = lse_parts.shape[1:]  # (..., Nq)
    m = np.full((*lead, 1), -np.inf, dtype=lse_parts.dtype)  # (..., Nq, 1): one "row" per query
    l = np.zeros((*lead, 1), dtype=lse_parts.dtype)  # (..., Nq, 1)
    acc = np.zeros((*lead, 1, o_parts.shape[-1]), dtype=o_parts.dtype)  # (..., Nq, 1, dv)
    for o_s, lse_s in zip(o_parts, lse_parts):  # one split at a time, like one key tile
        m, l, acc, _ = online_softmax_update(m, l, acc, lse_s[..., None, None], o_s[..., None, :])
    O, lse = online_softmax_finish(m, l, acc)  # (..., Nq, 1, dv), (..., Nq, 1)
    return O[..., 0, :], lse[..., 0]


def split_kv_attention(q, k, v, *, num_splits: int | None = None, causal: bool = False,
                       scale: float | None = None):
    """Split-KV (Flash-Decoding) attention in NumPy. Returns ``(o, lse)``, as every stage.

    q (..., H, Nq, d), k (..., H_kv, Nk, d), v (..., H_kv, Nk, dv), H a multiple of H_kv
    (grouped-query attention; H_kv = H is ordinary attention). Made for decoding (Nq from 1 to a
    few; ``causal`` aligns the queries with the last keys, as everywhere) but exact for any Nq.
    ``num_splits=None`` takes :func:`choose_num_splits` for an H200; any positive number is
    allowed, even more splits than keys (the extra splits are empty).
    """
    q, k, v = as_array(q, "q"), as_array(k, "k"), as_array(v, "v")
    prob = check_attention_inputs(q, k, v, causal=causal, scale=scale)
    if num_splits is None:
        num_splits = choose_num_splits(math.prod(prob.kv_lead), prob.n_k)
    num_splits = check_positive_int(num_splits, "num_splits")
    g = prob.kv_group
    Qg, Kg, Vg = group_query_heads(q, g), kv_heads_view(k, g), kv_heads_view(v, g)  # (..., H_kv, g, N, ·)
    parts = [partial_attention(Qg, Kg, Vg, prob, k0, k1) for k0, k1 in split_bounds(prob.n_k, num_splits)]
    O, lse = combine([o for o, _ in parts], [s for _, s in parts])  # (..., Nq, dv), (..., Nq)
    return ungroup_heads(O, prob.out_shape).astype(prob.dtype), ungroup_heads(lse, prob.lse_shape)
