"""Kernel v11 (``tinyflash.hopper_fp8_attention``) on a Hopper GPU at real sizes: e4m3 inputs from NumPy
(ml_dtypes, copied to the GPU and back), PyTorch (torch.float8_e4m3fn CUDA tensors) and CuPy (uint8 bytes);
d = 64, 128 and 256, causal or not, grouped-query heads, per-tensor and per-head descales, ragged lengths.

Each result is checked against ``tinyflash.fp8_attention`` (the NumPy emulation, Bc = 128) and against float64
attention of the values the inputs stand for, by ``core.tolerance.fp8_bounds`` with the GPU's terms (the FP8 tensor
cores keep about 13 bits while they add; tests/test_hopper_fp8.py's docstring derives each term). The three array
libraries run the same kernel on the same bytes: their outputs agree bit for bit. Skipped without a GPU
(conftest) and on a GPU that is not compute capability 9.0.
Run: ``python -m pytest -m gpu tests/test_hopper_fp8_gpu.py``.
"""

import ml_dtypes
import numpy as np
import pytest
from test_hopper_fp8 import check_against_both, fp8_inputs

import tinyflash as tf

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def hopper():
    from tinyflash.gpu.runtime import compute_capability

    if compute_capability() != (9, 0):
        pytest.skip("kernel v11 (FP8 wgmma) needs compute capability 9.0")


def run(x, causal, **options):
    return tf.hopper_fp8_attention(x.q, x.k, x.v, x.descale_q, x.descale_k, x.descale_v, causal=causal, **options)


def test_two_heads_causal(rng):
    """Two heads, a few tiles each, ragged, d = 128, causal."""
    x = fp8_inputs(rng, (1, 2), (1, 2), 300, 333, 128)
    o, lse = run(x, True)
    check_against_both(x, o, lse, True)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n_q, n_k", [(1, 1), (17, 300), (1000, 1000), (700, 2049)])
def test_sizes(rng, d, causal, n_q, n_k):
    """Lengths from one row to several query and key tiles, ragged, Nq ≠ Nk both ways; four query heads on two
    K/V heads, descales per head."""
    x = fp8_inputs(rng, (1, 4), (1, 2), n_q, n_k, d, "head")
    o, lse = run(x, causal)
    check_against_both(x, o, lse, causal, f"d={d} Nq={n_q} Nk={n_k}")


def test_batch_and_many_heads(rng):
    """B = 3, H = 8, H_kv = 1 (multi-query), per-tensor descales."""
    x = fp8_inputs(rng, (3, 8), (3, 1), 257, 385, 128)
    o, lse = run(x, False)
    check_against_both(x, o, lse, False)


@pytest.mark.smoke
def test_torch_and_cupy_give_the_numpy_bytes(rng):
    """The GPU smoke tier's call on device arrays (tests/test_kernel_versions.py runs v11 on NumPy arrays):
    torch.float8_e4m3fn CUDA tensors give a torch.bfloat16 o on the GPU, CuPy uint8 bytes uint16 bit patterns:
    both the NumPy call's bits."""
    torch = pytest.importorskip("torch")
    x = fp8_inputs(rng, (2, 4), (2, 2), 500, 600, 128, "head")
    o, lse = run(x, True)
    t = [torch.from_numpy(a.view(np.uint8)).cuda().view(torch.float8_e4m3fn) for a in (x.q, x.k, x.v)]
    o_t, lse_t = tf.hopper_fp8_attention(*t, x.descale_q, x.descale_k, x.descale_v, causal=True)
    assert o_t.dtype == torch.bfloat16 and o_t.is_cuda and tuple(o_t.shape) == o.shape
    assert np.array_equal(o_t.view(torch.int16).cpu().numpy().view(np.uint16), o.view(np.uint16))
    assert np.array_equal(lse_t.cpu().numpy(), lse)
    cupy = pytest.importorskip("cupy")
    c = [cupy.asarray(a.view(np.uint8)) for a in (x.q, x.k, x.v)]
    o_c, _ = tf.hopper_fp8_attention(*c, x.descale_q, x.descale_k, x.descale_v, causal=True)
    assert o_c.dtype == np.uint16 and np.array_equal(cupy.asnumpy(o_c), o.view(np.uint16))
    assert o.dtype == ml_dtypes.bfloat16
