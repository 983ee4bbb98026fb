"""Kernel v11 (``tinyflash.hopper_fp8_attention``: FP8 wgmma on e4m3 Q, K, V) on numba's simulator, at one or two
tiles, against ``tinyflash.fp8_attention`` (the NumPy emulation that rounds as the kernel does) and against float64
attention of the values the inputs stand for (q8 · descale_q, ...). The key renumbering that carries P from the
score accumulators into the e4m3 A operand is checked by itself first, in Python and in a simulated warpgroup.

**Against the emulation** (``emulation_bounds``), fp8_attention with Bc = 128 keys a tile (the kernel's: P is
computed from the running maximum of the tiles seen so far, so the tiling changes which values are rounded to e4m3).
Both compute the same float32 P up to exp2's last bit, round it to e4m3 alike, and differ by

* the output's rounding to bfloat16 (8 significant bits): at most 2^-8 |O|;
* float32's roundings in another order: the products are exact and the wgmma's sums rounded once per instruction
  (the emulation's: at every add), l_i summed by lanes then across them. Each of the n <= Nk + 2 · tiles roundings
  errs by 2^-24 of a partial sum of P|v| (or of P for l), and Σ P|v| / l <= max|v|: with Nk <= 2^8 here, at most
  2^-16 max|v| each for acc and l, so 2^-15 · max|v| · descale_v for O; for lse (ln l, and m from S's float32 sum
  over d) 2^-15 (1 + |lse|);
* on a GPU, the FP8 tensor cores' additions, which keep about 13 bits (``tests/test_wgmma_fp8_ptx.py``: an
  instruction errs by at most UNIT = 2^-12 of the sum of its |products| and of |D|, over ``steps`` chained
  instructions steps · UNIT of the bound). For S: K steps = d / 32 instructions, an error in S (natural units) of
  dS = (d / 32) · 2^-12 · scale · descales · max Σ_d |q||k|, which moves P by a factor e^±dS and so O by at most
  2 dS max|v| and lse by dS; for P·V, ceil(Nk / 32) chained instructions: ceil(Nk / 32) · 2^-12 · max|v|. And
  cvt's rounding of P to e4m3 may go the other way where the GPU's exp2 (``ex2.approx``, a few float32 ulps) lands
  P on the other side of a midpoint between two e4m3 numbers: such an entry moves by one e4m3 step, at most 2^-3 P,
  which the float64 bound below covers; the GPU tests compare with the emulation by the bound against float64.

**Against float64** (``float64_bounds``): the inputs' values are exact (the descales multiply e4m3 numbers), so the
errors are the kernel's own. P is rounded to e4m3 for P·V but summed into l unrounded: an entry P >= 2^-6 moves by
at most 2^-4 P, a subnormal one by at most 2^-10, so O moves by at most (2^-4 Σ P|v| + 2^-10 Nk max|v|) / l; with
l >= 2^8 (the row's largest entry is P = 2^8 exactly), that is 2^-4 max|v| + 2^-18 Nk max|v|. Add the bfloat16
output (2^-8 |O|), the float32 terms and on a GPU the accumulation terms above. lse uses the unrounded P: only the
float32 terms and dS. The bounds are worst cases; the emulation's comparison is the tight one (a misplaced key, a
lost descale or a wrong offset moves O by a good part of max|v|, and the emulation bound's 2^-15 max|v| is far less).
``tinyflash.core.tolerance.fp8_bounds`` computes these bounds; the GPU tests (``test_hopper_fp8_gpu.py``) and the
benchmark (``benchmarks/fp8_forward_timing.py``) use it too.
"""

import ml_dtypes
import numpy as np
import pytest
from numba import cuda, float32, uint32, uint64
from test_wgmma_fp8_ptx import UNIT, as_words, copy_plan
from test_wgmma_ptx import ALIGN, lanes_to_matrix, needs_hopper

import tinyflash as tf
from tinyflash.core.e4m3 import round_e4m3
from tinyflash.core.tolerance import fp8_bounds
from tinyflash.forward.kernels import VERSIONS
from tinyflash.forward.kernels.fp8_tiling import Fp8Tiling, padded_keys, transpose_v
from tinyflash.gpu import ptx, wgmma
from tinyflash.gpu.runtime import simulator_enabled
from tinyflash.gpu.wgmma_emulation import a_fragment_e4m3, accumulator_place
from tinyflash.warpgroup_tile import WarpgroupTile, fp8_key_of_column, fp8_warpgroup_tile

BC = 128  # the kernel's key tile


def dequantized(x: tf.FP8Inputs):
    """The float64 values the e4m3 inputs stand for: q8 · descale_q, ... (each descale per tensor or per head)."""
    def times(a, d):
        d = np.asarray(d, np.float64)
        return a.astype(np.float64) * (d if d.ndim == 0 else d[..., None, None])

    return times(x.q, x.descale_q), times(x.k, x.descale_k), times(x.v, x.descale_v)


def check_within(got, ref, bound, what):
    """got within ``bound`` of ref, element by element (-inf where ref is -inf); the worst element on failure."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert np.array_equal(np.isfinite(got), np.isfinite(ref)) and np.array_equal(got[~np.isfinite(ref)],
                                                                                  ref[~np.isfinite(ref)]), what
    finite = np.isfinite(ref)
    excess = np.where(finite, np.abs(np.where(finite, got, 0.0) - np.where(finite, ref, 0.0)) - bound, -1.0)
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess[worst] <= 0, (f"{what}{tuple(int(i) for i in worst)}: got {got[worst]}, expected {ref[worst]}, "
                                f"error {abs(got[worst] - ref[worst]):.3g} > bound {np.broadcast_to(bound, ref.shape)[worst]:.3g}")


def fp8_inputs(rng, lead_q, lead_kv, n_q, n_k, d, granularity="tensor"):
    """Standard-normal q, k, v (v times 3, so that its descale is not near 1), quantized to e4m3."""
    q = rng.standard_normal((*lead_q, n_q, d))
    k = rng.standard_normal((*lead_kv, n_k, d))
    v = 3.0 * rng.standard_normal((*lead_kv, n_k, d))
    return tf.quantize_fp8(q, k, v, granularity=granularity)


def check_against_both(x: tf.FP8Inputs, o, lse, causal, what=""):
    """v11's o, lse against fp8_attention (Bc = 128) and against float64 attention of the dequantized inputs, by
    ``core.tolerance.fp8_bounds`` (the module docstring's bounds)."""
    assert o.dtype == ml_dtypes.bfloat16 and lse.dtype == np.float32
    n_k, d = x.k.shape[-2], x.q.shape[-1]
    q, k, v = dequantized(x)
    g = q.shape[-3] // k.shape[-3]
    qk_max = float((np.abs(q) @ np.swapaxes(np.abs(np.repeat(k, g, axis=-3)), -1, -2)).max()) / np.sqrt(d)
    v_max, o = float(np.abs(v).max()), o.astype(np.float64)
    gpu = not simulator_enabled()
    ref_o, ref_lse = tf.fp8_attention(x.q, x.k, x.v, x.descale_q, x.descale_k, x.descale_v, causal=causal,
                                      block_k=BC)
    o_bound, lse_bound = fp8_bounds(ref_o, ref_lse, v_max, n_k, d, qk_max, gpu=gpu, against="emulation")
    check_within(o, ref_o, o_bound, f"{what} o against fp8_attention")
    check_within(lse, ref_lse, lse_bound, f"{what} lse against fp8_attention")
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=causal)
    o_bound, lse_bound = fp8_bounds(ref_o, ref_lse, v_max, n_k, d, qk_max, gpu=gpu, against="float64")
    check_within(o, ref_o, o_bound, f"{what} o against float64")
    check_within(lse, ref_lse, lse_bound, f"{what} lse against float64")


def test_key_renumbering_gives_each_lane_its_own_keys():
    """fp8_key_of_column is a permutation of each 32-key step, and the A fragment's columns that a lane holds are
    keys whose scores that lane's accumulators hold, in the same rows: P needs no exchange between lanes."""
    assert sorted(fp8_key_of_column(c) for c in range(32)) == list(range(32))
    for lane in range(32):
        rows, cols = accumulator_place(lane, 32)  # warp 0's lane: its accumulators of keys 0 .. 31
        held = set(zip(rows.tolist(), cols.tolist()))
        wanted = {(row, fp8_key_of_column(col)) for row, col in a_fragment_e4m3(lane)}
        assert wanted == held, lane


def pv_kernel(d):
    """One warpgroup: Vᵀ (d rows of 128 keys) into swizzled shared memory; each lane's s filled from P (64 × 128,
    float32) in the accumulator layout; acc = P V by v11's pack_p and issue_p_times_v (``p_times_v``)."""
    group = fp8_warpgroup_tile(WarpgroupTile("e4m3", d, BC, 64))
    copy_v, v_chunks, _ = copy_plan(BC, d)
    HALF, S_TILES, P_STEPS = d // 2, BC // 8, BC // 32

    @cuda.jit
    def kernel(P, VT, D):
        smem = cuda.shared.array(0, uint32)
        tid = uint64(cuda.threadIdx.x)
        base = (ptx.shared_address(smem, uint64(0)) + uint32(ALIGN - 1)) & ~uint32(ALIGN - 1)
        copy_v(VT, uint64(0), uint64(0), uint64(d), base, tid, v_chunks)
        ptx.cp_async_commit()
        ptx.cp_async_wait_all()
        wgmma.fence_proxy_async()
        cuda.syncthreads()  # Vᵀ has landed, visible to the tensor cores
        warp, lane = tid // uint64(32), tid % uint64(32)
        g, t = lane // uint64(4), lane % uint64(4)
        s = cuda.local.array((1, S_TILES, 4), float32)
        for n in range(S_TILES):
            for e in range(4):
                s[0, n, e] = P[warp * uint64(16) + g + uint64(8 * (e // 2)), uint64(8 * n) + uint64(2) * t + uint64(e % 2)]
        p = cuda.local.array((P_STEPS, 4), uint32)
        acc = cuda.local.array((1, HALF // 4, 4), float32)
        for n in range(HALF // 4):
            for e in range(4):
                acc[0, n, e] = float32(0.0)
        _, _, vt_desc = group.descriptors(base, uint64(0), base, base)
        group.p_times_v(acc, s, p, vt_desc)
        for i in range(HALF):
            D[tid, i] = acc[0, i // 4, i % 4]

    return kernel


def test_the_driver_signatures_fit_the_kernels():
    """What a call on PyTorch or CuPy arrays on a GPU launches through the driver (``forward.hopper_fp8.sized_fp8``)
    is compiled for v11's SIGNATURE and the Vᵀ pass's TRANSPOSE_SIGNATURE: as many types as each kernel has
    parameters, arrays where it takes arrays (checked on the builds, without a launch)."""
    from tinyflash.forward.kernels.fp8_tiling import TRANSPOSE_SIGNATURE
    from tinyflash.gpu.launch import parameters

    v11 = VERSIONS["v11"]
    for kernel, signature, arrays in ((v11.build(v11.tilings[1](64)), v11.signature, 5),
                                      (transpose_v(64), TRANSPOSE_SIGNATURE, 2)):
        assert len(parameters(kernel)) == len(signature)
        assert [hasattr(t, "ndim") for t in signature] == [True] * arrays + [False] * (len(signature) - arrays)


@pytest.mark.simulator
@pytest.mark.grid
def test_p_reaches_the_tensor_cores_by_renumbered_keys(rng):
    """P (float32, in the score accumulators' layout) times V through the Vᵀ pass and v11's FP8 P·V: the e4m3 P
    times V, whatever order the keys take on the way. Vᵀ from the pass is checked byte by byte first (its padding
    keys zero). Four chained instructions, each within UNIT of Σ |P||V| (test_wgmma_fp8_ptx.py: 2^-23 on the
    simulator, whose products are exact and rounded once per instruction; 2^-12 on a GPU's FP8 tensor cores)."""
    needs_hopper()
    d, n_k = 128, 100  # a ragged tile: keys 100 .. 127 are the pass's zeros
    p = np.exp2(rng.uniform(-12, 8, (64, BC))).astype(np.float32)  # P in [2^-12, 2^8]: normal and subnormal e4m3
    v8 = tf.quantize_fp8(*[3.0 * rng.standard_normal((n_k, d))] * 3).v  # (Nk, d) e4m3
    vt = np.zeros(d * padded_keys(n_k), np.uint8)
    transpose_v(d)[(padded_keys(n_k) // 32, 1), 128](v8.view(np.uint8).reshape(-1), vt, n_k, padded_keys(n_k))
    v = np.zeros((BC, d))
    v[:n_k] = v8.astype(np.float64)
    cols = [32 * (c // 32) + fp8_key_of_column(c % 32) for c in range(BC)]  # key held by Vᵀ's column c
    expected_vt = np.zeros((d, BC), np.uint8)
    expected_vt[:, :] = np.pad(v8.view(np.uint8), ((0, BC - n_k), (0, 0)))[cols, :].T
    assert np.array_equal(vt.reshape(d, BC), expected_vt)
    out = np.zeros((128, d // 2), np.float32)
    pv_kernel(d)[1, 128, 0, d * BC + ALIGN](p, as_words(vt.reshape(d, BC)), out)
    p8 = round_e4m3(p).astype(np.float64)
    bound = 4 * UNIT * (np.abs(p8) @ np.abs(v)) + 1e-30
    got, want = lanes_to_matrix(out, d), p8 @ v
    assert np.all(np.abs(got - want) <= bound), np.abs(got - want).max()


@pytest.mark.simulator
@pytest.mark.grid
def test_two_key_tiles_and_inputs_left_alone(rng):
    """One query tile, two key tiles (the loop's overlap and its last P·V), a ragged end, d = 128; the inputs are
    left as they were. (The first tier's run of v11 is tests/test_kernel_versions.py's.)"""
    needs_hopper()
    x = fp8_inputs(rng, (1, 1), (1, 1), 50, 150, 128)
    before = [a.copy() for a in (x.q, x.k, x.v)]
    o, lse = tf.hopper_fp8_attention(x.q, x.k, x.v, x.descale_q, x.descale_k, x.descale_v)
    check_against_both(x, o, lse, False)
    assert all(np.array_equal(a.view(np.uint8), b.view(np.uint8)) for a, b in zip((x.q, x.k, x.v), before))


@pytest.mark.simulator
@pytest.mark.grid
@pytest.mark.parametrize("case", [
    dict(lead_q=(1, 2), lead_kv=(1, 1), n_q=70, n_k=150, d=128, causal=True, granularity="head"),
    dict(lead_q=(1, 1), lead_kv=(1, 1), n_q=100, n_k=40, d=128, causal=True, granularity="tensor"),
    dict(lead_q=(2, 1), lead_kv=(2, 1), n_q=33, n_k=129, d=128, causal=False, granularity="head"),
    dict(lead_q=(1, 1), lead_kv=(1, 1), n_q=40, n_k=130, d=256, causal=False, granularity="tensor"),
    dict(lead_q=(1, 2), lead_kv=(1, 1), n_q=70, n_k=200, d=64, causal=True, granularity="head"),
], ids=["gqa-causal-head", "causal-rows-without-keys", "batch2-per-head", "d256", "d64"])
def test_hopper_fp8_attention(rng, case):
    """Grouped-query heads, causal (bottom-right: with Nq > Nk the first rows see no key: O = 0, lse = -inf),
    per-head descales over a batch, d = 256 and d = 64 (Q_i and K_j with the 64-byte swizzle)."""
    needs_hopper()
    x = fp8_inputs(rng, case["lead_q"], case["lead_kv"], case["n_q"], case["n_k"], case["d"], case["granularity"])
    o, lse = tf.hopper_fp8_attention(x.q, x.k, x.v, x.descale_q, x.descale_k, x.descale_v, causal=case["causal"])
    check_against_both(x, o, lse, case["causal"])


@pytest.mark.simulator
@pytest.mark.grid
def test_two_consumer_warpgroups_take_turns(rng):
    """The GPU's tiling's shape: a producer and two consumer warpgroups (ping-pong), Br = 128, three key tiles; one
    query tile of 120 rows, the second warpgroup's ragged."""
    needs_hopper()
    x = fp8_inputs(rng, (1, 1), (1, 1), 120, 300, 128)
    o, lse = tf.hopper_fp8_attention(x.q, x.k, x.v, x.descale_q, x.descale_k, x.descale_v, causal=True,
                                     config=Fp8Tiling(D=128, WARPGROUPS=2))
    check_against_both(x, o, lse, True)


@pytest.mark.simulator
@pytest.mark.grid
def test_descales_per_kv_head_of_q(rng):
    """descale_q given per (batch, K/V head), FlashAttention-3's shape, is that head's for each of its query heads."""
    needs_hopper()
    x = fp8_inputs(rng, (1, 2), (1, 1), 20, 40, 128, "head")
    dq = np.array([[1.5]], np.float32)
    o, lse = tf.hopper_fp8_attention(x.q, x.k, x.v, dq, x.descale_k, x.descale_v)
    check_against_both(x._replace(descale_q=np.full((1, 2), 1.5, np.float32)), o, lse, False)


def test_bad_arguments_are_refused_before_the_gpu(rng):
    """Each argument's error names it, before any GPU is looked for."""
    x = fp8_inputs(rng, (1, 2), (1, 1), 8, 8, 128, "head")
    call = tf.hopper_fp8_attention
    with pytest.raises(TypeError, match="q of dtype float16"):
        call(x.q.astype(np.float16), x.k, x.v)
    with pytest.raises(TypeError, match="v of dtype uint8"):
        call(x.q, x.k, x.v.view(np.uint8))  # host bytes carry no type: e4m3 must say so
    small = fp8_inputs(rng, (1, 1), (1, 1), 8, 8, 96)
    with pytest.raises(ValueError, match=r"d = dv one of \(64, 128, 256\)"):
        call(small.q, small.k, small.v)
    with pytest.raises(ValueError, match=r"descale_k must have shape \(\) .* got \(1, 2, 1\)"):
        call(x.q, x.k, x.v, 1.0, np.ones((1, 2, 1)))  # a descale per block: the emulation's, not the kernel's
    with pytest.raises(ValueError, match="descale_v must be finite and > 0"):
        call(x.q, x.k, x.v, 1.0, 1.0, -2.0)
    with pytest.raises(TypeError, match="descale_q must be a real number"):
        call(x.q, x.k, x.v, "1")
    with pytest.raises(ValueError, match="kernel must be one of v11"):
        call(x.q, x.k, x.v, kernel="v10")
    with pytest.raises(ValueError, match="kernel must be one of v1, .*v10 \\(None"):  # and the other way
        tf.cuda_attention(np.ones((4, 128), np.float16), np.ones((4, 128), np.float16),
                          np.ones((4, 128), np.float16), kernel="v11")


def test_registered_with_its_limits():
    """v11 takes e4m3 at d = dv = 64, 128 and 256 only; its GPU tilings fit a block's 227 KiB (three stages would at
    d = 256 too: 224 KiB), and the others are refused with the reason."""
    v11 = VERSIONS["v11"]
    assert v11.accepts("float8_e4m3fn", 128, 128) and v11.accepts(ml_dtypes.float8_e4m3fn, 256, 256)
    assert v11.accepts("float8_e4m3fn", 64, 64) and not v11.accepts("float8_e4m3fn", 96, 96)
    assert not v11.accepts(np.float16, 128, 128) and not v11.accepts("float8_e4m3fn", 128, 64)
    assert VERSIONS.default("hopper_fp8_attention") is v11
    for d in (64, 128, 256):
        cfg = v11.tilings[0](d)
        assert (cfg.BR, cfg.BC, cfg.PRODUCER, cfg.LAZY_RESCALE) == (128, 128, True, False) and cfg.smem_bytes <= 227 * 1024
    assert Fp8Tiling(D=256, WARPGROUPS=2, STAGES=3).validate().smem_bytes <= 227 * 1024
    with pytest.raises(ValueError, match="D must be one of"):
        Fp8Tiling(D=96, WARPGROUPS=2).validate()
    with pytest.raises(ValueError, match="BC must be 128"):
        Fp8Tiling(D=128, WARPGROUPS=2, BC=64).validate()
    with pytest.raises(ValueError, match="no lazy rescaling"):
        Fp8Tiling(D=128, WARPGROUPS=2, LAZY_RESCALE=True).validate()


@pytest.mark.simulator
@pytest.mark.grid
def test_the_benchmarks_check_passes_v11_and_catches_a_wrong_output(rng):
    """``bench.fp8_forward.check_fp8`` (the hopper-fp8 benchmark's check, on PyTorch tensors) passes v11's result and
    fails it with one element moved by a tenth of max|v|, or with one row's lse moved by 0.1."""
    torch = pytest.importorskip("torch", reason="the benchmark's FP8 peer and its check take PyTorch tensors")
    from tinyflash.bench.fp8_forward import check_fp8

    needs_hopper()
    x = fp8_inputs(rng, (1, 2), (1, 1), 60, 100, 128)  # one query tile and one key tile a head: the check is the subject
    o, lse = tf.hopper_fp8_attention(x.q, x.k, x.v, x.descale_q, x.descale_k, x.descale_v, causal=True)
    inputs = {"fp8": (*(torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn) for a in (x.q, x.k, x.v)),
                      x.descale_q, x.descale_k, x.descale_v), "causal": True}

    def verdict(o, lse):
        return check_fp8((torch.from_numpy(o.view(np.int16)).view(torch.bfloat16), torch.from_numpy(lse)), inputs)

    assert verdict(o, lse).ok
    v_max = float(np.abs(dequantized(x)[2]).max())
    wrong = o.astype(np.float32)
    wrong[0, 1, -3, 7] += 0.1 * v_max
    assert not verdict(wrong.astype(ml_dtypes.bfloat16), lse).ok
    wrong_lse = lse.copy()
    wrong_lse[0, 0, -1] += 0.1  # the GPU's bound on lse here: (d / 32) · 2^-12 · max Σ|q||k| · scale, about 1e-2
    assert not verdict(o, wrong_lse).ok
