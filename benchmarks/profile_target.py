"""A small program for Nsight Compute to profile (see benchmarks/profile_ncu.sh).

    python benchmarks/profile_target.py tinyflash|torch D [N]

Runs one attention forward three times at B=1, H=32, N (default 4096), head dim D, float32:
tinyflash's fast kernel, or PyTorch's scaled_dot_product_attention restricted to its
memory-efficient backend. ncu profiles the second launch.
"""

from __future__ import annotations

import sys

import numpy as np


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    which, d = argv[0], int(argv[1])
    n = int(argv[2]) if len(argv) > 2 else 4096
    if which == "tinyflash":
        import cupy

        from tinyflash.forward.cuda import cuda_attention

        gen = cupy.random.default_rng()
        q, k, v = (gen.standard_normal((1, 32, n, d), dtype=np.float32) for _ in range(3))
        for _ in range(3):
            cuda_attention(q, k, v)
        cupy.cuda.runtime.deviceSynchronize()
    elif which == "torch":
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q, k, v = (torch.randn(1, 32, n, d, device="cuda") for _ in range(3))
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            for _ in range(3):
                torch.nn.functional.scaled_dot_product_attention(q, k, v)
        torch.cuda.synchronize()
    else:
        raise ValueError(f"first argument must be 'tinyflash' or 'torch'; got {which!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
