"""Lesson 11: attention as models write it — masks, score modifications, the block mask, packed sequences.

What you will learn
    * how one pair of plain Python functions describes the variants models use: a mask_mod
      (b, h, q_idx, kv_idx) -> keep? for sliding windows, documents and prefix-LM, and a
      score_mod (score, b, h, q_idx, kv_idx) -> score for softcapping, ALiBi and relative biases
      (PyTorch's FlexAttention has the same two functions);
    * that causal attention itself is one such mask, and gives the same bits as ``causal=True``;
    * the block mask: per query tile, the key tiles that are empty (never loaded), partial (masked
      per element) or full (no mask at all), and how much of the work each variant skips;
    * the backward through a score_mod without writing its derivative: dual numbers;
    * attention sinks (gpt-oss): a learned logit per head that takes a share of every row's softmax;
    * packing documents end to end without padding (``varlen_attention``), and why it is the
      document mask of one long sequence.

What changed since lesson 03: the same tiles and online softmax; each tile's scores go through
the score_mod, and the loop over key tiles visits only the tiles the block mask lists. The
functions are in src/tinyflash/core/mods.py, core/block_mask.py, core/variants.py, core/dual.py,
core/sinks.py; the packed layout in src/tinyflash/forward/varlen.py.

Run from the repository root:  python lessons/11_masks_and_packing.py
Everything here is NumPy. The figure figures/block_sparsity.png is drawn by
python -m tinyflash.plots --only block_sparsity.

Running time: about 4 s on 2 CPU cores without a GPU (figures/data/cpu_runs.csv, 2026-12-05, commit
6466155+).
"""

# %% [0] Inputs
import math

import numpy as np

import tinyflash as tf
from tinyflash.core.dual import Dual, dual_aware
from tinyflash.core.tolerance import assert_close
from lib import excerpt, lesson_rng, show

rng = lesson_rng()  # seeded, the seed printed (TINYFLASH_SEED=n for others): the checks hold for any seed
H, N, d = 4, 300, 16  # heads, tokens, head dim: a size where the dense N × N formula is cheap
q, k, v = (rng.standard_normal((H, N, d)) for _ in range(3))  # (H, N, d) each, float64
TOL = 1e-12  # float64 against float64: only the order of the sums differs


def dense(q, k, v, keep=None, score=None):
    """Attention from its definition, with the N × N matrices: the lesson's own reference.

    keep (H, N, N) bool: the kept pairs; score: a function of the (H, N, N) scaled scores."""
    S = (q @ np.swapaxes(k, -1, -2)) / math.sqrt(q.shape[-1])  # (H, N, N)
    if score is not None:
        S = score(S)
    if keep is not None:
        S = np.where(keep, S, -np.inf)
    m = S.max(axis=-1, keepdims=True)
    P = np.exp(S - m)
    return (P / P.sum(axis=-1, keepdims=True)) @ v, (m + np.log(P.sum(axis=-1, keepdims=True)))[..., 0]


qi, ki = np.arange(N)[:, None], np.arange(N)[None, :]  # (N, 1), (1, N): the positions of a pair

# %% [1] A mask is a function of four indices
# mask_mod(b, h, q_idx, kv_idx) -> True where query q_idx may attend key kv_idx. The causal mask:
def causal_mask(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


o_mod, lse_mod = tf.blocked_attention(q, k, v, mask_mod=causal_mask, block_q=64, block_k=64)
o_causal, lse_causal = tf.blocked_attention(q, k, v, causal=True, block_q=64, block_k=64)
assert np.array_equal(o_mod, o_causal) and np.array_equal(lse_mod, lse_causal)
print("causal as a mask_mod: the same bits as causal=True (the same tiles skipped, the same ones masked)")
# The stages call the function on a whole tile at once, with broadcasting index arrays (q_idx (rows, 1),
# kv_idx (1, cols)), so `&`, `|` and comparisons work elementwise; a function that takes no arrays (an
# `if`, `and`, math.tanh) is called element by element instead, with the same result.
show("sliding_window, a mask of two comparisons (src/tinyflash/core/variants.py)",
     excerpt(tf.sliding_window, "def mask_mod", "return (kv_idx"))

window = tf.sliding_window(32)  # each query sees itself and the 31 keys before it (Mistral's local attention)
o, lse = tf.blocked_attention(q, k, v, mask_mod=window)
o_ref, lse_ref = dense(q, k, v, keep=(ki <= qi) & (qi - ki < 32))
assert_close(o, o_ref, TOL, "sliding window o")
assert_close(lse, lse_ref, TOL, "sliding window lse", is_lse=True)

ids = np.repeat(np.arange(3), [90, 150, 60])  # 3 documents packed into one sequence of 300 tokens
docs = tf.document_mask(ids)  # keep a key only if it is in the query's document
o, _ = tf.blocked_attention(q, k, v, mask_mod=docs, causal=True)  # causal AND same document
o_ref, _ = dense(q, k, v, keep=(ki <= qi) & (ids[:, None] == ids[None, :]))
assert_close(o, o_ref, TOL, "document mask o")
print("sliding window of 32 and 3 packed documents (causal): equal to the dense formula")

# %% [2] A score modification is a function of the score and the same indices
# score_mod(score, b, h, q_idx, kv_idx) -> the score to use, on the scaled score, before the softmax.
cap = 5.0
o, _ = tf.blocked_attention(q, k, v, score_mod=tf.softcap(cap), causal=True)  # Gemma 2: cap · tanh(s / cap)
o_ref, _ = dense(q, k, v, keep=ki <= qi, score=lambda S: cap * np.tanh(S / cap))
assert_close(o, o_ref, TOL, "softcap o")
slopes = 2.0 ** (-8.0 * np.arange(1, H + 1) / H)  # ALiBi's slopes for H = 4 heads: 1/4, 1/16, 1/64, 1/256
o, _ = tf.blocked_attention(q, k, v, score_mod=tf.alibi(H), causal=True)  # BLOOM, MPT: a bias by distance
o_ref, _ = dense(q, k, v, keep=ki <= qi, score=lambda S: S + slopes[:, None, None] * (ki - qi))
assert_close(o, o_ref, TOL, "ALiBi o")
print(f"softcap {cap} and ALiBi (slopes {', '.join(f'1/{1 / s:.0f}' for s in slopes)}): equal to the dense formula")

# %% [3] The block mask: which tiles to compute
# A tile of Br × Bc pairs is empty (every pair masked: skipped, K_j and V_j never loaded), full
# (every pair kept: no per-element mask) or partial (the mask evaluated per element).
# create_block_mask classifies every tile once, before the attention runs.
bm = tf.create_block_mask(window, 1, 1, 512, 512, block_q=64, block_k=64)
picture = {0: " .", 1: " ░", 2: " █"}
print("\nthe block mask of a sliding window of 32 keys at N = 512, tiles of 64 (░ partial, █ full, . empty):")
for row in bm.to_dense()[0, 0]:
    print("   " + "".join(picture[int(kind)] for kind in row))
# Every row of tiles here has the diagonal tile (partial) and the one before it, which the window
# reaches into (partial): a window narrower than a tile leaves no full tile.
print(f"skipped: {bm.sparsity():.1%} of the tiles")

# How much each variant of FlexAttention's comparison skips at its size (N = 16,384, tiles of 128):
N_BIG, BLOCK = 16_384, 128
big_ids = np.repeat(np.arange(8), N_BIG // 8)  # 8 packed documents
variants = {"causal (with softcap, ALiBi)": (None, True), "sliding window 1,024": (tf.sliding_window(1024), True),
            "8 documents, causal": (tf.document_mask(big_ids), True), "prefix-LM, prefix 4,096": (tf.prefix_lm(4096), False)}
print(f"\nat N = {N_BIG:,}, tiles of {BLOCK} × {BLOCK}: the work left, against dense attention")
print("  variant                        empty   partial  full")
work = {}
for name, (mask_mod, causal) in variants.items():
    kinds = np.bincount(tf.create_block_mask(mask_mod, 1, 1, N_BIG, N_BIG, block_q=BLOCK, block_k=BLOCK,
                                             causal=causal).to_dense().ravel(), minlength=3) / (N_BIG // BLOCK) ** 2
    work[name] = kinds[1] + kinds[2]  # the tiles computed
    print(f"  {name:<29} {kinds[0]:6.1%}  {kinds[1]:6.1%}  {kinds[2]:6.1%}")
assert abs(work["causal (with softcap, ALiBi)"] - (0.5 + 0.5 / (N_BIG // BLOCK))) < 1e-12  # half, plus the diagonal
assert work["sliding window 1,024"] < 0.07 and work["8 documents, causal"] < 0.07
# A sliding window of 1,024 keys or 8 documents leaves under 7% of the tiles: a kernel that skips the
# empty tiles does about 1/15 of dense attention's work, where a kernel that computes every score
# and masks afterwards (attention with an explicit mask) does all of it.

# Stage 1 really never loads an empty tile: count the bytes of K read (an HBMCounter, lesson 06).
reads = {}
for name, kwargs in {"dense": {}, "window": {"mask_mod": window}}.items():
    io = tf.HBMCounter()
    tf.blocked_attention(q, k, v, block_q=64, block_k=64, io=io, **kwargs)
    reads[name] = io.reads["K"]
print(f"\nK bytes read by stage 1 at N = {N}: dense {reads['dense']:,}, sliding window {reads['window']:,}")
assert reads["window"] < reads["dense"] / 2

# %% [4] The backward through a score_mod: dual numbers
# The gradient needs d score_mod / d score at every score (dS is multiplied by it before dQ and dK).
# Rather than ask for a second function, the stages call the same one with a dual number a + b·ε
# (ε² = 0): every operation carries the value and its derivative, so f(Dual(s, 1)) = Dual(f(s), f'(s)).
softcap = tf.softcap(cap)
s = 3.0
result = dual_aware(softcap)(Dual(s, 1.0), 0, 0, 0, 0)  # math.tanh answered by its dual-aware twin
print(f"\nsoftcap at s = {s}: value {float(result.val):.6f}, derivative {float(result.der):.6f} "
      f"(1 - tanh²(s/cap) = {1 - math.tanh(s / cap) ** 2:.6f})")
assert abs(result.der - (1 - math.tanh(s / cap) ** 2)) < 1e-15

qs, ks, vs = (x[:, :40] for x in (q, k, v))  # (H, 40, d): a small size for finite differences
o, lse = tf.blocked_attention(qs, ks, vs, score_mod=softcap, causal=True, block_q=16, block_k=16)
do = rng.standard_normal(o.shape)
dq, dk, dv = tf.blocked_attention_backward(qs, ks, vs, o, lse, do, score_mod=softcap, causal=True,
                                           block_q=16, block_k=16)
step, pick = 1e-6, (1, 7, 3)  # one entry of q
bumped = qs.copy()
bumped[pick] += step
loss = lambda x: float((tf.naive_attention(x, ks, vs, score_mod=softcap, causal=True)[0] * do).sum())  # noqa: E731
numeric = (loss(bumped) - loss(qs)) / step
print(f"dL/dq{list(pick)}: backward {dq[pick]:.6f}, finite difference {numeric:.6f}")
assert abs(dq[pick] - numeric) < 1e-4 * max(1.0, abs(numeric))

# %% [5] Attention sinks: a logit without a value
# gpt-oss gives each head a learned logit that joins every row's softmax: the row's weights over its
# keys then sum to less than 1, so a head can attend to "nothing" when no key matters.
sinks = np.array([2.0, 0.0, -1.0, -30.0])  # (H,) one per head
o_sink, lse_sink = tf.blocked_attention(q, k, v, causal=True, sinks=sinks)
o_plain, lse_plain = tf.blocked_attention(q, k, v, causal=True)
kept = np.exp(lse_plain - lse_sink)  # (H, N): the share of the softmax the keys keep
assert_close(o_sink, o_plain * kept[..., None], TOL, "sinks scale o by the keys' share")
print(f"\nsinks {sinks.tolist()}: the keys keep on average {', '.join(f'{x:.0%}' for x in kept.mean(axis=1))} "
      "of each row's softmax")

# %% [6] Packing documents without padding
# A batch of documents of different lengths, padded to the longest, computes scores for the padding.
# Packed end to end (FlashAttention's "varlen" layout), with cumulative lengths, it computes none:
lengths = np.array([90, 150, 60])  # the 3 documents of [1]
cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)  # [0, 90, 240, 300]
packed = [x.swapaxes(0, 1) for x in (q, k, v)]  # (300, H, d): token-major, the documents one after another
o_packed, lse_packed = tf.varlen_attention(*packed, cu, cu, causal=True)
o_docs, lse_docs = tf.blocked_attention(q, k, v, mask_mod=docs, causal=True)
assert_close(o_packed.swapaxes(0, 1), o_docs, TOL, "varlen == document mask")
assert_close(lse_packed, lse_docs, TOL, "varlen lse == document mask", is_lse=True)
pairs_padded = len(lengths) * lengths.max() ** 2 // 2  # causal pairs of a batch padded to 150 tokens
pairs_packed = int((lengths**2).sum()) // 2  # causal pairs of the documents themselves
print(f"\n3 documents of {lengths.tolist()} tokens: packed attention equals the document mask; causal score pairs "
      f"~{pairs_packed:,} packed against ~{pairs_padded:,} padded to the longest ({pairs_padded / pairs_packed:.2f}×)")
