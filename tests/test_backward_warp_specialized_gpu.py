"""Backward kernel v4 (warp-specialised, TMA) on a real GPU at realistic sizes (``pytest -m gpu``), with the
helpers of v2's GPU tests (``test_backward_tensor_cores_gpu.py``), as v3's GPU tests.

N in {1, 17, 128, 1000, 4096} (ragged tiles everywhere but 128 and 4096), d = 64 and 128, causal and not,
float16 and bfloat16 as PyTorch tensors, Nq != Nk, grouped-query heads; every gradient against the float64
reference by FlashAttention's rule for gradients; dk and dv bitwise reproducible, and at d = 128 equal to v3's
(the same products in the same order), dq within rounding; NumPy in and out; the tiling's DQ_BY_TMA (dQ_i added
by TMA reduce-adds) against the reference too. Needs compute capability 9.0 (wgmma, TMA):
skipped elsewhere.
"""

from dataclasses import replace

import numpy as np
import pytest
from test_backward_tensor_cores_gpu import (check_against_the_float64_reference, check_grouped_query_heads,
                                            check_reproducible, inputs)

import tinyflash as tf
from tinyflash.bench.checking import check_gradients

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def hopper():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("backward kernel v4 uses wgmma and TMA: compute capability 9.0 (Hopper) only")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("n", [1, 17, 128, 1000, 4096])
def test_against_the_float64_reference(rng, n, d, causal, dtype):
    check_against_the_float64_reference(rng, n, d, causal, dtype, "v4")


@pytest.mark.parametrize("n_q, n_k", [(1000, 3001), (3001, 1000)])
@pytest.mark.parametrize("d", [64, 128])
def test_queries_and_keys_of_different_lengths(rng, n_q, n_k, d):
    """Causal with Nq < Nk (the last key tiles see only the last queries) and Nq > Nk (the first queries see no
    key): bottom-right masking, ragged tiles on both sides."""
    q, do = inputs(int(rng.integers(2**31)), 2, 2, n_q, d, "bfloat16")[::3]
    k, v = inputs(int(rng.integers(2**31)), 2, 2, n_k, d, "bfloat16")[1:3]
    o, lse = tf.tensor_core_attention(q, k, v, causal=True)
    dq, dk, dv = tf.tensor_core_attention_backward(q, k, v, o, lse, do, causal=True, kernel="v4")
    skip = max(n_q - n_k, 0)  # the first Nq - Nk queries see no key (v3's GPU test says why this is the check)
    assert not dq[..., :skip, :].any()
    verdict = check_gradients((dq[..., skip:, :], dk, dv), q[..., skip:, :], k, v, do[..., skip:, :], causal=True)
    assert verdict.ok, verdict


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_grouped_query_heads(rng, dtype):
    check_grouped_query_heads(rng, dtype, "v4")


def test_dk_dv_bitwise_reproducible_dq_within_rounding(rng):
    check_reproducible(rng, "v4")


@pytest.mark.parametrize("causal", [False, True])
def test_dk_dv_are_v3s_at_d_128(rng, causal):
    """At d = 128 v4 has v3's tiling and issues v3's multiplies in v3's order: dk and dv are v3's, bit for bit
    (4 query heads per K/V head, so that each block walks many query tiles through the ring of stages); dq
    within rounding. (At d = 64 v4's query tiles have 128 rows: the float64 reference tests check it.)"""
    q, k, v, do = inputs(int(rng.integers(2**31)), 8, 2, 1500, 128, "bfloat16")
    o, lse = tf.tensor_core_attention(q, k, v, causal=causal)
    dq3, dk3, dv3 = tf.tensor_core_attention_backward(q, k, v, o, lse, do, causal=causal, kernel="v3")
    dq4, dk4, dv4 = tf.tensor_core_attention_backward(q, k, v, o, lse, do, causal=causal, kernel="v4")
    assert torch.equal(dk3, dk4) and torch.equal(dv3, dv4)
    assert float((dq4.float() - dq3.float()).abs().max()) <= float(dq3.float().abs().max()) * 2.0**-7


@pytest.fixture
def dq_by_tma(monkeypatch):
    """tensor_core_attention_backward(kernel='v4') at v4's tiling with DQ_BY_TMA: dQ_i through shared memory and
    TMA reduce-adds by the producer's second warp (plans made afresh)."""
    from tinyflash.backward.kernels import VERSIONS, tma_tiling
    from tinyflash.host.plans import PLANS

    v4 = VERSIONS["v4"]
    tilings = (lambda d: replace(tma_tiling.default_tiling(d), DQ_BY_TMA=True), *v4.tilings[1:])
    monkeypatch.setitem(VERSIONS.versions, "v4", replace(v4, tilings=tilings))
    monkeypatch.setattr(PLANS, "plans", {})


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("n", [17, 1000, 4096])
def test_dq_by_tma_against_the_float64_reference(rng, dq_by_tma, n, d, causal):
    check_against_the_float64_reference(rng, n, d, causal, "bfloat16", "v4")


def test_dq_by_tma_grouped_query_heads(rng, dq_by_tma):
    check_grouped_query_heads(rng, "float16", "v4")


def test_numpy_float16_in_numpy_out(rng):
    """NumPy arrays take numba's launches (the general path: copied to the GPU for the tensor maps), not the
    driver's: the same kernel, sized there."""
    q, k, v = (rng.standard_normal((2, 300, 128)).astype(np.float16) for _ in range(3))
    do = rng.standard_normal(q.shape).astype(np.float16)
    o, lse = tf.naive_attention(q, k, v, causal=True)
    grads = tf.tensor_core_attention_backward(q, k, v, o, lse, do, causal=True, kernel="v4")
    assert all(isinstance(g, np.ndarray) and g.dtype == np.float16 for g in grads)
    assert check_gradients(grads, q, k, v, do, causal=True).ok
