"""Benchmark the forward pass on a GPU: tinyflash's kernel, naive CuPy attention, PyTorch SDPA.

    python -m tinyflash.bench --csv figures/data/bench_h200.csv          # the full sweep
    python -m tinyflash.bench --quick                                   # a few sizes
    python -m tinyflash.bench --seed-example --csv seed_example.csv     # B=1, H=32, N=32k, fp16, causal

Every (implementation, size) is first checked against a float64 reference on a sample of rows
and only then timed: CUDA events around one call, median of repeated calls after a warm-up.
TFLOP/s counts 4·B·H·Nq·Nk·d floating-point operations (two matrix products), halved for causal
attention. Peak extra memory is the largest number of bytes the call holds in the framework's
allocator beyond what was live before it (the inputs): for tinyflash and naive CuPy, a CuPy
memory hook counts every allocation from CuPy's pool (tinyflash allocates its outputs there
when given CuPy arrays; its kernel allocates nothing else); for PyTorch,
torch.cuda.max_memory_allocated(). Workspace that a library allocates outside these allocators
(e.g. cuBLAS's own) is not counted. Naive attention that does not fit is recorded as "oom".
Needs CuPy; PyTorch is optional.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import os
import statistics
import sys

# All work here runs on the legacy default stream, so numba need not synchronise on the stream
# a CuPy array reports (which it does by default before every launch with such arrays).
os.environ.setdefault("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "0")

import numpy as np  # noqa: E402

FIELDS = ["device", "date", "numpy", "numba_cuda", "cupy", "torch", "impl", "dtype", "causal", "batch", "heads",
          "n", "d", "time_ms", "tflops", "peak_bytes", "status", "max_rel_err"]
IMPLS = ("tinyflash", "cupy_naive", "torch_flash", "torch_efficient")
# Validation bounds for the sampled relative error (max norm) before anything is timed.
CHECK_TOL = {"float32": 1e-4, "float16": 1e-2}


def attention_flops(batch: int, heads: int, n_q: int, n_k: int, d: int, causal: bool) -> float:
    """4·B·H·Nq·Nk·d: Q Kᵀ and P V, 2 operations per multiply-add; causal does about half."""
    f = 4.0 * batch * heads * n_q * n_k * d
    return f / 2 if causal else f


def environment() -> dict:
    """Device, library versions and date, written into every CSV row."""
    import cupy

    env = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "numpy": np.__version__, "cupy": cupy.__version__}
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    env["device"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    try:
        from importlib.metadata import version

        env["numba_cuda"] = version("numba-cuda")
    except Exception:
        env["numba_cuda"] = "unknown"
    try:
        import torch

        env["torch"] = torch.__version__
    except ImportError:
        env["torch"] = ""
    return env


def time_call(fn, *, warmup: int = 1, min_reps: int = 3, max_reps: int = 20, min_total_ms: float = 300.0) -> float:
    """Median milliseconds of ``fn()`` between two CUDA events, after ``warmup`` untimed calls."""
    import cupy

    for _ in range(warmup):
        fn()
    cupy.cuda.Device().synchronize()
    times = []
    while len(times) < min_reps or (sum(times) < min_total_ms and len(times) < max_reps):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def _peak_hook_class():
    import cupy

    class PeakMemory(cupy.cuda.MemoryHook):
        """Counts bytes taken from CuPy's pool while active; ``peak`` is the most held at once."""

        name = "PeakMemory"

        def __init__(self):
            self.live = 0
            self.peak = 0

        def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
            self.live += mem_size
            self.peak = max(self.peak, self.live)

        def free_postprocess(self, device_id, mem_size, mem_ptr, pmem_id):
            self.live -= mem_size

    return PeakMemory


def cupy_naive_attention(q, k, v, *, causal: bool = False, scale: float | None = None):
    """Standard attention on the GPU with CuPy: S and P are materialised in HBM (cuBLAS matmuls).

    S and P are stored in the input dtype, as the seeds' memory model assumes.
    """
    import cupy

    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    S = cupy.matmul(q, k.swapaxes(-1, -2))  # (..., Nq, Nk)  written to HBM
    S *= S.dtype.type(scale)
    if causal:
        allowed = cupy.tri(n_q, n_k, k=n_k - n_q, dtype=bool)  # (Nq, Nk), bottom-right aligned
        cupy.copyto(S, S.dtype.type(-np.inf), where=~allowed)  # masked pairs: probability 0
    P = S - S.max(axis=-1, keepdims=True)  # (..., Nq, Nk)  read S, write P
    del S
    cupy.exp(P, out=P)
    P /= P.sum(axis=-1, keepdims=True, dtype=np.float32).astype(P.dtype)
    return cupy.matmul(P, v)  # (..., Nq, dv)  read P


def sample_error(o, q, k, v, *, causal: bool, rng, rows: int = 64) -> float:
    """Max-norm relative error of ``o`` on a sample of rows of the first and last head, in float64."""
    import cupy

    b_last, h_last = q.shape[0] - 1, q.shape[1] - 1
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    idx = cupy.asarray(np.sort(rng.choice(n_q, size=min(rows, n_q), replace=False)))
    worst = 0.0
    for b, h in {(0, 0), (b_last, h_last)}:
        qs = q[b, h, idx].astype(np.float64)  # (rows, d)
        S = qs @ k[b, h].astype(np.float64).T / math.sqrt(d)  # (rows, Nk)
        if causal:
            allowed = cupy.arange(n_k)[None, :] <= idx[:, None] + (n_k - n_q)
            S = cupy.where(allowed, S, -np.inf)
        P = cupy.exp(S - S.max(axis=1, keepdims=True))
        ref = (P / P.sum(axis=1, keepdims=True)) @ v[b, h].astype(np.float64)  # (rows, dv)
        got = o[b, h, idx].astype(np.float64)
        worst = max(worst, float(cupy.abs(got - ref).max() / cupy.abs(ref).max()))
    return worst


def _implementations(torch_ok: bool):
    """name -> (function of cupy q, k, v, causal returning o, kind) where kind picks the memory meter."""
    import tinyflash

    impls = {
        "tinyflash": (lambda q, k, v, causal: tinyflash.cuda_attention(q, k, v, causal=causal)[0], "cupy"),
        "cupy_naive": (lambda q, k, v, causal: cupy_naive_attention(q, k, v, causal=causal), "cupy"),
    }
    if torch_ok:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def sdpa(backend):
            def run(q, k, v, causal):
                tq, tk, tv = (torch.from_dlpack(x) for x in (q, k, v))  # zero-copy views
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

            return run

        impls["torch_flash"] = (sdpa(SDPBackend.FLASH_ATTENTION), "torch")
        impls["torch_efficient"] = (sdpa(SDPBackend.EFFICIENT_ATTENTION), "torch")
    return impls


def measure(fn, kind: str, q, k, v, causal: bool, rng) -> dict:
    """Check one implementation on one input, then time it and meter its memory."""
    import cupy

    pool = cupy.get_default_memory_pool()
    try:
        if kind == "torch":
            import torch

            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            out = fn(q, k, v, causal)
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
            o = cupy.from_dlpack(out)
        else:
            with _peak_hook_class()() as hook:
                o = fn(q, k, v, causal)
                cupy.cuda.Device().synchronize()
            peak = hook.peak
        err = sample_error(o, q, k, v, causal=causal, rng=rng)
        del o
        tol = CHECK_TOL[np.dtype(q.dtype).name]
        if not err <= tol:
            return {"status": f"wrong (error {err:.2e} > {tol:.0e})", "max_rel_err": err, "peak_bytes": peak}
        ms = time_call(lambda: fn(q, k, v, causal))
        return {"status": "ok", "time_ms": ms, "peak_bytes": peak, "max_rel_err": err}
    except cupy.cuda.memory.OutOfMemoryError:
        return {"status": "oom"}
    except Exception as exc:  # a backend that refuses these inputs (e.g. flash with float32)
        if type(exc).__name__ == "OutOfMemoryError":
            return {"status": "oom"}
        if "No available kernel" in str(exc) or "not supported" in str(exc).lower():
            return {"status": "unsupported"}
        raise
    finally:
        pool.free_all_blocks()
        if kind == "torch":
            import torch

            torch.cuda.empty_cache()


def run(ns, ds, dtypes, causals, impls, *, batch: int, heads: int, csv_path: str | None, seed: int | None = None):
    """The sweep: prints one line per measurement and writes the CSV (rows written as they come)."""
    import cupy

    try:
        import torch  # noqa: F401

        torch_ok = True
    except ImportError:
        torch_ok = False
    available = _implementations(torch_ok)
    env = environment()
    rng = np.random.default_rng(seed)
    rows = []
    out = open(csv_path, "w", newline="") if csv_path else None
    writer = csv.DictWriter(out, fieldnames=FIELDS) if out else None
    if writer:
        writer.writeheader()
    print(f"{env['device']}  numpy {env['numpy']}  numba-cuda {env['numba_cuda']}  cupy {env['cupy']}  "
          f"torch {env['torch'] or '-'}  {env['date']}")
    print(f"{'impl':16} {'dtype':8} {'causal':6} {'N':>6} {'d':>4} {'ms':>9} {'TFLOP/s':>8} {'extra MiB':>10} "
          f"{'rel err':>8}  status")
    for dtype in dtypes:
        for d in ds:
            for causal in causals:
                for n in ns:
                    shape = (batch, heads, n, d)
                    gen = cupy.random.default_rng(int(rng.integers(2**31)))
                    q, k, v = (gen.standard_normal(shape, dtype=np.float32).astype(dtype) for _ in range(3))
                    for name in impls:
                        if name not in available:
                            continue
                        fn, kind = available[name]
                        res = measure(fn, kind, q, k, v, causal, rng)
                        row = {**env, "impl": name, "dtype": np.dtype(dtype).name, "causal": causal, "batch": batch,
                               "heads": heads, "n": n, "d": d, **res}
                        if "time_ms" in res:
                            row["tflops"] = attention_flops(batch, heads, n, n, d, causal) / (res["time_ms"] * 1e9)
                        rows.append(row)
                        if writer:
                            writer.writerow({f: _fmt(row.get(f, "")) for f in FIELDS})
                            out.flush()
                        print(_line(row), flush=True)
                    del q, k, v
                    cupy.get_default_memory_pool().free_all_blocks()
    if out:
        out.close()
    return rows


def _fmt(x):
    if isinstance(x, float):
        return f"{x:.6g}"
    return x


def _line(row: dict) -> str:
    ms = f"{row['time_ms']:9.3f}" if "time_ms" in row else f"{'-':>9}"
    tf = f"{row['tflops']:8.1f}" if "tflops" in row else f"{'-':>8}"
    mem = f"{row['peak_bytes'] / 2**20:10.1f}" if row.get("peak_bytes") not in (None, "") else f"{'-':>10}"
    err = f"{row['max_rel_err']:8.1e}" if "max_rel_err" in row else f"{'-':>8}"
    return (f"{row['impl']:16} {row['dtype']:8} {str(row['causal']):6} {row['n']:6d} {row['d']:4d} {ms} {tf} {mem} "
            f"{err}  {row['status']}")


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def summary_table(rows: list[dict], n: int = 16384) -> str:
    """A Markdown table of one sequence length from a benchmark CSV (the README's results table).

    One line per (dtype, d, causal): TFLOP/s of each implementation, tinyflash's speed relative
    to PyTorch's memory-efficient backend and to naive CuPy, and extra memory against naive CuPy.
    """
    ok = {(r["impl"], r["dtype"], r["d"], r["causal"]): r for r in rows if r["status"] == "ok" and int(r["n"]) == n}
    seen = {r["impl"]: r["status"] for r in rows if int(r["n"]) == n}
    if not ok:
        raise ValueError(f"no successful measurement at N={n} in the CSV")

    def cell(impl, key, field, fmt):
        r = ok.get((impl, *key))
        return fmt.format(float(r[field])) if r else ("OOM" if seen.get(impl) == "oom" else "–")

    lines = ["| dtype | d | causal | tinyflash TFLOP/s | SDPA efficient | SDPA flash | naive CuPy | "
             "tinyflash / efficient | speed-up over naive | extra memory, tinyflash / naive |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({k[1:] for k in ok}, key=lambda k: (k[0], int(k[1]), k[2]))
    for key in keys:
        tf_row, eff, naive = ok.get(("tinyflash", *key)), ok.get(("torch_efficient", *key)), ok.get(("cupy_naive", *key))
        ratio = f"{float(eff['time_ms']) / float(tf_row['time_ms']):.2f}×" if tf_row and eff else "–"
        speed = f"{float(naive['time_ms']) / float(tf_row['time_ms']):.1f}×" if tf_row and naive else "–"
        mem = (f"{int(tf_row['peak_bytes']) / 2**20:.0f} MiB / {int(naive['peak_bytes']) / 2**20:.0f} MiB"
               if tf_row and naive else "–")
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {cell('tinyflash', key, 'tflops', '{:.1f}')} | "
                     f"{cell('torch_efficient', key, 'tflops', '{:.1f}')} | {cell('torch_flash', key, 'tflops', '{:.1f}')} | "
                     f"{cell('cupy_naive', key, 'tflops', '{:.1f}')} | {ratio} | {speed} | {mem} |")
    return "\n".join(lines)


def seed_example_table(row: dict) -> str:
    """The README's Markdown table of a --seed-example result (one CSV row)."""
    gib = 2**30
    return "\n".join([
        "| time | TFLOP/s | memory held (inputs + extra) | q, k, v, o, lse alone | fp16 scores alone would need | "
        "max rel. error (sampled rows, float64 reference) |",
        "|---|---|---|---|---|---|",
        f"| {float(row['time_ms']):.1f} ms | {float(row['tflops']):.1f} | {int(row['total_peak_bytes']) / gib:.2f} GiB | "
        f"{int(row['model_qkvo_lse_bytes']) / gib:.2f} GiB | {int(row['model_fp16_scores_bytes']) / gib:.0f} GiB | "
        f"{float(row['max_rel_err']):.1e} |",
    ])


def seed_example(csv_path: str | None, seed: int | None = None) -> dict:
    """The seeds' example end to end: B=1, H=32, N=32,768, d=128, float16, causal, on tinyflash.

    Reports the time, the device memory held during the call (inputs included, compared with the
    size of q, k, v, o and lse alone, and with the 64 GiB the fp16 scores alone would need), and
    the error on a sample of rows against a float64 reference.
    """
    import cupy

    import tinyflash
    from tinyflash.memory import attention_memory

    env = environment()
    rng = np.random.default_rng(seed)
    B, H, N, d = 1, 32, 32_768, 128
    gen = cupy.random.default_rng(int(rng.integers(2**31)))
    q, k, v = (gen.standard_normal((B, H, N, d), dtype=np.float32).astype(np.float16) for _ in range(3))
    pool = cupy.get_default_memory_pool()
    inputs = pool.used_bytes()
    free_before, _ = cupy.cuda.runtime.memGetInfo()
    with _peak_hook_class()() as hook:
        o, lse = tinyflash.cuda_attention(q, k, v, causal=True)
        cupy.cuda.Device().synchronize()
    free_after, _ = cupy.cuda.runtime.memGetInfo()
    err = sample_error(o, q, k, v, causal=True, rng=rng, rows=128)
    ms = time_call(lambda: tinyflash.cuda_attention(q, k, v, causal=True))
    model = attention_memory(N, d, heads=H, batch=B, dtype="float16")
    res = {
        **env, "time_ms": ms, "tflops": attention_flops(B, H, N, N, d, True) / (ms * 1e9),
        "inputs_bytes": inputs, "extra_peak_bytes": hook.peak, "total_peak_bytes": inputs + hook.peak,
        "driver_growth_bytes": free_before - free_after, "model_qkvo_lse_bytes": model.qkv + model.o + model.lse,
        "model_fp16_scores_bytes": model.scores, "max_rel_err": err,
    }
    for key, val in res.items():
        print(f"{key:24} {val}")
    if csv_path:
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(res))
            w.writeheader()
            w.writerow({key: _fmt(val) for key, val in res.items()})
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--csv", help="write the results here (default: print only)")
    ap.add_argument("--n", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--dtype", nargs="+", default=["float16", "float32"], choices=["float16", "float32"])
    ap.add_argument("--causal", nargs="+", default=["False", "True"], choices=["False", "True"])
    ap.add_argument("--impl", nargs="+", default=list(IMPLS), choices=list(IMPLS))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: fresh)")
    ap.add_argument("--quick", action="store_true", help="N in {1024, 4096} only")
    ap.add_argument("--seed-example", action="store_true", help="run the seeds' 32k example instead of the sweep")
    ap.add_argument("--summary", metavar="CSV", help="print the README's Markdown table of an existing CSV "
                    "(the sweep's or --seed-example's) and exit")
    ap.add_argument("--summary-n", type=int, default=16384, help="the sequence length of that table")
    args = ap.parse_args(argv)
    if args.summary:
        rows = read_csv(args.summary)
        print(seed_example_table(rows[0]) if "total_peak_bytes" in rows[0] else summary_table(rows, args.summary_n))
        return 0
    try:
        import cupy

        if not cupy.cuda.is_available():
            raise RuntimeError("CuPy sees no GPU")
    except Exception as exc:
        print(f"tinyflash.bench needs a CUDA GPU and CuPy: {exc}", file=sys.stderr)
        return 2
    if args.seed_example:
        seed_example(args.csv, args.seed)
        return 0
    ns = [1024, 4096] if args.quick else args.n
    run(ns, args.d, [np.dtype(x) for x in args.dtype], [c == "True" for c in args.causal], args.impl,
        batch=args.batch, heads=args.heads, csv_path=args.csv, seed=args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
