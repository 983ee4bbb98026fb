"""The backward pass on Hopper's warpgroup multiplies (backward kernel v3) at tiny sizes on numba's CUDA
simulator, where wgmma runs through its emulation (``gpu/wgmma_emulation.py``).

The simulator runs one Python thread per CUDA thread: one warpgroup (128 threads), 64 keys and 64 query rows
per tile, N <= 130; one test with the GPU's two warpgroups. Gradients are checked against the float64
reference by FlashAttention's rule for gradients, with the helpers of ``test_backward_tensor_cores.py``
(v2's tests); the GPU tests (``test_backward_wgmma_gpu.py``) take realistic sizes.
"""

import numpy as np
import pytest
from conftest import make_qkv
from test_backward_tensor_cores import check, check_bfloat16

import tinyflash as tf
from tinyflash.backward.kernels import VERSIONS
from tinyflash.backward.kernels.hopper_tiling import BackwardHopperTiling, default_tiling

pytestmark = [pytest.mark.simulator, pytest.mark.grid]


def gradients(rng, lead_q, lead_kv, n_q, n_k, d, causal, **options):
    """float16 q, k, v, do; the forward's o and lse; v3's (dq, dk, dv) through tensor_core_attention_backward, or
    through cuda_attention_backward with ``options`` (a tiling)."""
    q = make_qkv(rng, lead_q, n_q, n_q, d, dtype=np.float16)[0]
    _, k, v = make_qkv(rng, lead_kv, n_k, n_k, d, dtype=np.float16)
    do = rng.standard_normal(q.shape).astype(np.float16)
    o, lse = tf.naive_attention(q, k, v, causal=causal)
    if options:
        return (q, k, v, do), tf.cuda_attention_backward(q, k, v, o, lse, do, causal=causal, kernel="v3", **options)
    return (q, k, v, do), tf.tensor_core_attention_backward(q, k, v, o, lse, do, causal=causal, kernel="v3")


@pytest.mark.parametrize("n_q, n_k, causal", [(17, 20, False), (70, 20, True), (20, 70, True), (1, 1, True)])
def test_lengths(rng, n_q, n_k, causal):
    """Ragged tiles, Nq != Nk both ways (two query tiles, two key tiles), the causal diagonal and the query tiles
    it skips, one row and one key."""
    inputs, grads = gradients(rng, (1,), (1,), n_q, n_k, 64, causal)
    check(inputs, grads, causal, f"v3 {n_q}x{n_k} causal={causal}")


def test_grouped_heads_are_summed_without_repeating_k_and_v(rng):
    """Two query heads on one K/V head, walked by one block: dk and dv are the sums over the group."""
    inputs, grads = gradients(rng, (2,), (1,), 40, 30, 64, True)
    check(inputs, grads, True, "v3 GQA 2/1")


def test_head_dim_128(rng):
    """d = 128: two 64-column halves in every swizzled tile, dQ_i 128 columns wide."""
    inputs, grads = gradients(rng, (), (), 9, 70, 128, True)
    check(inputs, grads, True, "v3 d=128")


def test_two_warpgroups_split_dq_by_columns(rng):
    """The GPU's tiling (2 warpgroups, Bc = 128) at d = 64: each warpgroup takes 32 of dQ_i's columns, read from
    K_j at 64 bytes into its swizzled rows; the second warpgroup's keys are ragged."""
    cfg = BackwardHopperTiling(D=64, WARPGROUPS=2).validate()
    assert (cfg.BC, cfg.DQ_N) == (128, 32)
    inputs, grads = gradients(rng, (), (), 30, 90, 64, False, config=cfg)
    check(inputs, grads, False, "v3 2 warpgroups")


def test_bfloat16(rng):
    check_bfloat16(rng, "v3", 19, 70, True)


def test_deterministic_mode_is_refused(rng):
    q, k, v = make_qkv(rng, (), 5, 5, 64, dtype=np.float16)
    o, lse = tf.naive_attention(q, k, v)
    with pytest.raises(ValueError, match="deterministic=True needs kernel v2"):
        tf.tensor_core_attention_backward(q, k, v, o, lse, o, deterministic=True, kernel="v3")
    with pytest.raises(ValueError, match="backward kernel v3 .* has no deterministic mode"):
        tf.cuda_attention_backward(q, k, v, o, lse, o, kernel="v3", deterministic=True)
    with pytest.raises(ValueError, match=r"^kernel must be one of v2, v3, v4 \(None: v[24]\); got 'v5'$"):
        tf.tensor_core_attention_backward(q, k, v, o, lse, o, kernel="v5")


def test_registry_and_tilings():
    assert VERSIONS["v3"].signature is not None and VERSIONS["v3"].head_dims == (64, 128)
    assert VERSIONS["v3"].tilings[0](128) == default_tiling(128)
    assert default_tiling(128).smem_bytes <= 227 * 1024 and default_tiling(64).BC == 128
    with pytest.raises(ValueError, match="WARPGROUPS must be 1 or 2"):
        BackwardHopperTiling(D=64, WARPGROUPS=3).validate()
    with pytest.raises(ValueError, match="D must be one of"):
        BackwardHopperTiling(D=96, WARPGROUPS=1).validate()


def test_no_queries(rng):
    """Nq = 0: no gradient reaches k or v (dk = dv = 0, every key row written)."""
    q, k, v = make_qkv(rng, (), 0, 5, 64, dtype=np.float16)
    o, lse = tf.naive_attention(q, k, v)
    dq, dk, dv = tf.tensor_core_attention_backward(q, k, v, o, lse, o, kernel="v3")
    assert dq.shape == (0, 64) and dk.shape == (5, 64) and not dk.any() and not dv.any()
