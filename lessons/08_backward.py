"""Lesson 08: the backward pass — gradients by recomputation, and training with them.

What you will learn
    * the gradient of softmax attention, derived in a few lines: dV = Pᵀ dO, dP = dO Vᵀ,
      dS = P ∘ (dP − D), dQ = scale · dS K, dK = scale · dSᵀ Q;
    * why D = rowsum(dP ∘ P) equals rowsum(dO ∘ O): one (N,) vector computed from what the
      forward returned, instead of a second pass over every key;
    * FlashAttention-2's backward: the forward saved only O and lse; each tile of P is
      recomputed as exp(S_ij − lse_i), one block per key tile accumulates dK_j and dV_j, and
      dQ is added up across blocks (with atomics on the GPU: what that does to determinism);
    * that the three stages (naive, blocked, numba.cuda) give the same gradients, and that a
      tiny attention layer trains the same with either;
    * what moves to the tensor cores in the backward: the tile turned on its side, so that P and dS
      feed dV and dK from the registers, while dQ still goes through shared memory and atomics.

What changed since lesson 05: the forward stages are unchanged; their output (o, lse) now feeds
a backward stage. New notation: dO, dP, dS (gradients of O, P, S) and D (one number per row).

Run from the repository root:  python lessons/08_backward.py
Without a GPU the kernel runs on numba's CUDA simulator at a tiny size; with a GPU and PyTorch,
the last cell also trains with tinyflash.torch.attention beside PyTorch's own attention.

Running time: about 20 s on 2 CPU cores without a GPU, its kernels on numba's simulator
(figures/data/cpu_runs.csv, 2026-12-05, commit 648bbe0+).
"""

# %% [0] Where the kernels run: decide before numba is imported

from lib import use_gpu_or_simulator  # imports no numba

HAS_GPU = use_gpu_or_simulator()  # a GPU if CuPy sees one, else NUMBA_ENABLE_CUDASIM=1 (before numba is imported)

import numpy as np  # noqa: E402

import tinyflash as tf  # noqa: E402
from tinyflash.core.tolerance import assert_close  # noqa: E402
from lib import lesson_seed, num, record  # noqa: E402

seed = lesson_seed()  # 2022 unless TINYFLASH_SEED says otherwise: the checks hold for any seed
print(f"random seed {seed} (set TINYFLASH_SEED=<integer> for other inputs); "
      f"kernels on {'the GPU' if HAS_GPU else 'numba CUDA simulator (no GPU found)'}")
rng = np.random.default_rng(seed)

# %% [1] Why: training needs the gradient, and the naive gradient needs P
# A training step runs the forward, then the backward. The textbook backward needs P (N × N per
# head) from the forward: a framework keeps it alive between the two passes. FlashAttention keeps
# O and lse (N·dv + N numbers) and recomputes each tile of P when the backward needs it.
N, d = 4096, 64
print(f"one head, N = {N}, d = {d}, float32: naive keeps S and P, {2 * N * N * 4 / 2**20:.0f} MiB; "
      f"FlashAttention keeps O and lse, {(N * d + N) * 4 / 2**20:.2f} MiB")

# %% [2] The gradient, derived (for one query row r; ∘ is the elementwise product)
#   O_r = Σ_k P_rk V_k                     -> dV_k = Σ_r P_rk dO_r          (dV = Pᵀ dO)
#                                             dP_rk = dO_r · V_k            (dP = dO Vᵀ)
#   P_r = softmax(S_r): ∂P_rk/∂S_rj = P_rk (δ_kj − P_rj)
#                                          -> dS_rj = P_rj (dP_rj − Σ_k P_rk dP_rk) = P_rj (dP_rj − D_r)
#   S = scale · Q Kᵀ                       -> dQ = scale · dS K,  dK = scale · dSᵀ Q
# And D_r = Σ_k P_rk dP_rk = Σ_k P_rk (dO_r · V_k) = dO_r · (Σ_k P_rk V_k) = dO_r · O_r:
# the row sums of dO ∘ O, from what the forward returned. Checked here on random inputs:
q, k, v = (rng.standard_normal((2, 9, 5)) for _ in range(3))  # (heads, N, d) each, float64
do = rng.standard_normal((2, 9, 5))  # (heads, N, dv) the gradient of the loss with respect to o
o, lse = tf.naive_attention(q, k, v, causal=True)
S = q @ np.swapaxes(k, -1, -2) / np.sqrt(5)  # (heads, N, N) the scores, causal mask below
S = np.where(tf.causal_mask(9, 9), S, -np.inf)
P = np.exp(S - lse[..., None])  # (heads, N, N) P recomputed from the saved lse: no m or l needed
dP = do @ np.swapaxes(v, -1, -2)  # (heads, N, N)
D_from_P, D_from_O = (dP * P).sum(-1), (do * o).sum(-1)  # (heads, N) each
print(f"max |rowsum(dP ∘ P) − rowsum(dO ∘ O)| = {np.abs(D_from_P - D_from_O).max():.1e}")
assert_close(D_from_O, D_from_P, 1e-12, "D two ways")

# The naive stage against central finite differences of L = Σ o ∘ dO (whose gradient in o is dO):
dq, dk, dv = tf.naive_attention_backward(q, k, v, do, causal=True)
eps = 1e-6
for name, x, g in (("q", q, dq), ("k", k, dk), ("v", v, dv)):
    idx = (1, 4, 2)
    x[idx] += eps
    up = (tf.naive_attention(q, k, v, causal=True)[0] * do).sum()
    x[idx] -= 2 * eps
    down = (tf.naive_attention(q, k, v, causal=True)[0] * do).sum()
    x[idx] += eps
    fd = (up - down) / (2 * eps)
    print(f"  d{name}{list(idx)}: backward {g[idx]:+.8f}, finite differences {fd:+.8f}")
    assert abs(g[idx] - fd) <= 1e-6 * max(1.0, abs(fd))

# %% [3] Pseudocode: FlashAttention-2's backward (stage 1, tinyflash/backward/blocked.py)
#   D = rowsum(dO ∘ O)                                    one small kernel
#   for each key tile K_j, V_j:                           one thread block
#       dK_j = dV_j = 0                                   registers
#       for each query tile Q_i that sees K_j (causal: key_stop decides which are skipped):
#           P_ij  = exp(scale · Q_i K_jᵀ − lse_i)         masked where the forward masked
#           dV_j += P_ijᵀ dO_i;   dP_ij = dO_i V_jᵀ;   dS_ij = P_ij ∘ (dP_ij − D_i)
#           dK_j += dS_ijᵀ Q_i;   dQ_i += scale · dS_ij K_j   (into HBM: added by every key tile)
#       write dK_j = scale · dK_j and dV_j                once
# Nothing of size N × N exists: the largest arrays are Br × Bc tiles.

# %% [4] The three stages compared (float32, ragged tiles, Nq != Nk, causal)
q, k, v = (x.astype(np.float32) for x in (rng.standard_normal((2, n, 8)) for n in (13, 19, 19)))  # (2, N, 8)
do = rng.standard_normal((2, 13, 8)).astype(np.float32)  # (2, Nq, dv)
o, lse = tf.naive_attention(q, k, v, causal=True)
ref = tf.reference_attention_backward(q, k, v, do, causal=True)  # float64
stages = {"naive": tf.naive_attention_backward(q, k, v, do, causal=True),
          "blocked": tf.blocked_attention_backward(q, k, v, o, lse, do, causal=True, block_q=8, block_k=8),
          "cuda": tf.cuda_attention_backward(q, k, v, o, lse, do, causal=True)}
for name, grads in stages.items():
    errors = [assert_close(g, r, 1e-4, f"{name} d{x}") for g, r, x in zip(grads, ref, "qkv")]
    print(f"  {name:8} relative error of dq, dk, dv vs float64: " + ", ".join(f"{e:.1e}" for e in errors))

# %% [5] Determinism: dK and dV are each written by one block; dQ is added by many
# Every key tile's block adds its dS_ij K_j into dQ_i with an atomic addition. On a GPU the blocks
# run at the same time and the additions land in an order that changes from run to run; float
# addition is not associative, so dq may differ in its last bits between runs (the GPU tests bound
# by how much). dk and dv never do. Two ways to make dq deterministic too: a second kernel over query
# tiles (recomputing S_ij and dP_ij: 7 matrix products instead of 5), or the key tiles taking turns at
# each query tile, key tile 0 first, counted by one integer per query tile: the tensor-core backward's
# deterministic=True (section 9 prints what the waiting costs).
again = tf.cuda_attention_backward(q, k, v, o, lse, do, causal=True)
assert np.array_equal(again[1], stages["cuda"][1]) and np.array_equal(again[2], stages["cuda"][2])
print(f"  second run: dk, dv bitwise identical; dq differs by at most "
      f"{np.abs(again[0] - stages['cuda'][0]).max():.1e}"
      + ("" if HAS_GPU else " (the simulator runs blocks in order)"))


# %% [6] Training: a tiny attention layer, its loss with the naive and with the FlashAttention stages
# x (N, 8) -> q, k, v = x Wq, x Wk, x Wv -> o = attention(q, k, v) -> loss = mean((o − y)²) / 2.
# The chain rule through the projections: dWq = xᵀ dq (and so on); plain gradient descent.
def train(forward, backward, steps, dtype, lr=2.0):
    init = np.random.default_rng(seed)  # the same data and starting weights for every run
    x, y = init.standard_normal((24, 8)).astype(dtype), init.standard_normal((24, 8)).astype(dtype)
    W = [(init.standard_normal((8, 8)) / np.sqrt(8)).astype(dtype) for _ in range(3)]  # Wq, Wk, Wv
    losses = []
    for _ in range(steps):
        q, k, v = (x @ w for w in W)  # (N, 8) each
        o, lse = forward(q, k, v)
        losses.append(float(((o - y) ** 2).mean() / 2))
        do = ((o - y) / o.size).astype(dtype)  # (N, 8) ∂loss/∂o
        grads = backward(q, k, v, o, lse, do)
        W = [w - dtype(lr) * (x.T @ g) for w, g in zip(W, grads)]
    return np.array(losses)


naive = train(lambda q, k, v: tf.naive_attention(q, k, v, causal=True),
              lambda q, k, v, o, lse, do: tf.naive_attention_backward(q, k, v, do, causal=True), 8, np.float64)
flash = train(lambda q, k, v: tf.blocked_attention(q, k, v, causal=True, block_q=8, block_k=8),
              lambda q, k, v, o, lse, do: tf.blocked_attention_backward(q, k, v, o, lse, do, causal=True,
                                                                        block_q=8, block_k=8), 8, np.float64)
kernel = train(lambda q, k, v: tf.cuda_attention(q, k, v, causal=True),
               lambda q, k, v, o, lse, do: tf.cuda_attention_backward(q, k, v, o, lse, do, causal=True),
               8 if HAS_GPU else 3, np.float32)  # on the simulator its backward is slow: 3 steps there
print(f"  step   naive (float64)   blocked (float64)   kernel (float32{'' if HAS_GPU else ', 3 steps on the simulator'})")
for step, (a, b) in enumerate(zip(naive, flash)):
    print(f"  {step:4d}   {a:.10f}      {b:.10f}        {num(kernel[step] if step < len(kernel) else None, '.7f')}")
assert naive[-1] < naive[0]  # it learns
assert_close(flash, naive, 1e-10, "blocked loss curve vs naive")
assert_close(kernel, naive[:len(kernel)], 1e-4, "kernel loss curve (float32) vs naive (float64)")

# %% [7] On a GPU with PyTorch: train with tinyflash.torch.attention, beside PyTorch's attention
try:
    import torch

    HAS_TORCH_GPU = HAS_GPU and torch.cuda.is_available()
except ImportError:
    HAS_TORCH_GPU = False
if HAS_TORCH_GPU:
    import tinyflash.torch as tft

    def train_torch(attention, steps=10):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        x, y = (torch.randn(4, 512, 64, device="cuda", generator=gen) for _ in range(2))  # (batch, N, d)
        W = [(torch.randn(64, 64, device="cuda", generator=gen) / 8).requires_grad_() for _ in range(3)]
        opt, losses = torch.optim.SGD(W, lr=20.0), []
        for _ in range(steps):
            loss = ((attention(x @ W[0], x @ W[1], x @ W[2]) - y) ** 2).mean() / 2
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return np.array(losses)

    ours = train_torch(lambda q, k, v: tft.attention(q, k, v, causal=True))
    theirs = train_torch(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
    print(f"  PyTorch, 10 steps: loss {ours[0]:.5f} -> {ours[-1]:.5f} with tinyflash, "
          f"{theirs[0]:.5f} -> {theirs[-1]:.5f} with SDPA")
    assert ours[-1] < ours[0]
    assert_close(ours, theirs, 1e-3, "tinyflash.torch loss curve vs SDPA")
else:
    print("  (no GPU with PyTorch here: the PyTorch training run is skipped)")

# %% [8] Picture: training memory against N (figures/training_memory.png, measured with tracemalloc)
# The committed data of the figure (python -m tinyflash.plots --only training_memory remakes it):
rows = record("training_memory")
print("      N   naive: kept (S, P, O)  backward peak | FlashAttention: kept (O, lse)  backward peak")
for n in sorted({int(r["n"]) for r in rows}):
    cells = {r["stage"]: r for r in rows if int(r["n"]) == n}
    naive = cells.get("naive")
    naive_cells = (f"{int(naive['kept_bytes']) / 2**20:10.1f} MiB {int(naive['backward_peak_bytes']) / 2**20:10.1f} MiB"
                   if naive else f"{'(not run)':>29}")
    flash_row = cells["flash"]
    print(f"  {n:5d}  {naive_cells}   | {int(flash_row['kept_bytes']) / 2**20:16.2f} MiB "
          f"{int(flash_row['backward_peak_bytes']) / 2**20:10.2f} MiB")
naive_rows = sorted((int(r["n"]), int(r["kept_bytes"])) for r in rows if r["stage"] == "naive")
assert naive_rows[-1][1] / naive_rows[0][1] > 0.8 * (naive_rows[-1][0] / naive_rows[0][0]) ** 2  # quadratic in N

# %% [9] On the tensor cores: the same loop, the tile turned on its side (backward kernel v2)
# Lesson 07's warp owns query rows: the rows of its mma tiles. For dK_j and dV_j a warp wants the keys as
# rows instead, so backward kernel v2 gives each warp 16 keys of the block's key tile and computes the
# transposed tiles: Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ. Then Pᵀ = exp(Sᵀ − lse) and dSᵀ = Pᵀ ∘ (dPᵀ − D) sit in
# the accumulators in exactly the layout of an A operand (lesson 07's trick), and feed dV_j += Pᵀ dO_i and
# dK_j += dSᵀ Q_i without leaving the registers. dQ_i += dS K_j needs dS by query rows: that one goes through
# shared memory (written as dSᵀ, read back transposed by ldmatrix.trans) and into HBM by atomics, as before.
# A block has 8 warps (128 keys) and query tiles of 64 rows: for dQ_i each warp takes 16 rows and half the columns.
# On this machine's kernel (a GPU, or the simulator at a tiny size), float16, d = 64, causal, with 2 query
# heads sharing one K/V head (grouped-query attention: dK and dV sum over the two):
n_q = 300 if HAS_GPU else 20
q16 = rng.standard_normal((2, n_q, 64)).astype(np.float16)
k16, v16 = (rng.standard_normal((1, n_q, 64)).astype(np.float16) for _ in range(2))
do16 = rng.standard_normal(q16.shape).astype(np.float16)
o16, lse16 = tf.naive_attention(q16, k16, v16, causal=True)
dq16, dk16, dv16 = tf.tensor_core_attention_backward(q16, k16, v16, o16, lse16, do16, causal=True)
ref = tf.reference_attention_backward(q16, np.repeat(k16, 2, 0), np.repeat(v16, 2, 0), do16, causal=True)
errors = [np.abs(g.astype(np.float64) - r).max() / np.abs(r).max()
          for g, r in zip((dq16, dk16, dv16), (ref[0], ref[1].sum(0, keepdims=True), ref[2].sum(0, keepdims=True)))]
print(f"\ntensor-core backward, float16, d = 64, N = {n_q}, 2 query heads on 1 K/V head: relative errors "
      f"dq {errors[0]:.1e}, dk {errors[1]:.1e}, dv {errors[2]:.1e} (float16 rounding of P and dS)")
assert max(errors) < 1e-2  # float16 keeps 11 bits; the tests hold every gradient to FlashAttention's rule

# Measured on an H200 against PyTorch's flash backward (FlashAttention-2), calls queued in interleaved rounds
# (figures/data/backward_tensor_cores_h200.csv; docs/results.md has the table):
rows = [r for r in record("backward_tensor_cores_h200") if r["status"] == "ok"]
atomic = [r for r in rows if r["impl"] == "tinyflash" and r["variant"] == "v2"]
print("  dtype     d  causal  B × N        tensor-core backward   SDPA flash backward   ratio")
for r in atomic:
    flash = next(x for x in rows if x["impl"] == "torch_flash" and all(
        x[c] == r[c] for c in ("dtype", "d", "causal", "batch", "n_q")))
    print(f"  {r['dtype']:8} {r['d']:>3}  {r['causal']:6}  {r['batch']} × {int(r['n_q']):6,}  "
          f"{float(r['tflops']):13.1f} TFLOP/s {float(flash['tflops']):13.1f} TFLOP/s {float(r['vs_baseline']):8.2f}×")
ratios = [float(r["vs_baseline"]) for r in atomic]
# the CUDA-core kernel computes in float32 whatever its inputs: its float32 rows at the same sizes
cuda_cores = {(r["d"], r["causal"]): float(r["tflops"]) for r in record("backward_h200")
              if r["impl"] == "tinyflash" and r["dtype"] == "float32" and r["n_q"] == "16384" and r["status"] == "ok"}
speedups = [float(r["tflops"]) / cuda_cores[r["d"], r["causal"]] for r in atomic
            if r["dtype"] == "float16" and r["n_q"] == "16384"]
print(f"  the tensor-core backward runs at {min(ratios):.2f}–{max(ratios):.2f}× FlashAttention-2's, "
      f"{min(speedups):.1f}–{max(speedups):.1f}× the CUDA-core kernel's speed (N = 16,384): well short "
      "of the tensor-core forward, which matches FlashAttention-2 (lesson 07)")
assert 0 < min(ratios) <= max(ratios) < 1.0  # what the record says: faster work is left to do
# On Hopper, backward kernel v3 (backward/kernels/v3_wgmma.py) runs the same loop on the warpgroup multiplies of
# stage 4 (lesson 10): a warpgroup's 64 keys are the rows of one wgmma, Pᵀ and dSᵀ stay in registers as its A
# operand for dV and dK, and dQ = dS K_j reads the stored dSᵀ transposed:
wgmma_rows = {tuple(r[c] for c in ("dtype", "d", "causal", "batch", "n_q")): r for r in rows
              if r["impl"] == "tinyflash" and r["variant"] == "v3"}
gains = [float(wgmma_rows[key]["tflops"]) / float(r["tflops"]) for r in atomic
         if (key := tuple(r[c] for c in ("dtype", "d", "causal", "batch", "n_q"))) in wgmma_rows]
over_flash = [float(r["vs_baseline"]) for r in wgmma_rows.values()]
print(f"  backward v3 (wgmma): {min(over_flash):.2f}–{max(over_flash):.2f}× FlashAttention-2's backward, "
      f"{min(gains):.2f}–{max(gains):.2f}× v2's speed ({len(gains)} configurations, each timed side by side)")
assert min(gains) > 1  # the warpgroup multiplies pay at every point measured
# Backward kernel v4 (backward/kernels/v4_warp_specialized.py) is v3 warp-specialised, as the forward's v9 is
# (lesson 10): a producer warpgroup loads each Q_i, dO_i by TMA into a ring of stages, the consumer warpgroups only
# multiply and meet once per query tile, for dSᵀ. With causal masking its blocks take the longest work first
# (key tile 0 sees every query, the last key tile the fewest): tile 0 of a few heads, then tile 1, and so on, so
# that the short blocks end the grid. It is what the call runs on Hopper:
v4_rows = [r for r in rows if r["impl"] == "tinyflash" and r["variant"] == "v4"]
over_v3 = [float(r["tflops"]) / float(wgmma_rows[key]["tflops"]) for r in v4_rows
           if (key := tuple(r[c] for c in ("dtype", "d", "causal", "batch", "n_q"))) in wgmma_rows]
print(f"  backward v4 (warp-specialised): {min(float(r['vs_baseline']) for r in v4_rows):.2f}–"
      f"{max(float(r['vs_baseline']) for r in v4_rows):.2f}× FlashAttention-2's backward, "
      f"{min(over_v3):.2f}–{max(over_v3):.2f}× v3's speed ({len(over_v3)} configurations, each timed side by side)")
for r in v4_rows:
    print(f"    {r['dtype']:8} d = {r['d']:>3}  causal = {r['causal']:5}  {r['batch']} × {int(r['n_q']):6,}: "
          f"{float(r['vs_baseline']):.2f}×")
assert min(over_v3) > 1  # the producer and the ring pay at every point measured
# The two row kernels around the main kernel (backward/kernels/rows.py: D = rowsum(dO ∘ O) with dQ's accumulator
# zeroed, then dQ scaled and rounded) do O(N·d) work against the main kernel's O(N²·d), yet they are not free: they
# read and write every row of O, dO and dQ's float32 accumulator once. How a warp touches memory decides their
# time. One thread per row would make each load of a warp touch 32 rows, 32 memory lines for 128 bytes of data;
# 16 threads per row make it touch 64 consecutive bytes in each of two rows. With the causal mask halving the main
# kernel, the row kernels' share of a call doubles, which is where the coalesced form shows most.
# What the tiling and the atomics are worth (figures/data/backward_tensor_core_tiles_h200.csv, float16, one run).
# The hardware counters of the first version showed L2 busy 80 % of the time and the tensor cores 22 %: its dQ
# atomics filled half of each 32-byte sector (a lane adds columns 2t and 2t + 1: two requests, each half-used),
# and a block of 64 keys read every Q_i and dO_i and added to every dQ_i once per 64 keys. One paired atomic per
# lane (red.global.add.v2.f32) fills whole sectors; 8 warps of 16 keys (Bc = 128) halve the reads and the adds.
tiles = [r for r in record("backward_tensor_core_tiles_h200") if r["status"] == "ok" and r["impl"] == "tinyflash"]
first, chosen = "warps=4 BR=64 BC=64 row_tiles=1 pairs=False", "warps=8 BR=64 BC=128 row_tiles=1 pairs=True"
print("  d  causal  B × N        4 warps, scalar atomics   8 warps (Bc = 128), paired atomics   (× SDPA flash)")
for r in (r for r in tiles if r["variant"] == "v2 " + first):
    best = next(x for x in tiles if x["variant"] == "v2 " + chosen and all(
        x[c] == r[c] for c in ("dtype", "d", "causal", "batch", "n_q")))
    print(f"  {r['d']:>3}  {r['causal']:6}  {r['batch']} × {int(r['n_q']):6,}  {float(r['vs_baseline']):20.2f}× "
          f"{float(best['vs_baseline']):30.2f}×")
    assert float(best["vs_baseline"]) > float(r["vs_baseline"])  # the default is the faster in every configuration
# deterministic=True: the key tiles add to each query tile's dQ in turn (same run, same inputs)
waits = [float(r["time_ms"]) / float(next(a for a in atomic if all(a[c] == r[c] for c in
                                                                     ("dtype", "d", "causal", "batch", "n_q")))["time_ms"])
         for r in rows if r["variant"] == "v2 deterministic"]
print(f"  deterministic dq (key tiles in turn) takes {min(waits):.2f}–{max(waits):.2f}× the atomic kernel's time")
assert min(waits) > 1  # waiting for one's turn is never free
