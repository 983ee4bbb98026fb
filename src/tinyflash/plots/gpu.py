"""Figures 3 and 5: peak device memory and time against N, from the benchmark's record.

Both read ``figures/data/bench_h200.csv`` (``python -m tinyflash.bench sweep``, in the record's
schema), measured on an H200 and committed, so they regenerate on a machine without a GPU; while
that file is missing they draw a placeholder that says so. Each line of :data:`IMPLS` that has rows
in a panel is drawn there (stage 3, v6, has float16 rows only); the crossover and out-of-memory
marks compare stage 2 with naive attention.
"""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ..bench.record import FIELDS, STATUSES
from ..cost.memory import attention_memory
from ..hardware import H200
from .common import bytes_axis, n_axis, save

IMPLS = {  # a line of the figures -> (legend label, colour, marker); a line without rows draws nothing
    "stage 2": ("tinyflash stage 2 (CUDA cores, v5)", "tab:green", "o"),
    "stage 3": ("tinyflash stage 3 (tensor cores, v6)", "tab:orange", "D"),
    "naive": ("naive attention, CuPy (S and P in HBM)", "tab:red", "s"),
    "torch_flash": ("PyTorch SDPA, flash backend", "tab:blue", "^"),
    "torch_efficient": ("PyTorch SDPA, mem-efficient backend", "tab:purple", "v"),
}
LINE_OF = {("tinyflash", "v5"): "stage 2", ("tinyflash", "v6"): "stage 3"}  # (impl, variant) -> line; else impl


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
        missing = [c for c in FIELDS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"benchmark CSV {path} lacks the columns {missing}; expected the record's {FIELDS}")
        rows = []
        for line, raw in enumerate(reader, start=2):
            status = "wrong" if raw["status"].startswith("wrong") else raw["status"]
            if status not in STATUSES:
                raise ValueError(f"{path}, line {line}: status must be ok, oom, unsupported or wrong (...); "
                                 f"got {raw['status']!r}")
            if status == "unsupported":
                continue
            row = dict(raw, status=status, status_detail=raw["status"])
            for key in ("batch", "heads", "d"):
                row[key] = int(raw[key])
            row["n"] = int(raw["n_q"])  # the sweep's Nq = Nk
            row["line"] = LINE_OF.get((raw["impl"], raw["variant"]), raw["impl"])
            for key in ("time_ms", "time_min_ms", "time_max_ms", "tflops", "peak_bytes", "max_rel_err", "tolerance"):
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
    sel = [r for r in rows if (r["dtype"], r["d"], r["causal"], r["batch"], r["heads"]) == config and r["line"] == impl]
    return sorted(sel, key=lambda r: r["n"])


def crossover_n(rows: list[dict], config: tuple, fast: str = "stage 2", slow: str = "naive"):
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


def first_oom_n(rows: list[dict], config: tuple, impl: str = "naive"):
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
    return save(fig, png)


def _provenance(rows: list[dict]) -> str:
    """Device, date(s) and versions; a CSV measured in several runs names each run's date and dtypes."""
    r = rows[0]
    runs = {}
    for row in rows:
        runs.setdefault(row["date"], set()).add(row["dtype"])
    when = r["date"] if len(runs) == 1 else ", ".join(f"{date} ({', '.join(sorted(dtypes))})"
                                                      for date, dtypes in sorted(runs.items()))
    return (f"measured on {r['device']}, {when}; numpy {r['numpy']}, numba-cuda {r['numba_cuda']}, "
            f"cupy {r['cupy']}, torch {r['torch'] or 'not installed'}")


def _impl_label(rows, impl):
    errors = [r["max_rel_err"] for r in rows
              if r["line"] == impl and r["status"] == "ok" and r["max_rel_err"] is not None]  # checked results only
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
    fig.suptitle(f"{title}; ✖ at the top = ran out of memory (did not fit the GPU; no measurement)\n"
                 f"{_provenance(rows)}",
                 fontsize=11)
    return save(fig, png)


def _draw_gpu_memory(ax, rows, config):
    dtype, d, causal, batch, heads = config
    ns = _config_ns(rows, config)
    model = [attention_memory(n, d, heads=heads, batch=batch, dtype=dtype) for n in ns]
    ax.plot(ns, [m.naive_extra for m in model], "--", color="gray", lw=2.5, alpha=0.6,
            label="model: S + P + O in the input dtype")
    ax.plot(ns, [m.flash_extra for m in model], ":", color="gray", lw=2.5, alpha=0.8, label="model: O + lse")
    values = [m.flash_extra for m in model] + [m.naive_extra for m in model]
    ooms = []  # (row, colour) of the runs that ran out of memory
    for impl, (_, color, marker) in IMPLS.items():
        sel = _panel_rows(rows, config, impl)
        ok = [r for r in sel if r["status"] == "ok" and r["peak_bytes"] is not None]
        if ok:
            ax.plot([r["n"] for r in ok], [r["peak_bytes"] for r in ok], marker + "-", color=color,
                    label=_impl_label(rows, impl))
            values += [r["peak_bytes"] for r in ok]
        ooms += [(r, color) for r in sel if r["status"] == "oom"]
    capacity = H200.memory_bytes if "H200" in rows[0]["device"] else None
    if capacity:
        ax.axhline(capacity, color="black", lw=1)
        ax.text(ns[0], capacity * 1.15, "H200: 141 GB", fontsize=9)
        values.append(capacity)
    top = 4 * max(values)  # out of memory: drawn above the capacity line (or above everything), not at a size
    for r, color in ooms:
        ax.plot([r["n"]], [top], "X", color=color, ms=13, zorder=5, clip_on=False)
        ax.annotate("out of memory:\ndid not fit", (r["n"], top), xytext=(-10, -4), textcoords="offset points",
                    ha="right", va="top", color=color, fontsize=9, fontweight="bold")
    values.append(top)
    n_axis(ax, ns)
    bytes_axis(ax, min(values) / 2, max(values) * 4)
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
    return save(fig, png)


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
    n_axis(ax_f, ns)
    ax_t.set_xlabel("")


def _mark_crossover(ax, rows, config, ns) -> None:
    """Shade where naive CuPy is faster; a dashed line where stage 2 starts to win; say where naive OOMs."""
    n_win = crossover_n(rows, config)
    n_oom = first_oom_n(rows, config)
    notes = []
    if n_win is None:
        notes.append("tinyflash stage 2 is not faster than naive CuPy\nat the largest N where both ran")
    elif n_win == ns[0]:
        notes.append("tinyflash stage 2 faster than naive CuPy\nat every N where both ran")
    else:
        ax.axvspan(ns[0] / 1.3, n_win / 1.41, color="tab:red", alpha=0.07, lw=0)
        ax.axvline(n_win, color="black", ls="--", lw=1)
        ax.text(n_win * 1.06, 0.72, f"stage 2 faster\nfrom N = {n_win:,}", transform=ax.get_xaxis_transform(),
                fontsize=8.5)
        ax.text(ns[0], 0.5, "naive CuPy\nfaster here", transform=ax.get_xaxis_transform(), fontsize=8.5,
                color="tab:red")
    if n_oom is not None:
        notes.append(f"naive CuPy out of memory from N = {n_oom:,}")
    if notes:
        ax.text(0.98, 0.04, "\n".join(notes), transform=ax.transAxes, ha="right", fontsize=8.5,
                bbox={"fc": "white", "ec": "0.7"})
