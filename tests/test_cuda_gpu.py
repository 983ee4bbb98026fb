"""Stage 2 on a real GPU at realistic sizes (``pytest -m gpu``; skipped without a GPU and CuPy).

Sizes from 1 to 4096 (ragged tiles everywhere but 128 and 4096), head dims 32, 64, 80 and 128,
causal and not, float32 and float16, against the float64 reference with the stage-1 rules;
every registered kernel version; plus determinism, CuPy, numba and PyTorch arrays in and out,
more than 65,535 heads and the >48 KiB shared-memory path; bfloat16 as PyTorch tensors on every version.
"""

import warnings

import numpy as np
import pytest
from conftest import make_qkv

import tinyflash as tf
from tinyflash.core.tolerance import F32_TOL, assert_close, assert_fa_rule, round_to
from tinyflash.forward.kernels import VERSIONS, tiling
from tinyflash.gpu.arrays import is_device_array
from tinyflash.hardware import STATIC_SMEM_PER_BLOCK

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def no_fallback():
    """On the GPU the fast tilings must get their shared memory: a fallback warning is a failure."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        yield


@pytest.mark.parametrize("n", [1, 17, 128, 1000, 4096])  # the sizes, the fastest-varying: consecutive cases
@pytest.mark.parametrize("causal", [False, True])  # share a compiled kernel (one per head dim and dtype), and
@pytest.mark.parametrize("d", [32, 64, 80, 128])  # benchmarks/gpu_tests.py splits the cases into runs of
@pytest.mark.parametrize("dtype", [np.float32, np.float16])  # consecutive ones
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


@pytest.mark.parametrize("kernel", [name for name, v in VERSIONS.items() if v.accepts(np.float32, 64, 80)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_every_version(rng, kernel, dtype):
    """Every registered version that takes d != dv (v1-v5; v6 in test_tensor_core_gpu.py), with its GPU
    tiling, at a ragged size with Nq != Nk."""
    q, k, v = make_qkv(rng, (2,), 777, 1000, d=64, d_v=80, dtype=dtype)
    for causal in (False, True):
        o, lse = tf.cuda_attention(q, k, v, causal=causal, kernel=kernel)
        ref_o, ref_lse = tf.reference_attention(q, k, v, causal=causal)
        if dtype == np.float16:
            assert_fa_rule(o, tf.naive_attention(q, k, v, causal=causal)[0], ref_o, np.float16, what=f"{kernel} o")
        else:
            assert_close(o, ref_o, F32_TOL, f"{kernel} o")
        assert_close(lse, ref_lse, F32_TOL, f"{kernel} lse", is_lse=True)


def bfloat16_tensors(torch, rng, lead, n_q, n_k, d, d_v=None):
    """q, k, v as PyTorch CUDA tensors of bfloat16, and the float32 values they hold (exactly)."""
    tensors = [torch.from_numpy(x).cuda().to(torch.bfloat16) for x in make_qkv(rng, lead, n_q, n_k, d, d_v, np.float32)]
    return tensors, [t.float().cpu().numpy() for t in tensors]


def check_bfloat16(o, lse, values, causal, what):
    """o by FlashAttention's rule (naive attention rounded to bfloat16 the baseline), lse within F32_TOL."""
    ref_o, ref_lse = tf.reference_attention(*values, causal=causal)
    naive = round_to(tf.naive_attention(*values, causal=causal)[0], "bfloat16")
    assert_fa_rule(o.float().cpu().numpy(), naive, ref_o, "bfloat16", what=f"{what} o")
    assert_close(lse.cpu().numpy(), ref_lse, F32_TOL, f"{what} lse", is_lse=True)


@pytest.mark.parametrize("kernel", [name for name, v in VERSIONS.items() if v.accepts(np.float32, 64, 80)])
def test_bfloat16_every_version(rng, kernel):
    """bfloat16 PyTorch tensors on every CUDA-core version (float32 arithmetic): d != dv, ragged, Nq != Nk."""
    torch = pytest.importorskip("torch")
    (q, k, v), values = bfloat16_tensors(torch, rng, (2,), 777, 1000, 64, 80)
    for causal in (False, True):
        o, lse = tf.cuda_attention(q, k, v, causal=causal, kernel=kernel)
        assert o.dtype == torch.bfloat16 and o.shape == (2, 777, 80) and lse.dtype == torch.float32
        check_bfloat16(o, lse, values, causal, f"{kernel} bfloat16")


@pytest.mark.parametrize("d", [8, 80, 256])
def test_bfloat16_head_dims_and_grouped_heads(rng, d):
    """bfloat16 at head dims the tensor cores do not take, 8 query heads on 2 K/V heads, causal."""
    torch = pytest.importorskip("torch")
    (q, _, _), q_values = bfloat16_tensors(torch, rng, (8,), 300, 1, d)
    (_, k, v), kv_values = bfloat16_tensors(torch, rng, (2,), 1, 513, d)
    o, lse = tf.cuda_attention(q, k, v, causal=True)
    check_bfloat16(o, lse, (q_values[0], *kv_values[1:]), True, f"d={d} GQA bfloat16")


def test_simple_kernel_with_head_dim_256(rng):
    """v1 with d = dv = 256 takes 64 KiB of shared memory: granted, not a driver error."""
    q, k, v = make_qkv(rng, (2,), 300, 300, d=256, dtype=np.float32)
    o, lse = tf.cuda_attention(q, k, v, causal=True, kernel="v1")
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=True)
    assert_close(o, ref_o, F32_TOL, "o")
    assert_close(lse, ref_lse, F32_TOL, "lse", is_lse=True)


def test_more_than_65535_heads(rng):
    """B × H = 70,000 > 65,535, CUDA's limit on blocks along y: launched in two slices."""
    q, k, v = make_qkv(rng, (70, 1000), 3, 5, d=8, dtype=np.float32)
    for kernel in ("v1", "v5"):
        o, lse = tf.cuda_attention(q, k, v, causal=True, kernel=kernel)
        ref_o, ref_lse = tf.reference_attention(q, k, v, causal=True)
        assert_close(o, ref_o, F32_TOL, f"{kernel} o")
        assert_close(lse, ref_lse, F32_TOL, f"{kernel} lse", is_lse=True)


def test_torch_in_torch_out(rng):
    """PyTorch CUDA tensors are read in place and the results are tensors on the same device;
    float64 is refused with the supported dtypes named."""
    torch = pytest.importorskip("torch")
    q, k, v = make_qkv(rng, (2, 3), 300, 257, d=64, dtype=np.float16)
    tq, tk, tv = (torch.from_numpy(x).cuda() for x in (q, k, v))
    tq_t = tq.transpose(-1, -2).contiguous().transpose(-1, -2)  # the same values, not contiguous
    o, lse = tf.cuda_attention(tq_t, tk, tv, causal=True)
    assert isinstance(o, torch.Tensor) and o.is_cuda and o.dtype == torch.float16 and o.shape == (2, 3, 300, 64)
    assert isinstance(lse, torch.Tensor) and lse.dtype == torch.float32 and lse.shape == (2, 3, 300)
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=True)
    assert_fa_rule(o.cpu().numpy(), tf.naive_attention(q, k, v, causal=True)[0], ref_o, np.float16, what="o")
    assert_close(lse.cpu().numpy(), ref_lse, F32_TOL, "lse", is_lse=True)
    for x, t in ((q, tq), (k, tk), (v, tv)):
        assert np.array_equal(t.cpu().numpy(), x)  # inputs untouched
    f64 = tq.to(torch.float64)
    with pytest.raises(TypeError, match="^q has dtype float64; expected one of float16, bfloat16, float32"):
        tf.cuda_attention(f64, f64, f64)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_deterministic(rng, dtype):
    """The same input twice gives bitwise identical outputs (no atomics, fixed summation order)."""
    import cupy

    q, k, v = (cupy.asarray(x) for x in make_qkv(rng, (1, 8), 2048, 2048, d=128, dtype=dtype))
    o1, lse1 = tf.cuda_attention(q, k, v, causal=True)
    o2, lse2 = tf.cuda_attention(q, k, v, causal=True)
    assert bool((o1 == o2).all()) and bool((lse1 == lse2).all())


@pytest.mark.smoke  # the GPU smoke tier: this entry point on device arrays
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
    assert is_device_array(o) and not isinstance(o, np.ndarray)
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
        assert tiling.default_config(d, d).smem_bytes > STATIC_SMEM_PER_BLOCK
    rng = np.random.default_rng()
    q, k, v = make_qkv(rng, (1,), 256, 256, d=128, dtype=np.float32)
    o, _ = tf.cuda_attention(q, k, v)  # the autouse fixture turns a fallback warning into an error
    assert_close(o, tf.reference_attention(q, k, v)[0], F32_TOL, "o")
