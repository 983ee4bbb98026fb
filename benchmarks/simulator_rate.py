"""How fast numba's CUDA simulator runs the kernels on this CPU: seconds per CUDA thread and key tile.

    NUMBA_ENABLE_CUDASIM=1 python benchmarks/simulator_rate.py [CSV]   # default: figures/data/simulator_rate.csv

``tinyflash.gpu.runtime.SIMULATOR_SECONDS_PER_THREAD_TILE`` (which sets when a simulator launch shows
progress and when it warns) is the order of magnitude of the committed rows. Each size runs once
after a tiny warm-up call; the work of a launch is what ``gpu/launch.py`` counts: CUDA threads
(blocks × threads per block) × key/value tiles each thread walks. Every row holds the CPU, the
versions and the date.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import sys
import time
from importlib.metadata import version
from pathlib import Path

SIZES = ((16, 64, 16), (16, 64, 64), (32, 32, 32), (64, 64, 64))  # (Nq, Nk, d), one head


def measure(sizes=SIZES, kernels=("v1", "v5")) -> list[dict]:
    """One row per kernel and size: seconds, work (threads × key tiles) and seconds per unit of work."""
    import numpy as np

    from tinyflash.forward.cuda import cuda_attention
    from tinyflash.forward.kernels import VERSIONS, tiling
    from tinyflash.gpu.runtime import simulator_enabled

    if not simulator_enabled():
        raise RuntimeError("the simulator is off: run with NUMBA_ENABLE_CUDASIM=1 (set before Python starts)")
    rng, rows = np.random.default_rng(0), []
    for kernel in kernels:
        for n_q, n_k, d in sizes:
            q = rng.standard_normal((n_q, d)).astype(np.float32)  # (Nq, d)
            k, v = (rng.standard_normal((n_k, d)).astype(np.float32) for _ in range(2))  # (Nk, d) each
            cuda_attention(q[:2], k[:2], v[:2], kernel=kernel)  # warm-up (imports, caches)
            start = time.perf_counter()
            cuda_attention(q, k, v, kernel=kernel)
            seconds = time.perf_counter() - start
            if kernel == "v1":
                v1 = VERSIONS["v1"].code.tiling(d, d)  # v1's tiling on the simulator
                br, bc = v1.BR, v1.BC
                threads = -(-n_q // br) * br  # one thread per row of each query tile
            else:
                cfg = tiling.simulator_config(d, d)
                br, bc, threads = cfg.BR, cfg.BC, -(-n_q // cfg.BR) * cfg.NT
            work = threads * -(-n_k // bc)
            rows.append({"kernel": kernel, "n_q": n_q, "n_k": n_k, "d": d, "seconds": seconds, "work": work,
                         "seconds_per_thread_tile": seconds / work})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv_path", nargs="?", default="figures/data/simulator_rate.csv", help="where the rows go")
    csv_path = ap.parse_args(argv).csv_path
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "0":
        print("set NUMBA_ENABLE_CUDASIM=1 before Python starts:  NUMBA_ENABLE_CUDASIM=1 python "
              "benchmarks/simulator_rate.py", file=sys.stderr)
        return 2
    env = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "python": platform.python_version(),
           "numba_cuda": version("numba-cuda"), "date": datetime.datetime.now(datetime.timezone.utc).strftime(
               "%Y-%m-%d %H:%M UTC")}
    rows = [{**env, **r} for r in measure()]
    print(f"{'kernel':>6} {'Nq':>4} {'Nk':>4} {'d':>4} {'seconds':>8} {'threads × key tiles':>20} {'s per unit':>11}")
    for r in rows:
        print(f"{r['kernel']:>6} {r['n_q']:>4} {r['n_k']:>4} {r['d']:>4} {r['seconds']:8.2f} {r['work']:>20,} "
              f"{r['seconds_per_thread_tile']:11.1e}")
    Path(csv_path).parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
