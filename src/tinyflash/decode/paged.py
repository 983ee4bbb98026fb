"""A paged KV cache, as vLLM and FlashInfer keep it: fixed-size pages in one pool, a block table.

A server decodes many sequences at once, of different lengths that grow by one token a step.
Storing each one's cache as one contiguous (H_kv, Nk, d) array means reserving the longest
length for all of them, or copying when one grows. A paged cache stores keys in pages of
``page_size`` tokens, taken from one shared pool as needed:

    k_pages       (num_pages, H_kv, page_size, d)   the pool of K pages (v_pages: the same for V)
    block_table   (B, max_pages) int32              page p of sequence b is k_pages[block_table[b, p]]
    seq_lens      (B,) int32                        tokens held by each sequence

so key j of sequence b lives at k_pages[block_table[b, j // page_size], :, j % page_size]. A
sequence wastes at most one partly filled page; pages need not be in order or adjacent.

:func:`paged_attention` is the NumPy version: it gathers each sequence's pages into a contiguous
array and calls :func:`~tinyflash.decode.split_kv.split_kv_attention`. The split kernels
(``decode/kernels/``) never gather: it reads every key through the block table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.checks import check_positive_int
from .split_kv import split_kv_attention

PAGE_SIZE = 16  # tokens per page (vLLM's default block size)


@dataclass(frozen=True)
class PagedKVCache:
    """One layer's paged K and V for a batch of sequences (shapes in the module docstring)."""

    k_pages: np.ndarray  # (num_pages, H_kv, page_size, d)
    v_pages: np.ndarray  # (num_pages, H_kv, page_size, dv)
    block_table: np.ndarray  # (B, max_pages) int32; entries past a sequence's pages are unused
    seq_lens: np.ndarray  # (B,) int32

    @property
    def page_size(self) -> int:
        return self.k_pages.shape[2]

    def gather(self, b: int):
        """Sequence b's K (H_kv, len, d) and V (H_kv, len, dv) as contiguous arrays (a copy)."""
        n = int(self.seq_lens[b])
        pages = self.block_table[b, :-(-n // self.page_size)]  # (pages,) its page numbers, in order
        K = np.concatenate(list(self.k_pages[pages]), axis=1)[:, :n]  # (H_kv, len, d)
        V = np.concatenate(list(self.v_pages[pages]), axis=1)[:, :n]  # (H_kv, len, dv)
        return K, V


def check_cache(cache: PagedKVCache, batch: int) -> None:
    """Refuse, with a ValueError naming the sequence and the entry, a cache that a kernel would read outside
    its pool: pages of four dims with one shape for K and V (but dv), a block table (B, max_pages) and B
    lengths, integers; every length in [0, max_pages · page_size]; every block-table entry a sequence uses
    (its first ceil(len / page_size)) a page of the pool. The table and the lengths are read on the host (a
    copy, for a cache on the GPU: small arrays, one synchronisation)."""
    k_pages, v_pages, table, lens = cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens
    if len(k_pages.shape) != 4 or len(v_pages.shape) != 4 or tuple(k_pages.shape[:3]) != tuple(v_pages.shape[:3]):
        raise ValueError(f"k_pages and v_pages must be (num_pages, H_kv, page_size, d) and (..., dv) of one pool; got "
                         f"{tuple(k_pages.shape)} and {tuple(v_pages.shape)}")
    if len(table.shape) != 2 or tuple(lens.shape) != (table.shape[0],) or table.shape[0] != batch:
        raise ValueError(f"block_table must be (B, max_pages) and seq_lens (B,) with B = {batch} sequences (q's "
                         f"batch); got {tuple(table.shape)} and {tuple(lens.shape)}")
    if not (isinstance(table, np.ndarray) and isinstance(lens, np.ndarray)):  # on the GPU: numba is imported by now
        from ..gpu.arrays import host_copy

        table, lens = host_copy(table), host_copy(lens)
    for name, x in (("block_table", table), ("seq_lens", lens)):
        if x.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integers; got dtype {x.dtype}")
    num_pages, page_size = k_pages.shape[0], k_pages.shape[2]
    capacity = table.shape[1] * page_size
    for b, n in enumerate(lens.tolist()):
        if not 0 <= n <= capacity:
            raise ValueError(f"seq_lens[{b}] = {n} is outside [0, {capacity}] (the block table's {table.shape[1]} "
                             f"pages of {page_size} tokens)")
        used = table[b, :-(-n // page_size)]
        bad = np.flatnonzero((used < 0) | (used >= num_pages))
        if bad.size:
            j = int(bad[0])
            raise ValueError(f"block_table[{b}, {j}] = {int(used[j])} is not a page of the pool [0, {num_pages}) "
                             f"(sequence {b} holds {n} tokens: its first {used.size} entries are read)")


def to_paged(k, v, seq_lens, page_size: int = PAGE_SIZE, rng=None, spare_pages: int = 3) -> PagedKVCache:
    """Copy a contiguous cache k (B, H_kv, Nk, d), v (B, H_kv, Nk, dv) into pages, sequence b
    keeping its first seq_lens[b] tokens. Pages are handed out in a random order (``rng``, a NumPy
    Generator; None: in order), with ``spare_pages`` unused pages in the pool, as a server's
    pool would look after sequences came and went."""
    page_size = check_positive_int(page_size, "page_size")
    seq_lens = np.asarray(seq_lens, dtype=np.int32)  # (B,)
    B, h_kv, n_k, d = k.shape
    if seq_lens.shape != (B,) or seq_lens.min() < 1 or seq_lens.max() > n_k:
        raise ValueError(f"seq_lens must hold B={B} lengths in [1, {n_k}]; got {seq_lens.tolist()}")
    n_pages = -(-seq_lens // page_size)  # (B,) pages per sequence
    total = int(n_pages.sum()) + spare_pages
    order = np.arange(total) if rng is None else rng.permutation(total)  # (total,) pool pages, handed out
    k_pages = np.zeros((total, h_kv, page_size, d), dtype=k.dtype)  # (num_pages, H_kv, page_size, d)
    v_pages = np.zeros((total, h_kv, page_size, v.shape[-1]), dtype=v.dtype)  # (num_pages, H_kv, page_size, dv)
    table = np.zeros((B, int(n_pages.max())), dtype=np.int32)  # (B, max_pages)
    used = 0
    for b in range(B):
        for p in range(n_pages[b]):
            page, start = order[used], p * page_size
            stop = min(start + page_size, int(seq_lens[b]))
            k_pages[page, :, :stop - start] = k[b, :, start:stop]
            v_pages[page, :, :stop - start] = v[b, :, start:stop]
            table[b, p], used = page, used + 1
    return PagedKVCache(k_pages, v_pages, table, seq_lens)


def pages_from_contiguous(k, v, page_size: int, perm) -> PagedKVCache:
    """A paged copy of a cache in which every sequence holds all Nk tokens, built with array
    operations only (NumPy or CuPy: for the benchmark, on the GPU). k (B, H_kv, Nk, d), v alike,
    Nk a multiple of ``page_size``; ``perm`` (B · Nk / page_size,) integer array: the pool page
    that takes each sequence's pages, in order (a permutation, so that pages land anywhere)."""
    B, h_kv, n_k, _ = k.shape  # (B, H_kv, Nk, d)
    if n_k % page_size:
        raise ValueError(f"Nk must be a multiple of page_size={page_size}; got k {k.shape}")
    per_seq = n_k // page_size  # pages per sequence

    def pool(x):
        c = x.shape[-1]
        pages = x.reshape(B, h_kv, per_seq, page_size, c).transpose(0, 2, 1, 3, 4)  # (B, pages, H_kv, P, c)
        pages = pages.reshape(B * per_seq, h_kv, page_size, c)  # (B·pages, H_kv, P, c), a copy
        out = pages.copy()  # (num_pages, H_kv, P, c) the pool
        out[perm] = pages  # page i of the batch goes to pool page perm[i]
        return out

    table = perm.reshape(B, per_seq).astype("int32")  # (B, pages): sequence b's page p is pool page perm[b·pages + p]
    lens = table[:, 0] * 0 + n_k  # (B,) int32, every sequence full (in the library of perm)
    return PagedKVCache(pool(k), pool(v), table, lens)


def paged_attention(q, cache: PagedKVCache, *, num_splits: int | None = None, causal: bool = False,
                    scale: float | None = None):
    """Decode attention on a paged cache, in NumPy. Returns ``(o, lse)``.

    q (B, H, Nq, d); sequence b attends its own seq_lens[b] keys (with ``causal``, its Nq queries
    are its last Nq tokens). Each sequence is gathered and computed by
    :func:`~tinyflash.decode.split_kv.split_kv_attention`: the reference for the paged kernel.
    """
    if q.ndim != 4 or q.shape[0] != cache.block_table.shape[0]:
        raise ValueError(f"q must have shape (B, H, Nq, d) with B = {cache.block_table.shape[0]} sequences; "
                         f"got {q.shape}")
    check_cache(cache, q.shape[0])
    results = [split_kv_attention(q[b], *cache.gather(b), num_splits=num_splits, causal=causal, scale=scale)
               for b in range(q.shape[0])]
    return np.stack([o for o, _ in results]), np.stack([lse for _, lse in results])  # (B, H, Nq, dv), (B, H, Nq)
