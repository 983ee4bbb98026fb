"""score_mod and mask_mod on stages 0 and 1, forward and backward; dual numbers; attention sinks.

Every stage is checked against a dense float64 formula written here with NumPy arrays (the bias and
the mask as Nq × Nk matrices, built without tinyflash.core.mods), and the backward against central
finite differences. Sizes are not multiples of the tiles; rows that see no key, causal together
with a mask_mod and grouped-query heads are among the cases.
"""

import math

import numpy as np
import pytest
from conftest import make_qkv
from test_backward import finite_difference, make_do

import tinyflash as tf
from tinyflash.core.dual import Dual, dual_aware
from tinyflash.core.mods import IndexBase, evaluate
from tinyflash.core.tolerance import F32_TOL, assert_close

F64_TOL = 1e-12  # float64 stages against the dense formula
FD_TOL = 1e-6  # float64 gradients against central finite differences


def dense_attention(q, k, v, *, scale=None, score=None, keep=None, causal=False, sinks=None):
    """The formula with Nq × Nk arrays: ``score(S, b, h, i, j)`` on index grids given as arrays (NumPy
    formulas), ``keep`` a boolean array broadcasting to (..., Nq, Nk), sinks (H,). Returns (o, lse) in float64."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    *lead, n_q, d = q.shape
    n_k = k.shape[-2]
    if k.shape[:-2] != q.shape[:-2]:  # grouped-query heads: repeat k and v to q's heads
        g = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    scale = 1 / math.sqrt(d) if scale is None else scale
    S = scale * q @ np.swapaxes(k, -1, -2)  # (..., Nq, Nk)
    b, h = grids(lead)
    i, j = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
    if score is not None:
        S = score(S, b, h, i, j)
    allowed = np.ones((n_q, n_k), bool) if keep is None else keep
    if causal:
        allowed = allowed & (j <= i + n_k - n_q)
    S = np.where(allowed, S, -np.inf)
    sink = np.full((*lead, 1, 1), -np.inf)  # no sink: a logit of weight 0
    if sinks is not None:  # sinks (H,) to (*lead, 1, 1): one per query head
        per_head = (*([1] * (len(lead) - 1)), -1, 1, 1) if lead else (1, 1)
        sink = np.broadcast_to(np.asarray(sinks, np.float64).reshape(per_head), (*lead, 1, 1))
    m = np.maximum(S.max(-1, keepdims=True), sink)
    m = np.where(np.isfinite(m), m, 0.0)
    E = np.exp(S - m)
    l = E.sum(-1, keepdims=True) + np.exp(sink - m)
    with np.errstate(divide="ignore", invalid="ignore"):
        o = np.where(l > 0, (E @ v) / l, 0.0)
        lse = np.where(l > 0, m + np.log(l), -np.inf)[..., 0]
    return o, lse


def grids(lead):
    """b, h index arrays broadcasting over (*lead, Nq, Nk), as the docs define them."""
    if len(lead) == 2:
        return np.arange(lead[0]).reshape(-1, 1, 1, 1), np.arange(lead[1]).reshape(1, -1, 1, 1)
    if len(lead) == 1:
        return 0, np.arange(lead[0]).reshape(-1, 1, 1)
    return 0, 0


# (name, score_mod, its NumPy formula) and (name, mask_mod, its NumPy formula): vectorisable ones and
# ones that take scalars only (math, if, min), which the stages evaluate element by element
SCORE_MODS = [
    ("bias by head and distance", lambda s, b, h, i, j: s + 0.25 * h - 0.05 * (i - j) + 0.5 * b,
     lambda s, b, h, i, j: s + 0.25 * h - 0.05 * (i - j) + 0.5 * b),
    ("softcap with math.tanh", lambda s, b, h, i, j: 2.0 * math.tanh(s / 2.0) + 0.1 * h,
     lambda s, b, h, i, j: 2.0 * np.tanh(s / 2.0) + 0.1 * h),
    ("a branch", lambda s, b, h, i, j: s * s * 0.3 if s > 0 else s,
     lambda s, b, h, i, j: np.where(s > 0, s * s * 0.3, s)),
    ("indices on the left", lambda s, b, h, i, j: (h + 1) * s * 0.5 - (i - j) / (s * s + 4),
     lambda s, b, h, i, j: (h + 1) * s * 0.5 - (i - j) / (s * s + 4)),
]
MASK_MODS = [
    ("window by head", lambda b, h, i, j: (j <= i + 2) & (i + 2 - j < 6 + 3 * h) | (j == b),
     lambda b, h, i, j: (j <= i + 2) & (i + 2 - j < 6 + 3 * h) | (j == b)),
    ("rows 3 mod 5 see nothing", lambda b, h, i, j: i % 5 != 3 and (i + j) % 7 != 0,
     lambda b, h, i, j: (i % 5 != 3) & ((i + j) % 7 != 0)),
]


@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", MASK_MODS, ids=lambda m: m[0])
@pytest.mark.parametrize("score", SCORE_MODS, ids=lambda m: m[0])
def test_stages_match_the_dense_formula(rng, lead, causal, mask, score):
    """naive, blocked (ragged 8 × 16 tiles) and the reference against the dense formula, Nq != Nk."""
    q, k, v = make_qkv(rng, lead, 29, 37, d=4, d_v=3)
    b, h = grids(lead)
    keep = mask[2](b, h, np.arange(29)[:, None], np.arange(37)[None, :])
    ref_o, ref_lse = dense_attention(q, k, v, score=score[2], keep=keep, causal=causal)
    mods = dict(score_mod=score[1], mask_mod=mask[1], causal=causal)
    for name, (o, lse) in (("naive", tf.naive_attention(q, k, v, **mods)),
                           ("blocked", tf.blocked_attention(q, k, v, block_q=8, block_k=16, **mods)),
                           ("reference", tf.reference_attention(q, k, v, **mods))):
        assert_close(o, ref_o, F64_TOL, f"{name} o")
        assert_close(lse, ref_lse, F64_TOL, f"{name} lse", is_lse=True)


def test_reference_rows_keep_their_positions(rng):
    """reference_attention(rows=...) evaluates the mods at the rows' true q_idx."""
    q, k, v = make_qkv(rng, (2, 2), 30, 26, d=4)
    mods = dict(score_mod=SCORE_MODS[0][1], mask_mod=MASK_MODS[0][1], causal=True)
    rows = np.array([0, 7, 29, 13])
    whole, some = tf.reference_attention(q, k, v, **mods), tf.reference_attention(q, k, v, rows=rows, **mods)
    assert_close(some[0], whole[0][..., rows, :], F64_TOL, "o of the rows")
    assert_close(some[1], whole[1][..., rows], F64_TOL, "lse of the rows", is_lse=True)


def test_no_key_rows_give_zero_and_minus_inf(rng):
    """A mask_mod that empties rows: o = 0, lse = -inf, and their gradients 0, on both stages."""
    q, k, v = make_qkv(rng, (2,), 21, 13, d=4)
    mask = lambda b, h, i, j: (i % 4 != 1) & (j <= i)  # noqa: E731  rows 1, 5, 9, ... see nothing
    empty = np.arange(21) % 4 == 1
    o0, lse0 = tf.naive_attention(q, k, v, mask_mod=mask)
    o1, lse1 = tf.blocked_attention(q, k, v, mask_mod=mask, block_q=4, block_k=8)
    do = make_do(rng, q, v)
    g0 = tf.naive_attention_backward(q, k, v, do, mask_mod=mask)
    g1 = tf.blocked_attention_backward(q, k, v, o1, lse1, do, mask_mod=mask, block_q=4, block_k=8)
    for o, lse, (dq, _, _) in ((o0, lse0, g0), (o1, lse1, g1)):
        assert not o[:, empty].any() and np.all(lse[:, empty] == -np.inf) and np.isfinite(lse[:, ~empty]).all()
        assert not dq[:, empty].any()
    for a, b, name in zip(g1, g0, ("dq", "dk", "dv")):
        assert_close(a, b, F64_TOL, f"blocked {name} vs naive")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_identity_mods_are_bit_identical_to_none(rng, dtype):
    """score_mod returning the score, mask_mod keeping every key: the same bits as no mods (causal on)."""
    q, k, v = make_qkv(rng, (2, 3), 23, 30, d=5, dtype=dtype)
    ident, everything = (lambda s, b, h, i, j: s), (lambda b, h, i, j: True)
    for fn, kw in ((tf.naive_attention, {}), (tf.blocked_attention, dict(block_q=8, block_k=8))):
        plain = fn(q, k, v, causal=True, **kw)
        for mods in (dict(score_mod=ident), dict(score_mod=ident, mask_mod=everything)):
            got = fn(q, k, v, causal=True, **mods, **kw)
            assert all(np.array_equal(a, b) for a, b in zip(got, plain)), (fn.__name__, mods)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_vector_and_element_evaluation_agree_bitwise(rng, dtype):
    """The same arithmetic, once vectorisable and once forced element by element (``min`` takes no arrays)."""
    q, k, v = make_qkv(rng, (2, 3), 17, 19, d=4, dtype=dtype)
    vector = lambda s, b, h, i, j: s * 0.7 + h * 0.3 - (i - j) * 0.01  # noqa: E731
    element = lambda s, b, h, i, j: min(s * 0.7 + h * 0.3 - (i - j) * 0.01, 1e30)  # noqa: E731
    S = rng.standard_normal((2, 3, 5, 6)).astype(dtype)
    grid = (S, np.arange(2).reshape(2, 1, 1, 1), np.arange(3).reshape(1, 3, 1, 1), np.arange(5)[:, None],
            np.arange(6)[None, :])
    (a, a_per_element), (b, b_per_element) = evaluate(vector, grid), evaluate(element, grid)
    assert not a_per_element and b_per_element
    assert np.array_equal(a, np.array(b, dtype=a.dtype).reshape(a.shape))
    for fn, kw in ((tf.naive_attention, {}), (tf.blocked_attention, dict(block_q=8, block_k=8))):
        x, y = fn(q, k, v, score_mod=vector, **kw), fn(q, k, v, score_mod=element, **kw)
        assert all(np.array_equal(p, r) for p, r in zip(x, y)), fn.__name__


def test_grouped_query_heads_see_the_query_head(rng):
    """H = 4 query heads on H_kv = 2 K/V heads: h in the mods is the query head."""
    q, _, _ = make_qkv(rng, (2, 4), 19, 1, d=4)
    _, k, v = make_qkv(rng, (2, 2), 1, 23, d=4)
    score = lambda s, b, h, i, j: s + 0.5 * h * (j % 3)  # noqa: E731
    mask = lambda b, h, i, j: (i - j) % (h + 2) != 0  # noqa: E731
    b, h = grids((2, 4))
    ref = dense_attention(q, k, v, score=score, keep=mask(b, h, np.arange(19)[:, None], np.arange(23)[None, :]))
    for name, got in (("naive", tf.naive_attention(q, k, v, score_mod=score, mask_mod=mask)),
                      ("blocked", tf.blocked_attention(q, k, v, score_mod=score, mask_mod=mask, block_q=8,
                                                       block_k=8))):
        assert_close(got[0], ref[0], F64_TOL, f"{name} o")
        assert_close(got[1], ref[1], F64_TOL, f"{name} lse", is_lse=True)


def test_float32_within_tolerance(rng):
    q, k, v = make_qkv(rng, (2,), 40, 33, d=8, dtype=np.float32)
    mods = dict(score_mod=SCORE_MODS[1][1], mask_mod=MASK_MODS[0][1], causal=True)
    ref_o, ref_lse = tf.reference_attention(q, k, v, **mods)
    for fn in (tf.naive_attention, tf.blocked_attention):
        o, lse = fn(q, k, v, **mods)
        assert o.dtype == np.float32 and lse.dtype == np.float32
        assert_close(o, ref_o, F32_TOL, f"{fn.__name__} o")
        assert_close(lse, ref_lse, F32_TOL, f"{fn.__name__} lse", is_lse=True)


def test_index_base_sees_the_sequence_and_its_positions(rng):
    """A view of a longer call with IndexBase(batch, q, kv): the mods see b = batch and absolute positions."""
    q, k, v = make_qkv(rng, (3,), 30, 30, d=4)
    score = lambda s, b, h, i, j: s + 0.1 * b + 0.02 * (i - j) + 0.3 * h  # noqa: E731
    mask = lambda b, h, i, j: (j <= i) & (i - j < 9 + b)  # noqa: E731
    h = np.arange(3).reshape(-1, 1, 1)
    i, j = np.arange(30)[:, None], np.arange(30)[None, :]
    whole = dense_attention(q, k, v, score=lambda s, *_: score(s, 4, h, i, j), keep=mask(4, h, i, j))
    base = IndexBase(batch=4, q=10, kv=10)  # the view starts at position 10 of the whole
    for fn in (tf.naive_attention, tf.blocked_attention):
        o, lse = fn(q[:, 10:], k[:, 10:], v[:, 10:], score_mod=score, mask_mod=mask, _index_base=base)
        sub = dense_attention(q[:, 10:], k[:, 10:], v[:, 10:], score=lambda s, *_: score(s, 4, h, i[10:], j[:, 10:]),
                              keep=mask(4, h, i[10:], j[:, 10:]))
        assert_close(o, sub[0], F64_TOL, f"{fn.__name__} o")
        inside = np.arange(10, 30) >= 22  # rows whose keys (i - 12 <= j <= i with b = 4) all lie in the view
        assert_close(o[:, inside], whole[0][:, 10:][:, inside], F64_TOL, "o vs the whole call")


# ---- dual numbers ----

DUAL_CASES = [
    ("polynomial", lambda s: 3 * s ** 3 - 2 * s + 1 / (s * s + 1)),
    ("pow with a dual exponent", lambda s: 2.0 ** s + (s * s + 1) ** (0.5 * s)),
    ("math functions", lambda s: math.exp(s / 3) + math.log1p(s * s) + math.sqrt(s * s + 2) + math.sin(s) * math.cos(s)),
    ("tanh, atan, erf, abs", lambda s: 1.5 * math.tanh(s / 1.5) + math.atan(s) + math.erf(s) + abs(s - 0.1)),
    ("branches and min", lambda s: min(s, 0.5) if s > -0.3 else -s * s),
    ("division from the left", lambda s: 1.0 / (2.0 + s) - (4 - s) / (s * s + 3)),
    ("math.pow", lambda s: math.pow(s * s + 1, 1.5)),
]


@pytest.mark.parametrize("case", DUAL_CASES, ids=lambda c: c[0])
def test_dual_derivative_against_finite_differences(rng, case):
    fn = dual_aware(case[1])
    for s in rng.uniform(-1.5, 1.5, size=7):
        got = fn(Dual(float(s), 1.0))
        val, der = (got.val, got.der) if isinstance(got, Dual) else (got, 0.0)  # a constant branch: slope 0
        fd = (case[1](s + 1e-6) - case[1](s - 1e-6)) / 2e-6
        assert val == case[1](float(s))  # the value is the plain function's, bit for bit
        assert abs(der - fd) <= 1e-6 * max(1.0, abs(fd)), (case[0], s, der, fd)


def test_numpy_on_the_left_of_a_dual_defers_to_it():
    """``h * s`` with h a NumPy scalar or array: a Dual (Dual.__rmul__), not an object array of Duals."""
    for left in (np.float64(2.0), np.int64(3), np.arange(3.0)):
        got = left * Dual(np.full(3, 1.5), np.ones(3))
        assert isinstance(got, Dual) and np.array_equal(got.der, left * np.ones(3))
        assert isinstance(left - Dual(1.5, 1.0), Dual) and isinstance(left / Dual(1.5, 1.0), Dual)


def test_dual_aware_answers_math_imported_by_name_and_in_closures():
    from math import tanh

    exp = math.exp

    def mod(s):
        return tanh(s) + exp(s)

    got = dual_aware(mod)(Dual(0.3, 1.0))
    assert abs(got.der - (1 - math.tanh(0.3) ** 2 + math.exp(0.3))) < 1e-15
    assert mod(0.3) == got.val and tanh is math.tanh  # the user's function and math are untouched


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("score", [SCORE_MODS[i] for i in (0, 1, 3)], ids=lambda m: m[0])
def test_backward_with_score_mod_against_finite_differences(rng, score, causal):
    """The naive backward (dual numbers through score_mod) against central differences; blocked against naive."""
    q, k, v = make_qkv(rng, (2, 2), 6, 5, d=3, d_v=2)
    W = make_do(rng, q, v)
    mods = dict(score_mod=score[1], mask_mod=MASK_MODS[0][1], causal=causal)

    def loss():
        return float((tf.naive_attention(q, k, v, **mods)[0] * W).sum())

    grads = tf.naive_attention_backward(q, k, v, W, **mods)
    for name, x, g in zip(("dq", "dk", "dv"), (q, k, v), grads):
        assert_close(g, finite_difference(loss, x), FD_TOL, f"{name} vs finite differences")
    o, lse = tf.blocked_attention(q, k, v, block_q=4, block_k=2, **mods)
    blocked = tf.blocked_attention_backward(q, k, v, o, lse, W, block_q=4, block_k=2, **mods)
    for name, a, b in zip(("dq", "dk", "dv"), blocked, grads):
        assert_close(a, b, F64_TOL, f"blocked {name} vs naive")


# ---- attention sinks ----

@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
@pytest.mark.parametrize("causal", [False, True])
def test_sinks_forward_against_the_dense_formula(rng, lead, causal):
    """Nq > Nk with causal: rows that see no key keep the sink alone (o = 0, lse = sink)."""
    q, k, v = make_qkv(rng, lead, 23, 17, d=4)
    sinks = rng.standard_normal(lead[-1] if lead else 1)
    ref = dense_attention(q, k, v, causal=causal, sinks=sinks)
    for name, (o, lse) in (("naive", tf.naive_attention(q, k, v, causal=causal, sinks=sinks)),
                           ("blocked", tf.blocked_attention(q, k, v, causal=causal, sinks=sinks, block_q=8,
                                                            block_k=8)),
                           ("reference", tf.reference_attention(q, k, v, causal=causal, sinks=sinks))):
        assert_close(o, ref[0], F64_TOL, f"{name} o")
        assert_close(lse, ref[1], F64_TOL, f"{name} lse", is_lse=True)


def test_sinks_gradient_against_finite_differences(rng):
    q, k, v = make_qkv(rng, (2, 3), 7, 6, d=3)
    sinks = rng.standard_normal(3)
    W = make_do(rng, q, v)
    mods = dict(causal=True, score_mod=SCORE_MODS[0][1], mask_mod=MASK_MODS[0][1])

    def loss():
        return float((tf.naive_attention(q, k, v, sinks=sinks, **mods)[0] * W).sum())

    grads = tf.naive_attention_backward(q, k, v, W, sinks=sinks, **mods)
    assert len(grads) == 4 and grads[3].shape == (3,)
    for name, x, g in zip(("dq", "dk", "dv", "dsinks"), (q, k, v, sinks), grads):
        assert_close(g, finite_difference(loss, x), FD_TOL, f"{name} vs finite differences")
    o, lse = tf.blocked_attention(q, k, v, sinks=sinks, block_q=4, block_k=4, **mods)
    blocked = tf.blocked_attention_backward(q, k, v, o, lse, W, sinks=sinks, block_q=4, block_k=4, **mods)
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), blocked, grads):
        assert_close(a, b, F64_TOL, f"blocked {name} vs naive")
    ref = tf.reference_attention_backward(q.astype(np.float32), k, v, W, sinks=sinks.astype(np.float32), **mods)
    assert ref[3].dtype == np.float64


def test_inputs_are_not_modified(rng):
    q, k, v = make_qkv(rng, (2,), 9, 11, d=3)
    sinks = rng.standard_normal(2)
    saved = [x.copy() for x in (q, k, v, sinks)]
    o, lse = tf.blocked_attention(q, k, v, sinks=sinks, score_mod=SCORE_MODS[1][1], block_q=4, block_k=4)
    tf.blocked_attention_backward(q, k, v, o, lse, o, sinks=sinks, score_mod=SCORE_MODS[1][1], block_q=4, block_k=4)
    assert all(np.array_equal(a, b) for a, b in zip((q, k, v, sinks), saved))


# ---- bad inputs ----

BAD = [
    (dict(score_mod=3), TypeError, "score_mod must be a callable"),
    (dict(mask_mod="no"), TypeError, "mask_mod must be a callable"),
    (dict(score_mod=lambda s, b, h: s), TypeError, "score_mod must take 5 positional arguments"),
    (dict(mask_mod=lambda b, h, i, j, extra: True), TypeError, "mask_mod must take 4 positional arguments"),
    (dict(sinks=np.zeros(3)), ValueError, r"sinks must have shape \(2,\)"),
    (dict(sinks=np.zeros(2, dtype=np.int64)), TypeError, "sinks must be a float array"),
    (dict(mask_mod=lambda b, h, i, j: True, _index_base=(1, 2, 3)), TypeError, "_index_base must be"),
]


@pytest.mark.parametrize("stage", ["naive", "blocked", "naive_backward", "blocked_backward"])
@pytest.mark.parametrize("kwargs, error, message", BAD, ids=lambda x: str(x)[:40])
def test_bad_mods(rng, stage, kwargs, error, message):
    q, k, v = make_qkv(rng, (2,), 5, 6, d=3)
    o, lse = tf.naive_attention(q, k, v)
    call = {"naive": lambda: tf.naive_attention(q, k, v, **kwargs),
            "blocked": lambda: tf.blocked_attention(q, k, v, **kwargs),
            "naive_backward": lambda: tf.naive_attention_backward(q, k, v, o, **kwargs),
            "blocked_backward": lambda: tf.blocked_attention_backward(q, k, v, o, lse, o, **kwargs)}[stage]
    with pytest.raises(error, match=message):
        call()


def test_mods_need_at_most_two_leading_dims(rng):
    q, k, v = make_qkv(rng, (2, 2, 2), 5, 6, d=3)
    with pytest.raises(ValueError, match=r"needs q of shape \(Nq, d\), \(H, Nq, d\) or \(B, H, Nq, d\)"):
        tf.blocked_attention(q, k, v, mask_mod=lambda b, h, i, j: True)
    with pytest.raises(ValueError, match="sinks needs q of shape"):
        tf.naive_attention(q, k, v, sinks=np.zeros(2))


def test_a_mask_mod_returning_the_wrong_shape_is_named(rng):
    q, k, v = make_qkv(rng, (2,), 5, 6, d=3)
    with pytest.raises(ValueError, match="mask_mod must return a bool"):
        tf.naive_attention(q, k, v, mask_mod=lambda b, h, i, j: np.ones(7, bool))


# ---- the grid ----

@pytest.mark.grid
@pytest.mark.parametrize("n_q, n_k", [(1, 1), (1, 40), (40, 1), (63, 65), (65, 63), (100, 100)])
@pytest.mark.parametrize("block", [(1, 1), (16, 16), (7, 33), (128, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_grid_stages_and_backward(rng, n_q, n_k, block, causal):
    q, k, v = make_qkv(rng, (2, 2), n_q, n_k, d=5, d_v=3)
    score, mask = SCORE_MODS[0], MASK_MODS[0]
    b, h = grids((2, 2))
    keep = mask[2](b, h, np.arange(n_q)[:, None], np.arange(n_k)[None, :])
    sinks = rng.standard_normal(2)
    ref = dense_attention(q, k, v, score=score[2], keep=keep, causal=causal, sinks=sinks)
    mods = dict(score_mod=score[1], mask_mod=mask[1], causal=causal, sinks=sinks)
    o, lse = tf.blocked_attention(q, k, v, block_q=block[0], block_k=block[1], **mods)
    assert_close(o, ref[0], F64_TOL, "blocked o")
    assert_close(lse, ref[1], F64_TOL, "blocked lse", is_lse=True)
    do = make_do(rng, q, v)
    want = tf.naive_attention_backward(q, k, v, do, **mods)
    got = tf.blocked_attention_backward(q, k, v, o, lse, do, block_q=block[0], block_k=block[1], **mods)
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), got, want):
        assert_close(a, b, 1e-11, f"blocked {name} vs naive")
