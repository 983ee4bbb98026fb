"""tinyflash.flex_attention_backward on the tensor cores (backward v2's flex_bwd_tc) at the simulator's sizes: score_mod
with its derivative and mask_mod compiled into the kernel, a block mask's transposed lists, causal, rows with no key,
grouped-query heads, ragged tiles, bfloat16, and the checks of bad arguments.

Each gradient is checked against the float64 reference backward with the same functions
(``tinyflash.reference_attention_backward``) by FlashAttention's rule for gradients: at most 3 × the error of the
naive backward in the same precision (``tinyflash.naive_attention_backward`` on the 16-bit values in float32,
results rounded to the input type). o and lse come from the NumPy forward with the same functions.
"""

import math

import numpy as np
import pytest
from conftest import make_qkv
from numba import cuda, float32, int64  # after conftest: it chooses the GPU or numba's simulator first

import tinyflash as tf
from tinyflash.core import variants
from tinyflash.core.dual_source import value_and_derivative
from tinyflash.core.tolerance import assert_fa_rule, round_to
from tinyflash.gpu.user_code import compiled

pytestmark = pytest.mark.simulator
GRAD_FACTOR = 3.0  # FlashAttention's rule for 16-bit gradients


def softcap(s, b, h, q_idx, kv_idx):
    return 2.0 * math.tanh(s / 2.0)


def alibi(s, b, h, q_idx, kv_idx):
    return s - 0.25 * (h + 1) * abs(q_idx - kv_idx)  # a slope per head; signed indices


def window(b, h, q_idx, kv_idx):
    return (q_idx - kv_idx <= 6) & (kv_idx - q_idx <= 6)


def documents(b, h, q_idx, kv_idx):
    """Three documents packed in one sequence of 40 (keys and queries 0-31, 32-35, 36-39)."""
    return q_idx // 32 + (q_idx >= 36) == kv_idx // 32 + (kv_idx >= 36)


def inputs(rng, lead_q, kv_heads, n_q, n_k, d, dtype=np.float16):
    """q, do (*lead_q, Nq, d) and k, v with ``kv_heads`` heads (the last leading dim), fresh normal values."""
    q = make_qkv(rng, lead_q, n_q, n_q, d, dtype=dtype)[0]
    _, k, v = make_qkv(rng, (*lead_q[:-1], kv_heads) if lead_q else (), n_k, n_k, d, dtype=dtype)
    do = rng.standard_normal(q.shape).astype(dtype)
    return q, k, v, do


def check(rng, q, k, v, do, *, what, dtype=np.float16, block_mask=None, **mods):
    """flex_attention_backward on o, lse of the NumPy forward: each gradient shaped and typed like its input, within
    FlashAttention's rule against the float64 reference on K, V repeated over each group (dk, dv summed over it)."""
    wide = [x.astype(np.float32) for x in (q, k, v, do)]  # the 16-bit values (the NumPy stages take no bfloat16)
    o, lse = tf.naive_attention(*wide[:3], **mods)
    o = o.astype(dtype)
    copies = [x.copy() for x in (q, k, v, o, lse, do)]
    grads = tf.flex_attention_backward(q, k, v, o, lse, do, block_mask=block_mask, **mods)
    assert all(np.array_equal(x, c, equal_nan=True) for x, c in zip((q, k, v, o, lse, do), copies))  # untouched
    group = q.shape[-3] // k.shape[-3] if q.ndim >= 3 else 1
    kr, vr = (np.repeat(x, group, axis=-3) if group > 1 else x for x in wide[1:3])
    ref = tf.reference_attention_backward(wide[0], kr, vr, wide[3], **mods)
    naive = tf.naive_attention_backward(wide[0], kr, vr, wide[3], **mods)
    for name, g, r, n, like in zip(("dq", "dk", "dv"), grads, ref, naive, (q, k, v)):
        assert g.shape == like.shape and g.dtype == like.dtype, (name, g.shape, g.dtype)
        n = round_to(n, np.dtype(dtype).name).astype(np.float64)  # float32 arithmetic, rounded to the input type
        if name != "dq" and group > 1:  # (..., H_kv, g, Nk, d) summed over g
            r, n = (x.reshape(*like.shape[:-2], group, *like.shape[-2:]).sum(axis=-3) for x in (r, n))
        assert_fa_rule(g.astype(np.float64), n, r, np.float16 if dtype == np.float16 else "bfloat16",
                       factor=GRAD_FACTOR, what=f"{what} {name}")
    return grads


@pytest.mark.smoke
def test_smoke_softcap_and_window(rng):
    """The first tier's one run: a softcap and a window on two heads, ragged tiles on both sides."""
    q, k, v, do = inputs(rng, (2,), 2, 17, 20, 16)
    check(rng, q, k, v, do, score_mod=softcap, mask_mod=window, what="smoke")


@pytest.mark.grid
@pytest.mark.parametrize("n_q, n_k", [(1, 17), (17, 40), (40, 17)])
@pytest.mark.parametrize("causal", [False, True])
def test_softcap_with_causal(rng, n_q, n_k, causal):
    """score_mod alone, and with causal (Nq > Nk: the first rows see no key, lse = -inf)."""
    q, k, v, do = inputs(rng, (2,), 2, n_q, n_k, 16)
    check(rng, q, k, v, do, score_mod=softcap, causal=causal, what=f"softcap {n_q}x{n_k} causal={causal}")


@pytest.mark.grid
def test_alibi_with_grouped_query_heads(rng):
    """ALiBi (tinyflash.core.variants) over 4 query heads on 2 K/V heads, batch 2: h is the query head."""
    q, k, v, do = inputs(rng, (2, 4), 2, 17, 23, 16)
    check(rng, q, k, v, do, score_mod=variants.alibi(4), causal=True, what="alibi GQA")


@pytest.mark.grid
@pytest.mark.parametrize("block", [16, 32])
def test_sliding_window_with_a_block_mask(rng, block):
    """A sliding window through its block mask (empty, partial and full tiles; 32: a mask tile is two kernel tiles,
    the last one ragged) and a score_mod on top."""
    q, k, v, do = inputs(rng, (1, 2), 2, 40, 40, 16)
    mask = variants.sliding_window(12)
    bm = tf.create_block_mask(mask, 1, 1, 40, 40, block_q=block, block_k=block)
    check(rng, q, k, v, do, score_mod=alibi, mask_mod=mask, block_mask=bm, what=f"window block mask {block}")


@pytest.mark.grid
@pytest.mark.parametrize("block_q, block_k", [(16, 16), (32, 16)])
def test_documents_with_a_causal_block_mask(rng, block_q, block_k):
    """Packed documents, causal, through a block mask; grouped-query heads (2 query heads on 1 K/V head)."""
    q, k, v, do = inputs(rng, (1, 2), 1, 40, 40, 16)
    bm = tf.create_block_mask(documents, 1, 2, 40, 40, block_q=block_q, block_k=block_k, causal=True)
    check(rng, q, k, v, do, mask_mod=documents, causal=True, block_mask=bm, what=f"documents {block_q}x{block_k}")


@pytest.mark.grid
def test_empty_query_tiles_are_never_read(rng):
    """Q and dO of a query tile that the block mask empties for every key tile hold NaN: dk and dv are still the
    dense mask's (a tile read would put NaN into every key's gradient)."""
    q, k, v, do = inputs(rng, (1, 1), 1, 48, 16, 16)
    keep = lambda b, h, q_idx, kv_idx: q_idx < 32  # noqa: E731  (queries 32-47 see no key)
    bm = tf.create_block_mask(keep, 1, 1, 48, 16, block_q=16, block_k=16)
    assert bm.to_dense()[0, 0, :, 0].tolist() == [2, 2, 0]
    o, lse = tf.naive_attention(q, k, v, mask_mod=keep)
    q_nan, do_nan = q.copy(), do.copy()
    q_nan[..., 32:, :] = np.nan
    do_nan[..., 32:, :] = np.nan
    dq, dk, dv = tf.flex_attention_backward(q_nan, k, v, o, lse, do_nan, block_mask=bm)
    _, ref_dk, ref_dv = check(rng, q, k, v, do, mask_mod=keep, block_mask=bm, what="reference")
    assert np.array_equal(dk, ref_dk) and np.array_equal(dv, ref_dv)


@pytest.mark.grid
def test_bfloat16_and_a_captured_table(rng):
    """bfloat16 (ml_dtypes) with a relative bias read from a captured table, and a mask that empties rows."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v, do = inputs(rng, (2,), 2, 17, 33, 32, dtype=np.float32)
    q, k, v, do = (x.astype(ml_dtypes.bfloat16) for x in (q, k, v, do))
    bias = variants.relative_bias(rng.standard_normal((2, 9)))
    rows = lambda b, h, q_idx, kv_idx: (q_idx % 5 != 3) & (kv_idx % 2 == h)  # noqa: E731
    check(rng, q, k, v, do, score_mod=bias, mask_mod=rows, dtype=ml_dtypes.bfloat16, what="bfloat16 table")


@pytest.mark.grid
def test_padded_head_dim_and_two_dimensional_inputs(rng):
    """q (Nq, d), d = 40 (padded to 64): b = h = 0 for the functions."""
    q, k, v, do = inputs(rng, (), 1, 23, 17, 40)
    score = lambda s, b, h, q_idx, kv_idx: s * (1.0 + 0.1 * (b + h)) + math.sin(s) * 0.5  # noqa: E731
    check(rng, q, k, v, do, score_mod=score, causal=True, what="(Nq, d) d=40")


@pytest.mark.grid
def test_a_score_mod_that_empties_rows(rng):
    """A score_mod of -inf for every key of some rows: their lse is -inf, their P 0 (not NaN), as the NumPy stages
    have it; the other rows through the score_mod's derivative."""
    q, k, v, do = inputs(rng, (2,), 2, 17, 20, 16)
    score = lambda s, b, h, q_idx, kv_idx: -math.inf if q_idx % 4 == 1 else s * 0.5 + 0.1 * h  # noqa: E731
    dq, _, _ = check(rng, q, k, v, do, score_mod=score, what="rows of -inf")
    assert np.all(dq[:, 1::4] == 0)


@pytest.mark.grid
@pytest.mark.parametrize("name", ["softcap", "alibi", "relative bias", "branches"])
def test_the_derivative_s_value_is_the_forward_s_score(rng, name):
    """In a kernel (the simulator's, or a GPU's: NVVM compiles both), score_mod(scale · s, ...) and the value of its
    rewritten (value, derivative) form are the same float32 bits, for fresh scores s."""
    fn = {"softcap": variants.softcap(30.0), "alibi": variants.alibi(4), "branches": branchy,
          "relative bias": variants.relative_bias(rng.standard_normal((4, 9)).astype(np.float32))}[name]
    plain, both = compiled(fn), compiled(value_and_derivative(fn, device=compiled))

    @cuda.jit
    def scores(S, scale, out, slopes):
        i = cuda.threadIdx.x  # one block
        if i < S.size:
            x = S[i] * scale
            q_idx, kv_idx = int64(i % 7), int64(i % 11)
            out[i] = float32(plain(x, int64(0), int64(i % 4), q_idx, kv_idx))
            value, slopes[i] = both(x, int64(0), int64(i % 4), q_idx, kv_idx)
            out[S.size + i] = float32(value)

    S = (rng.standard_normal(64) * 8).astype(np.float32)
    out, slopes = np.zeros(128, np.float32), np.zeros(64, np.float32)
    scores[1, 64](S, np.float32(0.125), out, slopes)
    assert np.array_equal(out[:64].view(np.uint32), out[64:].view(np.uint32)), name
    assert np.isfinite(slopes).all()


def branchy(s, b, h, q_idx, kv_idx):
    """A score_mod with a branch, min and a math function (its derivative differs on each side of 0)."""
    if s > 0:
        return min(s, np.float32(4.0)) - 0.5 * h
    return math.exp(s) - np.float32(1.0)


def no_launch(monkeypatch):
    """Make any launch of the backward's kernels fail the test: its errors must come first."""
    def launch(*args, **kwargs):
        raise AssertionError("a kernel was launched")

    monkeypatch.setattr("tinyflash.backward.tensor_cores.launch", launch)
    monkeypatch.setattr("tinyflash.backward.tensor_cores.launch_backward_tensor_cores", launch)


def loops_over_the_score(s, b, h, q_idx, kv_idx):
    for _ in range(2):
        s = s * 0.5
    return s


@pytest.mark.parametrize("kwargs, error, words", [
    ({"score_mod": 3}, TypeError, "score_mod must be a callable"),
    ({"mask_mod": lambda b, h, q_idx, kv_idx, extra: True}, TypeError, "mask_mod must take 4"),
    ({"score_mod": loops_over_the_score}, TypeError, "a For statement on an active number"),
    ({"score_mod": eval("lambda s, b, h, q_idx, kv_idx: s")}, TypeError, "source of <lambda> is needed"),
    ({"block_mask": tf.create_block_mask(window, 1, 1, 17, 17, block_q=24, block_k=16)}, ValueError,
     "block_q = 24 must be a multiple of the backward kernel's query tile Br"),
    ({"kernel": "v3"}, ValueError, "kernel must be one of v2"),
])
def test_bad_arguments(rng, monkeypatch, kwargs, error, words):
    """Raised before any launch, naming the argument."""
    no_launch(monkeypatch)
    q, k, v, do = inputs(rng, (1,), 1, 17, 17, 16)
    o, lse = tf.naive_attention(q, k, v)
    with pytest.raises(error, match=words):
        tf.flex_attention_backward(q, k, v, o, lse, do, **kwargs)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        tf.flex_attention_backward(*(x.astype(np.float32) for x in (q, k, v, o)), lse, do.astype(np.float32))


def test_bad_transposed_lists(rng, monkeypatch):
    """A block mask whose transposed lists name a query tile past Nq, or list them out of order: raised before any
    launch (the backward's block would read rows past Nq)."""
    from dataclasses import replace

    no_launch(monkeypatch)
    q, k, v, do = inputs(rng, (1,), 1, 17, 17, 16)
    o, lse = tf.naive_attention(q, k, v, mask_mod=window)
    good = tf.create_block_mask(window, 1, 1, 17, 17, block_q=16, block_k=16)
    assert good.q_num_blocks[0, 0, 0] == 2 and good.q_indices[0, 0, 0].tolist() == [0, 1]  # key tile 0: 2 partial
    for name, where, value in (("q_indices", (0, 0, 0, 1), 2), ("q_indices", (0, 0, 0, 1), 0),
                               ("full_q_num_blocks", (0, 0, 1), 3)):
        lists = {n: getattr(good, n).copy() for n in ("q_num_blocks", "q_indices", "full_q_num_blocks",
                                                      "full_q_indices")}
        lists[name][where] = value
        with pytest.raises(ValueError, match="must list 0 to Tr = 2 query tiles"):
            tf.flex_attention_backward(q, k, v, o, lse, do, block_mask=replace(good, **lists))


def test_the_driver_signature_fits_what_the_build_takes():
    """What a flex backward on PyTorch or CuPy arrays launches through the driver (``host.sized.sized_flex_backward``)
    is compiled for ``host.sized.signature_of``'s choice: v2's flex signature for flex_bwd_tc (the user's functions or
    a block mask), its plain one for its own kernel; either as long as the kernel's parameters (on the builds)."""
    from tinyflash.backward.kernels import VERSIONS
    from tinyflash.gpu.launch import parameters
    from tinyflash.host.flex import user_function
    from tinyflash.host.sized import signature_of

    v2 = VERSIONS["v2"]
    cfg = v2.tilings[1](64)
    score = user_function(variants.softcap(20.0), "score_mod", 5)
    for kwargs in ({"score_mod": score}, {"block_sparse": True}, {}):
        kernel = v2.build(cfg, "float16", pair_atomics=False, **kwargs)
        signature = signature_of(v2, kernel)
        assert signature is (v2.flex_signature if kwargs else v2.signature), kwargs
        assert len(parameters(kernel)) == len(signature), kwargs
