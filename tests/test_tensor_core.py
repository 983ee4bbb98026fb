"""Stage 3, the tensor-core kernel v6, at the smallest sizes its tiles allow (one warp, 16 queries
and 16 keys per tile, d = 64): on numba's CUDA simulator without a GPU, with the emulated
instructions of tinyflash.gpu.ptx_emulation; on a GPU, with the real ones.

float16 through tensor_core_attention; bfloat16, which NumPy lacks, through the kernel's launch
function with 16-bit patterns made by tinyflash.gpu.ptx_emulation.to_bits.
"""

import numpy as np
import pytest
from conftest import make_qkv

import tinyflash as tf
from tinyflash.core.checks import check_attention_inputs
from tinyflash.core.online_softmax import LOG2E
from tinyflash.core.tolerance import F32_TOL, RuleCheck, assert_close, assert_fa_rule
from tinyflash.forward.kernels import VERSIONS
from tinyflash.forward.kernels import tensor_core_tiling as tct
from tinyflash.gpu.launch import LaunchArgs
from tinyflash.host.launch import launch_tensor_cores
from tinyflash.gpu.ptx_emulation import from_bits, to_bits
from tinyflash.warp_tile import RESCALE_LOG2

pytestmark = [pytest.mark.simulator, pytest.mark.grid]


def check(o, lse, q, k, v, causal, what):
    """FlashAttention's rule for o against naive float16 attention; lse within F32_TOL (float32 math)."""
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=causal)
    assert_fa_rule(o, tf.naive_attention(q, k, v, causal=causal)[0], ref_o, np.float16, what=f"{what} o")
    assert_close(lse, ref_lse, F32_TOL, f"{what} lse", is_lse=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k", [(20, 37), (33, 17)])
def test_float16_ragged(rng, n_q, n_k, causal):
    """Ragged tiles on both sides, Nq != Nk; with causal and Nq > Nk, rows that see no key."""
    q, k, v = make_qkv(rng, (1,), n_q, n_k, d=64, dtype=np.float16)
    copies = [x.copy() for x in (q, k, v)]
    o, lse = tf.tensor_core_attention(q, k, v, causal=causal)
    assert o.dtype == np.float16 and o.shape == (1, n_q, 64) and lse.dtype == np.float32 and lse.shape == (1, n_q)
    check(o, lse, q, k, v, causal, f"v6 {n_q}x{n_k} causal={causal}")
    assert all(np.array_equal(x, c) for x, c in zip((q, k, v), copies))  # inputs untouched
    if causal and n_q > n_k:
        assert np.all(o[0, :n_q - n_k] == 0) and np.all(np.isneginf(lse[0, :n_q - n_k]))


def two_row_tiles(d, warps=1):
    """ROW_TILES = 2 at the simulator's sizes: each warp owns 32 query rows (two 16-row tiles that share
    every K_j, V_j fragment), 16 keys per tile; Br = 32 · warps."""
    return tct.TensorCoreTiling(D=d, WARPS=warps, BC=16, ROW_TILES=2).validate()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k", [(37, 29), (29, 37)])
def test_two_row_tiles_ragged(rng, n_q, n_k, causal):
    """Two row tiles per warp (Br = 32), ragged on both sides: the last query tile's second row tile lies
    wholly past Nq; with causal and Nq > Nk, rows that see no key, and row tiles that see different keys."""
    q, k, v = make_qkv(rng, (2,), n_q, n_k, d=64, dtype=np.float16)
    o, lse = tf.cuda_attention(q, k, v, causal=causal, kernel="v6", config=two_row_tiles(64))
    check(o, lse, q, k, v, causal, f"v6 two row tiles {n_q}x{n_k} causal={causal}")
    if causal and n_q > n_k:
        assert np.all(o[:, :n_q - n_k] == 0) and np.all(np.isneginf(lse[:, :n_q - n_k]))


@pytest.mark.parametrize("causal", [False, True])
def test_two_row_tiles_two_warps(rng, causal):
    """Two warps of two row tiles (Br = 64): the second warp's rows of Q_i, its first row's causal skip."""
    q, k, v = make_qkv(rng, (1,), 45, 40, d=64, dtype=np.float16)
    o, lse = tf.cuda_attention(q, k, v, causal=causal, kernel="v6", config=two_row_tiles(64, warps=2))
    check(o, lse, q, k, v, causal, f"v6 2 warps x two row tiles 45x40 causal={causal}")


def test_two_row_tiles_head_dim_128(rng):
    q, k, v = make_qkv(rng, (), 41, 23, d=128, dtype=np.float16)
    o, lse = tf.cuda_attention(q, k, v, causal=True, scale=0.05, kernel="v6", config=two_row_tiles(128))
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=True, scale=0.05)
    assert_fa_rule(o, tf.naive_attention(q, k, v, causal=True, scale=0.05)[0], ref_o, np.float16,
                   what="d=128 two row tiles o")
    assert_close(lse, ref_lse, F32_TOL, "d=128 two row tiles lse", is_lse=True)


def q_in_smem(d, row_tiles):
    """Q_IN_SMEM at the simulator's sizes: Q_i's A operands read from shared memory for every key tile,
    two mma steps at a time, instead of held in registers; one warp, 16 keys per tile."""
    return tct.TensorCoreTiling(D=d, WARPS=1, BC=16, ROW_TILES=row_tiles, Q_IN_SMEM=True).validate()


@pytest.mark.parametrize("row_tiles", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k", [(37, 29), (29, 37)])
def test_q_in_smem_ragged(rng, n_q, n_k, causal, row_tiles):
    """Q_i read from shared memory per key tile (it must survive every K_j, V_j copy), ragged on both sides;
    with causal and Nq > Nk, rows that see no key."""
    q, k, v = make_qkv(rng, (2,), n_q, n_k, d=64, dtype=np.float16)
    o, lse = tf.cuda_attention(q, k, v, causal=causal, kernel="v6", config=q_in_smem(64, row_tiles))
    check(o, lse, q, k, v, causal, f"v6 Q in smem, {row_tiles} row tiles {n_q}x{n_k} causal={causal}")
    if causal and n_q > n_k:
        assert np.all(o[:, :n_q - n_k] == 0) and np.all(np.isneginf(lse[:, :n_q - n_k]))


def test_q_in_smem_head_dim_128(rng):
    """d = 128: four pairs of mma steps over d, each pair's Q operands read again for every key tile."""
    q, k, v = make_qkv(rng, (), 41, 23, d=128, dtype=np.float16)
    o, lse = tf.cuda_attention(q, k, v, causal=True, scale=0.05, kernel="v6", config=q_in_smem(128, 2))
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=True, scale=0.05)
    assert_fa_rule(o, tf.naive_attention(q, k, v, causal=True, scale=0.05)[0], ref_o, np.float16,
                   what="d=128 Q in smem o")
    assert_close(lse, ref_lse, F32_TOL, "d=128 Q in smem lse", is_lse=True)


def lazy(d, row_tiles=1):
    """LAZY_RESCALE at the simulator's sizes: acc and l_i rescaled only when a row's max grows by more than
    2^RESCALE_LOG2; one warp, 16 keys per tile."""
    return tct.TensorCoreTiling(D=d, WARPS=1, BC=16, ROW_TILES=row_tiles, LAZY_RESCALE=True).validate()


@pytest.mark.parametrize("row_tiles", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_lazy_rescale(rng, causal, row_tiles):
    """Lazy rescaling takes both branches: the keys of later tiles score ever higher, so the max of most rows
    grows by more than 2^8 from tile to tile (rescaled), then stops growing (not rescaled: P_ij up to 2^8)."""
    q, k, v = make_qkv(rng, (1,), 37, 70, d=64, dtype=np.float16)
    growth = np.minimum(np.arange(70), 40) / 40.0  # (Nk,): keys 40 .. score like key 40
    k = (k + 3.0 * growth[:, None] * q[:, :1, :]).astype(np.float16)  # scores against q's first row grow
    q = (q + q[:, :1, :]).astype(np.float16)  # every row shares part of row 0, so every row's scores grow
    scale = 0.5  # scaled scores reach hundreds: a rise of 2^8 in exp2 units within one tile of 16 keys
    reference = tct.TensorCoreTiling(D=64, WARPS=1, BC=16, ROW_TILES=row_tiles).validate()
    o_lazy, lse_lazy = tf.cuda_attention(q, k, v, causal=causal, scale=scale, kernel="v6", config=lazy(64, row_tiles))
    o, lse = tf.cuda_attention(q, k, v, causal=causal, scale=scale, kernel="v6", config=reference)
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=causal, scale=scale)
    s = scale * LOG2E * np.einsum("hqd,hkd->hqk", q.astype(np.float64), k.astype(np.float64))  # (1, Nq, Nk) base 2
    first = s[..., :16].max(-1)  # (1, Nq): each row's max over the first tile
    assert (s.max(-1) - first > 2 * RESCALE_LOG2).mean() > 0.5  # most rows are rescaled again later
    assert_fa_rule(o_lazy, tf.naive_attention(q, k, v, causal=causal, scale=scale)[0], ref_o, np.float16,
                   what=f"lazy rescale o causal={causal}")
    assert_close(lse_lazy, ref_lse, F32_TOL, "lazy rescale lse", is_lse=True)
    assert_close(o_lazy.astype(np.float64), o.astype(np.float64), 2e-3, "lazy against eager rescaling")


def test_head_dim_128_and_a_scale(rng):
    q, k, v = make_qkv(rng, (), 17, 16, d=128, dtype=np.float16)
    o, lse = tf.tensor_core_attention(q, k, v, causal=True, scale=0.05)
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=True, scale=0.05)
    assert_fa_rule(o, tf.naive_attention(q, k, v, causal=True, scale=0.05)[0], ref_o, np.float16, what="d=128 o")
    assert_close(lse, ref_lse, F32_TOL, "d=128 lse", is_lse=True)


def bf16_attention(q, k, v, causal, config=None, version="v6"):
    """Kernel ``version`` (v6 unless named) on the bfloat16 patterns of q, k, v (float32 arrays): (o as float32,
    lse); config: its tiling."""
    prob = check_attention_inputs(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16),
                                  causal=causal, scale=None, allowed=(np.dtype(np.float16),))
    bits = [to_bits(x, "bfloat16").reshape(-1) for x in (q, k, v)]  # (Nq·d,), (Nk·d,), (Nk·d,) uint16
    o, lse = np.zeros(prob.n_q * prob.d, np.uint16), np.zeros(prob.n_q, np.float32)  # (Nq·d,), (Nq,)
    args = LaunchArgs(arrays={"Q": (bits[0], q.size), "K": (bits[1], k.size), "V": (bits[2], v.size), "O": (o, o.size),
                              "LSE": (lse, lse.size)},
                      scalars={"n_q": prob.n_q, "n_k": prob.n_k, "scale_log2": np.float32(prob.scale * LOG2E),
                               "causal": causal, "kv_group": 1}, n_heads=1)
    launch_tensor_cores(VERSIONS[version], args, prob, config, "bfloat16", who=f"kernel {version}")
    return from_bits(o, "bfloat16").reshape(prob.n_q, prob.d), lse


@pytest.mark.parametrize("row_tiles", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_bfloat16(rng, causal, row_tiles):
    """bfloat16: FlashAttention's rule against naive attention on the same bfloat16 inputs, rounded to bfloat16."""
    q, k, v = bf16_inputs(rng, 21, 30, 64)
    o, lse = bf16_attention(q, k, v, causal, config=tct.TensorCoreTiling(D=64, WARPS=1, BC=16, ROW_TILES=row_tiles))
    check_bf16(o, lse, q, k, v, causal)


def bf16_inputs(rng, n_q, n_k, d):
    """q, k, v as float32 arrays of values exact in bfloat16."""
    return (from_bits(to_bits(x, "bfloat16"), "bfloat16") for x in make_qkv(rng, (), n_q, n_k, d=d))


def check_bf16(o, lse, q, k, v, causal):
    """FlashAttention's rule for bfloat16 o against naive attention rounded to bfloat16; lse within F32_TOL."""
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=causal)
    naive = from_bits(to_bits(tf.naive_attention(q, k, v, causal=causal)[0], "bfloat16"), "bfloat16")

    def bf16(x):
        return from_bits(to_bits(x, "bfloat16"), "bfloat16").astype(np.float64)

    r = bf16(ref_o)
    atol = 2.0 * float(np.abs(bf16(bf16(r + 0.3) - 0.3) - r).max())  # flash-attn's fwd_atol, in bfloat16
    rule = RuleCheck(float(np.abs(o - ref_o).max()), float(np.abs(naive - ref_o).max()), atol, 2.0)
    assert rule.ok, str(rule)
    assert_close(lse, ref_lse, F32_TOL, "bf16 lse", is_lse=True)


def test_registered_and_through_cuda_attention(rng):
    """v6 is the next version; cuda_attention(kernel='v6') runs it on float16, refuses float32 clearly."""
    assert list(VERSIONS)[5] == "v6" and VERSIONS["v6"].accepts("bfloat16", 64, 64)
    assert not VERSIONS["v6"].accepts(np.float32, 64, 64) and VERSIONS["v6"].accepts(np.float16, 80, 80)
    assert not VERSIONS["v6"].accepts(np.float16, 84, 84) and not VERSIONS["v6"].accepts(np.float16, 264, 264)
    q, k, v = make_qkv(rng, (), 9, 18, d=64, dtype=np.float16)
    o, lse = tf.cuda_attention(q, k, v, kernel="v6")
    check(o, lse, q, k, v, False, "cuda_attention v6")
    with pytest.raises(TypeError, match="float16 or bfloat16.*cuda_attention"):
        tf.cuda_attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), kernel="v6")


@pytest.mark.parametrize("args, kwargs, error, match", [
    (((1, 5, 64), (1, 5, 64), (1, 5, 64), np.float32), {}, TypeError,
     r"^tensor_core_attention takes float16 or bfloat16; got q of dtype float32 \(tinyflash.cuda_attention takes "
     r"float16, bfloat16 and float32\)$"),
    (((1, 5, 84), (1, 5, 84), (1, 5, 84), np.float16), {}, ValueError,
     r"d = dv a multiple of 8 up to 256; got q \(1, 5, 84\).*cuda_attention"),
    (((1, 5, 264), (1, 5, 264), (1, 5, 264), np.float16), {}, ValueError, r"d = dv a multiple of 8 up to 256"),
    (((1, 5, 64), (1, 5, 64), (1, 5, 128), np.float16), {}, ValueError, "d = dv"),
    (((1, 5, 64), (1, 0, 64), (1, 0, 64), np.float16), {}, ValueError, "Nk >= 1"),
    (((1, 5, 64), (1, 5, 64), (1, 5, 64), np.float16), {"causal": 1}, TypeError, "causal must be True or False"),
    (((1, 5, 64), (1, 5, 64), (1, 5, 64), np.float16), {"causal": "yes"}, TypeError, "^causal must be True or False"),
    (((1, 5, 64), (1, 5, 64), (1, 5, 64), np.float16), {"scale": "big"}, TypeError, "^scale must be"),
])
def test_bad_inputs(rng, args, kwargs, error, match):
    *shapes, dtype = args
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in shapes)
    with pytest.raises(error, match=match):
        tf.tensor_core_attention(q, k, v, **kwargs)


@pytest.mark.parametrize("group", [1, 2, None])
def test_block_order(rng, group):
    """Every (head, query tile) computed once whatever the heads ordered together (block_work): one head after
    another (1), groups of 2 with a last group of 1 (5 heads), and the rule's (all 5: tiny K, V), causal, where
    the order runs longest tiles first; the same bits in every order."""
    q, k, v = make_qkv(rng, (5,), 24, 24, d=64, dtype=np.float16)  # two query tiles, two key tiles
    cfg = tct.TensorCoreTiling(D=64, WARPS=1, BC=16, HEAD_GROUP=group).validate()
    o, lse = tf.cuda_attention(q, k, v, causal=True, kernel="v6", config=cfg)
    check(o, lse, q, k, v, True, f"v6 head group {group}")
    o1, lse1 = tf.cuda_attention(q, k, v, causal=True, kernel="v6", config=tct.simulator_tiling(64))
    assert np.array_equal(o, o1) and np.array_equal(lse, lse1)


def test_head_group_rule():
    """Not causal: one head after another. Causal: the heads whose K and V fit in L2_KV_BYTES, whole K/V heads
    (kv_group query heads each), at most all of them; HEAD_GROUP overrides the rule."""
    cfg = tct.default_tiling(128, True, 4096)
    kv_bytes = 2 * 4096 * 128 * 2
    assert cfg.head_group(4096, 32, 1, False) == 1
    assert cfg.head_group(4096, 64, 1, True) == tct.L2_KV_BYTES // kv_bytes > 1
    assert cfg.head_group(4096, 64, 4, True) == min(64, 4 * (tct.L2_KV_BYTES // kv_bytes))
    assert cfg.head_group(4096, 3, 1, True) == 3  # fewer heads than the rule's
    assert cfg.head_group(10**7, 32, 2, True) == 2  # K, V larger than L2: still one K/V head
    forced = tct.TensorCoreTiling(D=128, WARPS=4, BC=64, ROW_TILES=2, HEAD_GROUP=5)
    assert forced.head_group(4096, 32, 1, False) == 5 and forced.head_group(4096, 3, 1, True) == 3
    with pytest.raises(ValueError, match="HEAD_GROUP"):
        tct.TensorCoreTiling(D=64, WARPS=1, BC=16, HEAD_GROUP=0).validate()


def test_tiling_rules():
    assert tct.default_tiling(128, False).smem_bytes > 48 * 1024  # asks the driver for more (gpu/smem.py)
    assert tct.TensorCoreTiling(D=64, WARPS=8, BC=16).problems()  # 128 chunks for 256 threads: uneven
    for d in (100, 264):
        with pytest.raises(ValueError, match="D must be a multiple of 8 up to 256"):
            tct.TensorCoreTiling(D=d, WARPS=1, BC=16).validate()
    for rows in (0, 3):
        with pytest.raises(ValueError, match="ROW_TILES"):
            tct.TensorCoreTiling(D=64, WARPS=1, BC=16, ROW_TILES=rows).validate()
    two = tct.TensorCoreTiling(D=128, WARPS=4, BC=32, ROW_TILES=2).validate()  # 32 query rows per warp
    assert two.BR == 128 and two.NT == 128 and two.smem_layout()["stage 0"] == 128 * two.ROW_WORDS  # Q_i: Br rows
    in_smem = tct.TensorCoreTiling(D=128, WARPS=4, BC=32, ROW_TILES=2, Q_IN_SMEM=True).validate()
    assert in_smem.smem_layout() == two.smem_layout()  # Q_i's region is there either way; only its readers differ
    for d in (64, 128):  # the simulator's smallest tiling; the GPU's from the H200 sweep
        assert tct.simulator_tiling(d).ROW_TILES == 1 and not tct.simulator_tiling(d).Q_IN_SMEM
        for causal in (False, True):  # 32 rows per warp at both head dims; Q_i read from shared memory at d = 128
            assert tct.default_tiling(d, causal).ROW_TILES == 2
            assert tct.default_tiling(d, causal).Q_IN_SMEM == (d == 128)
            assert tct.default_tiling(d, causal).LAZY_RESCALE == (d == 128 or causal)  # measured: where it paid
    # 128-row blocks for short causal sequences at d = 128 only; the long-sequence tiling when Nq is not given
    assert tct.default_tiling(128, True, tct.SHORT_CAUSAL - 1).WARPS == 4 and tct.default_tiling(128, True).WARPS == 8
    assert tct.default_tiling(128, False, 16).WARPS == 8 and tct.default_tiling(64, True, 16).WARPS == 4


def test_call_key(rng):
    """What a call's plan is kept by: CuPy and PyTorch CUDA arrays only, and only a bool causal and a float or
    None scale (causal=1 hashes like True, but must still be refused by the checks)."""
    from tinyflash.host.plans import call_key

    fake = type("ndarray", (), {"__module__": "cupy._core.core", "shape": (2, 9, 64), "dtype": np.dtype(np.float16),
                                "device": type("Device", (), {"id": 1})()})
    q = fake()
    assert call_key(q, q, q, True, None) == ("cupy", (2, 9, 64), (2, 9, 64), (2, 9, 64), *(np.dtype(np.float16),) * 3,
                                             True, None, (1, 1, 1))  # and the GPU of each
    assert call_key(q, q, q, False, 0.125)[-3:-1] == (False, 0.125)
    for causal, scale in ((1, None), (np.bool_(True), None), (True, 1), (True, np.float32(0.125))):
        assert call_key(q, q, q, causal, scale) is None
    host = rng.standard_normal((2, 9, 64)).astype(np.float16)
    assert call_key(host, host, host, True, None) is None  # NumPy: copied to the GPU at every call anyway
    assert call_key(q, host, q, True, None) is None


def test_on_the_gpu_copies_only_host_arrays():
    """``host.launch.on_the_gpu`` (a TMA kernel's NumPy inputs go to the GPU: a tensor map holds a device address):
    host arrays are copied there and the host outputs back; an output the wrapper allocated on the GPU (as it does
    for NumPy inputs) is handed over as it is and written there, never copied onto itself."""
    from numba import cuda

    from tinyflash.gpu.arrays import is_device_array
    from tinyflash.gpu.launch import LaunchArgs
    from tinyflash.host.launch import on_the_gpu

    q, host_out = np.arange(6, dtype=np.float32), np.zeros(6, np.float32)
    device_out = cuda.to_device(np.zeros(6, np.float32))
    seen = {}

    def launch_there(args):
        seen.update({name: a for name, (a, _) in args.arrays.items()})
        for name in ("O", "LSE"):
            args.arrays[name][0].copy_to_device(args.arrays["Q"][0].copy_to_host() + 1)

    on_the_gpu(LaunchArgs(arrays={"Q": (q, 6), "O": (device_out, 6), "LSE": (host_out, 6)}, scalars={}, n_heads=1),
               ("O", "LSE"), launch_there)
    assert all(map(is_device_array, seen.values())) and seen["O"] is device_out
    assert np.array_equal(host_out, q + 1) and np.array_equal(device_out.copy_to_host(), q + 1)
