"""Time the two kernel versions side by side on a GPU: flash_fwd_simple (one thread per query
row) and flash_fwd (register tiling), checked first against the float64 reference.

    python benchmarks/kernel_versions.py --csv figures/data/kernel_versions_h200.csv

B=1, H=32, float32, not causal, N and d as given; median of CUDA-event timings after a warm-up.
The module docstring of src/tinyflash/cuda_kernel.py quotes the result.
"""

from __future__ import annotations

import argparse
import csv
import sys

import numpy as np

from tinyflash.bench import attention_flops, environment, sample_error, time_call
from tinyflash.cuda_kernel import cuda_attention


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", required=True)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    args = ap.parse_args(argv)
    import cupy

    env = environment()
    rng = np.random.default_rng()
    fields = ["device", "date", "numba_cuda", "kernel", "n", "d", "time_ms", "tflops", "max_rel_err"]
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for d in args.d:
            gen = cupy.random.default_rng(int(rng.integers(2**31)))
            q, k, v = (gen.standard_normal((1, 32, args.n, d), dtype=np.float32) for _ in range(3))
            for kernel in ("simple", "fast"):
                err = sample_error(cuda_attention(q, k, v, kernel=kernel)[0], q, k, v, causal=False, rng=rng)
                if not err <= 1e-4:
                    raise AssertionError(f"{kernel} kernel, d={d}: relative error {err:.2e} > 1e-4")
                ms = time_call(lambda: cuda_attention(q, k, v, kernel=kernel))
                row = {"device": env["device"], "date": env["date"], "numba_cuda": env["numba_cuda"], "kernel": kernel,
                       "n": args.n, "d": d, "time_ms": f"{ms:.3f}",
                       "tflops": f"{attention_flops(1, 32, args.n, args.n, d, False) / (ms * 1e9):.2f}",
                       "max_rel_err": f"{err:.2e}"}
                w.writerow(row)
                print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
