"""Figures 1 and 2: the memory model of attention, and the memory the NumPy stages really take.

| figure                  | what is drawn                    | where the numbers come from       |
|-------------------------|----------------------------------|-----------------------------------|
| memory_model.png        | bytes of S, P, Q/K/V/O vs N      | memory.attention_memory (formula) |
| memory_cpu_measured.png | peak bytes of the NumPy stages   | tracemalloc, this machine         |
"""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ..forward.blocked import blocked_attention
from ..forward.naive import naive_attention
from ..cost.memory import (KiB, attention_memory, blocked_workspace_bytes, format_bytes, max_sequence_length, measure_peak_bytes)
from .common import (bytes_axis, check_ns, measured_rows, n_axis, progress_bar, save, write_csv)
from ..hardware import CONSUMER_CARD_BYTES, H200

MODEL_NS = [2**p for p in range(9, 18)]  # 512 ... 131,072
CPU_NAIVE_NS = [2**p for p in range(8, 14)]  # 256 ... 8192 (S and P in float32: 512 MiB at the end)
CPU_BLOCKED_NS = [2**p for p in range(8, 16)]  # 256 ... 32,768 (only O(N·d) memory, so it can go further)
CPU_BLOCK = 256  # tiles of the CPU memory sweep: big tiles keep the Python loop short at N = 32k


# --- figure 1: the memory model -----------------------------------------------------------


def memory_model_data(ns=MODEL_NS, d: int = 128) -> list[dict]:
    """Bytes of every array of the model at each N, for 1 and 32 heads, fp16 and fp32."""
    rows = []
    for heads in (1, 32):
        for dtype in ("float16", "float32"):
            for n in check_ns(ns, "ns"):
                m = attention_memory(n, d, heads=heads, dtype=dtype)
                rows.append({"heads": heads, "dtype": dtype, "n": n, "d": d, "scores_bytes": m.scores,
                             "scores_and_probabilities_bytes": m.logits_and_probabilities,
                             "qkvo_bytes": m.qkv + m.o, "flash_extra_bytes": m.flash_extra})
    return rows


def plot_memory_model(png: Path, csv_path: Path | None = None, *, ns=MODEL_NS, d: int = 128) -> Path:
    """Figure 1: the analytic memory of naive attention vs FlashAttention, 1 head and 32 heads."""
    ns = check_ns(ns, "ns")
    rows = memory_model_data(ns, d)
    if csv_path is not None:
        write_csv(Path(csv_path), rows)
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
        for budget, text, ls in ((CONSUMER_CARD_BYTES, "24 GiB card", "-."), (H200.memory_bytes, "H200: 141 GB", "-")):
            ax.axhline(budget, color="black", ls=ls, lw=1)
            ax.text(ns[0], budget * 1.15, text, fontsize=9, va="bottom")
            n_max = max_sequence_length(budget, heads=heads, dtype="float16", matrices=2)
            notes.append(f"    in {text.split(': ')[-1].replace(' card', '')} up to N = {n_max:,}")
            if ns[0] <= n_max <= ns[-1]:  # where S + P in fp16 stops fitting
                ax.plot([n_max], [budget], "kv", ms=8, zorder=5)
        example = attention_memory(32_768, d, heads=heads, dtype="float16")  # the 32k-token example
        shown, what = (example.scores, "S") if heads == 1 else (example.logits_and_probabilities, "S + P")
        ax.plot([32_768], [shown], "o", color="black", ms=7, zorder=5)
        notes.append(f"● N = 32k: {what} in fp16 = {format_bytes(shown)}")
        ax.text(0.97, 0.04, "\n".join(notes), transform=ax.transAxes, ha="right", va="bottom", fontsize=9, ma="left",
                bbox={"fc": "white", "ec": "0.7"})
        n_axis(ax, ns)
        ax.set_title(f"{heads} head{'s' if heads > 1 else ''}, d = {d}, batch 1 (model, not measured)")
        ax.grid(True, which="major", alpha=0.3)
    bytes_axis(axes[0], 2.0**16, 2.0**43)
    axes[0].set_ylabel("memory (bytes, binary units)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=9)
    fig.suptitle("Memory of attention vs sequence length: N × N matrices against O(N·d) arrays (log-log)")
    return save(fig, png)


# --- figure 2: memory measured on the CPU -------------------------------------------------


def memory_cpu_data(naive_ns=CPU_NAIVE_NS, blocked_ns=CPU_BLOCKED_NS, *, d: int = 64, block: int = CPU_BLOCK,
                    progress: bool = True, seed: int = 0) -> list[dict]:
    """Peak extra memory (tracemalloc) of each NumPy stage at each N, beside its model. float32."""
    rng = np.random.default_rng(seed)
    runs = [("naive", n) for n in check_ns(naive_ns, "naive_ns")] + \
           [("blocked", n) for n in check_ns(blocked_ns, "blocked_ns")]
    rows = []
    for stage, n in progress_bar(runs, "tracemalloc sweep", progress):
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


CPU_INT_FIELDS = ("n", "d", "block", "measured_peak_bytes", "model_bytes", "outputs_bytes")  # block: "" for naive


def plot_memory_cpu_measured(png: Path, csv_path: Path | None = None, *, naive_ns=CPU_NAIVE_NS,
                             blocked_ns=CPU_BLOCKED_NS, d: int = 64, block: int = CPU_BLOCK,
                             progress: bool = True, remeasure: bool = True) -> Path:
    """Figure 2: tracemalloc's peak for naive_attention and blocked_attention over the model lines.

    ``remeasure``: measure now (tracemalloc; the slow part of a run) and write ``csv_path`` if given;
    else draw the measurement committed in ``csv_path`` (what ``python -m tinyflash.plots`` does
    unless given ``--remeasure-cpu``, so that a run leaves the checkout as it was).
    """
    rows = measured_rows(csv_path, remeasure, lambda: memory_cpu_data(naive_ns, blocked_ns, d=d, block=block,
                                                                      progress=progress), CPU_INT_FIELDS)
    if not remeasure:
        d, block = rows[0]["d"], next(r["block"] for r in rows if r["stage"] == "blocked")
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
            f"{100 * worst['blocked']:.1f}% (N ≥ 2·Br)\nfloat32, d = {d}, one head; the inputs Q, K, V are not "
            f"counted\nblocked: Br = Bc = {block} (lesson 06: 64; bigger tiles keep the Python loop short at large N)"
            f"\nmeasured on {rows[0]['machine']}, numpy {rows[0]['numpy']}, Python {rows[0]['python']}",
            transform=ax.transAxes, ha="right", fontsize=9)
    n_axis(ax, ns)
    bytes_axis(ax, min(m.flash_extra for m in model) / 2, max(m.naive_extra for m in model) * 4)
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
                    label="model: the loop's temporaries at their peak,\nmax(3·Br·Bc + Br·d, 2·Br·Bc + 4·Br·d), float32")
    n_axis(ax_diff, ns)
    ax_diff.set_ylim(bottom=0)
    ax_diff.set_ylabel("measured peak − outputs (KiB)")
    ax_diff.set_title("Beyond the outputs: flat in N for blocked")
    ax_diff.legend(fontsize=9, loc="center right")
    ax_diff.grid(True, alpha=0.3)
    return save(fig, png)
