"""Lesson 12: FP8 — attention on float8 e4m3 inputs, FlashAttention-3's FP8 forward (kernel v11).

What you will learn
    * the e4m3 format: 1 sign, 4 exponent (bias 7) and 3 mantissa bits, largest number 448, no
      infinities, 8 numbers in every binade (a rounding error of at most 2^-4 of the value), and the
      subnormals below 2^-6 where that guarantee ends;
    * scaling and descaling: q, k, v stored as x8 = round(x / descale) with one descale per tensor, per
      head or per block of rows, and where the descales come back: on the scores (scale · Q8 K8ᵀ times
      descale_q · descale_k) and on the output (descale_v);
    * why the FP8 kernel needs V transposed: FP8 ``wgmma`` (k = 32) reads both operands K-major only, so
      P·V, a sum over keys, needs Vᵀ in shared memory; v11 writes it in a pass before the kernel;
    * P's range: P = exp(s - m) in [0, 1] falls into e4m3's subnormals at its small end; FlashAttention-3
      takes 8 off the row maximum, so P lies in [0, 256], and what that changes;
    * incoherent processing: a random Hadamard rotation of Q and K that leaves Q Kᵀ as it is and spreads
      outliers, and its error on FlashAttention-3's outlier input beside per-tensor scaling;
    * what the record says: v11's speed beside bfloat16's on an H200, and FP8's error beside bfloat16's.

What changed since lesson 10 (stage 4, v10 on 16-bit inputs): kernel v11 is v10 on e4m3 bytes. Its loop, its
warp specialisation and ping-pong are v10's; the products are FP8 wgmma's, P_ij is rounded to e4m3 after an
offset, V arrives transposed, and the descales multiply float32 results. The NumPy side is src/tinyflash/core/
e4m3.py (the format), core/quantize.py (descales, the rotation) and forward/fp8.py (``tinyflash.fp8_attention``,
stage 1's loop on e4m3 inputs as v11 computes it); the kernel is src/tinyflash/forward/kernels/v11_fp8.py with
fp8_tiling.py (its tiling and the Vᵀ pass), called by ``tinyflash.hopper_fp8_attention``.

Run from the repository root:  python lessons/12_fp8.py
Everything but cell [3] is NumPy. Cell [3] runs v11's Vᵀ pass and, on a Hopper GPU or numba's simulator (a
toy size), v11 itself.

Running time: about 4 s on 2 CPU cores without a GPU, its kernels on numba's simulator
(figures/data/cpu_runs.csv, 2026-12-06, commit 48d1070).
"""

# %% [0] Where the kernels run (cell [3]): decide before numba is imported
from lib import use_gpu_or_simulator  # imports no numba

HAS_GPU = use_gpu_or_simulator()  # a GPU if CuPy sees one, else NUMBA_ENABLE_CUDASIM=1 (before numba is imported)

import math  # noqa: E402

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import tinyflash as tf  # noqa: E402
from tinyflash.core import e4m3  # noqa: E402
from tinyflash.core.quantize import hadamard_rotate, outlier_inputs, random_signs  # noqa: E402
from tinyflash.core.tolerance import fp8_bounds  # noqa: E402
from tinyflash.forward.fp8 import P_OFFSET  # noqa: E402
from tinyflash.forward.kernels import VERSIONS, fp8_tiling  # noqa: E402
from tinyflash.gpu import wgmma  # noqa: E402
from tinyflash.gpu.runtime import compute_capability  # noqa: E402
from tinyflash.warpgroup_tile import fp8_key_of_column  # noqa: E402
from lib import excerpt, lesson_rng, record, show  # noqa: E402

ON_HOPPER = not HAS_GPU or compute_capability() == (9, 0)  # the simulator emulates Hopper's instructions
rng = lesson_rng()  # seeded, the seed printed (TINYFLASH_SEED=n for others): the checks hold for any seed
E4M3 = ml_dtypes.float8_e4m3fn  # NumPy's e4m3 type (PyTorch's torch.float8_e4m3fn has the same bytes)


def rmse(o, ref) -> float:
    return float(np.sqrt(np.mean((np.asarray(o, np.float64) - ref) ** 2)))


def dequantized(x8, descale, block: int = 0) -> np.ndarray:
    """The float64 values e4m3 numbers stand for: x8 · descale, the descale per tensor (()), head ((H,)) or block
    of ``block`` rows ((H, T))."""
    s = np.asarray(descale, np.float64)
    if s.ndim == 2:
        s = np.repeat(s, block, axis=-1)[:, :x8.shape[-2]]  # (H, N): each row's block's descale
    return x8.astype(np.float64) * (s if s.ndim == 0 else s[..., None] if s.ndim == 2 else s[:, None, None])


# %% [1] The format: one byte, s eeee mmm
values = e4m3.decode_e4m3(np.arange(256, dtype=np.uint8))  # (256,) the value of every byte, float32
assert np.isnan(values).sum() == 2 and not np.isinf(values).any()  # 0x7F and 0xFF are NaN; no infinity at all
assert np.nanmax(values) == e4m3.E4M3_MAX == float(ml_dtypes.finfo(E4M3).max)
print("value      s eeee mmm   = (-1)^s (1 + m/8) 2^(e - 7)  (e = 0: subnormal, m/8 · 2^-6)")
for x in (1.0, 1.125, 448.0, 2.0**-6, 2.0**-9, -3.25):
    b = int(e4m3.encode_e4m3(np.float64(x)))
    print(f"{x:9.6g}  {b >> 7} {b >> 3 & 15:04b} {b & 7:03b}   e = {b >> 3 & 15:2}, m = {b & 7}")
assert int(e4m3.encode_e4m3(np.float64(1.0))) >> e4m3.MANTISSA_BITS == e4m3.EXPONENT_BIAS  # 1.0 = 2^(7 - 7)
positive = np.unique(values[np.isfinite(values) & (values > 0)])  # (126,) the positive numbers, ascending
binade = positive[(positive >= 1) & (positive < 2)]  # (8,) the numbers of [1, 2)
subnormal = positive[positive < 2.0**e4m3.MIN_EXPONENT]  # (7,) those below the smallest normal number
assert len(binade) == 8 and np.all(np.diff(binade) == e4m3.E4M3_EPSILON)  # 3 mantissa bits: 8 a binade
assert np.all(subnormal == e4m3.SMALLEST_SUBNORMAL * np.arange(1, 8))  # evenly spaced, 2^-9 apart
print(f"{len(positive)} positive numbers from {positive[0]:g} to {positive[-1]:g}; [1, 2) holds {binade.tolist()}")
x = np.exp2(rng.uniform(e4m3.MIN_EXPONENT, math.log2(e4m3.E4M3_MAX), 100_000))  # normal magnitudes
normal_err = np.max(np.abs(e4m3.round_e4m3(x) - x) / x)
x = rng.uniform(2.0**-11, 2.0**e4m3.MIN_EXPONENT, 100_000)  # subnormal magnitudes
sub_err = np.max(np.abs(e4m3.round_e4m3(x) - x) / x)
print(f"rounding to nearest errs by at most {normal_err:.4f} of the value above 2^-6 (bound 2^-4 = "
      f"{e4m3.UNIT_ROUNDOFF}), by up to {sub_err:.2f} of it below (the subnormals: 2^-9 apart whatever the value)")
assert normal_err <= e4m3.UNIT_ROUNDOFF < sub_err
# ml_dtypes' cast and the GPU's cvt.rn.satfinite (round_e4m3) round alike; past 448 the cast gives NaN and the
# GPU's conversion the largest number, 448: both lose the value, which is why inputs are scaled first.
x = np.array([0.1, 3.14159, 300.0, 460.0, 500.0, 0.003, 0.0009], np.float32)
cast, gpu = x.astype(E4M3).astype(np.float32), e4m3.round_e4m3(x)  # (7,) each
for a, b, c in zip(x, cast, gpu):
    print(f"  {a:10.5g} -> ml_dtypes {b:<10.5g} cvt.satfinite {c:<10.5g}")
fits = x < 464  # 448 + half a step: everything that rounds to a finite number
assert np.array_equal(cast[fits], gpu[fits]) and np.isnan(cast[~fits]).all() and np.all(gpu[~fits] == 448)

# %% [2] Scaling: x8 = round(x / descale), one descale per tensor, head or block; descaling on the results
H, N, d, BLOCK = 4, 512, 64, 64  # heads, tokens, head dim, rows a block (the forward's tile)
q, k, v = outlier_inputs(rng, (H, N, d))  # (H, N, d) float32 each: N(0, 1), 0.1% of the entries at 10× the scale
print(f"\nq: {H} heads × {N} × {d}, max|q| {np.abs(q).max():.1f}, but 99.9% of |q| below "
      f"{np.quantile(np.abs(q), 0.999):.1f}")
for granularity in ("tensor", "head", "block"):
    f = tf.quantize_fp8(q, k, v, granularity=granularity, block=BLOCK)  # e4m3 q, k, v and their descales
    q8 = f.q.astype(np.float32)  # (H, N, d) the e4m3 numbers
    group_max = np.abs(q8).reshape(*f.descale_q.shape, -1).max(axis=-1)  # one per descale (N: whole blocks)
    assert np.all(group_max == e4m3.E4M3_MAX)  # every group's largest entry lands on 448
    back = dequantized(f.q, f.descale_q, BLOCK)  # (H, N, d) q8 · descale
    normal = np.abs(q) >= 2.0**e4m3.MIN_EXPONENT * dequantized(np.ones_like(q), f.descale_q, BLOCK)  # x / descale
    assert np.all(np.abs(back - q)[normal] <= e4m3.UNIT_ROUNDOFF * np.abs(q)[normal])
    print(f"  per {granularity:6}: descale_q shape {str(f.descale_q.shape):8} from {f.descale_q.min():.4f} to "
          f"{f.descale_q.max():.4f}; entries in the subnormals {np.mean(~normal):.3%}, rounded to 0 "
          f"{np.mean(q8 == 0):.3%}")
# A descale moves every entry's exponent, not its 3 mantissa bits: above the subnormals each entry keeps
# 2^-4 of itself whatever the group. The descales come back on float32 results: dq_i is the same for every
# row of Q_i and dk_j for every column of K_jᵀ, so (dq_i Q8_i)(dk_j K8_j)ᵀ = dq_i dk_j (Q8_i K8_jᵀ): one factor
# per tile, folded into the softmax's scale; descale_v multiplies P V8 (forward/fp8.py, the emulation of v11):
show("forward/fp8.py: the descales on S_ij, and a block's descale of V on P V8_j", "\n".join(
    excerpt(tf.fp8_attention, first, last) for first, last in (("S2 = (Q_i @", "S2 = (Q_i @"),
                                                               ("PV = round_e4m3(P)", "PV *= dv"))))
show("kernels/v11_fp8.py: the epilogue, V's descale and P's offset", excerpt(
    VERSIONS["v11"].code.consumer, "for half in range(2):  # V's descale", "rescale_acc(acc, alpha)"))
f = tf.quantize_fp8(q, k, v, granularity="block", block=BLOCK)
tile = np.s_[0, :BLOCK]  # head 0, the first tile of rows: Q_0 and K_0
lhs = (f.q[tile].astype(np.float32) @ f.k[tile].astype(np.float32).T) * (f.descale_q[0, 0] * f.descale_k[0, 0])
rhs = dequantized(f.q, f.descale_q, BLOCK)[tile] @ dequantized(f.k, f.descale_k, BLOCK)[tile].T  # (Br, Bc)
assert np.allclose(lhs, rhs, rtol=1e-6, atol=1e-6 * np.abs(rhs).max())  # the same scores up to float32
ref, _ = tf.reference_attention(*(x.astype(np.float64) for x in (q, k, v)))  # (H, N, d) float64
o8, _ = tf.fp8_attention(*f, block_q=BLOCK, block_k=BLOCK)
print(f"fp8_attention on q, k, v per block: RMSE of O against float64 {rmse(o8, ref):.2e}")

# %% [3] Why V is transposed: FP8 wgmma reads K-major operands only
# One FP8 wgmma multiplies 64 × 32 by 32 × N: k = 32 bytes, as the 16-bit k = 16, so twice the multiply-adds.
n16, n8 = wgmma.WGMMA_M * 128 * wgmma.WGMMA_K, wgmma.WGMMA_M * 128 * wgmma.WGMMA_K_FP8  # at N = 128
print(f"\nmultiply-adds: wgmma m64n128k16 (16-bit) {n16:,}, m64n128k32 (e4m3) {n8:,} ({n8 // n16}x)")
# A K-major operand has k along a row of its tile. For S = Q Kᵀ, k is d: K_j's rows (a key's d bytes) are
# K-major already. For O += P V, k is the keys, but V_j's rows run along d (n): MN-major. 16-bit wgmma
# reads it so (trans_b); FP8 wgmma cannot:
wgmma.mma_async_ss("bfloat16", 128, trans_b=True)  # v10's P·V: built without complaint
try:
    wgmma.mma_async_ss("e4m3", 128, trans_b=True)
    raise AssertionError("FP8 wgmma took an MN-major B")
except ValueError as refused:
    print(f"wgmma.mma_async_ss('e4m3', 128, trans_b=True): {refused}")
# So v11 writes Vᵀ (d rows of keys) before the kernel. It also renumbers the keys of each 32-key step: the
# FP8 A operand gives lane t of a group of 4 columns 4t .. 4t + 3 and 16 + 4t .. 16 + 4t + 3, while its
# accumulators of S (then P) hold keys 2t, 2t + 1 of each 8. Column c is given the key its lane already holds,
# so P enters the A operand with no byte moved between lanes; Vᵀ's columns follow the same order, and P·V, a
# sum over keys, does not see the order.
show("kernels/fp8_tiling.py: the pass that writes Vᵀ", excerpt(fp8_tiling.transpose_v, "def transpose(V", "VT[("))
order = fp8_key_of_column(np.arange(fp8_tiling.TRANSPOSE_KEYS))  # (32,) the key that column c holds
print(f"column c of a 32-key step holds key {order.tolist()}")
assert sorted(order) == list(range(32))
for t in range(4):  # lane t: the keys of its A columns are the keys of its accumulators
    columns = [4 * t + b for b in range(4)] + [16 + 4 * t + b for b in range(4)]
    assert sorted(order[columns]) == [8 * eight + 2 * t + e for eight in range(4) for e in range(2)]
n_k = 40  # keys: one whole 32-key step and a ragged one
v8 = f.v[0, :n_k]  # (n_k, d) head 0's e4m3 V
nkp = fp8_tiling.padded_keys(n_k)  # Vᵀ's columns: whole tiles of Bc keys, zeros past n_k
vt = np.zeros(d * nkp, np.uint8)  # (d · nkp,) bytes
fp8_tiling.transpose_v(d)[(nkp // fp8_tiling.TRANSPOSE_KEYS, 1), fp8_tiling.TRANSPOSE_THREADS](
    np.ascontiguousarray(v8).view(np.uint8).reshape(-1), vt, n_k, nkp)
keys = np.arange(nkp) // 32 * 32 + order[np.arange(nkp) % 32]  # (nkp,) the key of each column of Vᵀ
padded = np.zeros((nkp, d), np.uint8)  # (nkp, d) V's bytes, zero rows past n_k
padded[:n_k] = v8.view(np.uint8)
assert np.array_equal(vt.reshape(d, nkp), padded[keys].T)  # Vᵀ[n, c] = V[key of c, n], zeros past n_k
p, values_v = rng.random((8, nkp)), padded.view(E4M3).astype(np.float64)  # P of 8 rows, keys in their own order
assert np.allclose(p[:, keys] @ values_v[keys], p @ values_v)  # renumbered in P and in V alike: the same P·V
print(f"the pass on {n_k} keys of V (d = {d}): Vᵀ is {d} × {nkp} bytes, each column the key the renumbering says")
# v11 itself: on a toy size on the simulator, what fp8_attention computes (with v11's Bc = 128 keys a tile)
if ON_HOPPER:
    small = tf.quantize_fp8(q[:1, :20], k[:1, :37], v[:1, :37])  # per tensor: the kernel's descales
    o11, lse11 = tf.hopper_fp8_attention(*small, causal=True)  # o bfloat16
    o_em, lse_em = tf.fp8_attention(*small, causal=True, block_k=fp8_tiling.FP8_BC)
    v_max = float(np.abs(dequantized(small.v, small.descale_v)).max())
    qk_max = float((np.abs(dequantized(small.q, small.descale_q)) @ np.abs(dequantized(small.k, small.descale_k))
                    .swapaxes(-1, -2)).max()) / math.sqrt(d)
    o_bound, lse_bound = fp8_bounds(o_em, lse_em, v_max, 37, d, qk_max, gpu=HAS_GPU, against="emulation")
    assert np.all(np.abs(o11.astype(np.float64) - o_em) <= o_bound) and np.all(np.abs(lse11 - lse_em) <= lse_bound)
    print(f"v11 on {'the GPU' if HAS_GPU else 'the simulator'} (20 queries, 37 keys, causal): fp8_attention's O and "
          f"lse within the bound (bfloat16 O: {np.abs(o11.astype(np.float64) - o_em).max():.1e} apart at most)")
else:
    print(f"this GPU is compute capability {compute_capability()}: FP8 wgmma needs 9.0 (Hopper); v11 skipped")

# %% [4] P's range: exp(s - m) lies in [0, 1], and e4m3 is poor below 2^-6
# FlashAttention-3 takes 8 off the row maximum: P = 2^8 exp(s - m) lies in [0, 256] (within 448). The factor is
# in acc and in l alike, so O = acc / l is unchanged; lse takes the 8 out. In v11's softmax:
show("kernels/v11_fp8.py: P with the offset", excerpt(VERSIONS["v11"].code.fp8_softmax, "shift = m_safe",
                                                     "x = math.exp2("))
qs, ks, vs = (rng.standard_normal((2, N, d)) for _ in range(3))  # (2, N, d) each
qs *= 2  # scores spread over a few units, as in a sharp head
s = (qs @ ks.swapaxes(-1, -2)) / math.sqrt(d)  # (2, N, N)
P = np.exp(s - s.max(axis=-1, keepdims=True))  # (2, N, N) in [0, 1]
big, lift = P >= 2.0**e4m3.MIN_EXPONENT, 2.0**P_OFFSET  # (2, N, N) the entries e4m3 holds as normal numbers; 2^8
# 2^8 is a power of two: an entry that is normal either way rounds to the same bits; only the small ones change
assert np.array_equal(e4m3.round_e4m3(lift * P)[big], lift * e4m3.round_e4m3(P)[big])
err0 = np.abs(e4m3.round_e4m3(P) - P) / P  # relative error of each entry, without the offset
err8 = np.abs(e4m3.round_e4m3(lift * P) / lift - P) / P  # with it
kept = P >= 2.0 ** (e4m3.MIN_EXPONENT - P_OFFSET)  # 2^-14: the entries the offset keeps normal
print(f"\nP of {N} keys: {np.mean(~big):.1%} of its entries below 2^-6 (subnormal in e4m3), {np.mean(P < 2.0**-10):.1%}"
      f" rounded to 0; they carry {np.sum(P * ~big) / P.sum():.2%} of the rows' sums")
print(f"relative error of P's entries above 2^-14: {err0[kept].max():.2f} without the offset, {err8[kept].max():.4f}"
      " with it")
assert err8[kept].max() <= e4m3.UNIT_ROUNDOFF < err0[kept].max()
fs = tf.quantize_fp8(qs, ks, vs)  # per tensor; the reference takes the values the e4m3 inputs stand for
ref_s, _ = tf.reference_attention(*(dequantized(x, sc) for x, sc in zip(fs[:3], fs[3:])))
err = {off: rmse(tf.fp8_attention(*fs, p_offset=off)[0], ref_s) for off in (0, P_OFFSET)}  # P's rounding
print(f"O's RMSE from P's rounding alone: {err[0]:.2e} in [0, 1], {err[P_OFFSET]:.2e} in [0, {lift:g}] "
      f"({err[0] / err[P_OFFSET]:.2f}x)")
assert err[P_OFFSET] < err[0]  # the large entries weigh most and round alike: the gain is only the small entries'

# %% [5] Incoherent processing: rotate Q and K by a random Hadamard matrix
# M = H diag(±1) / √d, H the d × d Hadamard matrix (entries ±1): M Mᵀ = I, so (Q M)(K M)ᵀ = Q Kᵀ. Each entry
# of q M mixes all d entries of q, so one outlier is spread over the row and the row's maximum falls.
seed = int(rng.integers(2**31))  # the rotation's random signs
M = hadamard_rotate(np.eye(d), random_signs(d, seed))  # (d, d) the rotation: each row of I rotated
assert np.allclose(M @ M.T, np.eye(d), atol=1e-12) and set(np.unique(np.abs(M * math.sqrt(d)).round(12))) == {1}
q64, k64 = q.astype(np.float64), k.astype(np.float64)  # (H, N, d) each
assert np.allclose((q64 @ M) @ (k64 @ M).swapaxes(-1, -2), q64 @ k64.swapaxes(-1, -2), atol=1e-9)
rows = np.abs(q).max(axis=-1) > 5  # (H, N) the rows that hold an outlier
crest = lambda x: np.abs(x).max(axis=-1) / np.sqrt(np.mean(x**2, axis=-1))  # noqa: E731  max / rms of a row
print(f"\n{rows.sum()} rows of q hold an outlier: max/rms of a row {crest(q)[rows].mean():.1f} before, "
      f"{crest(q @ M)[rows].mean():.1f} after the rotation; max|q| {np.abs(q).max():.1f} -> {np.abs(q @ M).max():.1f}")
assert crest(q @ M)[rows].mean() < crest(q)[rows].mean() and np.abs(q @ M).max() < np.abs(q).max()
errors = {}
for granularity in ("tensor", "block"):
    for rotate in (False, True):
        f = tf.quantize_fp8(q, k, v, granularity=granularity, block=BLOCK, rotate=rotate, seed=seed)
        errors[granularity, rotate] = rmse(tf.fp8_attention(*f, block_q=BLOCK, block_k=BLOCK)[0], ref)
        label = f"per {granularity}" + (", rotated" if rotate else "")
        print(f"  {label:20} RMSE of O {errors[granularity, rotate]:.2e}, per tensor's over it "
              f"{errors['tensor', False] / errors[granularity, rotate]:.2f}x")
assert errors["block", True] < errors["tensor", False]  # block scaling with rotation beats per-tensor scaling

# %% [6] What the record says: v11's speed beside bfloat16's, FP8's error beside bfloat16's
SPEED = [r for r in record("hopper_fp8_h200") if r["status"] == "ok"]  # python -m tinyflash.bench hopper-fp8
r0 = SPEED[0]
print(f"\nfigures/data/hopper_fp8_h200.csv ({r0['device']}, {r0['date']}, commit {r0['commit']}): B = {r0['batch']}, "
      f"H = {r0['heads']}, N = {int(r0['n_q']):,}, d = {r0['d']}; TFLOP/s (v11's time includes the Vᵀ pass):")
print(f"  {'causal':6} {'SDPA flash bf16':>15} {'v10 bf16':>9} {'v11 e4m3':>9} {'v11/v10':>8}")
over_v10 = {}
for causal in sorted({r["causal"] for r in SPEED}):
    t = {r["variant"] or r["impl"]: float(r["tflops"]) for r in SPEED if r["causal"] == causal}
    over_v10[causal] = t["v11 e4m3"] / t["v10"]
    print(f"  {causal:6} {t['torch_flash']:15.0f} {t['v10']:9.0f} {t['v11 e4m3']:9.0f} {over_v10[causal]:8.2f}")
    assert t["v11 e4m3"] > t["torch_flash"]  # past FlashAttention-2 in bfloat16
assert max(over_v10.values()) < 2 and over_v10["True"] < 1  # short of the doubled rate; causal, behind v10
ACCURACY = record("fp8_accuracy")  # python -m tinyflash.bench.fp8_accuracy: the study of cell [5], larger
a0 = ACCURACY[0]
print(f"figures/data/fp8_accuracy.csv ({a0['device']}, {a0['date']}, commit {a0['commit']}): H = {a0['heads']}, "
      f"N = {int(a0['n']):,}, blocks of {a0['block']}, RMSE of O against float64, the mean of "
      f"{len({r['seed'] for r in ACCURACY})} seeds (an 'only' row: that rounding alone, the rest in float32):")
methods = ("bfloat16", "e4m3 P only", "e4m3 V only", "e4m3 Q, K only", "fp8 per tensor, P offset 0", "fp8 per tensor",
           "fp8 per block, rotated")
head_dims = sorted({int(r["d"]) for r in ACCURACY})
mean = {(m, dd): float(np.mean([float(r["rmse"]) for r in ACCURACY if r["method"] == m and int(r["d"]) == dd]))
        for m in methods for dd in head_dims}
print(f"  {'method':28}" + "".join(f"{f'd = {dd}':>11}" for dd in head_dims))
for m in methods:
    print(f"  {m:28}" + "".join(f"{mean[m, dd]:11.2e}" for dd in head_dims))
offset_gain = [mean["fp8 per tensor, P offset 0", dd] / mean["fp8 per tensor", dd] for dd in head_dims]
rotation_gain = [mean["fp8 per tensor", dd] / mean["fp8 per block, rotated", dd] for dd in head_dims]
bf16_lead = [mean["fp8 per block, rotated", dd] / mean["bfloat16", dd] for dd in head_dims]
print(f"  P's offset: {min(offset_gain):.2f}x to {max(offset_gain):.2f}x lower RMSE; blocks with rotation: "
      f"{min(rotation_gain):.2f}x to {max(rotation_gain):.2f}x; bfloat16 still {min(bf16_lead):.1f}x to "
      f"{max(bf16_lead):.1f}x lower than that")
assert min(rotation_gain) > 1 and min(bf16_lead) > 1 and max(abs(g - 1) for g in offset_gain) < 0.05
for dd in head_dims:  # of the three roundings alone, Q's and K's errs most
    assert mean["e4m3 Q, K only", dd] > max(mean["e4m3 P only", dd], mean["e4m3 V only", dd])
# On this input FP8's error is mostly Q's and K's rounding (docs/results.md takes it apart): the rotation acts on
# it; P's offset, which changes only P's small entries (cell [4]), is lost beside it. In speed, the record shows
# v11 short of the doubled multiply rate, and behind v10 with the causal mask; why is not measured yet (the
# "Next" of docs/notes/2026-12-06-h200-flex-v10-fp8-v11-suite-part-one.md).
