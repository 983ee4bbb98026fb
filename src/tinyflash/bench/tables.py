"""The tables and sentences of the docs, computed from the record (``figures/data/*.csv``).

docs/results.md holds them between markers (``<!-- name:start -->`` ... ``<!-- name:end -->``);
``python -m tinyflash.bench --summary CSV`` prints the tables of one CSV, and the tests check that the
docs hold exactly what these functions produce. A cell is '–' where the record has no such row, and
says 'OOM' where the implementation ran out of memory.
"""

from __future__ import annotations

from .cells import DASH, cell, configs, find, ok_rows, speed
from .record import number
from .sweep_tables import tiles_table


def versions_table(rows: list[dict], dtype: str = "float32", causal: str = "False") -> str:
    """The kernel versions (``versions``): TFLOP/s of each registered version per head dim, with the
    registry's line on what changed."""
    from ..forward.kernels import VERSIONS

    ns = {r["n_q"] for r in rows}
    if len(ns) != 1:
        raise ValueError(f"the versions record should hold one sequence length; got {sorted(ns)}")
    ds = [d for (d,) in configs(rows, "d")]
    lines = ["| version | what changed | " + " | ".join(f"d = {d}" for d in ds) + " |",
             "|---|---|" + "---|" * len(ds)]
    for name, version in VERSIONS.items():
        cells = [cell(find(rows, variant=name, d=d, dtype=dtype, causal=causal)) for d in ds]
        lines.append(f"| {name} | {version.changed} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def vector_sentence(rows: list[dict]) -> str:
    """What reading 4 elements per thread and load bought (``vector``), per dtype: the range over d and causal."""
    def change(dtype):
        return sorted(float(find(rows, variant="v5 vector=1", dtype=dtype, d=d, causal=c)["time_ms"])
                      / float(find(rows, variant="v5 vector=4", dtype=dtype, d=d, causal=c)["time_ms"]) - 1
                      for d, c in configs(ok_rows(rows, dtype=dtype), "d", "causal"))

    f16, f32 = change("float16"), sorted(-x for x in change("float32"))
    return (f"4 per thread made float16 {f16[0]:.1%} to {f16[-1]:.1%} faster and float32 {f32[0]:.1%} to "
            f"{f32[-1]:.1%} slower")


def sweep_table(rows: list[dict], n: int = 16384) -> str:
    """The forward sweep (``sweep``) at one sequence length: TFLOP/s of each implementation per (dtype, d,
    causal); stage 2 against SDPA's memory-efficient backend and naive attention, stage 3 against SDPA
    flash, and the extra memory of stage 2 and of naive attention."""
    at = [r for r in rows if r["n_q"] == str(n)]
    if not ok_rows(at):
        raise ValueError(f"no successful measurement at N={n} in the record")
    lines = ["| dtype | d | causal | stage 2 (v5) | stage 3 (v6) | SDPA efficient | SDPA flash | naive | "
             "stage 2 / efficient | stage 3 / flash | stage 2 / naive | extra memory, stage 2 / naive |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for dtype, d, causal in configs(at, "dtype", "d", "causal"):
        def get(impl, variant=""):
            return find(at, impl=impl, variant=variant, dtype=dtype, d=d, causal=causal)

        v5, v6, eff, flash, naive = (get("tinyflash", "v5"), get("tinyflash", "v6"), get("torch_efficient"),
                                     get("torch_flash"), get("naive"))
        memory = (f"{number(v5, 'peak_bytes') / 2**20:,.0f} MiB / {number(naive, 'peak_bytes') / 2**20:,.0f} MiB"
                  if v5 and naive and v5["status"] == naive["status"] == "ok" else DASH)
        lines.append(f"| {dtype} | {d} | {causal} | {' | '.join(cell(r) for r in (v5, v6, eff, flash, naive))} | "
                     f"{speed(v5, eff)} | {speed(v6, flash)} | {speed(v5, naive, '{:.1f}×')} | {memory} |")
    return "\n".join(lines)


def example_32k_table(rows: list[dict]) -> str:
    """The 32k-token example (``example-32k``): time, TFLOP/s, the memory held against what the scores alone
    would need, the error on sampled rows; one line per stage and dtype."""
    from ..cost.memory import attention_memory

    lines = ["| stage | dtype | time | TFLOP/s | memory beyond the inputs | o and lse alone | "
             "float16 scores would need | max rel. error |", "|---|---|---|---|---|---|---|---|"]
    stage = {"v5": "2 (v5, CUDA cores)", "v6": "3 (v6, tensor cores)"}
    for r in sorted(ok_rows(rows), key=lambda r: (r["variant"], r["dtype"])):
        model = attention_memory(int(r["n_q"]), int(r["d"]), heads=int(r["heads"]), batch=int(r["batch"]),
                                 dtype=r["dtype"])
        lines.append(f"| {stage.get(r['variant'], r['variant'])} | {r['dtype']} | {float(r['time_ms']):.1f} ms | "
                     f"{float(r['tflops']):.1f} | {number(r, 'peak_bytes') / 2**30:.3f} GiB | "
                     f"{(model.o + model.lse) / 2**30:.3f} GiB | {model.scores / 2**30:.0f} GiB | "
                     f"{float(r['max_rel_err']):.1e} |")
    return "\n".join(lines)


def against_baseline(row) -> str:
    """Three cells of a peer timed against the baseline: queued, the middle half of the rounds, one call alone."""
    q1, q3 = cell(row, "vs_baseline_q1", "{:.2f}"), cell(row, "vs_baseline_q3", "{:.2f}")
    return (f"{cell(row, 'vs_baseline', '{:.2f}×')} | {DASH if q1 == DASH else f'{q1}–{q3}×'} | "
            f"{cell(row, 'latency_vs_baseline', '{:.2f}×')}")


def tensor_core_table(rows: list[dict]) -> str:
    """Stage 3 against its peers (``tensor-cores``): v6's TFLOP/s and its speed over SDPA flash per
    configuration (queued; the middle half of the rounds' ratios; one call alone), the peers' TFLOP/s."""
    lines = ["| dtype | d | causal | N | v6 TFLOP/s | v6 / flash | its rounds' middle half | one call alone: v6 / flash "
             "| SDPA flash | SDPA cuDNN | v5 (stage 2) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for dtype, d, causal, n in configs(rows, "dtype", "d", "causal", "n_q"):
        def get(impl, variant=""):
            return find(rows, impl=impl, variant=variant, dtype=dtype, d=d, causal=causal, n_q=n)

        v6 = get("tinyflash", "v6")
        lines.append(f"| {dtype} | {d} | {causal} | {n} | {cell(v6)} | {against_baseline(v6)} | "
                     f"{cell(get('torch_flash'))} | {cell(get('torch_cudnn'))} | {cell(get('tinyflash', 'v5'))} |")
    return "\n".join(lines)


def hopper_table(rows: list[dict]) -> str:
    """Stage 4's steps against their peers (``hopper``): each kernel's speed over SDPA flash (queued), v6 to the last
    wgmma version; for the one ``hopper_attention`` runs (the registry's rule, else the record's last step),
    its TFLOP/s, one call alone over flash's, and its speed over SDPA cuDNN by time; the peers' TFLOP/s."""
    from ..forward.kernels import VERSIONS

    VERSION = VERSIONS.default("hopper_attention").name

    steps = sorted({r["variant"] for r in rows if r["impl"] == "tinyflash"}, key=lambda v: int(v[1:]))
    shown = VERSION if VERSION in steps else steps[-1]  # a record older than VERSION: its last step
    lines = ["| dtype | d | causal | B × N | " + " | ".join(f"{v} / flash" for v in steps) + f" | {shown} TFLOP/s | "
             f"one call alone: {shown} / flash | {shown} / cuDNN | SDPA flash | SDPA cuDNN |",
             "|---" * (len(steps) + 9) + "|"]
    for dtype, d, causal, b, n in configs(rows, "dtype", "d", "causal", "batch", "n_q"):
        def get(impl, variant=""):
            return find(rows, impl=impl, variant=variant, dtype=dtype, d=d, causal=causal, batch=b, n_q=n)

        runs, cudnn = get("tinyflash", shown), get("torch_cudnn")
        ladder = " | ".join(cell(get("tinyflash", v), "vs_baseline", "{:.2f}×") for v in steps)
        lines.append(f"| {dtype} | {d} | {causal} | {b} × {int(n):,} | {ladder} | {cell(runs)} | "
                     f"{cell(runs, 'latency_vs_baseline', '{:.2f}×')} | {speed(runs, cudnn)} | {cell(get('torch_flash'))} | "
                     f"{cell(cudnn)} |")
    return "\n".join(lines)


def head_dim_table(rows: list[dict]) -> str:
    """Stage 3 at head dims beside 64 and 128 (``head-dims``): v6 as a user calls it, its TFLOP/s and speed over SDPA
    flash (queued; one call alone), its fastest candidate tiling there, and stage 4 where the record times it."""
    from ..forward.kernels import VERSIONS

    VERSION = VERSIONS.default("hopper_attention").name

    s4 = [VERSION] * any(r["variant"] == VERSION for r in rows)  # hopper_attention's kernel: timed on Hopper only
    lines = ["| dtype | d | causal | B × N | v6 TFLOP/s | v6 / flash | one call alone: v6 / flash | fastest tiling tried "
             "| its speed / flash |" + "".join(f" {v} TFLOP/s | {v} / flash |" for v in s4) + " SDPA flash |",
             "|---" * (10 + 2 * len(s4)) + "|"]
    for dtype, d, causal, b, n in configs(rows, "dtype", "d", "causal", "batch", "n_q"):
        def get(impl, variant=""):
            return find(rows, impl=impl, variant=variant, dtype=dtype, d=d, causal=causal, batch=b, n_q=n)

        v6 = get("tinyflash", "v6")
        tried = [r for r in rows if r["impl"] == "tinyflash" and r["variant"].startswith("v6 ") and r["status"] == "ok"
                 and (r["dtype"], r["d"], r["causal"], r["batch"], r["n_q"]) == (dtype, d, causal, b, n)]
        best = max(tried, key=lambda r: float(r["vs_baseline"]), default=None)
        name = best["variant"].removeprefix("v6 ").split(" group=")[0] if best else DASH
        hopper = "".join(f"{cell(get('tinyflash', v))} | {cell(get('tinyflash', v), 'vs_baseline', '{:.2f}×')} | " for v in s4)
        lines.append(f"| {dtype} | {d} | {causal} | {b} × {int(n):,} | {cell(v6)} | {cell(v6, 'vs_baseline', '{:.2f}×')} | "
                     f"{cell(v6, 'latency_vs_baseline', '{:.2f}×')} | {name} | {cell(best, 'vs_baseline', '{:.2f}×')} | "
                     f"{hopper}{cell(get('torch_flash'))} |")
    return "\n".join(lines)


def hopper_tiles_table(rows: list[dict]) -> str:
    """v7's tilings (``hopper-tiles``): per (N, d, causal), each tiling's TFLOP/s and its speed over SDPA flash."""
    variants = sorted({r["variant"] for r in rows if r["impl"] == "tinyflash"})
    out = [f"| N | d | causal | {' | '.join(v.removeprefix('v7 ') for v in variants)} | SDPA flash |",
           "|---|---|---|" + "---|" * (len(variants) + 1)]
    for n, d, causal in configs(rows, "n_q", "d", "causal"):
        found = [find(rows, impl="tinyflash", variant=v, n_q=n, d=d, causal=causal) for v in variants]
        cells = [f"{cell(r)} ({cell(r, 'vs_baseline', '{:.2f}×')})" if r else DASH for r in found]
        out.append(f"| {int(n):,} | {d} | {causal} | {' | '.join(cells)} | "
                   f"{cell(find(rows, impl='torch_flash', variant='', n_q=n, d=d, causal=causal))} |")
    return "\n".join(out)


def backward_tensor_core_table(rows: list[dict]) -> str:
    """The tensor-core backward against SDPA's flash backward (``backward-tensor-cores``), per configuration:
    its TFLOP/s and speed over flash's (queued; the middle half of the rounds' ratios; one call alone)."""
    wgmma = [k for k in ("v3", "v4") if any(r["impl"] == "tinyflash" and r["variant"] == k for r in rows)]  # if timed
    lines = ["| dtype | d | causal | B × N | v2 TFLOP/s | v2 / flash | its rounds' middle half | one call alone: "
             "v2 / flash |" + "".join(f" {k} TFLOP/s | {k} / flash |" for k in wgmma) + " SDPA flash |",
             "|---" * (9 + 2 * len(wgmma)) + "|"]
    for dtype, d, causal, b, n in configs(rows, "dtype", "d", "causal", "batch", "n_q"):
        def get(impl, variant=""):
            return find(rows, impl=impl, variant=variant, dtype=dtype, d=d, causal=causal, batch=b, n_q=n)

        v2 = get("tinyflash", "v2")
        later = "".join(f"{cell(get('tinyflash', k))} | {cell(get('tinyflash', k), 'vs_baseline', '{:.2f}×')} | " for k in wgmma)
        lines.append(f"| {dtype} | {d} | {causal} | {b} × {int(n):,} | {cell(v2)} | {against_baseline(v2)} | "
                     f"{later}{cell(get('torch_flash'))} |")
    return "\n".join(lines)


def backward_tile_table(rows: list[dict]) -> str:
    """Backward kernel v2's tilings and dQ atomics (``backward-tensor-core-tiles``): per configuration, each
    variant's speed over SDPA's flash backward in the same run (queued), and flash's TFLOP/s."""
    variants = list(dict.fromkeys(r["variant"] for r in rows if r["impl"] == "tinyflash"))
    short = [v.removeprefix("v2 ").replace(" row_tiles=1", "").replace("pairs=True", "paired atomics")
             .replace("pairs=False", "scalar atomics") for v in variants]
    lines = ["| dtype | d | causal | B × N | " + " | ".join(short) + " | SDPA flash TFLOP/s |",
             "|---" * (5 + len(variants)) + "|"]
    for dtype, d, causal, b, n in configs(rows, "dtype", "d", "causal", "batch", "n_q"):
        def get(impl, variant=""):
            return find(rows, impl=impl, variant=variant, dtype=dtype, d=d, causal=causal, batch=b, n_q=n)

        cells = [cell(get("tinyflash", v), "vs_baseline", "{:.2f}×") for v in variants]
        lines.append(f"| {dtype} | {d} | {causal} | {b} × {int(n):,} | " + " | ".join(cells)
                     + f" | {cell(get('torch_flash'))} |")
    return "\n".join(lines)


def training_step_table(rows: list[dict]) -> str:
    """A training step through tinyflash.torch against SDPA flash's (``training-step``), per configuration: its
    TFLOP/s, speed over flash's, and the memory each holds beyond the inputs at its peak."""
    lines = ["| dtype | d | causal | B × N | tinyflash TFLOP/s | tinyflash / flash | its rounds' middle half | one call "
             "alone: tinyflash / flash | SDPA flash | peak MiB: tinyflash | flash |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for dtype, d, causal, b, n in configs(rows, "dtype", "d", "causal", "batch", "n_q"):
        def get(impl, variant=""):
            return find(rows, impl=impl, variant=variant, dtype=dtype, d=d, causal=causal, batch=b, n_q=n)

        ours, flash = get("tinyflash", "torch"), get("torch_flash")
        mib = [f"{number(r, 'peak_bytes', float('nan')) / 2**20:,.0f}" if r else "–" for r in (ours, flash)]
        lines.append(f"| {dtype} | {d} | {causal} | {b} × {int(n):,} | {cell(ours)} | {against_baseline(ours)} | "
                     f"{cell(flash)} | {mib[0]} | {mib[1]} |")
    return "\n".join(lines)


def decode_call_table(rows: list[dict]) -> str:
    """Decoding as a PyTorch program calls it (``decode-whole-call``): per dtype, batch and cache length, µs per
    call (queued) of SDPA flash and tinyflash called whole, tinyflash's speed over flash's, its prepared run() over
    flash called whole, and the two captured in CUDA graphs."""
    lines = ["| dtype | B | Nk | SDPA flash µs | tinyflash whole call µs | whole / flash | its rounds' middle half | "
             "one call alone | prepared run() / flash | graph: tinyflash / SDPA's graph |",
             "|---|---|---|---|---|---|---|---|---|---|"]

    def us(row) -> str:
        return cell(row, "time_ms", "{:.4f}") if row is None or row["status"] != "ok" else \
            f"{number(row, 'time_ms') * 1e3:,.0f}"

    for dtype, b, n_k in configs(rows, "dtype", "batch", "n_k"):
        def get(impl, variant=""):
            return find(rows, impl=impl, variant=variant, dtype=dtype, batch=b, n_k=n_k)

        whole = get("split_kv", "whole call")
        graphs = [get("torch_flash", "CUDA graph"), get("split_kv", "whole call, CUDA graph")]
        ratio = (f"{number(graphs[0], 'time_ms') / number(graphs[1], 'time_ms'):.2f}×"
                 if all(r and r["status"] == "ok" for r in graphs) else DASH)
        lines.append(f"| {dtype} | {b} | {int(n_k):,} | {us(get('torch_flash'))} | {us(whole)} | "
                     f"{against_baseline(whole)} | {cell(get('split_kv'), 'vs_baseline', '{:.2f}×')} | {ratio} |")
    return "\n".join(lines)


def cold_start_table(rows: list[dict]) -> str:
    """A new process's first call, with the kernel cache empty, filled and off (``benchmarks/cold_start.py``)."""
    def span(values, fmt):
        lo, hi = fmt.format(min(values)), fmt.format(max(values))
        return lo if lo == hi else f"{lo}–{hi}"

    lines = ["| entry point | imports, s | first call, cache empty, s | first call, cache filled, s | first call, "
             "cache off, s | second call, ms | kernels loaded from the cache |", "|---|---|---|---|---|---|---|"]
    for entry in dict.fromkeys(r["entry"] for r in rows):
        mine = [r for r in rows if r["entry"] == entry]
        first = {state: [float(r["first_call_s"]) for r in mine if r["cache"] == state] for state in ("miss", "hit", "off")}
        lines.append(f"| {entry} | {span([float(r['import_s']) for r in mine], '{:.1f}')} | {span(first['miss'], '{:.2f}')} "
                     f"| {span(first['hit'], '{:.2f}')} | {span(first['off'], '{:.2f}')} | "
                     f"{span([float(r['second_call_s']) * 1e3 for r in mine], '{:.2f}')} | "
                     f"{max(int(r['hits']) for r in mine)} |")
    return "\n".join(lines) + f"\n\n(measured {rows[0]['date'][:10]}, {rows[0]['device']}, torch {rows[0]['torch']})"


def accuracy_table(rows: list[dict]) -> str:
    """The tensor-core forward's error seed by seed (``benchmarks/accuracy.py``): per configuration, the largest
    ratio of its error to naive attention's in the same type and to SDPA flash's, and the seeds outside the rule."""
    lines = ["| dtype | d | causal | seeds | largest error / naive's | largest error / SDPA flash's | outside the rule |",
             "|---|---|---|---|---|---|---|"]
    for dtype, d, causal in configs(rows, "dtype", "d", "causal"):
        mine = [r for r in rows if (r["dtype"], r["d"], r["causal"]) == (dtype, d, causal)]
        ratio = lambda other: max(float(r["err_tinyflash"]) / float(r[other]) for r in mine)  # noqa: E731
        lines.append(f"| {dtype} | {d} | {causal} | {len(mine)} | {ratio('err_naive'):.2f}× | "
                     f"{ratio('err_sdpa_flash'):.2f}× | {sum(r['within_rule'] != 'True' for r in mine)} |")
    return "\n".join(lines)


def backward_table(rows: list[dict], n: int = 16384) -> str:
    """The backward pass (``backward``): TFLOP/s (2.5× the forward's FLOPs) per (d, causal) at ``n``, tinyflash
    against SDPA's float32 efficient backward, and naive attention's time over tinyflash's at 4,096 and ``n``."""
    lines = ["| d | causal | tinyflash f32 | SDPA efficient f32 | SDPA flash f16 | naive f32 | tinyflash / efficient | "
             f"naive / tinyflash, N = 4096 | naive / tinyflash, N = {n} |", "|---|---|---|---|---|---|---|---|---|"]
    for d, causal in configs(rows, "d", "causal"):
        def get(impl, dtype="float32", at=n):
            return find(rows, impl=impl, variant="v1" if impl == "tinyflash" else "", dtype=dtype, d=d, causal=causal,
                        n_q=at)

        ours = get("tinyflash")
        lines.append(f"| {d} | {causal} | {cell(ours)} | {cell(get('torch_efficient'))} | "
                     f"{cell(get('torch_flash', 'float16'))} | {cell(get('naive'))} | "
                     f"{speed(ours, get('torch_efficient'))} | {speed(get('tinyflash', at=4096), get('naive', at=4096), '{:.1f}×')} | "
                     f"{speed(ours, get('naive'), '{:.1f}×')} |")
    return "\n".join(lines)


DECODE_COLUMNS = (("split_kv", ""), ("no_split", ""), ("paged", "page_size=16"), ("torch_flash", ""),
                  ("torch_cudnn", ""), ("copy", "device-to-device, K and V"))


def decode_table(rows: list[dict]) -> str:
    """Decoding (``decode``): µs per call of each implementation per (B, Nk), the split count, split-KV's K/V
    read rate, its speed over SDPA flash (per call; and both replayed from CUDA graphs: the kernels alone),
    its rate over a copy's, and the paged kernel's time over the contiguous one's."""
    def us(r):
        return f"{float(r['time_ms']) * 1e3:,.1f}" if r and r["status"] == "ok" else (r["status"] if r else DASH)

    names = " | ".join(impl for impl, _ in DECODE_COLUMNS)
    lines = [f"| B | Nk | splits | {names} | split_kv TB/s | split_kv / SDPA flash | the same, CUDA graphs | "
             "split_kv / copy | paged / split_kv |", "|---" * (len(DECODE_COLUMNS) + 8) + "|"]
    for b, n in configs(rows, "batch", "n_k"):
        def get(impl, variant=""):
            return find(rows, impl=impl, variant=variant, batch=b, n_k=n)

        ours, copy = get("split_kv"), get(*DECODE_COLUMNS[-1])
        share = (f"{number(ours, 'tb_per_s') / number(copy, 'tb_per_s'):.0%}"
                 if ours and copy and ours["status"] == copy["status"] == "ok" else DASH)
        lines.append(f"| {b} | {int(n):,} | {ours['num_splits'] if ours else DASH} | "
                     f"{' | '.join(us(get(i, v)) for i, v in DECODE_COLUMNS)} | {cell(ours, 'tb_per_s', '{:.2f}')} | "
                     f"{speed(ours, get('torch_flash'))} | {speed(get('split_kv', 'CUDA graph'), get('torch_flash', 'CUDA graph'))}"
                     f" | {share} | {speed(ours, get(*DECODE_COLUMNS[2]), '{:.2f}')} |")
    return "\n".join(lines)


BAR_VS_FLASH, BAR_VS_COPY, BAR_PAGED = 0.9, 0.8, 1.1  # decode's bar: of SDPA flash's speed, of a copy's, paged time


def decode_bar_sentence(rows: list[dict]) -> str:
    """Where the decode record stands against its bar: per call at least BAR_VS_FLASH of SDPA flash at every
    shape, BAR_VS_COPY of a copy's rate at the largest, paged within BAR_PAGED of contiguous."""
    def t(impl, variant, b, n):
        r = find(rows, impl=impl, variant=variant, batch=b, n_k=n)
        return float(r["time_ms"]) if r is not None and r["status"] == "ok" else float("nan")

    shapes = configs(rows, "batch", "n_k")
    per_call = [t("torch_flash", "", b, n) / t("split_kv", "", b, n) for b, n in shapes]
    graphs = [t("torch_flash", "CUDA graph", b, n) / t("split_kv", "CUDA graph", b, n) for b, n in shapes]
    paged = [t("paged", "page_size=16", b, n) / t("split_kv", "", b, n) for b, n in shapes]
    largest = shapes[-1]
    copy = (number(find(rows, impl="split_kv", variant="", batch=largest[0], n_k=largest[1]), "tb_per_s")
            / number(find(rows, impl="copy", batch=largest[0], n_k=largest[1]), "tb_per_s"))
    met = min(per_call) >= BAR_VS_FLASH and copy >= BAR_VS_COPY and max(paged) <= BAR_PAGED  # NaN: not met
    return (f"per call, split-KV is at {min(per_call):.2f}× or more of SDPA flash at every shape, reads K and V at "
            f"{copy:.0%} of the copy's rate at B = {largest[0]}, Nk = {int(largest[1]):,}, and the paged kernel takes "
            f"{min(paged):.2f}–{max(paged):.2f}× the contiguous one's time: {'the bar is met' if met else 'the bar is not met'}."
            f" The kernels alone (CUDA graphs) run at {min(graphs):.2f}–{max(graphs):.2f}× of SDPA flash's")


def flex_table(rows: list[dict]) -> str:
    """tinyflash.flex_attention beside FlexAttention compiled and SDPA with the dense mask (``flex``), per variant:
    ms per call (queued) on v6 and on v10 (Hopper; a dash where the record has none), v6's speed over FlexAttention's
    (queued; the rounds' middle half; one call alone), v10's (queued)."""
    lines = ["| variant | FlexAttention ms | v6 ms | v6 / FlexAttention | its rounds' middle half | one call alone | "
             "v10 ms | v10 / FlexAttention | SDPA with the mask ms |", "|---|---|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys(r["variant"] for r in rows if r["impl"] == "torch_flex"):
        flex, ours, v10, masked = (find(rows, impl=impl, variant=variant) for impl, variant in (
            ("torch_flex", name), ("tinyflash", name), ("tinyflash", f"{name} v10"), ("torch_efficient", f"mask {name}")))
        lines.append(f"| {name} | {cell(flex, 'time_ms', '{:.3f}')} | {cell(ours, 'time_ms', '{:.3f}')} | "
                     f"{against_baseline(ours)} | {cell(v10, 'time_ms', '{:.3f}')} | "
                     f"{cell(v10, 'vs_baseline', '{:.2f}×')} | {cell(masked, 'time_ms', '{:.1f}')} |")
    return "\n".join(lines)


TABLES = {"versions": versions_table, "sweep": sweep_table, "example-32k": example_32k_table,
          "tensor-cores": tensor_core_table, "tensor-core-tiles": tiles_table, "backward": backward_table,
          "decode": decode_table, "vector": vector_sentence, "backward-tensor-cores": backward_tensor_core_table,
          "training-step": training_step_table, "decode-whole-call": decode_call_table, "hopper": hopper_table, "hopper-ping-pong": hopper_table,
          "hopper-tiles": hopper_tiles_table, "head-dims": head_dim_table,
          "backward-tensor-core-tiles": backward_tile_table, "training-head-dims": training_step_table,
          "flex": flex_table}


def summary(rows: list[dict]) -> str:
    """The table (or sentence) of a record file, chosen by its rows' benchmark."""
    names = {r["benchmark"] for r in rows}
    if len(names) != 1 or next(iter(names)) not in TABLES:
        raise ValueError(f"no table for the benchmark(s) {sorted(names)}; tables exist for {sorted(TABLES)}")
    return TABLES[names.pop()](rows)
