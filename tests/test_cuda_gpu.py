"""Stage 2 on a real GPU at realistic sizes (``pytest -m gpu``; skipped without a GPU and CuPy).

Sizes from 1 to 4096 (ragged tiles everywhere but 128 and 4096), head dims 32, 64, 80 and 128,
causal and not, float32 and float16, against the float64 reference with the stage-1 rules;
plus determinism, device-array round trips and the >48 KiB shared-memory path.
"""

import warnings

import numpy as np
import pytest
from conftest import make_qkv

import tinyflash as tf
from tinyflash import cuda_kernel as ck
from tinyflash.testing import assert_close, assert_fa_rule

pytestmark = pytest.mark.gpu
F32_TOL = 1e-5


@pytest.fixture(autouse=True)
def no_fallback():
    """On the GPU the fast tilings must get their shared memory: a fallback warning is a failure."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        yield


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [32, 64, 80, 128])
@pytest.mark.parametrize("n", [1, 17, 128, 1000, 4096])
def test_against_reference(rng, n, d, causal, dtype):
    lead = (1, 2) if n >= 1000 else (2, 3)
    q, k, v = make_qkv(rng, lead, n, n, d=d, dtype=dtype)
    o, lse = tf.cuda_attention(q, k, v, causal=causal)
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=causal)
    assert o.dtype == dtype and o.shape == q.shape and lse.dtype == np.float32
    if dtype == np.float16:
        assert_fa_rule(o, tf.naive_attention(q, k, v, causal=causal)[0], ref_o, np.float16, what="o")
    else:
        assert_close(o, ref_o, F32_TOL, "o")
    assert_close(lse, ref_lse, F32_TOL, "lse", is_lse=True)


@pytest.mark.parametrize("n_q, n_k", [(1000, 17), (17, 1000), (300, 4096)])
@pytest.mark.parametrize("causal", [False, True])
def test_unequal_lengths(rng, n_q, n_k, causal):
    q, k, v = make_qkv(rng, (2,), n_q, n_k, d=64, d_v=96, dtype=np.float32)
    o, lse = tf.cuda_attention(q, k, v, causal=causal)
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=causal)
    assert_close(o, ref_o, F32_TOL, "o")
    assert_close(lse, ref_lse, F32_TOL, "lse", is_lse=True)


@pytest.mark.parametrize("d", [8, 200, 256])
def test_other_head_dims(rng, d):
    q, k, v = make_qkv(rng, (2,), 333, 333, d=d, dtype=np.float32)
    o, lse = tf.cuda_attention(q, k, v, causal=True)
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=True)
    assert_close(o, ref_o, F32_TOL, f"o d={d}")
    assert_close(lse, ref_lse, F32_TOL, f"lse d={d}", is_lse=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_simple_kernel(rng, dtype):
    q, k, v = make_qkv(rng, (2,), 777, 777, d=64, dtype=dtype)
    o, lse = tf.cuda_attention(q, k, v, causal=True, kernel="simple")
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=True)
    if dtype == np.float16:
        assert_fa_rule(o, tf.naive_attention(q, k, v, causal=True)[0], ref_o, np.float16, what="o")
    else:
        assert_close(o, ref_o, F32_TOL, "o")
    assert_close(lse, ref_lse, F32_TOL, "lse", is_lse=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_deterministic(rng, dtype):
    """The same input twice gives bitwise identical outputs (no atomics, fixed summation order)."""
    import cupy

    q, k, v = (cupy.asarray(x) for x in make_qkv(rng, (1, 8), 2048, 2048, d=128, dtype=dtype))
    o1, lse1 = tf.cuda_attention(q, k, v, causal=True)
    o2, lse2 = tf.cuda_attention(q, k, v, causal=True)
    assert bool((o1 == o2).all()) and bool((lse1 == lse2).all())


def test_cupy_in_cupy_out(rng):
    import cupy

    q, k, v = make_qkv(rng, (2, 3), 500, 400, d=64, dtype=np.float16)
    o, lse = tf.cuda_attention(cupy.asarray(q), cupy.asarray(k), cupy.asarray(v), causal=True)
    assert isinstance(o, cupy.ndarray) and isinstance(lse, cupy.ndarray) and o.shape == (2, 3, 500, 64)
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=True)
    assert_fa_rule(o.get(), tf.naive_attention(q, k, v, causal=True)[0], ref_o, np.float16, what="o")
    assert_close(lse.get(), ref_lse, F32_TOL, "lse", is_lse=True)


def test_non_contiguous_cupy_and_numba_device_arrays(rng):
    import cupy
    from numba import cuda

    q, k, v = make_qkv(rng, (2,), 300, 300, d=64, dtype=np.float32)
    qt = cupy.asarray(np.ascontiguousarray(np.swapaxes(q, 1, 2))).swapaxes(1, 2)  # a transposed view
    o, _ = tf.cuda_attention(qt, cupy.asarray(k), cupy.asarray(v))
    assert_close(o.get(), tf.reference_attention(q, k, v)[0], F32_TOL, "o, transposed CuPy q")
    o, lse = tf.cuda_attention(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v))
    assert ck._is_device_array(o) and not isinstance(o, np.ndarray)
    assert_close(o.copy_to_host(), tf.reference_attention(q, k, v)[0], F32_TOL, "o, numba arrays")


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_unaligned_device_views(rng, dtype):
    """Device views that start one element into their buffer (not 16-byte aligned) are copied
    before the kernel reads them 4 elements at a time; results stay right, inputs untouched."""
    import cupy
    from numba import cuda

    q, k, v = make_qkv(rng, (2,), 300, 300, d=64, dtype=dtype)

    def unaligned(x, lib):
        buf = lib.to_device(np.concatenate([np.ones(1, dtype), x.ravel()])) if lib is cuda else \
            cupy.asarray(np.concatenate([np.ones(1, dtype), x.ravel()]))
        view = buf[1:].reshape(x.shape)
        assert view.__cuda_array_interface__["data"][0] % 16 != 0
        return view

    ref_o = tf.reference_attention(q, k, v)[0]
    for lib in (cupy, cuda):
        dq, dk, dv = (unaligned(x, lib) for x in (q, k, v))
        o = tf.cuda_attention(dq, dk, dv)[0]
        o = o.get() if lib is cupy else o.copy_to_host()
        if dtype == np.float16:
            assert_fa_rule(o, tf.naive_attention(q, k, v)[0], ref_o, np.float16, what=f"o, {lib.__name__} views")
        else:
            assert_close(o, ref_o, F32_TOL, f"o, {lib.__name__} views")
        for x, dx in ((q, dq), (k, dk), (v, dv)):
            assert np.array_equal(cupy.asnumpy(dx) if lib is cupy else dx.copy_to_host(), x)


def test_large_shared_memory_is_granted():
    """The default tilings need more than 48 KiB; the driver must grant it (no fallback warning)."""
    for d in (64, 128, 256):
        assert ck.default_config(d, d).smem_bytes > ck.STATIC_SMEM_LIMIT
    rng = np.random.default_rng()
    q, k, v = make_qkv(rng, (1,), 256, 256, d=128, dtype=np.float32)
    o, _ = tf.cuda_attention(q, k, v)  # the autouse fixture turns a fallback warning into an error
    assert_close(o, tf.reference_attention(q, k, v)[0], F32_TOL, "o")
