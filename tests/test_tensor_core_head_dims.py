"""The tensor-core forward (v6) at head dims other than 64 and 128, on numba's CUDA simulator: every
multiple of 8 up to 256 runs on the tensor cores. Two things are new there, and each is tested here at
ragged sizes: a row's 16-byte pieces that do not divide the block's threads (d = 96: 12 pieces for 32
threads, so some threads wait and the last pass stops at the tile's rows), and a head dim that is not a
multiple of 32, padded with zero columns to DP in shared memory and in the fragments (d = 40 to 64,
d = 200 to 224), of which only d columns are written out. The decode kernel's head dims are in
test_decode_tensor_cores.py; on a GPU, test_tensor_core_gpu.py.
"""

import numpy as np
import pytest
from conftest import make_qkv
from test_tensor_core import bf16_attention, bf16_inputs, check, check_bf16

import tinyflash as tf
from tinyflash.forward.kernels import VERSIONS
from tinyflash.forward.kernels import tensor_core_tiling as tct
from tinyflash.hardware import H200

pytestmark = [pytest.mark.simulator, pytest.mark.grid]


@pytest.mark.parametrize("d", [32, 40, 96, 200, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims(rng, d, causal):
    """The simulator's tiling (one warp, 16 keys per tile), ragged on both sides; causal with Nq > Nk, rows
    that see no key (o = 0, lse = -inf)."""
    n_q, n_k = (33, 17) if causal else (20, 37)
    q, k, v = make_qkv(rng, (1,), n_q, n_k, d=d, dtype=np.float16)
    copies = [x.copy() for x in (q, k, v)]
    o, lse = tf.tensor_core_attention(q, k, v, causal=causal)
    assert o.shape == (1, n_q, d) and lse.shape == (1, n_q)
    check(o, lse, q, k, v, causal, f"v6 d={d} {n_q}x{n_k} causal={causal}")
    assert all(np.array_equal(x, c) for x, c in zip((q, k, v), copies))  # inputs untouched
    if causal:
        assert np.all(o[0, :n_q - n_k] == 0) and np.all(np.isneginf(lse[0, :n_q - n_k]))


@pytest.mark.parametrize("d, warps, row_tiles, q_in_smem", [
    (96, 2, 2, False),  # 64 threads, 12 pieces a row: 5 rows per pass, 4 threads wait; 16 keys in 4 passes (cut)
    (96, 2, 1, True),  # Q_i read from shared memory, 6 mma steps over d in 3 pairs
    (200, 2, 1, True),  # padded to 224: 28 pieces a row, 2 rows per pass; the padding read as Q_i's operands
])
def test_head_dims_more_warps(rng, d, warps, row_tiles, q_in_smem):
    """Two warps, so that the threads of a pass reach past the rows of a tile: causal, ragged, two heads."""
    cfg = tct.TensorCoreTiling(D=d, WARPS=warps, BC=16, ROW_TILES=row_tiles, Q_IN_SMEM=q_in_smem).validate()
    q, k, v = make_qkv(rng, (2,), 45, 40, d=d, dtype=np.float16)
    o, lse = tf.cuda_attention(q, k, v, causal=True, kernel="v6", config=cfg)
    check(o, lse, q, k, v, True, f"v6 {cfg}")


def test_grouped_heads_at_d_96(rng):
    """Grouped-query attention (4 query heads on 2 K/V heads) at d = 96."""
    q = rng.standard_normal((4, 23, 96)).astype(np.float16)
    k, v = (rng.standard_normal((2, 31, 96)).astype(np.float16) for _ in range(2))
    o, lse = tf.tensor_core_attention(q, k, v, causal=True)
    check(o, lse, q, k, v, True, "v6 GQA d=96")


@pytest.mark.parametrize("d", [40, 96])
def test_bfloat16_head_dims(rng, d):
    q, k, v = bf16_inputs(rng, 21, 30, d)
    o, lse = bf16_attention(q, k, v, True, config=tct.simulator_tiling(d))
    check_bf16(o, lse, q, k, v, True)


def test_default_tilings_at_every_head_dim():
    """Every multiple of 8 up to 256 has a valid default tiling that fits one block's shared memory on an H200:
    up to DP = 64 d = 64's, up to DP = 128 d = 128's, past it one row tile per warp with Q_i in shared memory
    (two row tiles' accumulators, DP / 2 · 8 registers, would not fit in 255)."""
    assert VERSIONS["v6"].head_dims == tuple(range(8, 257, 8))
    for d in VERSIONS["v6"].head_dims:
        for causal, n in ((False, 16384), (True, 1024), (True, 16384)):
            cfg = tct.default_tiling(d, causal, n)
            assert cfg.D == d and cfg.DP % 32 == 0 and d <= cfg.DP < d + 32 and cfg.smem_bytes <= H200.smem_per_block
            like = 64 if cfg.DP <= 64 else 128 if cfg.DP <= 128 else None
            if like:
                measured = tct.default_tiling(like, causal, n)
                assert (cfg.WARPS, cfg.BC, cfg.ROW_TILES, cfg.Q_IN_SMEM, cfg.LAZY_RESCALE) == (
                    measured.WARPS, measured.BC, measured.ROW_TILES, measured.Q_IN_SMEM, measured.LAZY_RESCALE)
            else:
                assert cfg.ROW_TILES == 1 and cfg.Q_IN_SMEM and cfg.WARPS == 8
