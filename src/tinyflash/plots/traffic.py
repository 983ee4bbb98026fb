"""Figure 4: bytes moved to and from HBM, standard attention against FlashAttention, beside the
paper's bounds: against N, and against the on-chip memory M at a fixed N.

The FlashAttention markers are counted by running the blocked stage (``traffic.flash_attention_traffic``)
where that is cheap, and must equal the closed form; the lines are the closed forms.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from .common import bytes_axis, check_ns, n_axis, progress_bar, save, write_csv
from .memory import MODEL_NS
from ..cost.traffic import (HOPPER_SRAM_ELEMENTS, SRAM_ELEMENTS, flash_attention_traffic, flash_traffic_closed_form,
                      standard_attention_traffic, standard_traffic_closed_form, theta_flash, theta_standard,
                      tile_sizes, traffic_crossover)

TRAFFIC_NS = MODEL_NS
TRAFFIC_COUNT_MAX_N = 2048  # count by running the NumPy stage up to here (float16 NumPy arithmetic is slow); closed form beyond
TRAFFIC_M_N = 4096  # the fixed N of the SRAM-size panel
TRAFFIC_MAX_TILE_PAIRS = 5_000  # count only if Tr·Tc (Python loop iterations) stays below this


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
    for n in progress_bar(check_ns(ns, "ns"), "HBM traffic vs N", progress):
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
    crossover = traffic_crossover(n, d, dtype=dtype)  # where the lines cross: sampled on both sides
    ms = sorted(set(ms) | {SRAM_ELEMENTS, HOPPER_SRAM_ELEMENTS, crossover, crossover - 4 * d})
    rows = []
    for m in progress_bar(ms, "HBM traffic vs M", progress):
        moved, how = _flash_traffic(n, d, m, False, True, dtype)
        block_q, block_k = tile_sizes(m, d)
        rows.append({"algorithm": "flash", "m": m, "block_q": block_q, "block_k": block_k, "bytes": moved, "how": how})
        rows.append({"algorithm": "flash_bound", "m": m, "block_q": "", "block_k": "",
                     "bytes": theta_flash(n, d, m) * b, "how": "bound"})
    std = standard_traffic_closed_form(n, d, dtype=dtype)
    rows.append({"algorithm": "standard", "m": "", "block_q": "", "block_k": "", "bytes": std, "how": "closed_form"})
    rows.append({"algorithm": "crossover", "m": crossover, "block_q": tile_sizes(crossover, d)[0],
                 "block_k": tile_sizes(crossover, d)[1], "bytes": "", "how": "traffic_crossover"})
    for r in rows:
        r.update(n=n, d=d, dtype=dtype, causal=False)
    return rows


def plot_hbm_traffic(png: Path, csv_dir: Path | None = None, *, ns=TRAFFIC_NS, m_panel_n: int = TRAFFIC_M_N,
                     d: int = 64, count_max_n: int = TRAFFIC_COUNT_MAX_N, progress: bool = True) -> Path:
    """Figure 4: HBM bytes vs N (left) and vs SRAM size M at fixed N (right), counted and bounded."""
    ns = check_ns(ns, "ns")
    rows_n = traffic_vs_n_data(ns, d=d, count_max_n=count_max_n, progress=progress)
    rows_m = traffic_vs_m_data(m_panel_n, d=d, progress=progress)
    if csv_dir is not None:
        write_csv(Path(csv_dir) / "hbm_traffic_vs_n.csv", rows_n)
        write_csv(Path(csv_dir) / "hbm_traffic_vs_m.csv", rows_m)
    fig = Figure(figsize=(14, 6), layout="constrained")
    ax, ax_m = fig.subplots(1, 2)
    _draw_traffic_vs_n(ax, rows_n, ns, d)
    _draw_traffic_vs_m(ax_m, rows_m, m_panel_n, d)
    fig.suptitle("HBM traffic of one attention head (fp16, d = %d): standard attention re-reads N × N matrices, "
                 "FlashAttention re-reads K and V" % d)
    return save(fig, png)


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
    # The causal line and the two bounds at M = 16,384 lie close together: each gets its own line
    # style and marker (bounds: thin, dotted or dash-dotted, with x or + at every N).
    x, y, _ = series(algorithm="standard_bound")
    ax.plot(x, y, ":", marker="x", ms=7, color="tab:red", lw=1.5, zorder=4, label="Θ(N·d + N²) bound (constant 1)")
    for m, causal, color, style in ((SRAM_ELEMENTS, False, "tab:green", "-"), (SRAM_ELEMENTS, True, "tab:olive", "--"),
                                    (HOPPER_SRAM_ELEMENTS, False, "tab:blue", "-")):
        x, y, sel = series(algorithm="flash", m=m, causal=causal)
        block_q, block_k = tile_sizes(m, d)
        what = "causal (dashed)" if causal else "non-causal"
        ax.plot(x, y, style, color=color, lw=2.5 if causal else 2,
                label=f"FlashAttention, {what}, M = {m:,} (Br={block_q}, Bc={block_k})")
        counted_marks(sel, color)
    for m, color in ((SRAM_ELEMENTS, "tab:green"), (HOPPER_SRAM_ELEMENTS, "tab:blue")):
        x, y, _ = series(algorithm="flash_bound", m=m)
        ax.plot(x, y, "-.", marker="+", ms=9, mew=1.5, color=color, lw=1.2, zorder=4,
                label=f"Θ(N²·d²/M) bound, M = {m:,} (constant 1)")
    n_last = ns[-1]  # how many times more standard attention moves, at the largest N
    std_last = series(algorithm="standard", n=n_last)[1][0]
    ratios = [f"{std_last / series(algorithm='flash', n=n_last, m=m, causal=False)[1][0]:.1f}× at M = {m:,}"
              for m in (SRAM_ELEMENTS, HOPPER_SRAM_ELEMENTS)]
    ax.text(0.98, 0.04, f"at N = {n_last:,} standard attention moves\n" + "\n".join(ratios) +
            "\nthe bytes of FlashAttention (non-causal)", transform=ax.transAxes, ha="right", fontsize=8.5,
            bbox={"fc": "white", "ec": "0.7"})
    ax.plot([], [], "o", color="gray", mfc="none", ms=9, mew=2,
            label="counted by blocked_attention (lines: closed form)")
    n_axis(ax, ns)
    all_bytes = [r["bytes"] for r in rows]
    bytes_axis(ax, min(all_bytes) / 2, max(all_bytes) * 4)
    ax.set_ylabel("bytes read + written in HBM")
    ax.set_title("Traffic vs sequence length")
    ax.legend(fontsize=7.5, loc="upper left")
    ax.grid(True, alpha=0.3)


def crossover_sentence(rows_m) -> str:
    """What the right panel says, from its data: below which M FlashAttention moves more bytes."""
    cross = _select(rows_m, algorithm="crossover")[0]
    return (f"below M = {cross['m']:,} elements (tiles smaller than {cross['block_q']} × {cross['block_k']}),\n"
            "K and V are re-read so often that FlashAttention\nwould move more bytes than standard attention")


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
    ax.text(0.03, 0.3, crossover_sentence(rows), transform=ax.transAxes, fontsize=8)
    cross = _select(rows, algorithm="crossover")[0]["m"]
    ax.plot([cross], [std], "D", color="black", ms=7, zorder=5, label=f"crossover, M = {cross:,}")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda m, _pos: f"{m / 1024:g}k" if m >= 1024 else f"{m:g}"))
    ax.set_xlabel("on-chip memory M (elements, 1k = 1024); Br = ceil(M/4d), Bc = min(Br, d)")
    all_bytes = [r["bytes"] for r in rows if r["bytes"] != ""]  # (the crossover row has none)
    bytes_axis(ax, min(all_bytes) / 2, max(all_bytes) * 2, step=2)
    ax.set_ylabel("bytes read + written in HBM")
    ax.set_title(f"Traffic vs SRAM size at N = {n:,}: more SRAM, fewer passes over K and V")
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(True, alpha=0.3)
