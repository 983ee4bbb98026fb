"""The figures of the README: memory, HBM traffic and time against sequence length.

    python -m tinyflash.plots                  # run from the repository root; all five figures
    python -m tinyflash.plots --only hbm_traffic memory_model
    python -m tinyflash.plots --remeasure-gpu  # on a GPU machine: run the benchmark first

Each figure draws what was measured (or counted) beside the model it is compared with, and
writes its data to ``figures/data/*.csv`` beside the PNG. The two GPU figures read the
benchmark's CSV, ``figures/data/bench_h200.csv``, measured on an H200 and committed, so they
regenerate on a machine without a GPU; while that file is missing they say so.

| figure                      | what is drawn                          | where the numbers come from        |
|-----------------------------|----------------------------------------|------------------------------------|
| memory_model.png            | bytes of S, P, Q/K/V/O vs N            | memory.attention_memory (formula)  |
| memory_cpu_measured.png     | peak bytes of the NumPy stages         | tracemalloc, this machine          |
| memory_gpu_measured.png     | peak device bytes per implementation   | bench_h200.csv (benchmark)         |
| hbm_traffic.png             | bytes moved to and from HBM            | counted tile loads + closed forms  |
| time_gpu.png                | time and TFLOP/s per implementation    | bench_h200.csv (benchmark)         |
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import platform
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure  # drawing on a Figure (Agg canvas) needs no pyplot and no display
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

from .blocked import blocked_attention
from .memory import (CONSUMER_GPU_BYTES, H200_MEMORY_BYTES, KiB, attention_memory, blocked_workspace_bytes,
                     format_bytes, max_sequence_length, measure_peak_bytes)
from .naive import naive_attention
from .traffic import (HOPPER_SRAM_ELEMENTS, SRAM_ELEMENTS, flash_attention_traffic, flash_traffic_closed_form,
                      standard_attention_traffic, standard_traffic_closed_form, theta_flash, theta_standard,
                      tile_sizes)

FIGURE_NAMES = ("memory_model", "memory_cpu_measured", "memory_gpu_measured", "hbm_traffic", "time_gpu")
GPU_CSV_NAME = "bench_h200.csv"
GPU_CSV_COLUMNS = ("device", "date", "numpy", "numba_cuda", "cupy", "torch", "impl", "dtype", "causal", "batch",
                   "heads", "n", "d", "time_ms", "tflops", "peak_bytes", "status", "max_rel_err")
IMPLS = {  # benchmark name -> (legend label, colour, marker)
    "tinyflash": ("tinyflash (numba kernel)", "tab:green", "o"),
    "cupy_naive": ("naive CuPy (S and P in HBM)", "tab:red", "s"),
    "torch_flash": ("PyTorch SDPA, flash backend", "tab:blue", "^"),
    "torch_efficient": ("PyTorch SDPA, mem-efficient backend", "tab:purple", "v"),
}

MODEL_NS = [2**p for p in range(9, 18)]  # 512 ... 131,072
CPU_NAIVE_NS = [2**p for p in range(8, 14)]  # 256 ... 8192 (S and P in float32: 512 MiB at the end)
CPU_BLOCKED_NS = [2**p for p in range(8, 16)]  # 256 ... 32,768 (only O(N·d) memory, so it can go further)
CPU_BLOCK = 256  # tiles of the CPU memory sweep: big tiles keep the Python loop short at N = 32k
TRAFFIC_NS = MODEL_NS
TRAFFIC_COUNT_MAX_N = 4096  # count by running the NumPy stage up to here; closed form beyond
TRAFFIC_M_N = 4096  # the fixed N of the SRAM-size panel
TRAFFIC_MAX_TILE_PAIRS = 5_000  # count only if Tr·Tc (Python loop iterations) stays below this


# --- small helpers ------------------------------------------------------------------------


def _n_label(n: float, _pos=None) -> str:
    """512, 1k, 2k, ..., 128k (k = 1024)."""
    return f"{n / 1024:g}k" if n >= 1024 else f"{n:g}"


def _n_axis(ax, ns) -> None:
    """Log-2 x axis of sequence lengths, one tick per power of two in ``ns``."""
    ax.set_xscale("log", base=2)
    powers = [n for n in ns if n & (n - 1) == 0]
    ax.xaxis.set_major_locator(FixedLocator(powers or list(ns)))
    ax.xaxis.set_major_formatter(FuncFormatter(_n_label))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("sequence length N (tokens, 1k = 1024)")


def _bytes_axis(ax, low: float, high: float, step: int = 5) -> None:
    """Log y axis in bytes, ticks every 2**step bytes labelled in binary units (KiB, MiB, GiB, TiB)."""
    ax.set_yscale("log", base=2)
    first, last = int(np.floor(np.log2(low))), int(np.ceil(np.log2(high)))
    ticks = [2.0**p for p in range(first, last + 1) if p % step == 0]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: format_bytes(y)))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(low, high)


def _write_csv(path: Path, rows: list[dict]) -> Path:
    """Write ``rows`` (dicts with the same keys) as a CSV with a header; return the path."""
    if not rows:
        raise ValueError(f"no rows to write to {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _save(fig: Figure, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def _progress(items, desc: str, progress: bool):
    """Wrap ``items`` in a tqdm progress bar when asked (and tqdm is installed)."""
    if not progress:
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, leave=False)


def _check_ns(ns, name: str) -> list[int]:
    ns = [int(n) for n in ns]
    if not ns or min(ns) < 1:
        raise ValueError(f"{name} must be a non-empty list of positive sequence lengths; got {ns!r}")
    return sorted(ns)


# --- figure 1: the memory model -----------------------------------------------------------


def memory_model_data(ns=MODEL_NS, d: int = 128) -> list[dict]:
    """Bytes of every array of the model at each N, for 1 and 32 heads, fp16 and fp32."""
    rows = []
    for heads in (1, 32):
        for dtype in ("float16", "float32"):
            for n in _check_ns(ns, "ns"):
                m = attention_memory(n, d, heads=heads, dtype=dtype)
                rows.append({"heads": heads, "dtype": dtype, "n": n, "d": d, "scores_bytes": m.scores,
                             "scores_and_probabilities_bytes": m.logits_and_probabilities,
                             "qkvo_bytes": m.qkv + m.o, "flash_extra_bytes": m.flash_extra})
    return rows


def plot_memory_model(png: Path, csv_path: Path | None = None, *, ns=MODEL_NS, d: int = 128) -> Path:
    """Figure 1: the analytic memory of naive attention vs FlashAttention, 1 head and 32 heads."""
    ns = _check_ns(ns, "ns")
    rows = memory_model_data(ns, d)
    if csv_path is not None:
        _write_csv(Path(csv_path), rows)
    fig = Figure(figsize=(13, 6.4), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    for ax, heads in zip(axes, (1, 32)):
        def col(dtype, key):
            return [r[key] for r in rows if r["heads"] == heads and r["dtype"] == dtype]  # (len(ns),)

        # S + P in fp16 takes exactly the bytes of S alone in fp32: the two lines coincide, so the
        # fp32 one is drawn wide and pale underneath.
        ax.plot(ns, col("float32", "scores_and_probabilities_bytes"), color="tab:red", lw=2,
                label="naive: logits S + probabilities P, fp32")
        ax.plot(ns, col("float32", "scores_bytes"), color="tab:orange", lw=6, alpha=0.45,
                label="naive: scores S only, fp32")
        ax.plot(ns, col("float16", "scores_and_probabilities_bytes"), "--", color="tab:red", lw=2,
                label="naive: S + P, fp16 (same bytes as S only, fp32)")
        ax.plot(ns, col("float16", "scores_bytes"), "--", color="tab:orange", lw=2, label="naive: S only, fp16")
        ax.plot(ns, col("float16", "qkvo_bytes"), color="tab:blue", lw=2, label="inputs and output: Q, K, V, O (fp16)")
        ax.plot(ns, col("float16", "flash_extra_bytes"), color="tab:green", lw=2,
                label="FlashAttention's extra memory: O + lse (fp16), O(N·d)")
        notes = ["▼ S + P in fp16 fit"]
        for budget, text, ls in ((CONSUMER_GPU_BYTES, "24 GiB card", "-."), (H200_MEMORY_BYTES, "H200: 141 GB", "-")):
            ax.axhline(budget, color="black", ls=ls, lw=1)
            ax.text(ns[0], budget * 1.15, text, fontsize=9, va="bottom")
            n_max = max_sequence_length(budget, heads=heads, dtype="float16", matrices=2)
            notes.append(f"    in {text.split(': ')[-1].replace(' card', '')} up to N = {n_max:,}")
            if ns[0] <= n_max <= ns[-1]:  # where S + P in fp16 stops fitting
                ax.plot([n_max], [budget], "kv", ms=8, zorder=5)
        seed = attention_memory(32_768, d, heads=heads, dtype="float16")  # the seeds' 32k example
        shown, what = (seed.scores, "S") if heads == 1 else (seed.logits_and_probabilities, "S + P")
        ax.plot([32_768], [shown], "o", color="black", ms=7, zorder=5)
        notes.append(f"● N = 32k: {what} in fp16 = {format_bytes(shown)}")
        ax.text(0.97, 0.04, "\n".join(notes), transform=ax.transAxes, ha="right", va="bottom", fontsize=9, ma="left",
                bbox={"fc": "white", "ec": "0.7"})
        _n_axis(ax, ns)
        ax.set_title(f"{heads} head{'s' if heads > 1 else ''}, d = {d}, batch 1 (model, not measured)")
        ax.grid(True, which="major", alpha=0.3)
    _bytes_axis(axes[0], 2.0**16, 2.0**43)
    axes[0].set_ylabel("memory (bytes, binary units)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=9)
    fig.suptitle("Memory of attention vs sequence length: N × N matrices against O(N·d) arrays (log-log)")
    return _save(fig, png)


# --- figure 2: memory measured on the CPU -------------------------------------------------


def memory_cpu_data(naive_ns=CPU_NAIVE_NS, blocked_ns=CPU_BLOCKED_NS, *, d: int = 64, block: int = CPU_BLOCK,
                    progress: bool = True, seed: int = 0) -> list[dict]:
    """Peak extra memory (tracemalloc) of each NumPy stage at each N, beside its model. float32."""
    rng = np.random.default_rng(seed)
    runs = [("naive", n) for n in _check_ns(naive_ns, "naive_ns")] + \
           [("blocked", n) for n in _check_ns(blocked_ns, "blocked_ns")]
    rows = []
    for stage, n in _progress(runs, "tracemalloc sweep", progress):
        q, k, v = (rng.standard_normal((n, d), dtype=np.float32) for _ in range(3))  # (N, d) each
        model = attention_memory(n, d, dtype="float32")
        if stage == "naive":
            peak, _ = measure_peak_bytes(naive_attention, q, k, v)
            expected = model.naive_extra  # S + P + O
        else:
            peak, _ = measure_peak_bytes(blocked_attention, q, k, v, block_q=block, block_k=block)
            tiles = min(block, n)  # a tile never holds more rows than there are
            expected = model.flash_extra + blocked_workspace_bytes(tiles, tiles, d)  # O + lse + tiles
        rows.append({"stage": stage, "n": n, "d": d, "dtype": "float32", "block": block if stage == "blocked" else "",
                     "measured_peak_bytes": peak, "model_bytes": expected, "outputs_bytes":
                     model.naive_extra if stage == "naive" else model.flash_extra,
                     "numpy": np.__version__, "python": platform.python_version(), "machine": platform.machine()})
    return rows


def plot_memory_cpu_measured(png: Path, csv_path: Path | None = None, *, naive_ns=CPU_NAIVE_NS,
                             blocked_ns=CPU_BLOCKED_NS, d: int = 64, block: int = CPU_BLOCK,
                             progress: bool = True) -> Path:
    """Figure 2: tracemalloc's peak for naive_attention and blocked_attention over the model lines."""
    rows = memory_cpu_data(naive_ns, blocked_ns, d=d, block=block, progress=progress)
    if csv_path is not None:
        _write_csv(Path(csv_path), rows)
    naive = [r for r in rows if r["stage"] == "naive"]
    blocked = [r for r in rows if r["stage"] == "blocked"]
    ns = sorted({r["n"] for r in rows})
    model = [attention_memory(n, d, dtype="float32") for n in ns]
    fig = Figure(figsize=(13, 5.4), layout="constrained")
    ax, ax_diff = fig.subplots(1, 2, width_ratios=[3, 2])
    ran = [n for n in ns if n <= naive[-1]["n"]]  # the naive model, solid where naive ran, dashed beyond
    ax.plot(ran, [m.naive_extra for m, n in zip(model, ns) if n in ran], color="tab:red", lw=1.5,
            label="model, naive: S + P + O (dashed: not run, too big)")
    ax.plot(ns[len(ran) - 1:], [m.naive_extra for m in model[len(ran) - 1:]], "--", color="tab:red", lw=1.5)
    ax.plot([r["n"] for r in naive], [r["measured_peak_bytes"] for r in naive], "o", color="tab:red", ms=9,
            mfc="none", mew=2, label="measured, naive_attention (tracemalloc)")
    workspace = blocked_workspace_bytes(block, block, d)
    ax.plot(ns, [m.flash_extra for m in model], ":", color="tab:green", lw=1.5, label="model, FlashAttention: O + lse")
    ax.plot(ns, [m.flash_extra + workspace for m in model], color="tab:green", lw=1.5,
            label=f"model, blocked: O + lse + NumPy's tiles ({format_bytes(workspace)}, any N)")
    ax.plot([r["n"] for r in blocked], [r["measured_peak_bytes"] for r in blocked], "s", color="tab:green", ms=8,
            mfc="none", mew=2, label=f"measured, blocked_attention, Br = Bc = {block}")
    worst = {stage: max(abs(r["measured_peak_bytes"] / r["model_bytes"] - 1) for r in rows_)
             for stage, rows_ in (("naive", naive), ("blocked", [r for r in blocked if r["n"] >= 2 * block]))}
    ax.text(0.98, 0.04, f"measured vs model, worst case: naive {100 * worst['naive']:.1f}%, blocked "
            f"{100 * worst['blocked']:.1f}% (N ≥ 2·Br)\nfloat32, d = {d}, one head; the inputs Q, K, V are not counted",
            transform=ax.transAxes, ha="right", fontsize=9)
    _n_axis(ax, ns)
    _bytes_axis(ax, min(m.flash_extra for m in model) / 2, max(m.naive_extra for m in model) * 4)
    ax.set_ylabel("peak extra memory during one call (bytes)")
    ax.set_title("Peak memory on the CPU: measured points on the model lines")
    ax.legend(fontsize=9, loc="upper left")
    ax.grid(True, alpha=0.3)
    # Right: measured minus the outputs, in KiB. Naive: S + P + O is all there is, bar a few length-N
    # vectors (row max, sum, lse); blocked: NumPy's tile temporaries, the same at every N.
    for stage_rows, color, marker, label in ((naive, "tab:red", "o", "naive − (S + P + O): row vectors, O(N)"),
                                             (blocked, "tab:green", "s", "blocked − (O + lse): tile workspace")):
        ax_diff.plot([r["n"] for r in stage_rows], [(r["measured_peak_bytes"] - r["outputs_bytes"]) / KiB
                                                    for r in stage_rows], marker + "-", color=color, label=label)
    ax_diff.axhline(workspace / KiB, color="tab:green", ls="--", lw=1,
                    label="model: 4 tiles Br×Bc + 2 tiles Br×d, float32")
    _n_axis(ax_diff, ns)
    ax_diff.set_ylim(bottom=0)
    ax_diff.set_ylabel("measured peak − outputs (KiB)")
    ax_diff.set_title("Beyond the outputs: flat in N for blocked")
    ax_diff.legend(fontsize=9, loc="center right")
    ax_diff.grid(True, alpha=0.3)
    return _save(fig, png)


# --- figure 4: HBM traffic ----------------------------------------------------------------


def _flash_traffic(n, d, m, causal, count, dtype):
    """(bytes, how): counted by the NumPy stage if ``count`` and cheap, else the closed form."""
    block_q, block_k = tile_sizes(m, d)
    closed = flash_traffic_closed_form(n, d, dtype=dtype, causal=causal, block_q=block_q, block_k=block_k).total
    tile_pairs = -(-n // block_q) * -(-n // block_k)  # Tr · Tc iterations of the Python loop
    if count and tile_pairs <= TRAFFIC_MAX_TILE_PAIRS:
        counted = flash_attention_traffic(n, d, dtype=dtype, causal=causal, block_q=block_q, block_k=block_k).total
        if counted != closed:  # the tests prove this never happens; a figure must not hide it either
            raise AssertionError(f"counted traffic {counted} != closed form {closed} at N={n}, M={m}, causal={causal}")
        return counted, "counted"
    return closed, "closed_form"


def traffic_vs_n_data(ns=TRAFFIC_NS, *, d: int = 64, dtype="float16", count_max_n: int = TRAFFIC_COUNT_MAX_N,
                      progress: bool = True) -> list[dict]:
    """Bytes moved vs N: standard attention, FlashAttention at two SRAM sizes, and the bounds."""
    b = np.dtype(dtype).itemsize
    rows = []
    for n in _progress(_check_ns(ns, "ns"), "HBM traffic vs N", progress):
        std = standard_attention_traffic(n, d, dtype=dtype).total  # walked step by step, nothing allocated
        assert std == standard_traffic_closed_form(n, d, dtype=dtype)
        rows.append({"algorithm": "standard", "n": n, "m": "", "causal": False, "bytes": std, "how": "walk"})
        rows.append({"algorithm": "standard_bound", "n": n, "m": "", "causal": False,
                     "bytes": theta_standard(n, d) * b, "how": "bound"})
        for m, causal in ((SRAM_ELEMENTS, False), (SRAM_ELEMENTS, True), (HOPPER_SRAM_ELEMENTS, False)):
            moved, how = _flash_traffic(n, d, m, causal, n <= count_max_n, dtype)
            rows.append({"algorithm": "flash", "n": n, "m": m, "causal": causal, "bytes": moved, "how": how})
        for m in (SRAM_ELEMENTS, HOPPER_SRAM_ELEMENTS):
            rows.append({"algorithm": "flash_bound", "n": n, "m": m, "causal": False,
                         "bytes": theta_flash(n, d, m) * b, "how": "bound"})
    for r in rows:
        r.update(d=d, dtype=dtype)
    return rows


def traffic_vs_m_data(n: int = TRAFFIC_M_N, *, d: int = 64, dtype="float16", progress: bool = True) -> list[dict]:
    """Bytes moved by FlashAttention vs SRAM size M (4d ... N·d elements) at fixed N."""
    b = np.dtype(dtype).itemsize
    ms = [2**p for p in range(int(np.log2(4 * d)), int(np.log2(n * d)) + 1)]  # M from 4d to N·d
    ms = sorted(set(ms) | {SRAM_ELEMENTS, HOPPER_SRAM_ELEMENTS})
    rows = []
    for m in _progress(ms, "HBM traffic vs M", progress):
        moved, how = _flash_traffic(n, d, m, False, True, dtype)
        block_q, block_k = tile_sizes(m, d)
        rows.append({"algorithm": "flash", "m": m, "block_q": block_q, "block_k": block_k, "bytes": moved, "how": how})
        rows.append({"algorithm": "flash_bound", "m": m, "block_q": "", "block_k": "",
                     "bytes": theta_flash(n, d, m) * b, "how": "bound"})
    std = standard_traffic_closed_form(n, d, dtype=dtype)
    rows.append({"algorithm": "standard", "m": "", "block_q": "", "block_k": "", "bytes": std, "how": "closed_form"})
    for r in rows:
        r.update(n=n, d=d, dtype=dtype, causal=False)
    return rows


def plot_hbm_traffic(png: Path, csv_dir: Path | None = None, *, ns=TRAFFIC_NS, m_panel_n: int = TRAFFIC_M_N,
                     d: int = 64, count_max_n: int = TRAFFIC_COUNT_MAX_N, progress: bool = True) -> Path:
    """Figure 4: HBM bytes vs N (left) and vs SRAM size M at fixed N (right), counted and bounded."""
    ns = _check_ns(ns, "ns")
    rows_n = traffic_vs_n_data(ns, d=d, count_max_n=count_max_n, progress=progress)
    rows_m = traffic_vs_m_data(m_panel_n, d=d, progress=progress)
    if csv_dir is not None:
        _write_csv(Path(csv_dir) / "hbm_traffic_vs_n.csv", rows_n)
        _write_csv(Path(csv_dir) / "hbm_traffic_vs_m.csv", rows_m)
    fig = Figure(figsize=(14, 6), layout="constrained")
    ax, ax_m = fig.subplots(1, 2)
    _draw_traffic_vs_n(ax, rows_n, ns, d)
    _draw_traffic_vs_m(ax_m, rows_m, m_panel_n, d)
    fig.suptitle("HBM traffic of one attention head (fp16, d = %d): standard attention re-reads N × N matrices, "
                 "FlashAttention re-reads K and V" % d)
    return _save(fig, png)


def _select(rows, **want):
    return [r for r in rows if all(r[k] == v for k, v in want.items())]


def _draw_traffic_vs_n(ax, rows, ns, d):
    def series(**want):
        sel = _select(rows, **want)
        return [r["n"] for r in sel], [r["bytes"] for r in sel], sel

    def counted_marks(sel, color):
        pts = [(r["n"], r["bytes"]) for r in sel if r["how"] == "counted"]
        if pts:
            ax.plot(*zip(*pts), "o", color=color, mfc="none", ms=9, mew=2)

    x, y, sel = series(algorithm="standard")
    ax.plot(x, y, "s-", color="tab:red", lw=2, label="standard: writes and re-reads S and P (counted walk)")
    x, y, _ = series(algorithm="standard_bound")  # bounds: dotted, drawn on top of the solid lines
    ax.plot(x, y, ":", color="tab:red", lw=2, zorder=4, label="Θ(N·d + N²) bound (constant 1)")
    for m, causal, color in ((SRAM_ELEMENTS, False, "tab:green"), (SRAM_ELEMENTS, True, "tab:olive"),
                             (HOPPER_SRAM_ELEMENTS, False, "tab:blue")):
        x, y, sel = series(algorithm="flash", m=m, causal=causal)
        block_q, block_k = tile_sizes(m, d)
        what = "causal" if causal else "non-causal"
        ax.plot(x, y, "-", color=color, lw=2, label=f"FlashAttention, {what}, M = {m:,} (Br={block_q}, Bc={block_k})")
        counted_marks(sel, color)
    for m, color in ((SRAM_ELEMENTS, "tab:green"), (HOPPER_SRAM_ELEMENTS, "tab:blue")):
        x, y, _ = series(algorithm="flash_bound", m=m)
        ax.plot(x, y, ":", color=color, lw=2, zorder=4, label=f"Θ(N²·d²/M) bound, M = {m:,} (constant 1)")
    n_last = ns[-1]  # how many times more standard attention moves, at the largest N
    std_last = series(algorithm="standard", n=n_last)[1][0]
    ratios = [f"{std_last / series(algorithm='flash', n=n_last, m=m, causal=False)[1][0]:.1f}× at M = {m:,}"
              for m in (SRAM_ELEMENTS, HOPPER_SRAM_ELEMENTS)]
    ax.text(0.98, 0.04, f"at N = {n_last:,} standard attention moves\n" + "\n".join(ratios) +
            "\nthe bytes of FlashAttention (non-causal)", transform=ax.transAxes, ha="right", fontsize=8.5,
            bbox={"fc": "white", "ec": "0.7"})
    ax.plot([], [], "o", color="gray", mfc="none", ms=9, mew=2,
            label="counted by blocked_attention (lines: closed form)")
    _n_axis(ax, ns)
    all_bytes = [r["bytes"] for r in rows]
    _bytes_axis(ax, min(all_bytes) / 2, max(all_bytes) * 4)
    ax.set_ylabel("bytes read + written in HBM")
    ax.set_title("Traffic vs sequence length")
    ax.legend(fontsize=7.5, loc="upper left")
    ax.grid(True, alpha=0.3)


def _draw_traffic_vs_m(ax, rows, n, d):
    flash = _select(rows, algorithm="flash")
    bound = _select(rows, algorithm="flash_bound")
    std = _select(rows, algorithm="standard")[0]["bytes"]
    ax.plot([r["m"] for r in flash], [r["bytes"] for r in flash], "-", color="tab:green", lw=2,
            label="FlashAttention (closed form)")
    counted = [r for r in flash if r["how"] == "counted"]
    ax.plot([r["m"] for r in counted], [r["bytes"] for r in counted], "o", color="tab:green", mfc="none", ms=9, mew=2,
            label="counted by blocked_attention")
    ax.plot([r["m"] for r in bound], [r["bytes"] for r in bound], ":", color="tab:green", lw=1.5,
            label="Θ(N²·d²/M) bound (constant 1)")
    ax.axhline(std, color="tab:red", lw=2, label="standard attention (does not depend on M)")
    marks = ((SRAM_ELEMENTS, "this project's tiles"), (HOPPER_SRAM_ELEMENTS, "H200 shared memory\nper SM, fp16"))
    for m, text in marks:
        ax.axvline(m, color="gray", ls="--", lw=1)
        ax.text(m / 1.08, std * 6, f"{text}\nM = {m:,}", fontsize=8, va="top", ha="right")
    worse = [r["m"] for r in flash if r["bytes"] >= std]  # SRAM sizes where FlashAttention moves more
    if worse:
        ax.text(0.03, 0.3, f"up to M = {max(worse):,}, K and V are re-read so often\n"
                "that FlashAttention would move more than standard", transform=ax.transAxes, fontsize=8)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda m, _pos: f"{m / 1024:g}k" if m >= 1024 else f"{m:g}"))
    ax.set_xlabel("on-chip memory M (elements, 1k = 1024); Br = ceil(M/4d), Bc = min(Br, d)")
    all_bytes = [r["bytes"] for r in rows]
    _bytes_axis(ax, min(all_bytes) / 2, max(all_bytes) * 2, step=2)
    ax.set_ylabel("bytes read + written in HBM")
    ax.set_title(f"Traffic vs SRAM size at N = {n:,}: more SRAM, fewer passes over K and V")
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(True, alpha=0.3)


# --- figures 3 and 5: the benchmark's GPU measurements ------------------------------------


def read_bench_csv(path: Path) -> list[dict] | None:
    """Rows of the benchmark CSV with typed fields; None if the file does not exist.

    Empty time/tflops/peak fields (status 'oom') become None; rows with status 'unsupported' are
    dropped. The benchmark checks every result before timing it; a result that failed the check
    has status 'wrong (error ... > ...)', kept here as status 'wrong' (its text in 'status_detail')
    so that the time figure can show it failed rather than silently leave it out.
    """
    path = Path(path)
    if not path.exists():
        return None
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in GPU_CSV_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"benchmark CSV {path} lacks the columns {missing}; expected {list(GPU_CSV_COLUMNS)}")
        rows = []
        for line, raw in enumerate(reader, start=2):
            status = "wrong" if raw["status"].startswith("wrong") else raw["status"]
            if status not in ("ok", "oom", "unsupported", "wrong"):
                raise ValueError(f"{path}, line {line}: status must be ok, oom, unsupported or wrong (...); "
                                 f"got {raw['status']!r}")
            if status == "unsupported":
                continue
            row = dict(raw, status=status, status_detail=raw["status"])
            for key in ("batch", "heads", "n", "d"):
                row[key] = int(raw[key])
            for key in ("time_ms", "tflops", "peak_bytes", "max_rel_err"):
                row[key] = float(raw[key]) if raw[key] not in ("", None) else None
            row["causal"] = raw["causal"].strip().lower() == "true"
            rows.append(row)
    return rows


def gpu_panels(rows: list[dict], max_panels: int = 4) -> list[tuple]:
    """Up to ``max_panels`` (dtype, d, causal, batch, heads) configurations, non-causal first, fp16 first."""
    configs = Counter((r["dtype"], r["d"], r["causal"], r["batch"], r["heads"]) for r in rows)
    best = {}  # (dtype, d, causal) -> the (batch, heads) with the most rows
    for (dtype, d, causal, batch, heads), count in configs.most_common():
        best.setdefault((dtype, d, causal), (batch, heads))
    keys = sorted(best, key=lambda c: (c[2], c[0] != "float16", c[1]))
    return [(*key, *best[key]) for key in keys[:max_panels]]


def _panel_rows(rows, config, impl):
    dtype, d, causal, batch, heads = config
    sel = [r for r in rows if (r["dtype"], r["d"], r["causal"], r["batch"], r["heads"]) == config and r["impl"] == impl]
    return sorted(sel, key=lambda r: r["n"])


def crossover_n(rows: list[dict], config: tuple, fast: str = "tinyflash", slow: str = "cupy_naive"):
    """Smallest measured N from which ``fast`` is faster than ``slow`` at every larger N where both ran.

    Only lengths where both ran are compared (an out-of-memory ``slow`` is reported by
    :func:`first_oom_n`, not counted as a speed win). None if ``fast`` is not faster at the largest
    length compared, or if there is none.
    """
    fast_t = {r["n"]: r["time_ms"] for r in _panel_rows(rows, config, fast) if r["status"] == "ok"}
    slow_t = {r["n"]: r["time_ms"] for r in _panel_rows(rows, config, slow) if r["status"] == "ok"}
    compared = sorted(set(fast_t) & set(slow_t))
    wins = [fast_t[n] < slow_t[n] for n in compared]  # (len(compared),)
    if not wins or not wins[-1]:
        return None
    first = len(wins)
    while first > 0 and wins[first - 1]:  # walk back over the trailing run of wins
        first -= 1
    return compared[first]


def first_oom_n(rows: list[dict], config: tuple, impl: str = "cupy_naive"):
    """Smallest N at which ``impl`` ran out of memory in this configuration; None if it never did."""
    ooms = [r["n"] for r in _panel_rows(rows, config, impl) if r["status"] == "oom"]
    return min(ooms) if ooms else None


def _placeholder(png: Path, title: str, csv_path: Path) -> Path:
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax = fig.subplots()
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.6, "no GPU measurements committed yet", ha="center", va="center", fontsize=18)
    ax.text(0.5, 0.3, f"this figure fills in once {csv_path} is committed;\nmeasure it on a GPU machine with"
            "  python -m tinyflash.plots --remeasure-gpu", ha="center", va="center", fontsize=10, family="monospace")
    ax.set_title(title)
    return _save(fig, png)


def _provenance(rows: list[dict]) -> str:
    r = rows[0]
    return (f"measured on {r['device']}, {r['date']}; numpy {r['numpy']}, numba-cuda {r['numba_cuda']}, "
            f"cupy {r['cupy']}, torch {r['torch'] or 'not installed'}")


def _impl_label(rows, impl):
    errors = [r["max_rel_err"] for r in rows
              if r["impl"] == impl and r["status"] == "ok" and r["max_rel_err"] is not None]  # checked results only
    label = IMPLS.get(impl, (impl, None, None))[0]
    return f"{label} (max rel. error {max(errors):.1e})" if errors else label


def _config_title(config):
    dtype, d, causal, batch, heads = config
    return f"{dtype}, d = {d}, {'causal' if causal else 'non-causal'}, batch {batch} × {heads} heads"


def _config_ns(rows, config):
    return sorted({r["n"] for r in rows if (r["dtype"], r["d"], r["causal"], r["batch"], r["heads"]) == config})


def _figure_legend(fig, axes, ncol=3):
    """One legend for the whole figure, each label once, below the panels."""
    seen = {}
    for ax in np.ravel(axes):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncol=ncol, fontsize=9)


def _panel_grid(rows) -> tuple[list, int, int]:
    """The benchmark's configurations (one per panel) and the grid for them: at most 2 columns."""
    configs = gpu_panels(rows)
    n_cols = min(2, len(configs))
    return configs, n_cols, -(-len(configs) // n_cols)


def plot_memory_gpu_measured(png: Path, csv_path: Path) -> Path:
    """Figure 3: peak device memory per implementation from the benchmark CSV (placeholder if absent)."""
    rows = read_bench_csv(csv_path)
    title = "Peak GPU memory vs sequence length (from the benchmark)"
    if not rows:
        return _placeholder(png, title, csv_path)
    configs, n_cols, n_rows = _panel_grid(rows)
    fig = Figure(figsize=(7 * n_cols, 5 * n_rows + 1.2), layout="constrained")
    axes = fig.subplots(n_rows, n_cols, squeeze=False)
    for ax, config in zip(axes.ravel(), configs):
        _draw_gpu_memory(ax, rows, config)
    for ax in axes.ravel()[len(configs):]:
        ax.set_visible(False)
    _figure_legend(fig, axes)
    fig.suptitle(f"{title}; ✖ = out of memory, drawn at what the model says it needed\n{_provenance(rows)}",
                 fontsize=11)
    return _save(fig, png)


def _draw_gpu_memory(ax, rows, config):
    dtype, d, causal, batch, heads = config
    ns = _config_ns(rows, config)
    model = [attention_memory(n, d, heads=heads, batch=batch, dtype=dtype) for n in ns]
    ax.plot(ns, [m.naive_extra for m in model], "--", color="gray", lw=2.5, alpha=0.6,
            label="model: S + P + O in the input dtype")
    ax.plot(ns, [m.flash_extra for m in model], ":", color="gray", lw=2.5, alpha=0.8, label="model: O + lse")
    values = [m.flash_extra for m in model] + [m.naive_extra for m in model]
    for impl, (_, color, marker) in IMPLS.items():
        sel = _panel_rows(rows, config, impl)
        ok = [r for r in sel if r["status"] == "ok" and r["peak_bytes"] is not None]
        if ok:
            ax.plot([r["n"] for r in ok], [r["peak_bytes"] for r in ok], marker + "-", color=color,
                    label=_impl_label(rows, impl))
            values += [r["peak_bytes"] for r in ok]
        for r in (r for r in sel if r["status"] == "oom"):  # drawn where the model says it needed memory
            need = attention_memory(r["n"], d, heads=heads, batch=batch, dtype=dtype).naive_extra
            ax.plot([r["n"]], [need], "X", color=color, ms=13, zorder=5)
            ax.annotate("OOM", (r["n"], need), xytext=(-8, 6), textcoords="offset points", ha="right",
                        color=color, fontsize=9, fontweight="bold")
    if "H200" in rows[0]["device"]:
        ax.axhline(H200_MEMORY_BYTES, color="black", lw=1)
        ax.text(ns[0], H200_MEMORY_BYTES * 1.15, "H200: 141 GB", fontsize=9)
        values.append(H200_MEMORY_BYTES)
    _n_axis(ax, ns)
    _bytes_axis(ax, min(values) / 2, max(values) * 4)
    ax.set_ylabel("peak extra device memory, one call (bytes)")
    ax.set_title(_config_title(config), fontsize=10)
    ax.grid(True, alpha=0.3)


def plot_time_gpu(png: Path, csv_path: Path) -> Path:
    """Figure 5: time (upper panel) and TFLOP/s (lower panel) per configuration; crossover marked."""
    rows = read_bench_csv(csv_path)
    title = "Time vs sequence length on the GPU (from the benchmark)"
    if not rows:
        return _placeholder(png, title, csv_path)
    # n_pairs rows of configurations, each a time panel over a TFLOP/s panel
    configs, n_cols, n_pairs = _panel_grid(rows)
    fig = Figure(figsize=(7 * n_cols, 7.5 * n_pairs + 1.2), layout="constrained")
    axes = fig.subplots(2 * n_pairs, n_cols, squeeze=False, height_ratios=[3, 2] * n_pairs)
    for i, config in enumerate(configs):
        pair, col = divmod(i, n_cols)
        ax_t, ax_f = axes[2 * pair, col], axes[2 * pair + 1, col]
        ax_f.sharex(ax_t)
        _draw_gpu_time(ax_t, ax_f, rows, config)
    for i in range(len(configs), n_pairs * n_cols):
        pair, col = divmod(i, n_cols)
        axes[2 * pair, col].set_visible(False)
        axes[2 * pair + 1, col].set_visible(False)
    _figure_legend(fig, axes)
    fig.suptitle(f"{title}; ✖ = ran out of memory (OOM) or failed the benchmark's correctness check\n"
                 f"{_provenance(rows)}", fontsize=11)
    return _save(fig, png)


def _draw_gpu_time(ax_t, ax_f, rows, config):
    ns = _config_ns(rows, config)
    for impl, (_, color, marker) in IMPLS.items():
        sel = _panel_rows(rows, config, impl)
        ok = [r for r in sel if r["status"] == "ok"]
        if ok:
            ax_t.plot([r["n"] for r in ok], [r["time_ms"] for r in ok], marker + "-", color=color,
                      label=_impl_label(rows, impl))
            ax_f.plot([r["n"] for r in ok], [r["tflops"] for r in ok], marker + "-", color=color)
        for r in (r for r in sel if r["status"] in ("oom", "wrong")):  # no time: mark it at the top of the panel
            text, y = ("OOM", 0.95) if r["status"] == "oom" else ("failed check", 0.87)
            ax_t.plot([r["n"]], [y], "X", color=color, ms=13, transform=ax_t.get_xaxis_transform(), clip_on=False)
            ax_t.annotate(text, (r["n"], y), xycoords=ax_t.get_xaxis_transform(), xytext=(-9, 0),
                          textcoords="offset points", ha="right", va="center", color=color, fontsize=9,
                          fontweight="bold")
    _mark_crossover(ax_t, rows, config, ns)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time per call (ms, log scale)")
    ax_t.set_title(_config_title(config), fontsize=10)
    ax_t.grid(True, alpha=0.3)
    ax_f.set_ylabel("throughput (TFLOP/s)")
    ax_f.set_ylim(bottom=0)
    ax_f.grid(True, alpha=0.3)
    _n_axis(ax_f, ns)
    ax_t.set_xlabel("")


def _mark_crossover(ax, rows, config, ns) -> None:
    """Shade where naive CuPy is faster; a dashed line where tinyflash starts to win; say where naive OOMs."""
    n_win = crossover_n(rows, config)
    n_oom = first_oom_n(rows, config)
    notes = []
    if n_win is None:
        notes.append("tinyflash is not faster than naive CuPy\nat the largest N where both ran")
    elif n_win == ns[0]:
        notes.append("tinyflash faster than naive CuPy\nat every N where both ran")
    else:
        ax.axvspan(ns[0] / 1.3, n_win / 1.41, color="tab:red", alpha=0.07, lw=0)
        ax.axvline(n_win, color="black", ls="--", lw=1)
        ax.text(n_win * 1.06, 0.72, f"tinyflash faster\nfrom N = {n_win:,}", transform=ax.get_xaxis_transform(),
                fontsize=8.5)
        ax.text(ns[0], 0.5, "naive CuPy\nfaster here", transform=ax.get_xaxis_transform(), fontsize=8.5,
                color="tab:red")
    if n_oom is not None:
        notes.append(f"naive CuPy out of memory from N = {n_oom:,}")
    if notes:
        ax.text(0.98, 0.04, "\n".join(notes), transform=ax.transAxes, ha="right", fontsize=8.5,
                bbox={"fc": "white", "ec": "0.7"})


# --- command line -------------------------------------------------------------------------


def remeasure_gpu(csv_path: Path) -> None:
    """Run the benchmark (``python -m tinyflash.bench --csv PATH``); clear error if it is missing."""
    if importlib.util.find_spec("tinyflash.bench") is None:
        raise SystemExit("--remeasure-gpu: the module tinyflash.bench is not in this checkout (the benchmark is "
                         "written on another branch); merge it first, or drop --remeasure-gpu to plot the "
                         "committed CSV")
    Path(csv_path).parent.mkdir(parents=True, exist_ok=True)  # the benchmark opens the file, not the folder
    cmd = [sys.executable, "-m", "tinyflash.bench", "--csv", str(csv_path)]
    print("running:", " ".join(cmd), flush=True)
    done = subprocess.run(cmd)
    if done.returncode != 0:
        raise SystemExit(f"the benchmark failed with exit code {done.returncode}; figures not regenerated")


def make_figures(out: Path, names=FIGURE_NAMES, *, gpu_csv: Path | None = None, progress: bool = True) -> list[Path]:
    """Write the named figures into ``out`` and their data into ``out/data``; return the PNG paths."""
    out, data = Path(out), Path(out) / "data"
    unknown = [n for n in names if n not in FIGURE_NAMES]
    if unknown:
        raise ValueError(f"names must be among {FIGURE_NAMES}; got unknown {unknown}")
    gpu_csv = data / GPU_CSV_NAME if gpu_csv is None else Path(gpu_csv)
    makers = {
        "memory_model": lambda p: plot_memory_model(p, data / "memory_model.csv"),
        "memory_cpu_measured": lambda p: plot_memory_cpu_measured(p, data / "memory_cpu_measured.csv",
                                                                  progress=progress),
        "memory_gpu_measured": lambda p: plot_memory_gpu_measured(p, gpu_csv),
        "hbm_traffic": lambda p: plot_hbm_traffic(p, data, progress=progress),
        "time_gpu": lambda p: plot_time_gpu(p, gpu_csv),
    }
    written = []
    for name in names:
        start = time.perf_counter()
        written.append(makers[name](out / f"{name}.png"))
        print(f"wrote {written[-1]}  ({time.perf_counter() - start:.1f} s)", flush=True)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tinyflash.plots", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("figures"), help="output folder (default: figures)")
    parser.add_argument("--only", nargs="+", choices=FIGURE_NAMES, default=list(FIGURE_NAMES), metavar="NAME",
                        help=f"draw only these figures: {', '.join(FIGURE_NAMES)}")
    parser.add_argument("--gpu-csv", type=Path, default=None, help=f"benchmark CSV (default: OUT/data/{GPU_CSV_NAME})")
    parser.add_argument("--remeasure-gpu", action="store_true",
                        help="first run `python -m tinyflash.bench --csv GPU_CSV` (needs a GPU)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    matplotlib.use("Agg")  # files only, no window (the figures are drawn on Agg canvases anyway)
    gpu_csv = args.gpu_csv or args.out / "data" / GPU_CSV_NAME
    start = time.perf_counter()
    if args.remeasure_gpu:
        remeasure_gpu(gpu_csv)
    make_figures(args.out, args.only, gpu_csv=gpu_csv, progress=not args.no_progress)
    print(f"done in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
