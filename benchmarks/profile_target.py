"""A small program for Nsight Compute to profile (see benchmarks/profile_ncu.sh).

    PYTHONPATH=src python benchmarks/profile_target.py tinyflash|torch D [N]

Runs one attention forward three times at B=1, H=32, N (default 4096), head dim D, float32:
tinyflash's ``cuda_attention`` (its default kernel, v5), or PyTorch's scaled_dot_product_attention
restricted to its memory-efficient backend. ncu profiles the second launch.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("which", choices=["tinyflash", "torch"], help="whose kernel runs")
    ap.add_argument("d", type=int, help="head dim")
    ap.add_argument("n", type=int, nargs="?", default=4096, help="Nq = Nk (default: %(default)s)")
    args = ap.parse_args(argv)
    n, d = args.n, args.d
    if args.which == "tinyflash":
        import cupy

        from tinyflash.forward.cuda import cuda_attention

        gen = cupy.random.default_rng()
        q, k, v = (gen.standard_normal((1, 32, n, d), dtype=np.float32) for _ in range(3))  # (B, H, N, d) each
        for _ in range(3):
            cuda_attention(q, k, v)
        cupy.cuda.runtime.deviceSynchronize()
    else:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q, k, v = (torch.randn(1, 32, n, d, device="cuda") for _ in range(3))  # (B, H, N, d) each
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            for _ in range(3):
                torch.nn.functional.scaled_dot_product_attention(q, k, v)
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
