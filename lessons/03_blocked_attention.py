"""Lesson 03: stage 1, FlashAttention's tiled loop in NumPy.

What you will learn
    * the loop of FlashAttention (forward pass): query tiles Q_i of Br rows outside, key/value
      tiles K_j, V_j of Bc rows inside, and per query row the online-softmax state m_i, l_i and
      an unnormalised output acc, rescaled by alpha whenever the running maximum grows;
    * what Br, Bc, Tr = ceil(Nq / Br) and Tc = ceil(Nk / Bc) are, and that tiles need not divide
      the sequence (the last one is ragged);
    * that tinyflash.blocked_attention gives the same O and lse as naive_attention, to 1e-12 in
      float64, for every tile size, causal or not;
    * that with a causal mask the key tiles above the diagonal are skipped, not computed and
      masked: about half the tiles, counted from the tile loads with tinyflash.cost.traffic.HBMCounter;
    * that nothing N × N is ever allocated (tracemalloc).

What changed since the last lesson: lesson 02 ran the online softmax for one query row. Here it
runs for Br rows at once against Bc keys at a time, so the scores exist only as Br × Bc tiles.

Run from the repository root:  python lessons/03_blocked_attention.py

Running time: under a second on 2 CPU cores without a GPU (figures/data/cpu_runs.csv, 2026-12-05,
commit 648bbe0+).
"""

# %% [1] Why: tiles small enough for on-chip memory
# Lesson 01 built all of S (Nq × Nk) before the softmax. On a GPU, S lives in slow main memory
# (HBM), written once and read back. FlashAttention instead loads a tile of queries and a tile of
# keys into fast on-chip memory (SRAM), computes their Br × Bc scores, folds them into each row's
# online-softmax state (lesson 02) and throws them away. Only O and one lse per row are written.
import numpy as np

import tinyflash as tf
from tinyflash.core.tolerance import lse_error, rel_error
from tinyflash.cost.memory import (blocked_workspace_bytes, format_bytes, measure_peak_bytes, tile_bytes)
from tinyflash.cost.traffic import HBMCounter
from lib import lesson_rng

rng = lesson_rng()  # seeded, the seed printed (TINYFLASH_SEED=n for others): the checks hold for any seed

# %% [2] Pseudocode (the docstring of blocked.py; stage 2's GPU kernel runs the same loop)
#   for each query tile Q_i (Br rows):                 <- one GPU thread block
#       m_i = -inf, l_i = 0, acc = 0                   <- state kept on chip (registers)
#       for each key/value tile K_j, V_j (Bc rows):    <- loaded into shared memory
#           S_ij = scale · Q_i K_jᵀ                    (Br × Bc, never written to HBM)
#           m_new = max(m_i, rowmax(S_ij))
#           P_ij  = exp(S_ij - m_new)
#           alpha = exp(m_i - m_new)                   <- rescales what came before
#           l_i   = alpha · l_i + rowsum(P_ij)
#           acc   = alpha · acc + P_ij V_j
#           m_i   = m_new
#       O_i = acc / l_i,  lse_i = m_i + log(l_i)       <- the only writes to HBM
# Compare with lesson 02: m_i, l_i, acc are lesson 02's m, ℓ, o, one entry (or row) per query.
# Causal: a key tile that starts after the last key the tile's last query may see is skipped,
# and so are all the tiles after it; only tiles crossing the diagonal apply the mask.

# %% [3] The names: Br, Bc, Tr, Tc, and ragged last tiles
n, Br, Bc = 100, 33, 16
Tr, Tc = -(-n // Br), -(-n // Bc)  # ceil(N / Br) query tiles, ceil(N / Bc) key tiles
q_tiles = [(i * Br, min((i + 1) * Br, n)) for i in range(Tr)]  # [start, end) of each Q_i
k_tiles = [(j * Bc, min((j + 1) * Bc, n)) for j in range(Tc)]  # [start, end) of each K_j, V_j
print(f"N = {n}, Br = {Br}, Bc = {Bc}:  Tr = {Tr} query tiles, Tc = {Tc} key/value tiles")
print("  Q_i rows:       " + "  ".join(f"{a}-{b - 1}" for a, b in q_tiles))
print("  K_j, V_j rows: " + "  ".join(f"{a}-{b - 1}" for a, b in k_tiles))
print(f"  the last query tile has {q_tiles[-1][1] - q_tiles[-1][0]} row(s), "
      f"the last key tile {k_tiles[-1][1] - k_tiles[-1][0]}")
assert sum(b - a for a, b in q_tiles) == n == sum(b - a for a, b in k_tiles)  # every row in exactly one tile
assert (Tr - 1) * Br < n <= Tr * Br and (Tc - 1) * Bc < n <= Tc * Bc

# %% [4] Check: stage 1 against stage 0 in float64, tile sizes that do not divide N
d = 32
print(f"\nblocked_attention vs naive_attention, float64, d = {d}:")
print("    Nq    Nk   Br   Bc  causal   error of O   error of lse")
cases = [(100, 100, b_q, b_k) for b_q, b_k in ((16, 16), (33, 33), (64, 64), (128, 128), (16, 33))]
cases += [(70, 100, 16, 33), (100, 70, 16, 33)]  # Nq != Nk: the causal diagonal is bottom-right
for n_q, n_k, b_q, b_k in cases:
    q = rng.standard_normal((n_q, d))  # (Nq, d)
    k = rng.standard_normal((n_k, d))  # (Nk, d)
    v = rng.standard_normal((n_k, d))  # (Nk, d)
    for causal in (False, True):
        if n_q != n_k and not causal:
            continue  # without a mask Nq != Nk is nothing new
        o0, lse0 = tf.naive_attention(q, k, v, causal=causal)  # (Nq, d), (Nq,)
        o1, lse1 = tf.blocked_attention(q, k, v, causal=causal, block_q=b_q, block_k=b_k)  # (Nq, d), (Nq,)
        err_o, err_lse = rel_error(o1, o0), lse_error(lse1, lse0)
        print(f"  {n_q:>4}  {n_k:>4}  {b_q:>3}  {b_k:>3}  {causal!s:>6}   {err_o:10.1e}   {err_lse:12.1e}")
        assert err_o <= 1e-12 and err_lse <= 1e-12
# The last case above, Nq = 100 > Nk = 70: the first 30 queries may attend no key: both stages give O = 0 and
# lse = -inf there, and rel_error demands that -inf entries match exactly.
assert np.all(lse0[:30] == -np.inf) and np.all(lse1[:30] == -np.inf) and np.all(o1[:30] == 0)

# %% [5] Causal: the tiles above the diagonal are never loaded
# Count the K tiles that blocked_attention loads: HBMCounter adds up the bytes of every tile it
# is told was read from main memory, exactly where the GPU kernel would read it.
n, d, B = 1024, 64, 64
q, k, v = (rng.standard_normal((n, d), dtype=np.float32) for _ in range(3))  # (N, d) each
k_tile_bytes = tile_bytes(B, d, "float32")  # one K_j: Bc × d
loads = {}
for causal in (False, True):
    io = HBMCounter()
    tf.blocked_attention(q, k, v, causal=causal, block_q=B, block_k=B, io=io)
    loads[causal] = io.reads["K"] // k_tile_bytes
    assert io.reads["K"] % k_tile_bytes == 0 and io.reads["V"] == io.reads["K"]  # whole tiles, K with V
    assert io.reads["Q"] == q.nbytes and io.writes["O"] == q.nbytes  # Q read once, O written once
T = n // B  # Tr = Tc = 16
print(f"\nN = {n}, Br = Bc = {B}: {T} × {T} = {T * T} (Q_i, K_j) tile pairs")
print(f"  K tiles loaded without a mask: {loads[False]}, causal: {loads[True]} = {T} · {T + 1} / 2 "
      f"-> {loads[True] / loads[False]:.0%} of the work")
assert loads[False] == T * T and loads[True] == T * (T + 1) // 2  # the lower triangle, diagonal included
assert 0.5 < loads[True] / loads[False] < 0.55  # about half: the diagonal tiles are the extra


# %% [6] The picture: which (Q_i, K_j) tiles the causal loop computes
def tile_map(n_q, n_k, b_q, b_k):
    """Rows of '#' (tile computed, no mask needed), '\\' (crosses the diagonal: computed and masked)
    and '.' (no allowed pair: skipped), read off tinyflash.causal_mask tile by tile."""
    rows, keys_loaded = [], 0
    for q_start in range(0, n_q, b_q):
        row = ""
        for k_start in range(0, n_k, b_k):
            allowed = tf.causal_mask(n_q, n_k, q_start, k_start, min(b_q, n_q - q_start),
                                     min(b_k, n_k - k_start))  # (<= Br, <= Bc) this tile of the mask
            row += "#" if allowed.all() else "\\" if allowed.any() else "."
            keys_loaded += allowed.shape[1] if allowed.any() else 0
        rows.append(row)
    return rows, keys_loaded


d = 8
key_row_bytes = d * np.dtype(np.float64).itemsize  # one row of K
for n_q, n_k in ((100, 100), (40, 100)):
    rows, keys_loaded = tile_map(n_q, n_k, 16, 16)
    q, k, v = (rng.standard_normal((m, d)) for m in (n_q, n_k, n_k))  # (Nq, d), (Nk, d), (Nk, d)
    io = HBMCounter()
    tf.blocked_attention(q, k, v, causal=True, block_q=16, block_k=16, io=io)
    print(f"\ncausal, Nq = {n_q}, Nk = {n_k}, Br = Bc = 16 (one row per Q_i, one column per K_j):")
    print("\n".join("  " + " ".join(r) for r in rows))
    print("  legend: # computed, no mask needed   \\ crosses the diagonal: computed, then masked   . skipped")
    print(f"  keys loaded: {keys_loaded} by the picture, {io.reads['K'] // key_row_bytes} counted by HBMCounter")
    assert keys_loaded * key_row_bytes == io.reads["K"]  # the loop skipped exactly the dots
# With Nq < Nk the diagonal is aligned bottom-right: the 40 queries are the last 40 of 100 tokens,
# so query 0 is token 60 and may attend keys 0 to 60; its tile needs no mask for the first 48 keys.

# %% [7] Check: nothing N × N is allocated
# measure_peak_bytes runs the call under tracemalloc, which sees every NumPy buffer (lesson 01, [8]).
n, d = 2048, 64
q, k, v = (rng.standard_normal((n, d)) for _ in range(3))  # (N, d) each, float64
peak, (o, lse) = measure_peak_bytes(tf.blocked_attention, q, k, v, block_q=64, block_k=64)
print(f"\nN = {n}, d = {d}, float64, 64 × 64 tiles: blocked_attention's peak is {format_bytes(peak)}")
tiles = peak - o.nbytes - lse.nbytes  # what the loop holds besides its results
model = blocked_workspace_bytes(64, 64, d, "float64")  # cost/memory.py: a few Br × Bc tiles and Br × dv accumulators
print(f"  one N × N matrix would be {format_bytes(n * n * 8)}; the output O is {format_bytes(o.nbytes)}, "
      f"the tiles the rest: {format_bytes(tiles)} (model: {format_bytes(model)}, whatever N is)")
assert 0 < tiles <= 1.25 * model
assert peak < 0.05 * n * n * 8  # under 5% of a single N × N float64 matrix
assert rel_error(o, tf.reference_attention(q, k, v)[0]) <= 1e-12  # and still the right answer
