"""Stage 4 (kernels v7 wgmma, v8 TMA, v9 warp specialisation, v10 ping-pong) on a Hopper GPU at real sizes:
hopper_attention's call path on PyTorch tensors with each version (``HOPPER``, from the registry), float16 and
bfloat16, d = 64, 128 and 256, causal or not, grouped-query heads, ragged lengths; v10 against v9, bit for bit.

Each result is checked on sampled query rows of the first and last head against the float64 reference, by
FlashAttention's rule against naive attention computed in the same precision by PyTorch
(``tinyflash.bench.checking.check_output``). Skipped without a GPU (conftest), and on a GPU that is not
compute capability 9.0 (wgmma exists there only), except the test of the error such a GPU gives.
Run: ``python -m pytest -m gpu tests/test_hopper_gpu.py tests/test_wgmma_ptx.py tests/test_tma_ptx.py
tests/test_hopper.py``.
"""

import numpy as np
import pytest

import tinyflash as tf
from tinyflash.core.tolerance import fa_rule

pytestmark = pytest.mark.gpu
NS = [1, 17, 128, 1000, 4097]
HOPPER = [name for name in __import__("tinyflash.forward.kernels", fromlist=["WIDER_VERSIONS"]).WIDER_VERSIONS
          if int(name[1:]) >= 7]  # the wgmma kernels on 16-bit inputs (v11, on e4m3: tests/test_hopper_fp8_gpu.py)


def attention(version, q, k, v, causal):
    """hopper_attention's call path (checks, plan, launch through the driver for device arrays) with ``version``."""
    return tf.hopper_attention(q, k, v, causal=causal, kernel=version)


def on_hopper() -> bool:
    from tinyflash.gpu.runtime import compute_capability

    return compute_capability() == (9, 0)


@pytest.fixture
def hopper():
    if not on_hopper():
        pytest.skip("kernel v7 (wgmma) needs compute capability 9.0")


def random_qkv(torch, n_q, n_k, d, dtype, heads=2, kv_heads=None, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    kv_heads = kv_heads or heads
    return [torch.randn((1, h, n, d), device="cuda", dtype=torch.float32, generator=gen).to(dtype)
            for h, n in ((heads, n_q), (kv_heads, n_k), (kv_heads, n_k))]  # (1, H, Nq, d), (1, H_kv, Nk, d) x 2


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("version", HOPPER)
def test_lengths(rng, hopper, version, n, d, causal, dtype):
    torch = pytest.importorskip("torch")
    from tinyflash.bench.checking import check_output

    q, k, v = random_qkv(torch, n, n, d, getattr(torch, dtype), seed=int(rng.integers(2**31)))
    o, lse = attention(version, q, k, v, causal)
    assert o.dtype == q.dtype and o.shape == q.shape and lse.dtype == torch.float32 and lse.shape == q.shape[:-1]
    verdict = check_output(o, q, k, v, causal=causal, rng=rng, lse=lse)
    assert verdict.ok, verdict


@pytest.mark.parametrize("n_q, n_k", [(1000, 777), (300, 4096), (4097, 129)])
@pytest.mark.parametrize("version", HOPPER)
def test_unequal_lengths(rng, hopper, version, n_q, n_k):
    torch = pytest.importorskip("torch")
    from tinyflash.bench.checking import check_output

    for d in (64, 128, 256):
        for causal in (False, True):
            for dtype in (torch.float16, torch.bfloat16):
                q, k, v = random_qkv(torch, n_q, n_k, d, dtype, seed=int(rng.integers(2**31)))
                o, lse = attention(version, q, k, v, causal)
                verdict = check_output(o, q, k, v, causal=causal, rng=rng, lse=lse)
                assert verdict.ok, (d, causal, dtype, verdict)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [128, 256])
@pytest.mark.parametrize("heads, kv_heads", [(8, 2), (8, 1)])
@pytest.mark.parametrize("version", HOPPER)
def test_grouped_query_heads(rng, hopper, version, heads, kv_heads, d, dtype):
    """GQA and MQA: the same numbers as with K and V repeated to every query head, and right by the rule."""
    torch = pytest.importorskip("torch")
    from tinyflash.bench.checking import check_output

    q, k, v = random_qkv(torch, 1000, 1500, d, getattr(torch, dtype), heads, kv_heads, int(rng.integers(2**31)))
    o, lse = attention(version, q, k, v, True)
    group = heads // kv_heads
    o_rep, lse_rep = attention(version, q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), True)
    assert torch.equal(o, o_rep) and torch.equal(lse, lse_rep)
    verdict = check_output(o, q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), causal=True, rng=rng,
                           lse=lse)
    assert verdict.ok, verdict


def test_tilings(rng, hopper):
    """Each tiling the hopper-tiles benchmark times, ragged and causal: right before it is timed."""
    torch = pytest.importorskip("torch")
    from tinyflash.bench.checking import check_output
    from tinyflash.bench.suites import V7_TILINGS
    from tinyflash.forward.kernels.hopper_tiling import HopperTiling

    for d, tilings in V7_TILINGS.items():
        for wg, bc in tilings:
            q, k, v = random_qkv(torch, 1111, 1111, d, torch.float16, seed=int(rng.integers(2**31)))
            cfg = HopperTiling(D=d, WARPGROUPS=wg, BC=bc).validate()
            o, lse = tf.cuda_attention(q, k, v, causal=True, kernel="v7", config=cfg)
            verdict = check_output(o, q, k, v, causal=True, rng=rng, lse=lse)
            assert verdict.ok, (cfg, verdict)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("n_q, n_k", [(1000, 777), (4097, 4097)])
def test_ping_pong_is_warp_specialisation_bit_for_bit(rng, hopper, n_q, n_k, d, dtype):
    """v10 computes every value as v9 does, in the same order, with its softmax under the tensor cores' products and
    its warpgroups taking turns: the same bits, causal or not. A race (a register or a stage read before its wait)
    would show as a difference."""
    torch = pytest.importorskip("torch")
    for causal in (False, True):
        q, k, v = random_qkv(torch, n_q, n_k, d, getattr(torch, dtype), heads=4, seed=int(rng.integers(2**31)))
        o9, lse9 = attention("v9", q, k, v, causal)
        o10, lse10 = attention("v10", q, k, v, causal)
        assert torch.equal(o10, o9) and torch.equal(lse10, lse9), (causal, (o10 - o9).abs().max())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_ping_pong_three_consumers(rng, hopper, dtype):
    """d = 64 with three consumer warpgroups (Br = 192, FlashAttention-3's block at d = 64) at 160 registers each,
    taking turns in a ring: right by the rule, ragged and causal or not."""
    torch = pytest.importorskip("torch")
    from tinyflash.bench.checking import check_output
    from tinyflash.forward.kernels.tma_tiling import TmaTiling

    cfg = TmaTiling(D=64, WARPGROUPS=3, BC=128, PRODUCER=True, CONSUMER_REGISTERS=160).validate()
    for causal in (False, True):
        q, k, v = random_qkv(torch, 3001, 2500, 64, getattr(torch, dtype), seed=int(rng.integers(2**31)))
        o, lse = tf.cuda_attention(q, k, v, causal=causal, kernel="v10", config=cfg)
        verdict = check_output(o, q, k, v, causal=causal, rng=rng, lse=lse)
        assert verdict.ok, (causal, verdict)


@pytest.mark.parametrize("version", HOPPER)
def test_deterministic(rng, hopper, version):
    """The same inputs give bitwise the same outputs: no atomics, a fixed order of every sum (and, for the TMA
    kernels, new arrays at other addresses: their tensor maps are not those of the first call)."""
    torch = pytest.importorskip("torch")
    q, k, v = random_qkv(torch, 3000, 3000, 128, torch.bfloat16, heads=4)
    first = attention(version, q, k, v, True)
    for _ in range(3):
        q, k, v = q.clone(), k.clone(), v.clone()
        again = attention(version, q, k, v, True)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("version", HOPPER)
def test_numpy_float16_and_v6_agree(rng, hopper, version):
    """NumPy in, NumPy out (through numba's launch: the TMA kernels' maps made for the launch); right by the rule;
    close to v6 (both accumulate in float32, in another order)."""
    q, k, v = (rng.standard_normal((2, 300, 64)).astype(np.float16) for _ in range(3))
    o, lse = attention(version, q, k, v, True)
    assert isinstance(o, np.ndarray) and o.dtype == np.float16
    ref_o = tf.reference_attention(q, k, v, causal=True)[0]
    assert fa_rule(o, tf.naive_attention(q, k, v, causal=True)[0], ref_o, np.float16).ok
    o6, lse6 = tf.tensor_core_attention(q, k, v, causal=True)
    assert np.abs(lse - lse6).max() < 1e-4 and np.abs(o.astype(np.float32) - o6).max() < 1e-2


def test_a_clear_error_off_hopper(rng):
    """On a GPU that is not compute capability 9.0: UnsupportedGPUError, which names what runs there instead."""
    if on_hopper():
        pytest.skip("this GPU is Hopper: the error is for the others")
    from tinyflash.gpu.runtime import UnsupportedGPUError

    q, k, v = (rng.standard_normal((1, 64, 64)).astype(np.float16) for _ in range(3))
    with pytest.raises(UnsupportedGPUError, match="compute capability 9.0 exactly.*tensor_core_attention"):
        tf.hopper_attention(q, k, v)
