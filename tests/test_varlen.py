"""Packed sequences (``varlen_attention`` and its backward) against each sequence computed on its own.

A packed batch must give, token for token, what the float64 reference gives for each sequence alone
(heads first, bottom-right causal within the sequence); sequences with no queries or no keys, lengths
that are not multiples of a tile, grouped-query heads; and the layout's errors before any work.
"""

import numpy as np
import pytest

import tinyflash as tf
from tinyflash.core.tolerance import F32_TOL, assert_close

F64_TOL = 1e-12  # float64 against float64: only the order of the sums differs


def packed_inputs(rng, lengths_q, lengths_k, h, h_kv, d, d_v, dtype=np.float64):
    """Random packed q (total_q, H, d), k (total_k, H_kv, d), v (total_k, H_kv, dv) and int32 cu_seqlens."""
    cu_q = np.concatenate([[0], np.cumsum(lengths_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lengths_k)]).astype(np.int32)
    q = rng.standard_normal((cu_q[-1], h, d)).astype(dtype)
    k = rng.standard_normal((cu_k[-1], h_kv, d)).astype(dtype)
    v = rng.standard_normal((cu_k[-1], h_kv, d_v)).astype(dtype)
    return q, k, v, cu_q, cu_k


def per_sequence_reference(q, k, v, cu_q, cu_k, causal):
    """Each sequence alone through the float64 reference; o (total_q, H, dv), lse (H, total_q)."""
    o = np.zeros((q.shape[0], q.shape[1], v.shape[2]))
    lse = np.full((q.shape[1], q.shape[0]), -np.inf)
    for s in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        if q1 > q0 and k1 > k0:
            o_s, lse_s = tf.reference_attention(q[q0:q1].swapaxes(0, 1), k[k0:k1].swapaxes(0, 1),
                                                v[k0:k1].swapaxes(0, 1), causal=causal)
            o[q0:q1], lse[:, q0:q1] = o_s.swapaxes(0, 1), lse_s
    return o, lse


# (query lengths, key lengths): one sequence; several of lengths not multiples of the tile (5 x 7 here);
# a sequence of no queries; of no keys; more queries than keys (causal rows that see nothing)
LENGTHS = [([13], [13]), ([5, 17, 1, 9], [5, 17, 1, 9]), ([3, 0, 12], [4, 6, 12]), ([6, 4], [0, 9]),
           ([11, 2], [4, 2])]


@pytest.mark.parametrize("lengths_q, lengths_k", LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
def test_equals_each_sequence_alone(rng, lengths_q, lengths_k, causal):
    q, k, v, cu_q, cu_k = packed_inputs(rng, lengths_q, lengths_k, 3, 3, 8, 6)
    before = [x.copy() for x in (q, k, v, cu_q, cu_k)]
    o, lse = tf.varlen_attention(q, k, v, cu_q, cu_k, causal=causal, block_q=5, block_k=7)
    o_ref, lse_ref = per_sequence_reference(q, k, v, cu_q, cu_k, causal)
    assert o.shape == (q.shape[0], 3, 6) and lse.shape == (3, q.shape[0])
    assert_close(o, o_ref, F64_TOL, "varlen o")
    assert_close(lse, lse_ref, F64_TOL, "varlen lse", is_lse=True)
    assert all(np.array_equal(x, y) for x, y in zip(before, (q, k, v, cu_q, cu_k)))  # inputs never modified


def test_float32_and_grouped_heads(rng):
    """float32 within float32's tolerance of the float64 reference; 4 query heads reading 2 K/V heads."""
    q, k, v, cu_q, cu_k = packed_inputs(rng, [7, 10], [9, 10], 4, 2, 8, 8, np.float32)
    o, lse = tf.varlen_attention(q, k, v, cu_q, cu_k, causal=True, max_seqlen_q=10, max_seqlen_k=10)
    group = 2  # query head h reads K/V head h // 2
    o_ref, lse_ref = per_sequence_reference(q, np.repeat(k, group, axis=1), np.repeat(v, group, axis=1),
                                            cu_q, cu_k, True)
    assert o.dtype == np.float32 and lse.dtype == np.float32
    assert_close(o, o_ref, F32_TOL, "varlen float32 GQA o")
    assert_close(lse, lse_ref, F32_TOL, "varlen float32 GQA lse", is_lse=True)


@pytest.mark.parametrize("causal", [False, True])
def test_backward_equals_each_sequence_alone(rng, causal):
    q, k, v, cu_q, cu_k = packed_inputs(rng, [5, 0, 11, 3], [5, 4, 8, 0], 2, 2, 6, 4)
    o, lse = tf.varlen_attention(q, k, v, cu_q, cu_k, causal=causal)
    do = rng.standard_normal(o.shape)
    dq, dk, dv = tf.varlen_attention_backward(q, k, v, o, lse, do, cu_q, cu_k, causal=causal, block_q=4,
                                              block_k=3)
    ref = [np.zeros_like(x) for x in (q, k, v)]
    for s in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        if q1 > q0 and k1 > k0:
            grads = tf.reference_attention_backward(*(x.swapaxes(0, 1) for x in (q[q0:q1], k[k0:k1], v[k0:k1],
                                                                                  do[q0:q1])), causal=causal)
            for r, g, (a, b) in zip(ref, grads, ((q0, q1), (k0, k1), (k0, k1))):
                r[a:b] = g.swapaxes(0, 1)
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), ref):
        assert got.shape == want.shape
        assert_close(got, want, F64_TOL, f"varlen {name}")
    keys_unseen, queries_alone = slice(cu_k[1], cu_k[2]), slice(cu_q[3], cu_q[4])  # sequence 1: no queries; 3: no keys
    assert not np.any(dk[keys_unseen]) and not np.any(dv[keys_unseen]) and not np.any(dq[queries_alone])


def test_no_cross_sequence_scores(rng):
    """Changing one sequence's keys changes no other sequence's outputs."""
    q, k, v, cu_q, cu_k = packed_inputs(rng, [4, 6], [5, 7], 2, 2, 4, 4)
    o1, _ = tf.varlen_attention(q, k, v, cu_q, cu_k)
    k2 = k.copy()
    k2[cu_k[1]:] += rng.standard_normal(k2[cu_k[1]:].shape)  # the second sequence's keys
    o2, _ = tf.varlen_attention(q, k2, v, cu_q, cu_k)
    assert np.array_equal(o1[:cu_q[1]], o2[:cu_q[1]])
    assert not np.allclose(o1[cu_q[1]:], o2[cu_q[1]:])


BAD = [
    (dict(cu_seqlens_q=[0, 4, 9]), ValueError, "cu_seqlens_q must end at the number of packed tokens, 10"),
    (dict(cu_seqlens_q=[1, 4, 10]), ValueError, "cu_seqlens_q must start at 0"),
    (dict(cu_seqlens_q=[0, 6, 4, 10]), ValueError, "cu_seqlens_q must not decrease"),
    (dict(cu_seqlens_q=np.array([0.0, 4.0, 10.0])), TypeError, "cu_seqlens_q must hold integers"),
    (dict(cu_seqlens_q=[[0, 4, 10]]), ValueError, r"cu_seqlens_q must have shape \(B \+ 1,\)"),
    (dict(cu_seqlens_q=None), TypeError, "cu_seqlens_q must be a 1-D integer array"),
    (dict(cu_seqlens_k=[0, 12]), ValueError, "the same number of sequences; got 2 and 1"),
    (dict(max_seqlen_q=5), ValueError, "max_seqlen_q must be at least the longest sequence's length, 6"),
    (dict(max_seqlen_k=2.5), TypeError, "max_seqlen_k must be an integer or None"),
    (dict(q=np.zeros((10, 2, 4, 1))), ValueError, r"q must have shape \(total_tokens, heads, d\)"),
    (dict(k=np.ones((12, 2, 5))), ValueError, "q and k must have the same head dimension"),
    (dict(v=np.ones((11, 2, 4))), ValueError, "k and v must hold the same number of packed tokens"),
    (dict(q=np.ones((10, 2, 4), np.int64)), TypeError, "q has dtype int64"),
    (dict(causal="yes"), TypeError, "causal must be True or False"),
    (dict(block_q=0), ValueError, "block_q must be a positive integer"),
]


@pytest.mark.parametrize("change, error, message", BAD)
def test_bad_inputs(rng, change, error, message):
    args = dict(q=rng.standard_normal((10, 2, 4)), k=rng.standard_normal((12, 2, 4)),
                v=rng.standard_normal((12, 2, 4)), cu_seqlens_q=np.array([0, 4, 10], np.int32),
                cu_seqlens_k=np.array([0, 5, 12], np.int32))
    args.update(change)
    with pytest.raises(error, match=message):
        tf.varlen_attention(**args)


def test_backward_refuses_wrong_lse_layout(rng):
    q, k, v, cu_q, cu_k = packed_inputs(rng, [4, 6], [5, 7], 2, 2, 4, 4)
    o, lse = tf.varlen_attention(q, k, v, cu_q, cu_k)
    with pytest.raises(ValueError, match=r"lse must have shape \(2, 10\)"):
        tf.varlen_attention_backward(q, k, v, o, lse.T.copy(), o, cu_q, cu_k)


def test_mods_see_the_sequence_index_and_its_own_positions(rng):
    """A score_mod and mask_mod in a packed batch: b is the sequence's index, q_idx and kv_idx count from
    its start; each sequence equals the reference on it alone, with the mods given that b."""
    q, k, v, cu_q, cu_k = packed_inputs(rng, [7, 12, 5], [9, 12, 5], 2, 2, 4, 4)
    window = tf.sliding_window(4)  # kv_idx <= q_idx, q_idx - kv_idx < 4, in the sequence's own positions

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + 0.25 * b - 0.1 * h  # depends on the sequence and the head

    o, lse = tf.varlen_attention(q, k, v, cu_q, cu_k, score_mod=score_mod, mask_mod=window, block_q=4, block_k=5)
    for s in range(3):
        q0, q1, k0, k1 = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        sm = lambda score, b, h, qi, ki, s=s: score_mod(score, s, h, qi, ki)  # noqa: E731 (b of this sequence)
        o_s, lse_s = tf.reference_attention(q[q0:q1].swapaxes(0, 1), k[k0:k1].swapaxes(0, 1),
                                            v[k0:k1].swapaxes(0, 1), score_mod=sm, mask_mod=window)
        assert_close(o[q0:q1], o_s.swapaxes(0, 1), F64_TOL, f"sequence {s} o")
        assert_close(lse[:, q0:q1], lse_s, F64_TOL, f"sequence {s} lse", is_lse=True)


def test_equals_document_mask_on_the_packed_row(rng):
    """Packing without padding is the document mask on one long sequence: the same o, lse and gradients."""
    lengths = [6, 11, 3]
    q, k, v, cu_q, cu_k = packed_inputs(rng, lengths, lengths, 2, 2, 8, 8)
    ids = np.repeat(np.arange(3), lengths)  # the document of each packed token
    document_of = tf.document_mask(ids)  # mask_mod: the same document only
    o, lse = tf.varlen_attention(q, k, v, cu_q, cu_k, causal=True)
    row = [x.swapaxes(0, 1) for x in (q, k, v)]  # (H, total, ·): the packed row as one sequence
    o_doc, lse_doc = tf.reference_attention(*row, causal=True, mask_mod=document_of)
    assert_close(o, o_doc.swapaxes(0, 1), F64_TOL, "varlen o against the document mask")
    assert_close(lse, lse_doc, F64_TOL, "varlen lse against the document mask", is_lse=True)
    do = rng.standard_normal(o.shape)
    grads = tf.varlen_attention_backward(q, k, v, o, lse, do, cu_q, cu_k, causal=True)
    grads_doc = tf.reference_attention_backward(*row, do.swapaxes(0, 1), causal=True, mask_mod=document_of)
    for name, got, want in zip(("dq", "dk", "dv"), grads, grads_doc):
        assert_close(got, want.swapaxes(0, 1), F64_TOL, f"varlen {name} against the document mask")


def test_sinks_and_their_gradient(rng):
    """Sinks (one logit per head) in every sequence; a sequence without keys has lse = its sink; dsinks is the
    sum over the sequences of what each gives alone."""
    q, k, v, cu_q, cu_k = packed_inputs(rng, [5, 3, 8], [6, 0, 8], 3, 3, 4, 4)
    sinks = rng.standard_normal(3)
    o, lse = tf.varlen_attention(q, k, v, cu_q, cu_k, causal=True, sinks=sinks)
    assert np.array_equal(lse[:, cu_q[1]:cu_q[2]], np.repeat(sinks[:, None], 3, axis=1))
    assert not np.any(o[cu_q[1]:cu_q[2]])
    do = rng.standard_normal(o.shape)
    *_, dsinks = tf.varlen_attention_backward(q, k, v, o, lse, do, cu_q, cu_k, causal=True, sinks=sinks)
    want = np.zeros(3)
    for s in (0, 2):
        q0, q1, k0, k1 = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        *_, ds = tf.reference_attention_backward(*(x.swapaxes(0, 1) for x in (q[q0:q1], k[k0:k1], v[k0:k1],
                                                                               do[q0:q1])), causal=True, sinks=sinks)
        want += ds
    assert_close(dsinks, want, F64_TOL, "varlen dsinks")
