"""Time this checkout's default kernel against another checkout's, in one process, alternating.

    python benchmarks/compare_checkouts.py --other PATH/TO/OTHER/src/tinyflash --label b15da04 \
        --csv benchmarks/results/compare_checkouts_h200.csv

For a change that should not change speed (a reorganisation, say): the other checkout's package
is imported under the name ``tinyflash_other``, and for every dtype, head dim and causal flag
both checkouts' ``cuda_attention`` are measured through this checkout's harness (checked against
the float64 reference, then timed: median of CUDA-event timings), in the order A B A B so that a
drift of the GPU's clock during the run hits both alike. Prints each pair's ratio and writes the
harness's CSV rows (variant: 'this checkout' or the other's label, then the round).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

os.environ.setdefault("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "0")  # everything runs on the default stream

import numpy as np  # noqa: E402

from tinyflash.forward.cuda import cuda_attention  # noqa: E402
from tinyflash.measure.harness import CsvWriter, attention_flops, environment, measure  # noqa: E402


def import_other(path: Path):
    """The package at ``path`` (a folder holding __init__.py), imported as ``tinyflash_other``."""
    spec = importlib.util.spec_from_file_location("tinyflash_other", path / "__init__.py",
                                                  submodule_search_locations=[str(path)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["tinyflash_other"] = module
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--other", type=Path, required=True, help="the other checkout's src/tinyflash folder")
    ap.add_argument("--label", default="other", help="what to call it in the CSV (e.g. its commit)")
    ap.add_argument("--csv", help="write the rows here")
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2, help="A B pairs per configuration")
    args = ap.parse_args(argv)
    import cupy

    other = import_other(args.other.resolve())
    impls = {"this checkout": lambda q, k, v, causal: cuda_attention(q, k, v, causal=causal)[0],
             args.label: lambda q, k, v, causal: other.cuda_attention(q, k, v, causal=causal)[0]}
    env, rng, writer = environment(), np.random.default_rng(), CsvWriter(args.csv)
    print(f"{env['device']} {env['date']}; B=1 H={args.heads} N={args.n}; this checkout vs {args.label}")
    ratios = []
    for dtype in ("float16", "float32"):
        for d in (64, 128):
            gen = cupy.random.default_rng(int(rng.integers(2**31)))
            q, k, v = (gen.standard_normal((1, args.heads, args.n, d), dtype=np.float32).astype(dtype)
                       for _ in range(3))  # (B, H, N, d) each
            for causal in (False, True):
                ms = {name: [] for name in impls}
                for r in range(args.rounds):
                    for name, fn in impls.items():
                        res = measure(fn, q, k, v, causal, rng)
                        if res["status"] != "ok":
                            raise AssertionError(f"{name} {dtype} d={d} causal={causal}: {res['status']}")
                        ms[name].append(res["time_ms"])
                        writer.write({**env, "benchmark": "compare_checkouts", "impl": "tinyflash",
                                      "variant": f"{name}, round {r + 1}", "dtype": dtype, "causal": causal,
                                      "batch": 1, "heads": args.heads, "n": args.n, "d": d, **res,
                                      "tflops": attention_flops(1, args.heads, args.n, args.n, d, causal)
                                      / (res["time_ms"] * 1e9)})
                this, that = (float(np.median(ms[name])) for name in impls)
                ratios.append(this / that)
                print(f"{dtype:8} d={d:3} causal={causal!s:5}  this {this:9.3f} ms  {args.label} {that:9.3f} ms  "
                      f"this/other {this / that:.3f}  (rounds: {ms})", flush=True)
    writer.close()
    print(f"this checkout's time / {args.label}'s: {min(ratios):.3f} to {max(ratios):.3f} "
          f"(above 1: this checkout slower)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
