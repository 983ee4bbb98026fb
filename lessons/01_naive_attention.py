"""Lesson 01: attention as the textbook writes it, and the N × N matrix it builds.

What you will learn
    * the formula S = scale · Q Kᵀ, P = softmax(S) row by row, O = P V, and the shape of every
      array in it: one score per (query, key) pair, so S and P are Nq × Nk;
    * why softmax subtracts the row maximum before exp: in float32, exp(100) is already inf;
    * the causal mask, aligned bottom-right: query i may attend key j iff j <= i + (Nk - Nq);
    * what the N × N matrix costs: for 32,768 tokens and d = 128 in fp16, one head's scores
      take exactly 2 GiB, while Q, K, V and O take 8 MiB each.

What changed since the last lesson: this is the first one. Stage 0, tinyflash.naive_attention,
is the trusted reference that every later stage is checked against.

Run from the repository root:  python lessons/01_naive_attention.py

Running time: under a second on 2 CPU cores without a GPU (figures/data/cpu_runs.csv, 2026-12-05,
commit 648bbe0+).
"""

# %% [1] Why: attention compares every query with every key
# Each token brings a query row, a key row and a value row. A query's output is an average of
# the value rows, weighted by how well the query matches each key. "Every query with every key"
# is where the N × N matrix comes from.
import math

import numpy as np

import tinyflash as tf
from tinyflash.core.tolerance import lse_error, rel_error
from tinyflash.cost.memory import (GiB, KiB, MiB, attention_memory, format_bytes, measure_peak_bytes, tile_bytes)
from lib import lesson_rng

rng = lesson_rng()  # seeded, the seed printed (TINYFLASH_SEED=n for others): the checks hold for any seed

# %% [2] Pseudocode (naive.py)
#   S = scale · Q Kᵀ            (Nq × Nk)  scale = 1/sqrt(d)
#   m = rowmax(S)               (Nq,)      subtracted before exp, so exp never overflows
#   P = exp(S - m) / rowsum     (Nq × Nk)  each row sums to 1
#   O = P V                     (Nq × dv)
#   lse = m + log(rowsum)       (Nq,)      log-sum-exp of each row; kept for later stages

# %% [3] Code: the formula written out entry by entry, on a tiny example
n_q, n_k, d, d_v = 5, 7, 4, 3  # all different, so every shape below is unambiguous
Q = rng.standard_normal((n_q, d))  # (Nq, d)   one query row per token
K = rng.standard_normal((n_k, d))  # (Nk, d)   one key row per token
V = rng.standard_normal((n_k, d_v))  # (Nk, dv)  one value row per token
scale = 1 / math.sqrt(d)

S = np.empty((n_q, n_k))  # (Nq, Nk)  one score per (query, key) pair: the N × N matrix
for i in range(n_q):
    for j in range(n_k):
        S[i, j] = scale * sum(Q[i, c] * K[j, c] for c in range(d))
P = np.empty((n_q, n_k))  # (Nq, Nk)  probabilities
lse = np.empty(n_q)  # (Nq,)
for i in range(n_q):
    m = max(S[i])  # the row maximum
    e = [math.exp(s - m) for s in S[i]]  # every exponent is <= 0, so every term is <= 1
    total = sum(e)  # the softmax denominator of row i
    P[i] = [x / total for x in e]
    lse[i] = m + math.log(total)
O = P @ V  # (Nq, dv)  each output row is a weighted average of the value rows

print("shapes:")
for name, a in (("Q", Q), ("K", K), ("V", V), ("S = scale·QKᵀ", S), ("P = softmax(S)", P), ("O = PV", O)):
    print(f"  {name:<15} {a.shape}")
assert S.shape == P.shape == (n_q, n_k) and O.shape == (n_q, d_v)

# %% [4] Check: tinyflash.naive_attention is that formula
o0, lse0 = tf.naive_attention(Q, K, V)  # (Nq, dv), (Nq,)
err_o, err_lse = rel_error(o0, O), lse_error(lse0, lse)
print(f"\nnaive_attention vs the loops above: relative error of O {err_o:.1e}, of lse {err_lse:.1e}")
assert o0.shape == (n_q, d_v) and lse0.shape == (n_q,)
assert err_o <= 1e-12 and err_lse <= 1e-12
assert np.allclose(P.sum(axis=1), 1.0, rtol=0, atol=1e-12)  # softmax rows sum to 1

# %% [5] Why subtract the maximum: exp overflows long before the scores look big
# float32's largest number is about 3.4e38, so exp(s) is inf for s > log(3.4e38) ≈ 88.7.
overflow_at = float(np.log(np.finfo(np.float32).max))
row = np.concatenate([[100.0], rng.uniform(90, 100, 4)]).astype(np.float32)  # (5,) one score of 100, others near it
with np.errstate(over="ignore", invalid="ignore"):
    big = np.exp(row)  # (5,) all inf
    unstable = big / big.sum()  # (5,) inf / inf = nan
shifted = np.exp(row - row.max())  # (5,) exponents <= 0: every term in (0, 1]
stable = shifted / shifted.sum()  # (5,)
exact = np.exp(row.astype(np.float64) - 100.0)  # (5,) float64, for comparison
exact /= exact.sum()
print(f"\nfloat32 exp overflows above {overflow_at:.2f}: exp(100) = {big[0]}")
print(f"  softmax without the max: {unstable}")
print(f"  softmax with the max:    {stable}  (sums to {stable.sum():.6f})")
assert 88 < overflow_at < 89 and np.isinf(big).all() and np.isnan(unstable).all()
assert np.isfinite(stable).all() and abs(stable.sum() - 1) < 1e-6 and rel_error(stable, exact) < 1e-6
# naive_attention subtracts the max too: scale the queries so the largest |score| is 200.
Q_big = (Q * (200 / np.abs(S).max())).astype(np.float32)  # (Nq, d)
K32, V32 = K.astype(np.float32), V.astype(np.float32)  # (Nk, d), (Nk, dv)
S_big = scale * Q_big @ K32.T  # (Nq, Nk)  shown only to print its size
o_big, lse_big = tf.naive_attention(Q_big, K32, V32)  # (Nq, dv), (Nq,)
print(f"  naive_attention with scores up to |{np.abs(S_big).max():.0f}|: output finite = {np.isfinite(o_big).all()}")
assert abs(np.abs(S_big).max() - 200) < 0.01 and np.isfinite(o_big).all() and np.isfinite(lse_big).all()

# %% [6] The causal mask, aligned bottom-right
# A token may only look at itself and earlier tokens. With Nq queries and Nk >= Nq keys, the
# queries are the LAST Nq tokens (e.g. new tokens appended to a cache of earlier keys), so the
# last query sees every key: query i may attend key j iff j <= i + (Nk - Nq).
mask = tf.causal_mask(3, 5)  # (3, 5) True where query i may attend key j
print("\ncausal mask, Nq = 3, Nk = 5 (1 = may attend):")
for i, mask_row in enumerate(mask):
    print(f"  query {i}: " + " ".join("1" if allowed else "0" for allowed in mask_row))
assert (mask == np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=bool)).all()
# Masked scores become -inf before the softmax, so they get probability exactly 0.
Qc, Kc, Vc = Q[:3], K[:5], V[:5]  # (3, d), (5, d), (5, dv)
Sc = np.where(mask, scale * Qc @ Kc.T, -np.inf)  # (3, 5)
Pc = np.exp(Sc - Sc.max(axis=1, keepdims=True))  # (3, 5) exp(-inf) = 0
Pc /= Pc.sum(axis=1, keepdims=True)
oc, _ = tf.naive_attention(Qc, Kc, Vc, causal=True)  # (3, dv)
print(f"  naive_attention(causal=True) vs masked softmax by hand: relative error {rel_error(oc, Pc @ Vc):.1e}")
assert rel_error(oc, Pc @ Vc) <= 1e-12 and (Pc[~mask] == 0).all()

# %% [7] What the N × N matrix costs: the 32k-token example
# One head, N = 32,768 tokens, d = 128, fp16 (2 bytes a number).
one = attention_memory(32_768, 128, heads=1, dtype="float16")
many = attention_memory(32_768, 128, heads=32, dtype="float16")
tile = tile_bytes(128, 128, "float16")
print("\nN = 32,768, d = 128, fp16")
print(f"  S has 32,768² = {32_768**2:,} scores: {format_bytes(one.scores)} per head; "
      f"S and P together {format_bytes(one.logits_and_probabilities)}")
print(f"  32 heads: S {format_bytes(many.scores)}, S and P {format_bytes(many.logits_and_probabilities)}")
print(f"  but Q, K, V are {format_bytes(one.q)} each ({format_bytes(one.qkv)} together) and O is "
      f"{format_bytes(one.o)} per head")
print(f"  a 128 × 128 fp16 tile of S (what FlashAttention keeps on chip instead): {format_bytes(tile)}")
assert 32_768**2 == 1_073_741_824 and one.scores == 2 * GiB and one.logits_and_probabilities == 4 * GiB
assert many.scores == 64 * GiB and many.logits_and_probabilities == 128 * GiB
assert one.q == one.k == one.v == 8 * MiB and one.qkv == 24 * MiB and one.o == 8 * MiB
assert tile == 32 * KiB
print(f"  S alone is {one.scores // one.o}× the output it helps compute")
assert one.scores // one.o == 32_768 // 128  # N / d: the ratio grows with N

# %% [8] Check: naive_attention really holds S and P (tracemalloc sees every NumPy buffer)
n = 1024
q, k, v = (rng.standard_normal((n, 64)) for _ in range(3))  # (N, 64) each, float64
peak, _ = measure_peak_bytes(tf.naive_attention, q, k, v)
print(f"\nN = {n}, float64: naive_attention's peak is {format_bytes(peak)}; "
      f"S and P take 2 · N² · 8 bytes = {format_bytes(2 * n * n * 8)}")
assert peak >= 2 * n * n * 8  # both N × N matrices were alive at once
# Lesson 03 computes the same O without ever allocating anything N × N.
