"""``python -m tinyflash.bench NAME``: check, then time, then record one benchmark (needs a CUDA GPU and CuPy;
PyTorch for SDPA's columns and for bfloat16). ``--list`` names the benchmarks, ``--summary CSV`` prints the
tables of a record file, ``--docs`` rewrites the numbers of README.md and docs/*.md and the lessons' running
times from the record (none of the three needs a GPU)."""

from __future__ import annotations

import argparse
import os
import sys

from .suites import BENCHMARKS

EPILOG = """examples:
  python -m tinyflash.bench tensor-cores --csv figures/data/tensor_cores_h200.csv
  python -m tinyflash.bench sweep --dtype float16 --n 4096 16384 --csv /tmp/sweep.csv
  python -m tinyflash.bench --summary figures/data/decode_h200.csv

Every row of a CSV holds the device, the library versions, the commit and the date. A CSV is only
replaced by a run of the same schema. How peers are checked and timed: docs/measuring.md."""


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m tinyflash.bench", description=__doc__.split("\n\n")[0],
                                 epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", nargs="?", choices=list(BENCHMARKS), metavar="NAME",
                    help="the benchmark: " + ", ".join(BENCHMARKS) + " (--list says what each measures)")
    ap.add_argument("--list", action="store_true", help="name every benchmark, its axes and its peers' kinds")
    ap.add_argument("--summary", metavar="CSV", help="print the table of a record file and exit")
    ap.add_argument("--docs", action="store_true",
                    help="rewrite the generated blocks of README.md and docs/*.md and the lessons' running times "
                    "from figures/data/ and exit")
    ap.add_argument("--csv", help="write the rows here (default: print only)")
    ap.add_argument("--dtype", nargs="+", choices=["float16", "bfloat16", "float32"], help="dtypes to measure")
    ap.add_argument("--d", type=int, nargs="+", help="head dims")
    ap.add_argument("--causal", nargs="+", choices=["False", "True"], help="causal or not")
    ap.add_argument("--n", type=int, nargs="+", help="sequence lengths, Nq = Nk")
    ap.add_argument("--n-k", type=int, nargs="+", help="cache lengths Nk (decode)")
    ap.add_argument("--batch", type=int, nargs="+", help="batch sizes")
    ap.add_argument("--mods", nargs="+", help="only these variants of a benchmark with a 'mods' axis (flex: causal, "
                    "window-1024, documents-8, softcap-30, alibi)")
    ap.add_argument("--impl", nargs="+", help="only these implementations (tinyflash, torch_flash, naive, ...)")
    ap.add_argument("--rounds", type=int, help="rounds of interleaved timing (default: the benchmark's)")
    ap.add_argument("--seed", type=int, help="random seed of the inputs (default: fresh)")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.list:
        width = max(map(len, BENCHMARKS)) + 2
        for bench in BENCHMARKS.values():
            axes = ", ".join(f"{k} {'/'.join(map(str, v))}" for k, v in bench.axes.items())
            print(f"{bench.name:{width}}{bench.doc}\n{'':{width}}axes: {axes}; {bench.rounds} rounds")
        return 0
    if args.summary:
        from .record import read_csv
        from .tables import summary

        print(summary(read_csv(args.summary)))
        return 0
    if args.docs:
        from .docs import write_docs

        changed = write_docs()
        print("\n".join(f"rewrote {p}" for p in changed) or "README.md, docs/ and the lessons already hold what the record says")
        return 0
    if args.name is None:
        parser().error("name a benchmark (--list names them)")
    known = BENCHMARKS[args.name].axes.get("mods", ())
    if args.mods and not set(args.mods) <= set(known):
        parser().error(f"--mods: {args.name} has the variants {', '.join(known) or 'none'}; got {', '.join(args.mods)}")
    try:
        import cupy

        if not cupy.cuda.is_available():
            raise RuntimeError("CuPy sees no GPU")
    except Exception as exc:
        print(f"tinyflash.bench needs a CUDA GPU and CuPy: {exc}", file=sys.stderr)
        return 2
    # all work here runs on the default stream: numba need not synchronise on the stream a CuPy array reports
    os.environ.setdefault("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "0")
    from .runner import run

    overrides = {"dtype": args.dtype, "d": args.d, "causal": args.causal and [c == "True" for c in args.causal],
                 "n": args.n, "n_k": args.n_k, "batch": args.batch, "mods": args.mods}
    run(BENCHMARKS[args.name], overrides=overrides, impls=args.impl, csv_path=args.csv, seed=args.seed,
        rounds=args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
