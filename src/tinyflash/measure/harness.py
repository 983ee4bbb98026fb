"""The one benchmark harness: check against the float64 reference, then time, then one CSV row.

Every GPU measurement of the project (``python -m tinyflash.bench``: the comparison with
PyTorch, the kernel versions, the tile sweep, the vector loads) goes through :func:`measure`:

1. **check** (:func:`check`): the output on a sample of query rows of the first and the last head
   against the float64 reference (:func:`tinyflash.reference_attention` with ``rows=``), by the
   project's one rule per dtype (:func:`tinyflash.core.tolerance.within_tolerance`): float32 within
   ``F32_TOL``; float16 by FlashAttention's rule, against standard attention computed in float16
   on the same rows (:func:`naive_same_precision`). Only a result that passes is timed;
2. **time** (:func:`time_call`): CUDA events around single calls, after warm-up calls, at least
   ``MIN_REPS`` of them; the median, with the fastest and slowest, goes into the row. (Stage 3 against
   its peers is timed by :func:`time_interleaved` instead: peers in turn, round by round, both queued
   and one call alone.)
3. **record**: one row of :data:`FIELDS`, the one CSV schema (device, library versions and date
   in every row), written as it comes (:class:`CsvWriter`).

TFLOP/s counts 4·B·H·Nq·Nk·d floating-point operations (two matrix products), halved for causal
attention. Peak extra memory is the largest number of bytes the call holds in the framework's
allocator beyond what was live before it: for CuPy arrays (tinyflash allocates its outputs there
when given CuPy arrays; its kernels allocate nothing else) a CuPy memory hook counts every
allocation from CuPy's pool; for PyTorch, ``torch.cuda.max_memory_allocated()``. Workspace a
library allocates outside these allocators (e.g. cuBLAS's own) is not counted.
"""

from __future__ import annotations

import csv
import datetime
import math
import statistics

import numpy as np

from ..core.masks import allowed
from ..core.tolerance import to_host64, within_tolerance
from ..forward.naive import reference_attention

FIELDS = ["device", "date", "numpy", "numba_cuda", "cupy", "torch", "benchmark", "impl", "variant", "dtype",
          "causal", "batch", "heads", "n", "d", "time_ms", "time_min_ms", "time_max_ms", "reps", "tflops",
          "peak_bytes", "regs", "smem_bytes", "status", "max_rel_err", "tolerance"]
STATUSES = ("ok", "oom", "unsupported", "wrong")  # 'wrong' rows say by how much: "wrong (error ... > ...)"
WARMUP, MIN_REPS, MIN_TOTAL_MS, MAX_REPS = 2, 5, 300.0, 50
CHECK_ROWS = 64  # query rows sampled per checked head


def attention_flops(batch: int, heads: int, n_q: int, n_k: int, d: int, causal: bool) -> float:
    """4·B·H·Nq·Nk·d: Q Kᵀ and P V, 2 operations per multiply-add; causal does about half."""
    f = 4.0 * batch * heads * n_q * n_k * d
    return f / 2 if causal else f


def environment() -> dict:
    """Device, library versions and date, written into every CSV row."""
    import cupy

    env = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "numpy": np.__version__, "cupy": cupy.__version__}
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    env["device"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    try:
        from importlib.metadata import version

        env["numba_cuda"] = version("numba-cuda")
    except Exception:
        env["numba_cuda"] = "unknown"
    try:
        import torch

        env["torch"] = torch.__version__
    except ImportError:
        env["torch"] = ""
    return env


class CudaClock:
    """The GPU's clock for :func:`time_call` and :func:`time_interleaved`: CUDA events on the default stream."""

    def __init__(self):
        import cupy

        self._cupy = cupy

    def sync(self) -> None:
        self._cupy.cuda.Device().synchronize()

    def elapsed_ms(self, work) -> float:
        """Milliseconds of GPU time between an event recorded before ``work()`` and one after it."""
        start, end = self._cupy.cuda.Event(), self._cupy.cuda.Event()
        start.record()
        work()
        end.record()
        end.synchronize()
        return self._cupy.cuda.get_elapsed_time(start, end)


def time_call(fn) -> dict:
    """CUDA-event times of ``fn()``, one call each, after WARMUP untimed calls: at least MIN_REPS,
    and more (up to MAX_REPS) until MIN_TOTAL_MS have passed. Returns the median, min and max (ms)."""
    clock = CudaClock()
    calls(fn, WARMUP)
    clock.sync()
    times = []
    while len(times) < MIN_REPS or (sum(times) < MIN_TOTAL_MS and len(times) < MAX_REPS):
        times.append(clock.elapsed_ms(fn))
    return {"time_ms": statistics.median(times), "time_min_ms": min(times), "time_max_ms": max(times),
            "reps": len(times)}


# time_interleaved: rounds; the length of a queued burst (at least MIN_BURST calls, at most MAX_BURST); how long a
# peer runs untimed before it is timed in a round (SETTLE_MS: the GPU's clock settles to the peer's own power draw)
ROUNDS, BURST_MS, MIN_BURST, MAX_BURST, SETTLE_MS = 15, 10.0, 2, 50, 200.0


def round_order(names: list, r: int) -> list:
    """The order of the peers in round r: rotated by r, and reversed in every other cycle of rotations, so
    that each peer leads some rounds and follows each of the others in some."""
    order = names[r % len(names):] + names[:r % len(names)]
    return order[::-1] if (r // len(names)) % 2 else order


def time_interleaved(peers: dict, *, rounds: int = ROUNDS, clock=None, trace=None) -> dict:
    """Time functions that do the same work, ``peers``: name -> (fn, around), in interleaved rounds: every
    round times each of them in turn (:func:`round_order`), so that a drift of the GPU (temperature, other
    loads) falls on all of them alike. ``around()`` is a context entered before a peer's calls, outside the
    timed interval (SDPA's choice of backend).

    At large sizes an H200 runs at its power limit (NVML reports its software power cap active) and sets its
    clock to stay there, so what ran just before a kernel changes its speed: at N = 16,384, d = 128, either
    peer timed right after cuDNN's kernel took 7-12 % longer than right after the other
    (benchmarks/results/tensor_core_clocks_h200_no_settle.log). So in each round a peer first runs SETTLE_MS
    of its own calls, untimed, and only then is timed, in the steady state of its own calls. Two times per
    call, medians over the rounds:

    * ``time_ms``, **queued**: calls back to back with the GPU kept busy. One call first, untimed; then
      events around ``burst`` calls; per call, the interval / burst. The host enqueues the next call
      while the GPU runs the last, so its own time is hidden whenever it is shorter than the GPU's: this
      is how a model's layers run, and how FlashAttention's benchmarks time (``torch.utils.benchmark``:
      many calls, one synchronisation). ``time_min_ms``, ``time_max_ms``: the fastest and slowest round.
    * ``latency_ms``, **one call alone**: the GPU idle, an event, the call, an event. The host's work
      before the launch (checks, allocations, the launch itself) is in the interval; on the H200 it also
      held 66 to 300 µs more than a queued call, for every peer, not explained (the README's stage 3).

    Each peer is called WARMUP times first; one call then sizes its ``burst`` (about BURST_MS) and its
    settling run. ``trace(round, name, ms)``, if given, is called after each burst with its time per call.
    Returns name -> {time_ms, time_min_ms, time_max_ms, reps (rounds), burst, latency_ms, rounds_ms (the
    queued time of each round, in round order)}."""
    clock = clock or CudaClock()
    names, burst, settle = list(peers), {}, {}
    for name, (fn, around) in peers.items():
        with around():
            calls(fn, WARMUP)
            clock.sync()
            once = max(clock.elapsed_ms(fn), 1e-3)
        burst[name] = min(MAX_BURST, max(MIN_BURST, math.ceil(BURST_MS / once)))
        settle[name] = math.ceil(SETTLE_MS / once)
    queued, alone = {name: [] for name in names}, {name: [] for name in names}
    for r in range(rounds):
        for name in round_order(names, r):
            fn, around = peers[name]
            with around():
                calls(fn, settle[name])  # untimed: the clock settles to this peer's power draw
                clock.sync()
                alone[name].append(clock.elapsed_ms(fn))  # the GPU idle (for the host's part) before the call
                fn()  # keeps the GPU busy while the host records the start event and enqueues the burst
                queued[name].append(clock.elapsed_ms(lambda: calls(fn, burst[name])) / burst[name])
                if trace:
                    trace(r, name, queued[name][-1])
    return {name: {"time_ms": statistics.median(queued[name]), "time_min_ms": min(queued[name]),
                   "time_max_ms": max(queued[name]), "reps": rounds, "burst": burst[name],
                   "latency_ms": statistics.median(alone[name]), "rounds_ms": queued[name]}
            for name in names}


def calls(fn, n: int) -> None:
    """``fn()`` n times, each result dropped at once (a burst holds no more memory than one call)."""
    for _ in range(n):
        fn()


def _xp(x):
    """The array module of ``x``: CuPy for CuPy arrays, else NumPy."""
    if type(x).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def naive_same_precision(q, k, v, *, causal: bool = False, rows=None):
    """Standard attention with S and P stored in the input dtype (CuPy on the GPU: cuBLAS products,
    S and P in HBM; NumPy on the CPU). q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv).

    It is the baseline of the benchmark ("naive CuPy") and, on a sample of ``rows`` (query
    indices), the "naive computation in the same precision" of FlashAttention's tolerance rule.
    Like a plain softmax, it gives NaN for a row that may attend no key (causal with Nq > Nk);
    the benchmark has Nq = Nk.
    """
    xp = _xp(q)
    n_q, n_k = q.shape[-2], k.shape[-2]
    query_rows = range(n_q) if rows is None else rows
    q = q if rows is None else q[..., xp.asarray(rows), :]  # (..., rows, d)
    S = xp.matmul(q, k.swapaxes(-1, -2))  # (..., Nq, Nk)  written to HBM
    S *= S.dtype.type(1.0 / math.sqrt(q.shape[-1]))
    if causal:
        xp.copyto(S, S.dtype.type(-np.inf), where=~allowed(query_rows, np.arange(n_k), n_q, n_k, xp=xp))
    P = S - S.max(axis=-1, keepdims=True)  # (..., Nq, Nk)  read S, write P
    del S
    xp.exp(P, out=P)
    P /= P.sum(axis=-1, keepdims=True, dtype=np.float32).astype(P.dtype)
    return xp.matmul(P, v)  # (..., Nq, dv)  read P


def check(o, q, k, v, *, causal: bool, rng, rows: int = CHECK_ROWS) -> dict:
    """The output ``o`` of q, k, v (B, H, N, d) on sampled rows of the first and last head, by the
    project's rule (module docstring). Returns ``ok``, ``max_rel_err`` and ``tolerance`` (the
    relative error the rule allowed, the smaller of the two heads')."""
    n_q = q.shape[-2]
    ok, worst, tolerance = True, 0.0, math.inf
    for b, h in sorted({(0, 0), (q.shape[0] - 1, q.shape[1] - 1)}):
        idx = np.sort(rng.choice(n_q, size=min(rows, n_q), replace=False))  # (rows,)
        host = [to_host64(x[b, h]) for x in (q, k, v)]  # (N, d) each: this head, on the host
        ref = reference_attention(*host, causal=causal, rows=idx)[0]  # (rows, dv) float64
        naive = naive_same_precision(q[b, h], k[b, h], v[b, h], causal=causal, rows=idx)
        verdict = within_tolerance(to_host64(o[b, h][_xp(o).asarray(idx)]), ref, np.dtype(q.dtype), to_host64(naive))
        ok, worst = ok and verdict.ok, max(worst, verdict.error)
        tolerance = min(tolerance, verdict.tolerance)
    return {"ok": ok, "max_rel_err": worst, "tolerance": tolerance}


def _peak_hook_class():
    import cupy

    class PeakMemory(cupy.cuda.MemoryHook):
        """Counts bytes taken from CuPy's pool while active; ``peak`` is the most held at once."""

        name = "PeakMemory"

        def __init__(self):
            self.live = 0
            self.peak = 0

        def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
            self.live += mem_size
            self.peak = max(self.peak, self.live)

        def free_postprocess(self, device_id, mem_size, mem_ptr, pmem_id):
            self.live -= mem_size

    return PeakMemory


def call_metered(fn, q, k, v, causal: bool, meter: str):
    """``(o, peak extra bytes)`` of one call; ``meter`` is 'cupy' or 'torch' (module docstring)."""
    import cupy

    if meter == "torch":
        import torch

        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = fn(q, k, v, causal)
        torch.cuda.synchronize()
        return cupy.from_dlpack(out), torch.cuda.max_memory_allocated() - base
    with _peak_hook_class()() as hook:
        o = fn(q, k, v, causal)
        cupy.cuda.Device().synchronize()
    return o, hook.peak


def measure(fn, q, k, v, causal: bool, rng, meter: str = "cupy") -> dict:
    """Check one implementation ``fn(q, k, v, causal) -> o`` on one input, then time it.

    Returns the measured fields of a row: status, times, peak_bytes, max_rel_err, tolerance.
    An implementation that runs out of memory gets status 'oom'; one that refuses the inputs
    (PyTorch's flash backend with float32) 'unsupported'; one that fails the check 'wrong (...)',
    and is not timed.
    """
    import cupy

    try:
        o, peak = call_metered(fn, q, k, v, causal, meter)
        verdict = check(o, q, k, v, causal=causal, rng=rng)
        del o
        res = {"peak_bytes": peak, "max_rel_err": verdict["max_rel_err"], "tolerance": verdict["tolerance"]}
        if not verdict["ok"]:
            return {**res, "status": f"wrong (error {verdict['max_rel_err']:.2e} > {verdict['tolerance']:.2e})"}
        return {**res, **time_call(lambda: fn(q, k, v, causal)), "status": "ok"}
    except Exception as exc:  # out of memory, or a backend that refuses these inputs
        if type(exc).__name__ == "OutOfMemoryError":
            return {"status": "oom"}
        if "No available kernel" in str(exc) or "not supported" in str(exc).lower():
            return {"status": "unsupported"}
        raise
    finally:
        cupy.get_default_memory_pool().free_all_blocks()
        if meter == "torch":
            import torch

            torch.cuda.empty_cache()


class CsvWriter:
    """Rows of :data:`FIELDS` (or of ``fields``), written and flushed one by one (a long run leaves
    what it measured); floats with 6 significant digits, missing fields empty."""

    def __init__(self, path, fields=FIELDS):
        self.fields = list(fields)
        self.file = open(path, "w", newline="") if path else None
        self.writer = csv.DictWriter(self.file, fieldnames=self.fields) if self.file else None
        if self.writer:
            self.writer.writeheader()

    def write(self, row: dict) -> None:
        unknown = set(row) - set(self.fields)
        if unknown:
            raise ValueError(f"row has fields outside the schema: {sorted(unknown)}")
        if self.writer:
            self.writer.writerow({f: f"{row[f]:.6g}" if isinstance(row.get(f), float) else row.get(f, "")
                                  for f in self.fields})
            self.file.flush()

    def close(self) -> None:
        if self.file:
            self.file.close()


def read_csv(path) -> list[dict]:
    """The rows of a CSV as dicts of strings."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
