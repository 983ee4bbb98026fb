"""The one runner: for every point of a benchmark, fresh inputs; every peer checked; those that passed
timed together; one row each, written to the record as it comes.

    rows = run(BENCHMARKS["tensor-cores"], csv_path="figures/data/tensor_cores_h200.csv")

A peer that runs out of memory gets status 'oom', one that refuses the inputs 'unsupported', one
whose result fails the check 'wrong (error ... > ...)'; none of them is timed.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np

from . import checking
from .record import CsvWriter, environment
from .suites import Benchmark
from .timing import against_baseline, time_interleaved


def attention_flops(batch: int, heads: int, n_q: int, n_k: int, d: int, causal: bool) -> float:
    """4·B·H·Nq·Nk·d: Q Kᵀ and P V, 2 operations per multiply-add; causal does about half."""
    f = 4.0 * batch * heads * n_q * n_k * d
    return f / 2 if causal else f


def backward_flops(batch, heads, n_q, n_k, d, causal) -> float:
    """2.5 × the forward's: the backward's five products against two (as FlashAttention and Triton count)."""
    return 2.5 * attention_flops(batch, heads, n_q, n_k, d, causal)


def training_flops(batch, heads, n_q, n_k, d, causal) -> float:
    """A training step's attention: the forward's products and the backward's, 3.5 × the forward's."""
    return 3.5 * attention_flops(batch, heads, n_q, n_k, d, causal)


def points(bench: Benchmark, overrides: dict | None = None) -> list[dict]:
    """Every combination of the axes' values (``overrides``: axis -> values replacing the defaults), each
    with the fixed sizes; the axis ``n`` sets Nq = Nk."""
    axes = {**bench.axes, **{k: tuple(v) for k, v in (overrides or {}).items() if k in bench.axes and v}}
    found = []
    for values in itertools.product(*axes.values()):
        point = {**bench.fixed, **dict(zip(axes, values))}
        if "n" in point:
            point.update(bench.by_n.get(point["n"], {}))
            point["n_q"] = point["n_k"] = point.pop("n")
        point.setdefault("kv_heads", point["heads"])
        found.append(point)
    return found


def make_inputs(bench: Benchmark, point: dict, seed: int) -> dict:
    """q (B, H, Nq, d), k and v (B, H_kv, Nk, d), and do for the backward: standard normal, in the
    benchmark's library and the point's dtype (float16 and bfloat16 rounded from float32 draws)."""
    b, n_q, n_k, d = point["batch"], point["n_q"], point["n_k"], point["d"]
    shapes = {"q": (b, point["heads"], n_q, d), "k": (b, point["kv_heads"], n_k, d), "v": (b, point["kv_heads"], n_k, d)}
    if bench.kind in ("backward", "training"):
        shapes["do"] = shapes["q"]
    if bench.library == "torch":
        import torch

        gen = torch.Generator(device="cuda").manual_seed(seed)
        dtype = getattr(torch, point["dtype"])
        arrays = {name: torch.randn(s, device="cuda", generator=gen).to(dtype) for name, s in shapes.items()}
    else:  # CuPy on the GPU, or NumPy (the CPU stages, and the tests)
        xp = np if bench.library == "numpy" else __import__("cupy")
        gen = xp.random.default_rng(seed)
        arrays = {name: gen.standard_normal(s, dtype=np.float32).astype(point["dtype"]) for name, s in shapes.items()}
    return {**point, **arrays}  # the point too: causal, the sizes, a flex variant's name


def metered(fn, library: str):
    """``(fn(), peak bytes)``: the call's output and the most it held at once beyond what was allocated before,
    in CuPy's pool and in PyTorch's allocator together (a library's own workspaces are not seen); for NumPy
    inputs, as tracemalloc sees it."""
    if library == "numpy":
        from ..cost.memory import measure_peak_bytes

        peak, out = measure_peak_bytes(fn)
        return out, peak
    import cupy

    class Peak(cupy.cuda.MemoryHook):
        name = "Peak"
        live = peak = 0

        def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
            self.live += mem_size
            self.peak = max(self.peak, self.live)

        def free_postprocess(self, device_id, mem_size, mem_ptr, pmem_id):
            self.live -= mem_size

    torch = _torch()
    if torch:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    with Peak() as hook:
        out = fn()
        cupy.cuda.Device().synchronize()
    return out, hook.peak + (torch.cuda.max_memory_allocated() - base if torch else 0)


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def check(bench: Benchmark, out, x: dict, rng):
    """The check of one peer's result (``checking``): an output, or the gradients."""
    if bench.kind in ("backward", "training"):
        key = "reference"
        if key not in x:  # the float64 gradients, once per input
            x[key] = checking.reference_backward(*(t[(0,) * (t.ndim - 2)] for t in (x["q"], x["k"], x["v"], x["do"])),
                                                 causal=x["causal"])
        return checking.check_gradients(out, x["q"], x["k"], x["v"], x["do"], causal=x["causal"], reference=x[key])
    mods = None
    if "mods" in x:  # the flex benchmark: the variant's functions, for the reference and the naive computation
        from .flex import tinyflash_mods

        mods = tinyflash_mods(x["mods"], x["n_q"], x["heads"])
    return checking.check_output(out, x["q"], x["k"], x["v"], causal=x["causal"], rng=rng, mods=mods)


def try_peer(bench: Benchmark, peer, x: dict, rng) -> tuple[dict, object]:
    """Make, run once, meter and check one peer: (its row's check fields, the function to time or None)."""
    try:
        with peer.around():
            fn = peer.make(x)
            out, peak = metered(fn, bench.library)
            row = {"peak_bytes": peak, **getattr(fn, "details", {})}
            if not peer.checked:
                return {**row, "status": "ok"}, fn
            verdict = peer.check(out, x, rng) if peer.check else check(bench, out, x, rng)
        del out
        row.update(max_rel_err=verdict.error, tolerance=verdict.tolerance)
        if not verdict.ok:
            return {**row, "status": f"wrong (error {verdict.error:.2e} > {verdict.tolerance:.2e})"}, None
        return {**row, "status": "ok"}, fn
    except Exception as exc:  # out of memory, or a backend that refuses these inputs
        if type(exc).__name__ == "OutOfMemoryError":
            return {"status": "oom"}, None
        text = str(exc).lower()
        if "no available kernel" in text or "not supported" in text:
            return {"status": "unsupported"}, None
        raise


def rate(bench: Benchmark, point: dict, impl: str, ms: float) -> dict:
    """TFLOP/s of an attention peer, TB/s of K and V read (a copy: read and written) when decoding."""
    b, h, n_q, n_k, d = point["batch"], point["heads"], point["n_q"], point["n_k"], point["d"]
    if bench.kind == "decode":
        itemsize = 2 if point["dtype"] == "bfloat16" else np.dtype(point["dtype"]).itemsize  # NumPy has no bfloat16
        kv_bytes = 2 * b * point["kv_heads"] * n_k * d * itemsize
        return {"tb_per_s": (2 if impl == "copy" else 1) * kv_bytes / (ms * 1e-3) / 1e12}
    flops = {"backward": backward_flops, "training": training_flops}.get(bench.kind, attention_flops)(
        b, h, n_q, n_k, d, point["causal"])
    return {"tflops": flops / (ms * 1e9)}


def run(bench: Benchmark, *, overrides: dict | None = None, impls=None, csv_path=None, seed: int | None = None,
        rounds: int | None = None, timer=time_interleaved, env: dict | None = None, echo=print) -> list[dict]:
    """Measure every point of ``bench``; write and return its rows. ``impls``: only these peers' impl names.
    ``timer`` and ``env`` are the GPU's clock and environment unless given (the tests pass toys)."""
    from numba.core.errors import NumbaPerformanceWarning

    warnings.simplefilter("ignore", NumbaPerformanceWarning)  # small grids at small sizes are intended
    env = env or environment()
    rng, rows, writer = np.random.default_rng(seed), [], CsvWriter(csv_path)
    echo(f"{bench.name}: {env['device']}  numba-cuda {env['numba_cuda']}  cupy {env['cupy']}  torch {env['torch'] or '-'}"
         f"  commit {env['commit'] or '-'}  {env['date']}")
    for point in points(bench, overrides):
        x = {**make_inputs(bench, point, int(rng.integers(2**31))), "rng": rng}
        found, calls = [], {}
        for peer in bench.peers(point):
            if point["dtype"] not in peer.dtypes or (impls and peer.impl not in impls):
                continue
            fields, fn = try_peer(bench, peer, x, rng)
            found.append({**env, "benchmark": bench.name, "impl": peer.impl, "variant": peer.variant,
                          **{k: point[k] for k in ("dtype", "causal", "batch", "heads", "kv_heads", "n_q", "n_k", "d")},
                          **fields})
            if fn is not None:
                calls[peer.name] = (fn, peer.around)
        times = timer(calls, rounds=rounds or bench.rounds) if calls else {}
        ratios = against_baseline(times, baseline_of(bench, times)) if bench.baseline else {}
        for row in found:
            name = (row["impl"], row["variant"])
            if name in times:
                t = times[name]
                row.update({k: t[k] for k in ("time_ms", "time_min_ms", "time_max_ms", "latency_ms", "rounds",
                                               "burst")}, timing="interleaved", **rate(bench, point, row["impl"],
                                                                                       t["time_ms"]))
                if name in ratios:
                    row.update(ratios[name], baseline=" ".join(bench.baseline).strip())
            writer.write(row)
            echo(line(row))
        rows += found
        del x
        if bench.library != "numpy":
            _free()
    writer.close()
    return rows


def baseline_of(bench: Benchmark, times: dict) -> tuple:
    """The baseline peer's name: ``bench.baseline``, or where its variant is '' and no such peer ran, the peer of
    its implementation that did (the flex benchmark's peers are named after the point's variant)."""
    base = bench.baseline
    if base not in times and not base[1]:
        return next((name for name in times if name[0] == base[0]), base)
    return base


def _free() -> None:
    """Give the inputs' memory back to the device between points."""
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
    torch = _torch()
    if torch:
        torch.cuda.empty_cache()


def line(row: dict) -> str:
    """One row as a line of text: what, where, time, rate, against the baseline, status."""
    def num(key, fmt, width):
        value = row.get(key)
        return f"{float(value):{width}{fmt}}" if value not in (None, "") else f"{'–':>{width}}"

    speed = "tflops" if row.get("tflops") not in (None, "") else "tb_per_s"
    return (f"{row['impl']:15} {row['variant']:28} {row['dtype']:8} {str(row['causal']):5} B={row['batch']} "
            f"H={row['heads']}/{row['kv_heads']} Nq={row['n_q']} Nk={row['n_k']} d={row['d']}  "
            f"{num('time_ms', '.3f', 9)} ms {num('latency_ms', '.3f', 9)} ms alone {num(speed, '.1f', 7)} "
            f"{'TFLOP/s' if speed == 'tflops' else 'TB/s'} {num('vs_baseline', '.3f', 6)}x  {row['status']}")

