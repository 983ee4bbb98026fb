"""Decoding in NumPy: split-KV attention and its combine, the split count, the paged cache, cache bytes.

Split-KV must equal unsplit attention (the float64 reference) for every number of splits,
including more splits than keys and splits that hold only masked keys; the combine is the online
softmax's update, so it must be associative; the paged cache must give what the contiguous one
gives, for random block tables and ragged lengths.
"""

import math

import numpy as np
import pytest
from conftest import make_qkv

import tinyflash as tf
from tinyflash.core.online_softmax import LOG2E, merge_weights
from tinyflash.core.tolerance import F32_TOL, assert_close, assert_fa_rule
from tinyflash.decode import split_kv
from tinyflash.hardware import H200
from tinyflash.decode.paged import to_paged

F64_TOL = 1e-12  # float64 against float64: only the order of the sums differs


def gqa_cache(rng, batch, h, h_kv, n_q, n_k, d, dtype=np.float64):
    """q (B, H, Nq, d), k and v (B, H_kv, Nk, d)."""
    q = rng.standard_normal((batch, h, n_q, d)).astype(dtype)  # (B, H, Nq, d)
    _, k, v = make_qkv(rng, (batch, h_kv), 1, n_k, d, d, dtype)  # (B, H_kv, Nk, d) each
    return q, k, v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k", [(1, 1), (1, 29), (3, 29), (4, 3), (2, 64)])
def test_split_equals_unsplit_for_every_split_count(rng, n_q, n_k, causal):
    """1 .. Nk + 3 splits: more splits than keys leaves some empty; with causal and Nq > Nk the
    first queries see no key at all (o = 0, lse = -inf), in every split."""
    q, k, v = gqa_cache(rng, 2, 4, 2, n_q, n_k, 6)
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=causal)
    for num_splits in range(1, n_k + 4):
        o, lse = tf.split_kv_attention(q, k, v, num_splits=num_splits, causal=causal)
        assert_close(o, ref_o, F64_TOL, f"o, {num_splits} splits")
        assert_close(lse, ref_lse, F64_TOL, f"lse, {num_splits} splits", is_lse=True)


def test_a_split_of_only_masked_keys_has_weight_zero(rng):
    """Causal, Nq = 3 queries on 20 keys, 10 splits of 2 keys: the last split's keys are masked
    for all but the last query; its partial lse is -inf there and o = 0."""
    q, k, v = gqa_cache(rng, 1, 2, 2, 3, 20, 4)
    prob = tf.core.checks.check_attention_inputs(q, k, v, causal=True, scale=None)
    o_s, lse_s = split_kv.partial_attention(q, k, v, prob, 19, 20)
    assert np.all(lse_s[..., :2] == -np.inf) and np.all(o_s[..., :2, :] == 0) and np.all(np.isfinite(lse_s[..., 2]))
    o, _ = tf.split_kv_attention(q, k, v, num_splits=10, causal=True)
    assert_close(o, tf.reference_attention(q, k, v, causal=True)[0], F64_TOL, "o")


def test_split_kv_float32_and_float16(rng):
    q, k, v = gqa_cache(rng, 1, 8, 2, 1, 300, 16, np.float32)
    ref_o, ref_lse = tf.reference_attention(q, k, v)
    o, lse = tf.split_kv_attention(q, k, v, num_splits=7)
    assert o.dtype == np.float32 and lse.dtype == np.float32
    assert_close(o, ref_o, F32_TOL, "float32 o")
    assert_close(lse, ref_lse, F32_TOL, "float32 lse", is_lse=True)
    q16, k16, v16 = (x.astype(np.float16) for x in (q, k, v))
    o16, _ = tf.split_kv_attention(q16, k16, v16, num_splits=7)
    ref16 = tf.reference_attention(q16, k16, v16)[0]
    assert o16.dtype == np.float16
    assert_fa_rule(o16, tf.naive_attention(q16, k16, v16)[0], ref16, np.float16, what="float16 o")


def test_combine_is_associative(rng):
    """combine(combine(a, b), c) == combine(a, combine(b, c)) == combine(a, b, c), -inf parts included."""
    o = rng.standard_normal((3, 5, 4))  # (S, Nq, dv) three partials
    lse = rng.standard_normal((3, 5)) * 10  # (S, Nq)
    lse[1, 2] = -np.inf  # a split that saw no allowed key for row 2
    o[1, 2] = 0.0
    ab = split_kv.combine(o[:2], lse[:2])
    bc = split_kv.combine(o[1:], lse[1:])
    left = split_kv.combine([ab[0], o[2]], [ab[1], lse[2]])
    right = split_kv.combine([o[0], bc[0]], [lse[0], bc[1]])
    whole = split_kv.combine(o, lse)
    for got, what in ((left, "(ab)c"), (right, "a(bc)")):
        assert_close(got[0], whole[0], F64_TOL, f"{what} o")
        assert_close(got[1], whole[1], F64_TOL, f"{what} lse", is_lse=True)
    assert_close(whole[1], np.logaddexp.reduce(lse, axis=0), F64_TOL, "lse is log Σ exp(lse_s)", is_lse=True)


def test_merge_weights_is_the_online_softmax_rescaling(rng):
    """The scalar rule the kernels compile (base 2) merges two partials as the NumPy combine does."""
    for lse_a, lse_b in ((1.5, -2.0), (-np.inf, 3.0), (0.25, 0.25), (-np.inf, -np.inf)):
        o_a, o_b = rng.standard_normal(3), rng.standard_normal(3)  # (dv,) two partial outputs
        o_a, o_b = o_a * (lse_a > -np.inf), o_b * (lse_b > -np.inf)  # an empty partial has o = 0
        m, w_a, w_b = merge_weights(lse_a * LOG2E, lse_b * LOG2E)  # each state: (lse_s, l = 1, O_s)
        l_sum = w_a + w_b
        o = (w_a * o_a + w_b * o_b) / l_sum if l_sum else np.zeros(3)
        lse = (m + math.log2(l_sum)) / LOG2E if l_sum else -np.inf
        want_o, want_lse = split_kv.combine([o_a, o_b], [lse_a, lse_b])
        assert np.allclose(o, want_o, rtol=1e-12, atol=1e-15) and (lse == want_lse or abs(lse - want_lse) < 1e-12)


def test_choose_num_splits():
    """Few blocks and a long cache: split until the GPU is about full (≥ 85% of the best wave
    efficiency); blocks that already fill it, or a short cache, are not split."""
    slots = H200.sms * split_kv.BLOCKS_PER_SM
    s = tf.decode.choose_num_splits(8, 131_072)
    assert split_kv.wave_efficiency(8 * s, slots) >= split_kv.WAVE_EFFICIENCY
    assert split_kv.wave_efficiency(8 * (s - 1), slots) < split_kv.WAVE_EFFICIENCY  # the fewest such
    assert tf.decode.choose_num_splits(slots, 131_072) == 1
    assert tf.decode.choose_num_splits(8, 100) == 1  # shorter than MIN_KEYS_PER_SPLIT
    assert tf.decode.choose_num_splits(64, 131_072) < s  # 8 sequences need fewer splits than one
    # the numbers choose_num_splits's docstring gives for B = 1 and 8 (8 K/V heads)
    assert (s, 8 * s, slots, tf.decode.choose_num_splits(64, 131_072)) == (57, 456, 528, 8)
    assert all(f"about {s} splits ({8 * s} blocks on {slots} slots)" in " ".join(x.split()) and "8 splits (512 blocks)"
               in " ".join(x.split()) for x in [split_kv.choose_num_splits.__doc__])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_paged_equals_contiguous(rng, page_size, causal):
    """Random block tables, ragged lengths (one shorter than a page, one a whole number of pages)."""
    q, k, v = gqa_cache(rng, 4, 6, 3, 2, 40, 5)
    lens = [40, 3, 17, 32]
    cache = to_paged(k, v, lens, page_size=page_size, rng=rng)
    assert len(set(cache.block_table[cache.block_table > 0].tolist())) == (cache.block_table > 0).sum()  # no page twice
    o, lse = tf.paged_attention(q, cache, causal=causal)
    for b, n in enumerate(lens):
        ref_o, ref_lse = tf.reference_attention(q[b], k[b, :, :n], v[b, :, :n], causal=causal)
        assert_close(o[b], ref_o, F64_TOL, f"paged o, sequence {b} of length {n}")
        assert_close(lse[b], ref_lse, F64_TOL, f"paged lse, sequence {b}", is_lse=True)


def test_paged_cache_rejects_bad_lengths(rng):
    q, k, v = gqa_cache(rng, 2, 2, 2, 1, 8, 4)
    with pytest.raises(ValueError, match="seq_lens must hold B=2 lengths in"):
        to_paged(k, v, [9, 3])
    with pytest.raises(ValueError, match="q must have shape"):
        tf.paged_attention(q[0], to_paged(k, v, [8, 3]))


def bad_caches(rng):
    """A good cache and (what is wrong, the cache with it wrong, the words of the error) for each rule of
    check_cache: nothing a kernel would read outside its pool."""
    from tinyflash.decode.paged import PagedKVCache

    q, k, v = gqa_cache(rng, 2, 2, 2, 1, 8, 4)
    good = to_paged(k, v, [8, 3], page_size=4)  # 2 pages and 1 page of a pool of 3 + 3 spare

    def with_(**fields):
        return PagedKVCache(**{**good.__dict__, **fields})

    table, lens = good.block_table, good.seq_lens
    outside = table.copy()
    outside[1, 0] = good.k_pages.shape[0]  # one past the pool
    negative = table.copy()
    negative[0, 1] = -1
    return q, good, [
        ("an entry past the pool", with_(block_table=outside), r"block_table\[1, 0\] = 6 is not a page of the pool"),
        ("a negative entry", with_(block_table=negative), r"block_table\[0, 1\] = -1 is not a page"),
        ("a length past the table", with_(seq_lens=np.array([9, 3], np.int32)), r"seq_lens\[0\] = 9 is outside \[0, 8\]"),
        ("a negative length", with_(seq_lens=np.array([8, -1], np.int32)), r"seq_lens\[1\] = -1 is outside"),
        ("lengths of another batch", with_(seq_lens=np.array([8], np.int32)), "seq_lens \\(B,\\) with B = 2"),
        ("a float table", with_(block_table=table.astype(np.float32)), "block_table must hold integers"),
        ("K and V pages of two pools", with_(v_pages=good.v_pages[:-1]), "of one pool"),
    ]


def test_a_bad_paged_cache_is_refused_by_name(rng):
    """Every cache a kernel would read outside its pool is refused before anything runs, naming the sequence and
    the entry; an unused entry past a sequence's pages may hold anything."""
    q, good, bad = bad_caches(rng)
    for what, cache, words in bad:
        with pytest.raises((ValueError, TypeError), match=words):
            tf.paged_attention(q, cache)
    unused = good.block_table.copy()
    unused[1, 1] = 10**6  # sequence 1 holds 3 tokens: one page, entry 1 is never read
    from tinyflash.decode.paged import PagedKVCache

    o, _ = tf.paged_attention(q, PagedKVCache(good.k_pages, good.v_pages, unused, good.seq_lens))
    assert np.isfinite(o).all()


def test_bad_num_splits_and_heads_rejected(rng):
    q, k, v = gqa_cache(rng, 1, 4, 2, 1, 8, 4)
    with pytest.raises(ValueError, match="num_splits must be a positive integer; got 0"):
        tf.split_kv_attention(q, k, v, num_splits=0)
    with pytest.raises(ValueError, match="multiple of the number of K/V heads"):
        tf.split_kv_attention(q[:, :3], k, v)


def test_kv_cache_bytes():
    """2 (K, V) · layers · batch · context · H_kv · d · bytes; GQA divides by H / H_kv."""
    mha = tf.kv_cache_bytes(layers=32, kv_heads=32, head_dim=128, context=131_072)
    assert mha == 2 * 32 * 131_072 * 32 * 128 * 2 == 64 * 2**30  # 64 GiB for one sequence
    assert tf.kv_cache_bytes(layers=32, kv_heads=8, head_dim=128, context=131_072) * 4 == mha
    assert tf.kv_cache_bytes(layers=32, kv_heads=32, head_dim=128, context=131_072, bytes_per_element=1) * 2 == mha
    with pytest.raises(ValueError, match="context must be a positive integer"):
        tf.kv_cache_bytes(layers=1, kv_heads=1, head_dim=1, context=0)


def test_pages_from_contiguous(rng):
    """The benchmark's paged copy (array operations only) holds the same keys as to_paged's."""
    from tinyflash.decode.paged import pages_from_contiguous

    q, k, v = gqa_cache(rng, 3, 4, 2, 1, 32, 4)
    cache = pages_from_contiguous(k, v, 8, rng.permutation(12))
    for b in range(3):
        K, V = cache.gather(b)
        assert np.array_equal(K, k[b]) and np.array_equal(V, v[b])
    o, _ = tf.paged_attention(q, cache)
    assert_close(o, tf.reference_attention(q, k, v)[0], F64_TOL, "paged o")
