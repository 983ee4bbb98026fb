"""The FP8 forward (kernel v11, ``tinyflash.hopper_fp8_attention``) timed beside v10 on bfloat16, each checked first.

    PYTHONPATH=src python benchmarks/fp8_forward_timing.py [--batch 1] [--heads 32] [--n 16384] [--d 128]
                                                           [--rounds 5] [--causal both|yes|no]

Needs a Hopper GPU, PyTorch and CuPy (the clock: ``tinyflash.bench.timing``). The inputs are standard-normal
bfloat16 tensors; v11 gets them quantized per tensor on the GPU (descale = max|x| / 448, e4m3 by PyTorch's
conversion), untimed. Before anything is timed:

* v10's bfloat16 output is checked as the benchmarks check every output (``bench.checking.check_output``:
  FlashAttention's rule on sampled rows of the first and last head);
* v11's, on the last 128 query rows of the first and last head (rows whose causal keys are all the keys, so that
  they can be computed alone), against ``tinyflash.fp8_attention`` and against float64 attention of the values
  the e4m3 inputs stand for, by ``core.tolerance.fp8_bounds`` with the GPU's terms.

Then the peers are timed in interleaved rounds (``time_interleaved``: each settled, queued back to back, medians):
v10 on bfloat16 (``hopper_attention``), v11 as a user calls it (the Vᵀ pass and the kernel, through numba's
launch), and the Vᵀ pass alone. TFLOP/s counts 4 · N² · d per head (half of it causal), the same for every peer,
so that the ratio is the time's. Prints one line per peer; records nothing (a first measurement, for the notes).
"""

from __future__ import annotations

import argparse
import math
from contextlib import nullcontext

import numpy as np


def quantized(x, torch):
    """x (bfloat16, on the GPU) per tensor in e4m3: (x8, descale), x ≈ x8 · descale."""
    descale = max(float(x.abs().max()), 1e-30) / 448.0
    return (x.float() / descale).to(torch.float8_e4m3fn), np.float32(descale)


def check_fp8(o, lse, q8, k8, v8, dq, dk, dv, causal: bool) -> str:
    """v11's o, lse on the last 128 rows of the first and last head against the emulation and float64; raises
    on a miss, else returns the worst error over its bound."""
    import torch

    import tinyflash as tf
    from tinyflash.core.tolerance import fp8_bounds

    def host(x):  # e4m3 bytes on the GPU -> a NumPy array of ml_dtypes' float8_e4m3fn
        return x.contiguous().view(torch.uint8).cpu().numpy().view("float8_e4m3fn")

    heads, n_q, d = q8.shape[1], q8.shape[2], q8.shape[3]
    rows = slice(max(0, n_q - 128), n_q)
    worst = 0.0
    for h in sorted({0, heads - 1}):
        qh, kh, vh = host(q8[0, h, rows]), host(k8[0, h]), host(v8[0, h])  # (128, d), (Nk, d), (Nk, d)
        got_o = o[0, h, rows].float().cpu().numpy().astype(np.float64)
        got_lse = lse[0, h, rows].cpu().numpy().astype(np.float64)
        q64, k64, v64 = (a.astype(np.float64) * s for a, s in ((qh, dq), (kh, dk), (vh, dv)))
        qk_max = float((np.abs(q64) @ np.abs(k64).T).max()) / math.sqrt(d)
        v_max = float(np.abs(v64).max())
        for against, (ref_o, ref_lse) in (("emulation", tf.fp8_attention(qh, kh, vh, dq, dk, dv, causal=causal,
                                                                         block_k=128)),
                                          ("float64", tf.reference_attention(q64, k64, v64, causal=causal))):
            o_bound, lse_bound = fp8_bounds(ref_o, ref_lse, v_max, kh.shape[0], d, qk_max, gpu=True, against=against)
            excess_o = float((np.abs(got_o - ref_o) / o_bound).max())
            excess_lse = float((np.abs(got_lse - ref_lse) / lse_bound).max())
            if not (excess_o <= 1 and excess_lse <= 1):
                raise AssertionError(f"v11 head {h} against {against}: o error {excess_o:.3g}, lse error "
                                     f"{excess_lse:.3g} of the bound")
            worst = max(worst, excess_o, excess_lse)
    return f"v11 checked (worst error {worst:.3f} of its bound)"


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
    from tinyflash.bench.timing import time_interleaved
    from tinyflash.forward.hopper_fp8 import check_fp8_call, numba_flat, transposed_v

    print(f"{torch.cuda.get_device_name()}; B={args.batch} H={args.heads} N={args.n} d={args.d}")
    rng = np.random.default_rng(0)
    shape = (args.batch, args.heads, args.n, args.d)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    (q8, dq), (k8, dk), (v8, dv) = (quantized(x, torch) for x in (q, k, v))
    for causal in {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]:
        o, lse = tf.hopper_attention(q, k, v, causal=causal)
        verdict = check_output(o, q, k, v, causal=causal, rng=rng, lse=lse)
        assert verdict.ok, f"v10: {verdict}"
        o8, lse8 = tf.hopper_fp8_attention(q8, k8, v8, dq, dk, dv, causal=causal)
        print(f"causal={causal}: v10 checked (error {verdict.error:.3g}, tolerance {verdict.tolerance:.3g}); "
              + check_fp8(o8, lse8, q8, k8, v8, dq, dk, dv, causal))
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
