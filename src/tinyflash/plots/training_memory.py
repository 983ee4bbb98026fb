"""The training-memory figure: what the backward pass keeps and takes, naive against FlashAttention.

| figure              | what is drawn                                         | where the numbers come from |
|---------------------|-------------------------------------------------------|-----------------------------|
| training_memory.png | bytes kept from forward to backward, and the peak of  | the arrays' sizes; tracemalloc, |
|                     | each backward stage, against N                        | this machine                |

A naive training step keeps S and P (N × N per head) from the forward pass for the backward
pass: measured as the peak of :func:`tinyflash.naive_attention`, where S, P and O are alive
together. FlashAttention keeps O and lse (N·dv + N): the bytes of the arrays the forward
returns. The backward's peaks are measured with tracemalloc
(:func:`tinyflash.cost.memory.measure_peak_bytes`) around one call of
:func:`tinyflash.naive_attention_backward` (S, P, dP and dS materialised) and of
:func:`tinyflash.blocked_attention_backward` (tiles only). float32, one head, inputs not counted.
"""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ..backward.blocked import blocked_attention_backward
from ..backward.naive import naive_attention_backward
from ..forward.blocked import blocked_attention
from ..forward.naive import naive_attention
from ..cost.memory import measure_peak_bytes
from .common import (bytes_axis, check_ns, measured_rows, n_axis, progress_bar, save)

NAIVE_NS = [2**p for p in range(8, 13)]  # 256 ... 4096 (S, P, dP, dS in float32: 256 MiB at the end)
FLASH_NS = [2**p for p in range(8, 15)]  # 256 ... 16,384 (O(N·d) memory: it can go further)
BLOCK = 256  # tiles of the CPU sweep: big tiles keep the Python loop short
INT_FIELDS = ("n", "d", "block", "kept_bytes", "backward_peak_bytes")  # the CSV's numbers (block: "" for naive)


def training_memory_data(naive_ns=NAIVE_NS, flash_ns=FLASH_NS, *, d: int = 64, block: int = BLOCK,
                         progress: bool = True, seed: int | None = None) -> list[dict]:
    """One row per (stage, N): bytes kept from forward to backward, and the backward's measured peak."""
    rng = np.random.default_rng(seed)
    runs = [("naive", n) for n in check_ns(naive_ns, "naive_ns")] + \
           [("flash", n) for n in check_ns(flash_ns, "flash_ns")]
    rows = []
    for stage, n in progress_bar(runs, "training memory", progress):
        q, k, v, do = (rng.standard_normal((n, d), dtype=np.float32) for _ in range(4))  # (N, d) each
        if stage == "naive":
            kept, _ = measure_peak_bytes(naive_attention, q, k, v)  # S, P and O, alive together
            peak, _ = measure_peak_bytes(naive_attention_backward, q, k, v, do)
        else:
            o, lse = blocked_attention(q, k, v, block_q=block, block_k=block)
            kept = o.nbytes + lse.nbytes  # O and lse
            peak, _ = measure_peak_bytes(blocked_attention_backward, q, k, v, o, lse, do, block_q=block,
                                         block_k=block)
        rows.append({"stage": stage, "n": n, "d": d, "dtype": "float32", "block": block if stage == "flash" else "",
                     "kept_bytes": kept, "backward_peak_bytes": peak, "numpy": np.__version__,
                     "python": platform.python_version(), "machine": platform.machine()})
    return rows


def plot_training_memory(png: Path, csv_path: Path | None = None, *, naive_ns=NAIVE_NS, flash_ns=FLASH_NS,
                         d: int = 64, block: int = BLOCK, progress: bool = True, remeasure: bool = True) -> Path:
    """The figure: kept bytes (lines) and backward peaks (markers), naive and FlashAttention, against N.

    ``remeasure``: measure now and write ``csv_path`` if given; else draw the measurement committed
    in ``csv_path`` (what ``python -m tinyflash.plots`` does unless given ``--remeasure-cpu``, so
    that a run leaves the checkout as it was).
    """
    rows = measured_rows(csv_path, remeasure, lambda: training_memory_data(naive_ns, flash_ns, d=d, block=block,
                                                                           progress=progress), INT_FIELDS)
    if not remeasure:
        d = rows[0]["d"]
        block = next(r["block"] for r in rows if r["stage"] == "flash")
    fig = Figure(figsize=(9, 5.6), layout="constrained")
    ax = fig.subplots()
    for stage, color, marker, kept_label, peak_label in (
            ("naive", "tab:red", "o", "kept for the backward: S, P (N × N each), O (peak of naive_attention)",
             "peak of naive_attention_backward (S, P, dP, dS)"),
            ("flash", "tab:green", "s", "kept for the backward: O + lse (what blocked_attention returns)",
             f"peak of blocked_attention_backward (Br = Bc = {block})")):
        sel = [r for r in rows if r["stage"] == stage]
        ns = [r["n"] for r in sel]
        ax.plot(ns, [r["kept_bytes"] for r in sel], "-", color=color, lw=2, label=kept_label)
        ax.plot(ns, [r["backward_peak_bytes"] for r in sel], marker, color=color, ms=8, mfc="none", mew=2,
                label=peak_label)
    all_ns = sorted({r["n"] for r in rows})
    values = [r[key] for r in rows for key in ("kept_bytes", "backward_peak_bytes")]
    n_axis(ax, all_ns)
    bytes_axis(ax, min(values) / 2, max(values) * 4)
    ax.set_ylabel("bytes (one head, float32, inputs not counted)")
    ax.set_title(f"Training memory: what the backward pass needs (d = {d}, measured on this CPU)")
    ax.legend(fontsize=9, loc="upper left")
    ax.grid(True, alpha=0.3)
    return save(fig, png)

