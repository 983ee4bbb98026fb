"""The two small kernels around the main backward kernel, each O(N·d) work, one thread per row or element.

* :data:`row_dot` (before): D_i = rowsum(dO_i ∘ O_i) for every query row, in float32, and the
  float32 accumulator of dQ set to zero (the main kernel adds into it with atomics).
* :data:`finish_dq` (after): dQ = scale · accumulator, in the dtype of q (the main kernel adds
  dS_ij K_j unscaled, as the scale is the same for every term).

Both are launched over (blocks of ROWS_PER_BLOCK rows or elements, heads) by
``tinyflash.gpu.launch.launch``, which finds each head's slice of the flat arrays.
"""

from __future__ import annotations

from numba import cuda, float32, uint64

ROWS_PER_BLOCK = 128  # threads per block of both kernels


@cuda.jit
def row_dot(dO, O, D, dQ_acc, n_q, d, d_v):
    """One thread per query row: D[row] = Σ_c dO[row, c] · O[row, c]; dQ_acc[row, :] = 0."""
    bh = uint64(cuda.blockIdx.y)  # which (batch, head)
    row = uint64(cuda.blockIdx.x) * uint64(cuda.blockDim.x) + uint64(cuda.threadIdx.x)
    n_q, d, d_v = uint64(n_q), uint64(d), uint64(d_v)
    if row < n_q:
        o_row = (bh * n_q + row) * d_v  # where this row of dO and O begins
        total = float32(0.0)
        for c in range(d_v):
            total += float32(dO[o_row + c]) * float32(O[o_row + c])
        D[bh * n_q + row] = total
        for c in range(d):
            dQ_acc[(bh * n_q + row) * d + c] = float32(0.0)


@cuda.jit
def finish_dq(dQ_acc, dQ, n, scale):
    """One thread per element of a head's dQ (n = Nq·d of them): dQ = scale · accumulator."""
    bh = uint64(cuda.blockIdx.y)
    idx = uint64(cuda.blockIdx.x) * uint64(cuda.blockDim.x) + uint64(cuda.threadIdx.x)
    n = uint64(n)
    if idx < n:
        dQ[bh * n + idx] = dQ_acc[bh * n + idx] * scale
