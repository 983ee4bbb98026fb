"""How much of a call of ``tensor_core_attention`` is the host's: the wrapper against the kernel alone,
and the same for SDPA's flash backend, the benchmark's yardstick.

    python benchmarks/tensor_core_host_overhead.py [N]      # default N = 4096; float16, B=1, H=32

The benchmark (``python -m tinyflash.bench tensor-cores``) times each call between two CUDA events,
on an idle GPU: whatever the host does before the launch (checks, array conversions, the launch
itself) counts, for us and for SDPA alike. For d = 64 and 128, causal or not, this prints the median
of the whole call and of the kernel alone: ours launched from arguments packed once
(``DriverKernel.bind``), SDPA's replayed from a CUDA graph. Then the host time per call, read off
a loop of calls on a problem so small that the GPU waits for the host (N = 16), and the host
functions that took the most time in our call (cProfile).
"""

import cProfile
import math
import pstats
import sys
import time

import numpy as np

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

    key = tc.call_key(q, k, v, False, None)
    plan = tc._PLANS[key]
    prob, launch = plan.prob, plan.launch
    o, lse = empty(q, prob.out_shape), empty(q, prob.lse_shape, tc.FLOAT32)
    kernel, arrays = launch.kernel, (q, k, v, o, lse)
    values = param_values(kernel.argument_types, (*arrays, *launch.scalars), kernel._sizes)
    address = kernel._params.pack(values)
    steps = {"call_key": lambda: tc.call_key(q, k, v, False, None),
             "plan lookup (dict)": lambda: tc._PLANS.get(key),
             "dense(q)": lambda: dense(q),
             "empty(q, out_shape)": lambda: empty(q, prob.out_shape),
             "empty(q, lse_shape, float32)": lambda: empty(q, prob.lse_shape, tc.FLOAT32),
             "torch.empty_like(q)": lambda: torch.empty_like(q),
             "param_values (5 arrays, 6 scalars)": lambda: param_values(kernel.argument_types, (*arrays, *launch.scalars),
                                                                         kernel._sizes),
             "pack (struct.pack_into)": lambda: kernel._params.pack(values),
             "cuLaunchKernel (DriverKernel._launch)": lambda: kernel._launch(launch.grid, launch.threads,
                                                                            launch.smem_bytes, address),
             "the whole call": lambda: tc.tensor_core_attention(q, k, v)}
    out = {}
    for name, fn in steps.items():
        out[name] = 1e6 * statistics.median(timeit.repeat(fn, number=2000, repeat=7)) / 2000
        torch.cuda.synchronize()
    return out


def main(n: int) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tinyflash.core.online_softmax import LOG2E
    from tinyflash.forward.kernels import v6_tensor_cores as v6
    from tinyflash.forward.tensor_cores import tensor_core_attention
    from tinyflash.gpu.driver_launch import driver_kernel
    from tinyflash.measure.harness import environment, time_call

    env = environment()
    print(f"host overhead: {env['device']} torch {env['torch']} {env['date']}; float16 B=1 H={HEADS} N={n}")
    for d in (64, 128):
        q, k, v = (torch.randn((1, HEADS, n, d), device="cuda", dtype=torch.float16) for _ in range(3))  # (B, H, N, d)
        for causal in (False, True):
            whole = time_call(lambda: tensor_core_attention(q, k, v, causal=causal))["time_ms"]
            cfg = v6.default_tiling(d, causal, n)  # the tiling tensor_core_attention picks for these inputs
            o, lse = torch.empty_like(q), torch.empty((HEADS * n,), device="cuda", dtype=torch.float32)
            group = v6.head_group(cfg, n, HEADS, 1, causal)
            args = (q, k, v, o, lse, n, n, np.float32(LOG2E / math.sqrt(d)), causal, 1, group)  # v6.SIGNATURE's
            kernel = driver_kernel(v6.kernel_for(cfg, "float16", group), v6.SIGNATURE, cfg.smem_bytes)
            bare = time_call(kernel.bind((-(-n // cfg.BR), HEADS), cfg.NT, cfg.smem_bytes, *args))["time_ms"]

            def flash():
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # as the benchmark calls it
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            flash_ms = time_call(flash)["time_ms"]
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # the backend chosen once, outside the timed call
                flash_bare_call = time_call(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))["time_ms"]
                stream = torch.cuda.Stream()
                with torch.cuda.stream(stream):
                    for _ in range(3):
                        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            flash_graph = time_call(graph.replay)["time_ms"]
            print(f"  d={d:3} causal={causal!s:5}  tinyflash: call {1e3 * whole:6.1f} us, kernel alone {1e3 * bare:6.1f} us "
                  f"(host {1e3 * (whole - bare):5.1f});  SDPA flash: call {1e3 * flash_ms:6.1f} us (backend set outside: "
                  f"{1e3 * flash_bare_call:6.1f}), graph {1e3 * flash_graph:6.1f} us (host {1e3 * (flash_ms - flash_graph):5.1f});  "
                  f"kernel alone, flash / ours: {flash_graph / bare:.3f}", flush=True)
            del o, lse, graph

    small = [torch.randn((1, HEADS, 16, 128), device="cuda", dtype=torch.float16) for _ in range(3)]
    ours = host_us_per_call(lambda: tensor_core_attention(*small))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        theirs = host_us_per_call(lambda: F.scaled_dot_product_attention(*small))
    print(f"  host time per call (N = 16, the GPU waits for the host): tensor_core_attention {ours:.1f} us, "
          f"SDPA flash {theirs:.1f} us (backend set outside the loop)")

    print("  the steps of a call on those inputs, each timed alone (us, median of 7 runs of 2000):")
    for name, us in host_steps(*small).items():
        print(f"    {name:<44} {us:6.2f}")

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
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4096)
