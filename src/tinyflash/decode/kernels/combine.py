"""The combine kernel: O and lse from the splits' partials (O_s, lse_s), exactly.

A finished partial is the online-softmax state (lse_s, 1, O_s), so the merge is a softmax over the
splits: lse = log Σ_s exp(lse_s), O = Σ_s exp(lse_s − lse) · O_s. All lse_s are known when the kernel
starts, so it takes the two passes of a plain softmax rather than the online merge of
:func:`tinyflash.decode.split_kv.combine`:

    m   = max_s lse_s                       <- a block-wide reduction over the splits
    l   = Σ_s exp(lse_s − m)                <- another
    w_s = exp(lse_s − m)                    <- THREADS splits at a time, in shared memory
    O   = Σ_s w_s · O_s / l,   lse = m + log l

Why: in the online merge each split's step waits for the previous one's rescaling, so a thread adds
one O_s per memory latency (about 0.4 µs a split on an H200). With the weights known first, the terms
of Σ_s w_s · O_s are independent and each thread keeps UNROLL loads in flight.

One block per (packed row, sequence and K/V head, THREADS columns); one thread per column. Base 2
inside, as in every kernel (exp2, log2).

:func:`make_merge` is the same merge for one warp, called by the tensor-core split kernel's last block of a row
set when it runs with ``merge=True`` (``tensor_cores.py``): no second launch. It is written for a few splits (at
most MAX_MERGED_SPLITS): every load of every split is issued before the first sum, so that the warp waits for
memory about twice, once for the lse_s and once for the O_s.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, types, uint64

from ...core.online_softmax import LN2, LOG2E
from ...gpu import elements, ptx
from ...gpu.driver_launch import flat_type
from ...gpu.runtime import u
from ...warp_tile import WARP

NEG_INF = float32(-np.inf)
ZERO = u(0)
THREADS = 128  # threads per block: a power of two (the tree reductions halve it)
UNROLL = 8  # terms of Σ_s w_s · O_s whose loads a thread issues before it adds them
MAX_MERGED_SPLITS = 8  # make_merge: splits at most (all their loads in flight at once)
MAX_MERGED_VALUES = 64  # make_merge: outputs per lane at most (rows × d / 32: its registers)


def grid(rows: int, d: int, sequences_times_kv_heads: int) -> tuple:
    """The combine kernel's grid: (packed rows, B · H_kv, column blocks of THREADS)."""
    return rows, sequences_times_kv_heads, -(-d // THREADS)


def block_reduction(pair, what: str):
    """A device function ``(red, t, x)`` -> ``pair`` folded over the block's threads' ``x``, to every thread: a tree in
    shared memory ``red`` (THREADS floats), halved at each level."""

    @cuda.jit(device=True, inline="always")
    def reduce(red, t, x):
        red[t] = x
        cuda.syncthreads()  # every thread's x is in red
        step = THREADS // 2
        while step > 0:
            if t < step:
                red[t] = pair(red[t], red[t + step])
            cuda.syncthreads()  # this level of the tree is complete before the next reads it
            step //= 2
        out = red[0]
        cuda.syncthreads()  # every thread has read red[0] before red is written again
        return out

    reduce.__doc__ = f"The {what} of the block's threads' x, to every thread."
    return reduce


@cuda.jit(device=True, inline="always")
def larger(a, b):
    return max(a, b)


@cuda.jit(device=True, inline="always")
def plus(a, b):
    return float32(a + b)


block_max, block_sum = block_reduction(larger, "largest"), block_reduction(plus, "sum")


@lru_cache(maxsize=None)
def make_combine_kernel(element: str = "", after_split: bool = False):
    """The combine kernel: O and lse from the splits' partials (module docstring). O is written in its array's
    type (float16, float32); for ``element`` 'bfloat16' O is a uint16 array of bfloat16 bits, each rounded to
    nearest even (``gpu.elements.narrow``). Launched on :func:`grid` with THREADS threads a block.

    ``after_split`` (compute capability 9.0 on): the kernel that may be launched while the split kernel still runs
    (programmatic stream serialization), so that its launch and its blocks' start overlap the split kernel's last
    blocks; each block waits for the split kernel's partials (``ptx.wait_for_prior_grids``) before it reads them."""
    narrow = elements.narrow(element or None)

    @cuda.jit(device=True, inline="always")
    def store(O, at, value):
        O[at] = narrow(value)

    @cuda.jit(fastmath=False)
    def combine_splits(O_PART, LSE_PART, O, LSE, n_splits, rows, d):
        red = cuda.shared.array(THREADS, float32)  # the reductions, then one chunk's weights w_s
        part = cuda.local.array(UNROLL, float32)  # UNROLL running sums of w_s · O_s
        if after_split:
            ptx.wait_for_prior_grids()  # the split kernel has ended and its partials are visible
        r, bkv, t = uint64(cuda.blockIdx.x), uint64(cuda.blockIdx.y), uint64(cuda.threadIdx.x)
        n_splits, rows, d = uint64(n_splits), uint64(rows), uint64(d)
        c = uint64(cuda.blockIdx.z) * uint64(THREADS) + t  # this thread's column
        first = bkv * n_splits * rows + r  # split s of row r is LSE_PART[first + s · rows]: layout (B·H_kv, S, rows)
        m = NEG_INF  # m = max_s lse_s (base 2); -inf when every split is empty
        for s in range(t, n_splits, uint64(THREADS)):
            m = max(m, LSE_PART[first + s * rows] * float32(LOG2E))
        m = block_max(red, t, m)
        l_sum = float32(0.0)  # l = Σ_s exp2(lse_s − m)
        if m != NEG_INF:
            for s in range(t, n_splits, uint64(THREADS)):
                l_sum += math.exp2(LSE_PART[first + s * rows] * float32(LOG2E) - m)
        l_sum = block_sum(red, t, l_sum)

        for k in range(UNROLL):
            part[k] = float32(0.0)
        stride = rows * d  # from split s to split s + 1 in O_PART: layout (B·H_kv, S, rows, d)
        for chunk in range(ZERO, n_splits, uint64(THREADS)):
            s = chunk + t
            w = float32(0.0)
            if s < n_splits and m != NEG_INF:
                w = math.exp2(LSE_PART[first + s * rows] * float32(LOG2E) - m)
            red[t] = w
            cuda.syncthreads()  # the chunk's weights are in red
            if c < d:
                count = min(uint64(THREADS), n_splits - chunk)
                at = (first + chunk * rows) * d + c  # O_s[c] of the chunk's first split
                i = ZERO
                while i + uint64(UNROLL) <= count:  # UNROLL independent terms: their loads overlap
                    for k in range(UNROLL):
                        part[k] += red[i + uint64(k)] * O_PART[at + uint64(k) * stride]
                    i += uint64(UNROLL)
                    at += uint64(UNROLL) * stride
                while i < count:
                    part[0] += red[i] * O_PART[at]
                    i += uint64(1)
                    at += stride
            cuda.syncthreads()  # every thread has read the chunk's weights before the next chunk writes red

        if c < d:
            o = float32(0.0)
            for k in range(UNROLL):
                o += part[k]
            store(O, (bkv * rows + r) * d + c, o / l_sum if l_sum != 0 else float32(0.0))
        if c == ZERO:
            LSE[bkv * rows + r] = (m + math.log2(l_sum)) * LN2 if l_sum != 0 else NEG_INF

    return combine_splits


@lru_cache(maxsize=None)
def combine_signature(dtype) -> tuple:
    """combine_splits' argument types: O_PART, LSE_PART, O (``dtype``; uint16 for 'bfloat16'), LSE, then n_splits,
    rows, d."""
    out = flat_type(np.uint16) if str(dtype) == "bfloat16" else flat_type(dtype)
    return (flat_type(np.float32), flat_type(np.float32), out, flat_type(np.float32)) + (types.int64,) * 3


def merge_problems(num_splits: int, rows_per_block: int, d: int) -> list[str]:
    """Why :func:`make_merge` cannot merge a row set of ``rows_per_block`` rows of ``d`` columns over ``num_splits``
    splits (empty: it can)."""
    problems = []
    if num_splits > MAX_MERGED_SPLITS:
        problems.append(f"merge=True takes at most {MAX_MERGED_SPLITS} splits; got {num_splits}")
    if -(-rows_per_block * d // WARP) > MAX_MERGED_VALUES:
        problems.append(f"merge=True takes at most {MAX_MERGED_VALUES * WARP} values a row set (rows per block × d); "
                        f"got {rows_per_block} × {d}")
    return problems


@lru_cache(maxsize=None)
def make_merge(element: str, rows_per_block: int, d: int):
    """The device function ``merge(O_PART, LSE_PART, O, LSE, weights, bkv, row0, rows, n_splits, lane)``: one warp
    writes O and lse of the packed rows row0 .. row0 + rows_per_block - 1 (those below ``rows``) of K/V head ``bkv``
    from the splits' partials (the layouts of the combine kernel), ``n_splits`` <= MAX_MERGED_SPLITS. ``weights``:
    shared memory of rows_per_block · MAX_MERGED_SPLITS floats. Lane r < rows_per_block computes row r's weights
    w_s = exp2(lse_s − m) / l and its lse; then lane i adds the outputs i, i + 32, .. (row-major over the row set's
    rows_per_block × d values), each Σ_s w_s · O_s with the splits past n_splits read at the last split and
    weighted 0, so that no load waits on a branch."""
    narrow = elements.narrow(element or None)
    SPLITS, RPB, D_ = MAX_MERGED_SPLITS, uint64(rows_per_block), uint64(d)
    VALUES = -(-rows_per_block * d // WARP)  # outputs per lane
    LAST_ROW, STRIDE = uint64(rows_per_block - 1), uint64(SPLITS)  # weights: row r's w_s at r · STRIDE + s

    @cuda.jit(device=True, inline="always")
    def merge(O_PART, LSE_PART, O, LSE, weights, bkv, row0, rows, n_splits, lane):
        if lane < RPB and row0 + lane < rows:  # the weights of row row0 + lane
            first = bkv * n_splits * rows + row0 + lane  # its lse_s is LSE_PART[first + s · rows]
            lse2 = cuda.local.array(MAX_MERGED_SPLITS, float32)
            m = NEG_INF
            for s in range(SPLITS):
                at = first + min(uint64(s), n_splits - uint64(1)) * rows
                lse2[s] = LSE_PART[at] * float32(LOG2E) if uint64(s) < n_splits else NEG_INF
                m = max(m, lse2[s])
            l_sum = float32(0.0)
            for s in range(SPLITS):
                lse2[s] = math.exp2(lse2[s] - m) if m != NEG_INF else float32(0.0)
                l_sum += lse2[s]
            for s in range(SPLITS):
                weights[lane * STRIDE + uint64(s)] = lse2[s] / l_sum if l_sum != 0 else float32(0.0)
            LSE[bkv * rows + row0 + lane] = (m + math.log2(l_sum)) * LN2 if l_sum != 0 else NEG_INF
        cuda.syncthreads()  # the weights are in shared memory (the block is this warp)
        out = cuda.local.array(VALUES, float32)
        for i in range(VALUES):
            e = lane + uint64(i * WARP)  # the value, row-major in the row set
            r, c = min(e // D_, LAST_ROW), e % D_
            row = min(row0 + r, rows - uint64(1))  # a row inside the head (the value is not stored otherwise)
            total = float32(0.0)
            for s in range(SPLITS):
                split = min(uint64(s), n_splits - uint64(1))
                total += weights[r * STRIDE + uint64(s)] * O_PART[((bkv * n_splits + split) * rows + row) * D_ + c]
            out[i] = total
        for i in range(VALUES):
            e = lane + uint64(i * WARP)
            if e < RPB * D_ and row0 + e // D_ < rows:
                O[(bkv * rows + row0 + e // D_) * D_ + e % D_] = narrow(out[i])

    return merge
