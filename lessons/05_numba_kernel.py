"""Lesson 05: the blocked loop as a numba.cuda kernel, with tiles in shared memory.

What you will learn
    * how stage 1's loops map onto a GPU: one thread block per (query tile Q_i, head), a loop
      over key/value tiles K_j, V_j that the block loads into shared memory (on-chip SRAM);
    * who computes what inside a block: each thread owns a few rows and keys of the score tile
      S_ij and a few columns of O_i, in registers (register tiling);
    * why it fits: the shared-memory budget of a tile, and why P_ij can reuse K_j's space;
    * that the kernel computes the same numbers as stage 1 (checked here), and what it costs on
      an H200 (read from the committed benchmark);
    * that it was written in five versions (src/tinyflash/forward/kernels/, v1 to v5), each one
      step from the one before and each still runnable: all are checked here, and what each step
      bought on an H200 is read from the committed measurements.

What changed since lesson 03: the same loop, the same names (Br, Bc, m_i, l_i, acc), but its
body runs in parallel: S_ij is split over the threads of a block, and the online-softmax state
lives in registers. Nothing of size Nq × Nk is ever written to GPU memory (HBM).

Run from the repository root:  python lessons/05_numba_kernel.py
Without a GPU it runs the kernels on numba's CUDA simulator (one Python thread per CUDA thread)
at a tiny size; with a GPU and CuPy it runs them there at a larger one.
"""

# %% [0] Where the kernels run: decide before numba is imported
import os
import sys
from pathlib import Path

try:
    import cupy

    HAS_GPU = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "0" and bool(cupy.cuda.is_available())
except Exception:  # no CuPy or no GPU
    HAS_GPU = False
if not HAS_GPU:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import numpy as np  # noqa: E402

import tinyflash as tf  # noqa: E402
from tinyflash.core.tolerance import F32_TOL, assert_close, assert_fa_rule  # noqa: E402
from tinyflash.forward.kernels import LATEST, VERSIONS, tiling, version_table  # noqa: E402
from tinyflash.gpu.smem import MAX_SMEM_PER_BLOCK, STATIC_SMEM_LIMIT  # noqa: E402
from tinyflash.measure.harness import read_csv  # noqa: E402
from tinyflash.measure.random_inputs import lesson_rng  # noqa: E402
from tinyflash.measure.report import versions_table  # noqa: E402
from tinyflash.measure.traffic import HBMCounter  # noqa: E402

print(f"running the kernels on {'the GPU' if HAS_GPU else 'numba CUDA simulator (no GPU found)'}")

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
print("\n" + version_table())
print(f"cuda_attention runs {LATEST} unless told otherwise (kernel='v1' ... '{LATEST}')")
assert list(VERSIONS)[-1] == LATEST

# %% [2] The thread/tile map of the register-tiled kernels (v2 on), as they run on an H200 for d = 128
cfg = tiling.default_config(128, 128)
print(f"\n{cfg}: {cfg.NT} threads per block; {cfg.RG} row groups of {cfg.CT} threads;")
print(f"each thread owns TM = {cfg.TM} rows, TN = {cfg.TN} keys of S_ij and {4 * cfg.TO4} columns of O_i")
assert cfg.RG * cfg.CT == cfg.NT and cfg.RG * cfg.TM == cfg.BR and cfg.CT * cfg.TN == cfg.BC
assert cfg.TM * cfg.TN * cfg.NT == cfg.BR * cfg.BC  # the score tile is split exactly, no overlap


def owner(row: int, key: int, c: tiling.TileConfig) -> int:
    """The thread that computes S_ij[row, key]: rows in blocks of TM, keys strided by CT."""
    return (row // c.TM) * c.CT + key % c.CT


print("\nWho computes S_ij[row, key] (thread numbers), top-left 10 rows × 20 keys:")
print("      key " + " ".join(f"{k:3d}" for k in range(20)))
for r in range(10):
    print(f"row {r:2d}    " + " ".join(f"{owner(r, k, cfg):3d}" for k in range(20)))
# Keys are dealt out round-robin (thread ct takes keys ct, ct + CT, ...), so the 16 threads of a
# row group read 16 neighbouring rows of K_j at once: different shared-memory banks, no conflicts.
owners = np.array([[owner(r, k, cfg) for k in range(cfg.BC)] for r in range(cfg.BR)])  # (Br, Bc)
assert np.all(np.bincount(owners.ravel()) == cfg.TM * cfg.TN)  # every thread: exactly TM × TN scores

# %% [3] Why it fits: shared memory per block
# TileConfig.smem_layout() is the one description of a block's shared memory: the kernels take
# their offsets from it, the launch its size, and this lesson prints it.
print("\nShared memory per block (float32 tiles, rows padded by 4 floats):")
for d in (64, 128):
    c = tiling.default_config(d, d)
    regions = c.smem_layout()
    print(f"  d = {d:3d}, Br = {c.BR}, Bc = {c.BC}: " + ", ".join(f"{r.name} {4 * r.floats / 1024:.1f} KiB"
                                                               for r in regions) + f"  -> {c.smem_bytes / 1024:.1f} KiB")
    assert 4 * sum(r.floats for r in regions) == c.smem_bytes
    assert STATIC_SMEM_LIMIT < c.smem_bytes <= MAX_SMEM_PER_BLOCK  # more than 48 KiB: must be asked for
# P_ij can overwrite K_j: once every thread has its scores (a barrier guarantees it), K_j is not
# read again in this tile. Above 48 KiB a kernel must ask the driver first (gpu/smem.py);
# if the driver refuses, cuda_attention warns and falls back to a tiling of at most 48 KiB:
small = tiling.small_config(128, 128)
print(f"  fallback for d = 128: {small}, {small.smem_bytes / 1024:.1f} KiB")
assert small.smem_bytes <= STATIC_SMEM_LIMIT

# %% [4] Check: every kernel version against stage 1 and the float64 reference
rng = lesson_rng()  # seeded, the seed printed (TINYFLASH_SEED=n for others)
lead, n_q, n_k, d = ((2,), 40, 37, 16) if not HAS_GPU else ((2, 4), 1000, 777, 64)
q, k, v = (rng.standard_normal((*lead, n, d)).astype(np.float32) for n in (n_q, n_k, n_k))  # (..., N, d)
print(f"\nq {q.shape}, k {k.shape}, v {v.shape}, float32 (N not a multiple of any tile)")
for causal in (False, True):
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=causal)  # float64
    blk_o, blk_lse = tf.blocked_attention(q, k, v, causal=causal)  # stage 1, float32
    for kernel in VERSIONS:
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

# %% [5] Causal: key tiles above the diagonal are skipped, not computed and masked
# The kernel's loop over K_j stops at key_stop(q_end): the keys that the tile's last query may see
# (tinyflash.core.masks, the one causal rule, which the kernels compile as a device function).
# Stage 1 stops at the same place, so counting its K_j loads with the kernel's tile sizes counts
# the kernel's tiles.
n = 1024
qc, kc, vc = (rng.standard_normal((n, 8)) for _ in range(3))  # (N, 8)
tiles = {}
for causal in (False, True):
    io = HBMCounter()
    tf.blocked_attention(qc, kc, vc, causal=causal, block_q=cfg.BR, block_k=cfg.BC, io=io)
    tiles[causal] = io.reads["K"] // (cfg.BC * 8 * 8)  # bytes of K read / bytes of one K_j
t = n // cfg.BR  # query tiles = key tiles here
print(f"\nN = {n}, {t} × {t} tiles: full attention computes {tiles[False]} score tiles, causal {tiles[True]} "
      f"({tiles[True] / tiles[False]:.0%})")
assert tiles[False] == t * t and tiles[True] == t * (t + 1) // 2  # the diagonal and below

# %% [6] Picture: what it costs on an H200 (from the committed benchmark, not measured here)
csv_path = Path(__file__).resolve().parent.parent / "figures" / "data" / "bench_h200.csv"
rows = read_csv(csv_path)
ok = [r for r in rows if r["status"] == "ok"]
print(f"\nFrom {csv_path.name} ({ok[0]['device']}, {ok[0]['date']}), B=1, H=32, N=16384, not causal:")
print(f"  {'impl':16} {'dtype':8} {'d':>4} {'ms':>9} {'TFLOP/s':>8} {'extra MiB':>10}")
for r in ok:
    if r["n"] == "16384" and r["causal"] == "False":
        print(f"  {r['impl']:16} {r['dtype']:8} {r['d']:>4} {float(r['time_ms']):9.2f} {float(r['tflops']):8.1f} "
              f"{int(r['peak_bytes']) / 2**20:10.1f}")
# The claim the README makes, checked on the data: from N = 4096 up, wherever naive CuPy attention
# ran at all, the kernel was faster and used a small fraction of its memory.
for r in ok:
    if r["impl"] != "tinyflash" or int(r["n"]) < 4096:
        continue
    naive = [x for x in ok if x["impl"] == "cupy_naive" and all(x[c] == r[c] for c in ("dtype", "causal", "n", "d"))]
    for x in naive:
        assert float(r["time_ms"]) < float(x["time_ms"]), (r, x)
        assert int(r["peak_bytes"]) < int(x["peak_bytes"]) / 20, (r, x)
print("checked: from N = 4096 up the kernel beats naive CuPy in time and uses < 1/20 of its memory")

# And what each step of the kernel's history bought, every version checked and then timed in one
# run (python -m tinyflash.bench versions; float32, not causal, N = 16384, median TFLOP/s):
versions = [r for r in read_csv(csv_path.parent / "kernel_versions_h200.csv")
            if r["status"] == "ok" and r["dtype"] == "float32" and r["causal"] == "False"]
print("\n" + versions_table(versions))
for d in ("64", "128"):
    tflops = [float(r["tflops"]) for name in VERSIONS for r in versions if r["variant"] == name and r["d"] == d]
    assert len(tflops) == len(VERSIONS) and tflops == sorted(tflops)  # every version faster than the one before
print("checked: in float32 every version is faster than the one before it, at d = 64 and at d = 128")
sys.exit(0)
