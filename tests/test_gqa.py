"""Grouped-query (GQA) and multi-query (MQA) attention in every forward stage.

k and v may have fewer heads (axis -3) than q: query head h reads K/V head h // (H / H_kv). Each
stage must give what it gives on K and V repeated explicitly to H heads (np.repeat), which is
what a stage without GQA would need; and a head count that is not a multiple is rejected.
"""

import numpy as np
import pytest
from conftest import make_qkv

import tinyflash as tf
from tinyflash.core.checks import check_attention_inputs
from tinyflash.core.tolerance import F32_TOL, assert_close, assert_fa_rule

F64_TOL = 1e-12  # float64 against float64: only the order of the sums differs

CPU_STAGES = {"naive": tf.naive_attention, "blocked": lambda q, k, v, **kw: tf.blocked_attention(
    q, k, v, block_q=5, block_k=7, **kw), "reference": tf.reference_attention}


def gqa_inputs(rng, batch, h, h_kv, n_q, n_k, d, d_v, dtype):
    """q (batch, H, Nq, d); k, v (batch, H_kv, Nk, ·); and k, v repeated to H heads."""
    q = rng.standard_normal((batch, h, n_q, d)).astype(dtype)  # (B, H, Nq, d)
    _, k, v = make_qkv(rng, (batch, h_kv), 1, n_k, d, d_v, dtype)  # (B, H_kv, Nk, d), (B, H_kv, Nk, dv)
    group = h // h_kv
    return q, k, v, np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)  # (B, H, Nk, ·) each


@pytest.mark.parametrize("stage", CPU_STAGES)
@pytest.mark.parametrize("h, h_kv", [(4, 2), (6, 3), (4, 1), (3, 3)])
@pytest.mark.parametrize("causal", [False, True])
def test_cpu_stages_equal_repeated_kv(rng, stage, h, h_kv, causal):
    q, k, v, k_rep, v_rep = gqa_inputs(rng, 2, h, h_kv, 9, 13, 6, 5, np.float64)
    k0, v0 = k.copy(), v.copy()
    o, lse = CPU_STAGES[stage](q, k, v, causal=causal)
    o_rep, lse_rep = CPU_STAGES[stage](q, k_rep, v_rep, causal=causal)
    assert o.shape == (2, h, 9, 5) and lse.shape == (2, h, 9)
    assert_close(o, o_rep, F64_TOL, f"{stage} GQA o vs repeated K/V")
    assert_close(lse, lse_rep, F64_TOL, f"{stage} GQA lse vs repeated K/V", is_lse=True)
    assert np.array_equal(k, k0) and np.array_equal(v, v0)  # inputs never modified


def test_reference_rows_with_gqa(rng):
    """The reference's sampled rows (what the benchmarks check) work with GQA too."""
    q, k, v, k_rep, v_rep = gqa_inputs(rng, 1, 4, 2, 11, 11, 4, 4, np.float64)
    rows = np.array([0, 7, 10])
    o, lse = tf.reference_attention(q, k, v, causal=True, rows=rows)
    o_rep, lse_rep = tf.reference_attention(q, k_rep, v_rep, causal=True)
    assert_close(o, o_rep[..., rows, :], F64_TOL, "rows o")
    assert_close(lse, lse_rep[..., rows], F64_TOL, "rows lse", is_lse=True)


@pytest.mark.simulator
@pytest.mark.grid
@pytest.mark.parametrize("kernel, h, h_kv, causal", [("v1", 4, 2, True), ("v2", 4, 2, False), ("v3", 4, 2, True),
                                                     ("v4", 3, 1, True), ("v5", 4, 2, True), ("v5", 3, 1, False)])
def test_kernels_equal_repeated_kv(rng, kernel, h, h_kv, causal):
    """Every kernel version with GQA (and MQA: H_kv = 1), on the simulator at a tiny size."""
    q, k, v, k_rep, v_rep = gqa_inputs(rng, 1, h, h_kv, 9, 11, 8, 5, np.float32)
    o, lse = tf.cuda_attention(q, k, v, causal=causal, kernel=kernel)
    o_rep, lse_rep = tf.blocked_attention(q, k_rep, v_rep, causal=causal, block_q=8, block_k=8)
    assert_close(o, o_rep, F32_TOL, f"{kernel} GQA o vs repeated K/V")
    assert_close(lse, lse_rep, F32_TOL, f"{kernel} GQA lse vs repeated K/V", is_lse=True)


@pytest.mark.simulator
@pytest.mark.grid
@pytest.mark.parametrize("h, h_kv", [(4, 2)])  # one case: each costs about 7 s on the simulator
def test_tensor_core_kernel_equals_repeated_kv(rng, h, h_kv):
    """Stage 3 (kernel v6) with GQA and MQA: float16, d = 64, causal, Nq != Nk, on the simulator."""
    q, k, v, k_rep, v_rep = gqa_inputs(rng, 1, h, h_kv, 17, 20, 64, 64, np.float16)
    o, lse = tf.tensor_core_attention(q, k, v, causal=True)
    o_rep, lse_rep = tf.tensor_core_attention(q, k_rep, v_rep, causal=True)
    assert np.array_equal(o, o_rep) and np.array_equal(lse, lse_rep)  # the same kernel on the same numbers
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=True)
    naive_o, _ = tf.naive_attention(q, k, v, causal=True)  # float16 storage: FlashAttention's rule
    assert_fa_rule(o, naive_o, ref_o, np.float16, what="v6 GQA o")
    assert_close(lse, ref_lse, F32_TOL, "v6 GQA lse", is_lse=True)


@pytest.mark.simulator
@pytest.mark.grid
def test_kernel_gqa_heads_in_slices(rng, monkeypatch):
    """More heads than one grid column holds: slices of heads start at a multiple of kv_group,
    so each slice's K/V views start at the right K/V head (limit lowered to 5: slices of 4)."""
    from tinyflash.gpu import launch

    monkeypatch.setattr(launch, "MAX_GRID_Y", 5)
    q, k, v, k_rep, v_rep = gqa_inputs(rng, 1, 6, 3, 5, 7, 8, 8, np.float32)
    o, lse = tf.cuda_attention(q, k, v, causal=True)
    o_rep, lse_rep = tf.blocked_attention(q, k_rep, v_rep, causal=True)
    assert_close(o, o_rep, F32_TOL, "sliced GQA o")
    assert_close(lse, lse_rep, F32_TOL, "sliced GQA lse", is_lse=True)


def test_kv_group_found_by_the_checks(rng):
    q, k, v, _, _ = gqa_inputs(rng, 2, 8, 2, 3, 4, 4, 4, np.float32)
    prob = check_attention_inputs(q, k, v, causal=False, scale=None)
    assert (prob.kv_group, prob.lead, prob.kv_lead) == (4, (2, 8), (2, 2))


@pytest.mark.parametrize("q_shape, kv_shape, match", [
    ((2, 6, 3, 4), (2, 4, 5, 4), r"multiple of the number of K/V heads.*H=6.*H_kv=4"),
    ((2, 4, 3, 4), (3, 2, 5, 4), "may have fewer heads"),
    ((4, 3, 4), (2, 5, 4, 4), "may have fewer heads"),
    ((3, 4), (5, 4, 4), "may have fewer heads"),
])
def test_bad_head_ratios_rejected(q_shape, kv_shape, match):
    q, k = np.ones(q_shape, np.float32), np.ones(kv_shape, np.float32)
    for stage in (tf.naive_attention, tf.blocked_attention, tf.reference_attention):
        with pytest.raises(ValueError, match=match):
            stage(q, k, k)


def test_k_and_v_head_counts_must_match():
    q, k, v = np.ones((4, 3, 4)), np.ones((2, 5, 4)), np.ones((1, 5, 4))
    with pytest.raises(ValueError, match="k and v must have identical leading"):
        tf.naive_attention(q, k, v)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tensor_core_gqa_on_the_gpu(rng, dtype):
    """Stage 3 with 32 query heads on 8 K/V heads, d = 128, causal, Nq != Nk (PyTorch tensors)."""
    torch = pytest.importorskip("torch")
    q, k, v, k_rep, v_rep = (torch.tensor(x, device="cuda").to(getattr(torch, dtype))
                             for x in gqa_inputs(rng, 2, 32, 8, 777, 1_001, 128, 128, np.float32))
    o, lse = tf.tensor_core_attention(q, k, v, causal=True)
    o_rep, lse_rep = tf.tensor_core_attention(q, k_rep, v_rep, causal=True)
    assert torch.equal(o, o_rep) and torch.equal(lse, lse_rep)  # the same kernel on the same numbers


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["v1", "v2", "v3", "v4", "v5"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_kernels_gqa_on_the_gpu(rng, kernel, dtype):
    """32 query heads on 8 K/V heads, d = 128, causal, Nq != Nk, at a size the simulator cannot run."""
    q, k, v, k_rep, v_rep = gqa_inputs(rng, 2, 32, 8, 777, 1_001, 128, 128, dtype)
    o, lse = tf.cuda_attention(q, k, v, causal=True, kernel=kernel)
    o_rep, lse_rep = tf.cuda_attention(q, k_rep, v_rep, causal=True, kernel=kernel)
    assert np.array_equal(o, o_rep) and np.array_equal(lse, lse_rep)  # the same kernel on the same numbers
    assert_close(lse, tf.reference_attention(q, k, v, causal=True)[1], F32_TOL, f"{kernel} GQA lse", is_lse=True)
