"""Does the GPU's clock explain a peer's slow rounds? The tensor-cores benchmark's interleaved rounds
(``time_interleaved``: each round every peer in turn, settled, then queued calls), with the SM clock, the
power draw and NVML's reasons for a lowered clock sampled every millisecond or so in another process.

    PYTHONPATH=src python benchmarks/tensor_core_clocks.py [--n 16384] [--d 128] [--dtype float16] [--causal]
                                                           [--rounds 20] [--csv FILE]

The peers are the tensor-cores benchmark's (``tinyflash.bench.suites.tensor_core_peers``: SDPA's flash and
cuDNN backends, v6, v5), on that benchmark's inputs (``runner.make_inputs``), each checked once before it
is timed. For each round and peer: its time per call, and the mean SM clock, mean power and the
clock-lowering reasons NVML reported while its burst ran (the burst's interval, placed on the host's
monotonic clock by its end: the host waits for the end event, then reads the clock). Then per peer: the
median time, the median clock, and the median time of the rounds at the highest clock seen. The reasons
are NVML's ``clocksEventReasons`` bits, named below; 'sw power cap' means the board held its power limit
by lowering the clock. It prints; with ``--csv`` it also writes one row per round and peer. It reads the
clock only: it changes no setting of the GPU. Needs a CUDA GPU, CuPy, PyTorch and pynvml (nvidia-ml-py).
"""

import argparse
import csv
import multiprocessing as mp
import os
import statistics
import tempfile
import time

REASONS = {0x4: "sw power cap", 0x8: "hw slowdown", 0x20: "sw thermal", 0x40: "hw thermal", 0x80: "power brake"}
CSV_FIELDS = ["device", "date", "numba_cuda", "torch", "commit", "dtype", "causal", "n", "d", "round", "peer",
              "ms_per_call", "sm_mhz", "watts", "reasons"]


def sample(path, stop, period_s=0.001):
    """Write 'monotonic_s sm_mhz power_w reasons' lines to ``path`` until ``stop`` is set (another process)."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    with open(path, "w") as f:
        while not stop.is_set():
            mhz = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
            watts = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000
            f.write(f"{time.monotonic():.6f} {mhz} {watts:.1f} {reasons(handle)}\n")
            time.sleep(period_s)


def peer_name(peer) -> str:
    """'impl/variant', or 'impl' for a peer without a variant (torch_flash, tinyflash/v6, ...)."""
    return f"{peer.impl}/{peer.variant}" if peer.variant else peer.impl


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Run from the repository root with PYTHONPATH=src.")
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--impls", nargs="+", default=["torch_flash", "torch_cudnn", "tinyflash/v6"],
                    help="peers, impl or impl/variant (default: flash, cuDNN, v6)")
    ap.add_argument("--csv", help="also write one row per round and peer here")
    ap.add_argument("--seed", type=int, default=0, help="random seed of the inputs")
    args = ap.parse_args(argv)
    os.environ.setdefault("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "0")  # everything runs on the default stream

    import numpy as np

    from tinyflash.bench import runner
    from tinyflash.bench.record import environment
    from tinyflash.bench.suites import BENCHMARKS, tensor_core_peers
    from tinyflash.bench.timing import time_interleaved

    env = environment()
    bench = BENCHMARKS["tensor-cores"]
    (point,) = runner.points(bench, {"dtype": [args.dtype], "d": [args.d], "causal": [args.causal], "n": [args.n]})
    rng = np.random.default_rng(args.seed)
    x = {**runner.make_inputs(bench, point, args.seed), "rng": rng}
    chosen = {}
    for peer in tensor_core_peers(point):
        name = peer_name(peer)
        if name not in args.impls or args.dtype not in peer.dtypes:
            continue
        fields, fn = runner.try_peer(bench, peer, x, rng)  # made, run once and checked, as the benchmark does
        if fn is None:
            print(f"{name}: {fields['status']}, not timed")
            continue
        chosen[name] = (fn, peer.around)
    marks = []  # (round, peer, ms per call, burst interval's end on the monotonic clock)
    spawn = mp.get_context("spawn")  # a fresh interpreter: nothing of this process's CUDA state
    stop = spawn.Event()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "clock_samples.txt")
        sampler = spawn.Process(target=sample, args=(path, stop), daemon=True)
        sampler.start()
        time.sleep(1.0)  # the sampler's first lines
        times = time_interleaved(chosen, rounds=args.rounds,
                                 trace=lambda r, name, ms: marks.append((r, name, ms, time.monotonic())))
        stop.set()
        sampler.join()
        with open(path) as f:
            samples = [tuple(float(v) for v in line.split()) for line in f]
    bursts = {name: t["burst"] for name, t in times.items()}
    print(f"{env['device']} torch {env['torch']} commit {env['commit'] or '-'} {env['date']}; {args.dtype} B=1 "
          f"H={point['heads']} N={args.n} d={args.d} causal={args.causal}; {len(samples)} samples")
    print(f"{'round':>5} {'peer':14} {'ms/call':>8} {'SM MHz':>7} {'W':>6}  reasons")
    per_peer, rows = {name: [] for name in chosen}, []
    for r, name, ms, end in marks:
        start = end - ms * bursts[name] / 1000
        inside = [s for s in samples if start <= s[0] <= end]
        mhz = statistics.mean(s[1] for s in inside) if inside else float("nan")
        watts = statistics.mean(s[2] for s in inside) if inside else float("nan")
        bits = 0
        for s in inside:
            bits |= int(s[3])
        named = ", ".join(text for bit, text in REASONS.items() if bits & bit) or "-"
        per_peer[name].append((ms, mhz, watts))
        rows.append({**{k: env[k] for k in ("device", "date", "numba_cuda", "torch", "commit")}, "dtype": args.dtype,
                     "causal": args.causal, "n": args.n, "d": args.d, "round": r, "peer": name,
                     "ms_per_call": f"{ms:.6g}", "sm_mhz": f"{mhz:.0f}", "watts": f"{watts:.1f}", "reasons": named})
        print(f"{r:5d} {name:14} {ms:8.3f} {mhz:7.0f} {watts:6.0f}  {named}")
    measured = [m for peer_rows in per_peer.values() for _, m, _ in peer_rows if m == m]  # rounds with samples
    top = max(measured) if measured else float("nan")
    print(f"\nper peer: median ms, median SM MHz, median W; median ms of the rounds at {top:.0f} MHz (the highest)")
    for name, peer_rows in per_peer.items():
        ms, mhz, watts = ([row[i] for row in peer_rows if row[1] == row[1]] for i in range(3))  # rounds with samples
        if not ms:
            print(f"  {name:14} no clock samples during its bursts")
            continue
        at_top = [t for t, m in zip(ms, mhz) if m >= top - 1]
        print(f"  {name:14} {statistics.median(ms):8.3f} ms  {statistics.median(mhz):6.0f} MHz  "
              f"{statistics.median(watts):5.0f} W   at the top clock: "
              f"{statistics.median(at_top) if at_top else float('nan'):8.3f} ms ({len(at_top)} rounds)")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
