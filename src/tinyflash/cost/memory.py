"""A memory model of attention: how many bytes each array takes.

Standard attention stores the Nq × Nk score matrix S (the logits) and, in a plain
implementation, the probability matrix P = softmax(S) as well. FlashAttention stores neither:
beyond its inputs it writes only the output O (Nq × dv) and one log-sum-exp per row.
Everything here is exact integer arithmetic; lesson 01 and the memory figure print it.
"""

from __future__ import annotations

import math
import tracemalloc
from dataclasses import dataclass

import numpy as np

KiB, MiB, GiB = 2**10, 2**20, 2**30

BYTES_PER_ELEMENT = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def dtype_bytes(dtype) -> int:
    """Bytes per element of ``dtype`` (a NumPy dtype, or one of the names in BYTES_PER_ELEMENT)."""
    if isinstance(dtype, str) and dtype in BYTES_PER_ELEMENT:
        return BYTES_PER_ELEMENT[dtype]
    try:
        return np.dtype(dtype).itemsize
    except TypeError as exc:
        raise TypeError(f"dtype must be a float dtype such as 'float16' or 'float32'; got {dtype!r}") from exc


@dataclass(frozen=True)
class AttentionMemory:
    """Bytes of every array of one attention call (all heads and batch entries together)."""

    scores: int  # S = scale·QKᵀ, Nq × Nk per head
    probabilities: int  # P = softmax(S), Nq × Nk per head
    q: int
    k: int
    v: int
    o: int
    lse: int  # one float32 per query row (FlashAttention keeps it for the backward pass)

    @property
    def logits_and_probabilities(self) -> int:
        return self.scores + self.probabilities

    @property
    def qkv(self) -> int:
        return self.q + self.k + self.v

    @property
    def naive_extra(self) -> int:
        """What standard attention allocates beyond its inputs: S, P and O."""
        return self.scores + self.probabilities + self.o

    @property
    def flash_extra(self) -> int:
        """What FlashAttention allocates beyond its inputs: O and the lse vector, O(N·d)."""
        return self.o + self.lse


def attention_memory(n: int, d: int, *, heads: int = 1, batch: int = 1, dtype="float16", n_k: int | None = None,
                     d_v: int | None = None, lse_dtype="float32") -> AttentionMemory:
    """The memory model for ``batch × heads`` heads of ``n`` queries, ``n_k`` keys (default n)."""
    n_k = n if n_k is None else n_k
    d_v = d if d_v is None else d_v
    b, heads_total = dtype_bytes(dtype), batch * heads
    return AttentionMemory(
        scores=heads_total * n * n_k * b,
        probabilities=heads_total * n * n_k * b,
        q=heads_total * n * d * b,
        k=heads_total * n_k * d * b,
        v=heads_total * n_k * d_v * b,
        o=heads_total * n * d_v * b,
        lse=heads_total * n * dtype_bytes(lse_dtype),
    )


def tile_bytes(rows: int, cols: int, dtype="float16") -> int:
    """Bytes of one rows × cols tile, e.g. a 128 × 128 fp16 score tile: 32 KiB."""
    return rows * cols * dtype_bytes(dtype)


def format_bytes(n: float) -> str:
    """Binary units, exact where exact: 2147483648 -> '2 GiB', 25165824 -> '24 MiB', 1536 -> '1.5 KiB'."""
    for unit, size in (("TiB", 2**40), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.3g} {unit}"
    return f"{n:.0f} B"


def max_sequence_length(budget_bytes: int, *, heads: int = 1, batch: int = 1, dtype="float16",
                        matrices: int = 2) -> int:
    """The largest N whose ``matrices`` N × N attention matrices (1: S only; 2: S and P) fit in the budget.

    Exact integer arithmetic: heads·batch·matrices·N²·bytes <= budget  <=>  N <= isqrt(budget // (...)).
    Only the matrices are counted, as in the memory figure; Q, K, V and O need space besides.
    """
    for name, value in (("budget_bytes", budget_bytes), ("heads", heads), ("batch", batch), ("matrices", matrices)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{name} must be a positive integer; got {value!r}")
    per_entry = heads * batch * matrices * dtype_bytes(dtype)  # bytes per (query, key) pair
    return math.isqrt(int(budget_bytes) // per_entry)


def measure_peak_bytes(fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` under :mod:`tracemalloc`; return ``(peak_bytes, result)``.

    ``peak_bytes`` is the highest amount of memory allocated during the call beyond what was
    allocated before it, so it includes the result (it is still alive when the call returns).
    NumPy reports its array buffers to tracemalloc, so this sees every N × N matrix. If tracemalloc
    is already running, it is left running (its peak is reset).
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable; got {type(fn).__name__}")
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]  # (current, peak): what is allocated already
        result = fn(*args, **kwargs)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return peak, result


def blocked_workspace_bytes(block_q: int, block_k: int, d_v: int, dtype="float32") -> int:
    """The tile temporaries :func:`tinyflash.blocked_attention` holds at its peak, in NumPy, whatever N is:
    the larger of two moments of its loop, in score tiles T = Br × Bc and accumulators A = Br × dv.

    * While the next S_ij = scale · Q_i K_jᵀ is made: the last S_ij, the product and its scaled copy (3 T),
      beside ``acc`` (A). (P_ij of the last tile is gone: it lives inside the online-softmax update.)
    * While ``acc = alpha · acc + P_ij V_j`` is made: S_ij and P_ij (2 T), the old ``acc``, ``alpha · acc``,
      ``P_ij V_j`` and their sum (4 A).

    So max(3 T + A, 2 T + 4 A) elements: square 64 × 64 tiles at d = 64 peak at the second moment, tiles of
    256 × 256 at the first. A model of NumPy's temporaries: it leaves out the vectors m_i, l_i and alpha (a
    few per cent of the total at 64 × 64 tiles, less at larger ones) and, in a causal call, the mask (up to
    about one more tile). On the GPU these tiles live in shared memory and registers instead.
    """
    for name, value in (("block_q", block_q), ("block_k", block_k), ("d_v", d_v)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{name} must be a positive integer; got {value!r}")
    tile, acc = block_q * block_k, block_q * d_v
    return max(3 * tile + acc, 2 * tile + 4 * acc) * dtype_bytes(dtype)
