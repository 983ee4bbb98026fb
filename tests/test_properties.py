"""Property-based tests: random shapes, tile sizes and masks, stage 1 against stage 0."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import tinyflash as tf
from tinyflash.core.tolerance import assert_close

dims = st.integers(min_value=1, max_value=70)


@settings(max_examples=150, deadline=None)
@given(n_q=dims, n_k=dims, d=st.integers(1, 40), d_v=st.integers(1, 20), block_q=st.integers(1, 80),
       block_k=st.integers(1, 80), causal=st.booleans(), lead=st.sampled_from([(), (1,), (3,), (2, 2)]),
       seed=st.integers(0, 2**32 - 1), log_scale=st.floats(-3.0, 1.0))
def test_blocked_equals_naive_float64(n_q, n_k, d, d_v, block_q, block_k, causal, lead, seed, log_scale):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((*lead, n_q, d))
    k = rng.standard_normal((*lead, n_k, d))
    v = rng.standard_normal((*lead, n_k, d_v))
    scale = 10.0**log_scale
    o0, lse0 = tf.naive_attention(q, k, v, causal=causal, scale=scale)
    o1, lse1 = tf.blocked_attention(q, k, v, causal=causal, scale=scale, block_q=block_q, block_k=block_k)
    assert_close(o1, o0, 1e-12, "o")
    assert_close(lse1, lse0, 1e-12, "lse", is_lse=True)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), chunk=st.integers(1, 64), seed=st.integers(0, 2**32 - 1),
       spread=st.floats(0.1, 1e3))
def test_online_softmax_equals_softmax(n, chunk, seed, spread):
    x = np.random.default_rng(seed).standard_normal(n) * spread
    p, state = tf.online_softmax(x, chunk)
    e = np.exp(x - x.max())
    assert_close(p, e / e.sum(), 1e-12, "softmax")
    assert state.m == x.max()
    assert len(state.history) == -(-n // chunk)
