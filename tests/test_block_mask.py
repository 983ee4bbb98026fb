"""The block mask: its layout against a brute-force classification of every tile, and stage 1 with it.

Stage 1 must skip the tiles a mask empties (checked by the K and V bytes it reads, as the kernels will
load them) and give the same result with a block mask as without; a block mask that does not fit the
call is refused with a message naming the argument.
"""

import numpy as np
import pytest
from conftest import make_qkv
from test_mods import dense_attention, grids

import tinyflash as tf
from tinyflash.core.tolerance import assert_close

F64_TOL = 1e-12


def window(b, h, i, j):  # a sliding window that widens with the head and the batch
    return (j <= i + 3) & (i + 3 - j < 10 + 4 * h + 2 * b)


def brute_force(mask, B, H, n_q, n_k, Br, Bc, causal):
    """(B, H, Tr, Tc): 0 empty, 1 partial, 2 full, from the whole Nq × Nk mask."""
    b, h = np.arange(B).reshape(-1, 1, 1, 1), np.arange(H).reshape(1, -1, 1, 1)
    i, j = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
    keep = np.broadcast_to(mask(b, h, i, j) & ((j <= i + n_k - n_q) | (not causal)), (B, H, n_q, n_k))
    Tr, Tc = -(-n_q // Br), -(-n_k // Bc)
    dense = np.zeros((B, H, Tr, Tc), dtype=np.int8)
    for r in range(Tr):
        for c in range(Tc):
            tile = keep[..., r * Br:(r + 1) * Br, c * Bc:(c + 1) * Bc]
            dense[..., r, c] = np.where(tile.all(axis=(-2, -1)), 2, np.where(tile.any(axis=(-2, -1)), 1, 0))
    return dense


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k, Br, Bc", [(37, 45, 8, 16), (45, 37, 16, 8), (5, 70, 8, 8), (64, 64, 16, 16)])
def test_layout_against_brute_force(n_q, n_k, Br, Bc, causal):
    B, H = 2, 3
    bm = tf.create_block_mask(window, B, H, n_q, n_k, block_q=Br, block_k=Bc, causal=causal)
    want = brute_force(window, B, H, n_q, n_k, Br, Bc, causal)
    Tr, Tc = want.shape[-2:]
    assert np.array_equal(bm.to_dense(), want)
    assert bm.sparsity() == pytest.approx((want == 0).mean())
    assert bm.shape == (B, H, n_q, n_k) and (bm.block_q, bm.block_k) == (Br, Bc) and bm.causal == causal
    for lists, dense, (rows, cols) in (
            ((bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices), want, (Tr, Tc)),
            ((bm.q_num_blocks, bm.q_indices, bm.full_q_num_blocks, bm.full_q_indices), np.swapaxes(want, -1, -2),
             (Tc, Tr))):
        for num, idx, kind in ((lists[0], lists[1], 1), (lists[2], lists[3], 2)):
            assert num.dtype == np.int32 and idx.dtype == np.int32
            assert num.shape == (B, H, rows) and idx.shape == (B, H, rows, cols)
            for b, h, r in np.ndindex(B, H, rows):
                n = num[b, h, r]
                assert list(idx[b, h, r, :n]) == list(np.flatnonzero(dense[b, h, r] == kind))  # ascending
                assert not idx[b, h, r, n:].any()  # padded with zeros


def test_broadcast_over_batch_and_heads():
    """B = H = 1 serves a mask that depends on neither; a mask that depends on h gets one row per head."""
    causal_window = lambda b, h, i, j: (j <= i) & (i - j < 12)  # noqa: E731
    one = tf.create_block_mask(causal_window, 1, 1, 50, 50, block_q=8, block_k=8)
    assert np.array_equal(one.to_dense()[0, 0], brute_force(causal_window, 1, 1, 50, 50, 8, 8, False)[0, 0])
    per_head = tf.create_block_mask(window, 1, 3, 50, 50, block_q=8, block_k=8)
    dense = per_head.to_dense()
    assert not np.array_equal(dense[0, 0], dense[0, 2])  # wider windows, fewer empty tiles
    assert (dense[0, 2] == 0).sum() < (dense[0, 0] == 0).sum()


@pytest.mark.parametrize("causal", [False, True])
def test_stage_one_with_and_without_a_block_mask(rng, causal):
    """A given block mask, one built from mask_mod and the dense formula agree, forward and backward."""
    q, k, v = make_qkv(rng, (2, 3), 37, 45, d=4)
    b, h = grids((2, 3))
    keep = window(b, h, np.arange(37)[:, None], np.arange(45)[None, :])
    ref = dense_attention(q, k, v, keep=keep, causal=causal)
    bm = tf.create_block_mask(window, 2, 3, 37, 45, block_q=8, block_k=16, causal=causal)
    with_bm = tf.blocked_attention(q, k, v, block_mask=bm, causal=causal, block_q=8, block_k=16)
    built = tf.blocked_attention(q, k, v, mask_mod=window, causal=causal, block_q=8, block_k=16)
    assert all(np.array_equal(x, y) for x, y in zip(with_bm, built))
    assert_close(with_bm[0], ref[0], F64_TOL, "o")
    assert_close(with_bm[1], ref[1], F64_TOL, "lse", is_lse=True)
    do = rng.standard_normal(ref[0].shape)
    want = tf.naive_attention_backward(q, k, v, do, mask_mod=window, causal=causal)
    got = tf.blocked_attention_backward(q, k, v, *with_bm, do, block_mask=bm, causal=causal, block_q=8, block_k=16)
    for name, x, y in zip(("dq", "dk", "dv"), got, want):
        assert_close(x, y, F64_TOL, f"blocked {name} with a block mask vs naive")


def test_stage_one_reads_only_the_tiles_the_mask_keeps(rng):
    """K and V bytes read = the non-empty tiles' (any head): the empty ones are never loaded."""
    n_q, n_k, Br, Bc = 70, 90, 16, 16
    q, k, v = make_qkv(rng, (2,), n_q, n_k, d=4)
    io = tf.HBMCounter()
    mask = lambda b, h, i, j: (j <= i + 20) & (i + 20 - j < 40)  # noqa: E731
    tf.blocked_attention(q, k, v, mask_mod=mask, block_q=Br, block_k=Bc, io=io)
    dense = brute_force(mask, 1, 1, n_q, n_k, Br, Bc, False)[0, 0]  # (Tr, Tc)
    sizes = np.minimum(Bc, n_k - Bc * np.arange(dense.shape[1]))  # keys per key tile
    want = sum(int(sizes[j]) for i, j in zip(*np.nonzero(dense))) * 2 * 4 * 8  # 2 heads, d = 4, float64
    assert io.reads["K"] == want and io.reads["V"] == want
    assert (dense == 0).any() and (dense == 2).any() and (dense == 1).any()  # all three kinds occur


def test_partial_tiles_alone_evaluate_the_mask(rng):
    """mask_mod is called on the partial tiles only (besides building the block mask): a counting mask."""
    calls = []

    def mask(b, h, i, j):
        calls.append(np.broadcast_shapes(np.shape(i), np.shape(j)))
        return (j <= i + 4) & (i + 4 - j < 20)

    q, k, v = make_qkv(rng, (), 64, 68, d=4)
    bm = tf.create_block_mask(mask, 1, 1, 64, 68, block_q=8, block_k=8)
    calls.clear()
    tf.blocked_attention(q, k, v, block_mask=bm, block_q=8, block_k=8)
    assert len(calls) == int(bm.kv_num_blocks.sum()) and int(bm.full_kv_num_blocks.sum()) > 0


BAD_CALLS = [
    (dict(block_q=16), ValueError, "block_mask was built with block_q=8, block_k=8"),
    (dict(causal=True), ValueError, "block_mask was built with causal=False"),
    (dict(mask_mod=lambda b, h, i, j: True), ValueError, "mask_mod differs from the block_mask's own"),
    (dict(block_mask="mask"), TypeError, "block_mask must be a tinyflash.BlockMask"),
]


@pytest.mark.parametrize("kwargs, error, message", BAD_CALLS, ids=lambda x: str(x)[:30])
def test_a_block_mask_that_does_not_fit_the_call(rng, kwargs, error, message):
    q, k, v = make_qkv(rng, (2,), 20, 20, d=4)
    call = dict(block_mask=tf.create_block_mask(window, 1, 1, 20, 20, block_q=8, block_k=8), block_q=8, block_k=8)
    call.update(kwargs)
    with pytest.raises(error, match=message):
        tf.blocked_attention(q, k, v, **call)
    o, lse = tf.naive_attention(q, k, v)
    with pytest.raises(error, match=message):
        tf.blocked_attention_backward(q, k, v, o, lse, o, **call)


def test_a_block_mask_of_another_shape_is_refused(rng):
    q, k, v = make_qkv(rng, (2, 3), 20, 20, d=4)
    for shape in ((2, 3, 20, 21), (2, 2, 20, 20), (3, 1, 20, 20)):
        bm = tf.create_block_mask(window, *shape, block_q=8, block_k=8)
        with pytest.raises(ValueError, match=r"block_mask has shape \(B, H, Nq, Nk\)"):
            tf.blocked_attention(q, k, v, block_mask=bm, block_q=8, block_k=8)


def test_a_block_mask_broadcast_over_heads_needs_a_mask_that_ignores_them(rng):
    q, k, v = make_qkv(rng, (2, 3), 20, 20, d=4)
    with pytest.raises(ValueError, match="block_mask has H = 1, but mask_mod depends on h"):
        tf.blocked_attention(q, k, v, block_mask=tf.create_block_mask(window, 2, 1, 20, 20, block_q=8, block_k=8),
                             block_q=8, block_k=8)
    with pytest.raises(ValueError, match="block_mask has B = 1, but mask_mod depends on b"):
        tf.blocked_attention(q, k, v, block_mask=tf.create_block_mask(window, 1, 3, 20, 20, block_q=8, block_k=8),
                             block_q=8, block_k=8)
    causal_window = lambda b, h, i, j: (j <= i) & (i - j < 12)  # noqa: E731
    bm = tf.create_block_mask(causal_window, 1, 1, 20, 20, block_q=8, block_k=8)
    o, _ = tf.blocked_attention(q, k, v, block_mask=bm, block_q=8, block_k=8)
    assert_close(o, tf.naive_attention(q, k, v, mask_mod=causal_window)[0], F64_TOL, "o, a block mask for every head")


def test_partial_tiles_need_a_mask(rng):
    """A block mask without its mask_mod (built by hand) has partial tiles no rule can mask: refused."""
    from dataclasses import replace

    q, k, v = make_qkv(rng, (), 20, 20, d=4)
    bm = replace(tf.create_block_mask(window, 1, 1, 20, 20, block_q=8, block_k=8), mask_mod=None)
    with pytest.raises(ValueError, match="block_mask has partial tiles but neither mask_mod nor causal"):
        tf.blocked_attention(q, k, v, block_mask=bm, block_q=8, block_k=8)
    o, lse = tf.blocked_attention(q, k, v, block_mask=bm, mask_mod=window, block_q=8, block_k=8)
    assert_close(o, tf.naive_attention(q, k, v, mask_mod=window)[0], F64_TOL, "o")


@pytest.mark.parametrize("args, kwargs, error, message", [
    ((3, 1, 1, 8, 8), {}, TypeError, "mask_mod must be a callable"),
    ((window, 0, 1, 8, 8), {}, ValueError, "B must be a positive integer"),
    ((window, 1, 1, 8, 2.5), {}, TypeError, "Nk must be a positive integer"),
    ((window, 1, 1, 8, 8), dict(block_q=0), ValueError, "block_q must be a positive integer"),
    ((window, 1, 1, 8, 8), dict(causal=1), TypeError, "causal must be True or False"),
    ((lambda b, h, i: True, 1, 1, 8, 8), {}, TypeError, "mask_mod must take 4 positional arguments"),
])
def test_create_block_mask_bad_inputs(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        tf.create_block_mask(*args, **kwargs)


def test_causal_alone_and_no_mask():
    """mask_mod None: the causal rule's tiles, or every tile full."""
    causal = tf.create_block_mask(None, 1, 1, 40, 40, block_q=8, block_k=8, causal=True).to_dense()[0, 0]
    assert np.array_equal(causal, np.where(np.eye(5, dtype=bool), 1, np.tril(np.full((5, 5), 2))))
    assert tf.create_block_mask(None, 1, 1, 40, 40, block_q=8, block_k=8).sparsity() == 0.0


@pytest.mark.grid
@pytest.mark.parametrize("n_q, n_k", [(1, 1), (1, 100), (100, 1), (127, 129), (200, 150)])
@pytest.mark.parametrize("Br, Bc", [(1, 1), (16, 16), (33, 7), (128, 128), (256, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_grid_layout_and_stage_one(rng, n_q, n_k, Br, Bc, causal):
    bm = tf.create_block_mask(window, 2, 2, n_q, n_k, block_q=Br, block_k=Bc, causal=causal)
    assert np.array_equal(bm.to_dense(), brute_force(window, 2, 2, n_q, n_k, Br, Bc, causal))
    q, k, v = make_qkv(rng, (2, 2), n_q, n_k, d=3)
    b, h = grids((2, 2))
    ref = dense_attention(q, k, v, keep=window(b, h, np.arange(n_q)[:, None], np.arange(n_k)[None, :]), causal=causal)
    o, lse = tf.blocked_attention(q, k, v, block_mask=bm, causal=causal, block_q=Br, block_k=Bc)
    assert_close(o, ref[0], F64_TOL, "o")
    assert_close(lse, ref[1], F64_TOL, "lse", is_lse=True)
