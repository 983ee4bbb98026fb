"""What every split kernel shares: the run of keys of a split, where a key's row is, and what its host needs.

Both split kernels (``cuda_cores.py``, ``tensor_cores.py``) cut a sequence's keys the same way
(:func:`split_keys`) and find a key's K and V rows the same way, in a contiguous cache or through a
paged cache's block table (:func:`key_row_offset`; ``tinyflash.decode.paged``): written once here,
compiled into each. And each says the same things to the host wrapper (:class:`SplitKernel`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, NamedTuple

from numba import cuda, uint64

from ...gpu.runtime import u

ONE = u(1)
NO_PAGE = u(2**64 - 1)  # "no block-table entry read yet"


@lru_cache(maxsize=None)
def key_row_offset(page_size: int):
    """The device function ``row_offset(TABLE, b, bkv, kv_head, key, n_k, h_kv, max_pages, d, seen)``:
    where key ``key`` of K/V head ``kv_head`` of sequence ``b`` (``bkv`` = b·H_kv + kv_head) starts in
    the flat K (and V) array, in elements. ``page_size`` 0: a contiguous cache (B, H_kv, Nk, d); else
    pages of ``page_size`` tokens (num_pages, H_kv, page_size, d) found through the block table, read
    once per page: ``seen`` = [the last page looked up, its page in the pool] (start it at NO_PAGE)."""
    PAGE = u(max(page_size, 1))

    @cuda.jit(device=True, inline="always")
    def row_offset(TABLE, b, bkv, kv_head, key, n_k, h_kv, max_pages, d, seen):
        if page_size == 0:  # contiguous
            return (bkv * n_k + key) * d
        page = key // PAGE
        if page != seen[0]:
            seen[0], seen[1] = page, uint64(TABLE[b * max_pages + page])  # through the block table
        return ((seen[1] * h_kv + kv_head) * PAGE + key % PAGE) * d

    return row_offset


@cuda.jit(device=True, inline="always")
def split_keys(seq_len, split, n_splits, tile):
    """(k_begin, k_end, n_tiles): split ``split``'s keys of a sequence of ``seq_len`` keys cut into
    ``n_splits`` equal runs, each a whole number of tiles of ``tile`` keys (the last runs may be
    short, or empty); uint64 arguments."""
    chunk = (seq_len + n_splits - ONE) // n_splits  # keys per split, rounded up to whole tiles
    chunk = (chunk + tile - ONE) // tile * tile
    k_begin = min(split * chunk, seq_len)
    k_end = min(k_begin + chunk, seq_len)
    return k_begin, k_end, (k_end - k_begin + tile - ONE) // tile


class SplitKernel(NamedTuple):
    """A split kernel chosen for one call: what the host wrapper (``decode/cuda.py``) needs to launch it."""

    build: Callable  # build(rows per block) -> (kernel, bytes of shared memory)
    threads: int  # per block
    max_rows: int  # packed query rows per block at most
    blocks_per_sm: int  # resident at once: the split rule counts them
    signature: tuple  # its argument types, for the driver's launch
    word_args: tuple  # the arrays it reads as uint32 words (pairs of 16-bit values, or whole 16-byte pieces)
    merged: bool = False  # it merges the splits' partials itself (O, LSE, ARRIVED): no combine kernel after it
