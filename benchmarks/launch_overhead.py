"""The host's time per kernel launch: numba's dispatcher against a launch through the driver.

    PYTHONPATH=src python benchmarks/launch_overhead.py [CSV]    # default CSV figures/data/launch_overhead_h200.csv

A small kernel (10 arguments, like v6's: five arrays and five scalars, one block of 32 threads) is
launched 2,000 times in a row and the host's wall time divided by 2,000: the GPU runs each launch in
a few µs, so the host is what is measured. Four ways, each on PyTorch tensors and on numba arrays:

    numba                 kernel[grid, block](*args): types the arguments, then launches
    numba, specialized    the same kernel compiled once for these types (kernel.specialize)
    driver                DriverKernel(...)(grid, block, smem, *args): packs the arguments, cuLaunchKernel
    driver, bound         DriverKernel.bind(...) once, then only cuLaunchKernel

The arguments are named once (``DriverKernel.arguments``, the kernel's parameter order), as the host
wrappers pass them. One row per way and kind of array, with the device, the versions and the date
(columns :data:`FIELDS`). Needs a CUDA GPU and PyTorch.
"""

import argparse
import time
from pathlib import Path

import numpy as np

REPS = 2000
FIELDS = ["date", "numpy", "cupy", "device", "numba_cuda", "torch", "arrays", "launch", "reps", "host_us_per_launch"]
DEFAULT_CSV = Path(__file__).resolve().parents[1] / "figures" / "data" / "launch_overhead_h200.csv"


def main(csv_path) -> list[dict]:
    import torch
    from numba import cuda
    from numba.cuda import types

    from tinyflash.bench.record import CsvWriter, environment
    from tinyflash.gpu.driver_launch import driver_kernel

    @cuda.jit
    def touch(a, b, c, d, e, n, m, scale, flag, group):  # like v6's arguments; writes one element
        if cuda.grid(1) == 0 and n > 0:
            e[0] = scale * (a[0] + b[0] + c[0] + d[0]) + (m + group if flag else 0)

    env = environment(device=torch.cuda.get_device_name())
    floats = types.Array(types.float32, 1, "C")
    signature = (floats,) * 5 + (types.int64, types.int64, types.float32, types.boolean, types.int64)
    tensors = [torch.ones(1024, device="cuda") for _ in range(5)]
    inputs = {"PyTorch tensors": tensors, "numba arrays": [cuda.as_cuda_array(t) for t in tensors]}
    scalars = {"n": 1024, "m": 3, "scale": np.float32(0.5), "flag": True, "group": 1}
    kernel = driver_kernel(touch, signature)  # compiled once for the signature, like v6's
    writer, rows = CsvWriter(csv_path, fields=FIELDS), []
    for label, arrays in inputs.items():
        args = kernel.arguments({**dict(zip("abcde", arrays)), **scalars})  # in touch's parameter order
        special = touch.specialize(*args)
        bound = kernel.bind((1,), 32, 0, *args)
        ways = {"numba": lambda: touch[1, 32](*args), "numba, specialized": lambda: special[1, 32](*args),
                "driver": lambda: kernel((1,), 32, 0, *args), "driver, bound": bound}
        for way, launch in ways.items():
            launch()  # compiles (numba) and loads the kernel: not timed
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(REPS):
                launch()
            host = time.perf_counter() - start
            torch.cuda.synchronize()
            row = {**{k: env[k] for k in FIELDS if k in env}, "arrays": label, "launch": way, "reps": REPS,
                   "host_us_per_launch": round(1e6 * host / REPS, 2)}
            writer.write(row)
            rows.append(row)
            print(f"{label:16s} {way:20s} {row['host_us_per_launch']:8.1f} µs per launch (host)", flush=True)
    writer.close()
    print(f"{env['device']}, numba-cuda {env['numba_cuda']}, torch {env['torch']}, {env['date']}")
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv_path", nargs="?", default=DEFAULT_CSV, help=f"where the rows go (default {DEFAULT_CSV})")
    main(ap.parse_args().csv_path)
