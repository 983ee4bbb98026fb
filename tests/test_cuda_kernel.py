"""Stage 2, the numba.cuda kernels, at tiny sizes: on numba's CUDA simulator without a GPU.

The simulator runs one Python thread per CUDA thread, so these tests use tiny tiles
(simulator_config: 8 × 8 tiles, 16 threads) and N <= 48; on a machine with a GPU they run there.
Each test compares against stage 1 (blocked_attention) and the float64 reference.
"""

import warnings

import numpy as np
import pytest
from conftest import HAS_GPU, make_qkv

import tinyflash as tf
from tinyflash import cuda_kernel as ck
from tinyflash.testing import assert_close, assert_fa_rule

pytestmark = pytest.mark.simulator
F32_TOL = 1e-5
SHAPES = [(1, 1), (7, 7), (8, 8), (9, 17), (17, 9), (48, 48), (33, 20), (20, 33)]


def check_against_stages(o, lse, q, k, v, causal, what):
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=causal)
    blk_o, blk_lse = tf.blocked_attention(q, k, v, causal=causal, block_q=8, block_k=8)
    if q.dtype == np.float16:
        naive_o = tf.naive_attention(q, k, v, causal=causal)[0]
        assert_fa_rule(o, naive_o, ref_o, np.float16, what=f"{what} o vs reference")
        assert_fa_rule(o, blk_o, ref_o, np.float16, what=f"{what} o vs stage 1")
    else:
        assert_close(o, ref_o, F32_TOL, f"{what} o vs reference")
        assert_close(o, blk_o, F32_TOL, f"{what} o vs stage 1")
    assert_close(lse, ref_lse, F32_TOL, f"{what} lse vs reference", is_lse=True)
    assert_close(lse, blk_lse, F32_TOL, f"{what} lse vs stage 1", is_lse=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k", SHAPES)
def test_fast_kernel_lengths(rng, n_q, n_k, causal):
    """Ragged tiles (N not a multiple of 8), Nq != Nk, causal: the fast kernel against stage 1."""
    q, k, v = make_qkv(rng, (2,), n_q, n_k, d=8, d_v=5, dtype=np.float32)
    o, lse = tf.cuda_attention(q, k, v, causal=causal)
    assert o.shape == (2, n_q, 5) and o.dtype == np.float32 and lse.dtype == np.float32
    check_against_stages(o, lse, q, k, v, causal, "fast")


@pytest.mark.parametrize("d, d_v", [(1, 1), (5, 16), (16, 3), (13, 24)])
@pytest.mark.parametrize("causal", [False, True])
def test_fast_kernel_head_dims(rng, d, d_v, causal):
    """Head dims that need padding (d not a multiple of 8, dv not of 16)."""
    q, k, v = make_qkv(rng, (), 19, 26, d=d, d_v=d_v, dtype=np.float32)
    o, lse = tf.cuda_attention(q, k, v, causal=causal)
    check_against_stages(o, lse, q, k, v, causal, f"d={d} dv={d_v}")


@pytest.mark.parametrize("lead", [(), (2,), (2, 3)])
def test_fast_kernel_leading_dims_float16(rng, lead):
    """float16 in memory, float32 arithmetic, float16 out; FlashAttention's 2x rule."""
    q, k, v = make_qkv(rng, lead, 23, 17, d=16, dtype=np.float16)
    o, lse = tf.cuda_attention(q, k, v, causal=True)
    assert o.dtype == np.float16 and o.shape == (*lead, 23, 16) and lse.shape == (*lead, 23)
    check_against_stages(o, lse, q, k, v, True, "float16")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k, dtype", [(17, 9, np.float32), (9, 40, np.float32), (24, 24, np.float16)])
def test_simple_kernel(rng, n_q, n_k, dtype, causal):
    """Version 1 (one thread per query row) computes the same thing."""
    q, k, v = make_qkv(rng, (2,), n_q, n_k, d=8, d_v=5, dtype=dtype)
    o, lse = tf.cuda_attention(q, k, v, causal=causal, kernel="simple")
    check_against_stages(o, lse, q, k, v, causal, "simple")


def test_config_with_several_rows_per_thread_and_a_ragged_last_tile(rng):
    """A tiling shaped like the GPU one (TM = 4 rows per thread, strided keys), still small."""
    cfg = ck.TileConfig(BR=16, BC=16, TM=4, NT=16, D=8, DV=16)
    q, k, v = make_qkv(rng, (), 37, 45, d=8, d_v=10, dtype=np.float32)
    for causal in (False, True):
        o, lse = tf.cuda_attention(q, k, v, causal=causal, config=cfg)
        check_against_stages(o, lse, q, k, v, causal, "TM=4")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_config_with_fewer_tile_rows_than_a_load_step(rng, dtype):
    """128 threads load an 8-wide K_j 16 rows at a time (float16, 4 elements per thread: 64
    rows), but the tile has only 8 rows: the fast (full-tile) load path must not be taken. Here
    V_j (dv = 64) is full too, so both take it together unless the tile shape is checked."""
    cfg = ck.TileConfig(BR=16, BC=8, TM=1, NT=128, D=8, DV=64)
    q, k, v = make_qkv(rng, (), 20, 33, d=8, d_v=64, dtype=dtype)
    o, lse = tf.cuda_attention(q, k, v, config=cfg)
    check_against_stages(o, lse, q, k, v, False, "BC=8, NT=128")


def test_fully_masked_rows(rng):
    q, k, v = make_qkv(rng, (), 12, 5, d=8, dtype=np.float32)
    for kernel in ("fast", "simple"):
        o, lse = tf.cuda_attention(q, k, v, causal=True, kernel=kernel)
        assert np.all(o[:7] == 0) and np.all(np.isneginf(lse[:7]))  # rows 0..6 may attend no key
        assert np.isfinite(lse[7:]).all()


def test_empty_queries(rng):
    q, k, v = make_qkv(rng, (2,), 0, 5, d=8, dtype=np.float16)
    o, lse = tf.cuda_attention(q, k, v)
    assert o.shape == (2, 0, 8) and o.dtype == np.float16 and lse.shape == (2, 0) and lse.dtype == np.float32


def test_inputs_unmodified_and_non_contiguous(rng):
    base = rng.standard_normal((2, 8, 30)).astype(np.float32)
    q = np.swapaxes(base, 1, 2)  # (2, 30, 8) transposed view
    k = rng.standard_normal((2, 60, 8)).astype(np.float32)[:, ::2]  # every other row
    v = rng.standard_normal((2, 30, 8)).astype(np.float32)
    copies = [x.copy() for x in (q, k, v)]
    o, lse = tf.cuda_attention(q, k, v, causal=True)
    for x, c in zip((q, k, v), copies):
        assert np.array_equal(x, c)
    check_against_stages(o, lse, q, k, v, True, "non-contiguous")


def test_nan_propagates(rng):
    q, k, v = make_qkv(rng, (), 20, 20, d=8, dtype=np.float32)
    q[3, 0] = np.nan
    o, lse = tf.cuda_attention(q, k, v)
    assert np.isnan(o[3]).all() and np.isnan(lse[3])
    assert np.isfinite(np.delete(o, 3, axis=0)).all()


def test_huge_logits(rng):
    q, k, v = make_qkv(rng, (), 30, 30, d=16, dtype=np.float32)
    q *= 50.0
    k *= 50.0
    o, lse = tf.cuda_attention(q, k, v, causal=True)
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=True)
    assert np.abs(ref_lse).max() > 3e3 and np.isfinite(o).all()
    # float32 knows scores of size |S| only to about eps·|S| (here ~1e-3 absolute), and a softmax passes
    # that absolute error on as a relative error of its weights: the output can be no better.
    assert_close(o, ref_o, 4 * np.finfo(np.float32).eps * float(np.abs(ref_lse).max()), "o")
    assert_close(lse, ref_lse, F32_TOL, "lse", is_lse=True)


def test_device_arrays_stay_on_the_device(rng):
    """numba device arrays in, numba device arrays out (no copy to the host in between)."""
    from numba import cuda

    q, k, v = make_qkv(rng, (2,), 11, 13, d=8, dtype=np.float32)
    o, lse = tf.cuda_attention(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v))
    assert ck._is_device_array(o) and ck._is_device_array(lse) and not isinstance(o, np.ndarray)
    assert o.shape == (2, 11, 8) and lse.shape == (2, 11)
    check_against_stages(o.copy_to_host(), lse.copy_to_host(), q, k, v, False, "device arrays")


def test_shared_memory_fallback_warns_and_stays_correct(rng, monkeypatch):
    """If the driver refuses more than 48 KiB of shared memory, a smaller tiling is used, with a warning."""
    def refuse(kernel, args, nbytes):
        raise RuntimeError("refused for the test")

    monkeypatch.setattr(ck, "allow_large_shared_memory", refuse)
    q, k, v = make_qkv(rng, (), 20, 20, d=8, dtype=np.float32)
    with pytest.warns(RuntimeWarning, match="falling back to the slower tiling"):
        o, lse = tf.cuda_attention(q, k, v, config=ck.TileConfig(BR=8, BC=8, TM=2, NT=16, D=8, DV=16))
    check_against_stages(o, lse, q, k, v, False, "fallback")


# ---- configuration and errors (no kernel launch) ----------------------------------------------


def test_tile_configs_fit_the_hardware():
    for d in range(1, 257, 7):
        assert ck.small_config(d, d).smem_bytes <= 48 * 1024
        cfg = ck.default_config(d, d)
        assert cfg.D >= d and cfg.DV >= d and cfg.smem_bytes <= 227 * 1024  # Hopper's per-block maximum
    with pytest.raises(ValueError, match="invalid tile configuration"):
        ck.TileConfig(BR=64, BC=64, TM=8, NT=96, D=64, DV=64).validate()


def test_vector_width():
    """float16 tiles are read 4 elements (8 bytes) per thread and load, float32 ones 1 (README)."""
    assert ck.vector_width(np.float16) == 4 and ck.vector_width(np.float32) == 1
    with pytest.raises(ValueError, match="vector must be 1 or 4; got 2"):
        ck.make_kernel(ck.simulator_config(8, 8), 2)


def test_bad_inputs():
    x = np.ones((4, 8), np.float32)
    with pytest.raises(TypeError, match="q has dtype float64; expected one of float16, float32"):
        tf.cuda_attention(x.astype(np.float64), x.astype(np.float64), x.astype(np.float64))
    big = np.ones((4, 257), np.float32)
    with pytest.raises(ValueError, match="head dims up to 256; got d .* = 257"):
        tf.cuda_attention(big, big, big)
    with pytest.raises(ValueError, match="head dims up to 256; got dv"):
        tf.cuda_attention(x, x, np.ones((4, 300), np.float32))
    with pytest.raises(ValueError, match="kernel must be 'fast' or 'simple'; got 'fastest'"):
        tf.cuda_attention(x, x, x, kernel="fastest")
    with pytest.raises(ValueError, match="same head dimension"):
        tf.cuda_attention(x, x[:, :4], x)
    with pytest.raises(ValueError, match="at least one key"):
        tf.cuda_attention(x, x[:0], x[:0])
    with pytest.raises(TypeError, match="causal must be True or False"):
        tf.cuda_attention(x, x, x, causal="yes")
    with pytest.raises(ValueError, match="too small for d=8"):
        tf.cuda_attention(x, x, x, config=ck.TileConfig(BR=8, BC=8, TM=2, NT=16, D=0, DV=16))


def test_mixed_host_and_device_arrays():
    from numba import cuda

    x = np.ones((4, 8), np.float32)
    with pytest.raises(TypeError, match="all be device arrays or all host arrays"):
        tf.cuda_attention(cuda.to_device(x), x, x)


def test_numpy_25_is_refused_with_a_clear_message(monkeypatch):
    monkeypatch.setattr(np, "__version__", "2.5.2")
    monkeypatch.delattr(np, "row_stack", raising=False)
    with pytest.raises(ImportError, match=r"needs numpy < 2.5 .*pip install 'numpy<2.5'"):
        ck._check_numpy_for_numba_cuda()


def test_simulator_flag_matches_the_machine():
    assert ck.simulator_enabled() == (not HAS_GPU)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ck.default_config(64, 64).BC == 128
