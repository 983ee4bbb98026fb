"""The combine kernel: O and lse from the splits' partials (O_s, lse_s), exactly.

A finished partial is the online-softmax state (lse_s, 1, O_s), so merging the splits is the online
softmax's rescaling once per split (:func:`tinyflash.core.online_softmax.merge_weights`, compiled here):
lse = log Σ_s exp(lse_s), O = Σ_s exp(lse_s − lse) · O_s. One thread per (packed row, column).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, types, uint64

from ...core.online_softmax import LN2, LOG2E, merge_weights
from ...gpu import elements
from ...gpu.driver_launch import flat_type
from ...gpu.runtime import device_function, u

NEG_INF = float32(-np.inf)
ZERO = u(0)
THREADS = 128  # threads per block
merge_weights = device_function(merge_weights)  # the online softmax's merge, from tinyflash.core


@lru_cache(maxsize=None)
def make_combine_kernel(element: str = ""):
    """The combine kernel: O and lse from the splits' partials, one thread per (packed row, column). O is written
    in its array's type (float16, float32); for ``element`` 'bfloat16' O is a uint16 array of bfloat16 bits, each
    rounded to nearest even (``gpu.elements.narrow``)."""
    narrow = elements.narrow(element or None)

    @cuda.jit(device=True, inline="always")
    def store(O, at, value):
        O[at] = narrow(value)

    @cuda.jit
    def combine_splits(O_PART, LSE_PART, O, LSE, n_splits, rows, d):
        bkv = uint64(cuda.blockIdx.y)  # which (sequence, K/V head)
        n_splits, rows, d = uint64(n_splits), uint64(rows), uint64(d)
        idx = uint64(cuda.blockIdx.x) * uint64(cuda.blockDim.x) + uint64(cuda.threadIdx.x)
        if idx < rows * d:
            r, c = idx // d, idx % d
            m, l_sum, o = NEG_INF, float32(0.0), float32(0.0)
            for sp in range(n_splits):  # the online softmax over the splits, each one state (lse_s, 1, O_s)
                part = (bkv * n_splits + sp) * rows + r
                m, w_run, w_split = merge_weights(m, LSE_PART[part] * float32(LOG2E))  # lse_s in base 2
                l_sum = float32(l_sum * w_run + w_split)
                o = float32(o * w_run + O_PART[part * d + c] * w_split)
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
