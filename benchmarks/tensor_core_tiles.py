"""Tilings of the tensor-core kernel v6 on a GPU, the kernel alone, each checked, then timed beside SDPA's
flash backend in the same run (float16, B=1, H=32).

    python benchmarks/tensor_core_tiles.py [N ...]      # default N = 4096 16384

For each N, d and causal: SDPA flash's time (one eager call, the backend chosen outside the timed
call), then one line per tiling (warps, row tiles per warp, Q_i in shared memory or registers, keys
per tile, register cap, lazy rescaling, heads ordered together): time, TFLOP/s, its speed over flash's, registers, spilled
bytes, shared memory. A tiling is launched from arguments packed once (``DriverKernel.bind``), so
the host's part of a call, the same for every tiling, is left out; each is first checked against
the float64 reference on sampled rows (FlashAttention's rule) and timed only if right.
The default tilings of v6 (``v6_tensor_cores.default_tiling``) are chosen from such runs.
"""

import itertools
import math
import sys

import numpy as np

from tinyflash.core.online_softmax import LOG2E
from tinyflash.forward.kernels import v6_tensor_cores as v6
from tinyflash.gpu.driver_launch import driver_kernel
from tinyflash.measure.bench_tensor_cores import check_torch
from tinyflash.measure.harness import attention_flops, environment, time_call

HEADS = 32
# (warps, keys per tile, register cap or None, row tiles per warp, Q_i's operands in shared memory, lazy rescaling):
# 2 row tiles (32 query rows per warp) halve the shared-memory reads per mma but double the registers for Q_i,
# S_ij and acc; Q in shared memory frees most of Q_i's registers (ptxas for sm_90:
# benchmarks/results/tensor_core_sass_q_smem_sm90.log); 4 warps give blocks of 128 query rows, twice as many
# blocks as 8 warps: finer pieces of work to share among the multiprocessors when causal rows differ in length.
TILINGS = {128: [(8, 64, None, 2, True, False), (8, 64, None, 2, True, True),
                 (4, 64, None, 2, True, False), (4, 64, None, 2, True, True)],
           64: [(4, 64, None, 2, False, False), (4, 64, None, 2, False, True)]}
# heads whose blocks are ordered together, longest query tiles first (v6's block_work; v6.head_group picks one):
# each tiling is timed with each, 1 being one head after another (not causal, where every block is as long, two)
HEAD_GROUPS = {True: (1, 2, 4, 8, 16, 32), False: (1, 4)}


def main(ns) -> list[dict]:
    """Check and time every tiling; print a line each and return them."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    env, rng, rows = environment(), np.random.default_rng(0), []
    print(f"v6 tilings, kernel alone: {env['device']} numba-cuda {env['numba_cuda']} torch {env['torch']} "
          f"{env['date']}; float16, B=1, H={HEADS}")
    for n in ns:
        for d, tilings in TILINGS.items():
            q, k, v = (torch.randn((1, HEADS, n, d), device="cuda", dtype=torch.float16) for _ in range(3))
            o, lse = torch.empty_like(q), torch.empty((HEADS * n,), device="cuda", dtype=torch.float32)
            for causal in (False, True):
                flops = attention_flops(1, HEADS, n, n, d, causal)
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    flash = time_call(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))["time_ms"]
                default = v6.default_tiling(d, causal, n)
                print(f"N={n} d={d} causal={causal}: SDPA flash {flash:.3f} ms ({flops / flash / 1e9:.1f} TFLOP/s); "
                      f"v6's default: {default}, head group {v6.head_group(default, n, HEADS, 1, causal)}", flush=True)
                for (warps, keys, cap, row_tiles, q_smem, lazy), group in itertools.product(tilings, HEAD_GROUPS[causal]):
                    cfg = v6.TensorCoreTiling(D=d, WARPS=warps, BC=keys, MAX_REGISTERS=cap, ROW_TILES=row_tiles,
                                              Q_IN_SMEM=q_smem, LAZY_RESCALE=lazy)
                    if cfg.problems():
                        continue
                    kernel = driver_kernel(v6.kernel_for(cfg, "float16", group), v6.SIGNATURE, cfg.smem_bytes)
                    args = (q, k, v, o, lse, n, n, np.float32(LOG2E / math.sqrt(d)), causal, 1, group)  # v6.SIGNATURE's
                    launch = kernel.bind((-(-n // cfg.BR), HEADS), cfg.NT, cfg.smem_bytes, *args)
                    o.fill_(float("nan"))  # every element must be written by the launch
                    launch()
                    verdict = check_torch(o, q, k, v, causal=causal, rng=rng)
                    ok = verdict["ok"]
                    ms = time_call(launch)["time_ms"] if ok else math.nan
                    tflops = flops / (ms * 1e9)
                    rows.append({"n": n, "d": d, "causal": causal, "warps": warps, "row_tiles": row_tiles,
                                 "q_in_smem": q_smem, "keys": keys, "cap": cap, "lazy": lazy, "head_group": group,
                                 "time_ms": ms,
                                 "tflops": tflops, "vs_flash": flash / ms, "regs": kernel.registers,
                                 "local_bytes": kernel.local_bytes, "ok": ok})
                    print(f"N={n} d={d} causal={causal!s:5} warps={warps} row_tiles={row_tiles} q_in_smem={q_smem!s:5} "
                          f"BC={keys:3d} cap={cap!s:4} lazy={lazy!s:5} group={group:2d}: {ms:8.3f} ms {tflops:6.1f} TFLOP/s "
                          f"{flash / ms:6.3f}x flash  regs={kernel.registers} local={kernel.local_bytes} "
                          f"smem={cfg.smem_bytes}  {'ok' if ok else 'WRONG (error %.1e)' % verdict['max_rel_err']}",
                          flush=True)
            del q, k, v, o, lse
            torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":
    main([int(x) for x in sys.argv[1:]] or [4096, 16384])
