"""Backward kernel v4 (warp-specialised: a producer warpgroup loading by TMA, consumers multiplying with wgmma)
at tiny sizes on numba's CUDA simulator, where TMA, the mbarriers, the named barrier and wgmma run through their
emulations (``gpu/tma_emulation.py``, ``gpu/wgmma_emulation.py``).

The simulator runs one Python thread per CUDA thread: the producer's warpgroup and one consumer warpgroup (256
threads), 64 keys and 64 query rows per tile, N <= 70; two tests with the GPU's two consumer warpgroups (384
threads), at its tilings for d = 64 (query tiles of 128 rows) and d = 128 (64 rows, at d = 64 here); dQ_i
added by TMA (the tiling's DQ_BY_TMA) at both head dims. Gradients
are checked against the float64 reference by FlashAttention's rule for gradients, with the helpers of
``test_backward_tensor_cores.py`` (v2's tests), and against v3's: the same products in the same order, so dk and
dv are the same bits. The GPU tests (``test_backward_warp_specialized_gpu.py``) take realistic sizes.
"""

from dataclasses import replace

import numpy as np
import pytest
from conftest import make_qkv
from test_backward_tensor_cores import check, check_bfloat16

import tinyflash as tf
from tinyflash.backward.kernels import VERSIONS
from tinyflash.backward.kernels import tma_tiling
from tinyflash.backward.kernels.tma_tiling import BackwardTmaTiling, default_tiling

pytestmark = [pytest.mark.simulator, pytest.mark.grid]


def problem(rng, lead_q, lead_kv, n_q, n_k, d, causal):
    """float16 q, k, v, do; the forward's o and lse."""
    q = make_qkv(rng, lead_q, n_q, n_q, d, dtype=np.float16)[0]
    _, k, v = make_qkv(rng, lead_kv, n_k, n_k, d, dtype=np.float16)
    do = rng.standard_normal(q.shape).astype(np.float16)
    o, lse = tf.naive_attention(q, k, v, causal=causal)
    return q, k, v, o, lse, do


def gradients(rng, lead_q, lead_kv, n_q, n_k, d, causal, **options):
    """v4's (dq, dk, dv) through tensor_core_attention_backward, or through cuda_attention_backward with
    ``options`` (a tiling), and the inputs."""
    q, k, v, o, lse, do = problem(rng, lead_q, lead_kv, n_q, n_k, d, causal)
    if options:
        return (q, k, v, do), tf.cuda_attention_backward(q, k, v, o, lse, do, causal=causal, kernel="v4", **options)
    return (q, k, v, do), tf.tensor_core_attention_backward(q, k, v, o, lse, do, causal=causal, kernel="v4")


@pytest.mark.parametrize("n_q, n_k, causal", [(20, 70, True), (1, 1, True)])
def test_lengths(rng, n_q, n_k, causal):
    """Ragged tiles (rows past Nq and keys past Nk land as zeros from TMA), Nq < Nk with the query tiles the
    diagonal skips (two key tiles), one row and one key; not causal: the tests with two consumer warpgroups."""
    inputs, grads = gradients(rng, (1,), (1,), n_q, n_k, 64, causal)
    check(inputs, grads, causal, f"v4 {n_q}x{n_k} causal={causal}")


def test_grouped_heads_wrap_the_ring_of_stages(rng):
    """Three query heads on one K/V head, one query tile each: three tiles through two stages and two dSᵀ
    buffers, so that stage 0 is refilled (its "empty" barrier's second phase) and buffer 0 reused; dk and dv are
    the sums over the group."""
    inputs, grads = gradients(rng, (3,), (1,), 20, 30, 64, True)
    check(inputs, grads, True, "v4 GQA 3/1")


# slow on the simulator (256 threads a block, four blocks): the order needs two heads of two key tiles each
def test_causal_blocks_longest_first(rng):
    """Causal over two K/V heads of two key tiles: the blocks take (head, key tile) in longest_first's order
    ((0, 0), (1, 0), (0, 1), (1, 1)), not the grid's; every gradient as the reference's."""
    inputs, grads = gradients(rng, (2,), (2,), 70, 70, 64, True)
    check(inputs, grads, True, "v4 causal, 2 K/V heads, longest first")


@pytest.mark.parametrize("tiles, kv_heads, head_mib", [(1, 1, 1), (32, 128, 4), (128, 32, 16), (7, 13, 3),
                                                       (5, 40, 9), (3, 1000, 0), (64, 6, 64)])
def test_longest_first_is_a_bijection_heavy_tiles_first(tiles, kv_heads, head_mib):
    """Every (K/V head, key tile) once; in each group of heads all of tile j before any of tile j + 1; the group's
    Q, dO and dQ within L2_SHARE_BYTES (or one head alone), twice as many heads not."""
    head_bytes = head_mib * 2**20
    order = [tuple(int(x) for x in tma_tiling.longest_first(b, tiles, kv_heads, head_bytes))
             for b in range(tiles * kv_heads)]
    assert sorted(order) == [(h, j) for h in range(kv_heads) for j in range(tiles)]
    group = next(i for i, (h, _) in enumerate(order + [(None, None)]) if h is None or h in {g for g, _ in order[:i]})
    assert group == 1 or group * head_bytes <= tma_tiling.L2_SHARE_BYTES  # the group shares the L2
    assert group == kv_heads or 2 * group * head_bytes > tma_tiling.L2_SHARE_BYTES  # and is as large as fits
    for start in range(0, kv_heads, group):
        blocks = order[start * tiles:(start + group) * tiles]
        assert [j for _, j in blocks] == sorted(j for _, j in blocks)  # tile 0 of the group's heads first
        assert {h for h, _ in blocks} == set(range(start, min(start + group, kv_heads)))


def test_agrees_with_v3(rng):
    """v3 and v4 issue the same multiplies in the same order (only who loads, and the barriers, differ): dk and dv
    are the same bits; dq, added by atomics, the same within rounding."""
    arrays = problem(rng, (1,), (1,), 40, 30, 64, True)
    dq3, dk3, dv3 = tf.tensor_core_attention_backward(*arrays, causal=True, kernel="v3")
    dq4, dk4, dv4 = tf.tensor_core_attention_backward(*arrays, causal=True, kernel="v4")
    assert np.array_equal(dk3, dk4) and np.array_equal(dv3, dv4)
    assert np.abs(dq4.astype(np.float32) - dq3).max() <= np.abs(dq3.astype(np.float32)).max() * 2.0**-9


def test_dq_by_tma_at_head_dim_128(rng, monkeypatch):
    """DQ_BY_TMA at d = 128: dQ_i stored in shared memory and added by the producer's second warp, four float32
    boxes a tile (rows past Nq left out of the adds); three query heads on one K/V head, so that the dQ buffer is
    written again after the writer says it has read it; two TMA boxes per Q_i, dO_i."""
    monkeypatch.setattr(tma_tiling, "simulator_tiling",
                        lambda d: BackwardTmaTiling(D=d, WARPGROUPS=1, DQ_BY_TMA=True).validate())
    inputs, grads = gradients(rng, (3,), (1,), 20, 30, 128, True)
    check(inputs, grads, True, "v4 d=128 dQ by TMA")


def test_two_consumer_warpgroups(rng):
    """The GPU's tiling (2 consumer warpgroups, Bc = 128) at d = 64: the warpgroups meet at the named barrier of
    256 threads for dSᵀ, each takes 32 of dQ_i's columns; the second warpgroup's keys are ragged."""
    cfg = BackwardTmaTiling(D=64, WARPGROUPS=2).validate()
    assert (cfg.BC, cfg.DQ_N, cfg.NT) == (128, 32, 384)
    inputs, grads = gradients(rng, (), (), 30, 90, 64, False, config=cfg)
    check(inputs, grads, False, "v4 2 consumer warpgroups")


@pytest.mark.parametrize("dq_by_tma", [False, True])
# slow on the simulator (384 threads a block): the GPU's tiling at d = 64, which no smaller tiling stands for
def test_query_tiles_of_128_rows(rng, dq_by_tma):
    """The GPU's tiling at d = 64: query tiles of 128 rows, the two consumer warpgroups splitting dQ_i's rows
    (each reads its 64-query half of dSᵀ); ragged on both sides, causal; dQ_i by atomics or by TMA."""
    cfg = replace(default_tiling(64), DQ_BY_TMA=dq_by_tma).validate()
    assert (cfg.BR, cfg.DQ_N, cfg.DQ_ROW_GROUPS) == (128, 64, 2)
    inputs, grads = gradients(rng, (), (), 70, 90, 64, True, config=cfg)
    check(inputs, grads, True, f"v4 Br=128 dq_by_tma={dq_by_tma}")


def test_bfloat16(rng):
    check_bfloat16(rng, "v4", 19, 70, True)


def test_deterministic_mode_is_refused(rng):
    q, k, v = make_qkv(rng, (), 5, 5, 64, dtype=np.float16)
    o, lse = tf.naive_attention(q, k, v)
    with pytest.raises(ValueError, match="deterministic=True needs kernel v2"):
        tf.tensor_core_attention_backward(q, k, v, o, lse, o, deterministic=True, kernel="v4")
    with pytest.raises(ValueError, match="backward kernel v4 .* has no deterministic mode"):
        tf.cuda_attention_backward(q, k, v, o, lse, o, kernel="v4", deterministic=True)


def test_registry_and_tilings():
    assert VERSIONS["v4"].signature is not None and VERSIONS["v4"].head_dims == (64, 128)
    assert VERSIONS["v4"].tilings[0](128) == default_tiling(128)
    for d in (64, 128):
        cfg = default_tiling(d)
        assert cfg.smem_bytes <= 227 * 1024 and (cfg.BC, cfg.NT, cfg.STAGES) == (128, 384, 2)
        assert 128 * (cfg.PRODUCER_REGISTERS + cfg.WARPGROUPS * cfg.CONSUMER_REGISTERS) <= 65536
    with pytest.raises(ValueError, match="a warpgroup for each 64 rows of dQ_i"):
        BackwardTmaTiling(D=64, WARPGROUPS=1, BR=128).validate()
    with pytest.raises(ValueError, match="STAGES must be 2, 3 or 4"):
        BackwardTmaTiling(D=64, WARPGROUPS=2, STAGES=5).validate()
    with pytest.raises(ValueError, match="must fit in 65536"):
        BackwardTmaTiling(D=64, WARPGROUPS=2, CONSUMER_REGISTERS=256).validate()


def test_no_queries(rng):
    """Nq = 0: no gradient reaches k or v (dk = dv = 0, every key row written); the producer loads nothing."""
    q, k, v = make_qkv(rng, (), 0, 5, 64, dtype=np.float16)
    o, lse = tf.naive_attention(q, k, v)
    dq, dk, dv = tf.tensor_core_attention_backward(q, k, v, o, lse, o, kernel="v4")
    assert dq.shape == (0, 64) and dk.shape == (5, 64) and not dk.any() and not dv.any()
