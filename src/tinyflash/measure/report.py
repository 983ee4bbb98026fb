"""Printing benchmark results: one line per measurement, and the README's Markdown tables.

The README's tables are generated from the committed CSVs by these functions (``python -m
tinyflash.bench --summary CSV`` prints them) and tests/test_readme.py checks that the README
holds exactly what they produce.
"""

from __future__ import annotations

LINE_HEADER = (f"{'impl':16} {'variant':28} {'dtype':8} {'causal':6} {'N':>6} {'d':>4} {'ms':>9} {'spread %':>8} "
               f"{'TFLOP/s':>8} {'extra MiB':>10} {'rel err':>8} {'tol':>8}  status")


def _num(row: dict, key: str):
    value = row.get(key)
    return None if value in (None, "") else float(value)


def line(row: dict) -> str:
    """One measurement as a line of text (the harness's rows, or rows read back from a CSV)."""
    ms, lo, hi = _num(row, "time_ms"), _num(row, "time_min_ms"), _num(row, "time_max_ms")
    cells = [f"{ms:9.3f}" if ms else f"{'-':>9}",
             f"{100 * (hi - lo) / ms:8.1f}" if ms and lo is not None and hi is not None else f"{'-':>8}",
             f"{_num(row, 'tflops'):8.1f}" if _num(row, "tflops") else f"{'-':>8}",
             f"{_num(row, 'peak_bytes') / 2**20:10.1f}" if _num(row, "peak_bytes") is not None else f"{'-':>10}",
             f"{_num(row, 'max_rel_err'):8.1e}" if _num(row, "max_rel_err") is not None else f"{'-':>8}",
             f"{_num(row, 'tolerance'):8.1e}" if _num(row, "tolerance") is not None else f"{'-':>8}"]
    return (f"{row['impl']:16} {row.get('variant', ''):28} {row['dtype']:8} {str(row['causal']):6} {int(row['n']):6d} "
            f"{int(row['d']):4d} " + " ".join(cells) + f"  {row['status']}")


def summary_table(rows: list[dict], n: int = 16384) -> str:
    """The README's results table: one line per (dtype, d, causal) at sequence length ``n`` of the
    sweep CSV, with TFLOP/s of each implementation; stage 2's speed relative to PyTorch's
    memory-efficient backend and to naive CuPy, and its extra memory against naive CuPy; stage 3's
    (``tinyflash_tc``, v6: float16 rows only) speed relative to the flash backend. "–" where a CSV
    has no such row (one measured before stage 3 joined the sweep has no v6 rows at all)."""
    ok = {(r["impl"], r["dtype"], r["d"], r["causal"]): r for r in rows if r["status"] == "ok" and int(r["n"]) == n}
    status = {(r["impl"], r["dtype"], r["d"], r["causal"]): r["status"] for r in rows if int(r["n"]) == n}
    if not ok:
        raise ValueError(f"no successful measurement at N={n} in the CSV")
    version = {r["variant"] for r in rows if r["impl"] == "tinyflash" and r.get("variant")}  # what stage 2 ran
    version = f" ({version.pop()})" if len(version) == 1 else ""

    def cell(impl, key, field, fmt):
        r = ok.get((impl, *key))
        return fmt.format(float(r[field])) if r else ("OOM" if status.get((impl, *key)) == "oom" else "–")

    def speed(fast, slow, key, fmt):  # time of slow / time of fast: how many times faster ``fast`` is
        a, b = ok.get((fast, *key)), ok.get((slow, *key))
        return fmt.format(float(b["time_ms"]) / float(a["time_ms"])) if a and b else "–"

    lines = [f"| dtype | d | causal | stage 2{version} TFLOP/s | stage 3 (v6) TFLOP/s | SDPA efficient | SDPA flash | "
             "naive CuPy | stage 2 / efficient | stage 3 / flash | speed-up over naive | "
             "extra memory, stage 2 / naive |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({k[1:] for k in ok}, key=lambda k: (k[0], int(k[1]), k[2]))
    for key in keys:
        tf_row, naive = ok.get(("tinyflash", *key)), ok.get(("cupy_naive", *key))
        mem = (f"{int(float(tf_row['peak_bytes'])) / 2**20:.0f} MiB / {int(float(naive['peak_bytes'])) / 2**20:.0f} MiB"
               if tf_row and naive else "–")
        tflops = [cell(impl, key, "tflops", "{:.1f}")
                  for impl in ("tinyflash", "tinyflash_tc", "torch_efficient", "torch_flash", "cupy_naive")]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {' | '.join(tflops)} | "
                     f"{speed('tinyflash', 'torch_efficient', key, '{:.2f}×')} | "
                     f"{speed('tinyflash_tc', 'torch_flash', key, '{:.2f}×')} | "
                     f"{speed('tinyflash', 'cupy_naive', key, '{:.1f}×')} | {mem} |")
    return "\n".join(lines)


def versions_table(rows: list[dict], dtype: str = "float32", causal: str = "False") -> str:
    """The README's kernel-version table: TFLOP/s (median) of each version per head dim, from the
    versions CSV, with the registry's line on what changed."""
    from ..forward.kernels import VERSIONS

    ok = {(r["variant"], r["d"]): r for r in rows
          if r["status"] == "ok" and r["dtype"] == dtype and r["causal"] == causal}
    ns = sorted({r["n"] for r in rows}, key=int)
    if len(ns) != 1:
        raise ValueError(f"the versions CSV should hold one sequence length; got {ns}")
    ds = sorted({d for _, d in ok}, key=int)
    lines = ["| version | what changed | " + " | ".join(f"d = {d}" for d in ds) + " |",
             "|---|---|" + "---|" * len(ds)]
    for name, version in VERSIONS.items():
        cells = [f"{float(ok[name, d]['tflops']):.1f}" if (name, d) in ok else "–" for d in ds]
        lines.append(f"| {name} | {version.changed} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def example_32k_table(row: dict) -> str:
    """The README's Markdown table of the 32k-token example (one CSV row)."""
    gib = 2**30
    return "\n".join([
        "| time (median) | TFLOP/s | memory held (inputs + extra) | q, k, v, o, lse alone | fp16 scores alone would need | "
        "max rel. error (sampled rows, float64 reference) |",
        "|---|---|---|---|---|---|",
        f"| {float(row['time_ms']):.1f} ms | {float(row['tflops']):.1f} | {int(row['total_peak_bytes']) / gib:.2f} GiB | "
        f"{int(row['model_qkvo_lse_bytes']) / gib:.2f} GiB | {int(row['model_fp16_scores_bytes']) / gib:.0f} GiB | "
        f"{float(row['max_rel_err']):.1e} |",
    ])


def backward_table(rows: list[dict], n: int = 16384) -> str:
    """The README's backward table (``python -m tinyflash.bench backward``): TFLOP/s (2.5× the forward's
    FLOPs) per (d, causal) at sequence length ``n``, tinyflash against SDPA's float32 efficient backward
    (the bar: 0.75×), and the time of naive CuPy over tinyflash's at N = 4096 and at ``n``."""
    ok = {(r["impl"], r["d"], r["causal"], r["n"]): r for r in rows if r["status"] == "ok"}
    status = {(r["impl"], r["d"], r["causal"], r["n"]): r["status"] for r in rows}

    def cell(impl, d, causal, n_):
        r = ok.get((impl, d, causal, str(n_)))
        return f"{float(r['tflops']):.1f}" if r else ("OOM" if status.get((impl, d, causal, str(n_))) == "oom" else "–")

    def ratio(a, b, d, causal, n_, fmt):  # time of b / time of a: how many times faster a is
        ra, rb = ok.get((a, d, causal, str(n_))), ok.get((b, d, causal, str(n_)))
        return fmt.format(float(rb["time_ms"]) / float(ra["time_ms"])) if ra and rb else "–"

    lines = [f"| d | causal | tinyflash f32 | SDPA efficient f32 | SDPA flash f16 | naive CuPy f32 | tinyflash / "
             f"efficient | naive / tinyflash, N = 4096 | naive / tinyflash, N = {n} |", "|---|---|---|---|---|---|---|---|---|"]
    for d, causal in sorted({(r["d"], r["causal"]) for r in rows}, key=lambda k: (int(k[0]), k[1])):
        lines.append(f"| {d} | {causal} | {cell('tinyflash', d, causal, n)} | {cell('torch_efficient', d, causal, n)} | "
                     f"{cell('torch_flash', d, causal, n)} | {cell('cupy_naive', d, causal, n)} | "
                     f"{ratio('tinyflash', 'torch_efficient', d, causal, n, '{:.2f}×')} | "
                     f"{ratio('tinyflash', 'cupy_naive', d, causal, 4096, '{:.1f}×')} | "
                     f"{ratio('tinyflash', 'cupy_naive', d, causal, n, '{:.1f}×')} |")
    return "\n".join(lines)


def table_for(rows: list[dict], n: int = 16384) -> str:
    """The README table that fits a CSV: the 32k-token example's, the versions', the backward's, or the
    sweep's at ``n``."""
    if "total_peak_bytes" in rows[0]:
        return example_32k_table(rows[0])
    if rows[0].get("benchmark") == "backward":
        return backward_table(rows, n)
    if rows[0].get("benchmark") == "versions":
        return versions_table(rows)
    return summary_table(rows, n)
