"""How much of a call of ``tensor_core_attention`` is the host's: the wrapper against the kernel alone,
and the same for SDPA's flash backend, the benchmark's yardstick.

    PYTHONPATH=src python benchmarks/tensor_core_host_overhead.py [N] [--rounds R]   # N = 4096; float16, B=1, H=32

For d = 64 and 128, causal or not, four peers are timed together in interleaved rounds
(``tinyflash.bench.timing.time_interleaved``, as the benchmark times): our whole call; our kernel alone,
launched from arguments packed once (``DriverKernel.bind``, the launch the call makes); SDPA flash's call,
its backend chosen outside the timed interval (as the benchmark's peer); SDPA flash replayed from a CUDA
graph. Each gets two medians: queued calls, where the host's work hides behind the GPU's, and one call
alone, where it does not; the difference between a call and its kernel alone, one call at a time, is the
host's part. Then the host time per call, read off a loop of calls on a problem so small that the GPU
waits for the host (N = 16); the steps of our call, each timed alone; and the host functions that took
the most time in our call (cProfile). Needs a CUDA GPU, CuPy and PyTorch.
"""

import argparse
import cProfile
import os
import pstats
import sys
import time

HEADS = 32


def host_us_per_call(fn, calls: int = 2000) -> float:
    """Wall-clock µs per call of ``fn`` over ``calls`` calls, the GPU synchronised only at the end."""
    import torch

    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return 1e6 * (time.perf_counter() - start) / calls


def host_steps(q, k, v) -> dict:
    """µs of each step of ``tensor_core_attention(q, k, v)`` on the driver's path, each timed alone."""
    import statistics
    import timeit

    import torch

    from tinyflash.forward import tensor_cores as tc
    from tinyflash.gpu.arrays import dense, empty
    from tinyflash.gpu.driver_launch import param_values
    from tinyflash.host.inputs import FLOAT32
    from tinyflash.host.plans import PLANS, call_key

    tc.tensor_core_attention(q, k, v)  # makes and keeps the call's plan
    key = ("tensor_core_attention", None, None, *call_key(q, k, v, False, None))  # as host.forward keys it
    plan = PLANS.get(key)
    prob, launch = plan.prob, plan.launch  # launch: v6's GridLaunch, sized for these shapes
    o, lse = empty(q, prob.out_shape), empty(q, prob.lse_shape, FLOAT32)
    kernel, arrays = launch.kernel, (q, k, v, o, lse)
    values = param_values(kernel.argument_types, (*arrays, *launch.scalars), kernel._sizes)
    address = kernel._params.pack(values)
    steps = {"call_key": lambda: call_key(q, k, v, False, None),
             "plan lookup (PLANS.get)": lambda: PLANS.get(key),
             "dense(q)": lambda: dense(q),
             "empty(q, out_shape)": lambda: empty(q, prob.out_shape),
             "empty(q, lse_shape, float32)": lambda: empty(q, prob.lse_shape, FLOAT32),
             "torch.empty_like(q)": lambda: torch.empty_like(q),
             f"param_values ({len(arrays)} arrays, {len(launch.scalars)} scalars)":
                 lambda: param_values(kernel.argument_types, (*arrays, *launch.scalars), kernel._sizes),
             "pack (struct.pack_into)": lambda: kernel._params.pack(values),
             "cuLaunchKernel (DriverKernel._launch)": lambda: kernel._launch(launch.grid, launch.threads,
                                                                            launch.smem_bytes, address),
             "the whole call": lambda: tc.tensor_core_attention(q, k, v)}
    out = {}
    for name, fn in steps.items():
        out[name] = 1e6 * statistics.median(timeit.repeat(fn, number=2000, repeat=7)) / 2000
        torch.cuda.synchronize()
    return out


def peers(q, k, v, causal: bool) -> tuple[dict, tuple]:
    """name -> (fn, around) for ``time_interleaved``: our call, our kernel alone, SDPA flash's call and graph;
    and what must live as long as they do (the bound launch's output arrays, the graph)."""
    from contextlib import nullcontext

    import torch
    import torch.nn.functional as F

    from tinyflash.bench.peers import sdpa_backend
    from tinyflash.forward import tensor_cores as tc
    from tinyflash.host.forward import plan_call

    o, lse = torch.empty_like(q), torch.empty(q.shape[:-1], device=q.device, dtype=torch.float32)
    launch = plan_call(tc.TENSOR_CORES, q, k, v, causal, None).launch  # the GridLaunch a call of these shapes makes
    # GridLaunch's call passes the arrays, then its scalars: packed here once instead of at every call
    bare = launch.kernel.bind(launch.grid, launch.threads, launch.smem_bytes, q, k, v, o, lse, *launch.scalars)
    flash = sdpa_backend("flash")
    with flash():  # the backend chosen once, outside the capture, as for the eager calls
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for _ in range(3):  # warm-up on a side stream, as CUDA graph capture asks
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return {"tinyflash call": (lambda: tc.tensor_core_attention(q, k, v, causal=causal), nullcontext),
            "tinyflash kernel alone": ((lambda: (bare(), o)), nullcontext),
            "SDPA flash call": (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), flash),
            "SDPA flash graph": (graph.replay, nullcontext)}, (o, lse, graph)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Run from the repository root with PYTHONPATH=src.")
    ap.add_argument("n", type=int, nargs="?", default=4096, help="Nq = Nk (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per configuration (default: %(default)s)")
    args = ap.parse_args(argv)
    os.environ.setdefault("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "0")  # everything runs on the default stream
    n = args.n

    import torch
    import torch.nn.functional as F

    from tinyflash.bench.peers import sdpa_backend
    from tinyflash.bench.record import environment
    from tinyflash.bench.timing import time_interleaved
    from tinyflash.forward.tensor_cores import tensor_core_attention

    env = environment()
    print(f"host overhead: {env['device']} torch {env['torch']} commit {env['commit'] or '-'} {env['date']}; "
          f"float16 B=1 H={HEADS} N={n}; median µs over {args.rounds} interleaved rounds, queued / one call alone")
    for d in (64, 128):
        q, k, v = (torch.randn((1, HEADS, n, d), device="cuda", dtype=torch.float16) for _ in range(3))  # (B, H, N, d)
        for causal in (False, True):
            timed, keep = peers(q, k, v, causal)
            t = time_interleaved(timed, rounds=args.rounds)
            us = {name: (1e3 * r["time_ms"], 1e3 * r["latency_ms"]) for name, r in t.items()}
            ours, bare = us["tinyflash call"], us["tinyflash kernel alone"]
            flash, graph = us["SDPA flash call"], us["SDPA flash graph"]
            print(f"  d={d:3} causal={causal!s:5}  tinyflash: call {ours[0]:7.1f} / {ours[1]:7.1f}, kernel alone "
                  f"{bare[0]:7.1f} / {bare[1]:7.1f} (host, alone: {ours[1] - bare[1]:5.1f});  SDPA flash: call "
                  f"{flash[0]:7.1f} / {flash[1]:7.1f}, graph {graph[0]:7.1f} / {graph[1]:7.1f} (host, alone: "
                  f"{flash[1] - graph[1]:5.1f});  kernel alone, flash graph / ours, queued: {graph[0] / bare[0]:.3f}",
                  flush=True)
            del timed, keep
        del q, k, v
        torch.cuda.empty_cache()

    small = [torch.randn((1, HEADS, 16, 128), device="cuda", dtype=torch.float16) for _ in range(3)]
    ours = host_us_per_call(lambda: tensor_core_attention(*small))
    with sdpa_backend("flash")():
        theirs = host_us_per_call(lambda: F.scaled_dot_product_attention(*small))
    print(f"  host time per call (N = 16, the GPU waits for the host): tensor_core_attention {ours:.1f} µs, "
          f"SDPA flash {theirs:.1f} µs (backend set outside the loop)")

    print("  the steps of a call on those inputs, each timed alone (µs, median of 7 runs of 2000):")
    for name, step_us in host_steps(*small).items():
        print(f"    {name:<44} {step_us:6.2f}")

    q, k, v = (torch.randn((1, HEADS, n, 128), device="cuda", dtype=torch.float16) for _ in range(3))
    profile = cProfile.Profile()
    torch.cuda.synchronize()
    profile.enable()
    for _ in range(200):
        tensor_core_attention(q, k, v)
    torch.cuda.synchronize()
    profile.disable()
    stats = pstats.Stats(profile, stream=sys.stdout)
    print("  cProfile of 200 calls at d = 128 (GPU work queues behind the host; host time per call = total / 200):")
    stats.sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
