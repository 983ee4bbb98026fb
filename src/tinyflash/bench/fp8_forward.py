"""The FP8 forward as a benchmark peer: kernel v11 (``tinyflash.hopper_fp8_attention``) beside the 16-bit kernels.

The ``hopper-fp8`` benchmark gives every peer the same bfloat16 (or float16) q, k, v. This peer quantizes them to
e4m3 on the GPU when it is made, untimed: one descale per tensor, max|x| / 448, and PyTorch's conversion (rounding
to nearest), as ``tinyflash.quantize_fp8(granularity="tensor")`` does on the host. What is timed is the call a user
makes on e4m3 inputs: the Vᵀ pass and the kernel.

**Its check.** FP8 cannot pass FlashAttention's rule against the 16-bit inputs (e4m3 keeps 3 mantissa bits, that
is the point of the accuracy study in docs/results.md), so the peer is checked against what it computes:
``tinyflash.fp8_attention`` on the e4m3 inputs, and float64 attention of the values they stand for, by
``core.tolerance.fp8_bounds`` with the GPU's terms, on the last 128 query rows (or fewer) of the first and the last
head. The last rows see every key, causal or not (bottom-right), so that they can be computed without the rows before
them. The verdict's ``error`` is the relative error against the emulation in the max norm, its ``tolerance`` the
bound's largest entry over max|O|, the same measure; ``ok`` holds when every element is within its own bound.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.tolerance import Verdict, fp8_bounds
from .peers import Peer

E4M3_MAX = 448.0  # the largest e4m3 number: each tensor's max|x| is mapped to it
CHECK_ROWS = 128  # the last query rows of a head that the check computes


def quantized(x):
    """x (a PyTorch tensor on the GPU) per tensor in e4m3: (x8, descale) with x ≈ x8 · descale."""
    import torch

    descale = max(float(x.abs().max()), 1e-30) / E4M3_MAX
    return (x.float() / descale).to(torch.float8_e4m3fn), np.float32(descale)


def host_e4m3(x) -> np.ndarray:
    """A PyTorch float8_e4m3fn tensor as a NumPy array of ml_dtypes' float8_e4m3fn (the same bytes)."""
    import torch

    return x.contiguous().view(torch.uint8).cpu().numpy().view("float8_e4m3fn")


def check_fp8(out, x: dict, rng=None) -> Verdict:
    """v11's (o, lse) on the e4m3 inputs ``x["fp8"]`` (module docstring)."""
    from ..forward.fp8 import fp8_attention
    from ..forward.naive import reference_attention

    o, lse = out
    q8, k8, v8, dq, dk, dv = x["fp8"]
    causal, heads, n_q, d = x["causal"], q8.shape[-3], q8.shape[-2], q8.shape[-1]
    group = heads // k8.shape[-3]
    rows = slice(max(0, n_q - CHECK_ROWS), n_q)
    ok, error, tolerance = True, 0.0, math.inf
    for h in sorted({0, heads - 1}):
        lead = (0,) * (q8.ndim - 3)  # the first batch
        qh, kh, vh = host_e4m3(q8[(*lead, h, rows)]), host_e4m3(k8[(*lead, h // group)]), host_e4m3(v8[(*lead, h // group)])
        got_o = o[(*lead, h, rows)].float().cpu().numpy().astype(np.float64)  # (rows, d)
        got_lse = lse[(*lead, h, rows)].cpu().numpy().astype(np.float64)  # (rows,)
        q64, k64, v64 = (a.astype(np.float64) * float(s) for a, s in ((qh, dq), (kh, dk), (vh, dv)))
        qk_max = float((np.abs(q64) @ np.abs(k64).T).max()) / math.sqrt(d)
        v_max = float(np.abs(v64).max())
        emulated = fp8_attention(qh, kh, vh, dq, dk, dv, causal=causal, block_k=128)
        for against, (ref_o, ref_lse) in (("emulation", emulated),
                                          ("float64", reference_attention(q64, k64, v64, causal=causal))):
            o_bound, lse_bound = fp8_bounds(ref_o, ref_lse, v_max, kh.shape[0], d, qk_max, gpu=True, against=against)
            finite = np.isfinite(ref_lse)
            ok = ok and bool(np.all(np.abs(got_o - ref_o) <= o_bound)) and bool(
                np.all(np.abs(got_lse[finite] - ref_lse[finite]) <= lse_bound[finite])) and np.array_equal(
                got_lse[~finite], ref_lse[~finite])
        scale = max(float(np.abs(emulated[0]).max()), 1e-30)
        error = max(error, float(np.abs(got_o - emulated[0]).max()) / scale)
        tolerance = min(tolerance, float(fp8_bounds(emulated[0], emulated[1], v_max, kh.shape[0], d, qk_max, gpu=True,
                                                    against="emulation")[0].max()) / scale)
    return Verdict(ok, error, tolerance)


def stage4_fp8() -> Peer:
    """tinyflash.hopper_fp8_attention (kernel v11) on the inputs quantized per tensor to e4m3 (module docstring)."""
    def make(x):
        from ..forward.hopper_fp8 import hopper_fp8_attention

        (q8, dq), (k8, dk), (v8, dv) = (quantized(x[n]) for n in ("q", "k", "v"))
        x["fp8"] = (q8, k8, v8, dq, dk, dv)  # what the check reads
        return lambda: hopper_fp8_attention(q8, k8, v8, dq, dk, dv, causal=x["causal"])

    return Peer("tinyflash", "v11 e4m3", make, ("float16", "bfloat16"), check=check_fp8)
