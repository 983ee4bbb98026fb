"""Lesson 05: the blocked loop as a numba.cuda kernel, with tiles in shared memory.

What you will learn
    * to read a kernel: the simple one (v1) printed from its source beside stage 1's loop, then
      the fast one's (v5) loop, one device function per phase;
    * how stage 1's loops map onto a GPU: one thread block per (query tile Q_i, head), a loop
      over key/value tiles K_j, V_j that the block loads into shared memory (on-chip SRAM);
    * who computes what inside a block: each thread owns a few rows and keys of the score tile
      S_ij and a few columns of O_i, in registers (register tiling);
    * why it fits: the shared-memory budget of a tile, and why P_ij can reuse K_j's space;
    * that the kernel computes the same numbers as stage 1 (checked here), and what it costs on
      an H200 (read from the committed benchmark);
    * that stage 2 was written in five versions (src/tinyflash/forward/kernels/, v1 to v5), each
      one step from the one before and each still runnable: all are checked here, and what each step
      bought on an H200 is read from the committed measurements. (The registry also lists v6 to v10,
      the tensor-core kernels of stages 3 and 4, which take 16-bit inputs only: lessons 07 and 10.)

What changed since lesson 03: the same loop, the same names (Br, Bc, m_i, l_i, acc), but its
body runs in parallel: S_ij is split over the threads of a block, and the online-softmax state
lives in registers. Nothing of size Nq × Nk is ever written to GPU memory (HBM).

Run from the repository root:  python lessons/05_numba_kernel.py
Without a GPU it runs the kernels on numba's CUDA simulator (one Python thread per CUDA thread)
at a tiny size; with a GPU and CuPy it runs them there at a larger one.

Running time: about 15 s on 2 CPU cores without a GPU, its kernels on numba's simulator
(figures/data/cpu_runs.csv, 2026-12-05, commit 648bbe0+).
"""

# %% [0] Where the kernels run: decide before numba is imported
from lib import use_gpu_or_simulator  # imports no numba

HAS_GPU = use_gpu_or_simulator()  # a GPU if CuPy sees one, else NUMBA_ENABLE_CUDASIM=1 (before numba is imported)

import numpy as np  # noqa: E402

import tinyflash as tf  # noqa: E402
from tinyflash.core.tolerance import F32_TOL, assert_close, assert_fa_rule  # noqa: E402
from tinyflash.forward.kernels import VERSIONS, tiling  # noqa: E402
from tinyflash.hardware import H200, STATIC_SMEM_PER_BLOCK  # noqa: E402
from lib import excerpt, lesson_rng, num, record, show  # noqa: E402
from tinyflash.cost.traffic import HBMCounter  # noqa: E402

print(f"running the kernels on {'the GPU' if HAS_GPU else 'numba CUDA simulator (no GPU found)'}")
rng = lesson_rng()  # seeded, the seed printed (TINYFLASH_SEED=n for others)

# %% [1] Why: the loop of stage 1, and what each part becomes on the GPU
#
#   for each query tile Q_i (Br rows)              -> one thread block, blockIdx = (i, head)
#       m_i = -inf, l_i = 0, acc = 0               -> registers of the block's threads
#       for each key/value tile K_j, V_j (Bc rows) -> loaded into shared memory by all threads
#           S_ij = scale · Q_i K_jᵀ                -> each thread: TM rows × TN keys, in registers
#           m_new = max(m_i, rowmax(S_ij))         -> a row's max is shared through shared memory
#           P_ij = exp(S_ij - m_new)               -> registers, then shared memory (for P_ij V_j)
#           l_i, acc rescaled by exp(m_i - m_new)  -> registers
#           acc += P_ij V_j                        -> each thread: TM rows × TO columns
#       O_i = acc / l_i, lse_i = m_i + log(l_i)    -> the only writes to HBM
#
# Between the steps, cuda.syncthreads() makes the block wait until every thread has finished
# writing (or reading) shared memory; the kernels name the race at each one.
#
# The kernels live in src/tinyflash/forward/kernels/, one file per version, each registered once.
# Each one is a complete kernel; the next one changes one thing, which the table says:
print("\n" + VERSIONS.table())
DEFAULT = VERSIONS.default("cuda_attention").name  # the registry's rule: what a call that names no kernel runs
print(f"cuda_attention runs {DEFAULT} unless told otherwise (kernel='v1' ... '{DEFAULT}')")
CUDA_CORES = [name for name, v in VERSIONS.items() if v.accepts(np.float32, 16, 16)]  # v6 (lesson 07): 16-bit only
assert CUDA_CORES[-1] == DEFAULT

# %% [2] Code: the simple kernel (v1) beside stage 1's loop, then the fast kernel's phases
# The kernels are printed from their source files (lib.excerpt), so what you read here is what
# runs. First stage 1's loop over key/value tiles (forward/blocked.py), for one query tile Q_i:
show("stage 1, tinyflash.blocked_attention (NumPy): the key/value loop of one query tile",
     excerpt(tf.blocked_attention, "for j, masked in key_tile_schedule", "online_softmax_update"))
# v1, the kernel to read first: one thread per query row. The block's threads load K_j and V_j into
# shared memory together, then each thread runs stage 1's lines for its own row: scores, mask,
# row max, rescale (alpha), P·V. m_i, l_i and acc are that row's, in registers.
show("kernel v1 (forward/kernels/v1_row_per_thread.py): the same loop, one thread per row",
     excerpt(VERSIONS["v1"].code.make_kernel, "for k_start in range", "m_i = m_new"))
# v5, the fast kernel: the same loop, each phase a device function named after stage 1's steps;
# a block's threads share the work of every phase (register tiling, below).
show(f"kernel {DEFAULT} (forward/kernels/{VERSIONS[DEFAULT].module}): the loop as phases",
     excerpt(VERSIONS[DEFAULT].code.make_kernel, "for k_start in range", "pv_product("))
print("  phases: load_kv (K_j, V_j into shared memory) -> scores (S_ij = scale·Q_i K_jᵀ) -> mask -> row_max "
      "(m_new) -> rescale (alpha, l_i, acc) -> store_p (P_ij) -> pv_product (acc += P_ij V_j)")

# %% [3] The thread/tile map of the register-tiled kernels (v2 on), as launched in this run
# Symbols (tiling.py; docs/notation.md lists them too):
#   BR, BC  Br and Bc: query rows of Q_i and keys of K_j per tile     NT   threads per block
#   TM      rows of S_ij per thread       RG = BR/TM  row groups      CT = NT/RG  threads per row group
#   TN = BC/CT  keys of S_ij per thread (strided by CT)               TO4 = DV/(4·CT)  groups of 4 columns of O_i
#   D, DV   d and dv padded with zeros    QS, KS, PS  row strides (floats) of Q_i, K_j, P_ijᵀ in shared memory
d_check = 16 if not HAS_GPU else 64  # the head dim of the check in [5]
cfg = tiling.simulator_config(d_check, d_check) if not HAS_GPU else tiling.default_config(d_check, d_check)
print(f"\ntiling launched here ({'simulator' if not HAS_GPU else 'GPU'}, d = {d_check}): {cfg}")
print("  (BR, BC: rows of Q_i and keys of K_j per tile; TM: rows per thread; NT: threads per block; "
      "D, DV: d and dv padded with zeros)")
print(f"  NT = {cfg.NT} threads per block: RG = BR/TM = {cfg.RG} row groups of CT = NT/RG = {cfg.CT} threads;")
print(f"  each thread owns TM = {cfg.TM} rows × TN = BC/CT = {cfg.TN} keys of S_ij and "
      f"4·TO4 = {4 * cfg.TO4} columns of O_i")
h200 = tiling.default_config(128, 128)
print(f"  (on an H200, d = 128: BR = {h200.BR}, BC = {h200.BC}, NT = {h200.NT}, TM = {h200.TM}, TN = {h200.TN}; "
      "the simulator runs a tiny tiling because it runs one Python thread per CUDA thread)")
for c in (cfg, h200):
    assert c.RG * c.CT == c.NT and c.RG * c.TM == c.BR and c.CT * c.TN == c.BC
    assert c.TM * c.TN * c.NT == c.BR * c.BC  # the score tile is split exactly, no overlap


def owner(row: int, key: int, c: tiling.TileConfig) -> int:
    """The thread that computes S_ij[row, key]: rows in blocks of TM, keys strided by CT."""
    return (row // c.TM) * c.CT + key % c.CT


rows_shown, keys_shown = min(cfg.BR, 10), min(cfg.BC, 20)
print(f"\nWho computes S_ij[row, key] (thread numbers tid), rows 0-{rows_shown - 1} × keys 0-{keys_shown - 1}:")
print("      key " + " ".join(f"{k:3d}" for k in range(keys_shown)))
for r in range(rows_shown):
    print(f"row {r:2d}    " + " ".join(f"{owner(r, k, cfg):3d}" for k in range(keys_shown)))
# Keys are dealt out round-robin (thread ct takes keys ct, ct + CT, ...), so the CT threads of a
# row group read CT neighbouring rows of K_j at once: different shared-memory banks, no conflicts.
owners = np.array([[owner(r, k, cfg) for k in range(cfg.BC)] for r in range(cfg.BR)])  # (Br, Bc)
assert np.all(np.bincount(owners.ravel()) == cfg.TM * cfg.TN)  # every thread: exactly TM × TN scores

# %% [4] Why it fits: shared memory per block on an H200
# TileConfig.smem_layout() is the one description of a block's shared memory: the kernels take
# their offsets from it, the launch its size, and this lesson prints it.
print("\nShared memory per block on an H200 (float32 tiles; rows padded by 4 floats: QS = KS = D + 4, PS = BR + 4):")
for d in (64, 128):
    c = tiling.default_config(d, d)
    regions = c.smem_layout()
    parts = ", ".join(f"{r.name} {4 * r.floats / 1024:.1f} KiB" for r in regions)
    print(f"  d = {d:3d}, Br = {c.BR}, Bc = {c.BC}: {parts}  -> {c.smem_bytes / 1024:.1f} KiB")
    assert 4 * sum(r.floats for r in regions) == c.smem_bytes
    assert STATIC_SMEM_PER_BLOCK < c.smem_bytes <= H200.smem_per_block  # more than 48 KiB: must be asked for
# P_ij can overwrite K_j: once every thread has its scores (a barrier guarantees it), K_j is not
# read again in this tile. Above 48 KiB a kernel must ask the driver first (gpu/smem.py);
# if the driver refuses, cuda_attention warns and falls back to a tiling of at most 48 KiB:
small = tiling.small_config(128, 128)
print(f"  fallback for d = 128: {small}, {small.smem_bytes / 1024:.1f} KiB")
assert small.smem_bytes <= STATIC_SMEM_PER_BLOCK

# %% [5] Check: every kernel version against stage 1 and the float64 reference
# Sizes that no tile launched here divides, so every version meets a ragged last query tile and a
# ragged last key tile (and, causal, a diagonal that cuts through tiles).
lead, n_q, n_k = ((2,), 21, 19) if not HAS_GPU else ((2, 4), 1000, 777)
v1_tiling = VERSIONS["v1"].code.tiling(d_check, d_check)  # where this run launches v1
v1_br, v1_bc = v1_tiling.BR, v1_tiling.BC
print(f"\nq (..., Nq, d) = {(*lead, n_q, d_check)}, k and v {(*lead, n_k, d_check)}, float32; no tile launched here "
      "divides Nq or Nk:")
for name, (br, bc) in (("v1", (v1_br, v1_bc)), ("v2-v5", (cfg.BR, cfg.BC))):
    print(f"  {name} tiles Br × Bc = {br} × {bc}: Nq = {n_q} = {n_q // br}·{br} + {n_q % br}, "
          f"Nk = {n_k} = {n_k // bc}·{bc} + {n_k % bc}")
    assert n_q % br and n_k % bc  # really ragged
q, k, v = (rng.standard_normal((*lead, n, d_check)).astype(np.float32) for n in (n_q, n_k, n_k))  # (..., N, d)
for causal in (False, True):
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=causal)  # float64
    blk_o, blk_lse = tf.blocked_attention(q, k, v, causal=causal)  # stage 1, float32
    for kernel in CUDA_CORES:
        o, lse = tf.cuda_attention(q, k, v, causal=causal, kernel=kernel)  # stage 2
        e_ref = assert_close(o, ref_o, F32_TOL, f"{kernel} o vs reference")
        e_blk = assert_close(o, blk_o, F32_TOL, f"{kernel} o vs stage 1")
        assert_close(lse, ref_lse, F32_TOL, f"{kernel} lse vs reference", is_lse=True)
        print(f"  causal={causal!s:5} {kernel}: rel. error vs float64 {e_ref:.1e}, vs stage 1 {e_blk:.1e}")

# float16 in memory, float32 arithmetic: FlashAttention's rule against the naive float16 result
q16, k16, v16 = (x.astype(np.float16) for x in (q, k, v))
o16, _ = tf.cuda_attention(q16, k16, v16, causal=True)
rule = assert_fa_rule(o16, tf.naive_attention(q16, k16, v16, causal=True)[0],
                      tf.reference_attention(q16, k16, v16, causal=True)[0], np.float16, what="float16 o")
print(f"  float16, causal: {rule}")

# %% [6] Causal: key tiles above the diagonal are skipped, not computed and masked
# The kernel's loop over K_j stops at key_stop(q_end): the keys that the tile's last query may see
# (tinyflash.core.masks, the one causal rule, which the kernels compile as a device function).
# Stage 1 stops at the same place, so counting its K_j loads with the kernel's tile sizes counts
# the kernel's tiles (the H200's, Br = Bc = 64 at d = 128).
n = 1024
qc, kc, vc = (rng.standard_normal((n, 8)) for _ in range(3))  # (N, 8)
tiles = {}
for causal in (False, True):
    io = HBMCounter()
    tf.blocked_attention(qc, kc, vc, causal=causal, block_q=h200.BR, block_k=h200.BC, io=io)
    tiles[causal] = io.reads["K"] // (h200.BC * 8 * 8)  # bytes of K read / bytes of one K_j
t = n // h200.BR  # query tiles = key tiles here
print(f"\nN = {n}, {t} × {t} tiles: full attention computes {tiles[False]} score tiles, causal {tiles[True]} "
      f"({tiles[True] / tiles[False]:.0%})")
assert tiles[False] == t * t and tiles[True] == t * (t + 1) // 2  # the diagonal and below

# %% [7] Picture: what it costs on an H200 (from the committed benchmark, not measured here)
rows = record("bench_h200")
ok = [r for r in rows if r["status"] == "ok"]
STAGE = {("tinyflash", "v5"): "stage 2 (v5)", ("tinyflash", "v6"): "stage 3 (v6)"}  # the others: their impl name
print(f"\nFrom figures/data/bench_h200.csv ({ok[0]['device']}), B=1, H=32, N=16384, not causal "
      "(stage 3 is lesson 07's tensor-core kernel; naive is standard attention in CuPy, S and P in HBM):")
print(f"  {'implementation':16} {'dtype':8} {'d':>4} {'ms':>9} {'TFLOP/s':>8} {'extra MiB':>10}")
for r in ok:
    if r["n_q"] == "16384" and r["causal"] == "False":
        print(f"  {STAGE.get((r['impl'], r['variant']), r['impl']):16} {r['dtype']:8} {r['d']:>4} "
              f"{float(r['time_ms']):9.2f} {float(r['tflops']):8.1f} {int(r['peak_bytes']) / 2**20:10.1f}")
# The claim docs/results.md makes, checked on the data: from N = 4096 up, wherever naive attention ran at
# all, stage 2's kernel was faster and used a small fraction of its memory.
for r in ok:
    if (r["impl"], r["variant"]) != ("tinyflash", "v5") or int(r["n_q"]) < 4096:
        continue
    naive = [x for x in ok if x["impl"] == "naive" and all(x[c] == r[c] for c in ("dtype", "causal", "n_q", "d"))]
    for x in naive:
        assert float(r["time_ms"]) < float(x["time_ms"]), (r, x)
        assert int(r["peak_bytes"]) < int(x["peak_bytes"]) / 20, (r, x)
print("checked: from N = 4096 up the kernel beats naive attention in time and uses < 1/20 of its memory")

# And what each step of the kernel's history bought, every version checked and then timed in one
# run (python -m tinyflash.bench versions; float32, not causal, N = 16384, median TFLOP/s):
versions = [r for r in record("kernel_versions_h200") if r["dtype"] == "float32" and r["causal"] == "False"]
tflops = {(r["variant"], r["d"]): r["tflops"] if r["status"] == "ok" else None for r in versions}
print(f"\n  {'version':8} {'d = 64':>7} {'d = 128':>8}  what changed")
for name in VERSIONS:
    print(f"  {name:8} {num(tflops.get((name, '64')), '.1f', 7)} {num(tflops.get((name, '128')), '.1f', 8)}  "
          f"{VERSIONS[name].changed[:70]}")
for d in ("64", "128"):
    ladder = [float(tflops[name, d]) for name in CUDA_CORES]
    assert ladder == sorted(ladder)  # every version faster than the one before
print("checked: in float32 every version is faster than the one before it, at d = 64 and at d = 128 "
      "(v6 has no float32 number: it takes 16-bit inputs only)")
