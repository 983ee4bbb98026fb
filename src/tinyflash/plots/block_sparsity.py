"""Figure: which tiles each mask leaves to compute — empty (skipped), partial (masked per element), full.

| figure             | what is drawn                                          | where the numbers come from  |
|--------------------|--------------------------------------------------------|------------------------------|
| block_sparsity.png | the block mask of each variant, and its tile fractions | core.block_mask (counted)    |

The variants are those of FlexAttention's comparison in lesson 11: B = 1, H = 1, Nq = Nk, tiles of
128 × 128. A score modification (softcap, ALiBi) masks nothing: its tiles are those of its mask
(dense, or causal).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from ..core.block_mask import create_block_mask
from ..core.variants import document_mask, prefix_lm, sliding_window
from .common import save, write_csv

BLOCK = 128  # tile rows and columns, FlexAttention's default
KINDS = ("empty", "partial", "full")  # to_dense()'s 0, 1, 2


def variants(n: int) -> dict:
    """name -> (mask_mod, causal) at sequence length ``n``: the masks of the benchmark's variants."""
    ids = np.repeat(np.arange(8), -(-n // 8))[:n]  # 8 packed documents of equal length
    return {
        "dense (softcap, ALiBi)": (None, False),
        "causal": (None, True),
        "sliding window 1,024": (sliding_window(1024), True),
        "8 documents, causal": (document_mask(ids), True),
        "prefix-LM, prefix n/4": (prefix_lm(n // 4), False),
    }


def block_sparsity_data(n: int = 16_384, block: int = BLOCK) -> list[dict]:
    """One row per variant: the fraction of the (n / block)² tiles that are empty, partial and full."""
    rows = []
    for name, (mask_mod, causal) in variants(n).items():
        dense = create_block_mask(mask_mod, 1, 1, n, n, block_q=block, block_k=block, causal=causal).to_dense()
        counts = np.bincount(dense.ravel(), minlength=3)  # tiles of each kind
        rows.append({"variant": name, "n": n, "block": block,
                     **{kind: round(float(c) / dense.size, 6) for kind, c in zip(KINDS, counts)}})
    return rows


def plot_block_sparsity(png: Path, csv_path: Path | None = None, *, n: int = 16_384, picture_n: int = 4_096) -> Path:
    """The figure: each variant's block mask at ``picture_n`` (one pixel per tile), and its tile fractions at ``n``."""
    rows = block_sparsity_data(n)
    if csv_path is not None:
        write_csv(Path(csv_path), rows)
    names = list(variants(n))
    fig = Figure(figsize=(13, 5.2), layout="constrained")
    grid = fig.add_gridspec(2, len(names), height_ratios=[1.3, 1])
    colors = ListedColormap(["white", "tab:orange", "tab:blue"])  # empty, partial, full
    for col, (name, (mask_mod, causal)) in enumerate(variants(picture_n).items()):
        ax = fig.add_subplot(grid[0, col])
        dense = create_block_mask(mask_mod, 1, 1, picture_n, picture_n, block_q=BLOCK, block_k=BLOCK,
                                  causal=causal).to_dense()[0, 0]  # (Tr, Tc)
        ax.imshow(dense, cmap=colors, vmin=0, vmax=2, interpolation="nearest")
        ax.set_title(name, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel("key tiles", fontsize=8)
        if col == 0:
            ax.set_ylabel(f"query tiles (N = {picture_n:,})", fontsize=8)
    ax = fig.add_subplot(grid[1, :])
    left = np.zeros(len(rows))
    for kind, color in zip(KINDS, ("lightgray", "tab:orange", "tab:blue")):
        widths = np.array([r[kind] for r in rows])
        ax.barh(names, widths, left=left, color=color, label=f"{kind} tiles")
        left += widths
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel(f"fraction of the {(n // BLOCK) ** 2:,} tiles of {BLOCK} × {BLOCK} at N = {n:,}")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.005, 0.5))
    fig.suptitle("The block mask: empty tiles are never loaded, partial ones are masked per element, full ones "
                 "need no mask", fontsize=11)
    return save(fig, png)
