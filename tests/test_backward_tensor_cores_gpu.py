"""The tensor-core backward (backward kernel v2) on a real GPU at realistic sizes (``pytest -m gpu``).

N in {1, 17, 128, 1000, 4096} (ragged tiles everywhere but 128 and 4096), d = 64, 96, 128, 192 and 256 (and
40 and 200, padded with zero columns to 64 and 224), causal and not, float16 and bfloat16 as PyTorch tensors,
grouped-query heads at each of those head dims; every gradient against the float64
reference by FlashAttention's rule for gradients (3 × the error of the naive backward in the same type,
S and P stored in it: ``tinyflash.bench.checking``); dk and dv bitwise reproducible, dq within rounding.
"""

import numpy as np
import pytest

import tinyflash as tf
from tinyflash.bench.checking import GRAD_FACTOR, check_gradients, naive_attention_backward, reference_backward
from tinyflash.core.tolerance import fa_rule

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def inputs(seed, heads, kv_heads, n, d, dtype):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    q, do = (torch.randn(1, heads, n, d, device="cuda", generator=gen).to(dt) for _ in range(2))
    k, v = (torch.randn(1, kv_heads, n, d, device="cuda", generator=gen).to(dt) for _ in range(2))
    return q, k, v, do


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("n", [1, 17, 128, 1000, 4096])
def test_against_the_float64_reference(rng, n, d, causal, dtype):
    check_against_the_float64_reference(rng, n, d, causal, dtype, "v2")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [40, 200])
@pytest.mark.parametrize("n", [17, 1000])
def test_padded_head_dims(rng, n, d, causal, dtype):
    """Head dims that are not multiples of 32: zero columns up to 64 and 224 in shared memory, d written."""
    check_against_the_float64_reference(rng, n, d, causal, dtype, "v2")


def check_against_the_float64_reference(rng, n, d, causal, dtype, kernel):
    """Backward kernel ``kernel`` on 2 heads of n queries and keys: every gradient shaped and typed like its input
    and within the rule (n = 1: dq, dk within the rounding of dS = dP - D = 0)."""
    q, k, v, do = inputs(int(rng.integers(2**31)), 2, 2, n, d, dtype)
    o, lse = tf.tensor_core_attention(q, k, v, causal=causal)
    grads = tf.tensor_core_attention_backward(q, k, v, o, lse, do, causal=causal, kernel=kernel)
    assert all(g.shape == x.shape and g.dtype == x.dtype for g, x in zip(grads, (q, k, v)))
    if n == 1:  # softmax over one key: P = 1, dS = dP - D = 0 but for the float32 rounding of two sums of d terms
        ds = 2 * d * 2.0**-24 * float((do.float() * v.float()).abs().sum(-1).max())
        scale = d**-0.5
        assert float(grads[0].abs().max()) <= scale * ds * float(k.float().abs().max())
        assert float(grads[1].abs().max()) <= scale * ds * float(q.float().abs().max())
        return
    verdict = check_gradients(grads, q, k, v, do, causal=causal)
    assert verdict.ok, verdict


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
def test_grouped_query_heads(rng, d, dtype):
    check_grouped_query_heads(rng, dtype, "v2", d)


def check_grouped_query_heads(rng, dtype, kernel, d=128):
    """8 query heads on 2 K/V heads: dk and dv are the sums over each group, K and V never repeated."""
    q, k, v, do = inputs(int(rng.integers(2**31)), 8, 2, 1000, d, dtype)
    o, lse = tf.tensor_core_attention(q, k, v, causal=True)
    dq, dk, dv = tf.tensor_core_attention_backward(q, k, v, o, lse, do, causal=True, kernel=kernel)
    kr, vr = (x.repeat_interleave(4, dim=1) for x in (k, v))
    for h in (0, 1):  # the K/V head, and its 4 query heads
        heads = slice(4 * h, 4 * h + 4)
        refs = [reference_backward(q[0, j], kr[0, j], vr[0, j], do[0, j], causal=True) for j in range(4 * h, 4 * h + 4)]
        naive = [naive_attention_backward(q[0, j], kr[0, j], vr[0, j], do[0, j], causal=True)
                 for j in range(4 * h, 4 * h + 4)]
        ref_dk, ref_dv = sum(r[1] for r in refs), sum(r[2] for r in refs)
        naive_dk, naive_dv = (sum(x[i].double() for x in naive) for i in (1, 2))
        for name, g, r, nv in (("dk", dk[0, h], ref_dk, naive_dk), ("dv", dv[0, h], ref_dv, naive_dv)):
            check = fa_rule(g, nv, r, dtype, GRAD_FACTOR)
            assert check.ok, (name, h, str(check))
        for j, r, nv in zip(range(heads.start, heads.stop), refs, naive):
            check = fa_rule(dq[0, j], nv[0], r[0], dtype, GRAD_FACTOR)
            assert check.ok, ("dq", j, str(check))


def test_dk_dv_bitwise_reproducible_dq_within_rounding(rng):
    check_reproducible(rng, "v2")


def check_reproducible(rng, kernel):
    """Two runs of backward kernel ``kernel``: dk and dv the same bit for bit, dq within one rounding."""
    q, k, v, do = inputs(int(rng.integers(2**31)), 4, 4, 2000, 64, "float16")
    o, lse = tf.tensor_core_attention(q, k, v, causal=True)
    first = tf.tensor_core_attention_backward(q, k, v, o, lse, do, causal=True, kernel=kernel)
    second = tf.tensor_core_attention_backward(q, k, v, o, lse, do, causal=True, kernel=kernel)
    assert torch.equal(first[1], second[1]) and torch.equal(first[2], second[2])
    diff = (first[0].float() - second[0].float()).abs().max()
    assert float(diff) <= 2 * float(first[0].float().abs().max()) * 2.0**-10  # one float16 rounding either way


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [128, 192])
def test_deterministic_mode_reproduces_dq_bit_for_bit(rng, d, causal, dtype):
    """deterministic=True: the key tiles add to dQ in turn; three runs give the same dq, bit for bit, and it
    is within the rule. 16 query heads on 4 K/V heads, N = 4,097 (a ragged last tile), d = 128 and 192."""
    q, k, v, do = inputs(int(rng.integers(2**31)), 16, 4, 4097, d, dtype)
    o, lse = tf.tensor_core_attention(q, k, v, causal=causal)
    runs = [tf.tensor_core_attention_backward(q, k, v, o, lse, do, causal=causal, deterministic=True)
            for _ in range(3)]
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))
    h = 5  # one query head against the reference (K/V head 1)
    ref = reference_backward(q[0, h], k[0, h // 4], v[0, h // 4], do[0, h], causal=causal)
    naive = naive_attention_backward(q[0, h], k[0, h // 4], v[0, h // 4], do[0, h], causal=causal)
    check = fa_rule(runs[0][0][0, h], naive[0], ref[0], dtype, GRAD_FACTOR)
    assert check.ok, str(check)


def test_numpy_float16_in_numpy_out(rng):
    q, k, v = (rng.standard_normal((2, 300, 64)).astype(np.float16) for _ in range(3))
    do = rng.standard_normal(q.shape).astype(np.float16)
    o, lse = tf.naive_attention(q, k, v)
    grads = tf.tensor_core_attention_backward(q, k, v, o, lse, do)
    assert all(isinstance(g, np.ndarray) and g.dtype == np.float16 for g in grads)
    assert check_gradients(grads, q, k, v, do, causal=False).ok


def test_torch_autograd_runs_the_tensor_cores_with_grouped_heads(rng):
    """tinyflash.torch.attention on bfloat16 with 4 query heads per K/V head: the fastest forward and the tensor-core
    backward (the same dk and dv, bit for bit, as calling them directly), k.grad and v.grad of the K/V heads."""
    import tinyflash.torch as tft

    q, k, v, do = inputs(int(rng.integers(2**31)), 8, 2, 700, 64, "bfloat16")
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    tft.attention(*leaves, causal=True).backward(do)
    o, lse = tft.attention_forward(q, k, v, True, None, False)  # the forward autograd ran (stage 4 on Hopper)
    dq, dk, dv = tf.tensor_core_attention_backward(q, k, v, o, lse, do, causal=True)
    assert leaves[1].grad.shape == k.shape and torch.equal(leaves[1].grad, dk) and torch.equal(leaves[2].grad, dv)
    assert float((leaves[0].grad.float() - dq.float()).abs().max()) <= float(dq.float().abs().max()) * 2.0**-7
