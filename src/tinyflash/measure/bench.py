"""Benchmarks on a GPU, every one through the one harness (check, then time, then a CSV row):

    python -m tinyflash.bench --csv figures/data/bench_h200.csv              # stages 2 and 3, naive CuPy, SDPA
    python -m tinyflash.bench versions --csv figures/data/kernel_versions_h200.csv   # every kernel version
    python -m tinyflash.bench tiles --csv figures/data/tile_sweep_h200.csv   # tilings of the latest kernel
    python -m tinyflash.bench vector --csv figures/data/vector_loads_h200.csv  # 1 or 4 elements per load
    python -m tinyflash.bench example-32k --csv figures/data/example_32k_h200.csv   # B=1, H=32, N=32k
    python -m tinyflash.bench tensor-cores --csv figures/data/tensor_cores_h200.csv  # stage 3 vs SDPA flash, cuDNN
    python -m tinyflash.bench backward --csv figures/data/backward_h200.csv  # the backward pass (bench_backward.py)
    python -m tinyflash.bench backward-tiles --csv backward_tiles.csv   # tilings of the backward kernel
    python -m tinyflash.bench decode --csv figures/data/decode_h200.csv     # split-KV decoding (bench_decode.py)
    python -m tinyflash.bench --summary figures/data/bench_h200.csv          # the README's table of a CSV

Each measurement is checked before it is timed (``tinyflash.measure.harness`` says how); all
but the 32k-token example write rows of one schema (``harness.FIELDS``). Needs CuPy; PyTorch is
optional (the SDPA columns). ``--summary`` needs neither.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import Callable

# All work here runs on the legacy default stream, so numba need not synchronise on the stream
# a CuPy array reports (which it does by default before every launch with such arrays).
os.environ.setdefault("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "0")

import numpy as np  # noqa: E402

from . import report  # noqa: E402
from .harness import (CsvWriter, attention_flops, check, environment, measure, naive_same_precision,  # noqa: E402
                      read_csv, time_call)

IMPLS = ("tinyflash", "tinyflash_tc", "cupy_naive", "torch_flash", "torch_efficient")
DEFAULT_NS = [512, 1024, 2048, 4096, 8192, 16384, 32768]


@dataclass
class Variant:
    """One thing to measure: an implementation, and which version or setting of it."""

    impl: str  # one of IMPLS: tinyflash (stage 2), tinyflash_tc (stage 3), cupy_naive, torch_flash, torch_efficient
    variant: str  # e.g. 'v5', 'v6', 'v5 vector=1', 'v5 BR=64 BC=64 TM=8 NT=128'; '' for the other libraries
    fn: Callable  # fn(q, k, v, causal) -> o
    meter: str = "cupy"  # how its memory is metered: 'cupy' or 'torch'
    details: Callable = field(default=lambda: {})  # extra columns after a run (regs, smem_bytes)


def tinyflash_variant(label: str, kernel: str | None = None, **options) -> Variant:
    from ..forward.cuda import cuda_attention

    return Variant("tinyflash", label, lambda q, k, v, causal: cuda_attention(q, k, v, causal=causal, kernel=kernel,
                                                                               **options)[0])


def tensor_core_variant() -> Variant:
    """Stage 3: kernel v6 on the tensor cores, called as a user calls it (``tinyflash.tensor_core_attention``)."""
    from ..forward.tensor_cores import tensor_core_attention

    return Variant("tinyflash_tc", "v6", lambda q, k, v, causal: tensor_core_attention(q, k, v, causal=causal)[0])


def sdpa_variants(d: int, dtype) -> list[Variant]:
    """What the main sweep measures at head dim ``d`` and ``dtype``: tinyflash's latest CUDA-core kernel;
    stage 3 (v6) where the registry says it takes these inputs (float16 here, d = 64 or 128: float32
    rows get no v6 row rather than an 'unsupported' one); naive CuPy; and, if PyTorch is installed,
    two SDPA backends."""
    from ..forward.kernels import LATEST, VERSIONS

    variants = [tinyflash_variant(LATEST)]
    if VERSIONS["v6"].accepts(dtype, d, d):
        variants.append(tensor_core_variant())
    variants.append(Variant("cupy_naive", "", lambda q, k, v, causal: naive_same_precision(q, k, v, causal=causal)))
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return variants

    def sdpa(backend):
        def run(q, k, v, causal):
            tq, tk, tv = (torch.from_dlpack(x) for x in (q, k, v))  # zero-copy views
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

        return run

    return variants + [Variant("torch_flash", "", sdpa(SDPBackend.FLASH_ATTENTION), "torch"),
                       Variant("torch_efficient", "", sdpa(SDPBackend.EFFICIENT_ATTENTION), "torch")]


def version_variants(d: int | None = None, dtype=None) -> list[Variant]:
    """Every registered kernel version that takes head dim ``d`` and ``dtype`` (all if None), default tiling."""
    from ..forward.kernels import VERSIONS

    return [tinyflash_variant(name, name) for name, v in VERSIONS.items() if d is None or v.accepts(dtype, d, d)]


def vector_variants() -> list[Variant]:
    """The latest kernel reading full tiles 1 and 4 elements per thread and global load."""
    return [tinyflash_variant(f"v5 vector={w}", "v5", vector=w) for w in (1, 4)]


TILE_SWEEP = {  # (BR, BC, TM, NT) tried per head dim; the default tilings are chosen from their times
    64: [(64, 64, 8, 128), (64, 128, 8, 128), (128, 64, 8, 128), (128, 64, 8, 256)],
    128: [(64, 64, 8, 128), (128, 64, 8, 256), (64, 32, 8, 128)],
}


def tile_variants(d: int, dtype) -> list[Variant]:
    """The latest kernel with each tiling of TILE_SWEEP[d]; regs and shared memory recorded."""
    from ..forward.kernels import v5_branch_free as v5
    from ..forward.kernels.tiling import TileConfig

    variants = []
    for BR, BC, TM, NT in TILE_SWEEP[d]:
        cfg = TileConfig(BR=BR, BC=BC, TM=TM, NT=NT, D=d, DV=d).validate()
        var = tinyflash_variant(f"v5 BR={BR} BC={BC} TM={TM} NT={NT}", "v5", config=cfg)

        def details(cfg=cfg):
            regs = v5.make_kernel(cfg, v5.vector_width(dtype)).get_regs_per_thread()
            return {"regs": max(regs.values()) if isinstance(regs, dict) else regs, "smem_bytes": cfg.smem_bytes}

        var.details = details
        variants.append(var)
    return variants


def sweep(benchmark: str, variants_for, *, ns, ds, dtypes, causals, batch: int, heads: int, csv_path=None,
          seed: int | None = None) -> list[dict]:
    """Measure ``variants_for(d, dtype)`` on fresh random inputs (B, H, N, d) for every dtype, d,
    causal and N; print a line and write a CSV row per measurement. Returns the rows."""
    import cupy
    from numba.core.errors import NumbaPerformanceWarning

    warnings.simplefilter("ignore", NumbaPerformanceWarning)  # small grids at small N are intended
    env, rng, rows = environment(), np.random.default_rng(seed), []
    writer = CsvWriter(csv_path)
    print(f"{benchmark}: {env['device']}  numpy {env['numpy']}  numba-cuda {env['numba_cuda']}  cupy {env['cupy']}  "
          f"torch {env['torch'] or '-'}  {env['date']}; B={batch} H={heads}")
    print(report.LINE_HEADER)
    for dtype in dtypes:
        for d in ds:
            variants = variants_for(d, dtype)
            for causal in causals:
                for n in ns:
                    gen = cupy.random.default_rng(int(rng.integers(2**31)))
                    q, k, v = (gen.standard_normal((batch, heads, n, d), dtype=np.float32).astype(dtype)
                               for _ in range(3))  # (B, H, N, d) each, fresh for every shape
                    for var in variants:
                        res = measure(var.fn, q, k, v, causal, rng, var.meter)
                        row = {**env, "benchmark": benchmark, "impl": var.impl, "variant": var.variant,
                               "dtype": np.dtype(dtype).name, "causal": causal, "batch": batch, "heads": heads,
                               "n": n, "d": d, **res}
                        if res["status"] == "ok":
                            row["tflops"] = attention_flops(batch, heads, n, n, d, causal) / (res["time_ms"] * 1e9)
                            row.update(var.details())
                        rows.append(row)
                        writer.write(row)
                        print(report.line(row), flush=True)
                    del q, k, v
                    cupy.get_default_memory_pool().free_all_blocks()
    writer.close()
    return rows


def example_32k(csv_path: str | None, seed: int | None = None) -> dict:
    """The 32k-token example end to end: B=1, H=32, N=32,768, d=128, float16, causal, on tinyflash.

    Reports the time, the device memory held during the call (inputs included, compared with the
    size of q, k, v, o and lse alone, and with the 64 GiB the fp16 scores alone would need), and
    the error on a sample of rows against a float64 reference.
    """
    import cupy

    from ..forward.cuda import cuda_attention
    from .harness import call_metered
    from .memory import attention_memory

    env = environment()
    rng = np.random.default_rng(seed)
    B, H, N, d = 1, 32, 32_768, 128
    gen = cupy.random.default_rng(int(rng.integers(2**31)))
    q, k, v = (gen.standard_normal((B, H, N, d), dtype=np.float32).astype(np.float16) for _ in range(3))
    inputs = cupy.get_default_memory_pool().used_bytes()
    run = lambda q, k, v, causal: cuda_attention(q, k, v, causal=causal)[0]  # noqa: E731
    o, extra = call_metered(run, q, k, v, True, "cupy")
    verdict = check(o, q, k, v, causal=True, rng=rng, rows=128)
    if not verdict["ok"]:
        raise AssertionError(f"the 32k-token example failed its check: {verdict}")
    timing = time_call(lambda: run(q, k, v, True))
    model = attention_memory(N, d, heads=H, batch=B, dtype="float16")
    res = {**env, **timing, "tflops": attention_flops(B, H, N, N, d, True) / (timing["time_ms"] * 1e9),
           "inputs_bytes": inputs, "extra_peak_bytes": extra, "total_peak_bytes": inputs + extra,
           "model_qkvo_lse_bytes": model.qkv + model.o + model.lse, "model_fp16_scores_bytes": model.scores,
           "max_rel_err": verdict["max_rel_err"], "tolerance": verdict["tolerance"]}
    for key, val in res.items():
        print(f"{key:24} {val}")
    writer = CsvWriter(csv_path, fields=res)  # its own columns: one row, memory beside time
    writer.write(res)
    writer.close()
    return res


SWEEPS = {  # name -> (what it measures for (d, dtype), default N, default d, default dtypes, default causal)
    "sweep": (sdpa_variants, DEFAULT_NS, [64, 128], ["float16", "float32"], [False, True]),
    "versions": (version_variants, [16384], [64, 128], ["float32", "float16"], [False]),
    "vector": (lambda d, dtype: vector_variants(), [16384], [64, 128], ["float16", "float32"], [False, True]),
    "tiles": (tile_variants, [16384], sorted(TILE_SWEEP), ["float32", "float16"], [False, True]),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tinyflash.bench", description=__doc__.split("\n\n")[0],
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("what", nargs="?", default="sweep", choices=[*SWEEPS, "example-32k", "tensor-cores", "backward",
                                                                 "backward-tiles", "decode"],
                    help="which benchmark (default: sweep):\n"
                    "  sweep        tinyflash (v5; v6 too on float16), naive CuPy and PyTorch SDPA against N\n"
                    "  versions     every registered kernel version, side by side\n"
                    "  vector       the latest kernel with 1 or 4 elements per thread and load\n"
                    "  tiles        the latest kernel with each tiling of its sweep\n"
                    "  example-32k  the 32k-token example: B=1, H=32, N=32,768, d=128, float16, causal\n"
                    "  tensor-cores stage 3 (v6) beside SDPA's flash and cuDNN backends\n"
                    "  backward     the backward pass beside SDPA's efficient and flash backwards, naive CuPy\n"
                    "  backward-tiles  tilings of the backward kernel\n"
                    "  decode       split-KV decoding, paged cache, SDPA with GQA, a copy's bandwidth")
    ap.add_argument("--csv", help="write the results here (default: print only)")
    ap.add_argument("--n", type=int, nargs="+", help="sequence lengths (default: the benchmark's)")
    ap.add_argument("--d", type=int, nargs="+", help="head dims (default: the benchmark's)")
    ap.add_argument("--dtype", nargs="+", choices=["float16", "float32", "bfloat16"],
                    help="dtypes (default: the benchmark's; bfloat16: tensor-cores only)")
    ap.add_argument("--causal", nargs="+", choices=["False", "True"], help="causal or not (default: the benchmark's)")
    ap.add_argument("--impl", nargs="+", choices=list(IMPLS), help="only these implementations")
    ap.add_argument("--batch", type=int, default=1, help="batch size B of the inputs (default: 1)")
    ap.add_argument("--heads", type=int, default=32, help="heads H of the inputs (default: 32)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: fresh)")
    ap.add_argument("--quick", action="store_true", help="N in {1024, 4096} only")
    ap.add_argument("--summary", metavar="CSV", help="print the README's Markdown table of an existing CSV and exit")
    ap.add_argument("--summary-n", type=int, default=16384, help="the sequence length of that table")
    args = ap.parse_args(argv)
    if args.summary:
        if args.what == "decode":  # the decode CSV has its own columns and table
            from .bench_decode import summary_table

            print(summary_table(read_csv(args.summary)))
            return 0
        print(report.table_for(read_csv(args.summary), args.summary_n))
        return 0
    try:
        import cupy

        if not cupy.cuda.is_available():
            raise RuntimeError("CuPy sees no GPU")
    except Exception as exc:
        print(f"tinyflash.bench needs a CUDA GPU and CuPy: {exc}", file=sys.stderr)
        return 2
    if args.what == "example-32k":
        example_32k(args.csv, args.seed)
        return 0
    if args.what == "tensor-cores":  # PyTorch tensors (bfloat16 too): its own sweep (bench_tensor_cores.py)
        from .bench_tensor_cores import sweep_tensor_cores

        given = {"ns": args.n, "ds": args.d, "dtypes": args.dtype,
                 "causals": args.causal and [c == "True" for c in args.causal]}
        sweep_tensor_cores(args.csv, **{key: val for key, val in given.items() if val},
                           batch=args.batch, heads=args.heads, seed=args.seed)
        return 0
    if args.what in ("backward", "backward-tiles"):  # measure/bench_backward.py; float32 (SDPA flash: float16)
        from .bench_backward import run_backward

        run_backward(ns=[1024, 4096] if args.quick else args.n, ds=args.d or (64, 128), impls=args.impl,
                     causals=[c == "True" for c in args.causal] if args.causal else (False, True),
                     batch=args.batch, heads=args.heads, csv_path=args.csv, seed=args.seed,
                     tiles=args.what == "backward-tiles")
        return 0
    if args.what == "decode":  # its own shapes and columns: tinyflash/measure/bench_decode.py
        from .bench_decode import run as run_decode

        run_decode(args.csv, args.seed, contexts=[4_096] if args.quick else args.n or None)
        return 0
    variants_for, ns, ds, dtypes, causals = SWEEPS[args.what]
    if args.impl:
        variants_for = (lambda f: lambda d, dtype: [x for x in f(d, dtype) if x.impl in args.impl])(variants_for)
    sweep(args.what, variants_for, ns=[1024, 4096] if args.quick else args.n or ns, ds=args.d or ds,
          dtypes=[np.dtype(x) for x in args.dtype or dtypes],
          causals=[c == "True" for c in args.causal] if args.causal else causals,
          batch=args.batch, heads=args.heads, csv_path=args.csv, seed=args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
