"""The backward kernel on a real GPU at realistic sizes, and PyTorch autograd (``pytest -m gpu``).

N from 1 to 4096 (ragged tiles everywhere but 128 and 4096), head dims 32, 64 and 128, causal
and not, float32 and float16, against the float64 reference and stage 1; bfloat16 PyTorch tensors; determinism (dk, dv
bitwise; dq within the bound of reordered float32 additions); CuPy arrays; the autograd wrapper
against PyTorch's scaled_dot_product_attention.
"""

import numpy as np
import pytest
from conftest import make_qkv

import tinyflash as tf
from tinyflash.core.tolerance import assert_close, assert_fa_rule, round_to

pytestmark = pytest.mark.gpu
F32_GRAD_TOL = 1e-4
GRAD_FACTOR = 3.0  # FlashAttention's rule for gradients
U32 = 2.0**-24  # unit roundoff of float32


def inputs(rng, lead, n_q, n_k, d, d_v, dtype, causal):
    q, k, v = make_qkv(rng, lead, n_q, n_k, d=d, d_v=d_v, dtype=dtype)
    do = rng.standard_normal((*lead, n_q, d_v)).astype(dtype)  # (..., Nq, dv)
    o, lse = tf.cuda_attention(q, k, v, causal=causal)
    return q, k, v, o, lse, do


@pytest.mark.parametrize("n", [1, 17, 128, 1000, 4096])  # the sizes, the fastest-varying: consecutive cases
@pytest.mark.parametrize("causal", [False, True])  # share a compiled kernel (one per head dim and dtype), and
@pytest.mark.parametrize("d", [32, 64, 128])  # benchmarks/gpu_tests.py splits the cases into runs of consecutive ones
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_against_reference_and_stage_1(rng, n, d, causal, dtype):
    lead = (1, 2) if n >= 1000 else (2, 3)
    q, k, v, o, lse, do = inputs(rng, lead, n, n, d, d, dtype, causal)
    grads = tf.cuda_attention_backward(q, k, v, o, lse, do, causal=causal)
    ref = tf.reference_attention_backward(q, k, v, do, causal=causal)
    blocked = tf.blocked_attention_backward(q, k, v, o, lse, do, causal=causal, block_q=256, block_k=256)
    naive = tf.naive_attention_backward(q, k, v, do, causal=causal) if dtype == np.float16 else None
    for i, (name, g, r, b) in enumerate(zip(("dq", "dk", "dv"), grads, ref, blocked)):
        assert g.dtype == dtype and g.shape == (q, k, v)[i].shape
        if n == 1 and name != "dv":  # softmax over one key: dq = dk = 0 up to rounding
            assert np.abs(g.astype(np.float64)).max() <= 1e-3
        elif dtype == np.float16:
            assert_fa_rule(g, naive[i], r, np.float16, factor=GRAD_FACTOR, what=f"{name} vs reference")
            assert_fa_rule(g, b, r, np.float16, factor=GRAD_FACTOR, what=f"{name} vs stage 1")
        else:
            assert_close(g, r, F32_GRAD_TOL, f"{name} vs reference")
            assert_close(g, b, F32_GRAD_TOL, f"{name} vs stage 1")


@pytest.mark.parametrize("n_q, n_k", [(1000, 17), (17, 1000), (300, 4096)])
@pytest.mark.parametrize("causal", [False, True])
def test_unequal_lengths_and_head_dims(rng, n_q, n_k, causal):
    q, k, v, o, lse, do = inputs(rng, (2,), n_q, n_k, 64, 96, np.float32, causal)
    grads = tf.cuda_attention_backward(q, k, v, o, lse, do, causal=causal)
    for name, g, r in zip(("dq", "dk", "dv"), grads, tf.reference_attention_backward(q, k, v, do, causal=causal)):
        assert_close(g, r, F32_GRAD_TOL, name)


@pytest.mark.parametrize("d", [8, 200, 256])
def test_other_head_dims(rng, d):
    q, k, v, o, lse, do = inputs(rng, (2,), 300, 257, d, d, np.float32, True)
    grads = tf.cuda_attention_backward(q, k, v, o, lse, do, causal=True)
    for name, g, r in zip(("dq", "dk", "dv"), grads, tf.reference_attention_backward(q, k, v, do, causal=True)):
        assert_close(g, r, F32_GRAD_TOL, f"{name} d={d}")


def atomic_order_bound(q, k, v, do, causal, n_tiles):
    """How far two runs' dq may differ: the Tc partial sums dS_ij K_j of each entry are added in any
    order; two orders of n float32 additions differ by at most 2(n - 1)·u·Σ|terms| (first order),
    with Σ|terms| <= scale · (|dS| |K|). Plus a unit in the last place for the final scaling."""
    q64, k64, v64, do64 = (x.astype(np.float64) for x in (q, k, v, do))
    scale = 1.0 / np.sqrt(q.shape[-1])
    S = scale * q64 @ np.swapaxes(k64, -1, -2)  # (..., Nq, Nk)
    if causal:
        S = np.where(tf.causal_mask(q.shape[-2], k.shape[-2]), S, -np.inf)
    P = np.exp(S - S.max(-1, keepdims=True))
    P /= P.sum(-1, keepdims=True)
    dP = do64 @ np.swapaxes(v64, -1, -2)
    dS = P * (dP - (dP * P).sum(-1, keepdims=True))
    return 1.01 * 2 * (n_tiles - 1) * U32 * scale * (np.abs(dS) @ np.abs(k64))


@pytest.mark.parametrize("causal", [False, True])
def test_determinism(rng, causal):
    """dk and dv bitwise identical over runs; dq (atomics) within the bound of reordered additions."""
    q, k, v, o, lse, do = inputs(rng, (1, 4), 2000, 2000, 64, 64, np.float32, causal)
    runs = [tf.cuda_attention_backward(q, k, v, o, lse, do, causal=causal) for _ in range(5)]
    from tinyflash.backward.kernels.tiling import default_config

    bound = atomic_order_bound(q, k, v, do, causal, -(-2000 // default_config(64, 64).BC))
    for dq, dk, dv in runs[1:]:
        assert np.array_equal(dk, runs[0][1]) and np.array_equal(dv, runs[0][2])
        diff = np.abs(dq.astype(np.float64) - runs[0][0]) - bound - U32 * np.abs(dq)
        assert diff.max() <= 0, f"dq differs by more than the bound: excess {diff.max():.3e}"


def test_cupy_in_cupy_out(rng):
    cupy = pytest.importorskip("cupy")
    q, k, v, o, lse, do = inputs(rng, (2,), 100, 120, 64, 64, np.float32, True)
    dev = [cupy.asarray(x) for x in (q, k, v, o, lse, do)]
    grads = tf.cuda_attention_backward(*dev, causal=True)
    assert all(isinstance(g, cupy.ndarray) for g in grads)
    for name, g, r in zip(("dq", "dk", "dv"), grads, tf.reference_attention_backward(q, k, v, do, causal=True)):
        assert_close(g, r, F32_GRAD_TOL, name)


def test_more_heads_than_one_launch(rng):
    """More than 65,535 (batch · head) rows of blocks: launched in slices."""
    q, k, v, o, lse, do = inputs(rng, (70_000,), 3, 5, 8, 8, np.float32, False)
    grads = tf.cuda_attention_backward(q, k, v, o, lse, do)
    for name, g, r in zip(("dq", "dk", "dv"), grads, tf.reference_attention_backward(q, k, v, do)):
        assert_close(g, r, F32_GRAD_TOL, name)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n, d", [(17, 32), (1000, 64), (2048, 128), (999, 80)])
def test_torch_autograd_matches_sdpa(rng, n, d, causal, dtype):
    """tinyflash.torch.attention's gradients against float64 (SDPA's, computed in float64): in float16
    FlashAttention's rule (our error at most 3× SDPA's float16 error), in float32 the relative error
    F32_GRAD_TOL of every float32 gradient check here (FlashAttention's rule is for reduced precision;
    SDPA's float32 backward is a fused kernel, not a naive computation). Nq == Nk: there both causal
    alignments agree. d = 32 and 80 run on the CUDA cores, 64 and 128 in float16 and bfloat16 on the tensor cores."""
    torch = pytest.importorskip("torch")
    import tinyflash.torch as tft

    tdtype = getattr(torch, dtype)
    q, k, v = (torch.tensor(x, device="cuda", requires_grad=True)  # float64 on the GPU: the reference
               for x in make_qkv(rng, (2, 4), n, n, d=d))
    do = torch.tensor(rng.standard_normal((2, 4, n, d)), device="cuda")
    ref = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal),
                              (q, k, v), do)

    def grads(attention):
        leaves = [x.detach().to(tdtype).requires_grad_() for x in (q, k, v)]
        return torch.autograd.grad(attention(*leaves), leaves, do.to(tdtype))

    ours = grads(lambda q, k, v: tft.attention(q, k, v, causal=causal))
    theirs = grads(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal))
    for name, a, b, r in zip(("dq", "dk", "dv"), ours, theirs, ref):
        assert a.dtype == tdtype and a.shape == r.shape
        if dtype in ("float16", "bfloat16"):
            assert_fa_rule(a.double().cpu().numpy(), b.double().cpu().numpy(), r.cpu().numpy(), dtype,
                           factor=GRAD_FACTOR, what=f"{name} tinyflash.torch vs SDPA")
        else:
            assert_close(a.double().cpu().numpy(), r.cpu().numpy(), F32_GRAD_TOL, f"{name} tinyflash.torch")


@pytest.mark.parametrize("causal", [False, True])
def test_bfloat16_torch(rng, causal):
    """bfloat16 PyTorch tensors through the CUDA-core forward and backward (d = 64, dv = 80: not the tensor
    cores'), ragged, Nq != Nk: the gradients by FlashAttention's rule (factor 3) against the float64 reference,
    the naive backward rounded to bfloat16 the baseline."""
    torch = pytest.importorskip("torch")
    q, k, v = make_qkv(rng, (2,), 300, 513, d=64, d_v=80, dtype=np.float32)
    do = rng.standard_normal((2, 300, 80)).astype(np.float32)
    tq, tk, tv, tdo = (torch.from_numpy(x).cuda().to(torch.bfloat16) for x in (q, k, v, do))
    q, k, v, do = (t.float().cpu().numpy() for t in (tq, tk, tv, tdo))  # the values bfloat16 holds
    o, lse = tf.cuda_attention(tq, tk, tv, causal=causal)
    grads = tf.cuda_attention_backward(tq, tk, tv, o, lse, tdo, causal=causal)
    ref = tf.reference_attention_backward(q, k, v, do, causal=causal)
    naive = tf.naive_attention_backward(q, k, v, do, causal=causal)
    for name, g, r, n in zip(("dq", "dk", "dv"), grads, ref, naive):
        assert g.dtype == torch.bfloat16 and g.shape == r.shape
        assert_fa_rule(g.float().cpu().numpy(), round_to(n, "bfloat16"), r, "bfloat16", factor=GRAD_FACTOR,
                       what=f"bfloat16 {name}")


def test_torch_wrapper_rejects_cpu_tensors():
    torch = pytest.importorskip("torch")
    import tinyflash.torch as tft

    x = torch.zeros(2, 3, 4)
    with pytest.raises(TypeError, match="q must be a CUDA torch.Tensor"):
        tft.attention(x, x, x)
