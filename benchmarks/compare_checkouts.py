"""Time this checkout's entry point against other checkouts', in one process, in interleaved rounds.

    PYTHONPATH=src python benchmarks/compare_checkouts.py --other b15da04=PATH/TO/OTHER/src/tinyflash \
        [--other ...] [--csv compare_checkouts_h200.csv] [--entry tensor_core_attention] [--n N ...]

For a change that should not change speed (a reorganisation, say). Each other checkout's package is
imported under the name ``tinyflash_<label>``; each checkout's ``cuda_attention`` (or
``tensor_core_attention``) is a peer of one benchmark (``tinyflash.bench.suites.Benchmark``) run by this
checkout's runner (``tinyflash.bench.runner.run``): for every dtype, head dim, causal flag and N, fresh
inputs, every checkout's result checked against the float64 reference, then all of them timed together
in interleaved rounds (``tinyflash.bench.timing.time_interleaved``: each round every checkout in turn,
settled first, so that a drift of the GPU's clock falls on all alike and none is always first). The first
``--other`` is the baseline: each row's ``vs_baseline`` is its time over this checkout's (above 1:
faster), with the quartiles of the rounds' ratios. A checkout passed twice under two labels is a check of
the method: it should come out at 1.00.

The rows are the record's (``tinyflash.bench.record.FIELDS``): benchmark 'compare-checkouts', impl
'tinyflash', variant the checkout's label ('this checkout' for this one). Needs a CUDA GPU and CuPy
(PyTorch for bfloat16).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

THIS = "this checkout"
ENTRIES = {"cuda_attention": ("float16", "float32"), "tensor_core_attention": ("float16", "bfloat16")}


def import_other(label: str, path: Path):
    """The package at ``path`` (a folder holding __init__.py), imported as ``tinyflash_<label>``: its modules
    import each other relatively, so it runs beside this checkout's ``tinyflash`` without touching it."""
    name = f"tinyflash_{label}"
    spec = importlib.util.spec_from_file_location(name, path / "__init__.py", submodule_search_locations=[str(path)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def checkout_peer(label: str, entry):
    """A peer that calls ``entry(q, k, v, causal=...)`` of one checkout and returns its output o."""
    from tinyflash.bench.peers import Peer

    def make(x):
        return lambda: entry(x["q"], x["k"], x["v"], causal=x["causal"])[0]

    return Peer("tinyflash", label, make)


def benchmark(args, entries: dict, baseline: str):
    """The ad-hoc benchmark: the axes asked for, every checkout a peer, the first other checkout the baseline."""
    from tinyflash.bench.suites import Benchmark

    found = [checkout_peer(label, entry) for label, entry in entries.items()]
    dtypes = tuple(args.dtype or ENTRIES[args.entry])
    return Benchmark("compare-checkouts", f"{args.entry} of several checkouts, side by side", "forward",
                     {"dtype": dtypes, "d": tuple(args.d), "causal": (False, True), "n": tuple(args.n)},
                     lambda point: found, fixed={"batch": 1, "heads": args.heads},
                     library="torch" if "bfloat16" in dtypes else "cupy", rounds=args.rounds,
                     baseline=("tinyflash", baseline))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Run from the repository root with PYTHONPATH=src; needs a CUDA GPU and CuPy.")
    ap.add_argument("--other", action="append", required=True, metavar="LABEL=PATH",
                    help="another checkout's src/tinyflash folder, and what to call it (e.g. its commit); "
                         "the first is the baseline of the ratios")
    ap.add_argument("--csv", help="write the rows here (default: print only)")
    ap.add_argument("--entry", choices=list(ENTRIES), default="cuda_attention",
                    help="which function of each checkout to time (default: %(default)s)")
    ap.add_argument("--dtype", nargs="+", choices=["float16", "bfloat16", "float32"],
                    help="dtypes (default: those the entry takes, bfloat16 left out unless asked for)")
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128], help="head dims (default: 64 128)")
    ap.add_argument("--n", type=int, nargs="+", default=[16384], help="sequence lengths, Nq = Nk (default: 16384)")
    ap.add_argument("--heads", type=int, default=32, help="heads, batch 1 (default: 32)")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds per configuration (default: 15)")
    ap.add_argument("--seed", type=int, help="random seed of the inputs (default: fresh)")
    args = ap.parse_args(argv)
    if args.dtype is None and args.entry == "tensor_core_attention":
        args.dtype = ["float16"]  # bfloat16 needs PyTorch inputs: asked for explicitly
    os.environ.setdefault("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "0")  # everything runs on the default stream

    from tinyflash.bench.runner import run
    from tinyflash.forward.cuda import cuda_attention
    from tinyflash.forward.tensor_cores import tensor_core_attention

    labels = dict(item.split("=", 1) for item in args.other)
    if THIS in labels:
        ap.error(f"'{THIS}' is this checkout's label; name the others otherwise")
    entries = {label: getattr(import_other(label, Path(path).resolve()), args.entry) for label, path in labels.items()}
    entries[THIS] = {"cuda_attention": cuda_attention, "tensor_core_attention": tensor_core_attention}[args.entry]
    baseline = next(iter(labels))
    rows = run(benchmark(args, entries, baseline), csv_path=args.csv, seed=args.seed)

    slowest = {}  # label -> the lowest speed over the baseline's, over all configurations
    for row in rows:
        if row.get("vs_baseline") not in (None, ""):
            slowest[row["variant"]] = min(slowest.get(row["variant"], float("inf")), float(row["vs_baseline"]))
    wrong = [row for row in rows if row["status"] != "ok"]
    print(f"lowest speed over {baseline}'s in any configuration (its time / the checkout's): "
          + ", ".join(f"{label} {s:.3f}x" for label, s in slowest.items()))
    if wrong:
        print(f"{len(wrong)} results not ok: " + "; ".join(f"{r['variant']} {r['dtype']} d={r['d']} "
                                                          f"causal={r['causal']}: {r['status']}" for r in wrong))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
