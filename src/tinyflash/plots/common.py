"""What the figures share: axes in sequence length and in bytes, writing PNGs and CSVs, progress bars.

Every figure is drawn on a matplotlib ``Figure`` with the Agg canvas (no pyplot, no display).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

from ..cost.memory import format_bytes


def n_label(n: float, _pos=None) -> str:
    """512, 1k, 2k, ..., 128k (k = 1024)."""
    return f"{n / 1024:g}k" if n >= 1024 else f"{n:g}"


def n_axis(ax, ns) -> None:
    """Log-2 x axis of sequence lengths, one tick per power of two in ``ns``."""
    ax.set_xscale("log", base=2)
    powers = [n for n in ns if n & (n - 1) == 0]
    ax.xaxis.set_major_locator(FixedLocator(powers or list(ns)))
    ax.xaxis.set_major_formatter(FuncFormatter(n_label))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("sequence length N (tokens, 1k = 1024)")


def bytes_axis(ax, low: float, high: float, step: int = 5) -> None:
    """Log y axis in bytes, ticks every 2**step bytes labelled in binary units (KiB, MiB, GiB, TiB)."""
    ax.set_yscale("log", base=2)
    first, last = int(np.floor(np.log2(low))), int(np.ceil(np.log2(high)))
    ticks = [2.0**p for p in range(first, last + 1) if p % step == 0]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: format_bytes(y)))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(low, high)


def write_csv(path: Path, rows: list[dict]) -> Path:
    """Write ``rows`` (dicts with the same keys) as a CSV with a header; return the path."""
    if not rows:
        raise ValueError(f"no rows to write to {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def measured_rows(csv_path: Path | None, remeasure: bool, measure, int_fields) -> list[dict]:
    """A CPU-measured figure's rows: ``measure()`` now (and written to ``csv_path`` if given), or,
    without ``remeasure``, the committed rows read back from ``csv_path`` with ``int_fields`` as
    ints (an empty field stays ""). So a plots run redraws from committed data and changes no file."""
    if remeasure:
        rows = measure()
        if csv_path is not None:
            write_csv(Path(csv_path), rows)
        return rows
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r.update({key: int(r[key]) if r[key] != "" else "" for key in int_fields})
    return rows


def save(fig: Figure, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def progress_bar(items, desc: str, progress: bool):
    """Wrap ``items`` in a tqdm progress bar when asked (and tqdm is installed)."""
    if not progress:
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, leave=False)


def check_ns(ns, name: str) -> list[int]:
    ns = [int(n) for n in ns]
    if not ns or min(ns) < 1:
        raise ValueError(f"{name} must be a non-empty list of positive sequence lengths; got {ns!r}")
    return sorted(ns)
