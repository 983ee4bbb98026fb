"""Figure: the bytes of a KV cache against context length, MHA vs GQA vs MQA, float16 vs int8.

| figure       | what is drawn                                   | where the numbers come from           |
|--------------|-------------------------------------------------|---------------------------------------|
| kv_cache.png | K and V bytes of all layers vs context, batch 1 | decode.cache_memory.kv_cache_bytes    |

The model: 32 layers, 32 query heads of d = 128 (a 7B-class transformer); its K/V heads are 32
(multi-head attention), 8 (grouped-query attention) or 1 (multi-query attention).
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from ..decode.cache_memory import kv_cache_bytes

from .common import bytes_axis, check_ns, n_axis, save, write_csv
from ..hardware import H200

LAYERS, HEADS, HEAD_DIM = 32, 32, 128  # the model of the figure and of lesson 09's worked example
KV_HEADS = {"MHA": 32, "GQA": 8, "MQA": 1}  # K/V heads of each attention variant
DTYPE_BYTES = {"float16": 2, "int8": 1}
CONTEXTS = [2**p for p in range(10, 21)]  # 1k ... 1M tokens


def kv_cache_data(contexts=CONTEXTS, batch: int = 1) -> list[dict]:
    """One row per (variant, dtype, context): the cache's bytes, from :func:`kv_cache_bytes`."""
    return [{"variant": name, "kv_heads": h_kv, "dtype": dt, "context": n, "batch": batch, "layers": LAYERS,
             "head_dim": HEAD_DIM, "bytes": kv_cache_bytes(layers=LAYERS, kv_heads=h_kv, head_dim=HEAD_DIM,
                                                           context=n, batch=batch, bytes_per_element=size)}
            for name, h_kv in KV_HEADS.items() for dt, size in DTYPE_BYTES.items()
            for n in check_ns(contexts, "contexts")]


def plot_kv_cache(png: Path, csv_path: Path | None = None, *, contexts=CONTEXTS) -> Path:
    """The figure: one line per (variant, dtype); the H200's memory as a horizontal line."""
    contexts = check_ns(contexts, "contexts")
    rows = kv_cache_data(contexts)
    if csv_path is not None:
        write_csv(Path(csv_path), rows)
    fig = Figure(figsize=(8.5, 6), layout="constrained")
    ax = fig.subplots()
    colors = {"MHA": "tab:red", "GQA": "tab:blue", "MQA": "tab:green"}
    for name, h_kv in KV_HEADS.items():
        for dt, style in (("float16", "-"), ("int8", "--")):
            ys = [r["bytes"] for r in rows if r["variant"] == name and r["dtype"] == dt]  # (len(contexts),)
            ax.plot(contexts, ys, style, color=colors[name], marker="o", ms=3,
                    label=f"{name} ({h_kv} K/V head{'s' if h_kv > 1 else ''}), {dt}")
    ax.axhline(H200.memory_bytes, color="black", lw=1, ls=":")
    ax.text(contexts[0], H200.memory_bytes * 1.2, f"H200: {H200.memory_bytes / 1e9:.0f} GB of HBM (all of it)", fontsize=9)
    n_axis(ax, contexts)
    ax.set_xlabel("context length (tokens, 1k = 1024)")
    ax.set_ylabel("KV cache, all layers, one sequence")
    low = min(r["bytes"] for r in rows)
    bytes_axis(ax, low / 2, max(max(r["bytes"] for r in rows), H200.memory_bytes) * 2, step=2)
    ax.grid(True, which="major", alpha=0.3)
    ax.set_title(f"KV cache of a {LAYERS}-layer model, {HEADS} query heads, d = {HEAD_DIM}: 2·layers·context·H_kv·d·bytes")
    ax.legend(fontsize=8, loc="lower right")
    return save(fig, png)
