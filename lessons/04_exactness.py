"""Lesson 04: what "exact" means: the same function, not the same bits.

What you will learn
    * that floating-point addition is not associative, so adding the same numbers in another
      order changes the last bits of the result, and tiling changes the order;
    * how far stage 0 (naive) and stage 1 (blocked) are from the float64 reference in float64,
      float32 and float16: about one rounding unit of each precision, and no more;
    * that blocked and naive differ from each other in the last bits while both are within
      tolerance: the difference is rounding, not approximation;
    * FlashAttention's own test rule for low precision: the fast path's error may be at most twice
      the error of a naive computation in the same precision, plus a rounding term; applied here
      to float16 inputs, and shown to reject an approximation that drops a few keys.

What changed since the last lesson: no new algorithm. Lesson 03 compared the stages in float64
only, where the differences are 1e-16; here the same comparison runs in lower precisions, with
tinyflash.core.tolerance's error metrics and tinyflash.core.tolerance.fa_rule.

Run from the repository root:  python lessons/04_exactness.py

Running time: under a second on 2 CPU cores without a GPU (figures/data/cpu_runs.csv, 2026-12-05,
commit 648bbe0+).
"""

# %% [1] Why: "exact" is a statement about the math
# blocked_attention evaluates the same sums as naive_attention, in pieces (lesson 02 showed the
# pieces add up to the whole). In exact arithmetic the results would be equal. In floating point
# every addition rounds, and a different order of additions rounds differently. So the test of
# exactness is: both results are within rounding error of a more precise reference.
import math

import numpy as np

import tinyflash as tf
from tinyflash.core.tolerance import F32_TOL, fa_rule, lse_error, rel_error
from lib import lesson_rng

rng = lesson_rng()  # seeded, the seed printed (TINYFLASH_SEED=n for others): the checks hold for any seed

# %% [2] Pseudocode: FlashAttention's tolerance rule (flash-attn's tests; tinyflash.core.tolerance.fa_rule)
#   ref      = attention computed in float64 from the same low-precision inputs
#   naive    = attention the simple way, inputs and output in the low precision
#   fast     = the implementation under test, same inputs and output precision
#   atol     = 2 · max|(r + 0.3) - 0.3 - r|, with r = ref rounded to the low precision
#              (the error of doing any arithmetic at all on numbers of ref's size)
#   pass iff max|fast - ref| <= 2 · max|naive - ref| + atol
# The yardstick is the naive method's own error in that precision, so the rule neither demands
# impossible accuracy from float16 nor lets a float32 implementation be sloppy.

# %% [3] Reordering a sum changes the last bits
# float32 has a 24-bit significand: 2^24 + 1 is not representable and rounds back to 2^24.
big, one = np.float32(2**24), np.float32(1)
print(f"float32: (2^24 + 1) - 2^24 = {(big + one) - big},  (2^24 - 2^24) + 1 = {(big - big) + one}")
assert (big + one) - big == 0 and (big - big) + one == 1

x = rng.standard_normal(10_000).astype(np.float32)  # (10000,) the same numbers in every order
orders = {"in order": x, "reversed": x[::-1], "sorted": np.sort(x), "shuffled": rng.permutation(x)}
sums = {name: np.cumsum(xs)[-1] for name, xs in orders.items()}  # one float32 addition after another
sums["pairwise (np.sum)"] = x.sum()  # NumPy adds in a tree
exact = math.fsum(x.astype(np.float64))  # the exactly rounded sum
u = np.finfo(np.float32).eps / 2  # unit roundoff of float32
n_add = x.size - 1
bound = n_add * u / (1 - n_add * u) * float(np.abs(x).astype(np.float64).sum())  # worst case, any order
print(f"\nthe same {x.size:,} float32 numbers summed in {len(sums)} orders (exact sum {exact:.7f}):")
for name, s in sums.items():
    print(f"  {name:<18} {s:14.7f}   error {abs(float(s) - exact):.1e}")
print(f"  {len(set(sums.values()))} different results, all within the worst-case bound {bound:.1e}")
assert len(set(sums.values())) >= 2  # the order shows in the last bits
assert all(abs(float(s) - exact) <= bound for s in sums.values())

# %% [4] Code: both stages against the float64 reference, in three precisions
# reference_attention is stage 0 run in float64 on the same inputs, so stage 0's float64 error is
# 0 by construction; stage 1's float64 error shows the cost of a different order: a few units of
# float64 roundoff. float16 inputs are computed in float32 and rounded to float16 at the end.
n, d, B = 300, 64, 64  # 300 = 4 · 64 + 44: a ragged last tile
tolerance = {np.float64: 1e-12, np.float32: F32_TOL, np.float16: float(np.finfo(np.float16).eps)}
q64, k64, v64 = (rng.standard_normal((n, d)) for _ in range(3))  # (N, d) each
errors = {}
print(f"\nrelative error against reference_attention (float64), N = {n}, d = {d}, Br = Bc = {B}:")
print("  (errors are relative to the float64 reference; ÷ eps: blocked O's error in units of its dtype's eps)")
print("  dtype     causal   eps of dtype   naive O    blocked O  (÷ eps)    naive lse  blocked lse")
for dtype in (np.float64, np.float32, np.float16):
    q, k, v = (a.astype(dtype) for a in (q64, k64, v64))  # (N, d) each, rounded to dtype
    eps = float(np.finfo(dtype).eps)
    for causal in (False, True):
        ref_o, ref_lse = tf.reference_attention(q, k, v, causal=causal)  # (N, d), (N,) float64
        naive_o, naive_lse = tf.naive_attention(q, k, v, causal=causal)  # (N, d) dtype, (N,)
        fast_o, fast_lse = tf.blocked_attention(q, k, v, causal=causal, block_q=B, block_k=B)  # same
        e = [rel_error(naive_o, ref_o), rel_error(fast_o, ref_o), lse_error(naive_lse, ref_lse),
             lse_error(fast_lse, ref_lse)]
        errors[dtype, causal] = e
        print(f"  {dtype.__name__:<8}  {causal!s:<6}   {eps:12.1e}   {e[0]:8.1e}   {e[1]:8.1e}   ({e[1] / eps:4.1f})  "
              f"  {e[2]:8.1e}   {e[3]:8.1e}")
        assert max(e[:2]) <= tolerance[dtype]  # O: within the tolerance of its precision
        assert max(e[2:]) <= (1e-12 if dtype == np.float64 else F32_TOL)  # lse: float32 unless inputs are float64
        if dtype == np.float64:
            assert e[0] == 0 == e[2]  # stage 0 in float64 is the reference
for causal in (False, True):  # each step down in precision costs at least a factor of 10
    assert errors[np.float16, causal][1] > 10 * errors[np.float32, causal][1] > 10 * errors[np.float64, causal][1]

# %% [5] Check: blocked and naive differ in the last bits, and both are right
q, k, v = (a.astype(np.float32) for a in (q64, k64, v64))  # (N, d) each
ref_o, _ = tf.reference_attention(q, k, v)  # (N, d) float64
naive_o, _ = tf.naive_attention(q, k, v)  # (N, d) float32
fast_o, _ = tf.blocked_attention(q, k, v, block_q=B, block_k=B)  # (N, d) float32
differ = float(np.mean(naive_o != fast_o))  # fraction of entries whose bits differ
gap = rel_error(fast_o, naive_o)
print(f"\nfloat32: blocked and naive differ in {differ:.0%} of the entries of O, by at most "
      f"{gap:.1e} of max|O| ({gap / np.finfo(np.float32).eps:.1f} float32 eps)")
print(f"  yet both are within {tolerance[np.float32]:.0e} of the reference: naive {rel_error(naive_o, ref_o):.1e}, "
      f"blocked {rel_error(fast_o, ref_o):.1e}")
assert differ > 0.5 and gap <= F32_TOL  # not bitwise equal, but equal to rounding
assert rel_error(naive_o, ref_o) <= F32_TOL and rel_error(fast_o, ref_o) <= F32_TOL
# In float16 both stages compute in float32 and round once at the end; the float32 differences
# are far below a float16 rounding step, so they survive only where a value sits near a boundary.
q, k, v = (a.astype(np.float16) for a in (q64, k64, v64))  # (N, d) each
differ16 = float(np.mean(tf.naive_attention(q, k, v)[0] != tf.blocked_attention(q, k, v, block_q=B, block_k=B)[0]))
print(f"float16 outputs: blocked and naive differ in {differ16:.1%} of the entries")
assert differ16 < differ / 10

# %% [6] FlashAttention's rule on float16 inputs
print("\nFlashAttention's rule, float16 inputs, max absolute errors against the float64 reference:")
print("     Nq    Nk  causal   fast error   naive error   rounding   bound = 2·naive + rounding")
for n_q, n_k, causal in ((300, 300, False), (300, 300, True), (129, 257, True), (257, 129, True)):
    q = rng.standard_normal((n_q, d)).astype(np.float16)  # (Nq, d)
    k = rng.standard_normal((n_k, d)).astype(np.float16)  # (Nk, d)
    v = rng.standard_normal((n_k, d)).astype(np.float16)  # (Nk, d)
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=causal)  # (Nq, d) float64, (Nq,)
    naive_o, _ = tf.naive_attention(q, k, v, causal=causal)  # (Nq, d) float16
    fast_o, fast_lse = tf.blocked_attention(q, k, v, causal=causal, block_q=B, block_k=B)  # (Nq, d) float16
    check = fa_rule(fast_o, naive_o, ref_o, np.float16)
    print(f"  {n_q:>5} {n_k:>5}  {causal!s:<6}  {check.fast_error:10.2e}   {check.naive_error:10.2e}  "
          f"{check.atol:9.2e}   {check.bound:9.2e}  {'ok' if check.ok else 'FAIL'}")
    assert check.ok
    assert lse_error(fast_lse, ref_lse) <= F32_TOL  # lse stays float32: the float32 tolerance applies
# The fast and naive errors are usually identical here: in float16 the largest error is the final
# rounding of O, and both stages round (almost) the same float32 values ([5]).
# The rule is no rubber stamp: an approximation that ignores the last 16 keys fails it.
q, k, v = (rng.standard_normal((n, d)).astype(np.float16) for _ in range(3))  # (N, d) each
ref_o, _ = tf.reference_attention(q, k, v)  # (N, d) float64
naive_o, _ = tf.naive_attention(q, k, v)  # (N, d) float16
approx_o, _ = tf.blocked_attention(q, k[:-16], v[:-16], block_q=B, block_k=B)  # (N, d) without 16 keys
check = fa_rule(approx_o, naive_o, ref_o, np.float16)
print(f"  dropping the last 16 of {n} keys: error {check.fast_error:.2e} > bound {check.bound:.2e} -> rejected")
assert not check.ok and check.fast_error > 3 * check.bound
