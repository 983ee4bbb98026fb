"""The backward pass on the tensor cores (backward kernel v2) at tiny sizes on numba's CUDA simulator, where
its PTX instructions run through their emulations (``gpu/ptx_emulation.py``).

The simulator runs one Python thread per CUDA thread: one warp, 16 keys and 16 query rows per tile, N <= 40,
d = 64 (one test at 128); past d = 128 two warps on the same 16 keys, each with half of dK's and dV's columns
(the tiling's DKV_COLUMN_GROUPS, as on a GPU), and head dims that are not multiples of 32, padded with zero
columns (d = 40 to 64, d = 200 to 224). Gradients are checked against the float64 reference by FlashAttention's rule for
gradients (3 × the error of naive attention in the same precision); the GPU tests
(``test_backward_tensor_cores_gpu.py``) take realistic sizes.
"""

import numpy as np
import pytest
from conftest import make_qkv

import tinyflash as tf
from tinyflash.backward.kernels import VERSIONS
from tinyflash.host.launch import launch_backward_tensor_cores
from tinyflash.backward.kernels.tensor_core_tiling import BackwardTensorCoreTiling, default_tiling
from tinyflash.core.checks import check_attention_inputs
from tinyflash.core.tolerance import assert_fa_rule
from tinyflash.gpu.launch import LaunchArgs
from tinyflash.gpu.ptx_emulation import from_bits, to_bits

pytestmark = [pytest.mark.simulator, pytest.mark.grid]
GRAD_FACTOR = 3.0  # FlashAttention's rule for 16-bit gradients


def gradients(rng, lead_q, lead_kv, n_q, n_k, d, causal):
    """float16 q, k, v, do; the forward's o and lse; tensor_core_attention_backward's (dq, dk, dv)."""
    q = make_qkv(rng, lead_q, n_q, n_q, d, dtype=np.float16)[0]
    _, k, v = make_qkv(rng, lead_kv, n_k, n_k, d, dtype=np.float16)
    do = rng.standard_normal(q.shape).astype(np.float16)
    o, lse = tf.naive_attention(q, k, v, causal=causal)
    return (q, k, v, do), tf.tensor_core_attention_backward(q, k, v, o, lse, do, causal=causal)


def check(inputs, grads, causal, what):
    """Each gradient shaped and typed like its input and within FlashAttention's rule; grouped K/V heads
    against the reference on K and V repeated, summed over each group."""
    q, k, v, do = inputs
    group = q.shape[-3] // k.shape[-3] if q.ndim >= 3 else 1
    kr, vr = (np.repeat(x, group, axis=-3) if group > 1 else x for x in (k, v))
    ref = tf.reference_attention_backward(q, kr, vr, do, causal=causal)
    naive = tf.naive_attention_backward(q, kr, vr, do, causal=causal)
    for name, g, r, n, like in zip(("dq", "dk", "dv"), grads, ref, naive, (q, k, v)):
        assert g.shape == like.shape and g.dtype == like.dtype, (name, g.shape, g.dtype)
        if name != "dq" and group > 1:  # (..., H_kv, g, Nk, d) summed over g
            r, n = (x.reshape(*like.shape[:-2], group, *like.shape[-2:]).sum(axis=-3) for x in (r, n))
        if k.shape[-2] == 1 and name != "dv":  # softmax over one key: dq = dk = 0 up to rounding (P = 1, dS = dP - D)
            assert np.abs(g.astype(np.float64)).max() <= one_key_bound(q, kr, vr, do, name), (what, name)
            continue
        assert_fa_rule(g, n, r, np.float16, factor=GRAD_FACTOR, what=f"{what} {name}")


def one_key_bound(q, k, v, do, name: str) -> float:
    """The largest |dq| or |dk| float32 rounding allows when each row attends one key. Then P = 1 and O = V, so
    dS = dP - D is 0 in exact arithmetic, but dP = dO·V (the tensor cores) and D = rowsum(dO ∘ O) (the row kernel)
    add the same d products, each exact in float32, in two orders: |dS| <= 2 γ(d - 1) Σ|dO ∘ V| per row, with
    γ(n) = n u / (1 - n u), u = 2^-24. dq = scale · dS k and dk = scale · Σ_rows dS q, then rounded to float16
    (a relative 2^-11 more)."""
    d = q.shape[-1]
    gamma = (d - 1) * 2.0**-24 / (1 - (d - 1) * 2.0**-24)
    ds = 2 * gamma * np.abs(do.astype(np.float64) * v.astype(np.float64)).sum(axis=-1)  # (..., Nq) rows' bounds
    scale, rounding = 1 / np.sqrt(d), 1 + 2.0**-11
    if name == "dq":
        return scale * float(ds.max()) * float(np.abs(k.astype(np.float64)).max()) * rounding
    return scale * float(ds.sum(axis=-1).max()) * float(np.abs(q.astype(np.float64)).max()) * rounding


@pytest.mark.parametrize("n_q, n_k, causal", [(17, 20, False), (20, 17, True), (1, 1, True)])
def test_lengths(rng, n_q, n_k, causal):
    """Ragged tiles, Nq != Nk both ways, the causal diagonal and the query tiles it skips, one row and one key."""
    inputs, grads = gradients(rng, (1,), (1,), n_q, n_k, 64, causal)
    check(inputs, grads, causal, f"{n_q}x{n_k} causal={causal}")


def test_grouped_heads_are_summed_without_repeating_k_and_v(rng):
    """Two query heads on one K/V head: dk and dv are the sums over the group."""
    inputs, grads = gradients(rng, (2,), (1,), 10, 18, 64, True)
    check(inputs, grads, True, "GQA 2/1")


def test_head_dim_128(rng):
    inputs, grads = gradients(rng, (), (), 9, 12, 128, True)
    check(inputs, grads, True, "d=128")


@pytest.mark.parametrize("d", [40, 96, 200, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims(rng, d, causal):
    """Every kind of head dim: padded to DP with zero columns (40, 200), 12 16-byte pieces a row for 32 threads
    (96), two warps on 16 keys sharing dK's and dV's columns (200, 256); ragged both ways, causal with Nq > Nk
    (rows that see no key)."""
    n_q, n_k = (21, 17) if causal else (17, 21)
    inputs, grads = gradients(rng, (1,), (1,), n_q, n_k, d, causal)
    copies = [x.copy() for x in inputs]
    check(inputs, grads, causal, f"d={d} {n_q}x{n_k} causal={causal}")
    assert all(np.array_equal(x, c) for x, c in zip(inputs, copies))  # inputs untouched


@pytest.mark.smoke  # the first tier's one run of the new kinds of head dim (one block, a few queries and keys)
def test_a_padded_head_dim_past_128(rng):
    """d = 136, padded to 160 with zero columns, two warps on 16 keys each with half of dK's and dV's columns,
    causal with Nq > Nk (a query that sees no key)."""
    inputs, grads = gradients(rng, (1,), (1,), 6, 5, 136, True)
    check(inputs, grads, True, "d=136")


@pytest.mark.parametrize("d", [96, 192])
def test_grouped_heads_at_other_head_dims(rng, d):
    """Grouped-query heads (two query heads on one K/V head) at d = 96 (one warp) and 192 (two warps on the same
    keys): dk and dv summed over the group."""
    inputs, grads = gradients(rng, (2,), (1,), 18, 11, d, True)
    check(inputs, grads, True, f"GQA 2/1 d={d}")


def check_bfloat16(rng, kernel, n_q, n_k, causal, d=64):
    """Backward kernel ``kernel``'s main kernel on bfloat16 bit patterns (NumPy has no bfloat16): D and dQ's scale
    in NumPy around it; each gradient within FlashAttention's rule, bfloat16's rounding of the result allowed."""
    q, k, v = (from_bits(to_bits(x, "bfloat16"), "bfloat16") for x in make_qkv(rng, (), n_q, n_k, d=d))
    do = from_bits(to_bits(rng.standard_normal(q.shape), "bfloat16"), "bfloat16")
    o, lse = tf.reference_attention(q, k, v, causal=causal)
    prob = check_attention_inputs(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16), causal=causal,
                                  scale=None, allowed=(np.dtype(np.float16),))
    bits = {name: to_bits(x, "bfloat16").reshape(-1) for name, x in (("Q", q), ("K", k), ("V", v), ("dO", do))}
    dk, dv = np.zeros(k.size, np.uint16), np.zeros(v.size, np.uint16)
    dq_acc = np.zeros(q.size, np.float32)
    D = (do.astype(np.float64) * o).sum(-1).astype(np.float32)  # rowsum(dO ∘ O)
    args = LaunchArgs(arrays={**{name: (x, x.size) for name, x in bits.items()},
                              "LSE": (lse.astype(np.float32), n_q), "Dvec": (D, n_q), "dQ_acc": (dq_acc, q.size),
                              "dK": (dk, k.size), "dV": (dv, v.size), "dQ_turn": (np.zeros(1, np.int32), 0)},
                      scalars={"n_q": n_q, "n_k": n_k, "scale": np.float32(prob.scale),
                               "scale_log2": np.float32(prob.scale * np.log2(np.e)), "causal": causal}, n_heads=1)
    launch_backward_tensor_cores(VERSIONS[kernel], args, prob, element="bfloat16", who=f"backward kernel {kernel}")
    grads = [dq_acc.reshape(q.shape) * prob.scale] + [from_bits(x, "bfloat16").reshape(k.shape) for x in (dk, dv)]
    ref = tf.reference_attention_backward(q, k, v, do, causal=causal)
    naive = [from_bits(to_bits(x, "bfloat16"), "bfloat16")
             for x in tf.naive_attention_backward(q, k, v, do, causal=causal)]
    for name, g, r, n in zip(("dq", "dk", "dv"), grads, ref, naive):
        r16 = from_bits(to_bits(r, "bfloat16"), "bfloat16").astype(np.float64)
        atol = 2.0 * float(np.abs(from_bits(to_bits(r16 + 0.3, "bfloat16"), "bfloat16") - 0.3 - r16).max())
        fast, base = float(np.abs(g - r).max()), float(np.abs(n - r).max())
        assert fast <= GRAD_FACTOR * base + atol, (kernel, name, fast, base, atol)


def test_bfloat16(rng):
    check_bfloat16(rng, "v2", 19, 23, True)


def test_bfloat16_at_d_192(rng):
    check_bfloat16(rng, "v2", 17, 13, False, d=192)


def test_cuda_attention_backward_runs_v2_on_float16(rng):
    """kernel="v2" through stage 2's wrapper: the same kernel, its float16 arrays handed over as words."""
    (q, k, v, do), grads = gradients(rng, (), (), 13, 13, 64, False)
    o, lse = tf.naive_attention(q, k, v)
    via_stage2 = tf.cuda_attention_backward(q, k, v, o, lse, do, kernel="v2")
    for a, b in zip(grads, via_stage2):
        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), rtol=0, atol=2e-3)


def test_no_queries(rng):
    """Nq = 0: no gradient reaches k or v (dk = dv = 0)."""
    q, k, v = make_qkv(rng, (), 0, 5, 64, dtype=np.float16)
    o, lse = tf.naive_attention(q, k, v)
    dq, dk, dv = tf.tensor_core_attention_backward(q, k, v, o, lse, o, causal=False)
    assert dq.shape == (0, 64) and dk.shape == (5, 64) and not dk.any() and not dv.any()


def test_bad_inputs_are_refused_before_a_launch(rng):
    q, k, v = make_qkv(rng, (), 4, 4, 64, dtype=np.float16)
    o, lse = tf.naive_attention(q, k, v)
    with pytest.raises(TypeError, match=r"^tensor_core_attention_backward takes float16 or bfloat16; got q of dtype "
                                        r"float32 \(tinyflash.cuda_attention_backward takes float16, bfloat16 and float32\)$"):
        tf.tensor_core_attention_backward(*(x.astype(np.float32) for x in (q, k, v, o)), lse, o.astype(np.float32))
    with pytest.raises(TypeError, match="lse must have dtype float32"):
        tf.tensor_core_attention_backward(q, k, v, o, lse.astype(np.float16), o)
    with pytest.raises(ValueError, match=r"supports d = dv a multiple of 8 up to 256; got q \(4, 36\)"):
        q36, k36, v36 = make_qkv(rng, (), 4, 4, 36, dtype=np.float16)
        tf.tensor_core_attention_backward(q36, k36, v36, q36, lse, q36)
    with pytest.raises(ValueError, match=r"d = dv a multiple of 8 up to 256; got q \(4, 64\), v \(4, 32\)"):
        tf.tensor_core_attention_backward(q, k, v[:, :32], o[:, :32], lse, o[:, :32])
    with pytest.raises(ValueError, match="do must have shape"):
        tf.tensor_core_attention_backward(q, k, v, o, lse, o[:3])
    with pytest.raises(TypeError, match="^causal must be True or False"):
        tf.tensor_core_attention_backward(q, k, v, o, lse, o, causal="yes")


# slow on the simulator (two warps, 37 keys in three tiles): the split of dQ_i between warps needs both
def test_warps_share_dq_by_columns(rng):
    """Two warps on one 16-row query tile: each takes half of dQ_i's columns (the tiling of 8 warps, BR = 64)."""
    cfg = BackwardTensorCoreTiling(D=64, WARPS=2, BR=16).validate()
    assert (cfg.DQ_ROW_WARPS, cfg.DQ_COLUMN_GROUPS, cfg.BC) == (1, 2, 32)
    (q, k, v, do), _ = gradients(rng, (), (), 19, 37, 64, False)
    o, lse = tf.naive_attention(q, k, v)
    check((q, k, v, do), tf.cuda_attention_backward(q, k, v, o, lse, do, kernel="v2", config=cfg), False, "2 warps")


@pytest.mark.parametrize("d", [96, 200])
# slow on the simulator (4 warps, two key tiles, the second ragged): the GPU's tilings of the new families
def test_the_gpu_s_tilings_at_other_head_dims(rng, d):
    """The GPU's own tiling (``default_tiling``), causal, ragged: at d = 96 4 warps of 16 keys, query tiles of 32
    rows, dQ_i split by rows and columns; at d = 200 (224 padded) 4 warps in two pairs on 16 keys each, each warp of
    a pair with half of dK's and dV's columns. One ragged query tile of 27 rows: the causal rule then cuts the second
    key tile's keys for some rows and not others. One head: grouped heads at these head dims are
    test_grouped_heads_at_other_head_dims's (and the GPU tests', with this tiling)."""
    cfg = default_tiling(d)
    assert (cfg.WARPS, cfg.BR, cfg.DKV_COLUMN_GROUPS) == ((4, 32, 1) if d == 96 else (4, 32, 2))
    q, k, v = make_qkv(rng, (1,), 27, cfg.BC + 5, d, dtype=np.float16)
    do = rng.standard_normal(q.shape).astype(np.float16)
    o, lse = tf.naive_attention(q, k, v, causal=True)
    grads = tf.tensor_core_attention_backward(q, k, v, o, lse, do, causal=True, config=cfg)
    check((q, k, v, do), grads, True, f"{cfg}")


def test_tilings():
    assert default_tiling(128).smem_bytes <= 227 * 1024 and default_tiling(64).BC == 128
    for d in range(8, 257, 8):  # every head dim has a tiling that an A100 (163 KB a block) and a Hopper GPU run
        cfg = default_tiling(d)
        assert cfg.D == d and cfg.smem_bytes <= 163 * 1024 and cfg.DKV_COLUMN_GROUPS == (1 if d <= 128 else 2), cfg
    assert (default_tiling(256).BC, default_tiling(256).BR, default_tiling(96).BC) == (64, 32, 64)
    with pytest.raises(ValueError, match="its 16-row tiles a multiple or a divisor of WARPS"):
        BackwardTensorCoreTiling(D=64, WARPS=4, BR=48).validate()
    with pytest.raises(ValueError, match="D must be a multiple of 8 up to 256"):
        BackwardTensorCoreTiling(D=100, WARPS=1, BR=16).validate()
    with pytest.raises(ValueError, match="DKV_COLUMN_GROUPS must divide WARPS"):
        BackwardTensorCoreTiling(D=256, WARPS=3, BR=48, DKV_COLUMN_GROUPS=2).validate()


def test_the_default_kernel_at_each_head_dim():
    """On a Hopper GPU the warp-specialised wgmma kernel (v4) at d = 64 and 128, v2 at every other head dim; v2
    elsewhere; and a named kernel that does not take the head dim is refused before anything runs."""
    for d in (64, 128):
        assert VERSIONS.default("tensor_core_attention_backward", "bfloat16", d, d, capability=(9, 0)).name == "v4"
    for d in (8, 40, 96, 192, 200, 256):
        assert VERSIONS.default("tensor_core_attention_backward", "bfloat16", d, d, capability=(9, 0)).name == "v2"
        assert VERSIONS.default("tensor_core_attention_backward", "float16", d, d, capability=(8, 0)).name == "v2"
    q = np.ones((4, 96), np.float16)
    with pytest.raises(ValueError, match=r"^backward kernel v3 takes d = dv one of \(64, 128\); got d = 96 \(kernel "
                                         r"v2 takes a multiple of 8 up to 256\)$"):
        tf.tensor_core_attention_backward(q, q, q, q, np.zeros(4, np.float32), q, kernel="v3")


@pytest.mark.parametrize("n_q, n_k, causal", [(34, 20, True), (20, 34, True)])  # without the mask: the GPU tests
# slow on the simulator (two heads, three tiles a side): every key tile's turn must come, on both sides of the
# diagonal
def test_deterministic_mode(rng, n_q, n_k, causal):
    """dQ added in key-tile order: the same gradients within the rule, grouped heads and ragged tiles included,
    and every key tile's turn comes (a wrong count would wait for ever): Nq > Nk, where the first queries see no
    key, and Nq < Nk causal, where the last key tiles see only the last queries. (On the simulator the blocks
    run one after another, so the order is the same in either mode; test_backward_tensor_cores_gpu.py shows
    that dq is reproducible bit for bit on a GPU.)"""
    q, k, v = make_qkv(rng, (2,), n_q, n_k, 64, dtype=np.float16)
    k, v = k[:1], v[:1]  # two query heads on one K/V head
    do = rng.standard_normal(q.shape).astype(np.float16)
    o, lse = tf.naive_attention(q, k, v, causal=causal)
    grads = tf.tensor_core_attention_backward(q, k, v, o, lse, do, causal=causal, deterministic=True)
    check((q, k, v, do), grads, causal, f"deterministic {n_q}x{n_k}")
    with pytest.raises(TypeError, match="deterministic must be a bool; got int"):
        tf.tensor_core_attention_backward(q, k, v, o, lse, do, causal=causal, deterministic=1)
