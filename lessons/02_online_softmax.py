"""Lesson 02: the online softmax: softmax of a row that arrives one chunk at a time.

What you will learn
    * why softmax seems to need the whole row at once (its maximum and its sum), and how a
      running maximum m and a running denominator ℓ remove that need;
    * the rescaling factor alpha = exp(m_old - m_new): when a later chunk raises the maximum,
      what was summed so far is multiplied down onto the new scale (a tile with maximum 4, then
      one containing 9: the first tile's sum is multiplied by exp(4 - 9));
    * that after every chunk the state is exactly the softmax of the part of the row seen so
      far, and after the last one it equals the full softmax;
    * that carrying a third quantity, o = the unnormalised weighted sum of value rows, gives
      attention for one query row without ever holding its whole row of scores.

What changed since the last lesson: lesson 01 computed softmax(S) on whole rows, so it had to
build all of S. Here a row is visited in chunks with tinyflash.OnlineSoftmax; lesson 03 does
the same for a whole tile of rows at once.

Run from the repository root:  python lessons/02_online_softmax.py

Running time: under a second on 2 CPU cores without a GPU (figures/data/cpu_runs.csv, 2026-12-05,
commit 648bbe0+).
"""

# %% [1] Why: softmax needs two things from the whole row
# softmax(s)_j = exp(s_j - m) / ℓ with m = max(s) and ℓ = sum(exp(s - m)). Both m and ℓ depend on
# every entry of the row. On a GPU a row of S has Nk entries spread over many key tiles, and
# only one tile fits on chip at a time. Computing m first and ℓ second would mean computing
# every score twice; the online softmax gets both in one pass.
import numpy as np

import tinyflash as tf
from tinyflash.core.tolerance import lse_error, rel_error
from lib import lesson_rng

rng = lesson_rng()  # seeded, the seed printed (TINYFLASH_SEED=n for others): the checks hold for any seed


def softmax(x):
    """The whole-row softmax of lesson 01, for comparison."""
    e = np.exp(x - x.max())  # (N,)
    return e / e.sum()  # (N,)


# %% [2] Pseudocode (online_softmax.py), one row, chunks s_1, s_2, ... of its scores
#   m_0 = -inf, ℓ_0 = 0, o_0 = 0
#   for each chunk t:
#       m_t   = max(m_{t-1}, max(s_t))
#       alpha = exp(m_{t-1} - m_t)                      <= 1; it is 1 when the max did not move
#       ℓ_t   = alpha · ℓ_{t-1} + sum(exp(s_t - m_t))
#       o_t   = alpha · o_{t-1} + exp(s_t - m_t) · V_t   (only for attention, [5])
#   softmax(s) = exp(s - m) / ℓ,  attention output = o / ℓ,  log-sum-exp = m + log(ℓ)

# %% [3] Code: one row of 10 scores in chunks of 4, 4 and 2
x = 3 * rng.standard_normal(10)  # (10,) one row of scores
chunk = 4
state = tf.OnlineSoftmax()
print(f"row of {x.size} scores, chunks of {chunk} (the last one ragged)")
print(" chunk      max(s_t)        m_t         ℓ_t     alpha")
for t, start in enumerate(range(0, x.size, chunk), 1):
    s_t = x[start:start + chunk]  # (<= 4,)
    m_old = state.m
    alpha = state.update(s_t)
    print(f"  {t}   {s_t.max():11.4f}  {state.m:9.4f}  {state.l:10.4f}  {alpha:8.4f}"
          + ("   <- first chunk: alpha = exp(-inf - m_1) = 0 rescales the empty start (ℓ_0 = 0)" if t == 1 else ""))
    # The invariant: the state is the softmax statistics of the prefix seen so far, exactly.
    seen = x[:start + chunk]  # (<= 10,)
    assert state.m == seen.max() and np.isclose(state.l, np.exp(seen - seen.max()).sum(), rtol=1e-14)
    assert alpha == np.exp(m_old - state.m)  # 0 on the first chunk (m_old = -inf), 1 if the max stayed

# %% [4] Check: one pass over the chunks gives the full softmax, for any chunk size
p, final = tf.online_softmax(x, chunk)  # (10,) probabilities, and the same state as above
print(f"online softmax vs whole-row softmax: relative error {rel_error(p, softmax(x)):.1e}")
assert final.history == state.history and rel_error(p, softmax(x)) <= 1e-14
for size in range(1, x.size + 1):  # chunks of 1 (one score at a time) up to the whole row
    p_size, _ = tf.online_softmax(x, size)  # (10,)
    assert rel_error(p_size, softmax(x)) <= 1e-14, size
print(f"the same for every chunk size from 1 to {x.size}")

# %% [5] The worked example: a first tile whose maximum is 4, a later tile containing 9
s_1 = rng.permutation(np.append(4.0, 4.0 - rng.uniform(0.5, 3.0, 3)))  # (4,) max 4
s_2 = rng.permutation(np.append(9.0, 9.0 - rng.uniform(0.5, 8.0, 3)))  # (4,) max 9
s_3 = 9.0 - rng.uniform(0.5, 8.0, 3)  # (3,) all below 9: the max does not move
ex = tf.OnlineSoftmax()
ex.update(s_1)
l_1 = ex.l  # sum(exp(s_1 - 4)): the first tile, measured against its own maximum 4
alpha_2 = ex.update(s_2)
print(f"\ntile 1 = {np.round(s_1, 2)}: m = {ex.history[0][0]:g}, ℓ = {l_1:.4f}")
print(f"tile 2 = {np.round(s_2, 2)}: m = {ex.m:g}, alpha = exp(4 - 9) = {alpha_2:.6f}, ℓ = {ex.l:.6f}")
assert ex.history[0][0] == 4.0 and np.isclose(l_1, np.exp(s_1 - 4.0).sum(), rtol=1e-14)
assert ex.m == 9.0 and alpha_2 == np.exp(4.0 - 9.0)
assert np.isclose(ex.l, alpha_2 * l_1 + np.exp(s_2 - 9.0).sum(), rtol=1e-14)
# Nothing was discarded: exp(4 - 9) · sum(exp(s_1 - 4)) is sum(exp(s_1 - 9)), tile 1 on the new scale.
print(f"  tile 1's share of ℓ: exp(4 - 9) · {l_1:.4f} = {alpha_2 * l_1:.6f} = sum(exp(s_1 - 9))")
assert np.isclose(alpha_2 * l_1, np.exp(s_1 - 9.0).sum(), rtol=1e-14)
alpha_3 = ex.update(s_3)
print(f"tile 3 = {np.round(s_3, 2)}: m = {ex.m:g} unchanged, alpha = {alpha_3:g}, ℓ = {ex.l:.6f}")
assert ex.m == 9.0 and alpha_3 == 1.0
row = np.concatenate([s_1, s_2, s_3])  # (11,) the whole row
p_ex = np.exp(row - ex.m) / ex.l  # (11,)
print(f"  exp(s - m) / ℓ vs whole-row softmax: relative error {rel_error(p_ex, softmax(row)):.1e}")
assert rel_error(p_ex, softmax(row)) <= 1e-14

# %% [6] With values: attention for one query row, key tile by key tile
# Carry o as well. After each tile, o / ℓ is attention over the keys seen so far; after the
# last, over all of them: the same number naive_attention gets from the whole row of S.
n_k, d, d_v, Bc = 50, 16, 8, 16  # 50 keys in tiles of 16, 16, 16 and 2
q = rng.standard_normal(d)  # (d,)     one query row
K = rng.standard_normal((n_k, d))  # (Nk, d)
V = rng.standard_normal((n_k, d_v))  # (Nk, dv)
s = (K @ q) / np.sqrt(d)  # (Nk,)    this query's row of S
row_state = tf.OnlineSoftmax()
print(f"\none query, {n_k} keys in tiles of Bc = {Bc}:")
print(" tile    keys        m          ℓ      alpha   o/ℓ vs attention over the keys so far")
print("  (alpha = exp(m_old - m_new); on tile 0, m_old = -inf: alpha = 0, nothing to rescale yet)")
for j, k_start in enumerate(range(0, n_k, Bc)):
    k_end = min(k_start + Bc, n_k)
    alpha = row_state.update(s[k_start:k_end], V[k_start:k_end])  # scores (Bc,), values (Bc, dv)
    so_far, _ = tf.naive_attention(q[None], K[:k_end], V[:k_end])  # (1, dv)
    err = rel_error(row_state.output(), so_far[0])
    print(f"  {j}   {k_start:>3}-{k_end - 1:<3}  {row_state.m:8.4f}  {row_state.l:9.4f}  {alpha:8.4f}   {err:.1e}")
    assert row_state.m == s[:k_end].max() and np.isclose(row_state.l, np.exp(s[:k_end] - row_state.m).sum())
    assert err <= 1e-13
o_full, lse_full = tf.naive_attention(q[None], K, V)  # (1, dv), (1,)
err_o, err_lse = rel_error(row_state.output(), o_full[0]), lse_error(row_state.lse, lse_full[0])
print(f"final o/ℓ vs naive_attention: relative error {err_o:.1e}; m + log ℓ vs its lse: {err_lse:.1e}")
assert err_o <= 1e-13 and err_lse <= 1e-13
# Per query row we kept two numbers (m, ℓ) and one vector o (dv,), never the row of Nk scores.
# Lesson 03 runs this for a whole tile of Br query rows at once: that is FlashAttention.
