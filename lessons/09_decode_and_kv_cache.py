"""Lesson 09: decoding with a KV cache — split-KV (Flash-Decoding), grouped-query attention, pages.

What you will learn
    * why generating one token at a time is bound by memory, not arithmetic: a decode step
      reads the whole KV cache to do about one FLOP per byte, where an H200 could do 200;
    * why FlashAttention's grid (one thread block per query tile and head) leaves most of the
      GPU idle when there is one query row, and how split-KV fixes it: split the keys, attend
      each split in its own block, combine the partial results exactly through their lse;
    * that the combine is the online softmax's rescaling once more (lesson 02), so the result
      is exact for any number of splits, even empty ones;
    * what grouped-query attention saves (the cache and the bytes read, by H / H_kv) and how a
      kernel reads each K/V byte once for all the query heads that share it;
    * how a paged cache (pages of 16 tokens in one pool, a block table per sequence) holds
      sequences of different lengths, and that attention through it gives the same numbers;
    * how big a KV cache is: a 32-layer model at 128k tokens of context, computed.

What changed since lesson 05: the same online softmax, but the loop over K/V tiles is cut into
splits that run in parallel, and there is one query row instead of thousands. The kernels are
new: one block per (split, sequence, K/V head) on the CUDA cores (src/tinyflash/decode/kernels/cuda_cores.py),
or one warp per block on the tensor cores (src/tinyflash/decode/kernels/tensor_cores.py, with lesson
07's fragments, from src/tinyflash/warp_tile.py).

Run from the repository root:  python lessons/09_decode_and_kv_cache.py
Without a GPU the kernels run on numba's CUDA simulator at a tiny size. The KV-cache
figure, figures/kv_cache.png, is drawn by  python -m tinyflash.plots --only kv_cache.

Running time: about 50 s on 2 CPU cores without a GPU, its kernels on numba's simulator
(figures/data/cpu_runs.csv, 2026-12-05, commit 648bbe0+).
"""

# %% [0] Where the kernels run: decide before numba is imported
from lib import use_gpu_or_simulator  # imports no numba

HAS_GPU = use_gpu_or_simulator()  # a GPU if CuPy sees one, else NUMBA_ENABLE_CUDASIM=1 (before numba is imported)

import numpy as np  # noqa: E402

import tinyflash as tf  # noqa: E402
from tinyflash.core.checks import check_attention_inputs  # noqa: E402
from tinyflash.core.heads import group_query_heads, kv_heads_view  # noqa: E402
from tinyflash.core.tolerance import F32_TOL, assert_close, assert_fa_rule  # noqa: E402
from tinyflash.decode import split_kv  # noqa: E402
from tinyflash.decode.cache_memory import attention_intensity, kv_cache_bytes  # noqa: E402
from tinyflash.decode.paged import to_paged  # noqa: E402
from tinyflash.decode.kernels import VERSIONS as DECODE_KERNELS  # noqa: E402
from tinyflash.cost.memory import format_bytes  # noqa: E402
from lib import lesson_rng, record  # noqa: E402
from tinyflash.hardware import H200  # noqa: E402

print(f"kernels on {'the GPU' if HAS_GPU else 'numba CUDA simulator (no GPU found)'}")
rng = lesson_rng()  # seeded, the seed printed (TINYFLASH_SEED=n for others): the checks hold for any seed

# %% [1] Why decode is memory-bound: FLOPs per byte
# A decode step of one layer: one new query row per head (Nq = 1) against the Nk cached keys.
#   FLOPs  = 4 · H · Nq · Nk · d            (Q Kᵀ and P V)
#   bytes  = (2 · H_kv · Nk · d) · 2        (read all of K and V once, float16) + Q and O (tiny)
# so FLOPs per byte is about H · Nq / H_kv: 1 for multi-head attention, whatever Nk is.
balance = H200.fp16_dense_flops / H200.hbm_bytes_per_s  # FLOPs the H200 can do per byte it reads
shape = {"heads": 32, "n_k": 131_072, "head_dim": 128}
decode_mha = attention_intensity(kv_heads=32, n_q=1, **shape)
decode_gqa = attention_intensity(kv_heads=8, n_q=1, **shape)
prefill = attention_intensity(kv_heads=32, n_q=131_072, **shape)
print(f"\nH200 datasheet: {H200.fp16_dense_flops / 1e12:.0f} TFLOP/s (float16, dense) / "
      f"{H200.hbm_bytes_per_s / 1e12:.1f} TB/s = {balance:.0f} FLOPs per byte")
print(f"attention, H = 32, d = 128, Nk = 131,072, float16: decode (Nq = 1) {decode_mha:.2f} FLOP/byte with 32 "
      f"K/V heads, {decode_gqa:.2f} with 8; prefill (Nq = Nk) {prefill:,.0f}")
assert decode_mha < 1.01 and 3.9 < decode_gqa < 4.01 and prefill > balance > 50 * decode_gqa
# Decode can at best run at the speed HBM delivers K and V: its time is bytes / bandwidth.

# %% [2] Why one block per head leaves the GPU idle
# FlashAttention's grid: one block per (query tile, batch · head). With Nq = 1 that is B · H_kv
# blocks (the query heads of a K/V head packed into one block, see [5]). An H200 has 132 SMs and
# runs a few such blocks on each at once: the "slots" of one wave. How many fit is the split kernel's
# own fact: its shared memory (and registers) per block. The tensor-core kernel that decodes float16 at
# d = 128 (the H200 measurements below) holds a ring of K/V tiles of 68 KB: 3 blocks per SM.
per_sm = DECODE_KERNELS["tensor_cores"].code.default_tiling(128).blocks_per_sm()
slots = H200.sms * per_sm
print(f"\n{H200.sms} SMs × {per_sm} resident blocks of the tensor-core split kernel = {slots} slots per wave")
print("  B   Nk       blocks unsplit  busy     splits (rule)  blocks  busy")
splits = {}
for batch in (1, 8):
    for n_k in (4_096, 32_768, 131_072):
        blocks = batch * 8  # B · H_kv, H_kv = 8
        s = splits[batch, n_k] = split_kv.choose_num_splits(blocks, n_k, H200.sms, per_sm)
        busy, busy_split = split_kv.wave_efficiency(blocks, slots), split_kv.wave_efficiency(blocks * s, slots)
        print(f"  {batch}  {n_k:>7,}  {blocks:>14}  {busy:5.1%}  {s:>14}  {blocks * s:>6}  {busy_split:5.1%}")
        assert busy < 0.2 < busy_split  # unsplit, most of the GPU waits; split, it is busy
# At B = 1 and Nk = 4,096 the rule stops at 28 splits: each split must hold at least MIN_KEYS_PER_SPLIT keys.
# The rule (split_kv.choose_num_splits) is FlashAttention's: the fewest splits whose wave
# efficiency is within 85% of the best, each split holding at least MIN_KEYS_PER_SPLIT keys.

# %% [3] The split and the merge, in NumPy
# Pseudocode:
#   for each split s, keys [k_begin, k_end):  O_s, lse_s = attention(q, K[k_begin:k_end], V[k_begin:k_end])
#   lse = log Σ_s exp(lse_s)                  (the log-sum-exp of all the scores of the row)
#   O   = Σ_s exp(lse_s - lse) · O_s          (each split weighted by its share of the softmax mass)
# That is the online softmax's update with one "score" lse_s and one "value" O_s per split.
q = rng.standard_normal((1, 4, 1, 16))  # (B, H, Nq, d): one new token, 4 query heads
k = rng.standard_normal((1, 2, 50, 16))  # (B, H_kv, Nk, d): 2 K/V heads (grouped-query attention)
v = rng.standard_normal((1, 2, 50, 16))  # (B, H_kv, Nk, d)
ref_o, ref_lse = tf.reference_attention(q, k, v)
prob = check_attention_inputs(q, k, v, causal=False, scale=None)
bounds = split_kv.split_bounds(50, 4)  # [(0, 13), (13, 26), (26, 39), (39, 50)]
Qg = group_query_heads(q, 2)  # (1, 2, 2, 1, 16): the query heads of each K/V head side by side
Kg, Vg = kv_heads_view(k, 2), kv_heads_view(v, 2)  # (1, 2, 1, 50, 16): broadcast over them
parts = [split_kv.partial_attention(Qg, Kg, Vg, prob, *b) for b in bounds]  # (O_s (1, 2, 2, 1, 16), lse_s (1, 2, 2, 1))
lse_s = np.stack([p[1] for p in parts])  # (4 splits, B, H_kv, group, Nq)
weights = np.exp(lse_s - np.logaddexp.reduce(lse_s, axis=0))  # (4, ...): each split's share, summing to 1
print(f"\n4 splits of 50 keys {bounds}: weights of head 0 = {np.round(weights[:, 0, 0, 0, 0], 3)}")
o, lse = split_kv.combine([p[0] for p in parts], lse_s)
assert_close(o.reshape(ref_o.shape), ref_o, 1e-12, "combined o")
assert_close(lse.reshape(ref_lse.shape), ref_lse, 1e-12, "combined lse", is_lse=True)
errors = [float(np.abs(tf.split_kv_attention(q, k, v, num_splits=s)[0] - ref_o).max()) for s in (1, 2, 7, 50, 80)]
print(f"split_kv_attention with 1, 2, 7, 50, 80 splits: max |error| {max(errors):.1e} (80 > 50 keys: empty splits)")
assert max(errors) < 1e-12

# %% [4] Grouped-query attention: what it saves
# q (B, H, Nq, d), k and v (B, H_kv, Nk, d): query head h reads K/V head h // (H / H_kv). The
# NumPy stages pair them with broadcasting views; K and V are never repeated.
k_rep, v_rep = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)  # (1, 4, 50, 16): what MHA would store
assert_close(tf.naive_attention(q, k_rep, v_rep)[0], ref_o, 1e-12, "GQA == repeated K/V")
print(f"GQA here: K and V of {k.nbytes + v.nbytes:,} bytes instead of {k_rep.nbytes + v_rep.nbytes:,} (H / H_kv = 2)")

# %% [5] The kernels: a split kernel, then a combine kernel
# One block per (split, sequence, K/V head). Its threads copy tiles of K and V rows into a ring
# of shared memory with 16-byte cp.async copies (TD lanes per row; 2 tiles in flight while one is
# computed, so HBM always has enough requests), compute the scores of all the packed rows (the
# group's query heads × Nq) from that one read, and keep an online-softmax state per key slot in
# registers; at the end
# the slots' states are merged (core.online_softmax.merge_weights) and the partial (O_s, lse_s)
# written. The combine kernel merges the splits with the same exact result, in the two passes of a
# plain softmax (the max of the lse_s, then their sum, then Σ_s w_s · O_s): every lse_s is known when
# it starts, so it does not need the online form, and its weighted terms are independent loads.
# On Hopper the combine kernel is launched with programmatic dependent launch: the driver may start it
# while the split kernel's last blocks still run, and each of its blocks waits for the partials inside
# (griddepcontrol.wait), so the short step has less idle time between its two kernels.
n_k, d = (4_000, 128) if HAS_GPU else (45, 8)
q32 = rng.standard_normal((2, 4, 2, d)).astype(np.float32)  # (B, H, Nq = 2, d): speculative decoding
k32 = rng.standard_normal((2, 2, n_k, d)).astype(np.float32)  # (B, H_kv, Nk, d)
v32 = rng.standard_normal((2, 2, n_k, d)).astype(np.float32)
o_gpu, lse_gpu = tf.cuda_split_kv_attention(q32, k32, v32, num_splits=3, causal=True)
o_ref, lse_ref = tf.reference_attention(q32, k32, v32, causal=True)
err = assert_close(o_gpu, o_ref, F32_TOL, "split kernel o")
assert_close(lse_gpu, lse_ref, F32_TOL, "split kernel lse", is_lse=True)
print(f"\nsplit kernel, B = 2, H = 4, H_kv = 2, Nq = 2 (causal), Nk = {n_k:,}, 3 splits: relative error {err:.1e}")

# The same split on the tensor cores (src/tinyflash/decode/kernels/tensor_cores.py), which
# cuda_split_kv_attention picks for float16 at d a multiple of 8 up to 256. One warp per block: the packed rows
# (here 2 query heads × Nq = 2 = 4) become the 16 rows of stage 3's mma.sync, the other 12 are
# zeros, multiplied for nothing, as decoding has tensor-core time to spare. S = Q·K_jᵀ and P·V_j are
# mma's on tiles that a cp.async ring brings in: far fewer instructions per key than the CUDA-core
# kernel's, which lets a few blocks read the cache near HBM's speed.
d16 = 128 if HAS_GPU else 64
q16, k16, v16 = (rng.standard_normal(x.shape[:-1] + (d16,)).astype(np.float16) for x in (q32, k32, v32))
o16, _ = tf.cuda_split_kv_attention(q16, k16, v16, num_splits=3, causal=True)
rule = assert_fa_rule(o16, tf.naive_attention(q16, k16, v16, causal=True)[0],
                      tf.reference_attention(q16, k16, v16, causal=True)[0], np.float16, what="tensor-core split kernel")
print(f"the same on the tensor cores, float16, d = {d16}: largest error {rule.fast_error:.1e}, standard attention's "
      f"in float16 {rule.naive_error:.1e} (FlashAttention's rule: at most 2× that)")

# %% [6] The paged cache: pages in one pool, a block table per sequence
lens = [n_k, n_k // 3]  # two sequences of different lengths
cache = to_paged(k32, v32, lens, page_size=4 if not HAS_GPU else 16, rng=rng)
print(f"pages of {cache.page_size} tokens, pool of {cache.k_pages.shape[0]} pages; block table of sequence 1 "
      f"(its {lens[1]} tokens): {cache.block_table[1, :-(-lens[1] // cache.page_size)].tolist()}")
o_paged, lse_paged = tf.cuda_paged_attention(q32, cache, causal=True)
for b, n in enumerate(lens):
    ref_b = tf.reference_attention(q32[b], k32[b, :, :n], v32[b, :, :n], causal=True)
    assert_close(o_paged[b], ref_b[0], F32_TOL, f"paged kernel, sequence {b}")
    assert_close(lse_paged[b], ref_b[1], F32_TOL, f"paged kernel lse, sequence {b}", is_lse=True)
print("the paged kernel, reading every key through the block table, gives the contiguous cache's result")

# %% [7] How big the cache is: a worked example, and the figure
# bytes = 2 (K and V) · layers · batch · context · H_kv · d · bytes per element
model = {"layers": 32, "head_dim": 128, "context": 131_072}
print("\n32 layers, 32 query heads, d = 128, one sequence of 131,072 tokens:")
sizes = {}
for name, h_kv in (("MHA", 32), ("GQA", 8), ("MQA", 1)):
    for dt, size in (("float16", 2), ("int8", 1)):
        sizes[name, dt] = kv_cache_bytes(kv_heads=h_kv, bytes_per_element=size, **model)
    read_ms = sizes[name, "float16"] / H200.hbm_bytes_per_s * 1e3
    print(f"  {name} ({h_kv:>2} K/V head{'s' if h_kv > 1 else ' '}): "
          f"{format_bytes(sizes[name, 'float16']):>9} in float16, "
          f"{format_bytes(sizes[name, 'int8']):>9} in int8; reading it once at {H200.hbm_bytes_per_s / 1e12:.1f} TB/s "
          f"takes {read_ms:.1f} ms: at most {1e3 / read_ms:.0f} tokens/s for this sequence")
assert sizes["MHA", "float16"] == 4 * sizes["GQA", "float16"] == 32 * sizes["MQA", "float16"]
assert sizes["MHA", "float16"] == 2 * sizes["MHA", "int8"]
print(f"an H200 holds {H200.memory_bytes / 1e9:.0f} GB: the MHA cache of "
      f"{H200.memory_bytes // sizes['MHA', 'float16']} such sequences, the GQA one of "
      f"{H200.memory_bytes // sizes['GQA', 'float16']} (before the model's weights)")
assert H200.memory_bytes // sizes["MHA", "float16"] == 2 and H200.memory_bytes // sizes["GQA", "float16"] == 8

# What the H200 measured (python -m tinyflash.bench decode; the record, not measured here): µs per call of
# the split kernels, as the rule above split them, beside PyTorch's SDPA flash backend (its own decode kernel)
rows = record("decode_h200")
print(f"\nmeasured on an H200 ({rows[0]['date']}), B = 1 and 8, H = 32, H_kv = 8, d = 128, float16, µs per call:")
print("  B       Nk  splits  split-KV  SDPA flash  split-KV / flash")
for r in rows:
    if r["impl"] == "split_kv" and r["variant"] == "":
        flash = next(x for x in rows if (x["impl"], x["variant"], x["batch"], x["n_k"]) == ("torch_flash", "", r["batch"],
                                                                                           r["n_k"]))
        print(f"  {r['batch']}  {int(r['n_k']):>7,}  {r['num_splits']:>6}  {float(r['time_ms']) * 1e3:8.1f}  "
              f"{float(flash['time_ms']) * 1e3:10.1f}  {float(flash['time_ms']) / float(r['time_ms']):16.2f}×")
        assert int(r["num_splits"]) == splits[int(r["batch"]), int(r["n_k"])]  # the rule above chose them
print("the figure: python -m tinyflash.plots --only kv_cache  ->  figures/kv_cache.png")
