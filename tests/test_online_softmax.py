"""The online softmax and the worked example: a first tile with max 4, a later tile with 9."""

import numpy as np
import pytest

import tinyflash as tf
from tinyflash.core.tolerance import assert_close


def test_worked_example_rescales_by_exp_4_minus_9(rng):
    s1 = np.array([1.0, 4.0, 2.5])  # first tile: max 4
    s2 = np.array([9.0, 0.5, 3.0])  # later tile: contains 9
    v1, v2 = rng.standard_normal((3, 5)), rng.standard_normal((3, 5))
    st = tf.OnlineSoftmax()
    assert st.update(s1, v1) == 0.0  # nothing to rescale at the first tile
    assert st.m == 4.0
    l_after_first = st.l
    o_after_first = st.o.copy()
    alpha = st.update(s2, v2)
    assert alpha == pytest.approx(np.exp(4.0 - 9.0), rel=1e-15)
    assert st.m == 9.0
    assert st.l == pytest.approx(np.exp(4 - 9) * l_after_first + np.exp(s2 - 9).sum(), rel=1e-15)
    np.testing.assert_allclose(st.o, np.exp(4 - 9) * o_after_first + np.exp(s2 - 9) @ v2, rtol=1e-14)
    s = np.concatenate([s1, s2])
    p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    assert_close(st.output(), p @ np.concatenate([v1, v2]), 1e-14)
    assert st.lse == pytest.approx(np.log(np.exp(s).sum()), rel=1e-15)


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 100])
def test_any_chunking_gives_the_full_softmax(rng, chunk):
    x = rng.standard_normal(50) * 5
    p, st = tf.online_softmax(x, chunk)
    e = np.exp(x - x.max())
    assert_close(p, e / e.sum(), 1e-14)
    assert st.l == pytest.approx(e.sum(), rel=1e-13)


def test_minus_inf_chunks_are_harmless():
    st = tf.OnlineSoftmax()
    assert st.update([-np.inf, -np.inf]) == 0.0  # a fully masked chunk
    assert st.m == -np.inf and st.l == 0.0 and st.lse == -np.inf
    st.update([2.0, -np.inf])
    assert st.m == 2.0 and st.l == 1.0


def test_bad_chunks():
    with pytest.raises(ValueError, match="non-empty 1-D chunk"):
        tf.OnlineSoftmax().update(np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"v_t must have shape \(2, dv\)"):
        tf.OnlineSoftmax().update([1.0, 2.0], np.ones((3, 2)))
    with pytest.raises(ValueError, match="chunk_size must be a positive integer; got 0"):
        tf.online_softmax([1.0], 0)
    with pytest.raises(ValueError, match="no values were given"):
        tf.OnlineSoftmax().output()
