"""Backward kernel v3 (Hopper's wgmma) on a real GPU at realistic sizes (``pytest -m gpu``), with the helpers
of v2's GPU tests (``test_backward_tensor_cores_gpu.py``).

N in {1, 17, 128, 1000, 4096} (ragged tiles everywhere but 128 and 4096), d = 64 and 128, causal and not,
float16 and bfloat16 as PyTorch tensors, Nq != Nk, grouped-query heads; every gradient against the float64
reference by FlashAttention's rule for gradients; dk and dv bitwise reproducible, dq within rounding; NumPy
in and out; PyTorch autograd with v3 as the backward. Needs compute capability 9.0 (wgmma): skipped elsewhere.
"""

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
        pytest.skip("backward kernel v3 uses wgmma: compute capability 9.0 (Hopper) only")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("n", [1, 17, 128, 1000, 4096])
def test_against_the_float64_reference(rng, n, d, causal, dtype):
    check_against_the_float64_reference(rng, n, d, causal, dtype, "v3")


@pytest.mark.parametrize("n_q, n_k", [(1000, 3001), (3001, 1000)])
@pytest.mark.parametrize("d", [64, 128])
def test_queries_and_keys_of_different_lengths(rng, n_q, n_k, d):
    """Causal with Nq < Nk (the last key tiles see only the last queries) and Nq > Nk (the first queries see no
    key): bottom-right masking, ragged tiles on both sides."""
    q, do = inputs(int(rng.integers(2**31)), 2, 2, n_q, d, "bfloat16")[::3]
    k, v = inputs(int(rng.integers(2**31)), 2, 2, n_k, d, "bfloat16")[1:3]
    o, lse = tf.tensor_core_attention(q, k, v, causal=True)
    dq, dk, dv = tf.tensor_core_attention_backward(q, k, v, o, lse, do, causal=True, kernel="v3")
    # the first Nq - Nk queries see no key: their dq is 0, and they add nothing to dk, dv. The others are the
    # problem of the last Nk queries alone (the same bottom-right mask), which the rule checks (a naive
    # backward has no finite baseline on a row without keys)
    skip = max(n_q - n_k, 0)
    assert not dq[..., :skip, :].any()
    verdict = check_gradients((dq[..., skip:, :], dk, dv), q[..., skip:, :], k, v, do[..., skip:, :], causal=True)
    assert verdict.ok, verdict


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_grouped_query_heads(rng, dtype):
    check_grouped_query_heads(rng, dtype, "v3")


def test_dk_dv_bitwise_reproducible_dq_within_rounding(rng):
    check_reproducible(rng, "v3")


def test_numpy_float16_in_numpy_out(rng):
    """NumPy arrays take numba's launches (the general path), not the driver's: the same kernel, sized there."""
    q, k, v = (rng.standard_normal((2, 300, 128)).astype(np.float16) for _ in range(3))
    do = rng.standard_normal(q.shape).astype(np.float16)
    o, lse = tf.naive_attention(q, k, v, causal=True)
    grads = tf.tensor_core_attention_backward(q, k, v, o, lse, do, causal=True, kernel="v3")
    assert all(isinstance(g, np.ndarray) and g.dtype == np.float16 for g in grads)
    assert check_gradients(grads, q, k, v, do, causal=True).ok


def test_torch_autograd_runs_v3_where_it_is_the_version(rng, monkeypatch):
    """tinyflash.torch.attention with the registry's rule set to v3: the same dk and dv, bit for bit, as v3 called
    directly (bfloat16, 4 query heads per K/V head)."""
    import tinyflash.torch as tft
    from tinyflash.backward.kernels import VERSIONS
    from tinyflash.host.plans import PLANS
    from tinyflash.host.registry import Default

    monkeypatch.setattr(VERSIONS, "defaults", (Default("tensor_core_attention_backward", "v3"), *VERSIONS.defaults))
    monkeypatch.setattr(PLANS, "plans", {})
    q, k, v, do = inputs(int(rng.integers(2**31)), 8, 2, 700, 64, "bfloat16")
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    tft.attention(*leaves, causal=True).backward(do)
    o, lse = tft.attention_forward(q, k, v, True, None, False)  # the forward autograd ran (stage 4 on Hopper)
    dq, dk, dv = tf.tensor_core_attention_backward(q, k, v, o, lse, do, causal=True, kernel="v3")
    assert torch.equal(leaves[1].grad, dk) and torch.equal(leaves[2].grad, dv)
    assert float((leaves[0].grad.float() - dq.float()).abs().max()) <= float(dq.float().abs().max()) * 2.0**-7
