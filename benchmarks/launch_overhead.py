"""The host's time per kernel launch: numba's dispatcher against a launch through the driver.

    python benchmarks/launch_overhead.py [CSV]      # on a GPU; default CSV benchmarks/results/launch_overhead_h200.csv

A small kernel (10 arguments, like v6's: five arrays and five scalars, one block of 32 threads) is
launched 2,000 times in a row and the host's wall time divided by 2,000: the GPU runs each launch in
a few µs, so the host is what is measured. Four ways, each on PyTorch tensors and on numba arrays:

    numba                 kernel[grid, block](*args): types the arguments, then launches
    numba, specialized    the same kernel compiled once for these types (kernel.specialize)
    driver                DriverKernel(...)(grid, block, smem, *args): packs the arguments, cuLaunchKernel
    driver, bound         DriverKernel.bind(...) once, then only cuLaunchKernel
"""

import sys
import time
from pathlib import Path

import numpy as np

REPS = 2000


def main(csv_path: str) -> list[dict]:
    import torch
    from numba import cuda
    from numba.cuda import types

    from tinyflash.gpu.driver_launch import driver_kernel
    from tinyflash.measure.harness import environment
    from tinyflash.plots.common import write_csv

    @cuda.jit
    def touch(a, b, c, d, e, n, m, scale, flag, group):  # like v6's arguments; writes one element
        if cuda.grid(1) == 0 and n > 0:
            e[0] = scale * (a[0] + b[0] + c[0] + d[0]) + (m + group if flag else 0)

    env = environment()
    floats = types.Array(types.float32, 1, "C")
    signature = (floats,) * 5 + (types.int64, types.int64, types.float32, types.boolean, types.int64)
    tensors = [torch.ones(1024, device="cuda") for _ in range(5)]
    inputs = {"PyTorch tensors": tensors, "numba arrays": [cuda.as_cuda_array(t) for t in tensors]}
    scalars = (1024, 3, np.float32(0.5), True, 1)
    rows = []
    for label, arrays in inputs.items():
        args = (*arrays, *scalars)
        special = touch.specialize(*args)
        kernel = driver_kernel(touch, signature)
        bound = kernel.bind((1,), 32, 0, *args)
        ways = {"numba": lambda: touch[1, 32](*args), "numba, specialized": lambda: special[1, 32](*args),
                "driver": lambda: kernel((1,), 32, 0, *args), "driver, bound": bound}
        for way, launch in ways.items():
            launch()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(REPS):
                launch()
            host = time.perf_counter() - start
            torch.cuda.synchronize()
            rows.append({**env, "benchmark": "launch-overhead", "arrays": label, "launch": way, "reps": REPS,
                         "host_us_per_launch": round(1e6 * host / REPS, 2)})
            print(f"{label:16s} {way:20s} {1e6 * host / REPS:8.1f} µs per launch (host)", flush=True)
    print(f"{env['device']}, numba-cuda {env['numba_cuda']}, torch {env['torch']}, {env['date']}")
    write_csv(Path(csv_path), rows)
    return rows


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/launch_overhead_h200.csv")
