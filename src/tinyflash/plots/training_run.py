"""The training-run figure: one small GPT trained twice from one seed, with tinyflash's attention and SDPA's.

| figure           | what is drawn                                          | where the numbers come from        |
|------------------|--------------------------------------------------------|------------------------------------|
| gpt_training.png | training loss (each step, and smoothed) and held-out   | examples/train_gpt.py on a GPU     |
|                  | loss of both runs; below, the gap between the two, and | (gpt_training_h200.csv)            |
|                  | SDPA's gap to its own second run                       |                                    |
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from ..bench.record import read_csv
from ..bench.training_run import IMPLS, REPEAT, SMOOTH, TOLERANCE, compare, curves, smoothed
from .common import save

COLORS = {"tinyflash": "tab:red", "sdpa_flash": "tab:blue"}
LABELS = {"tinyflash": "tinyflash.torch.attention", "sdpa_flash": "SDPA (flash backend)"}


def plot_gpt_training(png: Path, csv_path: Path) -> Path:
    """Both runs' losses against the step (upper panel) and the gap between their smoothed curves (lower)."""
    rows = read_csv(csv_path)
    c, result = curves(rows), compare(rows, int(rows[0]["batch"]) * int(rows[0]["context"]))
    fig = Figure(figsize=(9, 7), layout="constrained")
    ax, gap = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    for impl in IMPLS:
        steps, loss, held_steps, held, _ = c[impl]
        ax.plot(steps, loss, color=COLORS[impl], alpha=0.25, linewidth=0.7)
        ax.plot(steps, smoothed(loss), color=COLORS[impl], linewidth=1.8,
                label=f"{LABELS[impl]}: training loss, mean of {SMOOTH} steps "
                      f"({result['tokens_per_s'][impl]:,.0f} tokens/s)")
        ax.plot(held_steps, held, color=COLORS[impl], linestyle="none", marker="o", markersize=4,
                label=f"{LABELS[impl]}: held-out loss")
    ax.set_ylabel("cross-entropy (nats per character)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    steps = c[IMPLS[0]][0]
    gap.plot(steps, smoothed(c[IMPLS[0]][1]) - smoothed(c[IMPLS[1]][1]), color="black", linewidth=1,
             label="tinyflash − SDPA")
    if REPEAT in c:  # SDPA's second run from the same seed: how far SDPA is from itself
        gap.plot(steps, smoothed(c[REPEAT][1]) - smoothed(c[IMPLS[1]][1]), color="tab:blue", linewidth=1,
                 alpha=0.6, label="SDPA (second run) − SDPA")
        gap.legend(fontsize=8)
    allowed = result["allowed_train_gap"]  # TOLERANCE, or twice SDPA's own gap where that is larger
    for bound in (-allowed, allowed):
        gap.axhline(bound, color="grey", linestyle="--", linewidth=0.8)
    gap.set_ylabel("gap of the smoothed losses")
    gap.set_xlabel("training step")
    r = rows[0]
    again = f" (SDPA to its own second run {result['sdpa_self_train_gap']:.3f})" if REPEAT in c else ""
    fig.suptitle(f"A character-level GPT ({r['layers']} layers, width {r['width']}, {r['heads']} heads, context "
                 f"{r['context']}, batch {r['batch']}, {r['dtype']})\ntrained from one seed with tinyflash and with SDPA"
                 f"\nlargest gap of the smoothed curves {result['max_train_gap']:.3f}{again}, of the held-out losses "
                 f"{result['max_eval_gap']:.3f}; allowed {allowed:.3f} ({TOLERANCE} or twice SDPA's own)"
                 f"\n{r['device']}, {r['date']}, torch {r['torch']}",
                 fontsize=10)
    return save(fig, png)
