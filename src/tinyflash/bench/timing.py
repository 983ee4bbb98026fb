"""Timing peers that do the same work: in interleaved rounds, each settled first, queued and alone.

:func:`time_interleaved` times functions ``peers``: name -> (fn, around) in rounds; every round times
each of them in turn (:func:`round_order`), so that a drift of the GPU (its temperature, other loads)
falls on all of them alike. ``around()`` is a context entered before a peer's calls, outside the
timed interval (SDPA's choice of backend, a setting a program makes once).

At large sizes an H200 runs at its power limit and sets its clock to stay there, so what ran just
before a kernel changes its speed. So in each round a peer first runs SETTLE_MS of its own calls,
untimed, and only then is timed, in the steady state of its own calls (docs/measuring.md). Two
times per call, medians over the rounds:

* ``time_ms``, **queued**: calls back to back, the GPU kept busy. One call first, untimed; then
  events around ``burst`` calls; per call, the interval / burst. The host enqueues the next call
  while the GPU runs the last, so its own time is hidden whenever it is shorter than the GPU's: how
  a model's layers run, and how FlashAttention's benchmarks time (``torch.utils.benchmark``).
  ``time_min_ms``, ``time_max_ms``: the fastest and slowest round.
* ``latency_ms``, **one call alone**: the GPU idle, an event, the call, an event. The host's work
  before the launch (checks, allocations, the launch itself) is in the interval.

The clock is CUDA events on the default stream (:class:`CudaClock`); the tests pass a toy clock.
"""

from __future__ import annotations

import math
import statistics

# rounds; a queued burst lasts about BURST_MS (MIN_BURST to MAX_BURST calls); each peer runs SETTLE_MS of its own
# calls untimed before it is timed in a round; WARMUP untimed calls first (compilation, caches, allocators)
ROUNDS, BURST_MS, MIN_BURST, MAX_BURST, SETTLE_MS, WARMUP = 15, 10.0, 2, 50, 200.0, 2


class CudaClock:
    """The GPU's clock: CUDA events on the default stream (CuPy's)."""

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


def calls(fn, n: int) -> None:
    """``fn()`` n times, each result dropped at once (a burst holds no more memory than one call)."""
    for _ in range(n):
        fn()


def round_order(names: list, r: int) -> list:
    """The order of the peers in round r: rotated by r, and reversed in every other cycle of rotations, so
    that each peer leads some rounds and follows each of the others in some."""
    order = names[r % len(names):] + names[:r % len(names)]
    return order[::-1] if (r // len(names)) % 2 else order


def time_interleaved(peers: dict, *, rounds: int = ROUNDS, clock=None, trace=None) -> dict:
    """Time ``peers`` (name -> (fn, around)) in interleaved rounds (module docstring).

    Each peer is called WARMUP times first; one call then sizes its ``burst`` (about BURST_MS) and its
    settling run. ``trace(round, name, ms)``, if given, is called after each burst with its time per call.
    Returns name -> {time_ms, time_min_ms, time_max_ms, rounds, burst, latency_ms, rounds_ms (the queued
    time of each round, in round order)}."""
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
                   "time_max_ms": max(queued[name]), "rounds": rounds, "burst": burst[name],
                   "latency_ms": statistics.median(alone[name]), "rounds_ms": queued[name]}
            for name in names}


def against_baseline(times: dict, baseline) -> dict:
    """name -> {vs_baseline, vs_baseline_q1, vs_baseline_q3, latency_vs_baseline}: the ``baseline`` peer's
    time over each peer's (above 1: faster), as the ratio of the medians, the quartiles of the rounds'
    ratios, and the ratio of the single calls' medians. Empty when the baseline was not timed."""
    base = times.get(baseline)
    if base is None:
        return {}
    out = {}
    for name, t in times.items():
        per_round = [b / x for b, x in zip(base["rounds_ms"], t["rounds_ms"], strict=True)]
        q1, _, q3 = statistics.quantiles(per_round, n=4) if len(per_round) > 1 else per_round * 3
        out[name] = {"vs_baseline": base["time_ms"] / t["time_ms"], "vs_baseline_q1": q1, "vs_baseline_q3": q3,
                     "latency_vs_baseline": base["latency_ms"] / t["latency_ms"]}
    return out
