"""How close the tensor-core forward comes to FlashAttention's rule, seed after seed, beside SDPA's flash backend.

    PYTHONPATH=src python benchmarks/accuracy.py figures/data/accuracy_h200.csv [--seeds 20]

For float16 and bfloat16, d = 64 and 128, causal or not, at N = 2,048 (B = 1, H = 4), and for each seed:
fresh standard-normal q, k, v rounded to the type; the float64 reference; and the largest absolute
error over every element of o of ``tinyflash.tensor_core_attention``, of SDPA's flash backend on the same
inputs, and of naive attention in the same type (S and P stored in it: ``tinyflash.bench.checking``, the
baseline of FlashAttention's rule). One CSV row per (configuration, seed) with the device, versions and
date; at the end, per configuration, the largest ratio to the naive error (the rule allows 2 plus the
rounding of the output) and to SDPA's. Needs a CUDA GPU and PyTorch.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

FIELDS = ["device", "date", "numpy", "numba_cuda", "cupy", "torch", "commit", "dtype", "d", "causal", "n", "heads",
          "seed", "err_tinyflash", "err_sdpa_flash", "err_naive", "rounding_atol", "within_rule"]


def errors(seed: int, dtype: str, d: int, causal: bool, n: int, heads: int) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tinyflash as tf
    from tinyflash.bench.checking import naive_attention
    from tinyflash.core.tolerance import rounding_atol

    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(1, heads, n, d, device="cuda", generator=gen).to(getattr(torch, dtype)) for _ in range(3))
    s = (q.double() @ k.double().transpose(-1, -2)) * d**-0.5
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    ref = torch.softmax(s, -1) @ v.double()
    ours, _ = tf.tensor_core_attention(q, k, v, causal=causal)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        flash = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    naive = torch.stack([naive_attention(q[0, h], k[0, h], v[0, h], causal=causal) for h in range(heads)])[None]
    err = {name: float((x.double() - ref).abs().max()) for name, x in (("tinyflash", ours), ("sdpa_flash", flash),
                                                                        ("naive", naive))}
    atol = float(rounding_atol(ref.cpu().numpy(), dtype))
    return {"err_tinyflash": err["tinyflash"], "err_sdpa_flash": err["sdpa_flash"], "err_naive": err["naive"],
            "rounding_atol": atol, "within_rule": err["tinyflash"] <= 2 * err["naive"] + atol}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=4)
    args = ap.parse_args(argv)
    import torch

    from tinyflash.bench.record import CsvWriter, environment

    env = {k: v for k, v in environment(torch.cuda.get_device_name()).items() if k in FIELDS}
    writer = CsvWriter(args.csv, FIELDS)
    outside = 0
    for dtype, d, causal in itertools.product(("float16", "bfloat16"), (64, 128), (False, True)):
        rows = []
        for seed in range(args.seeds):
            row = {"dtype": dtype, "d": d, "causal": causal, "n": args.n, "heads": args.heads, "seed": seed,
                   **errors(seed, dtype, d, causal, args.n, args.heads)}
            writer.write({**env, **row})
            rows.append(row)
        to_naive = max(r["err_tinyflash"] / r["err_naive"] for r in rows)
        to_flash = max(r["err_tinyflash"] / r["err_sdpa_flash"] for r in rows)
        beyond = sum(not r["within_rule"] for r in rows)
        outside += beyond
        print(f"{dtype:8s} d={d:3d} causal={causal!s:5s}: largest error over naive's {to_naive:.2f}×, over SDPA "
              f"flash's {to_flash:.2f}×; {beyond} of {len(rows)} seeds outside the rule", flush=True)
    writer.close()
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main())
