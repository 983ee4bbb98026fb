"""tinyflash.flex_attention on the tensor cores (v6's flex_fwd) at the simulator's sizes: score_mod and mask_mod
compiled into the kernel, causal with them, rows with no key, grouped-query heads, a block mask with empty, partial
and full tiles, the kernel cache, and the checks of bad arguments.

Each result is checked against a float64 reference computed densely here from the same functions (the scores
scaled, score_mod applied element by element, -inf where causal or mask_mod masks), o by FlashAttention's rule
against the same computation in float32 rounded to the input type (tinyflash's naive stage does the same), lse
within F32_TOL.
"""

import math
from dataclasses import replace

import numpy as np
import pytest
from conftest import make_qkv

import tinyflash as tf
from tinyflash.core import variants
from tinyflash.core.masks import causal_mask
from tinyflash.core.tolerance import F32_TOL, assert_close, assert_fa_rule, round_to
from tinyflash.forward.kernels import VERSIONS
from tinyflash.forward.kernels import tensor_core_tiling as tct

pytestmark = pytest.mark.simulator


def dense(q, k, v, score_mod, mask_mod, causal, scale, dtype):
    """o, lse by the formula in ``dtype`` (float64 or float32): S = scale · q kᵀ, score_mod and the masks element by
    element, softmax, P V; a row with no key gives o = 0, lse = -inf. q (*lead, Nq, d) with lead (), (H,), (B, H)."""
    lead, (n_q, d), n_k = q.shape[:-2], q.shape[-2:], k.shape[-2]
    q4 = q.reshape((-1, *q.shape[-3:]) if q.ndim == 4 else (1, -1, n_q, d)).astype(dtype)  # (B, H, Nq, d)
    k4, v4 = (x.reshape(q4.shape[0], -1, n_k, d).astype(dtype) for x in (k, v))  # (B, H_kv, Nk, d)
    g = q4.shape[1] // k4.shape[1]  # query heads per K/V head
    k4, v4 = np.repeat(k4, g, axis=1), np.repeat(v4, g, axis=1)  # (B, H, Nk, d)
    S = dtype(scale) * np.einsum("bhqd,bhkd->bhqk", q4, k4)  # (B, H, Nq, Nk)
    keep = np.broadcast_to(causal_mask(n_q, n_k) if causal else True, S.shape).copy()
    for b, h, i, j in np.ndindex(S.shape):
        if score_mod is not None:
            S[b, h, i, j] = score_mod(S[b, h, i, j], b, h, i, j)
        if mask_mod is not None:
            keep[b, h, i, j] &= bool(mask_mod(b, h, i, j))
    S = np.where(keep, S, -np.inf)
    m = S.max(-1, keepdims=True)  # (B, H, Nq, 1)
    m_safe = np.where(np.isfinite(m), m, 0)
    P = np.exp(S - m_safe)
    l = P.sum(-1, keepdims=True)
    o = np.where(l > 0, (P @ v4) / np.where(l > 0, l, 1), 0)  # (B, H, Nq, d)
    lse = np.where(l[..., 0] > 0, (m_safe + np.log(np.where(l > 0, l, 1)))[..., 0], -np.inf)
    return o.reshape((*lead, n_q, d)), lse.reshape((*lead, n_q))


def check(o, lse, q, k, v, score_mod=None, mask_mod=None, causal=False, scale=None, dtype="float16", what=""):
    """o by FlashAttention's rule against the float32 computation rounded to ``dtype``; lse within F32_TOL."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    ref_o, ref_lse = dense(q, k, v, score_mod, mask_mod, causal, scale, np.float64)
    naive = round_to(dense(q, k, v, score_mod, mask_mod, causal, scale, np.float32)[0], dtype)
    assert o.shape == ref_o.shape and lse.shape == ref_lse.shape
    assert_fa_rule(np.asarray(o, dtype=np.float64), naive, ref_o, np.float16 if dtype == "float16" else dtype,
                   what=f"{what} o")
    assert_close(lse, ref_lse, F32_TOL, f"{what} lse", is_lse=True)
    return ref_o, ref_lse


def softcap(s, b, h, q_idx, kv_idx):
    return 2.0 * math.tanh(s / 2.0)


def alibi(s, b, h, q_idx, kv_idx):
    return s - 0.25 * (h + 1) * abs(q_idx - kv_idx)  # a slope per head; signed indices


def sliding_window(b, h, q_idx, kv_idx):
    return (q_idx - kv_idx <= 6) & (kv_idx - q_idx <= 6)


def test_smoke_score_and_mask(rng):
    """The first tier's one run: a softcap and a window on two heads, ragged tiles on both sides."""
    q, k, v = make_qkv(rng, (2,), 17, 40, d=16, dtype=np.float16)
    copies = [x.copy() for x in (q, k, v)]
    o, lse = tf.flex_attention(q, k, v, score_mod=softcap, mask_mod=sliding_window)
    assert o.dtype == np.float16 and o.shape == q.shape and lse.dtype == np.float32 and lse.shape == q.shape[:-1]
    check(o, lse, q, k, v, softcap, sliding_window, what="smoke")
    assert all(np.array_equal(x, c) for x, c in zip((q, k, v), copies))  # inputs untouched


@pytest.mark.grid
@pytest.mark.parametrize("n_q, n_k", [(1, 17), (17, 1), (17, 40), (40, 17), (40, 40)])
@pytest.mark.parametrize("causal", [False, True])
def test_score_mod_with_causal(rng, n_q, n_k, causal):
    """score_mod alone, and with causal (Nq > Nk: the first rows see no key)."""
    q, k, v = make_qkv(rng, (2,), n_q, n_k, d=16, dtype=np.float16)
    o, lse = tf.flex_attention(q, k, v, score_mod=alibi, causal=causal)
    check(o, lse, q, k, v, alibi, None, causal, what=f"alibi {n_q}x{n_k} causal={causal}")


@pytest.mark.grid
@pytest.mark.parametrize("n_q, n_k", [(17, 40), (40, 17)])
def test_causal_and_mask_with_empty_rows(rng, n_q, n_k):
    """causal AND a mask_mod that empties some rows whole (q_idx % 5 == 3): o = 0, lse = -inf there."""
    q, k, v = make_qkv(rng, (1, 2), n_q, n_k, d=32, dtype=np.float16)
    mask = lambda b, h, q_idx, kv_idx: (q_idx % 5 != 3) & (kv_idx % 2 == h)  # noqa: E731
    o, lse = tf.flex_attention(q, k, v, mask_mod=mask, causal=True, scale=0.3)
    ref_o, ref_lse = check(o, lse, q, k, v, None, mask, True, 0.3, what=f"causal + mask {n_q}x{n_k}")
    empty = np.isneginf(ref_lse)
    assert empty.any() and np.all(o[empty] == 0) and np.all(np.isneginf(lse[empty]))


@pytest.mark.grid
def test_grouped_query_heads_see_the_query_head(rng):
    """GQA (4 query heads, 2 K/V heads, batch 2): h is the query head, b the batch."""
    q, k, v = make_qkv(rng, (2, 4), 17, 17, d=16, dtype=np.float16)
    k, v = k[:, :2].copy(), v[:, :2].copy()
    score = lambda s, b, h, q_idx, kv_idx: s + 0.5 * h - 0.75 * b * (kv_idx % 3)  # noqa: E731
    mask = lambda b, h, q_idx, kv_idx: (kv_idx + h + b) % 4 != 0  # noqa: E731
    o, lse = tf.flex_attention(q, k, v, score_mod=score, mask_mod=mask)
    check(o, lse, q, k, v, score, mask, what="GQA")


@pytest.mark.grid
def test_bfloat16_and_a_captured_table(rng):
    """bfloat16 (ml_dtypes' arrays) with a relative bias read from a captured NumPy table (a constant of the kernel)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v = make_qkv(rng, (2,), 17, 40, d=32, dtype=np.float32)
    q, k, v = (x.astype(ml_dtypes.bfloat16) for x in (q, k, v))
    table = rng.standard_normal(17 + 40).astype(np.float32)  # bias by q_idx - kv_idx + 39

    def bias(s, b, h, q_idx, kv_idx):
        return s + table[q_idx - kv_idx + 39]

    o, lse = tf.flex_attention(q, k, v, score_mod=bias, causal=True)
    assert o.dtype == q.dtype
    check(o.astype(np.float32), lse, q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), bias, None,
          True, dtype="bfloat16", what="bfloat16 table")


def documents(b, h, q_idx, kv_idx):
    """Three documents packed in one sequence of 40: keys 0-31, 32-35, 36-39 (queries alike). The document's
    number is an int (q_idx // 32 + ...): a sum of two comparisons would be a logical or on NumPy's bools (the
    simulator's scalars) and a count on the GPU's."""
    return q_idx // 32 + (q_idx >= 36) == kv_idx // 32 + (kv_idx >= 36)


def keep_of(mask_mod, lead, n_q, n_k, causal):
    """(B, H, Nq, Nk) bool: causal AND mask_mod."""
    keep = np.empty((*lead, n_q, n_k), dtype=bool)
    for b, h, i, j in np.ndindex(keep.shape):
        keep[b, h, i, j] = bool(mask_mod(b, h, i, j))
    return keep & (causal_mask(n_q, n_k) if causal else True)


@pytest.mark.grid
@pytest.mark.parametrize("block_q, block_k", [(16, 16), (32, 32), (32, 16)])
@pytest.mark.parametrize("causal", [False, True])
def test_block_mask(rng, block_q, block_k, causal):
    """Packed documents: the block mask has empty, partial and full tiles (causal in tiles of 32: no full one);
    block_q = 2 Br puts two kernel blocks in one of its query tiles; block_k = 2 Bc makes each key tile two kernel
    tiles, the last one (40 keys: 8 in the last tile) one. The result is the dense mask's."""
    q, k, v = make_qkv(rng, (1, 2), 40, 40, d=16, dtype=np.float16)
    bm = tf.create_block_mask(documents, 1, 2, 40, 40, block_q=block_q, block_k=block_k, causal=causal)
    full_tile = not causal or block_q == 16  # causal: no query tile of 32 rows has a full key tile
    assert set(bm.to_dense().ravel().tolist()) == ({0, 1, 2} if full_tile else {0, 1})
    o, lse = tf.flex_attention(q, k, v, mask_mod=documents, block_mask=bm, causal=causal, score_mod=softcap)
    check(o, lse, q, k, v, softcap, documents, causal, what=f"block mask {block_q}x{block_k} causal={causal}")


@pytest.mark.grid
def test_block_mask_broadcast_over_heads_and_its_mask_mod(rng):
    """A block mask with H = 1 serves every head; without a mask_mod the block mask's own is used."""
    q, k, v = make_qkv(rng, (3,), 33, 40, d=16, dtype=np.float16)
    bm = tf.create_block_mask(documents, 1, 1, 33, 40, block_q=16, block_k=16)
    o, lse = tf.flex_attention(q, k, v, block_mask=bm)
    check(o, lse, q, k, v, None, documents, what="broadcast block mask")


@pytest.mark.grid
def test_block_mask_skips_empty_tiles(rng):
    """The kernel never reads an empty tile: K and V of the tile that the block mask empties hold NaN, and the
    result is still the dense mask's (a tile read would put NaN into every row, masked or not: 0 · NaN)."""
    q, k, v = make_qkv(rng, (1, 1), 16, 48, d=16, dtype=np.float16)
    window = lambda b, h, q_idx, kv_idx: (kv_idx >= q_idx) & (kv_idx < q_idx + 16)  # noqa: E731
    bm = tf.create_block_mask(window, 1, 1, 16, 48, block_q=16, block_k=16)
    assert bm.to_dense()[0, 0, 0].tolist() == [1, 1, 0]  # keys 32-47: empty
    k_nan, v_nan = k.copy(), v.copy()
    k_nan[..., 32:, :] = np.nan
    v_nan[..., 32:, :] = np.nan
    o, lse = tf.flex_attention(q, k_nan, v_nan, block_mask=bm)
    check(o, lse, q, k, v, None, window, what="NaN in an empty tile")


@pytest.mark.grid
@pytest.mark.parametrize("which", ["softcap + sliding window", "alibi + prefix", "relative bias + documents"])
def test_ready_made_variants(rng, which):
    """tinyflash.core.variants' closures (numbers and NumPy arrays captured) compiled into the kernel as they stand."""
    H, n = 2, 33
    q, k, v = make_qkv(rng, (H,), n, n, d=16, dtype=np.float16)
    ids = np.repeat(np.arange(3), [12, 9, 12])  # (Nq,) three documents
    score_mod, mask_mod = {"softcap + sliding window": (variants.softcap(2.0), variants.sliding_window(7)),
                           "alibi + prefix": (variants.alibi(H), variants.prefix_lm(5)),
                           "relative bias + documents": (variants.relative_bias(rng.standard_normal((H, 9))),
                                                         variants.document_mask(ids))}[which]
    o, lse = tf.flex_attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod)
    check(o, lse, q, k, v, score_mod, mask_mod, what=which)


def test_the_kernel_cache(rng):
    """Two lambdas of the same code with equal captured numbers share a kernel; a different number gets another
    (checked on the build, without a launch)."""

    def window(size):
        return lambda b, h, q_idx, kv_idx: abs(q_idx - kv_idx) <= size

    from tinyflash.host.flex import user_function

    v6, cfg = VERSIONS["v6"], tct.simulator_tiling(16)
    build = lambda mod: v6.build(cfg, "float16", 1, mask_mod=user_function(mod, "mask_mod", 4))  # noqa: E731
    assert build(window(3)) is build(window(3))
    assert build(window(3)) is not build(window(4))
    assert build(window(3)) is not v6.build(cfg, "float16", 1)
    ids = np.arange(40) // 8
    same, other = variants.document_mask(ids), variants.document_mask(ids.copy())
    assert build(same) is build(other)  # equal captured arrays
    assert build(same) is not build(variants.document_mask(ids[::-1].copy()))
    module = {"WINDOW": 3}  # a global the function reads: frozen into the kernel, so part of its key
    exec("def by_global(b, h, q_idx, kv_idx):\n    return abs(q_idx - kv_idx) <= WINDOW", module)
    first = build(module["by_global"])
    module["WINDOW"] = 4
    assert build(module["by_global"]) is not first


@pytest.mark.grid
def test_different_captured_numbers_give_different_results(rng):
    q, k, v = make_qkv(rng, (1,), 17, 17, d=16, dtype=np.float16)
    for size in (2, 5):
        mask = lambda b, h, q_idx, kv_idx: abs(q_idx - kv_idx) <= size  # noqa: E731
        o, lse = tf.flex_attention(q, k, v, mask_mod=mask)
        check(o, lse, q, k, v, None, mask, what=f"window {size}")


def no_launch(monkeypatch):
    """Make any launch of flex_attention's kernel fail the test: its errors must come first."""
    def launch(*args, **kwargs):
        raise AssertionError("a kernel was launched")

    monkeypatch.setattr("tinyflash.host.flex.launch", launch)


class NotAFunction:
    pass


@pytest.mark.parametrize("kwargs, error, words", [
    ({"score_mod": 3}, TypeError, "score_mod must be a callable"),
    ({"mask_mod": "causal"}, TypeError, "mask_mod must be a callable"),
    ({"score_mod": lambda s, b, h: s}, TypeError, "score_mod must take 5"),
    ({"mask_mod": lambda b, h, q_idx, kv_idx, extra: True}, TypeError, "mask_mod must take 4"),
    ({"mask_mod": lambda b, h, q_idx, kv_idx: NOT_A_NUMBER is None}, TypeError, "mask_mod reads a value of type"),
    ({"block_mask": np.zeros((1, 1, 2))}, TypeError, "block_mask must be a tinyflash.BlockMask"),
    ({"mask_mod": variants.document_mask(np.arange(17000), np.arange(17000))}, ValueError,
     "mask_mod capture NumPy arrays of 68,000 bytes"),  # two int16 arrays (q's ids, k's): more than constant memory
])
def test_bad_arguments(rng, monkeypatch, kwargs, error, words):
    """Raised before any launch, naming the argument."""
    no_launch(monkeypatch)
    q, k, v = make_qkv(rng, (1,), 17, 17, d=16, dtype=np.float16)
    with pytest.raises(error, match=words):
        tf.flex_attention(q, k, v, **kwargs)


NOT_A_NUMBER = NotAFunction()  # a global of a type numba cannot compile into a kernel


def test_bad_block_masks(rng, monkeypatch):
    """A block mask for another shape or causal, of a block size the kernel's tiles cannot walk, or with another
    mask_mod than the call's: raised before any launch."""
    no_launch(monkeypatch)
    q, k, v = make_qkv(rng, (2,), 33, 40, d=16, dtype=np.float16)
    bad = {"does not fit this call": tf.create_block_mask(documents, 1, 2, 20, 40, block_q=16, block_k=16),
           "Nq = 34": tf.create_block_mask(documents, 1, 2, 34, 40, block_q=16, block_k=16),
           "block_k = 24 a multiple of its key tile Bc = 16": tf.create_block_mask(documents, 1, 2, 33, 40,
                                                                                   block_q=16, block_k=24),
           "built with causal=True": tf.create_block_mask(documents, 1, 2, 33, 40, block_q=16, block_k=16,
                                                          causal=True)}
    for words, bm in bad.items():
        with pytest.raises(ValueError, match=words):
            tf.flex_attention(q, k, v, mask_mod=documents, block_mask=bm)
    good = tf.create_block_mask(documents, 1, 2, 33, 40, block_q=16, block_k=16)
    for name, where, value in (("kv_indices", (0, 0, 2, 0), 3), ("full_kv_num_blocks", (0, 0, 0), 4)):
        lists = {n: getattr(good, n).copy() for n in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks",
                                                      "full_kv_indices")}
        assert good.kv_num_blocks[0, 0, 2] == 1  # query tile 2 lists one partial key tile: made tile 3, past Nk
        lists[name][where] = value  # or more full tiles than Tc
        with pytest.raises(ValueError, match="must list 0 to Tc = 3 key tiles"):
            tf.flex_attention(q, k, v, mask_mod=documents, block_mask=replace(good, **lists))
    with pytest.raises(ValueError, match="does not fit this call"):  # 3 heads for a call of 2
        tf.flex_attention(q, k, v, block_mask=tf.create_block_mask(documents, 1, 3, 33, 40, block_q=16, block_k=16))
    with pytest.raises(ValueError, match="mask_mod differs from the block_mask's own"):
        tf.flex_attention(q, k, v, mask_mod=sliding_window,
                          block_mask=tf.create_block_mask(documents, 1, 2, 33, 40, block_q=16, block_k=16))


def test_tiling_for_block_mask():
    """The GPU's tilings shrunk to fit FlexAttention's default block mask (128 × 128) and smaller ones."""
    cfg = tct.default_tiling(128, False, 16384)  # 8 warps × 32 rows: Br = 256
    fitted = cfg.for_block_mask(128, 128)
    assert fitted.BR == 128 and fitted.BC == 64 and 128 % fitted.BR == 0
    assert cfg.for_block_mask(32, 32).BR == 32 and cfg.for_block_mask(32, 32).BC == 32
    assert cfg.for_block_mask(128, 8) is None  # no key tile of 8


@pytest.mark.grid
def test_agrees_with_the_numpy_stages(rng):
    """The same functions through the NumPy stages (tinyflash.reference_attention in float64, naive_attention in
    float16): one semantics for every stage. GQA, causal, a block mask."""
    q, k, v = make_qkv(rng, (1, 4), 40, 40, d=16, dtype=np.float16)
    k, v = k[:, :2].copy(), v[:, :2].copy()
    score_mod, mask_mod = variants.alibi(4), variants.sliding_window(12)
    bm = tf.create_block_mask(mask_mod, 1, 1, 40, 40, block_q=16, block_k=16, causal=True)
    o, lse = tf.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, causal=True)
    mods = {"score_mod": score_mod, "mask_mod": mask_mod, "causal": True}
    ref_o, ref_lse = tf.reference_attention(q, k, v, **mods)
    assert_fa_rule(o, tf.naive_attention(q, k, v, **mods)[0], ref_o, np.float16, what="against the NumPy stages o")
    assert_close(lse, ref_lse, F32_TOL, "against the NumPy stages lse", is_lse=True)


@pytest.mark.grid
def test_two_dimensional_inputs_are_batch_0_head_0(rng):
    """q (Nq, d): b = h = 0 for the functions (a mask that keeps nothing elsewhere)."""
    q, k, v = make_qkv(rng, (), 17, 23, d=16, dtype=np.float16)
    mask = lambda b, h, q_idx, kv_idx: (b == 0) & (h == 0) & (kv_idx % 3 != 1)  # noqa: E731
    o, lse = tf.flex_attention(q, k, v, mask_mod=mask, score_mod=alibi)
    ref_o, _ = check(o, lse, q, k, v, alibi, mask, what="(Nq, d)")
    assert np.isfinite(lse).all()


@pytest.mark.parametrize("name", ["v6", "v10"])
def test_the_driver_signatures_fit_what_the_builds_take(name):
    """What a call on device arrays launches through the driver (``host.sized.sized_flex``) is compiled for the
    signature ``host.sized.signature_of`` chooses: for a build with the user's functions or a block mask (flex_fwd)
    the version's flex signature, for one without (the version's own flash_fwd) its plain one; either as long as
    the kernel's parameters (checked on the builds, without a launch)."""
    from tinyflash.gpu.launch import parameters
    from tinyflash.host.flex import user_function
    from tinyflash.host.sized import signature_of

    version = VERSIONS[name]
    cfg = version.tilings[1](64)
    score = user_function(variants.softcap(20.0), "score_mod", 5)
    for kwargs in ({"score_mod": score}, {"block_sparse": True}, {}):
        kernel = version.build(cfg, "float16", 1, **kwargs)
        signature = signature_of(version, kernel)
        assert signature is (version.flex_signature if kwargs else version.signature), (name, kwargs)
        assert len(parameters(kernel)) == len(signature), (name, kwargs)
