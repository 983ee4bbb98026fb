"""How fast numba's CUDA simulator runs the kernels here: seconds per CUDA thread and key tile.

    python -m tinyflash.measure.simulator_rate

``tinyflash.gpu.runtime.SIMULATOR_SECONDS_PER_THREAD_TILE`` (which sets when a simulator launch
shows progress and when it warns) was calibrated with this on a 2-core CPU. Each size runs once
after a tiny warm-up call; the work of a launch is what ``gpu/launch.py`` counts: CUDA threads
(blocks × threads per block) × key/value tiles each thread walks.
"""

from __future__ import annotations

import os
import sys
import time

SIZES = ((16, 64, 16), (16, 64, 64), (32, 32, 32), (64, 64, 64))  # (Nq, Nk, d), one head


def measure(sizes=SIZES, kernels=("v1", "v5")) -> list[dict]:
    """One row per kernel and size: seconds, work (threads × key tiles) and seconds per unit of work."""
    import numpy as np

    from ..forward.cuda import cuda_attention
    from ..forward.kernels import tiling, v1_row_per_thread
    from ..gpu.runtime import simulator_enabled

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
                br, bc, _, _ = v1_row_per_thread.tiling(d, d)
                threads = -(-n_q // br) * br  # one thread per row of each query tile
            else:
                cfg = tiling.simulator_config(d, d)
                br, bc, threads = cfg.BR, cfg.BC, -(-n_q // cfg.BR) * cfg.NT
            work = threads * -(-n_k // bc)
            rows.append({"kernel": kernel, "n_q": n_q, "n_k": n_k, "d": d, "seconds": seconds, "work": work,
                         "seconds_per_thread_tile": seconds / work})
    return rows


def main() -> int:
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "0":
        print("set NUMBA_ENABLE_CUDASIM=1 before Python starts:  NUMBA_ENABLE_CUDASIM=1 python -m "
              "tinyflash.measure.simulator_rate", file=sys.stderr)
        return 2
    print(f"{'kernel':>6} {'Nq':>4} {'Nk':>4} {'d':>4} {'seconds':>8} {'threads × key tiles':>20} {'s per unit':>11}")
    for r in measure():
        print(f"{r['kernel']:>6} {r['n_q']:>4} {r['n_k']:>4} {r['d']:>4} {r['seconds']:8.2f} {r['work']:>20,} "
              f"{r['seconds_per_thread_tile']:11.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
