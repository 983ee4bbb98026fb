"""Stage 0 (naive) and stage 1 (blocked) against each other and against the float64 reference."""

import itertools

import numpy as np
import pytest
from conftest import make_qkv

import tinyflash as tf
from tinyflash.core.tolerance import F32_TOL, assert_close, assert_fa_rule

SIZES = [1, 2, 7, 63, 64, 65, 200]
HEAD_DIMS = [1, 8, 64, 96, 128]
LEADS = [(), (2,), (2, 3)]
F64_TOL = 1e-12  # float64 stages against each other


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k", list(itertools.product(SIZES, SIZES)))
def test_blocked_matches_naive_all_lengths(rng, n_q, n_k, causal):
    """Every pair of lengths (Nq == Nk and Nq != Nk), float64, tiles of 16 that rarely divide N."""
    q, k, v = make_qkv(rng, (2,), n_q, n_k, d=8, d_v=5)
    o0, lse0 = tf.naive_attention(q, k, v, causal=causal)
    o1, lse1 = tf.blocked_attention(q, k, v, causal=causal, block_q=16, block_k=16)
    assert o1.shape == (2, n_q, 5) and lse1.shape == (2, n_q)
    assert o1.dtype == np.float64 and lse1.dtype == np.float64
    assert_close(o1, o0, F64_TOL, "o, blocked vs naive")
    assert_close(lse1, lse0, F64_TOL, "lse, blocked vs naive", is_lse=True)


@pytest.mark.parametrize("block_q, block_k", [(1, 1), (16, 16), (64, 64), (16, 64), (64, 1), (256, 300)])
@pytest.mark.parametrize("causal", [False, True])
def test_block_sizes(rng, block_q, block_k, causal):
    """Block sizes 1, 16, 64 and larger than N, mixed, on lengths that no tile divides."""
    q, k, v = make_qkv(rng, (), 65, 200, d=8, d_v=3)
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=causal)
    o, lse = tf.blocked_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k)
    assert_close(o, ref_o, F64_TOL, "o")
    assert_close(lse, ref_lse, F64_TOL, "lse", is_lse=True)


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("lead", LEADS)
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims_and_leading_dims_float32(rng, d, lead, causal):
    """float32 stages within 1e-5 of the float64 reference, dv != d, Nq != Nk."""
    q, k, v = make_qkv(rng, lead, 65, 63, d=d, d_v=d + 3, dtype=np.float32)
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=causal)
    for name, fn in (("naive", tf.naive_attention), ("blocked", tf.blocked_attention)):
        o, lse = fn(q, k, v, causal=causal)
        assert o.dtype == np.float32 and lse.dtype == np.float32
        assert o.shape == (*lead, 65, d + 3) and lse.shape == (*lead, 65)
        assert_close(o, ref_o, F32_TOL, f"{name} o, d={d}")
        assert_close(lse, ref_lse, F32_TOL, f"{name} lse, d={d}", is_lse=True)


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("n_q, n_k", [(1, 1), (7, 200), (200, 65), (64, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_float16_flash_attention_rule(rng, d, n_q, n_k, causal):
    """float16 in, float32 arithmetic, float16 out: blocked error <= 2x naive float16 error (+ rounding)."""
    q, k, v = make_qkv(rng, (2,), n_q, n_k, d=d, dtype=np.float16)
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=causal)
    naive_o, naive_lse = tf.naive_attention(q, k, v, causal=causal)
    o, lse = tf.blocked_attention(q, k, v, causal=causal, block_q=16, block_k=64)
    assert o.dtype == np.float16 and lse.dtype == np.float32
    assert_fa_rule(o, naive_o, ref_o, np.float16, what="o")
    # lse is computed and returned in float32, so the float32 rule applies to it.
    assert_close(lse, ref_lse, F32_TOL, "lse", is_lse=True)
    assert_close(naive_lse, ref_lse, F32_TOL, "naive lse", is_lse=True)


@pytest.mark.parametrize("causal", [False, True])
def test_naive_matches_the_textbook_formula(rng, causal):
    """Stage 0 against softmax(S) V written out directly, with an explicit mask."""
    q, k, v = make_qkv(rng, (), 9, 12, d=4, d_v=2)
    S = q @ k.T / np.sqrt(4)  # (9, 12)
    if causal:
        S = np.where(np.arange(12)[None, :] <= np.arange(9)[:, None] + 3, S, -np.inf)
    P = np.exp(S) / np.exp(S).sum(axis=1, keepdims=True)  # small logits: no overflow here
    o, lse = tf.naive_attention(q, k, v, causal=causal)
    assert_close(o, P @ v, F64_TOL)
    assert_close(lse, np.log(np.exp(S).sum(axis=1)), F64_TOL, is_lse=True)


def test_causal_bottom_right_alignment():
    """Query i attends key j iff j <= i + (Nk - Nq); with Nq == Nk the lower triangle."""
    assert np.array_equal(tf.causal_mask(3, 3), np.tril(np.ones((3, 3), bool)))
    expected = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)  # Nq=2, Nk=4: offset 2
    assert np.array_equal(tf.causal_mask(2, 4), expected)
    expected = np.array([[0, 0], [1, 0], [1, 1]], bool)  # Nq=3, Nk=2: row 0 sees nothing
    assert np.array_equal(tf.causal_mask(3, 2), expected)


@pytest.mark.parametrize("fn", [tf.naive_attention, tf.blocked_attention])
def test_fully_masked_rows_give_zero_and_minus_inf(rng, fn):
    q, k, v = make_qkv(rng, (2,), 7, 3, d=4)
    o, lse = fn(q, k, v, causal=True)  # rows 0..3 have i + (3 - 7) < 0: no key allowed
    assert np.all(o[:, :4] == 0) and np.all(np.isneginf(lse[:, :4]))
    assert np.all(np.isfinite(lse[:, 4:])) and np.all(np.abs(o[:, 4:]) > 0)


def test_causal_skips_tiles_above_the_diagonal(rng):
    """The blocked stage reads only the key tiles on or below the diagonal: about half for causal."""
    from tinyflash.cost.traffic import HBMCounter

    q, k, v = make_qkv(rng, (), 256, 256, d=4)
    full, causal = HBMCounter(), HBMCounter()
    tf.blocked_attention(q, k, v, block_q=64, block_k=64, io=full)
    tf.blocked_attention(q, k, v, causal=True, block_q=64, block_k=64, io=causal)
    tiles_full, tiles_causal = full.reads["K"] // (64 * 4 * 8), causal.reads["K"] // (64 * 4 * 8)
    assert tiles_full == 16 and tiles_causal == 4 + 3 + 2 + 1


@pytest.mark.parametrize("fn", [tf.naive_attention, tf.blocked_attention])
def test_empty_queries_give_empty_outputs(rng, fn):
    q, k, v = make_qkv(rng, (2,), 0, 5, d=4, d_v=3, dtype=np.float32)
    o, lse = fn(q, k, v)
    assert o.shape == (2, 0, 3) and o.dtype == np.float32
    assert lse.shape == (2, 0) and lse.dtype == np.float32


@pytest.mark.parametrize("fn", [tf.naive_attention, tf.blocked_attention])
def test_inputs_are_not_modified(rng, fn):
    q, k, v = make_qkv(rng, (2,), 9, 11, d=4, dtype=np.float32)
    copies = [x.copy() for x in (q, k, v)]
    fn(q, k, v, causal=True)
    for x, c in zip((q, k, v), copies):
        assert np.array_equal(x, c)


@pytest.mark.parametrize("fn", [tf.naive_attention, tf.blocked_attention])
def test_non_contiguous_inputs(rng, fn):
    """Transposed views and strided slices give the same result as contiguous copies."""
    base = rng.standard_normal((3, 8, 40))  # (B, d, N): q as a transposed view
    q = np.swapaxes(base, 1, 2)  # (3, 40, 8) non-contiguous
    k = rng.standard_normal((3, 80, 8))[:, ::2]  # (3, 40, 8) every other row
    v = rng.standard_normal((3, 40, 12))[..., ::3]  # (3, 40, 4) strided columns
    assert not (q.flags.c_contiguous or k.flags.c_contiguous or v.flags.c_contiguous)
    o, lse = fn(q, k, v)
    o_ref, lse_ref = fn(*(np.ascontiguousarray(x) for x in (q, k, v)))
    assert_close(o, o_ref, F64_TOL)
    assert_close(lse, lse_ref, F64_TOL, is_lse=True)


@pytest.mark.parametrize("fn", [tf.naive_attention, tf.blocked_attention])
def test_nan_propagates_to_the_affected_rows(rng, fn):
    q, k, v = make_qkv(rng, (), 20, 20, d=4, dtype=np.float32)
    q[3, 1] = np.nan  # one query row
    o, lse = fn(q, k, v)
    assert np.isnan(o[3]).all() and np.isnan(lse[3])
    assert np.isfinite(np.delete(o, 3, axis=0)).all()
    k[5, 0] = np.nan  # one key: every row that attends it is affected
    o, lse = fn(q, k, v, causal=True)
    assert np.isnan(o[5:]).all() and np.isfinite(o[:3]).all() and np.isfinite(o[4]).all()


@pytest.mark.parametrize("fn", [tf.naive_attention, tf.blocked_attention])
def test_huge_logits_stay_finite_and_correct(rng, fn):
    """Scores around ±1e4 in float32: exp would overflow without subtracting the running max."""
    q, k, v = make_qkv(rng, (2,), 33, 40, d=16, dtype=np.float32)
    q *= 50.0  # scores ~ 50·N(0,1)·sqrt(16)/4 ... up to about 1e4 after the next line
    k *= 50.0
    o, lse = fn(q, k, v, causal=True)
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=True)
    assert np.abs(ref_lse).max() > 3e3  # the logits really are huge
    assert np.isfinite(o).all() and np.isfinite(lse).all()
    # float32 knows scores of size |S| only to about eps·|S| (here ~1e-3 absolute), and a softmax passes
    # that absolute error on as a relative error of its weights: the output can be no better.
    assert_close(o, ref_o, 4 * np.finfo(np.float32).eps * float(np.abs(ref_lse).max()), "o")
    assert_close(lse, ref_lse, F32_TOL, "lse", is_lse=True)


def test_blocked_never_allocates_an_n_by_n_array(rng):
    """tracemalloc peak at N = 4096 stays far below one N×N float64 matrix (128 MiB)."""
    import tracemalloc

    n, d = 4096, 32
    q, k, v = make_qkv(rng, (), n, n, d=d)
    tracemalloc.start()
    try:
        tf.blocked_attention(q, k, v, causal=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    n_by_n = n * n * 8
    outputs = n * d * 8 + n * 8
    assert peak < n_by_n / 50, f"peak {peak} bytes; one N×N matrix is {n_by_n}"
    assert peak < 4 * outputs, f"peak {peak} bytes; O and lse are {outputs}"
