"""Stage 4, kernels v7 (wgmma), v8 (TMA), v9 (warp specialisation) and v10 (ping-pong), at the smallest sizes their
tiles allow: one (consumer) warpgroup of 128 threads (64 query rows), 16 keys per tile, v9 and v10 with their
producer warpgroup besides (and two consumers by default: v10's take turns).
On numba's simulator, with the emulated instructions of tinyflash.gpu.wgmma_emulation and tma_emulation; on a
Hopper GPU the same tests run the real ones (elsewhere they are skipped: they need compute capability 9.0).
Most tests run for every version (``HOPPER``, from the registry); v7's through hopper_attention, the entry point.

float16 through hopper_attention; bfloat16, which NumPy lacks, through the kernel's launch with 16-bit
patterns made by tinyflash.gpu.ptx_emulation.to_bits. Results against the float64 reference: FlashAttention's
rule for o against naive attention in the same precision, lse within F32_TOL.
"""

import numpy as np
import pytest
from conftest import make_qkv
from test_tensor_core import bf16_attention, bf16_inputs, check_bf16

import tinyflash as tf
from tinyflash.core.tolerance import F32_TOL, assert_close, assert_fa_rule
from tinyflash.forward.kernels import VERSIONS, WIDER_VERSIONS
from tinyflash.forward.kernels.hopper_tiling import HopperTiling
from tinyflash.forward.kernels.tma_tiling import TmaTiling
from tinyflash.gpu.runtime import simulator_enabled

pytestmark = [pytest.mark.simulator, pytest.mark.grid]
HOPPER = [name for name in WIDER_VERSIONS if int(name[1:]) >= 7]  # the wgmma kernels on 16-bit inputs (v11: test_hopper_fp8.py)
ENTRY = VERSIONS.default("hopper_attention").name  # what hopper_attention runs


def attention(version, q, k, v, **options):
    """``version`` on q, k, v: through hopper_attention for the version it runs, else cuda_attention(kernel=...)."""
    if version == ENTRY and "config" not in options:
        return tf.hopper_attention(q, k, v, **options)
    return tf.cuda_attention(q, k, v, kernel=version, **options)


def tiling(version, d, warpgroups, bc, **more):
    """A tiling of ``version``: v7's HopperTiling; v8's TmaTiling; v9's and v10's, with a producer warpgroup."""
    if version == "v7":
        return HopperTiling(D=d, WARPGROUPS=warpgroups, BC=bc, **more).validate()
    return TmaTiling(D=d, WARPGROUPS=warpgroups, BC=bc, PRODUCER=version != "v8", **more).validate()


@pytest.fixture(autouse=True)
def hopper_or_simulator():
    if not simulator_enabled():
        from tinyflash.gpu.runtime import compute_capability

        if compute_capability() != (9, 0):
            pytest.skip("kernel v7 (wgmma) needs compute capability 9.0")


def check(o, lse, q, k, v, causal, what, scale=None):
    """FlashAttention's rule for o against naive float16 attention; lse within F32_TOL (float32 math)."""
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=causal, scale=scale)
    assert_fa_rule(o, tf.naive_attention(q, k, v, causal=causal, scale=scale)[0], ref_o, np.float16, what=f"{what} o")
    assert_close(lse, ref_lse, F32_TOL, f"{what} lse", is_lse=True)


@pytest.mark.parametrize("version", HOPPER)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k", [(20, 37), (33, 17)])
def test_float16_ragged(rng, n_q, n_k, causal, version):
    """Ragged tiles on both sides (a 64-row warpgroup tile mostly past Nq), Nq != Nk; with causal and Nq > Nk,
    rows that see no key."""
    q, k, v = make_qkv(rng, (1,), n_q, n_k, d=64, dtype=np.float16)
    copies = [x.copy() for x in (q, k, v)]
    o, lse = attention(version, q, k, v, causal=causal)
    assert o.dtype == np.float16 and o.shape == (1, n_q, 64) and lse.dtype == np.float32 and lse.shape == (1, n_q)
    check(o, lse, q, k, v, causal, f"{version} {n_q}x{n_k} causal={causal}")
    assert all(np.array_equal(x, c) for x, c in zip((q, k, v), copies))  # inputs untouched
    if causal and n_q > n_k:
        assert np.all(o[0, :n_q - n_k] == 0) and np.all(np.isneginf(lse[0, :n_q - n_k]))


# slow on the simulator (a warpgroup or three, 5 key tiles at d = 128): each stage's barrier through 3 phases
@pytest.mark.parametrize("version", HOPPER)
@pytest.mark.parametrize("causal", [False, True])
def test_head_dim_128_many_tiles(rng, causal, version):
    """d = 128 (Q_i, K_j, V_j in two 64-column halves, two TMA boxes each; V_j's descriptor crosses them), 5 key
    tiles through the two stages (each stage's barrier through 3 phases), a full 64-row tile and a scale."""
    q, k, v = make_qkv(rng, (), 64, 80, d=128, dtype=np.float16)
    o, lse = attention(version, q, k, v, causal=causal, scale=0.05)
    check(o, lse, q, k, v, causal, f"{version} d=128 64x80 causal={causal}", scale=0.05)


@pytest.mark.parametrize("version", HOPPER)
@pytest.mark.parametrize("causal, n_q, n_k", [(False, 20, 37), (True, 45, 29)])
def test_head_dim_256(rng, causal, n_q, n_k, version):
    """d = 256 (FlashAttention-3's largest): Q_i, K_j, V_j in four 64-column pieces, four TMA boxes each; S_ij's
    16 k-steps cross three pieces, P·V's wgmma is m64n256 (V_j's descriptor across four). Ragged on both sides;
    causal with Nq > Nk, rows that see no key."""
    q, k, v = make_qkv(rng, (1,), n_q, n_k, d=256, dtype=np.float16)
    o, lse = attention(version, q, k, v, causal=causal)
    assert o.shape == (1, n_q, 256) and lse.shape == (1, n_q)
    check(o, lse, q, k, v, causal, f"{version} d=256 {n_q}x{n_k} causal={causal}")
    if causal:
        assert np.all(o[0, :n_q - n_k] == 0) and np.all(np.isneginf(lse[0, :n_q - n_k]))


@pytest.mark.parametrize("causal", [False, True])
def test_head_dim_256_bfloat16(rng, causal):
    """d = 256 in bfloat16 through the kernel hopper_attention runs, ragged, causal and not."""
    q, k, v = bf16_inputs(rng, 19, 35, 256)  # exact in bfloat16
    o, lse = bf16_attention(q, k, v, causal, version=ENTRY)
    check_bf16(o, lse, q, k, v, causal)


@pytest.mark.parametrize("version", HOPPER)
def test_two_warpgroups(rng, version):
    """Two (consumer) warpgroups (Br = 128), 32-key tiles, causal with Nq > 64: the second warpgroup's rows of
    Q_i, its first warp's causal skip, and 36 rows past Nq (the TMA box of Q_i reads them as zeros)."""
    q, k, v = make_qkv(rng, (1,), 92, 70, d=64, dtype=np.float16)
    o, lse = attention(version, q, k, v, causal=True, config=tiling(version, 64, 2, 32))
    check(o, lse, q, k, v, True, f"{version} two warpgroups 92x70 causal")
    assert np.all(o[0, :92 - 70] == 0) and np.all(np.isneginf(lse[0, :92 - 70]))


def test_eager_rescaling_equals_lazy(rng):
    """LAZY_RESCALE off: the running state rescaled at every tile; the same attention within the rule."""
    q, k, v = make_qkv(rng, (1,), 40, 50, d=64, dtype=np.float16)
    q *= 3  # scores that grow from tile to tile often enough to rescale
    eager = HopperTiling(D=64, WARPGROUPS=1, BC=16, LAZY_RESCALE=False).validate()
    o, lse = tf.cuda_attention(q, k, v, causal=True, kernel="v7", config=eager)
    check(o, lse, q, k, v, True, "v7 eager rescaling")
    o_lazy, lse_lazy = tf.hopper_attention(q, k, v, causal=True)
    assert_close(o_lazy.astype(np.float64), o.astype(np.float64), 2e-3, "lazy against eager rescaling")


@pytest.mark.parametrize("version", [v for v in HOPPER if v != "v10"])  # v10: in its test against v9, below
def test_grouped_query_heads(rng, version):
    """2 query heads on 1 K/V head (and a batch of 2): the same numbers as with K, V repeated to 2 heads (the
    TMA kernels' K and V maps have 2 heads, Q's 4)."""
    q = rng.standard_normal((2, 2, 17, 64)).astype(np.float16)  # (B, H, Nq, d)
    _, k, v = make_qkv(rng, (2, 1), 1, 20, d=64, dtype=np.float16)  # (B, H_kv, Nk, d)
    o, lse = attention(version, q, k, v, causal=True)
    o_rep, lse_rep = attention(version, q, np.repeat(k, 2, axis=-3), np.repeat(v, 2, axis=-3), causal=True)
    assert np.array_equal(o, o_rep) and np.array_equal(lse, lse_rep)
    check(o, lse, q, k, v, True, f"{version} GQA")


@pytest.mark.parametrize("version", [v for v in HOPPER if v != "v7"])
def test_three_stages_many_tiles(rng, version):
    """A ring of 3 stages over 7 key tiles (ragged), two query tiles: each stage's barriers through their phases,
    tile j + 2 requested while tile j is multiplied."""
    q, k, v = make_qkv(rng, (1,), 70, 100, d=64, dtype=np.float16)
    o, lse = attention(version, q, k, v, causal=False, config=tiling(version, 64, 1, 16, STAGES=3))
    check(o, lse, q, k, v, False, f"{version} 3 stages 70x100")


# slow on the simulator (two kernels of 384 threads, 4 key tiles): the same bits need both on the same inputs
def test_ping_pong_is_warp_specialisation_bit_for_bit(rng):
    """v10 overlaps the softmax with the products and takes turns, but computes every value as v9 does, in the same
    order: the same bits, ragged and causal over 4 key tiles, scores large enough to rescale often, two query heads
    on one K/V head (v10's grouped-query test). On the simulator a product reaches its registers at the wait that
    retires it: S_ij or acc read too early would differ."""
    q = 3 * rng.standard_normal((1, 2, 50, 64)).astype(np.float16)  # (B, H, Nq, d); 3: scores that grow from tile
    # to tile, so that lazy rescaling rescales at some tiles and not at others
    _, k, v = make_qkv(rng, (1, 1), 1, 61, d=64, dtype=np.float16)  # (B, H_kv, Nk, d)
    o9, lse9 = tf.cuda_attention(q, k, v, causal=True, kernel="v9")
    o10, lse10 = tf.cuda_attention(q, k, v, causal=True, kernel="v10")
    assert np.array_equal(o10, o9) and np.array_equal(lse10, lse9)
    check(o10, lse10, q, k, v, True, "v10 GQA 50x61 causal")


def test_ping_pong_three_consumers(rng):
    """Three consumer warpgroups (Br = 192) take turns in a ring, 0, 1, 2, 0, ...: barriers 1 to 3."""
    q, k, v = make_qkv(rng, (1,), 150, 45, d=64, dtype=np.float16)
    cfg = tiling("v10", 64, 3, 16, CONSUMER_REGISTERS=160)  # 3 · 160 + 24 registers a thread fit
    o, lse = tf.cuda_attention(q, k, v, causal=False, kernel="v10", config=cfg)
    check(o, lse, q, k, v, False, "v10 three consumers 150x45")


def test_ping_pong_needs_a_producer(rng):
    q, k, v = make_qkv(rng, (1,), 8, 8, d=64, dtype=np.float16)
    with pytest.raises(ValueError, match="kernel v10 needs a producer warpgroup"):
        tf.cuda_attention(q, k, v, kernel="v10", config=TmaTiling(D=64, WARPGROUPS=1, BC=16).validate())


@pytest.mark.parametrize("version", HOPPER)
@pytest.mark.parametrize("causal", [False, True])
def test_bfloat16(rng, causal, version):
    """bfloat16: FlashAttention's rule against naive attention on the same bfloat16 inputs, rounded to bfloat16."""
    q, k, v = bf16_inputs(rng, 21, 30, 64)  # exact in bfloat16
    o, lse = bf16_attention(q, k, v, causal, version=version)
    check_bf16(o, lse, q, k, v, causal)


def test_bad_inputs_name_the_argument(rng):
    q, k, v = make_qkv(rng, (1,), 8, 8, d=64, dtype=np.float32)
    with pytest.raises(TypeError, match="hopper_attention takes float16 or bfloat16; got q of dtype float32"):
        tf.hopper_attention(q, k, v)
    q, k, v = make_qkv(rng, (1,), 8, 8, d=96, dtype=np.float16)
    with pytest.raises(ValueError, match=r"hopper_attention supports d = dv one of \(64, 128, 256\); got q"):
        tf.hopper_attention(q, k, v)


@pytest.mark.parametrize("version", HOPPER)
def test_registered_with_its_limits(version):
    entry = VERSIONS[version]
    assert entry.accepts("bfloat16", 128, 128) and entry.accepts(np.float16, 64, 64)
    assert entry.accepts("bfloat16", 256, 256) and entry.accepts(np.float16, 256, 256)
    assert not entry.accepts(np.float32, 64, 64) and not entry.accepts(np.float16, 96, 96)
    assert not entry.accepts(np.float16, 256, 128)  # d = dv only


def test_tma_tilings_checked():
    assert TmaTiling(D=128, WARPGROUPS=2, BC=128, PRODUCER=True).NT == 384
    with pytest.raises(ValueError, match="STAGES"):
        TmaTiling(D=64, WARPGROUPS=1, BC=64, STAGES=5).validate()
    with pytest.raises(ValueError, match="registers"):
        TmaTiling(D=64, WARPGROUPS=2, BC=64, PRODUCER=True, PRODUCER_REGISTERS=40).validate()
    with pytest.raises(ValueError, match="shared memory"):
        TmaTiling(D=128, WARPGROUPS=2, BC=128, STAGES=4).validate()
    with pytest.raises(ValueError, match="shared memory"):  # d = 256: 80 keys a tile is the most two stages hold
        TmaTiling(D=256, WARPGROUPS=2, BC=96, PRODUCER=True).validate()
    with pytest.raises(ValueError, match="WARPGROUPS"):
        HopperTiling(D=64, WARPGROUPS=4, BC=64).validate()
    with pytest.raises(ValueError, match="BC must be a multiple of 16"):
        HopperTiling(D=64, WARPGROUPS=1, BC=24).validate()


@pytest.mark.parametrize("version", HOPPER)
def test_the_gpu_tilings_fit_every_head_dim(version):
    """Each kernel's tiling on a GPU at each d it takes passes its checks and fits the 227 KiB a block may have
    on an H200; at d = 256, FlashAttention-3's 128 × 80 in two stages (three of 80 keys would not fit)."""
    for d in VERSIONS[version].head_dims:
        cfg = VERSIONS[version].tilings[0](d)  # validated
        assert cfg.D == d and cfg.smem_bytes <= 227 * 1024, cfg
    big = VERSIONS[version].tilings[0](256)
    assert (big.BR, big.BC, getattr(big, "STAGES", 2)) == (128, 80, 2)


def test_the_tilings_the_benchmark_times_are_valid():
    """Every tiling of the hopper-tiles benchmark passes the tiling's own checks before a GPU sees it."""
    from tinyflash.bench.suites import V7_TILINGS

    for d, tilings in V7_TILINGS.items():
        for warpgroups, bc in tilings:
            cfg = HopperTiling(D=d, WARPGROUPS=warpgroups, BC=bc).validate()
            assert cfg.smem_bytes <= 227 * 1024, cfg
