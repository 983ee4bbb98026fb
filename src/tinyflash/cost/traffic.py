"""Counting main-memory (HBM) traffic: standard attention against FlashAttention.

The :class:`HBMCounter` is handed to :func:`tinyflash.blocked_attention` (argument ``io``), which
reports each tile it reads from or writes to main memory exactly as the GPU kernel moves them.

Three ways of getting the bytes moved by one attention call, which the tests hold equal:

* **counted** — :func:`standard_attention_traffic` walks the unfused algorithm step by step;
  :func:`flash_attention_traffic` runs :func:`tinyflash.blocked_attention` on random inputs and
  lets it report every tile it loads and stores;
* **closed form** — :func:`standard_traffic_closed_form` and :func:`flash_traffic_closed_form`,
  exact element counts, ragged last tiles and causal skipping included; cheap at any N;
* **the paper's bounds** (Dao et al. 2022, Theorem 2), in elements and up to a constant:
  Θ(N·d + N²) for standard attention (:func:`theta_standard`) and Θ(N²·d²/M) for FlashAttention
  with on-chip memory of M elements (:func:`theta_flash`).

Counting runs the NumPy stage, so it is for moderate N (a few thousand); beyond, use the
closed form, which the tests prove equal to the count at awkward sizes.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..core.checks import check_causal, check_positive_int
from ..core.masks import key_stop
from ..hardware import H200
from ..forward.blocked import blocked_attention
from .memory import dtype_bytes

# M, the on-chip memory (in elements) that the tiles of this project are sized for. With d = 64,
# tile_sizes(SRAM_ELEMENTS, 64) gives Br = Bc = 64: the default tiles of blocked_attention, and
# the tiles the stage-2 kernel uses on a GPU for d = 128 (forward/kernels/tiling.py: default_config).
SRAM_ELEMENTS = 16_384
# An H200 multiprocessor's shared memory (228 KiB), as fp16 elements: 116,736
HOPPER_SRAM_ELEMENTS = H200.smem_per_sm // 2


def lse_bytes(dtype) -> int:
    """Bytes of one log-sum-exp: float32 (float64 for float64 inputs), as both NumPy stages store it."""
    return 8 if dtype_bytes(dtype) == 8 else 4


class HBMCounter:
    """Bytes read from and written to main memory, per tensor name."""

    def __init__(self):
        self.reads = defaultdict(int)  # name -> bytes
        self.writes = defaultdict(int)  # name -> bytes

    def read(self, name: str, tile) -> None:
        """Record that the array ``tile`` was read from main memory."""
        self.read_bytes(name, int(tile.size) * tile.dtype.itemsize)

    def write(self, name: str, tile) -> None:
        """Record that the array ``tile`` was written to main memory."""
        self.write_bytes(name, int(tile.size) * tile.dtype.itemsize)

    def read_bytes(self, name: str, nbytes: int) -> None:
        """Record a read of ``nbytes`` without an array (for counting at sizes we never allocate)."""
        self.reads[name] += int(nbytes)

    def write_bytes(self, name: str, nbytes: int) -> None:
        self.writes[name] += int(nbytes)

    @property
    def bytes_read(self) -> int:
        return sum(self.reads.values())

    @property
    def bytes_written(self) -> int:
        return sum(self.writes.values())

    @property
    def total(self) -> int:
        return self.bytes_read + self.bytes_written

    def __repr__(self) -> str:
        return f"HBMCounter(reads={dict(self.reads)}, writes={dict(self.writes)})"


def _sizes(n_q, d, n_k, d_v, heads):
    """Check and fill in the sizes shared by every function here: (Nq, d, Nk, dv, heads)."""
    n_q, d = check_positive_int(n_q, "n_q"), check_positive_int(d, "d")
    n_k = n_q if n_k is None else check_positive_int(n_k, "n_k")
    d_v = d if d_v is None else check_positive_int(d_v, "d_v")
    return n_q, d, n_k, d_v, check_positive_int(heads, "heads")


def tile_sizes(sram_elements: int, d: int) -> tuple[int, int]:
    """(Br, Bc) for on-chip memory of M = ``sram_elements`` elements and head dim ``d``.

    The paper's Algorithm 1 loops over key/value tiles outside and query tiles inside, and picks
    Bc = ceil(M / 4d), Br = min(Bc, d): the tile it keeps on chip while the other streams past is
    the big one. Our loop order (blocked.py, and the kernel) is FlashAttention-2's: query tiles
    outside, so the roles swap: Br = ceil(M / 4d) and Bc = min(Br, d). Either way Q_i, K_j, V_j
    and O_i take about M/4 elements each and the score tile S_ij (Br × Bc) at most M/4, and the
    tensor streamed past is re-read ceil(N / (M/4d)) times: that is where the M in Θ(N²d²/M)
    comes from.
    """
    m = check_positive_int(sram_elements, "sram_elements")
    d = check_positive_int(d, "d")
    block_q = -(-m // (4 * d))  # ceil(M / 4d), at least 1
    return block_q, min(block_q, d)


# --- standard attention -------------------------------------------------------------------


def standard_attention_traffic(n_q: int, d: int, *, n_k: int | None = None, d_v: int | None = None,
                               heads: int = 1, dtype="float16", score_dtype=None) -> HBMCounter:
    """Count the HBM traffic of standard (unfused) attention, step by step. Allocates nothing.

    This is the paper's Algorithm 0, which an unfused GPU implementation runs as three kernels:
    a matmul, a softmax and a second matmul, each reading its inputs from HBM and writing its
    result back. S and P are stored in ``score_dtype`` (default: ``dtype``). Each input is
    counted as read once, as by an ideal matmul; a tiled GEMM re-reads panels of Q, K and V,
    so a real run moves somewhat more. The causal mask is applied inside the softmax pass,
    which reads S anyway, so the count is the same with and without it (an unfused framework
    path that applies the mask as its own elementwise pass adds one more read and write of S).
    """
    n_q, d, n_k, d_v, heads = _sizes(n_q, d, n_k, d_v, heads)
    b = dtype_bytes(dtype)  # bytes per element of Q, K, V, O
    b_s = b if score_dtype is None else dtype_bytes(score_dtype)  # bytes per element of S and P
    io = HBMCounter()
    # Kernel 1, S = scale · Q Kᵀ: read Q and K, write the Nq × Nk scores.
    io.read_bytes("Q", heads * n_q * d * b)
    io.read_bytes("K", heads * n_k * d * b)
    io.write_bytes("S", heads * n_q * n_k * b_s)
    # Kernel 2, P = softmax(S) row by row (masking here if causal): read S, write P and the
    # log-sum-exp of every row. (A softmax kernel whose row does not fit on chip reads S 2-3 times.)
    io.read_bytes("S", heads * n_q * n_k * b_s)
    io.write_bytes("P", heads * n_q * n_k * b_s)
    io.write_bytes("lse", heads * n_q * lse_bytes(dtype))
    # Kernel 3, O = P V: read P and V, write O.
    io.read_bytes("P", heads * n_q * n_k * b_s)
    io.read_bytes("V", heads * n_k * d_v * b)
    io.write_bytes("O", heads * n_q * d_v * b)
    return io


def standard_traffic_closed_form(n_q: int, d: int, *, n_k: int | None = None, d_v: int | None = None,
                                 heads: int = 1, dtype="float16", score_dtype=None) -> int:
    """Total bytes of :func:`standard_attention_traffic` as one expression.

    inputs and output once: (Nq·d + Nk·d + Nk·dv + Nq·dv)·b;  S and P written once and read
    once each: 4·Nq·Nk·b_s;  lse: Nq float32.  The N² term is what FlashAttention removes.
    """
    n_q, d, n_k, d_v, heads = _sizes(n_q, d, n_k, d_v, heads)
    b = dtype_bytes(dtype)
    b_s = b if score_dtype is None else dtype_bytes(score_dtype)
    per_head = (n_q * d + n_k * d + n_k * d_v + n_q * d_v) * b + 4 * n_q * n_k * b_s + n_q * lse_bytes(dtype)
    return heads * per_head


# --- FlashAttention -----------------------------------------------------------------------


def flash_attention_traffic(n_q: int, d: int, *, n_k: int | None = None, d_v: int | None = None, heads: int = 1,
                            dtype="float16", causal: bool = False, block_q: int = 64, block_k: int = 64,
                            seed: int = 0) -> HBMCounter:
    """Count FlashAttention's HBM traffic by running :func:`tinyflash.blocked_attention`.

    The inputs are random (the count does not depend on their values); every tile load and store
    the blocked stage makes is reported to the counter, as the kernel makes them. Time and memory
    grow as Nq·Nk and Nq·d: fine up to a few thousand, use :func:`flash_traffic_closed_form` beyond.
    """
    n_q, d, n_k, d_v, heads = _sizes(n_q, d, n_k, d_v, heads)
    rng = np.random.default_rng(seed)
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"dtype must be float16, float32 or float64; got {dtype!r}") from exc
    q = rng.standard_normal((heads, n_q, d)).astype(dt)  # (heads, Nq, d)
    k = rng.standard_normal((heads, n_k, d)).astype(dt)  # (heads, Nk, d)
    v = rng.standard_normal((heads, n_k, d_v)).astype(dt)  # (heads, Nk, dv)
    io = HBMCounter()
    blocked_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k, io=io)
    return io


def keys_read_per_query_tile(n_q: int, n_k: int, block_q: int, block_k: int, causal: bool) -> np.ndarray:
    """Keys each query tile loads, (Tr,): Nk, or with ``causal`` only up to the last tile it may see.

    Query tile i holds rows [i·Br, q_end) with q_end = min((i+1)·Br, Nq). Its rows may attend keys
    below key_stop(q_end) (:func:`tinyflash.core.masks.key_stop`); it loads the key tiles that
    start below that: ceil(key_stop / Bc) of them, the last one ragged if it reaches Nk.
    """
    q_ends = [min((i + 1) * block_q, n_q) for i in range(-(-n_q // block_q))]  # (Tr,) one past each tile's last row
    key_tiles = [-(-key_stop(q_end, n_q, n_k, causal) // block_k) for q_end in q_ends]  # (Tr,) key tiles loaded
    return np.minimum(np.array(key_tiles, dtype=np.int64) * block_k, n_k)  # (Tr,) keys loaded


def flash_traffic_closed_form(n_q: int, d: int, *, n_k: int | None = None, d_v: int | None = None, heads: int = 1,
                              dtype="float16", causal: bool = False, block_q: int = 64,
                              block_k: int = 64) -> HBMCounter:
    """FlashAttention's exact traffic from a formula, per tensor, without running anything.

    Q is read once and O and lse written once; each of the Tr = ceil(Nq/Br) query tiles reads the
    keys and values it needs: all Nk of them (K and V traffic Tr·Nk·(d + dv)), or with
    ``causal`` only those up to its diagonal (:func:`keys_read_per_query_tile`).
    """
    n_q, d, n_k, d_v, heads = _sizes(n_q, d, n_k, d_v, heads)
    block_q, block_k = check_positive_int(block_q, "block_q"), check_positive_int(block_k, "block_k")
    b = dtype_bytes(dtype)
    keys = int(keys_read_per_query_tile(n_q, n_k, block_q, block_k, check_causal(causal)).sum())
    io = HBMCounter()
    io.read_bytes("Q", heads * n_q * d * b)
    io.read_bytes("K", heads * keys * d * b)
    io.read_bytes("V", heads * keys * d_v * b)
    io.write_bytes("O", heads * n_q * d_v * b)
    io.write_bytes("lse", heads * n_q * lse_bytes(dtype))
    return io


# --- the paper's bounds -------------------------------------------------------------------


def theta_standard(n: int, d: int) -> float:
    """The paper's Θ(N·d + N²) for standard attention, in elements, with constant 1."""
    n, d = check_positive_int(n, "n"), check_positive_int(d, "d")
    return float(n * d + n * n)


def theta_flash(n: int, d: int, sram_elements: int) -> float:
    """The paper's Θ(N²·d²/M) for FlashAttention, in elements, with constant 1 (valid for d <= M <= N·d)."""
    n, d = check_positive_int(n, "n"), check_positive_int(d, "d")
    m = check_positive_int(sram_elements, "sram_elements")
    return n * n * d * d / m


def traffic_ratio(n: int, d: int, sram_elements: int = SRAM_ELEMENTS, *, dtype="float16") -> float:
    """How many times more bytes standard attention moves than FlashAttention (both non-causal)."""
    block_q, block_k = tile_sizes(sram_elements, d)
    flash = flash_traffic_closed_form(n, d, dtype=dtype, block_q=block_q, block_k=block_k).total
    return standard_traffic_closed_form(n, d, dtype=dtype) / flash


def traffic_crossover(n: int, d: int, *, dtype="float16") -> int:
    """The on-chip memory M (elements) from which FlashAttention moves fewer bytes than standard
    attention: the smallest M such that :func:`traffic_ratio` (standard over flash, non-causal)
    is above 1 there and at every larger M up to N·d.

    M enters only through Br = ceil(M/4d) (:func:`tile_sizes`), so the M tried are the multiples
    of 4d; below the crossover, tiles are so small that K and V, re-read once per query tile,
    cost more than writing and reading S and P.
    """
    step = 4 * check_positive_int(d, "d")
    ms = list(range(step, check_positive_int(n, "n") * d + 1, step))  # Br = 1, 2, ..., N/4
    fewer = [traffic_ratio(n, d, m, dtype=dtype) > 1 for m in ms]  # (len(ms),)
    if not fewer or not fewer[-1]:
        raise ValueError(f"FlashAttention never moves fewer bytes than standard attention at N={n}, d={d}")
    first = len(fewer)
    while first > 0 and fewer[first - 1]:  # walk back over the trailing run of "fewer"
        first -= 1
    return ms[first]


__all__ = [
    "HBMCounter",
    "HOPPER_SRAM_ELEMENTS",
    "lse_bytes",
    "SRAM_ELEMENTS",
    "flash_attention_traffic",
    "flash_traffic_closed_form",
    "keys_read_per_query_tile",
    "standard_attention_traffic",
    "standard_traffic_closed_form",
    "theta_flash",
    "theta_standard",
    "tile_sizes",
    "traffic_crossover",
    "traffic_ratio",
]
