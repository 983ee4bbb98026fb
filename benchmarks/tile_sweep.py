"""Check, then time, several tilings of the fast kernel on a real GPU (a tuning aid, not a test).

    python benchmarks/tile_sweep.py --csv sweep.csv [--n 16384] [--heads 32]

For every TileConfig in SWEEP and both dtypes: the kernel is first checked against the float64
reference at an awkward size (B=1, H=2, N=777, causal and not, FlashAttention's rule for
float16), then timed with CUDA events at B=1, H=heads, N=n (median after a warm-up), causal and
not. Prints a table and writes a CSV with device, versions, date and the register count of each
compiled kernel. default_config() in src/tinyflash/cuda_kernel.py is chosen from its results.
"""

from __future__ import annotations

import argparse
import csv
import sys
import warnings

import numpy as np

from tinyflash.bench import attention_flops, environment, time_call
from tinyflash.cuda_kernel import TileConfig, cuda_attention, make_kernel, vector_width
from tinyflash.naive import naive_attention, reference_attention
from tinyflash.testing import fa_rule, rel_error

SWEEP = {
    64: [
        TileConfig(BR=64, BC=64, TM=8, NT=128, D=64, DV=64),
        TileConfig(BR=64, BC=128, TM=8, NT=128, D=64, DV=64),
        TileConfig(BR=128, BC=64, TM=8, NT=128, D=64, DV=64),
        TileConfig(BR=128, BC=64, TM=8, NT=256, D=64, DV=64),
    ],
    128: [
        TileConfig(BR=64, BC=64, TM=8, NT=128, D=128, DV=128),
        TileConfig(BR=128, BC=64, TM=8, NT=256, D=128, DV=128),
        TileConfig(BR=64, BC=32, TM=8, NT=128, D=128, DV=128),
    ],
}


def check(cfg: TileConfig, d: int, dtype, rng) -> str:
    """'ok' or what failed, at N=777 (no tile divides it), causal and not."""
    for causal in (False, True):
        q, k, v = (rng.standard_normal((1, 2, 777, d)).astype(dtype) for _ in range(3))
        o, lse = cuda_attention(q, k, v, causal=causal, config=cfg)
        ref_o, ref_lse = reference_attention(q, k, v, causal=causal)
        if dtype == np.float16:
            rule = fa_rule(o, naive_attention(q, k, v, causal=causal)[0], ref_o, np.float16)
            if not rule.ok:
                return f"o: {rule}"
        elif rel_error(o, ref_o) > 1e-5:
            return f"o: error {rel_error(o, ref_o):.2e}"
        if rel_error(lse, ref_lse) > 1e-5:
            return f"lse: error {rel_error(lse, ref_lse):.2e}"
    return "ok"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", required=True)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--d", type=int, nargs="+", default=sorted(SWEEP))
    ap.add_argument("--dtype", nargs="+", default=["float32", "float16"], choices=["float32", "float16"])
    args = ap.parse_args(argv)
    import cupy
    from numba.core.errors import NumbaPerformanceWarning

    warnings.simplefilter("ignore", NumbaPerformanceWarning)  # small grids in the checks are intended
    env = environment()
    rng = np.random.default_rng()
    fields = ["device", "date", "numba_cuda", "d", "dtype", "causal", "BR", "BC", "TM", "NT", "smem_bytes", "regs",
              "check", "time_ms", "tflops"]
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        print(f"{env['device']} numba-cuda {env['numba_cuda']} {env['date']}; B=1 H={args.heads} N={args.n}")
        for d in args.d:
            for cfg in SWEEP[d]:
                for dtype in (np.dtype(x).type for x in args.dtype):
                    try:
                        with warnings.catch_warnings():
                            warnings.simplefilter("error", RuntimeWarning)  # a fallback to another tiling is a failure
                            status = check(cfg, d, dtype, rng)
                    except Exception as exc:
                        status = f"error: {type(exc).__name__}: {exc}"
                    regs = make_kernel(cfg, vector_width(dtype)).get_regs_per_thread()
                    regs = max(regs.values()) if isinstance(regs, dict) else regs
                    gen = cupy.random.default_rng(int(rng.integers(2**31)))
                    q, k, v = (gen.standard_normal((1, args.heads, args.n, d), dtype=np.float32).astype(dtype)
                               for _ in range(3))
                    for causal in (False, True):
                        row = {"device": env["device"], "date": env["date"], "numba_cuda": env["numba_cuda"], "d": d,
                               "dtype": np.dtype(dtype).name, "causal": causal, "BR": cfg.BR, "BC": cfg.BC,
                               "TM": cfg.TM, "NT": cfg.NT, "smem_bytes": cfg.smem_bytes, "regs": regs,
                               "check": status}
                        if status == "ok":
                            ms = time_call(lambda: cuda_attention(q, k, v, causal=causal, config=cfg))
                            row["time_ms"] = f"{ms:.3f}"
                            row["tflops"] = f"{attention_flops(1, args.heads, args.n, args.n, d, causal) / (ms * 1e9):.2f}"
                        w.writerow(row)
                        f.flush()
                        print(f"d={d:3} {row['dtype']:7} causal={causal!s:5} BR={cfg.BR:3} BC={cfg.BC:3} TM={cfg.TM} "
                              f"NT={cfg.NT:3} smem={cfg.smem_bytes / 1024:5.1f}K regs={regs:3} "
                              f"{row.get('tflops', '-'):>6} TFLOP/s {row.get('time_ms', '-'):>9} ms  {status}", flush=True)
                    del q, k, v
                    cupy.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
