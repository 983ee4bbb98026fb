"""The two small kernels around the main backward kernel, each O(N·d) work.

* ``row_dot`` (before): D_i = rowsum(dO_i ∘ O_i) for every query row, in float32, and the
  float32 accumulator of dQ set to zero (the main kernel adds into it with atomics); ROW_LANES threads a row.
* ``finish_dq`` (after): dQ = scale · accumulator, in the dtype of q, one thread per element (the main kernel adds
  dS_ij K_j unscaled, as the scale is the same for every term).

Both are launched over (blocks of ROWS_PER_BLOCK threads, heads) by
``tinyflash.gpu.launch.launch``, which finds each head's slice of the flat arrays; :func:`element_rows` makes
them for an element type (bfloat16: read and written as its 16-bit patterns). :func:`word_rows` gives
the same two for 16-bit inputs held as words of two values (the tensor-core backward's float16 and
bfloat16, which NumPy and numba have no type for). Both ``row_dot`` kernels give a query row ROW_LANES threads.

Why ROW_LANES threads share a row: with one thread per row, the 32 threads of a warp would read
32 rows at once, an element or word of each (32 memory lines per load), and write dQ's accumulator 32 lines per store.
With a row's words spread over its lanes, each load and store of a warp covers consecutive words of whole
rows, and a few shuffles add the lanes' sums. The row kernels move O(N·d) bytes, once; the main kernel
O(N²·d) work, but on a causal backward at N = 4,096 the row kernels' time is no longer small beside it.
"""

from __future__ import annotations

from functools import lru_cache

from numba import cuda, float32, uint64
from numba.cuda import types

from ...gpu import elements, ptx
from ...gpu.warp import group_sum

WORDS, FLOATS = types.Array(types.uint32, 1, "C"), types.Array(types.float32, 1, "C")
ROW_DOT_WORDS_SIGNATURE = (WORDS, WORDS, FLOATS, FLOATS, types.int64, types.int64)  # dO, O, D, dQ_acc, n_q, d
FINISH_DQ_WORDS_SIGNATURE = (FLOATS, WORDS, types.int64, types.float32)  # dQ_acc, dQ, n, scale

ROWS_PER_BLOCK = 128  # threads per block of both kernels
ROW_LANES = 16  # row_dot: threads per query row (a power of two, at most a warp)
ROW_DOT_ROWS = ROWS_PER_BLOCK // ROW_LANES  # query rows per block of row_dot


@lru_cache(maxsize=None)
def element_rows(element: str | None = None):
    """``(row_dot, finish_dq)`` for inputs of ``element`` ('bfloat16': arrays of its 16-bit patterns; None:
    float16 or float32), each element read and written through ``gpu.elements``' widen and narrow."""
    widen, narrow = elements.widen(element), elements.narrow(element)  # an element as float32, and back
    row_sum = group_sum(ROW_LANES)  # the sum over a row's lanes, to each of them

    @cuda.jit
    def row_dot(dO, O, D, dQ_acc, n_q, d, d_v):
        """ROW_LANES threads per query row, ROW_DOT_ROWS rows a block: D[row] = Σ_c dO[row, c] · O[row, c] (the
        thread adds columns lane, lane + ROW_LANES, ..; a shuffle tree adds the threads' sums); dQ_acc[row, :] = 0."""
        bh, tid = uint64(cuda.blockIdx.y), uint64(cuda.threadIdx.x)  # which (batch, head); the thread
        row = uint64(cuda.blockIdx.x) * uint64(ROW_DOT_ROWS) + tid // uint64(ROW_LANES)
        lane = tid % uint64(ROW_LANES)
        n_q, d, d_v = uint64(n_q), uint64(d), uint64(d_v)
        total = float32(0.0)
        if row < n_q:
            o_row = (bh * n_q + row) * d_v  # where this row of dO and O begins
            for c in range(lane, d_v, uint64(ROW_LANES)):
                total += widen(dO[o_row + c]) * widen(O[o_row + c])
            for c in range(lane, d, uint64(ROW_LANES)):
                dQ_acc[(bh * n_q + row) * d + c] = float32(0.0)
        total = row_sum(total)  # every thread, inside the rows or not: a shuffle takes the whole warp
        if row < n_q and lane == uint64(0):
            D[bh * n_q + row] = total

    @cuda.jit
    def finish_dq(dQ_acc, dQ, n, scale):
        """One thread per element of a head's dQ (n = Nq·d of them): dQ = scale · accumulator."""
        bh = uint64(cuda.blockIdx.y)
        idx = uint64(cuda.blockIdx.x) * uint64(cuda.blockDim.x) + uint64(cuda.threadIdx.x)
        n = uint64(n)
        if idx < n:
            dQ[bh * n + idx] = narrow(dQ_acc[bh * n + idx] * scale)

    return row_dot, finish_dq


row_dot, finish_dq = element_rows()  # float16 and float32 inputs


@lru_cache(maxsize=None)
def word_rows(element: str):
    """``(row_dot_words, finish_dq_words)`` for ``element`` (float16 or bfloat16) inputs held as uint32 words
    of two values: the two kernels above, reading and writing pairs (``gpu.ptx.unpack``, ``pack``)."""
    unpack, pack = ptx.unpack(element), ptx.pack(element)
    row_sum = group_sum(ROW_LANES)  # the sum over a row's lanes, to each of them

    @cuda.jit
    def row_dot_words(dO, O, D, dQ_acc, n_q, d):
        """ROW_LANES threads per query row, ROW_DOT_ROWS rows a block: D[row] = Σ_c dO[row, c] · O[row, c] (the
        thread adds words lane, lane + ROW_LANES, .. of the row's d / 2; a shuffle tree adds the threads' sums);
        dQ_acc[row, :] = 0 (floats lane, lane + ROW_LANES, ..)."""
        bh, tid = uint64(cuda.blockIdx.y), uint64(cuda.threadIdx.x)
        row = uint64(cuda.blockIdx.x) * uint64(ROW_DOT_ROWS) + tid // uint64(ROW_LANES)
        lane = tid % uint64(ROW_LANES)
        n_q, d = uint64(n_q), uint64(d)
        total = float32(0.0)
        if row < n_q:
            w_row = (bh * n_q + row) * (d // uint64(2))  # where this row of dO and O begins, in words
            for c in range(lane, d // uint64(2), uint64(ROW_LANES)):
                a0, a1 = unpack(dO[w_row + c])
                b0, b1 = unpack(O[w_row + c])
                total += a0 * b0 + a1 * b1
            for c in range(lane, d, uint64(ROW_LANES)):
                dQ_acc[(bh * n_q + row) * d + c] = float32(0.0)
        total = row_sum(total)  # every thread, inside the rows or not: a shuffle takes the whole warp
        if row < n_q and lane == uint64(0):
            D[bh * n_q + row] = total

    @cuda.jit
    def finish_dq_words(dQ_acc, dQ, n, scale):
        """One thread per word of a head's dQ (n = Nq·d / 2 of them): two elements, scale · accumulator, rounded."""
        bh = uint64(cuda.blockIdx.y)
        idx = uint64(cuda.blockIdx.x) * uint64(cuda.blockDim.x) + uint64(cuda.threadIdx.x)
        n = uint64(n)
        if idx < n:
            at = (bh * n + idx) * uint64(2)
            dQ[bh * n + idx] = pack(dQ_acc[at] * scale, dQ_acc[at + uint64(1)] * scale)

    return row_dot_words, finish_dq_words
