"""How much of a call of ``tensor_core_attention`` is the host's: the wrapper against the kernel alone.

    python benchmarks/tensor_core_host_overhead.py [N]      # default N = 4096; float16, B=1, H=32, d=128

The benchmark (``python -m tinyflash.bench tensor-cores``) times each call between two CUDA events,
on an idle GPU: whatever the host does before the launch (checks, array conversions, numba's
dispatch) counts. This prints the median of the whole call, of the bare launch of the compiled
kernel on arrays made beforehand with its arguments packed once (``DriverKernel.bind``), and the
host functions that took the most time (cProfile).
"""

import cProfile
import math
import pstats
import sys

import numpy as np


def main(n: int) -> None:
    import torch

    from tinyflash.core.online_softmax import LOG2E
    from tinyflash.forward.kernels import v6_tensor_cores as v6
    from tinyflash.forward.tensor_cores import tensor_core_attention
    from tinyflash.gpu.driver_launch import driver_kernel
    from tinyflash.measure.harness import environment, time_call

    env, d, heads = environment(), 128, 32
    q, k, v = (torch.randn((1, heads, n, d), device="cuda", dtype=torch.float16) for _ in range(3))  # (B, H, N, d)
    whole = time_call(lambda: tensor_core_attention(q, k, v))["time_ms"]

    cfg = v6.default_tiling(d, False)
    o, lse = torch.empty_like(q), torch.empty((heads * n,), device="cuda", dtype=torch.float32)
    args = (q, k, v, o, lse, n, n, np.float32(LOG2E / math.sqrt(d)), False, 1)  # flash_fwd's, v6.SIGNATURE
    kernel = driver_kernel(v6.make_kernel(cfg, "float16"), v6.SIGNATURE, cfg.smem_bytes)
    bare = time_call(kernel.bind((-(-n // cfg.BR), heads), cfg.NT, cfg.smem_bytes, *args))["time_ms"]  # packed once
    print(f"host overhead: {env['device']} {env['date']}; float16 B=1 H={heads} N={n} d={d}, tiling {cfg}")
    print(f"  tensor_core_attention: {whole:.3f} ms median;  the compiled kernel launched alone: {bare:.3f} ms;  "
          f"difference {1000 * (whole - bare):.0f} us")

    profile = cProfile.Profile()
    torch.cuda.synchronize()
    profile.enable()
    for _ in range(200):
        tensor_core_attention(q, k, v)
    torch.cuda.synchronize()
    profile.disable()
    stats = pstats.Stats(profile, stream=sys.stdout)
    print("  cProfile of 200 calls (GPU work queues behind the host; host time per call = total / 200):")
    stats.sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4096)
