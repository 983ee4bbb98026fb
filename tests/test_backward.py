"""The backward's CPU stages: naive against finite differences, blocked against naive, bad inputs.

Stage 0 (``naive_attention_backward``) is checked against central finite differences of a
scalar loss in float64; stage 1 (``blocked_attention_backward``, recomputation from the saved
lse) against stage 0: float64 within 1e-10, float32 within 1e-4, float16 storage by
FlashAttention's rule for gradients (3× the error of naive in float16, both against float64).
"""

import numpy as np
import pytest
from conftest import make_qkv

import tinyflash as tf
from tinyflash.core.tolerance import assert_close, assert_fa_rule

F64_TOL = 1e-10  # blocked against naive, float64
F32_GRAD_TOL = 1e-4  # blocked against naive, float32
FD_TOL = 1e-6  # naive against central finite differences, float64
GRAD_FACTOR = 3.0  # FlashAttention's rule for gradients: 3× naive's error in the same precision
SHAPES = [(1, 2), (7, 7), (17, 9), (9, 17), (33, 40), (64, 64), (65, 63)]


def forward_then_backward(q, k, v, do, causal, **blocks):
    o, lse = tf.naive_attention(q, k, v, causal=causal)
    return tf.blocked_attention_backward(q, k, v, o, lse, do, causal=causal, **blocks)


def make_do(rng, q, v):
    return rng.standard_normal((*q.shape[:-1], v.shape[-1])).astype(q.dtype)  # (..., Nq, dv)


def finite_difference(loss, x, eps=1e-5):
    """Central differences of the scalar ``loss()`` with respect to every entry of ``x`` (changed in place)."""
    grad = np.empty_like(x)
    for idx in np.ndindex(x.shape):
        saved = x[idx]
        x[idx] = saved + eps
        up = loss()
        x[idx] = saved - eps
        down = loss()
        x[idx] = saved
        grad[idx] = (up - down) / (2 * eps)
    return grad


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k", [(5, 7), (7, 4)])
def test_naive_backward_against_finite_differences(rng, n_q, n_k, causal):
    """L = Σ o ∘ W for a fixed random W, so ∂L/∂o = W: every gradient entry against central differences."""
    q, k, v = make_qkv(rng, (2,), n_q, n_k, d=3, d_v=4)
    W = make_do(rng, q, v)

    def loss():
        return float((tf.naive_attention(q, k, v, causal=causal)[0] * W).sum())

    dq, dk, dv = tf.naive_attention_backward(q, k, v, W, causal=causal)
    for name, x, g in (("dq", q, dq), ("dk", k, dk), ("dv", v, dv)):
        assert_close(g, finite_difference(loss, x), FD_TOL, f"{name} vs finite differences")


def test_naive_backward_explicit_scale_against_finite_differences(rng):
    q, k, v = make_qkv(rng, (), 4, 6, d=3, d_v=2)
    W = make_do(rng, q, v)

    def loss():
        return float((tf.naive_attention(q, k, v, causal=True, scale=0.7)[0] * W).sum())

    grads = tf.naive_attention_backward(q, k, v, W, causal=True, scale=0.7)
    for name, x, g in zip(("dq", "dk", "dv"), (q, k, v), grads):
        assert_close(g, finite_difference(loss, x), FD_TOL, f"{name} vs finite differences, scale 0.7")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k", SHAPES)
def test_blocked_matches_naive_float64(rng, n_q, n_k, causal):
    """Ragged tiles of 16 × 8, Nq != Nk, dv != d, leading dims."""
    q, k, v = make_qkv(rng, (2, 3), n_q, n_k, d=8, d_v=5)
    do = make_do(rng, q, v)
    naive = tf.naive_attention_backward(q, k, v, do, causal=causal)
    blocked = forward_then_backward(q, k, v, do, causal, block_q=16, block_k=8)
    for name, g, ref, like in zip(("dq", "dk", "dv"), blocked, naive, (q, k, v)):
        assert g.shape == like.shape and g.dtype == np.float64
        if n_k == 1 and name != "dv":  # softmax over one key is 1 whatever S is: dq = dk = 0 exactly
            assert np.abs(g).max() <= 1e-14 and not ref.any()
        else:
            assert_close(g, ref, F64_TOL, f"{name} blocked vs naive")


@pytest.mark.parametrize("block_q, block_k", [(1, 1), (64, 64), (16, 64), (64, 1), (256, 300)])
def test_blocked_block_sizes(rng, block_q, block_k):
    q, k, v = make_qkv(rng, (), 65, 100, d=8, d_v=3)
    do = make_do(rng, q, v)
    naive = tf.naive_attention_backward(q, k, v, do, causal=True)
    for name, g, ref in zip(("dq", "dk", "dv"), forward_then_backward(q, k, v, do, True, block_q=block_q,
                                                                      block_k=block_k), naive):
        assert_close(g, ref, F64_TOL, f"{name}, blocks {block_q} x {block_k}")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d, d_v", [(1, 1), (16, 16), (64, 32), (128, 128)])
def test_blocked_matches_naive_float32(rng, d, d_v, causal):
    q, k, v = make_qkv(rng, (2,), 70, 50, d=d, d_v=d_v, dtype=np.float32)
    do = make_do(rng, q, v)
    naive = tf.naive_attention_backward(q, k, v, do, causal=causal)
    for name, g, ref in zip(("dq", "dk", "dv"), forward_then_backward(q, k, v, do, causal), naive):
        assert g.dtype == np.float32
        assert_close(g, ref, F32_GRAD_TOL, f"{name} float32 blocked vs naive")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k, d", [(7, 200, 16), (200, 65, 64), (64, 64, 128)])
def test_blocked_float16_flash_attention_rule(rng, n_q, n_k, d, causal):
    """float16 storage (forward o and the gradients in float16, arithmetic in float32): 3× naive's error."""
    q, k, v = make_qkv(rng, (2,), n_q, n_k, d=d, dtype=np.float16)
    do = make_do(rng, q, v)
    ref = tf.reference_attention_backward(q, k, v, do, causal=causal)
    naive = tf.naive_attention_backward(q, k, v, do, causal=causal)
    blocked = forward_then_backward(q, k, v, do, causal)
    for name, g, n, r in zip(("dq", "dk", "dv"), blocked, naive, ref):
        assert g.dtype == np.float16
        assert_fa_rule(g, n, r, np.float16, factor=GRAD_FACTOR, what=f"{name} float16")


def test_rows_that_see_no_key_have_zero_gradients(rng):
    """Causal with Nq > Nk: the first Nq - Nk rows attend nothing (o = 0, lse = -inf): zero dq there,
    and nothing from them in dk, dv (the same gradients as without those rows)."""
    q, k, v = make_qkv(rng, (2,), 12, 5, d=4, d_v=3)
    do = make_do(rng, q, v)
    o, lse = tf.naive_attention(q, k, v, causal=True)
    assert np.isneginf(lse[:, :7]).all()
    for dq, dk, dv in (tf.naive_attention_backward(q, k, v, do, causal=True),
                       tf.blocked_attention_backward(q, k, v, o, lse, do, causal=True, block_q=4, block_k=4)):
        assert np.isfinite(dq).all() and not dq[:, :7].any()
        dq_rest, dk_rest, dv_rest = tf.naive_attention_backward(q[:, 7:], k, v, do[:, 7:], causal=True)
        assert_close(dq[:, 7:], dq_rest, F64_TOL, "dq of the rows that see keys")
        assert_close(dk, dk_rest, F64_TOL, "dk")
        assert_close(dv, dv_rest, F64_TOL, "dv")


def test_inputs_are_not_modified(rng):
    q, k, v = make_qkv(rng, (2,), 9, 11, d=4)
    do = make_do(rng, q, v)
    o, lse = tf.naive_attention(q, k, v)
    copies = [x.copy() for x in (q, k, v, o, lse, do)]
    tf.naive_attention_backward(q, k, v, do)
    tf.blocked_attention_backward(q, k, v, o, lse, do, block_q=4, block_k=4)
    assert all(np.array_equal(a, b) for a, b in zip((q, k, v, o, lse, do), copies))


# ---- bad inputs: the forward's errors, plus do, o and lse -------------------------------------------------


def bad_input_cases(q, k, v, o, lse, do):
    """(description, kwargs to replace, expected error, message pattern)."""
    return [
        ("do of the wrong shape", {"do": do[:, :-1]}, ValueError, r"do must have shape \(2, 5, 3\) .*got \(2, 4, 3\)"),
        ("do of the wrong dtype", {"do": do.astype(np.float64)}, TypeError, r"do must have dtype float32 .*float64"),
        ("do not an array", {"do": None}, TypeError, r"do must be an array"),
        ("o of the wrong shape", {"o": o[..., :2]}, ValueError, r"o must have shape \(2, 5, 3\) .*got \(2, 5, 2\)"),
        ("o of the wrong dtype", {"o": o.astype(np.float16)}, TypeError, r"o must have dtype float32 .*float16"),
        ("lse of the wrong shape", {"lse": lse[:, :, None]}, ValueError, r"lse must have shape \(2, 5\) .*\(2, 5, 1\)"),
        ("lse of the wrong dtype", {"lse": lse.astype(np.float64)}, TypeError, r"lse must have dtype float32"),
        ("q of another number of heads (grouped-query attention)", {"q": np.concatenate([q, q])}, ValueError,
         r"does not support grouped-query attention"),
        ("k with another head dim", {"k": k[..., :2]}, ValueError, r"same head dimension d"),
        ("bad causal", {"causal": 1}, TypeError, r"causal must be True or False"),
        ("bad scale", {"scale": -1.0}, ValueError, r"scale must be finite and > 0"),
    ]


def call_stage(stage, args, changes):
    args = {**args, **changes}
    if stage == "naive":
        return tf.naive_attention_backward(args["q"], args["k"], args["v"], args["do"], causal=args["causal"],
                                           scale=args["scale"])
    fn = tf.blocked_attention_backward if stage == "blocked" else tf.cuda_attention_backward
    return fn(args["q"], args["k"], args["v"], args["o"], args["lse"], args["do"], causal=args["causal"],
              scale=args["scale"])


@pytest.mark.parametrize("stage", ["naive", "blocked", "cuda"])
def test_bad_inputs(rng, stage):
    q, k, v = make_qkv(rng, (2,), 5, 6, d=4, d_v=3, dtype=np.float32)
    o, lse = tf.naive_attention(q, k, v)
    do = make_do(rng, q, v)
    args = {"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do, "causal": False, "scale": None}
    for what, changes, error, pattern in bad_input_cases(q, k, v, o, lse, do):
        if stage == "naive" and set(changes) & {"o", "lse"}:
            continue  # the naive stage takes no o or lse
        with pytest.raises(error, match=pattern):
            call_stage(stage, args, changes)
            pytest.fail(f"{stage}: {what} was accepted")


def test_cuda_backward_rejects_float64_and_mixed_arrays(rng):
    q, k, v = make_qkv(rng, (), 5, 6, d=4)
    o, lse = tf.naive_attention(q, k, v)
    with pytest.raises(TypeError, match=r"q has dtype float64; expected one of float16, bfloat16, float32"):
        tf.cuda_attention_backward(q, k, v, o, lse, make_do(rng, q, v))
