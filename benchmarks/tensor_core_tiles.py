"""Tilings of the tensor-core kernel v6 on a GPU: each checked, then timed (float16, B=1, H=32).

    python benchmarks/tensor_core_tiles.py [N ...]      # default N = 16384

Prints one line per (d, causal, warps, row tiles per warp, Q in shared memory, keys per tile): time,
TFLOP/s, registers, shared memory.
The default tilings of v6 (``v6_tensor_cores.default_tiling``) are chosen from such runs.
"""

import os
import sys

os.environ.setdefault("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "0")

import numpy as np  # noqa: E402

from tinyflash.forward.cuda import cuda_attention  # noqa: E402
from tinyflash.forward.kernels import v6_tensor_cores as v6  # noqa: E402
from tinyflash.gpu.driver_launch import driver_kernel  # noqa: E402
from tinyflash.measure.harness import attention_flops, environment, measure  # noqa: E402

# (warps, keys per tile, register cap or None, row tiles per warp, Q_i's operands in shared memory): a cap
# lets more blocks share a multiprocessor; 2 row tiles (32 query rows per warp) halve the shared-memory reads
# per mma but double the registers for Q_i, S_ij and acc (ptxas for sm_90: at d = 128 only 16 keys per tile
# fit without spilling); Q in shared memory frees most of Q_i's registers for more ldmatrix (ptxas: 32 keys
# fit at d = 128 with 2 row tiles, 238 registers; benchmarks/results/tensor_core_sass_q_smem_sm90.log)
TILINGS = {64: [(4, 32, None, 1, False), (4, 32, 96, 1, False), (4, 64, None, 1, False), (4, 64, 128, 1, False),
                (4, 32, None, 2, False), (4, 64, None, 2, False), (8, 64, None, 2, False),
                (4, 64, None, 2, True), (8, 64, None, 2, True)],
           128: [(4, 32, None, 1, False), (4, 32, 128, 1, False), (4, 64, None, 1, False), (8, 64, None, 1, False),
                 (8, 128, None, 1, False), (4, 16, None, 2, False), (8, 16, None, 2, False),
                 (4, 32, None, 2, False), (4, 64, None, 2, False), (8, 32, None, 2, False),
                 (4, 32, None, 2, True), (8, 32, None, 2, True), (4, 64, None, 2, True), (8, 64, None, 2, True),
                 (4, 128, None, 1, True), (8, 128, None, 1, True)]}


def main(ns) -> list[dict]:
    """Check and time every tiling; print a line each and return them (d, causal, warps, row_tiles, q_in_smem,
    keys, ...)."""
    import cupy

    env, rng, rows = environment(), np.random.default_rng(0), []
    print(f"v6 tilings: {env['device']} numba-cuda {env['numba_cuda']} {env['date']}; float16, B=1, H=32")
    for n in ns:
        for d, tilings in TILINGS.items():
            gen = cupy.random.default_rng(n + d)
            q, k, v = (gen.standard_normal((1, 32, n, d), dtype=np.float32).astype(np.float16) for _ in range(3))
            for causal in (False, True):
                for warps, keys, cap, row_tiles, q_smem in tilings:
                    cfg = v6.TensorCoreTiling(D=d, WARPS=warps, BC=keys, MAX_REGISTERS=cap, ROW_TILES=row_tiles,
                                              Q_IN_SMEM=q_smem)
                    if cfg.problems():
                        continue

                    def run(q, k, v, c, cfg=cfg):
                        return cuda_attention(q, k, v, causal=c, kernel="v6", config=cfg)[0]

                    res = measure(run, q, k, v, causal, rng)
                    kernel = driver_kernel(v6.make_kernel(cfg, "float16"), v6.SIGNATURE, cfg.smem_bytes)  # the run's
                    regs, spilled = kernel.registers, kernel.local_bytes
                    tflops = (attention_flops(1, 32, n, n, d, causal) / (res["time_ms"] * 1e9)
                              if res["status"] == "ok" else float("nan"))
                    rows.append({"n": n, "d": d, "causal": causal, "warps": warps, "row_tiles": row_tiles,
                                 "q_in_smem": q_smem, "keys": keys, "cap": cap, "tflops": tflops,
                                 "regs": regs, "local_bytes": spilled, "status": res["status"]})
                    print(f"N={n} d={d} causal={causal!s:5} warps={warps} row_tiles={row_tiles} "
                          f"q_in_smem={q_smem!s:5} BC={keys:3d} "
                          f"cap={cap!s:4}: "
                          f"{res.get('time_ms', 0):8.3f} ms "
                          f"{tflops:6.1f} TFLOP/s  regs={regs} local={spilled} smem={cfg.smem_bytes}  {res['status']}",
                          flush=True)
    return rows


if __name__ == "__main__":
    main([int(x) for x in sys.argv[1:]] or [16384])
