"""Time this checkout's default kernel against other checkouts', in one process, alternating.

    python benchmarks/compare_checkouts.py --other b15da04=PATH/TO/OTHER/src/tinyflash \
        --csv benchmarks/results/compare_checkouts_h200.csv [--entry tensor_core_attention] [--n N]

For a change that should not change speed (a reorganisation, say): each other checkout's package
is imported under the name ``tinyflash_<label>``, and for every dtype, head dim and causal flag
all checkouts' ``cuda_attention`` are measured through this checkout's harness (checked against
the float64 reference, then timed: median of CUDA-event timings), in the order A B C, B C A, C A B, ...
so that a drift of the GPU's clock during the run hits all alike, and none is always first. A checkout
passed twice under two labels is a check of the method: it should come out at 1.00. Prints each configuration's
times and ratios to the first ``--other`` (the baseline), and writes the harness's CSV rows
(variant: the label, then the round).
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
from tinyflash.forward.tensor_cores import tensor_core_attention  # noqa: E402
from tinyflash.measure.harness import CsvWriter, attention_flops, environment, measure  # noqa: E402


def import_other(label: str, path: Path):
    """The package at ``path`` (a folder holding __init__.py), imported as ``tinyflash_<label>``."""
    name = f"tinyflash_{label}"
    spec = importlib.util.spec_from_file_location(name, path / "__init__.py", submodule_search_locations=[str(path)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--other", action="append", required=True, metavar="LABEL=PATH",
                    help="another checkout's src/tinyflash folder, and what to call it (e.g. its commit); "
                         "the first is the baseline of the ratios")
    ap.add_argument("--csv", help="write the rows here")
    ap.add_argument("--entry", choices=("cuda_attention", "tensor_core_attention"), default="cuda_attention",
                    help="which function of each checkout to time (tensor_core_attention: float16 only, stage 3)")
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2, help="A B pairs per configuration")
    args = ap.parse_args(argv)
    import cupy

    others = dict(item.split("=", 1) for item in args.other)
    impls = {label: getattr(import_other(label, Path(path).resolve()), args.entry) for label, path in others.items()}
    impls["this checkout"] = cuda_attention if args.entry == "cuda_attention" else tensor_core_attention
    baseline = next(iter(others))
    env, rng, writer = environment(), np.random.default_rng(), CsvWriter(args.csv)
    print(f"{env['device']} {env['date']}; B=1 H={args.heads} N={args.n}; time / {baseline}'s time:")
    worst = {name: 0.0 for name in impls}
    for dtype in ("float16", "float32") if args.entry == "cuda_attention" else ("float16",):
        for d in (64, 128):
            gen = cupy.random.default_rng(int(rng.integers(2**31)))
            q, k, v = (gen.standard_normal((1, args.heads, args.n, d), dtype=np.float32).astype(dtype)
                       for _ in range(3))  # (B, H, N, d) each
            for causal in (False, True):
                ms = {name: [] for name in impls}
                for r in range(args.rounds):
                    names = list(impls)[r % len(impls):] + list(impls)[:r % len(impls)]  # each takes each place
                    for name in names:
                        fn = (lambda f: lambda q, k, v, causal: f(q, k, v, causal=causal)[0])(impls[name])
                        res = measure(fn, q, k, v, causal, rng)
                        if res["status"] != "ok":
                            raise AssertionError(f"{name} {dtype} d={d} causal={causal}: {res['status']}")
                        ms[name].append(res["time_ms"])
                        writer.write({**env, "benchmark": "compare_checkouts", "impl": "tinyflash",
                                      "variant": f"{name}, round {r + 1}", "dtype": dtype, "causal": causal,
                                      "batch": 1, "heads": args.heads, "n": args.n, "d": d, **res,
                                      "tflops": attention_flops(1, args.heads, args.n, args.n, d, causal)
                                      / (res["time_ms"] * 1e9)})
                base = float(np.median(ms[baseline]))
                for name in impls:
                    worst[name] = max(worst[name], float(np.median(ms[name])) / base)
                print(f"{dtype:8} d={d:3} causal={causal!s:5}  {baseline} {base:9.3f} ms  " + "  ".join(
                    f"{name} {float(np.median(ms[name])) / base:.3f}" for name in impls if name != baseline), flush=True)
    writer.close()
    print("largest time / baseline's over all configurations: " + ", ".join(f"{n} {w:.3f}" for n, w in worst.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
