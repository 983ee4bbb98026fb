"""Lesson 06: memory and HBM traffic against sequence length, measured beside the model.

What you will learn
    * how many bytes standard attention needs at sequence length N, and where it stops fitting
      on a GPU, from an exact model (the 32k-token example falls out of it);
    * that the model is right: tracemalloc sees naive_attention allocate S, P and O and nothing
      else of note, and blocked_attention allocate its output plus a few tiles, whatever N is;
    * how many bytes each algorithm moves to and from main memory (HBM): counted from the tile
      loads and stores of the blocked stage, equal to a closed form, and within a constant of
      the paper's bounds Θ(N·d + N²) and Θ(N²·d²/M);
    * that FlashAttention's saving in traffic depends on the on-chip memory M: with 64 × 64
      tiles it moves about half the bytes of standard attention, with an H200's shared memory
      about a thirteenth, and with very little SRAM it would move more.

What changed since the earlier lessons: no new algorithm. The two NumPy stages you know are
measured; every number printed below is computed by tinyflash and checked by an assert.

Run from the repository root:  python lessons/06_memory_and_io.py
The figures of these numbers, figures/memory_model.png, memory_cpu_measured.png and hbm_traffic.png,
are drawn by  python -m tinyflash.plots.

Running time: under a second on 2 CPU cores without a GPU (figures/data/cpu_runs.csv, 2026-12-05,
commit 648bbe0+).
"""

# %% [1] Why: the N × N matrix is the problem
# One head, N = 32,768 tokens, d = 128, fp16 (the 32k-token example). S has N² entries.
import numpy as np

import tinyflash as tf
from lib import lesson_rng
from tinyflash.cost.memory import (GiB, KiB, MiB, attention_memory, blocked_workspace_bytes, format_bytes, max_sequence_length, measure_peak_bytes, tile_bytes)
from tinyflash.cost.traffic import (HOPPER_SRAM_ELEMENTS, SRAM_ELEMENTS, flash_attention_traffic, flash_traffic_closed_form, standard_attention_traffic, standard_traffic_closed_form, theta_flash, theta_standard, tile_sizes, traffic_ratio)
from tinyflash.hardware import CONSUMER_CARD_BYTES, H200


one = attention_memory(32_768, 128, heads=1, dtype="float16")
many = attention_memory(32_768, 128, heads=32, dtype="float16")
print("the 32k-token example: B = 1, H = 32 heads, N = 32,768 tokens, d = 128, float16, causal")
print(f"  why it matters: its float16 scores S alone would need {format_bytes(many.scores)}; FlashAttention never "
      "stores them")
print(f"  one head : S = {format_bytes(one.scores)}, S + P = {format_bytes(one.logits_and_probabilities)}, "
      f"Q + K + V = {format_bytes(one.qkv)}, O = {format_bytes(one.o)}")
print(f"  32 heads : S = {format_bytes(many.scores)}, S + P = {format_bytes(many.logits_and_probabilities)}")
print(f"  one 128 × 128 fp16 score tile: {format_bytes(tile_bytes(128, 128, 'float16'))}")
assert 32_768**2 == 1_073_741_824 and one.scores == 2 * GiB and one.logits_and_probabilities == 4 * GiB
assert one.q == one.k == one.v == one.o == 8 * MiB and one.qkv == 24 * MiB
assert many.scores == 64 * GiB and many.logits_and_probabilities == 128 * GiB
assert tile_bytes(128, 128, "float16") == 32 * KiB

# %% [2] The model against N: quadratic vs linear, and where naive stops fitting
# Pseudocode of the two footprints (beyond the inputs Q, K, V):
#   standard attention:  S (N × N) + P (N × N) + O (N × dv)    -> grows as N²
#   FlashAttention:      O (N × dv) + lse (N)                   -> grows as N·d
print("\n32 heads, d = 128, fp16:\n        N   S + P + O    O + lse    ratio")
for n in (1024, 4096, 16_384, 32_768, 131_072):
    m = attention_memory(n, 128, heads=32, dtype="float16")
    print(f"{n:>9,}  {format_bytes(m.naive_extra):>10}  {format_bytes(m.flash_extra):>9}  "
          f"{m.naive_extra / m.flash_extra:>6.0f}×")
    assert m.naive_extra / m.flash_extra > n / 128  # the ratio grows linearly with N

fit_h200 = max_sequence_length(H200.memory_bytes, heads=32, dtype="float16", matrices=2)
fit_24 = max_sequence_length(CONSUMER_CARD_BYTES, heads=32, dtype="float16", matrices=2)
print(f"S + P for 32 heads in fp16 fit in 141 GB up to N = {fit_h200:,} and in 24 GiB up to N = {fit_24:,}")
assert (fit_h200, fit_24) == (33_189, 14_188)
assert fit_24 < 32_768 <= fit_h200  # the 32k-token example: fits an H200 (just), not a 24 GiB card

# %% [3] Measure: tracemalloc sees every NumPy buffer
# measure_peak_bytes(fn, ...) = the highest allocation during the call beyond what existed before.
d, block = 64, 64
rng = lesson_rng()  # seeded and printed (TINYFLASH_SEED=n for others); memory does not depend on the values
print(f"\nmeasured on this CPU, float32, d = {d}:")
print("     N   naive peak   model S+P+O   error | blocked peak   O + lse   peak − (O + lse)")
workspaces = []
for n in (256, 512, 1024, 2048):
    q, k, v = (rng.standard_normal((n, d), dtype=np.float32) for _ in range(3))  # (N, d) each
    model = attention_memory(n, d, dtype="float32")
    naive_peak, _ = measure_peak_bytes(tf.naive_attention, q, k, v)
    blocked_peak, _ = measure_peak_bytes(tf.blocked_attention, q, k, v, block_q=block, block_k=block)
    error = naive_peak / model.naive_extra - 1
    workspaces.append(blocked_peak - model.flash_extra)
    print(f"{n:>6,}  {format_bytes(naive_peak):>11}  {format_bytes(model.naive_extra):>12}  {100 * error:5.1f}% | "
          f"{format_bytes(blocked_peak):>12}  {format_bytes(model.flash_extra):>8}  {format_bytes(workspaces[-1]):>8}")
    assert 0 <= error <= 0.10  # naive: S + P + O and a few length-N vectors
workspace_model = blocked_workspace_bytes(block, block, d, "float32")
print(f"blocked: the same {format_bytes(workspaces[-1])} of tiles at every N "
      f"(model: the larger of 3·Br·Bc + Br·d and 2·Br·Bc + 4·Br·d elements = {format_bytes(workspace_model)})")
assert max(workspaces) - min(workspaces) <= KiB  # flat in N: no N × N array anywhere
assert abs(workspaces[-1] / workspace_model - 1) <= 0.10

# %% [4] Traffic: count the tile loads and stores, compare with the closed form
# Standard attention (three kernels):  read Q, K -> write S | read S -> write P | read P, V -> write O
# FlashAttention (blocked.py):         for each query tile: read Q_i, then every K_j, V_j it needs; write O_i, lse_i
print("\ncounted (blocked_attention) == closed form, fp16, d = 64, lengths no tile divides:")
for n_q, n_k, causal in ((1000, 1000, False), (1000, 1000, True), (777, 1234, True), (1234, 777, True)):
    counted = flash_attention_traffic(n_q, 64, n_k=n_k, causal=causal, block_q=64, block_k=64)
    closed = flash_traffic_closed_form(n_q, 64, n_k=n_k, causal=causal, block_q=64, block_k=64)
    print(f"  Nq = {n_q:>5,}, Nk = {n_k:>5,}, causal = {causal!s:5}: {counted.total:>10,} bytes")
    assert dict(counted.reads) == dict(closed.reads) and dict(counted.writes) == dict(closed.writes)

# %% [5] Traffic against N and against SRAM size M, beside the paper's bounds
print("\nHBM bytes per head, fp16, d = 64 (closed forms, which the counts above and tests/test_traffic.py "
      "check against blocked_attention's own tile loads):")
print("       N     standard   Flash M=16,384   Flash M=116,736   std / Θ(Nd+N²)   flash / Θ(N²d²/M)")
h200_m = HOPPER_SRAM_ELEMENTS  # an H200 SM's 228 KiB of shared memory, as fp16 elements: 116,736
for n in (1024, 4096, 16_384, 131_072):
    std = standard_traffic_closed_form(n, 64)
    std_walk = standard_attention_traffic(n, 64).total  # the step-by-step walk: same number
    flash = [flash_traffic_closed_form(n, 64, block_q=tile_sizes(m, 64)[0], block_k=tile_sizes(m, 64)[1]).total
             for m in (SRAM_ELEMENTS, h200_m)]
    r_std, r_flash = std / (2 * theta_standard(n, 64)), flash[0] / (2 * theta_flash(n, 64, SRAM_ELEMENTS))
    print(f"{n:>8,}  {format_bytes(std):>11}  {format_bytes(flash[0]):>15}  {format_bytes(flash[1]):>16}  "
          f"{r_std:>15.2f}  {r_flash:>18.2f}")
    assert std == std_walk and flash[1] < flash[0] < std
    assert 4 <= r_std <= 4.1 and 8 <= r_flash <= 12  # constants hidden in the Θ, the same at every N
# How many times more standard attention moves, at N = 4096, for three SRAM sizes M:
ratios = {m: traffic_ratio(4096, 64, m) for m in (SRAM_ELEMENTS, h200_m, 4096)}
print("standard / FlashAttention at N = 4096: " + ", ".join(f"{r:.2f}× with M = {m:,}" for m, r in ratios.items()))
assert abs(ratios[SRAM_ELEMENTS] - 2.0) < 0.01  # 64 × 64 tiles: K and V re-read N/64 times, 2N² vs 4N² elements
assert 12.9 < ratios[h200_m] < 13.1 and ratios[4096] < 1  # big SRAM: 13× less; tiny SRAM: Flash moves more

# %% [6] The picture
print("\nthe figures: python -m tinyflash.plots  ->  figures/memory_model.png, memory_cpu_measured.png, "
      "hbm_traffic.png (and the GPU ones)")
