"""Does the GPU's clock explain a peer's slow rounds? The tensor-cores benchmark's interleaved rounds
(``time_interleaved``: each round every peer in turn, queued calls), with the SM clock, the power draw
and NVML's reasons for a lowered clock sampled every millisecond or so in another process.

    python benchmarks/tensor_core_clocks.py [--n 16384] [--d 128] [--dtype float16] [--causal] [--rounds 20]

For each round and peer: its time per call, and the mean SM clock, mean power and the clock-lowering
reasons NVML reported while its burst ran (the burst's interval, placed on the host's monotonic clock by
its end: the host waits for the end event, then reads the clock). Then per peer: the median time, the
median clock, and the median time of the rounds at the highest clock seen. The reasons are NVML's
``clocksEventReasons`` bits, named below; 'sw power cap' means the board held its power limit by lowering
the clock. Reads the clock only: it changes no setting of the GPU.
"""

import argparse
import multiprocessing as mp
import statistics
import time

REASONS = {0x4: "sw power cap", 0x8: "hw slowdown", 0x20: "sw thermal", 0x40: "hw thermal", 0x80: "power brake"}


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


def main():
    import torch

    from tinyflash.measure.bench_tensor_cores import peers
    from tinyflash.measure.harness import environment, time_interleaved

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--impls", nargs="+", default=["torch_flash", "torch_cudnn", "tinyflash/v6"],
                    help="peers, impl or impl/variant (default: flash, cuDNN, v6)")
    args = ap.parse_args()
    env = environment()
    q, k, v = (torch.randn((1, 32, args.n, args.d), device="cuda").to(getattr(torch, args.dtype)) for _ in range(3))
    chosen = {}
    for impl, variant, fn, dtypes, around in peers():
        name = f"{impl}/{variant}" if variant else impl
        if name in args.impls and args.dtype in dtypes:
            chosen[name] = ((lambda fn: lambda: fn(q, k, v, args.causal))(fn), around)
    marks = []  # (round, peer, ms per call, burst interval's end on the monotonic clock)
    spawn = mp.get_context("spawn")  # a fresh interpreter: nothing of this process's CUDA state
    stop, path = spawn.Event(), "/tmp/tensor_core_clocks.samples"
    sampler = spawn.Process(target=sample, args=(path, stop), daemon=True)
    sampler.start()
    time.sleep(1.0)  # the sampler's first lines
    times = time_interleaved(chosen, rounds=args.rounds,
                             trace=lambda r, name, ms: marks.append((r, name, ms, time.monotonic())))
    stop.set()
    sampler.join()
    samples = [tuple(float(x) for x in line.split()) for line in open(path)]
    bursts = {name: t["burst"] for name, t in times.items()}
    print(f"{env['device']} torch {env['torch']} {env['date']}; {args.dtype} B=1 H=32 N={args.n} d={args.d} "
          f"causal={args.causal}; {len(samples)} samples")
    print(f"{'round':>5} {'peer':14} {'ms/call':>8} {'SM MHz':>7} {'W':>6}  reasons")
    per_peer = {name: [] for name in chosen}
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
        print(f"{r:5d} {name:14} {ms:8.3f} {mhz:7.0f} {watts:6.0f}  {named}")
    top = max(m for rows in per_peer.values() for _, m, _ in rows if m == m)
    print(f"\nper peer: median ms, median SM MHz, median W; median ms of the rounds at {top:.0f} MHz (the highest)")
    for name, rows in per_peer.items():
        ms, mhz, watts = ([row[i] for row in rows if row[1] == row[1]] for i in range(3))  # rounds with samples
        at_top = [t for t, m in zip(ms, mhz) if m >= top - 1]
        print(f"  {name:14} {statistics.median(ms):8.3f} ms  {statistics.median(mhz):6.0f} MHz  "
              f"{statistics.median(watts):5.0f} W   at the top clock: "
              f"{statistics.median(at_top) if at_top else float('nan'):8.3f} ms ({len(at_top)} rounds)")


if __name__ == "__main__":
    main()
