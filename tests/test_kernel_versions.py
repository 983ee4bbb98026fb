"""Every registered kernel version once, and every entry point once: the first tier's proof that each kernel runs
and computes attention exactly (within the project's tolerance), on numba's CUDA simulator without a GPU.

``python -m pytest`` runs these; the other kernel tests are the exhaustive grid (every size, head dim, dtype and
tiling, each kernel's own corner cases), which ``python -m pytest --grid`` adds. The tests iterate over the
registries (``VERSIONS`` of the forward, the backward and decoding), so a new version gets its test here without
an edit. Each version runs once, at the smallest size that still exercises its tiles:

* ragged: on the simulator 37 queries and 20 keys fill no tile of any version; on a GPU, 300 and 203 fill
  several, the last of each in part;
* causal with Nq > Nk: the first rows see no key (o = 0, lse = -inf), a query tile skips key tiles;
* grouped-query heads where the version takes them: 2 query heads on 1 K/V head.

On a GPU, ``python -m pytest -m smoke`` runs these with the GPU's tilings, and the few GPU tests marked smoke
beside them (the entry points on CuPy and PyTorch arrays): the GPU smoke tier (``benchmarks/gpu_tests.py --smoke``).

The CUDA-core versions run float32 at d = 8 (dv = 5 where they take dv != d); the tensor-core versions float16
at d = 64; the FP8 versions (e4m3 inputs, ``hopper_fp8_attention``) at d = 128, the least they take, checked
against ``fp8_attention`` and float64 by ``test_hopper_fp8.check_against_both``. Results are compared with the float64 reference and with the stage before (stage 1,
``blocked_attention`` and its backward; NumPy split-KV for decoding): float32 within F32_TOL, 16-bit results
by FlashAttention's rule against naive attention in the same precision.
"""

import numpy as np
import pytest
from conftest import make_qkv
from test_backward_kernel import check_against_stages as check_backward_against_stages
from test_backward_tensor_cores import check as check_16_bit_gradients
from test_cuda_kernel import check_against_stages as check_forward_against_stages

import tinyflash as tf
from tinyflash.backward.kernels import VERSIONS as BACKWARD
from tinyflash.core.tolerance import F32_TOL, assert_close
from tinyflash.decode.cuda import prepare_paged, prepare_split_kv
from tinyflash.decode.kernels import VERSIONS as DECODE
from tinyflash.forward.kernels import FP8_VERSIONS
from tinyflash.forward.kernels import VERSIONS as FORWARD
from tinyflash.gpu import arrays
from tinyflash.gpu.runtime import UnsupportedGPUError, simulator_enabled

pytestmark = [pytest.mark.simulator, pytest.mark.smoke]
# ragged for every tiling, the simulator's (tiles of 8 to 64 rows, 8 or 16 keys: one or a few) or a GPU's (up to
# 128 rows and 128 keys at these head dims: several); causal, rows 0 .. Nq - Nk - 1 see no key
N_Q, N_K = (37, 20) if simulator_enabled() else (300, 203)


# each version's own tests, which --grid runs too (on the simulator, at more sizes than these): what a version's run
# here repeats in the exhaustive grid
OWN_TESTS = ("tests/test_cuda_kernel.py (v1-v5), tests/test_tensor_core.py (v6), tests/test_hopper.py (v7-v10), "
             "tests/test_hopper_fp8.py (v11), tests/test_backward_kernel.py, test_backward_tensor_cores.py, "
             "test_backward_wgmma.py, test_backward_warp_specialized.py (backward v1-v4), tests/test_decode_kernels.py "
             "and test_decode_tensor_cores.py (decoding)")


@pytest.fixture(autouse=True)
def once_in_the_grid(request):
    """With --grid on the simulator, a version's run here is left to its own tests (OWN_TESTS), which the grid runs
    at more sizes: both would take minutes of CI's 15. The first tier (without --grid) and a GPU run these."""
    versions = ("test_forward_version", "test_backward_version", "test_decode_kernel")
    if request.config.getoption("grid") and simulator_enabled() and request.node.originalname in versions:
        pytest.skip(f"with --grid on the simulator, each version runs in its own tests: {OWN_TESTS}")


def shape_of(takes_float32: bool, takes_dv_apart: bool):
    """(dtype, d, dv) of a version's test: float32 at d = 8 where it takes float32 (dv = 5 where it takes
    dv != d), else float16 at d = 64."""
    if not takes_float32:
        return np.float16, 64, 64
    return np.float32, 8, (5 if takes_dv_apart else 8)


def run_or_skip(call):
    """``call()``, or a skip that names why this GPU cannot run it (the Hopper kernels off Hopper)."""
    try:
        return call()
    except UnsupportedGPUError as error:
        pytest.skip(str(error))


def grouped(rng, n_q, n_k, d, d_v, dtype, kv_heads=1, group=2):
    """q (kv_heads·group, Nq, d), k (kv_heads, Nk, d), v (kv_heads, Nk, dv): ``group`` query heads per K/V head."""
    q = make_qkv(rng, (kv_heads * group,), n_q, n_q, d, d_v, dtype)[0]
    _, k, v = make_qkv(rng, (kv_heads,), n_k, n_k, d, d_v, dtype)
    return q, k, v


@pytest.mark.parametrize("name", list(FORWARD))
def test_forward_version(rng, name):
    """cuda_attention(kernel=name): ragged, causal, 2 query heads on 1 K/V head; o and lse against the float64
    reference and against stage 1."""
    version = FORWARD[name]
    if name in FP8_VERSIONS:
        return check_fp8_version(rng, name)
    dtype, d, d_v = shape_of(version.accepts(np.float32, 8, 8), version.accepts(np.float32, 8, 5))
    assert version.accepts(dtype, d, d_v)
    q, k, v = grouped(rng, N_Q, N_K, d, d_v, dtype)
    o, lse = run_or_skip(lambda: tf.cuda_attention(q, k, v, causal=True, kernel=name))
    assert o.shape == (2, N_Q, d_v) and o.dtype == dtype and lse.shape == (2, N_Q) and lse.dtype == np.float32
    check_forward_against_stages(o, lse, q, k, v, True, name)
    assert np.all(o[:, :N_Q - N_K] == 0) and np.all(np.isneginf(lse[:, :N_Q - N_K]))


def check_fp8_version(rng, name):
    """An FP8 version through hopper_fp8_attention(kernel=name): e4m3 inputs with descales per head, d = 128,
    ragged, causal, 2 query heads on 1 K/V head."""
    from test_hopper_fp8 import check_against_both, fp8_inputs

    x = fp8_inputs(rng, (2,), (1,), N_Q, N_K, 128, "head")
    o, lse = run_or_skip(lambda: tf.hopper_fp8_attention(*x, causal=True, kernel=name))
    check_against_both(x, o, lse, True, name)
    assert np.all(o[:, :N_Q - N_K].astype(np.float32) == 0) and np.all(np.isneginf(lse[:, :N_Q - N_K]))


@pytest.mark.parametrize("name", list(BACKWARD))
def test_backward_version(rng, name):
    """The backward kernel ``name``: ragged, causal; dq, dk, dv against the float64 reference and (float32)
    against stage 1. The 16-bit kernels through tensor_core_attention_backward, with 2 query heads on 1 K/V
    head (dk, dv summed over the group); the float32 one through cuda_attention_backward, one K/V head per
    query head (the only layout it takes)."""
    version = BACKWARD[name]
    takes_float32 = np.dtype(np.float32) in version.dtypes
    dtype, d, d_v = shape_of(takes_float32, version.head_dims is None)
    if takes_float32:
        q, k, v = make_qkv(rng, (2,), N_Q, N_K, d, d_v, dtype)
        do = rng.standard_normal((2, N_Q, d_v)).astype(dtype)  # (H, Nq, dv)
        o, lse = tf.naive_attention(q, k, v, causal=True)
        grads = run_or_skip(lambda: tf.cuda_attention_backward(q, k, v, o, lse, do, causal=True, kernel=name))
        check_backward_against_stages(grads, q, k, v, o, lse, do, True, f"backward {name}")
        return
    q, k, v = grouped(rng, N_Q, N_K, d, d_v, dtype)
    do = rng.standard_normal(q.shape).astype(dtype)  # (H, Nq, dv)
    o, lse = tf.naive_attention(q, k, v, causal=True)
    grads = run_or_skip(lambda: tf.tensor_core_attention_backward(q, k, v, o, lse, do, causal=True, kernel=name))
    check_16_bit_gradients((q, k, v, do), grads, True, f"backward {name}")


def check_decode(o, lse, q, k, v, num_splits, what):
    """o and lse against the float64 reference and against NumPy split-KV on the same splits (stage 1 of
    decoding): float32 within F32_TOL; float16 by FlashAttention's rule."""
    from test_decode_kernels import check

    check(o, lse, q, k, v, True, what)
    o_np, lse_np = tf.split_kv_attention(q, k, v, num_splits=num_splits, causal=True)
    if q.dtype == np.float32:
        assert_close(o, o_np, F32_TOL, f"{what} o vs NumPy split-KV")
    assert_close(lse, lse_np, F32_TOL, f"{what} lse vs NumPy split-KV", is_lse=True)


@pytest.mark.parametrize("name", list(DECODE))
def test_decode_kernel(rng, name):
    """The split kernel ``name`` and the combine kernel: 2 queries (causal, as in speculative decoding), Nk keys
    in 3 splits (ragged), 2 query heads on 1 K/V head; then a batch of 2 on a paged cache of pages of 4 tokens,
    the second sequence shorter."""
    kernel = DECODE[name]
    dtype, d, _ = shape_of("float32" in kernel.dtypes, False)
    assert kernel.accepts(np.dtype(dtype), d, d)
    n_q, splits = 2, 3
    q = rng.standard_normal((2, 2, n_q, d)).astype(dtype)  # (B, H, Nq, d)
    k, v = (rng.standard_normal((2, 1, N_K, d)).astype(dtype) for _ in range(2))  # (B, H_kv, Nk, d)
    run, o, lse, prob = run_or_skip(lambda: prepare_split_kv(q[:1], k[:1], v[:1], num_splits=splits, causal=True,
                                                             kernel=name))
    run()
    o, lse = arrays.result(o, prob.out_shape, True), arrays.result(lse, prob.lse_shape, True)
    assert o.shape == q[:1].shape and o.dtype == dtype and lse.shape == q[:1].shape[:-1]
    check_decode(o, lse, q[:1], k[:1], v[:1], splits, f"decode {name}")
    lens = [N_K, 7]
    cache = tf.to_paged(k, v, lens, page_size=4, rng=rng)
    run, o, lse, prob = prepare_paged(q, cache, num_splits=2, causal=True, kernel=name)
    run()
    o, lse = arrays.result(o, prob.out_shape, True), arrays.result(lse, prob.lse_shape, True)
    for b, n in enumerate(lens):
        check_decode(o[b], lse[b], q[b], k[b, :, :n], v[b, :, :n], 2, f"paged decode {name}, sequence {b}")


# the entry points that the tests above do not call (they call cuda_attention, cuda_attention_backward and
# tensor_core_attention_backward), each with the kernel it runs when none is named
ENTRY_POINTS = {"tensor_core_attention": tf.tensor_core_attention, "hopper_attention": tf.hopper_attention}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_forward_entry_point(rng, entry):
    """Each forward entry point with its own kernel and plan: float16, d = 64, ragged, causal, one head."""
    attention = ENTRY_POINTS[entry]
    q, k, v = make_qkv(rng, (1,), N_Q, N_K, 64, dtype=np.float16)
    o, lse = run_or_skip(lambda: attention(q, k, v, causal=True))
    check_forward_against_stages(o, lse, q, k, v, True, entry)


def test_decode_entry_points(rng):
    """cuda_split_kv_attention and cuda_paged_attention with the kernel they choose: float16 at d = 64, one query,
    2 query heads on 1 K/V head."""
    q = rng.standard_normal((1, 2, 1, 64)).astype(np.float16)  # (B, H, Nq, d)
    k, v = (rng.standard_normal((1, 1, N_K, 64)).astype(np.float16) for _ in range(2))  # (B, H_kv, Nk, d)
    o, lse = tf.cuda_split_kv_attention(q, k, v, num_splits=2, causal=True)
    check_decode(o, lse, q, k, v, 2, "cuda_split_kv_attention")
    lens = [N_K]
    o, lse = tf.cuda_paged_attention(q, tf.to_paged(k, v, lens, page_size=4, rng=rng), num_splits=2, causal=True)
    for b, n in enumerate(lens):
        check_decode(o[b], lse[b], q[b], k[b, :, :n], v[b, :, :n], 2, f"cuda_paged_attention, sequence {b}")
