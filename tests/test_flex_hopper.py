"""tinyflash.flex_attention on Hopper's kernel v10 (its flex_fwd: wgmma, TMA, a producer warpgroup, ping-pong
consumers) at the simulator's sizes: score_mod and mask_mod compiled in, causal with them, rows with no key,
grouped-query heads, a block mask whose empty tiles are never loaded and whose full tiles get no per-element work,
float16 and bfloat16; and the registry's rule (v10 on compute capability 9.0, v6 elsewhere).

The simulator runs v10 as tests/test_hopper.py does (every wgmma, TMA copy and barrier emulated): d = 64 (wgmma's
smallest head dim), 16-key tiles, one or two consumer warpgroups of 64 rows. Each result is checked as
tests/test_flex_tensor_cores.py checks v6's: against a float64 reference computed densely from the same functions,
o by FlashAttention's rule against the float32 computation rounded to the input type, lse within F32_TOL.
"""

from dataclasses import replace

import numpy as np
import pytest
from conftest import make_qkv
from test_flex_tensor_cores import alibi, check, documents, no_launch, softcap, sliding_window

import tinyflash as tf
from tinyflash.core import variants
from tinyflash.core.tolerance import F32_TOL, assert_close, assert_fa_rule
from tinyflash.forward.kernels import VERSIONS
from tinyflash.forward.kernels import tma_tiling
from tinyflash.gpu.runtime import simulator_enabled

pytestmark = pytest.mark.simulator
D = 64  # wgmma's smallest head dim


@pytest.fixture(autouse=True)
def hopper_or_simulator():
    if not simulator_enabled():
        from tinyflash.gpu.runtime import compute_capability

        if compute_capability() != (9, 0):
            pytest.skip("kernel v10 (wgmma, TMA) needs compute capability 9.0")


def flex(q, k, v, **options):
    """flex_attention on v10 (the simulator's default is v6: the rule for v10 names compute capability 9.0)."""
    return tf.flex_attention(q, k, v, kernel="v10", **options)


def packed(b, h, q_idx, kv_idx):
    """Three documents packed in one sequence of 75 tokens: 0-39, 40-47, 48-74 (queries and keys alike). The
    document's number is an int plus a comparison (a sum of two comparisons would be a logical or on NumPy's bools,
    the simulator's scalars)."""
    return (q_idx + 24) // 64 + (q_idx >= 48) == (kv_idx + 24) // 64 + (kv_idx >= 48)


@pytest.mark.smoke
def test_smoke_softcap_and_window_through_a_block_mask(rng):
    """The first tier's one run of v10's flex_fwd: a softcap, a window's block mask (block_q = 64: one consumer
    warpgroup), ragged tiles on both sides."""
    q, k, v = make_qkv(rng, (1,), 20, 37, d=D, dtype=np.float16)
    copies = [x.copy() for x in (q, k, v)]
    bm = tf.create_block_mask(sliding_window, 1, 1, 20, 37, block_q=64, block_k=16)
    o, lse = flex(q, k, v, score_mod=softcap, block_mask=bm)
    assert o.dtype == np.float16 and o.shape == q.shape and lse.dtype == np.float32 and lse.shape == q.shape[:-1]
    check(o, lse, q, k, v, softcap, sliding_window, what="v10 smoke")
    assert all(np.array_equal(x, c) for x, c in zip((q, k, v), copies))  # inputs untouched


@pytest.mark.grid
@pytest.mark.parametrize("n_q, n_k", [(20, 37), (37, 20)])
@pytest.mark.parametrize("causal", [False, True])
def test_score_mod_with_causal(rng, n_q, n_k, causal):
    """score_mod alone (a bias per head, signed distances), two consumer warpgroups taking turns; with causal
    and Nq > Nk, the first rows see no key: o = 0, lse = -inf."""
    q, k, v = make_qkv(rng, (2,), n_q, n_k, d=D, dtype=np.float16)
    o, lse = flex(q, k, v, score_mod=alibi, causal=causal)
    ref_o, ref_lse = check(o, lse, q, k, v, alibi, None, causal, what=f"alibi {n_q}x{n_k} causal={causal}")
    empty = np.isneginf(ref_lse)
    assert np.all(o[empty] == 0) and np.all(np.isneginf(lse[empty]))


@pytest.mark.grid
def test_causal_and_mask_with_empty_rows(rng):
    """causal AND a mask_mod that empties some rows whole (q_idx % 5 == 3) on every key tile (no block mask)."""
    q, k, v = make_qkv(rng, (1, 2), 40, 29, d=D, dtype=np.float16)
    mask = lambda b, h, q_idx, kv_idx: (q_idx % 5 != 3) & (kv_idx % 2 == h)  # noqa: E731
    o, lse = flex(q, k, v, mask_mod=mask, causal=True, scale=0.3)
    ref_o, ref_lse = check(o, lse, q, k, v, None, mask, True, 0.3, what="causal + mask 40x29")
    empty = np.isneginf(ref_lse)
    assert empty.any() and np.all(o[empty] == 0) and np.all(np.isneginf(lse[empty]))


@pytest.mark.grid
def test_grouped_query_heads_see_the_query_head(rng):
    """GQA (2 query heads per K/V head, batch 2): h is the query head, b the batch."""
    q, k, v = make_qkv(rng, (2, 2), 17, 23, d=D, dtype=np.float16)
    k, v = k[:, :1].copy(), v[:, :1].copy()
    score = lambda s, b, h, q_idx, kv_idx: s + 0.5 * h - 0.75 * b * (kv_idx % 3)  # noqa: E731
    mask = lambda b, h, q_idx, kv_idx: (kv_idx + h + b) % 4 != 0  # noqa: E731
    o, lse = flex(q, k, v, score_mod=score, mask_mod=mask)
    check(o, lse, q, k, v, score, mask, what="GQA")


@pytest.mark.grid
@pytest.mark.parametrize("block_q, block_k, causal", [(64, 16, True), (64, 32, False), (128, 16, False)])
def test_block_mask(rng, block_q, block_k, causal):  # each block shape once, causal once (the simulator is slow)
    """Packed documents over 75 tokens: block_q = 64 (one consumer warpgroup, two query tiles: empty, partial and,
    but for causal in tiles of 32 keys, full tiles), 128 (two warpgroups taking turns, one query tile: partial
    tiles); block_k = 2 Bc makes each key tile two kernel tiles, the last one (75 keys: 11 in the last tile) one.
    The result is the dense mask's."""
    q, k, v = make_qkv(rng, (1, 2), 75, 75, d=D, dtype=np.float16)
    bm = tf.create_block_mask(packed, 1, 2, 75, 75, block_q=block_q, block_k=block_k, causal=causal)
    kinds = {64: {0, 1} if causal and block_k == 32 else {0, 1, 2}, 128: {1}}[block_q]  # empty, partial, full
    assert set(bm.to_dense().ravel().tolist()) == kinds
    o, lse = flex(q, k, v, mask_mod=packed, block_mask=bm, causal=causal, score_mod=softcap)
    check(o, lse, q, k, v, softcap, packed, causal, what=f"block mask {block_q}x{block_k} causal={causal}")


@pytest.mark.grid
def test_block_mask_skips_empty_tiles(rng):
    """The kernel never loads an empty tile: K and V of the key tile that the block mask empties hold NaN, and the
    result is still the dense mask's (a tile read would put NaN into every row, masked or not: 0 · NaN). The
    second query tile lists no key tile at all: its block's producer loads Q_i alone and its rows give o = 0,
    lse = -inf."""
    q, k, v = make_qkv(rng, (1, 1), 80, 64, d=D, dtype=np.float16)
    window = lambda b, h, q_idx, kv_idx: (kv_idx >= q_idx + 16) & (kv_idx < q_idx + 32)  # noqa: E731
    bm = tf.create_block_mask(window, 1, 1, 80, 64, block_q=64, block_k=16)
    assert bm.to_dense()[0, 0].tolist() == [[0, 1, 1, 1], [0, 0, 0, 0]]  # keys 0-15: empty; rows 64-79: no key
    k_nan, v_nan = k.copy(), v.copy()
    k_nan[..., :16, :] = np.nan
    v_nan[..., :16, :] = np.nan
    o, lse = flex(q, k_nan, v_nan, block_mask=bm)
    check(o, lse, q, k, v, None, window, what="NaN in the empty tile")
    assert np.all(o[..., 48:, :] == 0) and np.all(np.isneginf(lse[..., 48:]))


@pytest.mark.grid
def test_full_tiles_get_no_per_element_work(rng):
    """A tile the block mask lists as full is taken whole, mask_mod never asked: with a partial tile relisted as
    full, its keys all count (the dense result of the mask with that tile kept whole), not mask_mod's."""
    q, k, v = make_qkv(rng, (1, 1), 20, 48, d=D, dtype=np.float16)
    bm = tf.create_block_mask(sliding_window, 1, 1, 20, 48, block_q=64, block_k=16)
    assert bm.to_dense()[0, 0, 0].tolist() == [1, 1, 0] and bm.kv_indices[0, 0, 0, :2].tolist() == [0, 1]
    lists = {"kv_num_blocks": np.array([[[1]]]), "kv_indices": np.array([[[[1, 0, 0]]]]),
             "full_kv_num_blocks": np.array([[[1]]]), "full_kv_indices": np.array([[[[0, 0, 0]]]])}
    o, lse = flex(q, k, v, mask_mod=sliding_window, block_mask=replace(bm, **lists))
    kept = lambda b, h, q_idx, kv_idx: (kv_idx < 16) | sliding_window(b, h, q_idx, kv_idx)  # noqa: E731
    check(o, lse, q, k, v, None, kept, what="a partial tile listed as full")


@pytest.mark.grid
@pytest.mark.parametrize("which", ["softcap + block mask", "relative bias + documents"])
def test_bfloat16(rng, which):
    """bfloat16 (ml_dtypes' arrays): a softcap through a window's block mask, and a captured table (a relative bias)
    with captured document ids (constants of the kernel), causal."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v = make_qkv(rng, (2,), 37, 37, d=D, dtype=np.float32)
    q, k, v = (x.astype(ml_dtypes.bfloat16) for x in (q, k, v))
    if which == "softcap + block mask":
        score_mod, mask_mod, causal = variants.softcap(2.0), variants.sliding_window(9), False
        bm = tf.create_block_mask(mask_mod, 1, 1, 37, 37, block_q=64, block_k=16)
    else:
        score_mod = variants.relative_bias(rng.standard_normal((2, 9)).astype(np.float32))
        mask_mod, causal, bm = variants.document_mask(np.repeat(np.arange(3), [12, 9, 16])), True, None
    o, lse = flex(q, k, v, score_mod=score_mod, mask_mod=mask_mod, block_mask=bm, causal=causal)
    assert o.dtype == q.dtype
    check(o.astype(np.float32), lse, q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), score_mod,
          mask_mod, causal, dtype="bfloat16", what=f"bfloat16 {which}")


@pytest.mark.grid
def test_agrees_with_the_numpy_stages(rng):
    """The same functions through the NumPy stages (tinyflash.reference_attention in float64, naive_attention in
    float16): GQA, causal, a block mask broadcast over heads, ALiBi and a sliding window."""
    q, k, v = make_qkv(rng, (1, 4), 40, 40, d=D, dtype=np.float16)
    k, v = k[:, :2].copy(), v[:, :2].copy()
    score_mod, mask_mod = variants.alibi(4), variants.sliding_window(12)
    bm = tf.create_block_mask(mask_mod, 1, 1, 40, 40, block_q=64, block_k=16, causal=True)
    o, lse = flex(q, k, v, score_mod=score_mod, block_mask=bm, causal=True)
    mods = {"score_mod": score_mod, "mask_mod": mask_mod, "causal": True}
    ref_o, ref_lse = tf.reference_attention(q, k, v, **mods)
    assert_fa_rule(o, tf.naive_attention(q, k, v, **mods)[0], ref_o, np.float16, what="against the NumPy stages o")
    assert_close(lse, ref_lse, F32_TOL, "against the NumPy stages lse", is_lse=True)


def test_the_default_rule():
    """flex_attention runs v10 on compute capability 9.0 at its head dims, v6 elsewhere (and on the simulator)."""
    rule = lambda d, capability: VERSIONS.default("flex_attention", "bfloat16", d, d,  # noqa: E731
                                                  capability=capability).name
    assert [rule(d, (9, 0)) for d in (64, 128, 256)] == ["v10"] * 3
    assert rule(96, (9, 0)) == "v6" and rule(128, (8, 0)) == "v6" and rule(128, (10, 0)) == "v6"
    assert {name for name, v in VERSIONS.items() if v.flex} == {"v6", "v10"}


def test_tiling_for_block_mask():
    """v10's GPU tilings fitted to FlexAttention's default block mask (128 × 128) and smaller ones."""
    for d in (64, 128):
        cfg = tma_tiling.ping_pong_tiling(d)
        assert cfg.for_block_mask(128, 128) == cfg  # Br = Bc = 128: as it is
    fitted = tma_tiling.ping_pong_tiling(256).for_block_mask(128, 128)  # Bc = 80 does not divide 128
    assert fitted.BC == 64 and fitted.BR == 128
    small = tma_tiling.simulator_specialised_tiling(D).for_block_mask(64, 32)
    assert small.WARPGROUPS == 1 and small.BC == 16 and small.PRODUCER
    assert tma_tiling.ping_pong_tiling(128).for_block_mask(128, 24) is None  # no key tile of 16 divides 24


def test_bad_arguments_name_the_argument(rng, monkeypatch):
    """v10 takes d = 64, 128, 256 only; a block mask whose block_q no consumer warpgroup count divides: raised
    before any launch."""
    no_launch(monkeypatch)
    q, k, v = make_qkv(rng, (1,), 17, 17, d=16, dtype=np.float16)
    with pytest.raises(ValueError, match="supports d = dv"):
        flex(q, k, v, score_mod=softcap)
    q, k, v = make_qkv(rng, (1,), 40, 40, d=D, dtype=np.float16)
    bm = tf.create_block_mask(documents, 1, 1, 40, 40, block_q=32, block_k=16)
    with pytest.raises(ValueError, match="block_q = 32 must be a multiple"):
        flex(q, k, v, mask_mod=documents, block_mask=bm)
