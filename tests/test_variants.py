"""The ready-made masks and score modifications, each against a dense float64 formula written here."""

import math

import numpy as np
import pytest
from conftest import make_qkv
from test_backward import finite_difference, make_do
from test_mods import dense_attention

import tinyflash as tf
from tinyflash.core.tolerance import assert_close
from tinyflash.core.variants import alibi_slopes

F64_TOL = 1e-12
N_Q, N_K, H = 29, 41, 3
I, J = np.arange(N_Q)[:, None], np.arange(N_K)[None, :]  # (Nq, 1), (1, Nk) positions
HEADS = np.arange(H).reshape(-1, 1, 1)  # (H, 1, 1)
IDS = np.repeat(np.arange(5), [7, 1, 12, 9, 12])  # five documents packed into 41 tokens


def stages(q, k, v, **mods):
    yield "naive", tf.naive_attention(q, k, v, **mods)
    yield "blocked", tf.blocked_attention(q, k, v, block_q=8, block_k=16, **mods)


# (name, the call's mods, the dense formula's score and keep)
CASES = [
    ("sliding_window", dict(mask_mod=tf.sliding_window(5, offset=N_K - N_Q)),
     dict(keep=(J <= I + N_K - N_Q) & (I + N_K - N_Q - J < 5))),
    ("sliding_window of 1, causal", dict(mask_mod=tf.sliding_window(1), causal=True), dict(keep=J == I)),
    ("prefix_lm", dict(mask_mod=tf.prefix_lm(6)), dict(keep=(J < 6) | (J <= I))),
    ("document_mask, causal", dict(mask_mod=tf.document_mask(IDS[:N_Q], IDS), causal=True),
     dict(keep=IDS[:N_Q, None] == IDS[None, :])),
    ("softcap", dict(score_mod=tf.softcap(0.5)), dict(score=lambda s, *_: 0.5 * np.tanh(s / 0.5))),
    ("alibi", dict(score_mod=tf.alibi(H, offset=N_K - N_Q), causal=True),
     dict(score=lambda s, *_: s - alibi_slopes(H).reshape(-1, 1, 1) * (I + N_K - N_Q - J))),
    ("relative_bias", dict(score_mod=tf.relative_bias(np.arange(H * 7.0).reshape(H, 7) / 10)),
     dict(score=lambda s, *_: s + (np.clip(J - I, -3, 3) + 3 + 7 * HEADS) / 10)),
]


@pytest.mark.parametrize("name, mods, formula", CASES, ids=[c[0] for c in CASES])
def test_variant_against_the_dense_formula(rng, name, mods, formula):
    q, k, v = make_qkv(rng, (H,), N_Q, N_K, d=4)
    ref = dense_attention(q, k, v, causal=mods.get("causal", False), **formula)
    for stage, (o, lse) in stages(q, k, v, **mods):
        assert_close(o, ref[0], F64_TOL, f"{stage} o")
        assert_close(lse, ref[1], F64_TOL, f"{stage} lse", is_lse=True)


def test_alibi_slopes():
    """Powers of two: 2^(-8(h+1)/H); otherwise the power below, then every other slope of twice it."""
    assert np.array_equal(alibi_slopes(8), 2.0 ** -np.arange(1, 9))
    assert np.allclose(alibi_slopes(4), 2.0 ** (-2.0 * np.arange(1, 5)))
    six = np.concatenate([2.0 ** (-2.0 * np.arange(1, 5)), 2.0 ** -np.array([1.0, 3.0])])
    assert np.allclose(alibi_slopes(6), six, rtol=1e-15)
    assert alibi_slopes(1).tolist() == [2.0 ** -8]


def test_alibi_bias_is_float32():
    """ALiBi's bias is a float32 (float32 slopes times the distance as a float32): a float32 score stays float32, as
    numba types it in a kernel, and the float64 reference adds the same bias to its float64 score."""
    score_mod, slopes = tf.alibi(6, offset=2), alibi_slopes(6).astype(np.float32)
    found = score_mod(np.float32(1.5), 0, 4, np.int64(3), np.int64(40))
    assert found.dtype == np.float32 and found == np.float32(1.5) + slopes[4] * np.float32(35)
    reference = score_mod(np.float64(1.5), 0, 4, np.int64(3), np.int64(40))
    assert reference.dtype == np.float64 and reference == 1.5 + float(slopes[4] * np.float32(35))


def test_softcap_gradient_against_finite_differences(rng):
    q, k, v = make_qkv(rng, (2,), 5, 6, d=3)
    q *= 3  # large scores, where the cap bends them
    W = make_do(rng, q, v)
    mods = dict(score_mod=tf.softcap(1.5), mask_mod=tf.sliding_window(3, offset=1))

    def loss():
        return float((tf.naive_attention(q, k, v, **mods)[0] * W).sum())

    for name, x, g in zip(("dq", "dk", "dv"), (q, k, v), tf.naive_attention_backward(q, k, v, W, **mods)):
        assert_close(g, finite_difference(loss, x), 1e-6, f"{name} vs finite differences")


def test_closures_capture_only_numbers_and_arrays():
    """What a kernel can compile: every cell of every variant's closure is a number (Python's or NumPy's) or a NumPy
    array."""
    made = [tf.sliding_window(4), tf.prefix_lm(3), tf.document_mask(IDS), tf.softcap(30.0), tf.alibi(6),
            tf.relative_bias(np.zeros((2, 5)))]
    for fn in made:
        for cell in fn.__closure__ or ():
            assert isinstance(cell.cell_contents, (int, float, np.number, np.ndarray)), (fn.__qualname__,
                                                                                          cell.cell_contents)


@pytest.mark.parametrize("make, args, error, message", [
    (tf.sliding_window, (0,), ValueError, "window must be >= 1"),
    (tf.sliding_window, (2.5,), TypeError, "window must be an integer"),
    (tf.prefix_lm, (-1,), ValueError, "prefix_length must be >= 0"),
    (tf.document_mask, (np.zeros((2, 2), int),), ValueError, "document_ids must be a 1-D integer array"),
    (tf.softcap, (0.0,), ValueError, "cap must be finite and > 0"),
    (tf.softcap, ("30",), TypeError, "cap must be a real number"),
    (tf.softcap, (1e39,), ValueError, "cap must be finite and > 0"),  # beyond float32, which the kernels take it in
    (tf.alibi, (0,), ValueError, "n_heads must be >= 1"),
    (tf.relative_bias, (np.zeros((2, 4)),), ValueError, "table must be a float array"),
])
def test_bad_arguments(make, args, error, message):
    with pytest.raises(error, match=message):
        make(*args)


def test_math_is_not_needed_inside_the_masks():
    """The masks take scalars as well as arrays: a plain Python call answers like the stages' grids."""
    mask = tf.sliding_window(3)
    assert mask(0, 0, 5, 3) and not mask(0, 0, 5, 2) and not mask(0, 0, 5, 6)
    assert tf.softcap(2.0)(1.0, 0, 0, 0, 0) == 2.0 * math.tanh(0.5)


def test_document_ids_are_kept_small_and_once():
    """document_mask keeps its ids in the smallest integer type (a kernel holds them in constant memory) and, for
    one array of ids, captures it once; the caller's array is left as it was."""
    from tinyflash.gpu.user_code import UserFunction

    ids = np.repeat(np.arange(8), 512)  # int64, 4,096 tokens
    mask = tf.document_mask(ids)
    assert ids.dtype == np.int64 and UserFunction.of(mask, "mask_mod").constant_bytes == 4096
    wide = tf.document_mask(np.arange(300), np.arange(300))  # int16 ids, two arrays
    assert UserFunction.of(wide, "mask_mod").constant_bytes == 2 * 2 * 300
    assert not mask(0, 0, 511, 512) and mask(0, 0, 512, 1023)
