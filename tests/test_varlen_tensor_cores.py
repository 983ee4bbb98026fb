"""tinyflash.varlen_attention on the tensor cores (one flex_attention launch over the packed row) at the simulator's
sizes: sequences of uneven lengths, an empty one, more keys than queries and fewer, causal per sequence, a
score_mod and a mask_mod that see the sequence's index and its own positions, grouped-query heads; the block mask
built from the offsets alone, checked tile by tile against the mask evaluated per element.

Results are checked against the NumPy stage on the same packed batch (``varlen_attention`` on float64 inputs):
o by FlashAttention's rule against the NumPy stage in float32 rounded to the input type, lse within F32_TOL.
"""

import math

import numpy as np
import pytest

import tinyflash as tf
from tinyflash.core.block_mask import EMPTY, FULL, PARTIAL
from tinyflash.core.packed import key_ranges, packed_tile_classes
from tinyflash.core.tolerance import F32_TOL, assert_close, assert_fa_rule, round_to

pytestmark = pytest.mark.simulator


def packed(rng, lengths_q, lengths_k, heads, kv_heads, d, dtype=np.float16):
    """q (total_q, H, d), k, v (total_k, H_kv, d) standard normal in ``dtype``, and the int32 offsets."""
    cu_q = np.concatenate([[0], np.cumsum(lengths_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lengths_k)]).astype(np.int32)
    q = rng.standard_normal((cu_q[-1], heads, d)).astype(dtype)
    k = rng.standard_normal((cu_k[-1], kv_heads, d)).astype(dtype)
    v = rng.standard_normal((cu_k[-1], kv_heads, d)).astype(dtype)
    return q, k, v, cu_q, cu_k


def check(o, lse, q, k, v, cu_q, cu_k, what, **kwargs):
    """o by FlashAttention's rule against the NumPy stage (float64 reference, float32 rounded to the input type)."""
    ref_o, ref_lse = tf.varlen_attention(*(x.astype(np.float64) for x in (q, k, v)), cu_q, cu_k, **kwargs)
    naive = round_to(tf.varlen_attention(*(x.astype(np.float32) for x in (q, k, v)), cu_q, cu_k, **kwargs)[0],
                     "float16")
    assert o.shape == ref_o.shape and o.dtype == q.dtype and lse.shape == ref_lse.shape
    assert_fa_rule(o.astype(np.float64), naive.astype(np.float64), ref_o, np.float16, what=f"{what} o")
    assert_close(lse, ref_lse, F32_TOL, f"{what} lse", is_lse=True)


def softcap(s, b, h, q_idx, kv_idx):
    return 2.0 * math.tanh(s / 2.0) + 0.125 * b  # b: the sequence's index, a bias per sequence


def local_window(b, h, q_idx, kv_idx):
    return abs(q_idx - kv_idx) <= 4 + b  # positions counted from the sequence's start; a window per sequence


@pytest.mark.smoke
def test_smoke_causal_sequences(rng):
    """The first tier's one run: three sequences (one without queries), causal, ragged 16 × 16 block-mask tiles."""
    q, k, v, cu_q, cu_k = packed(rng, [9, 0, 14], [12, 5, 14], heads=2, kv_heads=1, d=16)
    copies = [x.copy() for x in (q, k, v)]
    o, lse = tf.varlen_attention(q, k, v, cu_q, cu_k, causal=True, block_q=16, block_k=16)
    check(o, lse, q, k, v, cu_q, cu_k, "smoke", causal=True)
    assert all(np.array_equal(a, b) for a, b in zip((q, k, v), copies))  # inputs untouched


@pytest.mark.grid
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mods", ["score", "mask", "both"])
def test_mods_see_the_sequence(rng, causal, mods):
    """score_mod and mask_mod get b = the sequence's index and positions from its start, as on the NumPy stage."""
    q, k, v, cu_q, cu_k = packed(rng, [11, 6, 17], [7, 13, 17], heads=2, kv_heads=2, d=16)
    score_mod = softcap if mods in ("score", "both") else None
    mask_mod = local_window if mods in ("mask", "both") else None
    o, lse = tf.varlen_attention(q, k, v, cu_q, cu_k, causal=causal, score_mod=score_mod, mask_mod=mask_mod,
                                 block_q=16, block_k=16)
    check(o, lse, q, k, v, cu_q, cu_k, f"{mods} causal={causal}", causal=causal, score_mod=score_mod,
          mask_mod=mask_mod)


@pytest.mark.grid
def test_one_sequence_and_default_tiles(rng):
    """One sequence alone, causal, with the default 128 × 128 tiles: the same as flex_attention of that sequence."""
    q, k, v, cu_q, cu_k = packed(rng, [21], [30], heads=2, kv_heads=1, d=24)
    o, lse = tf.varlen_attention(q, k, v, cu_q, cu_k, causal=True)
    check(o, lse, q, k, v, cu_q, cu_k, "one sequence", causal=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_tile_classes_match_the_mask(rng, causal, masked):
    """packed_tile_classes against the mask evaluated per element: empty tiles keep nothing, full tiles all."""
    for _ in range(20):
        b = int(rng.integers(1, 6))
        cu_q = np.concatenate([[0], np.cumsum(rng.integers(0, 30, b))])
        cu_k = np.concatenate([[0], np.cumsum(rng.integers(0, 30, b))])
        if cu_q[-1] == 0 or cu_k[-1] == 0:
            continue
        bq, bk = int(rng.choice([4, 8, 16])), int(rng.choice([4, 8, 16]))
        lo, hi = key_ranges(cu_q, cu_k, causal)
        keep = (np.arange(cu_k[-1]) >= lo[:, None]) & (np.arange(cu_k[-1]) < hi[:, None])  # (total_q, total_k)
        dense = packed_tile_classes(cu_q, cu_k, causal, bq, bk, masked)[0, 0]
        for i, j in np.ndindex(dense.shape):
            tile = keep[i * bq:(i + 1) * bq, j * bk:(j + 1) * bk]
            want = EMPTY if not tile.any() else (FULL if tile.all() and not masked else PARTIAL)
            assert dense[i, j] == want, (cu_q, cu_k, bq, bk, i, j)


def test_key_ranges_per_sequence():
    """Bottom-right causal within each sequence; an empty sequence owns no query."""
    lo, hi = key_ranges(np.array([0, 5, 5, 13]), np.array([0, 7, 10, 19]), causal=True)
    assert list(lo) == [0] * 5 + [10] * 8
    assert list(hi) == [3, 4, 5, 6, 7] + list(range(12, 20))


def test_refusals_on_the_tensor_cores(rng):
    """16-bit inputs go to the tensor cores, which take no sinks and need a query and a key."""
    q, k, v, cu_q, cu_k = packed(rng, [3, 4], [5, 2], heads=2, kv_heads=1, d=16)
    with pytest.raises(ValueError, match="sinks are taken on the NumPy stage only"):
        tf.varlen_attention(q, k, v, cu_q, cu_k, sinks=np.ones(2, np.float32))
    with pytest.raises(ValueError, match="at least one query and one key"):
        tf.varlen_attention(q[:0], k, v, np.zeros(3, np.int32), cu_k)
    with pytest.raises(TypeError, match="q has dtype"):
        tf.varlen_attention(q.astype(np.int16), k, v, cu_q, cu_k)


def test_a_layout_is_planned_once():
    """The rules and block mask of a packed layout are kept: the same offsets, functions and tiles find them again;
    other offsets or another mask_mod get their own."""
    from tinyflash.forward.varlen_tensor_cores import packed_call

    cu_q, cu_k = np.array([0, 5, 12], np.int32), np.array([0, 7, 9], np.int32)
    first = packed_call(cu_q, cu_k, True, None, None, 16, 16)
    assert packed_call(cu_q.copy(), cu_k.copy(), True, None, None, 16, 16) is first
    assert packed_call(cu_q, np.array([0, 6, 9], np.int32), True, None, None, 16, 16) is not first
    other = packed_call(cu_q, cu_k, True, None, local_window, 16, 16)
    assert other is not first and other[1].mask_mod is not first[1].mask_mod
