"""The FP8 forward (kernel v11) beside v10 on bfloat16, with the Vᵀ pass timed alone: a first look for the notes.

    PYTHONPATH=src python benchmarks/fp8_forward_timing.py [--batch 1] [--heads 32] [--n 16384] [--d 128]
                                                           [--rounds 5] [--causal both|yes|no]

The record is ``python -m tinyflash.bench hopper-fp8`` (v11, v10 and SDPA flash, checked, timed, one CSV row each);
this script times the same two kernels and, besides, v11's pass that writes Vᵀ alone (``forward/hopper_fp8.py``'s
``transposed_v``), which the benchmark's peers cannot show. Needs a Hopper GPU, PyTorch and CuPy. Standard-normal
bfloat16 inputs; v11 gets them quantized per tensor on the GPU, untimed (``bench.fp8_forward.quantized``). Before
anything is timed, v10's output is checked as the benchmarks check every output (``bench.checking.check_output``)
and v11's as the benchmark checks it (``bench.fp8_forward.check_fp8``: the last rows of the first and last head
against ``fp8_attention`` and float64, by ``core.tolerance.fp8_bounds``). Then interleaved rounds
(``time_interleaved``); TFLOP/s counts 4 · N² · d per head (half of it causal) for every peer. Prints; records
nothing.
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--n", type=int, default=16384)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    args = parser.parse_args()

    import torch

    import tinyflash as tf
    from tinyflash.bench.checking import check_output
    from tinyflash.bench.fp8_forward import check_fp8, quantized
    from tinyflash.bench.timing import time_interleaved
    from tinyflash.forward.hopper_fp8 import check_fp8_call, numba_flat, transposed_v

    print(f"{torch.cuda.get_device_name()}; B={args.batch} H={args.heads} N={args.n} d={args.d}")
    rng = np.random.default_rng(0)
    shape = (args.batch, args.heads, args.n, args.d)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    (q8, dq), (k8, dk), (v8, dv) = (quantized(x) for x in (q, k, v))
    for causal in {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]:
        o, lse = tf.hopper_attention(q, k, v, causal=causal)
        verdict = check_output(o, q, k, v, causal=causal, rng=rng, lse=lse)
        assert verdict.ok, f"v10: {verdict}"
        fp8 = check_fp8(tf.hopper_fp8_attention(q8, k8, v8, dq, dk, dv, causal=causal),
                        {"fp8": (q8, k8, v8, dq, dk, dv), "causal": causal})
        assert fp8.ok, f"v11: {fp8}"
        print(f"causal={causal}: v10 checked (error {verdict.error:.3g}, tolerance {verdict.tolerance:.3g}); "
              f"v11 checked (error {fp8.error:.3g}, tolerance {fp8.tolerance:.3g})")
        prob, _, found, _, _, _ = check_fp8_call(q8, k8, v8, dq, dk, dv, causal, None, None)
        vb = numba_flat(found["v"])
        peers = {"v10 bfloat16": (lambda: tf.hopper_attention(q, k, v, causal=causal)[0], nullcontext),
                 "v11 e4m3": (lambda: tf.hopper_fp8_attention(q8, k8, v8, dq, dk, dv, causal=causal)[0],
                              nullcontext),
                 "v11's Vᵀ pass alone": (lambda: transposed_v(vb, prob, v8)[0], nullcontext)}
        times = time_interleaved(peers, rounds=args.rounds)
        flops = 4 * args.batch * args.heads * args.n * args.n * args.d * (0.5 if causal else 1.0)
        for name, t in times.items():
            print(f"  {name:22} {t['time_ms']:8.3f} ms  ({t['time_min_ms']:.3f} .. {t['time_max_ms']:.3f})  "
                  f"{flops / t['time_ms'] / 1e9:7.1f} TFLOP/s  one call alone {t['latency_ms']:.3f} ms")


if __name__ == "__main__":
    main()
