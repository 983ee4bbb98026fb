"""Backward stage 2, the numba.cuda kernels, at tiny sizes on numba's CUDA simulator (without a GPU).

The simulator runs one Python thread per CUDA thread, so these use the tiny simulator tiling
(8 × 8 tiles, 16 threads) and N <= 19, and one test the GPU's tiling at d = 64 on two tiles. The kernel is compared with stage 1
(``blocked_attention_backward``) and with the float64 reference.
"""

import numpy as np
import pytest
from conftest import make_qkv

import tinyflash as tf
from tinyflash.backward.kernels import VERSIONS, tiling
from tinyflash.core.tolerance import assert_close, assert_fa_rule

pytestmark = [pytest.mark.simulator, pytest.mark.grid]
F32_GRAD_TOL = 1e-4  # float32 gradients against the float64 reference and against stage 1
GRAD_FACTOR = 3.0  # FlashAttention's rule for float16 gradients


def run_kernel(q, k, v, causal, rng, **options):
    do = rng.standard_normal((*q.shape[:-1], v.shape[-1])).astype(q.dtype)  # (..., Nq, dv)
    o, lse = tf.naive_attention(q, k, v, causal=causal)  # lse float32 for float16/32 inputs
    grads = tf.cuda_attention_backward(q, k, v, o, lse, do, causal=causal, **options)
    return grads, (o, lse, do)


def check_against_stages(grads, q, k, v, o, lse, do, causal, what):
    ref = tf.reference_attention_backward(q, k, v, do, causal=causal)
    blocked = tf.blocked_attention_backward(q, k, v, o, lse, do, causal=causal, block_q=8, block_k=8)
    naive = tf.naive_attention_backward(q, k, v, do, causal=causal)
    for name, g, r, b, n, like in zip(("dq", "dk", "dv"), grads, ref, blocked, naive, (q, k, v)):
        assert g.shape == like.shape and g.dtype == like.dtype, (name, g.shape, g.dtype)
        if q.dtype == np.float16:
            assert_fa_rule(g, n, r, np.float16, factor=GRAD_FACTOR, what=f"{what} {name} vs reference")
        elif k.shape[-2] == 1 and name != "dv":  # softmax over one key: dq = dk = 0 up to rounding
            assert np.abs(g).max() <= 1e-6
        else:
            assert_close(g, r, F32_GRAD_TOL, f"{what} {name} vs reference")
            assert_close(g, b, F32_GRAD_TOL, f"{what} {name} vs stage 1")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k", [(1, 1), (8, 8), (9, 17), (17, 9)])
def test_kernel_lengths(rng, n_q, n_k, causal):
    """Ragged tiles, Nq != Nk (both ways), causal tile skipping, leading dims, dv != d."""
    q, k, v = make_qkv(rng, (2,), n_q, n_k, d=8, d_v=5, dtype=np.float32)
    grads, (o, lse, do) = run_kernel(q, k, v, causal, rng)
    check_against_stages(grads, q, k, v, o, lse, do, causal, f"{n_q}x{n_k}")


@pytest.mark.parametrize("d, d_v", [(1, 3), (13, 24), (20, 16)])
def test_kernel_head_dims(rng, d, d_v):
    """Head dims that need padding (to 16 on the simulator) and d > 16 (two column groups)."""
    q, k, v = make_qkv(rng, (), 11, 14, d=d, d_v=d_v, dtype=np.float32)
    grads, (o, lse, do) = run_kernel(q, k, v, True, rng)
    check_against_stages(grads, q, k, v, o, lse, do, True, f"d={d} dv={d_v}")


@pytest.mark.parametrize("lead", [(), (2, 2)])
def test_kernel_float16(rng, lead):
    """float16 storage, float32 arithmetic, float16 gradients; full tiles take the 4-wide vector loads."""
    q, k, v = make_qkv(rng, lead, 16, 19, d=16, dtype=np.float16)
    grads, (o, lse, do) = run_kernel(q, k, v, True, rng)
    check_against_stages(grads, q, k, v, o, lse, do, True, f"float16 lead={lead}")


def test_rows_that_see_no_key(rng):
    """Causal, Nq > Nk: rows with lse = -inf get dq = 0 and add nothing to dk, dv."""
    q, k, v = make_qkv(rng, (), 13, 4, d=8, dtype=np.float32)
    (dq, dk, dv), (o, lse, do) = run_kernel(q, k, v, True, rng)
    assert np.isneginf(lse[:9]).all() and not dq[:9].any()
    check_against_stages((dq, dk, dv), q, k, v, o, lse, do, True, "rows that see no key")


def test_keys_no_query_sees_get_zero_gradients(rng):
    """Causal, Nq < Nk: every key is seen (bottom-right alignment), but with Nq = 0 no key is: dk = dv = 0."""
    q, k, v = make_qkv(rng, (2,), 0, 9, d=8, dtype=np.float32)
    o, lse = tf.naive_attention(q, k, v, causal=True)
    dq, dk, dv = tf.cuda_attention_backward(q, k, v, o, lse, np.zeros_like(o), causal=True)
    assert dq.shape == (2, 0, 8) and dk.shape == k.shape and not dk.any() and not dv.any()


def test_explicit_config_and_scale(rng):
    cfg = tiling.BackwardTileConfig(BR=4, BC=8, NT=8, TM=2, TK=4, D=0, DV=0).padded(8, 8)
    q, k, v = make_qkv(rng, (), 10, 12, d=8, dtype=np.float32)
    do = rng.standard_normal(q.shape).astype(np.float32)
    o, lse = tf.naive_attention(q, k, v, causal=True, scale=0.3)
    grads = tf.cuda_attention_backward(q, k, v, o, lse, do, causal=True, scale=0.3, config=cfg, vector=1)
    for name, g, r in zip(("dq", "dk", "dv"), grads, tf.reference_attention_backward(q, k, v, do, causal=True,
                                                                                       scale=0.3)):
        assert_close(g, r, F32_GRAD_TOL, f"{name}, config {cfg}")


def test_dk_dv_deterministic(rng):
    """dK_j and dV_j are each written by one block: bitwise identical from run to run. (dq's additions
    by atomics may land in another order on a GPU; the simulator runs blocks one by one, so the
    bound on dq's difference is checked by the GPU tests.)"""
    q, k, v = make_qkv(rng, (), 9, 12, d=8, dtype=np.float32)
    (g1, (o, lse, do)) = run_kernel(q, k, v, False, rng)
    g2 = tf.cuda_attention_backward(q, k, v, o, lse, do, causal=False)
    assert VERSIONS["v1"].deterministic == ("dk", "dv")
    assert np.array_equal(g1[1], g2[1]) and np.array_equal(g1[2], g2[2])


def test_configs_are_valid_for_every_head_dim():
    for d in (1, 8, 32, 64, 80, 128, 200, 256):
        for cfg in (tiling.default_config(d, d), tiling.simulator_config(d, d), tiling.default_config(d, 7)):
            assert not cfg.problems() and cfg.D >= d and cfg.smem_bytes <= 227 * 1024, cfg
    with pytest.raises(ValueError, match="invalid backward tile configuration"):
        tiling.BackwardTileConfig(BR=8, BC=8, NT=16, TM=3, TK=2, D=16, DV=16).validate()



# slow on the simulator (128 threads a block, 64 × 64 tiles, two of each): the only run of the GPU's tiling there
def test_the_gpu_tiling_on_the_simulator(rng):
    """The tiling a GPU runs at d = 64 (64 × 64 tiles, 128 threads, float16 read 4 elements per load),
    on two ragged query and key tiles, causal: the index arithmetic the CI would otherwise never run."""
    cfg = tiling.default_config(64, 64)
    assert (cfg.BR, cfg.BC, cfg.NT) == (64, 64, 128)
    q, k, v = make_qkv(rng, (), 70, 65, d=64, dtype=np.float16)
    grads, (o, lse, do) = run_kernel(q, k, v, True, rng, config=cfg)
    check_against_stages(grads, q, k, v, o, lse, do, True, "GPU tiling d=64")
