"""The figures of the README and docs/results.md: memory, HBM traffic and time against sequence length.

    python -m tinyflash.plots                  # run from the repository root; every figure
    python -m tinyflash.plots --only hbm_traffic memory_model
    python -m tinyflash.plots --remeasure-gpu  # on a GPU machine: run the benchmark first
    python -m tinyflash.plots --remeasure-cpu  # measure the CPU memory figures' data again

Each figure draws what was measured (or counted) beside the model it is compared with, and
writes its data to ``figures/data/*.csv`` beside the PNG:

| figure                      | what is drawn                          | where the numbers come from        |
|-----------------------------|----------------------------------------|------------------------------------|
| memory_model.png            | bytes of S, P, Q/K/V/O vs N            | cost.memory (formula)              |
| memory_cpu_measured.png     | peak bytes of the NumPy stages         | tracemalloc (committed CSV)        |
| memory_gpu_measured.png     | peak device bytes per implementation   | bench_h200.csv (benchmark)         |
| hbm_traffic.png             | bytes moved to and from HBM            | counted tile loads + closed forms  |
| time_gpu.png                | time and TFLOP/s per implementation    | bench_h200.csv (benchmark)         |
| training_memory.png         | what the backward keeps and takes      | tracemalloc (committed CSV)        |
| kv_cache.png                | KV-cache bytes vs context, MHA/GQA/MQA | decode.cache_memory (formula)      |
| gpt_training.png            | a GPT's loss with tinyflash and SDPA   | examples/train_gpt.py (GPU CSV)    |
| block_sparsity.png          | empty, partial, full tiles per mask    | core.block_mask (counted)          |

The figures themselves are drawn in memory.py, traffic.py, gpu.py, training_memory.py,
kv_cache.py, training_run.py and block_sparsity.py beside this file; common.py holds what they share. Tooling, not teaching code: nothing in
the teaching modules imports this package.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import matplotlib

from .block_sparsity import plot_block_sparsity
from .gpu import plot_memory_gpu_measured, plot_time_gpu
from .kv_cache import plot_kv_cache
from .memory import plot_memory_cpu_measured, plot_memory_model
from .traffic import plot_hbm_traffic
from .training_memory import plot_training_memory
from .training_run import plot_gpt_training

FIGURE_NAMES = ("memory_model", "memory_cpu_measured", "memory_gpu_measured", "hbm_traffic", "time_gpu",
                "training_memory", "kv_cache", "gpt_training", "block_sparsity")
GPU_CSV_NAME = "bench_h200.csv"
GPT_CSV_NAME = "gpt_training_h200.csv"  # examples/train_gpt.py --csv, run on the H200


def remeasure_gpu(csv_path: Path) -> None:
    """Run the forward sweep (``python -m tinyflash.bench sweep --csv PATH``); stop if it fails."""
    Path(csv_path).parent.mkdir(parents=True, exist_ok=True)  # the benchmark opens the file, not the folder
    cmd = [sys.executable, "-m", "tinyflash.bench", "sweep", "--csv", str(csv_path)]
    print("running:", " ".join(cmd), flush=True)
    done = subprocess.run(cmd)
    if done.returncode != 0:
        raise SystemExit(f"the benchmark failed with exit code {done.returncode}; figures not regenerated")


def make_figures(out: Path, names=FIGURE_NAMES, *, gpu_csv: Path | None = None, progress: bool = True,
                 remeasure_cpu: bool = False) -> list[Path]:
    """Write the named figures into ``out`` and their data into ``out/data``; return the PNG paths.

    The two CPU memory figures are drawn from ``out/data/memory_cpu_measured.csv`` and
    ``out/data/training_memory.csv``; they are measured again (tracemalloc, the longest
    part of a run) only if ``remeasure_cpu`` or if that file does not exist yet.
    Every other figure's data is computed, the same at every run: a run changes no committed file.
    """
    out, data = Path(out), Path(out) / "data"
    unknown = [n for n in names if n not in FIGURE_NAMES]
    if unknown:
        raise ValueError(f"names must be among {FIGURE_NAMES}; got unknown {unknown}")
    gpu_csv = data / GPU_CSV_NAME if gpu_csv is None else Path(gpu_csv)
    makers = {
        "memory_model": lambda p: plot_memory_model(p, data / "memory_model.csv"),
        "memory_cpu_measured": lambda p: plot_memory_cpu_measured(
            p, data / "memory_cpu_measured.csv", progress=progress,
            remeasure=remeasure_cpu or not (data / "memory_cpu_measured.csv").exists()),
        "memory_gpu_measured": lambda p: plot_memory_gpu_measured(p, gpu_csv),
        "hbm_traffic": lambda p: plot_hbm_traffic(p, data, progress=progress),
        "time_gpu": lambda p: plot_time_gpu(p, gpu_csv),
        "training_memory": lambda p: plot_training_memory(
            p, data / "training_memory.csv", progress=progress,
            remeasure=remeasure_cpu or not (data / "training_memory.csv").exists()),
        "kv_cache": lambda p: plot_kv_cache(p, data / "kv_cache.csv"),
        "gpt_training": lambda p: plot_gpt_training(p, data / GPT_CSV_NAME),
        "block_sparsity": lambda p: plot_block_sparsity(p, data / "block_sparsity.csv"),
    }
    written = []
    for name in names:
        start = time.perf_counter()
        written.append(makers[name](out / f"{name}.png"))
        print(f"wrote {written[-1]}  ({time.perf_counter() - start:.1f} s)", flush=True)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tinyflash.plots", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("figures"), help="output folder (default: figures)")
    parser.add_argument("--only", nargs="+", choices=FIGURE_NAMES, default=list(FIGURE_NAMES), metavar="NAME",
                        help=f"draw only these figures: {', '.join(FIGURE_NAMES)}")
    parser.add_argument("--gpu-csv", type=Path, default=None, help=f"benchmark CSV (default: OUT/data/{GPU_CSV_NAME})")
    parser.add_argument("--remeasure-gpu", action="store_true",
                        help="first run `python -m tinyflash.bench sweep --csv GPU_CSV` (needs a GPU)")
    parser.add_argument("--remeasure-cpu", action="store_true",
                        help="measure the NumPy stages' memory again (tracemalloc: most of a run's time) and rewrite "
                        "OUT/data/memory_cpu_measured.csv and training_memory.csv; without it those "
                        "figures are drawn from the CSVs")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    matplotlib.use("Agg")  # files only, no window (the figures are drawn on Agg canvases anyway)
    gpu_csv = args.gpu_csv or args.out / "data" / GPU_CSV_NAME
    start = time.perf_counter()
    if args.remeasure_gpu:
        remeasure_gpu(gpu_csv)
    make_figures(args.out, args.only, gpu_csv=gpu_csv, progress=not args.no_progress, remeasure_cpu=args.remeasure_cpu)
    print(f"done in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
