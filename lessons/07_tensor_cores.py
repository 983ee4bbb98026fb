"""Lesson 07: the tensor cores, from Python — stage 3.

What you will learn
    * what one ``mma.sync.m16n8k16`` computes (D = A·B + C, 16 × 16 times 16 × 8, for a whole warp)
      and how numba emits it: one PTX instruction through ``numba.cuda.extending.intrinsic``
      (src/tinyflash/gpu/ptx.py);
    * which lane of the warp holds which element of A, B and C, drawn from the layout tables the
      simulator's emulation runs on (src/tinyflash/gpu/ptx_emulation.py);
    * why P_ij never leaves the registers: the accumulator layout of S_ij = Q_i K_jᵀ, packed to
      16-bit pairs, *is* the A-operand layout of P_ij V_j;
    * the double-buffered K_j, V_j pipeline (cp.async); the order in which the blocks start, longest
      first when causal; and what the tensor cores bought on an H200 over stage 2, read from the
      committed benchmark.

What changed since lesson 05 (stage 2): the same loop and the same names, kernel v6
(src/tinyflash/forward/kernels/v6_tensor_cores.py). A warp, not a thread, is now the unit that
owns rows: 16 query rows per warp (or 32, two row tiles: ``ROW_TILES``). Inputs are float16 or
bfloat16, accumulation float32.

Run from the repository root:  python lessons/07_tensor_cores.py
Without a GPU the kernel runs on numba's CUDA simulator, each warp instruction emulated in
Python at a toy size; with a GPU and CuPy, on the real tensor cores.

Running time: about 8 s on 2 CPU cores without a GPU, its kernels on numba's simulator
(figures/data/cpu_runs.csv, 2026-12-05, commit 648bbe0+).
"""

# %% [0] Where the kernels run: decide before numba is imported
from lib import use_gpu_or_simulator  # imports no numba

HAS_GPU = use_gpu_or_simulator()  # a GPU if CuPy sees one, else NUMBA_ENABLE_CUDASIM=1 (before numba is imported)

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

import tinyflash as tf  # noqa: E402
from tinyflash.core.tolerance import F32_TOL, assert_close, assert_fa_rule  # noqa: E402
from tinyflash.forward.kernels import tensor_core_tiling as tct  # noqa: E402
from tinyflash.warp_tile import RESCALE_LOG2  # noqa: E402
from tinyflash.gpu import ptx  # noqa: E402
from tinyflash.gpu.ptx_emulation import a_fragment, b_fragment, c_fragment, draw, from_bits, to_bits  # noqa: E402
from lib import lesson_rng, num, record  # noqa: E402

print(f"running on {'the GPU (real tensor cores)' if HAS_GPU else 'numba CUDA simulator (emulated instructions)'}")

# %% [1] Why: stage 2 computes every product one multiply-add per thread and instruction
#
# On CUDA cores a warp instruction does 32 multiply-adds (one per lane). The tensor cores do
# small matrix products: one mma.sync.m16n8k16 multiplies a 16 × 16 tile by a 16 × 8 tile for the
# whole warp, 16·8·16 = 2048 multiply-adds, in 16-bit inputs with a float32 accumulator:
print(f"multiply-adds per warp instruction: CUDA cores 32, one m16n8k16 mma {16 * 8 * 16} "
      f"({16 * 8 * 16 // 32}x as many)")
# numba has no tensor-core API, but it can emit any single PTX instruction as inline assembly
# (llvmlite.ir.InlineAsm inside a numba.cuda.extending.intrinsic). tinyflash/gpu/ptx.py has one
# function per instruction: mma.sync, ldmatrix(.trans), cp.async (+ commit / wait), cvt (pack).

# %% [2] Pseudocode: stage 1's loop, per warp of 16 query rows
#
#   Q_i fragments  <- ldmatrix from shared memory, once              (registers, 16-bit pairs)
#   for each K_j, V_j (Bc keys):       [tile j+1 copied by cp.async into the other buffer meanwhile]
#       S_ij = Q_i K_jᵀ                <- d/16 mma per 8 keys, B operands by ldmatrix
#       mask, row max (4 lanes share a row: 2 shuffles), rescale l_i and acc, P_ij = exp2(...)
#       P_ij packed to 16-bit pairs    <- cvt: S_ij's accumulators become P·V's A operands
#       acc += P_ij V_j                <- Bc/16 · d/8 mma, B operands by ldmatrix.trans
#   O_i = acc / l_i, lse_i = m_i + log(l_i)

# %% [3] Code: one mma.sync on a warp, against NumPy
mma = ptx.mma_m16n8k16("float16")


@cuda.jit
def one_mma(A, Bt, D):
    """A (16, 8) and Bᵀ (8, 8) words of float16 pairs; D (16, 8) float32 = A·B (C = 0)."""
    lane = cuda.threadIdx.x
    g, t = lane // 4, lane % 4  # the PTX ISA's names: the lane's group and its place in it
    d0, d1, d2, d3 = mma(A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4], Bt[g, t], Bt[g, t + 4],
                         np.float32(0), np.float32(0), np.float32(0), np.float32(0))
    D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1] = d0, d1, d2, d3


def as_words(x):
    """(rows, cols) -> (rows, cols // 2) uint32: two float16 per word, the first in the low half."""
    bits = to_bits(x, "float16").astype(np.uint32)  # (rows, cols)
    return np.ascontiguousarray(bits[:, 0::2] | (bits[:, 1::2] << 16))


rng = lesson_rng()  # seeded, the seed printed (TINYFLASH_SEED=n for others): the checks hold for any seed
A, B = rng.standard_normal((16, 16)), rng.standard_normal((16, 8))  # (16, 16), (16, 8)
D = np.zeros((16, 8), np.float32)
one_mma[1, 32](as_words(A), as_words(B.T), D)
A16, B16 = (from_bits(to_bits(x, "float16"), "float16").astype(np.float64) for x in (A, B))  # what the cores see
err = np.abs(D - A16 @ B16).max()
print(f"one mma.sync, 32 lanes: max |D - A·B| = {err:.1e} (float32 accumulation)")
assert err <= 1e-5 * np.abs(A16 @ B16).max()

# Which lane holds what (lane L, its element i; from ptx_emulation's tables, the ones the
# emulation runs on and the GPU tests confirmed on an H200). C (16 × 8, float32), first 8 rows:
print("\nC / D fragment (16 × 8), rows 0-7 (rows 8-15: the same lanes, elements 2 and 3):")
print("\n".join(draw(c_fragment, 16, 8).splitlines()[:8]))
print("\nA fragment (16 × 16), rows 0-1 and 8-9 (a0 = elements 0,1; a1 = 2,3; a2 = 4,5; a3 = 6,7):")
rows_a = draw(a_fragment, 16, 16).splitlines()
print("\n".join(rows_a[i] for i in (0, 1, 8, 9)))
print("\nB fragment (16 × 8), rows 0-3 (b0 = elements 0,1 of lanes g·4 + t: rows 2t, 2t+1 of column g):")
print("\n".join(draw(b_fragment, 16, 8).splitlines()[:4]))

# %% [4] Why P_ij stays in registers: S's accumulator layout is P·V's A-operand layout
#
# S_ij for 16 rows × 16 keys is two mma results side by side (keys 0-7 and 8-15). Lane L holds,
# from the first, (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1) and the same 8 columns on from the
# second. The A operand of P_ij V_j over those 16 keys wants exactly these elements in lane L:
for lane in range(32):
    left = c_fragment(lane)  # keys 0-7
    right = [(r, c + 8) for r, c in c_fragment(lane)]  # keys 8-15
    packed = [left[0], left[1], left[2], left[3], right[0], right[1], right[2], right[3]]  # a0, a1, a2, a3
    assert packed == a_fragment(lane)
print("\nchecked for all 32 lanes: S_ij's two accumulator tiles, packed in pairs (cvt), are P_ij's A operand")
# So each lane rounds its own P values to 16 bits (cvt.rn.f16x2.f32) and multiplies: no shared
# memory, no barrier. Stage 2 (v5) wrote P_ij to shared memory and read it back.

# %% [5] The pipeline: two buffers of K_j, V_j in shared memory, filled by cp.async
cfg = tct.default_tiling(128, causal=False)
print(f"\nd = 128 on a GPU: {cfg.WARPS} warps × {16 * cfg.ROW_TILES} rows = Br {cfg.BR}, Bc {cfg.BC}; "
      "shared memory (words):",
      cfg.smem_layout(), f"= {cfg.smem_bytes / 1024:.0f} KiB")
print(f"Q_i's operands {'read from shared memory at every key tile' if cfg.Q_IN_SMEM else 'held in registers'} "
      "(Q_IN_SMEM): 32 rows per warp need the registers for S_ij and the accumulator")
#   tile j:    compute on buffer j % 2     | cp.async K_j+1, V_j+1 -> buffer (j+1) % 2
#   wait_group 0 (this thread's copies), then one barrier: everyone's copies have landed, and no
#   warp still reads buffer j % 2, which tile j+2's copies will overwrite.
# cp.async copies HBM -> shared memory without passing through registers, so the copies of the
# next tile are in flight while the tensor cores work on this one. Rows are padded by 16 bytes,
# so the 8 rows that one ldmatrix reads fall into different shared-memory banks.
assert cfg.smem_bytes == 4 * (cfg.BR * cfg.ROW_WORDS + 4 * cfg.BC * cfg.ROW_WORDS)  # Q_i + 2 × (K_j, V_j)

# %% [5b] Lazy rescaling: most tiles need no rescale at all
#
# Each tile's softmax step rescales the running acc (d floats per row) and l_i by
# alpha = exp2(m_old - m_new) whenever the row max grows, however little. But O_i = acc / l_i and
# lse_i = m_i + log l_i are right for any reference m_i, so the kernel can keep the old m_i as long as
# P_ij = exp2(scale·S_ij - m_i) cannot overflow: it rescales only when a tile's max exceeds m_i by more
# than 2^RESCALE_LOG2 (as FlashAttention-4 does), and P_ij then stays below 2^8 = 256, in range in
# float16 and bfloat16. How often must it rescale? Stage 1's loop over 64-key tiles, counted in NumPy:
q_demo, k_demo = rng.standard_normal((256, 128)), rng.standard_normal((4096, 128))  # (rows, d), (keys, d)
S2 = (q_demo @ k_demo.T) / np.sqrt(128) * np.log2(np.e)  # (256, 4096) scaled scores, base 2
tile_max = S2.reshape(256, -1, 64).max(axis=-1)  # (256, 64 tiles)
grows_any = (tile_max[:, 1:] > np.maximum.accumulate(tile_max, axis=1)[:, :-1]).mean()  # (eager: any growth)
m_ref, lazy_rescales = tile_max[:, 0].copy(), 0  # (256,): the lazy reference after the first tile
for j in range(1, tile_max.shape[1]):
    grow = tile_max[:, j] > m_ref + RESCALE_LOG2  # (256,)
    lazy_rescales += grow.sum()
    m_ref = np.where(grow, np.maximum(m_ref, tile_max[:, j]), m_ref)
print(f"\nrandom q, k (d = 128, 4096 keys, tiles of 64): the max grows in {100 * grows_any:.1f}% of (row, tile) "
      f"after the first tile; by more than 2^{RESCALE_LOG2:.0f}: in {100 * lazy_rescales / (256 * 63):.2f}%")
lazy = {(d, c): tct.default_tiling(d, causal=c).LAZY_RESCALE for d in (64, 128) for c in (False, True)}
print(f"v6's GPU tilings rescale lazily: d = 128 {lazy[128, False]}; d = 64 causal {lazy[64, True]}, not causal "
      f"{lazy[64, False]} (measured: there it did not pay)")
# In the kernel each lane decides once per tile for its rows, so the common case is one branch, no
# multiplications of acc; the H200 sweep (figures/data/tensor_core_tiles_h200.csv) has both ways.

# %% [5c] The order of the blocks: causal, the longest first
#
# Causal, query tile i (of T) sees i + 1 tiles' worth of keys: the blocks differ up to T-fold in
# length. The GPU starts blocks in the order of their index, each on the first multiprocessor with
# room; if a head's longest block is among the last started, the others sit idle while it finishes.
# v6 orders its blocks (block_work) by groups of heads: within a group, every head's last (longest)
# tile, then every head's next-to-last, ...; the heads of a group are those whose K, V fit in
# L2_KV_BYTES together (TensorCoreTiling.head_group). A model of it: blocks as long as their keys (plus one for
# loading Q_i and writing O_i), started in order, each on the first free slot.
import heapq  # noqa: E402


def busy(lengths, slots):
    """The fraction of slots × time spent working, blocks started in the order given."""
    free = [0.0] * slots  # when each slot is next free (a heap)
    for length in lengths:
        heapq.heappush(free, heapq.heappop(free) + length)
    return sum(lengths) / (slots * max(free))


cfg_c = tct.default_tiling(128, causal=True, n_q=4096)
n_tiles, heads = 4096 // cfg_c.BR, 32
slots = 132 * 2  # the H200's 132 multiprocessors, 2 blocks each (128 threads × 255 registers, 102 KiB smem)
length = [1 + (i + 1) * cfg_c.BR / cfg_c.BC for i in range(n_tiles)]  # key tiles of query tile i, + 1
group = cfg_c.head_group(4096, heads, 1, True)
by_head = [length[i] for h in range(heads) for i in reversed(range(n_tiles))]  # one head after another
by_group = [length[i] for g in range(0, heads, group) for i in reversed(range(n_tiles)) for h in range(group)]
print(f"\ncausal, N = 4,096, H = {heads}, Br = {cfg_c.BR}: {n_tiles * heads} blocks on {slots} slots; busy "
      f"{100 * busy(by_head, slots):.0f}% one head after another, {100 * busy(by_group, slots):.0f}% in groups of "
      f"{group} heads (model)")
tiles = record("tensor_core_tiles_h200")  # the same tiling on the H200, kernel alone (python -m tinyflash.bench tensor-core-tiles)
for g in (1, group):
    name = (f"v6 warps={cfg_c.WARPS} row_tiles={cfg_c.ROW_TILES} q_in_smem={cfg_c.Q_IN_SMEM} BC={cfg_c.BC} "
            f"lazy={cfg_c.LAZY_RESCALE} group={g} kernel=grouped")
    r = next(r for r in tiles if r["variant"] == name and (r["n_q"], r["d"], r["causal"]) == ("4096", "128", "True"))
    print(f"  measured on the H200, {g} head(s) at a time: {float(r['time_ms']):.3f} ms ({r['date']})")

# %% [6] Check: the whole kernel against the float64 reference (ragged tiles, Nq != Nk, causal)
n_q, n_k, d = (20, 37, 64) if not HAS_GPU else (1000, 777, 128)
q, k, v = (rng.standard_normal((2, n, d)).astype(np.float16) for n in (n_q, n_k, n_k))  # (2, N, d)
for causal in (False, True):
    o, lse = tf.tensor_core_attention(q, k, v, causal=causal)
    ref_o, ref_lse = tf.reference_attention(q, k, v, causal=causal)
    rule = assert_fa_rule(o, tf.naive_attention(q, k, v, causal=causal)[0], ref_o, np.float16, what="v6 o")
    assert_close(lse, ref_lse, F32_TOL, "v6 lse", is_lse=True)
    print(f"q {q.shape} k {k.shape} float16, causal={causal!s:5}: {rule}")

# %% [7] Picture: what the tensor cores bought on an H200 (committed benchmark, not measured here)
rows = [r for r in record("tensor_cores_h200") if r["status"] == "ok" and r["n_q"] == "16384"]
tflops = {(r["impl"], r["variant"], r["dtype"], r["d"], r["causal"]): float(r["tflops"]) for r in rows}
print(f"\nFrom figures/data/tensor_cores_h200.csv ({rows[0]['device']}, {rows[0]['date']}), B=1, H=32, N=16384, "
      "TFLOP/s of calls queued back to back (the GPU's time per call; docs/measuring.md says how they were timed):")
print(f"  {'dtype':8} {'d':>4} {'causal':6} {'v5 (stage 2)':>12} {'v6':>7} {'SDPA flash':>10} {'cuDNN':>7} "
      f"{'v6/v5':>6} {'v6/flash':>8}")
for dtype, dd, causal in sorted({k[2:] for k in tflops}):
    v5, v6_, flash, cudnn = (tflops.get((impl, var, dtype, dd, causal)) for impl, var in
                             (("tinyflash", "v5"), ("tinyflash", "v6"), ("torch_flash", ""), ("torch_cudnn", "")))
    print(f"  {dtype:8} {dd:>4} {causal:6} {num(v5, '.1f', 12)} {v6_:7.1f} {flash:10.1f} {cudnn:7.1f} "
          f"{num(v5 and v6_ / v5, '.1f', 6)} {v6_ / flash:8.2f}")
    assert v5 is None or v6_ >= 4 * v5  # float16: at least 4x stage 2 (stage 2 takes no bfloat16: '–')
ratios = sorted(tflops["tinyflash", "v6", *key] / tflops["torch_flash", "", *key]
                for key in {k[2:] for k in tflops} if ("torch_flash", "", *key) in tflops)
print(f"v6 over FlashAttention-2 (SDPA flash) at N = 16384: {ratios[0]:.2f}x to {ratios[-1]:.2f}x")
# What is left: cuDNN, which uses Hopper's wgmma (warpgroup matrix products read straight from
# shared memory) and TMA copies, is much faster still. wgmma needs the sm_90a target and
# asynchronous warpgroup fences, beyond one inline instruction: a stage of its own.
