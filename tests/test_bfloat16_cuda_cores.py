"""bfloat16 on the CUDA cores, at tiny ragged sizes on numba's simulator (or a GPU): stage 2's kernels v1-v5,
the backward's v1 and decoding's CUDA-core split kernel, through their public entry points.

NumPy has no bfloat16, and the test environment no PyTorch: the inputs are :class:`Bfloat16Array`, a device
array that shows the entry points what a PyTorch CUDA tensor of bfloat16 shows them (a shape, a dtype named
bfloat16, ``view(int16)``: its 16-bit patterns), built from float32 values that bfloat16 holds exactly.
Results are judged by FlashAttention's rule for bfloat16 (core/tolerance.py): against the float64 reference of
the same values, within twice the error of naive attention rounded to bfloat16 (three times for gradients), lse
within float32's tolerance.
"""

import numpy as np
import pytest
from conftest import make_qkv
from numba import cuda

import tinyflash as tf
from tinyflash.core.tolerance import F32_TOL, assert_close, assert_fa_rule
from tinyflash.decode.paged import PagedKVCache, to_paged
from tinyflash.forward.kernels import VERSIONS
from tinyflash.gpu.ptx_emulation import from_bits, to_bits

pytestmark = [pytest.mark.simulator, pytest.mark.grid]
CUDA_CORES = [name for name, v in VERSIONS.items() if v.accepts("bfloat16", 8, 5)]  # v1-v5 (v6: d = dv = 64, 128)


class Bfloat16Array:
    """A device array of bfloat16 as the entry points see a PyTorch CUDA tensor of it: ``shape``, a ``dtype``
    named bfloat16 (what ``str(torch.bfloat16)`` ends with), ``view(np.int16)`` (the same memory as 16-bit
    patterns) and a ``__cuda_array_interface__`` (only its presence is asked: the array is on the device)."""

    def __init__(self, values):  # float32 values, exact in bfloat16
        self.bits = cuda.to_device(to_bits(values, "bfloat16"))  # (..., N, d) uint16 on the device
        self.shape, self.dtype = values.shape, "bfloat16"
        self.__cuda_array_interface__ = {"shape": values.shape, "typestr": "<V2", "data": (0, False), "version": 2}

    def view(self, dtype):
        return self.bits.view(dtype)


def bf16_exact(x):
    """float32 values that bfloat16 holds exactly: ``x`` rounded to bfloat16."""
    return from_bits(to_bits(x, "bfloat16"), "bfloat16")


def values_of(out):
    """The float32 values of an output of bfloat16 patterns (a device array of uint16, as the entry points
    return it for bfloat16 inputs that are not PyTorch tensors)."""
    bits = out.copy_to_host()
    assert bits.dtype == np.uint16, bits.dtype
    return from_bits(bits, "bfloat16")


def bf16_inputs(rng, lead, n_q, n_k, d, d_v=None, kv_lead=None):
    q, k, v = (bf16_exact(x) for x in make_qkv(rng, lead, n_q, n_k, d, d_v, np.float32))
    if kv_lead is not None:  # grouped-query attention: fewer K/V heads
        k, v = k[..., : kv_lead[-1], :, :].copy(), v[..., : kv_lead[-1], :, :].copy()
    return q, k, v


def check_output(o, lse, q, k, v, causal, what):
    """o (bfloat16 patterns) by FlashAttention's rule, lse (float32) within F32_TOL, against float64."""
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=causal)
    naive = bf16_exact(tf.naive_attention(q, k, v, causal=causal)[0])  # naive attention, o rounded to bfloat16
    assert_fa_rule(values_of(o).reshape(ref_o.shape), naive, ref_o, "bfloat16", what=f"{what} o")
    assert_close(lse.copy_to_host().reshape(ref_lse.shape), ref_lse, F32_TOL, f"{what} lse", is_lse=True)


@pytest.mark.parametrize("kernel", CUDA_CORES)
@pytest.mark.parametrize("causal", [False, True])
def test_forward_every_version(rng, kernel, causal):
    """Ragged tiles both ways (20 queries, 33 keys: tiles of 8), a padded head dim (dv = 5), two heads."""
    q, k, v = bf16_inputs(rng, (2,), 20, 33, 8, d_v=5)
    o, lse = tf.cuda_attention(*(Bfloat16Array(x) for x in (q, k, v)), causal=causal, kernel=kernel)
    assert o.shape == (2, 20, 5) and lse.shape == (2, 20)
    check_output(o, lse, q, k, v, causal, f"{kernel} bfloat16")


@pytest.mark.parametrize("d", [1, 13])
def test_forward_head_dims_and_grouped_heads(rng, d):
    """Odd head dims (one element per load, the ragged loader) and grouped-query attention (4 query heads
    on 2 K/V heads), causal, Nq > Nk."""
    q, k, v = bf16_inputs(rng, (4,), 17, 9, d, kv_lead=(2,))
    o, lse = tf.cuda_attention(*(Bfloat16Array(x) for x in (q, k, v)), causal=True)
    check_output(o, lse, q, k, v, True, f"d={d} GQA bfloat16")


@pytest.mark.parametrize("causal", [False, True])
def test_backward(rng, causal):
    """dq, dk, dv of bfloat16 inputs by FlashAttention's rule for gradients (factor 3) against the float64
    reference, the baseline naive backward rounded to bfloat16; ragged tiles, dv != d."""
    q, k, v = bf16_inputs(rng, (2,), 9, 17, 8, d_v=5)
    do = bf16_exact(rng.standard_normal((2, 9, 5)).astype(np.float32))  # (B, Nq, dv)
    o, lse = tf.reference_attention(q, k, v, causal=causal)
    o, lse = bf16_exact(o), lse.astype(np.float32)  # the forward's outputs as a bfloat16 forward returns them
    args = [Bfloat16Array(x) for x in (q, k, v, o)]
    grads = tf.cuda_attention_backward(*args[:4], cuda.to_device(lse), Bfloat16Array(do), causal=causal)
    ref = tf.reference_attention_backward(q, k, v, do, causal=causal)
    naive = [bf16_exact(g) for g in tf.naive_attention_backward(q, k, v, do, causal=causal)]
    for name, g, r, n in zip(("dq", "dk", "dv"), grads, ref, naive):
        assert g.shape == r.shape, (name, g.shape)
        assert_fa_rule(values_of(g).reshape(r.shape), n, r, "bfloat16", factor=3.0, what=f"bfloat16 backward {name}")


@pytest.mark.parametrize("n_q, n_k, d, num_splits, causal", [
    (3, 21, 8, 2, True),  # whole 16-byte pieces of a row: K and V copied by cp.async; bottom-right causal
    (1, 11, 5, 3, False),  # d = 5: element by element, zeros past d; a split with no key
])
def test_split_kv(rng, n_q, n_k, d, num_splits, causal):
    """Split-KV decoding of bfloat16 at head dims the tensor cores do not take, on the CUDA-core kernel."""
    q, k, v = bf16_inputs(rng, (2, 4), n_q, n_k, d, kv_lead=(2, 2))  # 2 query heads per K/V head
    o, lse = tf.cuda_split_kv_attention(*(Bfloat16Array(x) for x in (q, k, v)), num_splits=num_splits, causal=causal)
    assert o.shape == q.shape and lse.shape == q.shape[:-1]
    check_output(o, lse, q, k, v, causal, f"split-KV d={d}")


def test_paged(rng):
    """A bfloat16 cache in pages of 4 tokens, two sequences of different lengths, each against its own keys."""
    lens = np.array([13, 6], dtype=np.int32)
    q, k, v = bf16_inputs(rng, (2, 2), 1, int(lens.max()), 8)  # (B, H, Nq, d), one K/V head per query head
    cache = to_paged(k, v, lens, page_size=4)
    pages = PagedKVCache(Bfloat16Array(cache.k_pages), Bfloat16Array(cache.v_pages), cache.block_table, cache.seq_lens)
    o, lse = tf.cuda_paged_attention(Bfloat16Array(q), pages, num_splits=2)
    o, lse = values_of(o).reshape(q.shape), lse.copy_to_host().reshape(q.shape[:-1])
    for b, n in enumerate(lens):
        qb, kb, vb = q[b], k[b, :, :n], v[b, :, :n]
        ref_o, ref_lse = tf.reference_attention(qb, kb, vb)
        naive = bf16_exact(tf.naive_attention(qb, kb, vb)[0])
        assert_fa_rule(o[b], naive, ref_o, "bfloat16", what=f"paged sequence {b} o")
        assert_close(lse[b], ref_lse, F32_TOL, f"paged sequence {b} lse", is_lse=True)


def test_entry_points_name_the_dtypes_they_take(rng):
    """Each CUDA-core entry point's dtype message names exactly the dtypes it takes; the CPU stages, which take
    no bfloat16, say which functions do."""
    q, k, v = (x.astype(np.float64) for x in make_qkv(rng, (1,), 3, 5, 8))
    expected = r"q has dtype float64; expected one of float16, bfloat16, float32"
    with pytest.raises(TypeError, match=rf"^{expected}\. Convert it first"):
        tf.cuda_attention(q, k, v)
    with pytest.raises(TypeError, match=rf"^{expected}\. Convert it first"):
        tf.cuda_attention_backward(q, k, v, q, q[..., 0].astype(np.float32), q)
    with pytest.raises(TypeError, match=rf"^{expected}\. Convert it first"):
        tf.cuda_split_kv_attention(q, k, v)
    bf = [Bfloat16Array(bf16_exact(x.astype(np.float32))) for x in (q, k, v)]
    with pytest.raises(TypeError, match=r"^q has dtype bfloat16; expected one of float16, float32, float64 "
                                        r"\(tinyflash.cuda_attention, tensor_core_attention, .*cuda_paged_attention "
                                        r"take it\)$"):
        tf.naive_attention(*bf)
    with pytest.raises(TypeError, match=r"^q, k and v must share one dtype; got q bfloat16, k float32, v bfloat16$"):
        tf.cuda_attention(bf[0], cuda.to_device(k.astype(np.float32)), bf[2])
