"""FP8 attention's accuracy on the CPU: the RMSE of O against float64, bfloat16 beside FP8's scalings.

    python -m tinyflash.bench.fp8_accuracy --csv figures/data/fp8_accuracy.csv

FlashAttention-3's experiment (its section on FP8's accuracy): q, k and v with standard normal entries, of which
a fraction (0.1%) is drawn with ten times the scale instead, the outlier features that FP8's scaling must
survive (``tinyflash.core.quantize.outlier_inputs``); the root-mean-square error of O against the float64
reference, for

* ``bfloat16``: q, k, v rounded to bfloat16 (ml_dtypes), S in float32, P rounded to bfloat16 before P·V with
  float32 accumulation, as the 16-bit kernels compute;
* ``fp8 per tensor``, ``fp8 per block``: ``quantize_fp8`` with one descale per tensor or per block of rows, then
  ``fp8_attention``, the emulated FP8 forward (P in e4m3 after FlashAttention-3's offset);
* the same two with ``rotated``: Q and K rotated by a random Hadamard matrix before quantization (incoherent
  processing);
* rows that take FP8's error apart, each rounding alone with everything else in float32: ``e4m3 P only`` (P
  rounded to e4m3, with the offset), ``e4m3 V only`` (V quantized per tensor), ``e4m3 Q, K only`` (Q and K
  quantized per tensor), and that with the rotation; ``fp8 per tensor, P offset 0``: P rounded in [0, 1],
  without FlashAttention-3's offset.

Every method's O is rounded to bfloat16 at the end, as the kernels write it. One CSV row per (d, seed, method),
with ``rmse_vs_per_tensor`` = the per-tensor FP8 RMSE over this one's (above 1: more accurate than per tensor).
The issue's bar: block scaling with rotation at least 2× lower RMSE than per-tensor FP8 on this input.
NumPy's BLAS may start a thread per core for each product: on a shared machine, OPENBLAS_NUM_THREADS=1 keeps the
run to seconds.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

import numpy as np

from ..core.e4m3 import round_e4m3
from ..core.quantize import OUTLIER_FRACTION, OUTLIER_SCALE, outlier_inputs, quantize_fp8
from ..forward.fp8 import P_OFFSET, fp8_attention
from ..forward.naive import reference_attention
from .record import CsvWriter, environment

FIELDS = ["device", "date", "numpy", "ml_dtypes", "commit", "method", "batch", "heads", "n", "d", "block", "seed",
          "outlier_fraction", "outlier_scale", "rmse", "rmse_vs_per_tensor"]
METHODS = {  # name: (granularity, rotate, p_offset) of the FP8 forward, or the name of a NumPy computation
    "bfloat16": "bfloat16", "e4m3 P only": "e4m3 P", "e4m3 V only": "e4m3 V", "e4m3 Q, K only": "e4m3 QK",
    "e4m3 Q, K only, rotated": "e4m3 QK rotated", "fp8 per tensor, P offset 0": ("tensor", False, 0),
    "fp8 per tensor": ("tensor", False, P_OFFSET), "fp8 per block": ("block", False, P_OFFSET),
    "fp8 per tensor, rotated": ("tensor", True, P_OFFSET), "fp8 per block, rotated": ("block", True, P_OFFSET),
}
HEAD_DIMS, N, HEADS, BLOCK, SEEDS = (64, 128, 256), 1024, 4, 64, (0, 1, 2)
BAR = 2.0  # block scaling with rotation: at least 2× lower RMSE than per tensor


def to_bfloat16(x) -> np.ndarray:
    """x rounded to bfloat16 (to nearest even), returned as float32."""
    import ml_dtypes

    return np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float32)


def rounded_attention(q, k, v, round_p, p_scale: float = 1.0) -> np.ndarray:
    """Attention in float32 with P = p_scale · exp(S - m) rounded by ``round_p`` before P·V (float32 accumulation)
    and l summed from the unrounded P, as the kernels do. O (..., N, dv) in float32."""
    s = (q @ np.swapaxes(k, -1, -2)) * np.float32(1 / np.sqrt(q.shape[-1]))  # (..., N, N)
    p = np.exp(s - s.max(axis=-1, keepdims=True)) * np.float32(p_scale)  # (..., N, N) float32
    return (round_p(p) @ v) / p.sum(axis=-1, keepdims=True)  # (..., N, dv)


def method_output(method: str, q, k, v, seed: int, block: int = BLOCK) -> np.ndarray:
    """O of one method, rounded to bfloat16 as the kernels write it (float64 values)."""
    how = METHODS[method]
    if how == "bfloat16":  # the 16-bit kernels: bfloat16 inputs, P rounded to bfloat16
        o = rounded_attention(to_bfloat16(q), to_bfloat16(k), to_bfloat16(v), to_bfloat16)
    elif how == "e4m3 P":  # FP8's rounding of P alone: float32 inputs, P = 2^offset · exp(S - m) rounded to e4m3
        o = rounded_attention(q, k, v, round_e4m3, 2.0**P_OFFSET)
    elif how == "e4m3 V":  # V's rounding alone: V quantized per tensor, the rest in float32, P unrounded
        fp8 = quantize_fp8(q, k, v)
        o = rounded_attention(q, k, fp8.v.astype(np.float32) * fp8.descale_v, lambda p: p)
    elif how in ("e4m3 QK", "e4m3 QK rotated"):  # Q's and K's rounding alone (per tensor): Q Kᵀ is the same rotated or not
        fp8 = quantize_fp8(q, k, v, rotate=how.endswith("rotated"), seed=seed)
        q8, k8 = fp8.q.astype(np.float32) * fp8.descale_q, fp8.k.astype(np.float32) * fp8.descale_k
        o = rounded_attention(q8, k8, v, lambda p: p)
    else:
        granularity, rotate, p_offset = how
        fp8 = quantize_fp8(q, k, v, granularity=granularity, block=block, rotate=rotate, seed=seed)
        o, _ = fp8_attention(*fp8, block_q=block, block_k=block, p_offset=p_offset)
    return to_bfloat16(o).astype(np.float64)


def measure(d: int, seed: int, n: int = N, heads: int = HEADS, block: int = BLOCK) -> dict:
    """method -> RMSE of O against float64 for one input (batch 1)."""
    rng = np.random.default_rng([seed, d])
    q, k, v = outlier_inputs(rng, (1, heads, n, d))
    ref, _ = reference_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    return {m: float(np.sqrt(np.mean((method_output(m, q, k, v, seed, block) - ref) ** 2))) for m in METHODS}


def rows(head_dims=HEAD_DIMS, seeds=SEEDS, n: int = N, heads: int = HEADS, block: int = BLOCK):
    """The CSV's rows (without the environment's fields), one per (d, seed, method)."""
    for d in head_dims:
        for seed in seeds:
            rmse = measure(d, seed, n, heads, block)
            for method, value in rmse.items():
                yield {"method": method, "batch": 1, "heads": heads, "n": n, "d": d, "block": block, "seed": seed,
                       "outlier_fraction": OUTLIER_FRACTION, "outlier_scale": OUTLIER_SCALE, "rmse": value,
                       "rmse_vs_per_tensor": rmse["fp8 per tensor"] / value}


def table(record: list[dict]) -> str:
    """The docs' table: per head dim, each method's RMSE (mean over seeds) and the per-tensor RMSE over it."""
    head_dims = sorted({int(r["d"]) for r in record})
    lines = ["| method | " + " | ".join(f"d = {d}" for d in head_dims) + " |", "|---|" + "---|" * len(head_dims)]
    for method in dict.fromkeys(r["method"] for r in record):
        cells = []
        for d in head_dims:
            mine = [r for r in record if r["method"] == method and int(r["d"]) == d]
            rmse = np.mean([float(r["rmse"]) for r in mine])
            ratio = np.mean([float(r["rmse_vs_per_tensor"]) for r in mine])
            cells.append(f"{rmse:.2e} ({ratio:.2f}×)")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sentence(record: list[dict]) -> str:
    """What the table says about the bar, with the setting of the run."""
    r0, head_dims = record[0], sorted({int(r["d"]) for r in record})
    gains = {d: [float(r["rmse_vs_per_tensor"]) for r in record
                 if r["method"] == "fp8 per block, rotated" and int(r["d"]) == d] for d in head_dims}
    least = min(min(g) for g in gains.values())
    said = ", ".join(f"{np.mean(gains[d]):.2f}× at d = {d}" for d in head_dims)
    return (f"RMSE of O against float64 (in brackets: per-tensor FP8's RMSE over the method's, above 1 more accurate), "
            f"the mean of {len({r['seed'] for r in record})} seeds; batch 1, H = {r0['heads']}, N = {int(r0['n']):,}, "
            f"blocks of {r0['block']} rows, {float(r0['outlier_fraction']):.1%} of the entries drawn with "
            f"{float(r0['outlier_scale']):g}× the scale; O rounded to bfloat16 for every method ({r0['device']}, numpy "
            f"{r0['numpy']}, ml_dtypes {r0['ml_dtypes']}, {r0['date'][:10]}, commit {r0['commit']}). The bar, block "
            f"scaling with rotation at least {BAR:g}× lower RMSE than per-tensor FP8, is "
            f"{'met' if least >= BAR else 'not met'}: {said}, {least:.2f}× for the least of its seeds.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tinyflash.bench.fp8_accuracy", description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", help="write the rows here (figures/data/fp8_accuracy.csv is the record)")
    args = ap.parse_args(argv)
    import ml_dtypes

    env = environment(f"CPU ({platform.machine()})")
    env = {"device": env["device"], "date": env["date"], "numpy": env["numpy"], "ml_dtypes": ml_dtypes.__version__,
           "commit": env["commit"]}
    writer, record, start = CsvWriter(args.csv, FIELDS), [], time.perf_counter()
    for row in rows():
        writer.write({**env, **row})
        record.append({**env, **{k: str(v) for k, v in row.items()}})
    writer.close()
    print(table(record) + "\n\n" + sentence(record) + f"\n({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
