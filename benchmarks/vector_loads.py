"""Time flash_fwd reading its full tiles one element per thread and load, or four (one vector load).

    python benchmarks/vector_loads.py --csv figures/data/vector_loads_h200.csv

B=1, H=32, the default tiling, N, d, dtypes and causal as given; every variant checked against
the float64 reference on sampled rows before it is timed (median of CUDA-event timings after a
warm-up). ``cuda_kernel.vector_width``, which picks 4 for float16 and 1 for float32, quotes the
result.
"""

from __future__ import annotations

import argparse
import csv
import sys

import numpy as np

from tinyflash.bench import attention_flops, environment, sample_error, time_call
from tinyflash.cuda_kernel import cuda_attention

TOL = {"float32": 1e-4, "float16": 5e-3}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", required=True)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--dtype", nargs="+", default=["float16", "float32"], choices=sorted(TOL))
    ap.add_argument("--causal", nargs="+", default=["False", "True"], choices=["False", "True"])
    args = ap.parse_args(argv)
    import cupy

    env = environment()
    rng = np.random.default_rng()
    fields = ["device", "date", "numba_cuda", "dtype", "d", "causal", "n", "vector", "time_ms", "tflops",
              "max_rel_err"]
    print(f"{env['device']} numba-cuda {env['numba_cuda']} {env['date']}; B=1 H=32 N={args.n}")
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for dtype in args.dtype:
            for d in args.d:
                gen = cupy.random.default_rng(int(rng.integers(2**31)))
                q, k, v = (gen.standard_normal((1, 32, args.n, d), dtype=np.float32).astype(dtype) for _ in range(3))
                for causal in (c == "True" for c in args.causal):
                    for vector in (1, 4):
                        err = sample_error(cuda_attention(q, k, v, causal=causal, vector=vector)[0], q, k, v,
                                           causal=causal, rng=rng)
                        if not err <= TOL[dtype]:
                            raise AssertionError(f"{dtype} d={d} causal={causal} vector={vector}: error {err:.2e}")
                        ms = time_call(lambda: cuda_attention(q, k, v, causal=causal, vector=vector))
                        tflops = attention_flops(1, 32, args.n, args.n, d, causal) / (ms * 1e9)
                        w.writerow({"device": env["device"], "date": env["date"], "numba_cuda": env["numba_cuda"],
                                    "dtype": dtype, "d": d, "causal": causal, "n": args.n, "vector": vector,
                                    "time_ms": f"{ms:.3f}", "tflops": f"{tflops:.2f}", "max_rel_err": f"{err:.2e}"})
                        f.flush()
                        print(f"{dtype:8s} d={d:3d} causal={causal!s:5s} vector={vector}  {ms:9.3f} ms "
                              f"{tflops:6.2f} TFLOP/s  err {err:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
