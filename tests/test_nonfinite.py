"""NaN and ±inf in the inputs: the same defined result in every stage, and no NumPy warnings.

The rules (docs/using.md, "NaN and ±inf"), on the scaled scores s = scale · q_i · k_j of the keys a row
attends (a masked key never counts):
* a NaN score, or a +inf one, makes the row's o and lse NaN: so a NaN in k_j poisons every row
  that attends key j, and a NaN in q_i its own row;
* a -inf score gives its key weight 0; a row whose scores are all -inf is treated like a row that
  may attend no key: o = 0, lse = -inf;
* a NaN or ±inf in v_j makes non-finite the o of the rows that attend key j (lse is unchanged).
"""

import warnings

import numpy as np
import pytest
from conftest import make_qkv

import tinyflash as tf
from tinyflash.core.masks import key_stop
from tinyflash.core.tolerance import F32_TOL, assert_close, assert_fa_rule

N_Q, N_K, D = 11, 13, 8  # no tile divides them; tiny, for the simulator


def stages():
    yield "naive", tf.naive_attention
    yield "blocked", lambda *a, **kw: tf.blocked_attention(*a, block_q=4, block_k=5, **kw)
    for kernel in ("v1", "v5"):  # the simple kernel and the latest, on the simulator without a GPU
        yield kernel, lambda *a, kernel=kernel, **kw: tf.cuda_attention(*a, kernel=kernel, **kw)


STAGES = dict(stages())
KERNEL = [pytest.mark.simulator, pytest.mark.grid]  # the kernels' cases: the simulator's grid
STAGE_CASES = [pytest.param(name, marks=KERNEL) if name.startswith("v") else name for name in STAGES]


def run(stage, q, k, v, causal):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # NumPy's "invalid value encountered" would fail here
        o, lse = STAGES[stage](q, k, v, causal=causal)
    return o.astype(np.float64), lse.astype(np.float64)


def attends(row, key, causal):
    return key < key_stop(row + 1, N_Q, N_K, causal)


@pytest.mark.parametrize("stage", STAGE_CASES)
def test_nan_key_poisons_exactly_the_rows_that_attend_it(stage, rng):
    q, k, v = make_qkv(rng, (), N_Q, N_K, D, dtype=np.float32)
    j = N_K - 4  # causal: the first rows do not reach it
    k[j, 2] = np.nan
    clean = k.copy()
    clean[j, 2] = 0.0
    o, lse = run(stage, q, k, v, True)
    o_ref, lse_ref = tf.reference_attention(q, clean, v, causal=True)
    hit = np.array([attends(i, j, True) for i in range(N_Q)])  # (Nq,)
    assert hit.any() and not hit.all()
    assert np.isnan(o[hit]).all() and np.isnan(lse[hit]).all()
    assert_close(o[~hit], o_ref[~hit], F32_TOL, "o of the rows that do not attend the NaN key")
    assert_close(lse[~hit], lse_ref[~hit], F32_TOL, "lse of those rows", is_lse=True)


@pytest.mark.parametrize("stage", STAGE_CASES)
def test_nan_query_poisons_its_row_only(stage, rng):
    q, k, v = make_qkv(rng, (), N_Q, N_K, D, dtype=np.float32)
    q[4, 0] = np.nan
    o, lse = run(stage, q, k, v, False)
    o_ref, lse_ref = tf.reference_attention(np.delete(q, 4, axis=0), k, v)
    assert np.isnan(o[4]).all() and np.isnan(lse[4])
    assert_close(np.delete(o, 4, axis=0), o_ref, F32_TOL, "o of the other rows")
    assert_close(np.delete(lse, 4), lse_ref, F32_TOL, "lse of the other rows", is_lse=True)


@pytest.mark.parametrize("stage", STAGE_CASES)
def test_infinite_scores(stage, rng):
    """k_j[0] = +inf: rows with q_i[0] > 0 score +inf (NaN rows), rows with q_i[0] < 0 score -inf
    (key j gets weight 0: the result without key j)."""
    q, k, v = make_qkv(rng, (), N_Q, N_K, D, dtype=np.float32)
    j = 6
    k[:, 0] = -np.abs(k[:, 0])  # every key but j: k[:, 0] < 0
    k[j, 0] = np.inf
    q[0, 0], q[1, 0] = 0.5, -0.5  # at least one row of each kind
    o, lse = run(stage, q, k, v, False)
    plus = q[:, 0] > 0  # (Nq,) rows whose score on key j is +inf
    assert np.isnan(o[plus]).all() and np.isnan(lse[plus]).all()
    minus = ~plus
    o_ref, lse_ref = tf.reference_attention(q[minus], np.delete(k, j, axis=0), np.delete(v, j, axis=0))
    assert_close(o[minus], o_ref, F32_TOL, "o of the rows whose score on key j is -inf")
    assert_close(lse[minus], lse_ref, F32_TOL, "lse of those rows", is_lse=True)


@pytest.mark.parametrize("stage", STAGE_CASES)
def test_all_scores_minus_inf_is_a_row_with_no_key(stage, rng):
    q, k, v = make_qkv(rng, (), N_Q, N_K, D, dtype=np.float32)
    k[:, 0] = np.abs(k[:, 0]) + 0.5  # every key: k[:, 0] > 0
    q[3, 0] = -np.inf  # row 3 scores -inf against every key
    o, lse = run(stage, q, k, v, False)
    assert (o[3] == 0).all() and lse[3] == -np.inf
    assert np.isfinite(np.delete(o, 3, axis=0)).all()


@pytest.mark.parametrize("stage", STAGE_CASES)
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_value_reaches_the_rows_that_attend_it(stage, bad, rng):
    q, k, v = make_qkv(rng, (), N_Q, N_K, D, dtype=np.float32)
    j, c = N_K - 2, 3
    v[j, c] = bad
    o, lse = run(stage, q, k, v, True)
    hit = np.array([attends(i, j, True) for i in range(N_Q)])  # (Nq,)
    assert not np.isfinite(o[hit, c]).any()
    assert np.isfinite(np.delete(o[hit], c, axis=1)).all() and np.isfinite(lse).all()
    assert_close(lse, tf.reference_attention(q, k, np.nan_to_num(v, posinf=0.0), causal=True)[1], F32_TOL, "lse",
                 is_lse=True)


@pytest.mark.simulator
@pytest.mark.grid
@pytest.mark.parametrize("lazy", [False, True])
def test_tensor_core_kernel_follows_the_same_rules(rng, lazy):
    """Stage 3 (kernel v6: float16, d = 64) on the same four situations, in one test to keep the
    simulator's cost down: a NaN key, a +inf / -inf score, a row of -inf scores, a NaN value; with the
    running state rescaled at every tile, and lazily (LAZY_RESCALE: only when a row's max grows by more
    than 2^8, which a NaN never does)."""
    d = 64
    from tinyflash.forward.kernels.tensor_core_tiling import TensorCoreTiling

    config = TensorCoreTiling(D=d, WARPS=1, BC=16, LAZY_RESCALE=lazy)  # the simulator's tiling, or lazy

    def inputs():
        return make_qkv(rng, (), N_Q, N_K, d, dtype=np.float16)

    def attention(q, k, v, causal):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            o, lse = tf.cuda_attention(q, k, v, causal=causal, kernel="v6", config=config)
        return o.astype(np.float64), lse.astype(np.float64)

    q, k, v = inputs()  # a NaN in key j: exactly the rows that attend it are NaN
    j = N_K - 4
    k[j, 2] = np.nan
    o, lse = attention(q, k, v, True)
    hit = np.array([attends(i, j, True) for i in range(N_Q)])  # (Nq,)
    assert np.isnan(o[hit]).all() and np.isnan(lse[hit]).all()
    assert np.isfinite(o[~hit]).all() and np.isfinite(lse[~hit]).all()

    q, k, v = inputs()  # key j scores +inf for row 0 (a NaN row) and -inf for row 1 (weight 0)
    j = 6
    k[:, 0] = -np.abs(k[:, 0])
    k[j, 0] = np.inf
    q[0, 0], q[1, 0] = 0.5, -0.5
    o, lse = attention(q, k, v, False)
    plus = q[:, 0] > 0  # (Nq,)
    assert np.isnan(o[plus]).all() and np.isnan(lse[plus]).all()
    o_ref, lse_ref = tf.reference_attention(q[~plus], np.delete(k, j, axis=0), np.delete(v, j, axis=0))
    o_naive, _ = tf.naive_attention(q[~plus], np.delete(k, j, axis=0), np.delete(v, j, axis=0))
    assert_fa_rule(o[~plus], o_naive, o_ref, np.float16, what="o of the rows whose score on key j is -inf")
    assert_close(lse[~plus], lse_ref, F32_TOL, "lse of those rows", is_lse=True)

    q, k, v = inputs()  # row 3 scores -inf against every key: o = 0, lse = -inf
    k[:, 0] = np.abs(k[:, 0]) + np.float16(0.5)
    q[3, 0] = -np.inf
    o, lse = attention(q, k, v, False)
    assert (o[3] == 0).all() and lse[3] == -np.inf
    assert np.isfinite(np.delete(o, 3, axis=0)).all()

    q, k, v = inputs()  # a NaN in v_j: column c of the rows that attend key j, nothing else
    j, c = N_K - 2, 3
    v[j, c] = np.nan
    o, lse = attention(q, k, v, True)
    hit = np.array([attends(i, j, True) for i in range(N_Q)])  # (Nq,)
    assert np.isnan(o[hit, c]).all()
    assert np.isfinite(np.delete(o[hit], c, axis=1)).all() and np.isfinite(lse).all()
