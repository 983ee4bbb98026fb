"""The first call of a new process: how long it waits for its kernels, with and without the disk cache.

    PYTHONPATH=src python benchmarks/cold_start.py figures/data/cold_start_h200.csv [--runs 2]

For each entry point a fresh Python process imports PyTorch and tinyflash, makes its inputs, and times its
first call (until the GPU has finished it), then a second call. The processes run in turn against one cache
folder made empty at the start: the first process finds nothing and compiles (``cache`` = 'miss'), the
next ones load the cubins it kept ('hit'); then the same with the cache turned off ('off'). Each process
checks its result against the first process's (the same inputs from one seed), so a kernel loaded from the
cache is shown to compute what a compiled one does. One CSV row per process: the device, versions and
date, the entry point, the cache's state, the kernel cache's hits and misses in that process, the seconds
of the imports, the first call and the second call. Needs a CUDA GPU and PyTorch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

ENTRIES = {  # name -> (inputs, first call); q, k, v (B=1, H=32, N=4,096, d=128) made before the clock starts
    "tensor_core_attention": ("float16", "tf.tensor_core_attention(q, k, v, causal=True)"),
    "torch training step": ("bfloat16", "torch.autograd.grad(tft.attention(*(x.requires_grad_() for x in (q, k, v)), "
                                        "causal=True, deterministic=True), (q, k, v), q.detach())"),
    "cuda_split_kv_attention": ("float16", "tf.cuda_split_kv_attention(q[:, :, :1], k, v)"),
    "cuda_attention (numba launch, not cached)": ("float16", "tf.cuda_attention(q, k, v, causal=True)"),
}

CHILD = """
import json, sys, time
start = time.perf_counter()
import torch
import tinyflash as tf
import tinyflash.torch as tft
from tinyflash.gpu import kernel_cache
torch.cuda.init()
imported = time.perf_counter() - start
gen = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(1, 32, 4096, 128, device="cuda", generator=gen).to(getattr(torch, {dtype!r})) for _ in range(3))
torch.cuda.synchronize()
times = []
for _ in range(2):
    t0 = time.perf_counter()
    out = {call}
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
first = out[0] if isinstance(out, tuple) else out
print(json.dumps({{"import_s": imported, "first_call_s": times[0], "second_call_s": times[1],
                  "hits": kernel_cache.stats["hits"], "misses": kernel_cache.stats["misses"],
                  "checksum": float(first.detach().double().sum())}}))
"""

FIELDS = ["device", "date", "numpy", "numba_cuda", "cupy", "torch", "commit", "entry", "cache", "run", "hits",
          "misses", "import_s", "first_call_s", "second_call_s", "same_result"]


def child(entry: str, cache: str) -> dict:
    dtype, call = ENTRIES[entry]
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "TINYFLASH_KERNEL_CACHE": cache}
    done = subprocess.run([sys.executable, "-c", CHILD.format(dtype=dtype, call=call)], capture_output=True,
                          text=True, env=env, timeout=600)
    if done.returncode:
        raise SystemExit(f"{entry} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--runs", type=int, default=2, help="processes after the first, with the cache filled")
    args = ap.parse_args(argv)
    import torch

    from tinyflash.bench.record import CsvWriter, environment

    env = {k: v for k, v in environment(torch.cuda.get_device_name()).items() if k in FIELDS}
    writer = CsvWriter(args.csv, FIELDS)
    failed = False
    for entry in ENTRIES:
        with tempfile.TemporaryDirectory() as folder:
            runs = [("miss", folder)] + [("hit", folder)] * args.runs + [("off", "off")]
            reference = None
            for i, (state, cache) in enumerate(runs):
                r = child(entry, cache)
                reference = r["checksum"] if reference is None else reference
                same = r["checksum"] == reference
                failed |= not same
                writer.write({**env, "entry": entry, "cache": state, "run": i, "hits": r["hits"], "misses": r["misses"],
                              "import_s": r["import_s"], "first_call_s": r["first_call_s"],
                              "second_call_s": r["second_call_s"], "same_result": same})
                print(f"{entry:42s} {state:4s}  imports {r['import_s']:5.2f} s  first call {r['first_call_s']:6.2f} s  "
                      f"second {r['second_call_s'] * 1e3:7.2f} ms  hits {r['hits']} misses {r['misses']}"
                      f"{'' if same else '  DIFFERENT RESULT'}", flush=True)
    writer.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
