"""The numbers of the README and of docs/*.md, computed from the record and the models, written between markers.

A generated block sits between ``<!-- name:start -->`` and ``<!-- name:end -->``; :data:`BLOCKS` says
how each is made. ``python -m tinyflash.bench --docs`` rewrites every block of README.md and docs/*.md
from the committed CSVs (``figures/data/``) and the cost models; ``tests/test_docs.py`` checks that the
files hold exactly what it would write, and that no number stands outside a block but the few that
name things (stages, lessons, head dims, sequence lengths). The dated notes (``docs/notes/``) are a
record of their day and are not generated. The lessons' running times are written the same way
(``lesson_times.py``). The tables come from ``tables.py`` and ``sweep_tables.py``, the
sentences of the cost models from ``model_sentences.py``; the README's and results.md's other sentences are here.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..backward.kernels import VERSIONS as BACKWARD
from ..forward.kernels import VERSIONS as FORWARD
from . import cells, fp8_accuracy, model_sentences, sweep_tables, tables
from .record import data_dir, number, read_csv, repository
from .suites import BENCHMARKS

HOPPER = (9, 0)
HOPPER_VERSION = FORWARD.default("hopper_attention").name  # what stage 4 runs
BACKWARD_HOPPER_VERSION = BACKWARD.default("tensor_core_attention_backward", capability=HOPPER).name  # on Hopper

MARKER = re.compile(r"<!-- ([\w-]+):start -->\n(.*?)<!-- \1:end -->", re.S)  # a block, empty or not


def record(stem: str) -> list[dict]:
    """The rows of figures/data/<stem>.csv."""
    return read_csv(data_dir() / f"{stem}.csv")


def span(values, fmt: str = "{:.2f}", unit: str = "×") -> str:
    """'0.93×–1.21×' style range of ``values`` (one value: just it)."""
    lo, hi = min(values), max(values)
    return f"{fmt.format(lo)}{unit}" if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}–{fmt.format(hi)}{unit}"


# --- README -----------------------------------------------------------------------------------------------


def quickstart_costs() -> str:
    """What the README's commands cost on a CPU, from the last timed run of each (figures/data/cpu_runs.csv): the
    lessons, then each test command, the quickest first."""
    rows = record("cpu_runs")
    lessons = next(r for r in rows if r["command"] == "python lessons/run_all.py")
    tests = sorted((r for r in rows if "pytest" in r["command"]), key=lambda r: float(r["seconds"]))

    def took(seconds: str) -> str:
        return f"{float(seconds):.0f} seconds" if float(seconds) < 90 else f"{float(seconds) / 60:.0f} minutes"

    def counted(row: dict) -> str:
        found = [f"{int(row.get(what) or 0):,} {what}" for what in ("passed", "failed", "skipped", "left_out")]
        return ", ".join(f for f in found if not f.startswith("0 ")).replace("left_out", "of the grid left out")

    return (f"On {tests[0]['cpus']} CPU cores ({tests[0]['machine']}, {tests[0]['date'][:10]}) the lessons took "
            f"{took(lessons['seconds'])}" + ("" if lessons["exit_code"] == "0" else " and failed") + "; "
            + "; ".join(f"`{r['command']}` {took(r['seconds'])} ({counted(r)}" + (")" if r["exit_code"] == "0" else
                        ", and it failed)") for r in tests)
            + ". The skipped tests need a GPU.")


def headlines() -> str:
    """The README's few headline numbers, each from its record."""
    versions = ok(record("kernel_versions_h200"), dtype="float32", causal="False", variant="v5")
    tc = [r for r in ok(record("tensor_cores_h200"), variant="v6")]
    queued, alone = [float(r["vs_baseline"]) for r in tc], [float(r["latency_vs_baseline"]) for r in tc]
    backward = record("backward_h200")
    bw_eff = [float(cells.find(backward, impl="torch_efficient", dtype="float32", d=r["d"], causal=r["causal"],
                                n_q=r["n_q"])["time_ms"]) / float(r["time_ms"])
              for r in ok(backward, impl="tinyflash", variant="v1", n_q="16384")]
    # the newest run that timed the kernel hopper_attention runs: step 4's, else the ladder's
    hopper = next(rows for rows in map(record, ("hopper_ping_pong_h200", "hopper_h200"))
                  if ok(rows, impl="tinyflash", variant=HOPPER_VERSION))
    runs = ok(hopper, impl="tinyflash", variant=HOPPER_VERSION)
    cudnn = [float(cells.find(hopper, impl="torch_cudnn", **{k: r[k] for k in ("dtype", "d", "causal", "n_q")})
                   ["time_ms"]) / float(r["time_ms"]) for r in runs]
    tc_bw, wg_bw = ([float(r["vs_baseline"]) for r in ok(record("backward_tensor_cores_h200"), impl="tinyflash",
                                                         variant=kernel)] for kernel in ("v2", BACKWARD_HOPPER_VERSION))
    decode = record("decode_h200")
    per_call = [float(r["vs_baseline"]) for r in ok(decode, impl="split_kv", variant="")]
    whole = [float(r["vs_baseline"]) for r in ok(record("decode_whole_call_h200"), impl="split_kv", variant="whole call")]
    step = [float(r["vs_baseline"]) for r in ok(record("training_step_h200"), impl="tinyflash", variant="torch")]
    return "\n".join([
        f"* **Stage 2** (CUDA cores, v5): {span([float(r['tflops']) for r in versions], '{:.1f}', ' TFLOP/s')} in "
        "float32 at N = 16,384 on an H200, each of its five versions faster than the one before.",
        f"* **Stage 3** (tensor cores, v6): {span(queued)} the speed of FlashAttention-2 (PyTorch SDPA's flash "
        f"backend) in all {len(tc)} configurations measured, calls queued back to back; one call alone, "
        f"{span(alone)}.",
        f"* **Stage 4** (Hopper's wgmma, TMA, warp specialisation and ping-pong, {HOPPER_VERSION}): "
        f"{span([float(r['vs_baseline']) for r in runs])} the speed of FlashAttention-2 and {span(cudnn)} that of "
        f"SDPA's cuDNN backend, {' and '.join(sorted({r['dtype'] for r in runs}))} at N = "
        f"{' and '.join(f'{n:,}' for n in sorted({int(r['n_q']) for r in runs}))} ({len(runs)} configurations, calls "
        f"queued; one call alone, {span([float(r['latency_vs_baseline']) for r in runs])} FlashAttention-2's speed).",
        f"* **Training** (the backward pass): on Hopper's wgmma (backward {BACKWARD_HOPPER_VERSION}) {span(wg_bw)} the speed of "
        f"FlashAttention-2's backward (SDPA flash), on mma.sync (v2) {span(tc_bw)}, float16 and bfloat16, calls "
        f"queued; a whole training step through `tinyflash.torch` (stage 4's forward, backward "
        f"{BACKWARD_HOPPER_VERSION}) {span(step)}; "
        f"on the CUDA cores {span(bw_eff)} of SDPA's "
        f"float32 efficient backward. A small GPT trains with it as with SDPA (docs/results.md).",
        f"* **Decoding** (split-KV, grouped-query heads): {span(per_call)} SDPA flash's speed per prepared call; "
        f"called whole from PyTorch, {span(whole)} SDPA flash called whole.",
    ])


def ok(rows, **where):
    return cells.ok_rows(rows, **where)


# --- docs/results.md --------------------------------------------------------------------------------------


def vector_block() -> str:
    rows = record("vector_loads_h200")
    return (f"Reading a full tile 4 elements per thread and load instead of 1 ({rows[0]['date'][:10]}): "
            f"{tables.vector_sentence(rows)}, so only float16 reads 4 at a time.")


def sweep_block() -> str:
    return tables.sweep_table(record("bench_h200"), 16384)


def sweep_sentences() -> str:
    """What the sweep's table says, in numbers: stage 2 against SDPA's efficient backend, its range, naive."""
    rows = record("bench_h200")
    at = {}
    for r in ok(rows, impl="tinyflash", variant="v5", n_q="16384"):
        eff = cells.find(rows, impl="torch_efficient", dtype=r["dtype"], d=r["d"], causal=r["causal"], n_q="16384")
        at[r["dtype"], r["d"], r["causal"]] = (float(r["tflops"]), float(eff["time_ms"]) / float(r["time_ms"]))
    f32 = {d: [x[1] for k, x in at.items() if k[0] == "float32" and k[1] == d] for d in ("64", "128")}
    beats = all(float(r["time_ms"]) < float(x["time_ms"])
                for r in ok(rows, impl="tinyflash", variant="v5") if int(r["n_q"]) >= 4096
                for x in ok(rows, impl="naive", dtype=r["dtype"], d=r["d"], causal=r["causal"], n_q=r["n_q"]))
    oom = sorted({int(r["n_q"]) for r in rows if r["impl"] == "naive" and r["status"] == "oom" and r["dtype"] == "float32"})
    dates = {r["dtype"]: r["date"][:10] for r in rows}
    return (f"At N = 16,384 stage 2 runs at {span([x[0] for x in at.values()], '{:.1f}', ' TFLOP/s')}. In float32 it "
            f"is {span(f32['64'])} the speed of SDPA's memory-efficient backend at d = 64 and {span(f32['128'])} at "
            "d = 128; that backend runs float32 on the tensor cores (three TF32 products per float32 product), while "
            "stage 2 does float32 arithmetic on the CUDA cores. "
            + ("From N = 4,096 up stage 2 is faster than naive attention wherever that ran at all"
               if beats else "Stage 2 is not faster than naive attention at every N from 4,096 up")
            + (f"; naive float32 attention ran out of memory from N = {oom[0]:,}. " if oom else ". ")
            + (f"All rows were measured on {dates['float16']}." if dates["float16"] == dates["float32"] else
               f"The float16 rows were measured on {dates['float16']}, the float32 rows on {dates['float32']}.")
            + " " + stage3_runs(rows))


def stage3_runs(sweep_rows) -> str:
    """Why the sweep's stage-3 column and stage 3's own table may disagree: two runs, two methods."""
    v6 = ok(sweep_rows, impl="tinyflash", variant="v6")
    own = ok(record("tensor_cores_h200"), variant="v6")
    return (f"The table's stage-3 column comes from this sweep's run ({v6[0]['timing']}, {v6[0]['date'][:10]}); stage 3's own "
            f"benchmark (below; {own[0]['timing']}, {own[0]['date'][:10]}) times it against flash with settled peers "
            f"and is the one to read: there {sum(float(r['vs_baseline']) >= 1 for r in own)} of {len(own)} "
            "configurations are at 1.0× or more.")


def tensor_core_sentence() -> str:
    rows = record("tensor_cores_h200")
    v6 = ok(rows, variant="v6")
    long = [r for r in v6 if r["n_q"] == "16384"]
    queued = {(r["dtype"], r["d"], r["causal"], r["n_q"]): float(r["vs_baseline"]) for r in v6}
    q1 = [float(r["vs_baseline_q1"]) for r in v6]
    alone = [r for r in v6 if float(r["latency_vs_baseline"]) < 1.0]
    over_v5 = [float(r["tflops"]) / float(cells.find(rows, variant="v5", dtype=r["dtype"], d=r["d"], causal=r["causal"],
                                                      n_q=r["n_q"])["tflops"])
               for r in long if r["dtype"] == "float16"]
    slowest = min(queued, key=queued.get)
    alone_at = ", ".join(f"{n:,}" for n in sorted({int(r["n_q"]) for r in alone}))
    return (f"At N = 16,384 v6 runs at {span([float(r['tflops']) for r in long], '{:.1f}', ' TFLOP/s')}: "
            f"{span([float(r['vs_baseline']) for r in long])} the speed of SDPA's flash backend in the same run, and "
            f"{span(over_v5, '{:.1f}')} stage 2's v5 in float16. At N = 4,096: "
            f"{span([x for k, x in queued.items() if k[3] == '4096'])}. {sum(x >= 1 for x in queued.values())} of "
            f"{len(queued)} configurations are at 1.0× or more, the slowest {queued[slowest]:.2f}× ({slowest[0]}, "
            f"d = {slowest[1]}, {'causal' if slowest[2] == 'True' else 'not causal'}, N = {int(slowest[3]):,}); the "
            f"middle half of every configuration's rounds is at {min(q1):.2f}× or more. One call alone, the GPU idle "
            f"before it, v6 is slower than flash in {len(alone)} configurations, all at N = "
            f"{alone_at}: the host's work before a launch shows there "
            f"(measured {rows[0]['date'][:10]}).")


def groups_block() -> str:
    return sweep_tables.groups_table(record("tensor_core_tiles_h200"))


def backward_longest() -> str:
    rows = record("backward_h200")
    n = max(int(r["n_q"]) for r in rows)
    at = {r["impl"]: r for r in rows if int(r["n_q"]) == n}
    ours, eff, naive = at["tinyflash"], at["torch_efficient"], at["naive"]
    return (f"At N = {n:,} (d = {ours['d']}, not causal) naive attention's backward "
            f"{'ran out of memory' if naive['status'] == 'oom' else naive['status']}, while tinyflash's ran at "
            f"{float(ours['tflops']):.1f} TFLOP/s (SDPA efficient {float(eff['tflops']):.1f}) with a peak of "
            f"{number(ours, 'peak_bytes') / 2**20:,.0f} MiB of device memory.")


def decode_bar() -> str:
    bar = (f"The bar set for the split kernel: per call, at least {tables.BAR_VS_FLASH:.1f}× SDPA flash's speed at "
           f"every shape, {tables.BAR_VS_COPY:.0%} of a copy's rate at the largest, and the paged cache within "
           f"{tables.BAR_PAGED - 1:.0%} of the contiguous one. Measured: ")
    return bar + tables.decode_bar_sentence(record("decode_h200")) + "."


def ptxas_block() -> str:
    """Registers and spills of the default kernels, from ptxas (no GPU needed: benchmarks/ptxas_report.py)."""
    rows = record("ptxas_sm90")
    lines = ["| kernel | variant | registers | spilled: stored, loaded (bytes) | PTX instructions | SASS instructions |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['kernel']} | {r['variant']} | {r['registers']} | {r['spill_stores']}, {r['spill_loads']} | "
              f"{r['ptx_instructions']} | {r['sass_instructions'] or '–'} |" for r in rows]
    return "\n".join(lines) + (f"\n\n({rows[0]['ptxas'].split(', ')[-1]} of ptxas, numba-cuda {rows[0]['numba_cuda']}, "
                               f"{rows[0]['date'][:10]})")


def gpu_tests() -> str:
    """The GPU test runs (benchmarks/gpu_tests.py) on each GPU of the record, one line per run, newest last."""
    lines = []
    for path in sorted(data_dir().glob("gpu_tests_*.csv")):
        runs = {}
        for r in record(path.stem):
            runs.setdefault((r["device"], r["date"], r["commit"]), []).append(r)
        for (device, date, commit), rows in runs.items():
            total = {key: sum(int(r[key]) for r in rows) for key in ("tests", "passed", "failed", "skipped", "errors")}
            failing = [f"{r['file']} ({r['failed']})" for r in rows if int(r["failed"]) or int(r["errors"])]
            lines.append(f"{date}* {device}, {date} (commit {commit}), {len(rows)} rows of test files: {total['tests']:,} "
                         f"tests, {total['passed']:,} passed, {total['skipped']} skipped, {total['failed']} failed"
                         + (f" ({', '.join(failing)})" if failing else "")
                         + (f", {total['errors']} errors" if total["errors"] else "") + ".")
    return ("The GPU test runs (`figures/data/gpu_tests_<gpu>.csv`, one row per file and process of a run; the dated "
            "notes say what failed and what was fixed):\n\n" + "\n".join(line[line.index("*"):] for line in
                                                                  sorted(lines)))  # newest last


def table(stem: str):
    """A block maker: the table of figures/data/<stem>.csv, chosen by its benchmark (``tables.summary``)."""
    return lambda: tables.summary(record(stem))


def backward_tensor_cores_sentence() -> str:
    """The tensor-core backward's speed over SDPA flash's, kernel by kernel (v2 off Hopper, v3 and v4 on it), and the
    bar."""
    rows = record("backward_tensor_cores_h200")
    said = []
    for kernel, where in (("v2", "mma.sync, every GPU from compute capability 8.0"), ("v3", "wgmma"),
                          ("v4", "wgmma, warp-specialised")):
        where += ", Hopper's default" if kernel == BACKWARD_HOPPER_VERSION else ""
        runs = ok(rows, impl="tinyflash", variant=kernel)
        if runs:
            said.append(f"{kernel} ({where}) runs at {span([float(r['tflops']) for r in runs], '{:.1f}', ' TFLOP/s')}, "
                        f"{span([float(r['vs_baseline']) for r in runs])} the speed of SDPA's flash backward "
                        f"(FlashAttention-2) in the same run, calls queued; one call alone "
                        f"{span([float(r['latency_vs_baseline']) for r in runs])}")
    best = min(max(float(r["vs_baseline"]) for r in rows if r["impl"] == "tinyflash" and r["status"] == "ok"
                   and r["variant"] in ("v2", "v3", "v4") and all(r[c] == x[c] for c in ("dtype", "d", "causal", "n_q")))
               for x in ok(rows, impl="tinyflash", variant="v2"))
    return (f"The tensor-core backward: {'; '.join(said)} ({len(ok(rows, impl='tinyflash', variant='v2'))} "
            f"configurations, measured {rows[0]['date'][:10]}). The bar set for it, 1.0× in every configuration, is "
            f"{'met' if best >= 1 else 'not met'}.")


def deterministic_sentence() -> str:
    """What deterministic mode costs: its time over the atomic kernel's, per configuration of the same run."""
    rows = record("backward_tensor_cores_h200")
    cost, causal_cost = [], []
    for r in ok(rows, impl="tinyflash", variant="v2 deterministic"):
        same = {k: r[k] for k in ("dtype", "d", "causal", "batch", "n_q")}
        base = cells.find(rows, impl="tinyflash", variant="v2", **same)
        (causal_cost if r["causal"] == "True" else cost).append(float(r["time_ms"]) / float(base["time_ms"]))
    return (f"In deterministic mode (`deterministic=True`) the key tiles add to each query tile's dQ in turn, key "
            f"tile 0 first, counted by one integer per query tile and head, so dq is the same, bit for bit, at every "
            f"run. The waiting costs {span(cost)} the time of the atomic kernel without the causal mask and "
            f"{span(causal_cost)} with it, where a key tile's first query tile comes late in the work of the key tiles "
            f"before it, which must all add to it first (same run as the table above).")


def training_step_sentence() -> str:
    rows = record("training_step_h200")
    ours = ok(rows, impl="tinyflash", variant="torch")
    mem = []
    for r in ours:
        same = {k: r[k] for k in ("dtype", "d", "causal", "batch", "n_q")}
        mem.append(number(r, "peak_bytes") / number(cells.find(rows, impl="torch_flash", **same), "peak_bytes"))
    met = min(float(r["vs_baseline"]) for r in ours) >= 1
    return (f"A training step through `tinyflash.torch.attention` runs at {span([float(r['vs_baseline']) for r in ours])} "
            f"the speed of SDPA flash's, calls queued, with {span(mem, '{:.2f}')} of its peak memory ({len(ours)} "
            f"configurations, measured {ours[0]['date'][:10]}): the bar, at least 1.0× with no more memory, is "
            f"{'met' if met else 'met for memory, not for speed'}.")


def gpt_training() -> str:
    from .training_run import sentence

    return sentence(record("gpt_training_h200"))


def decode_call_bar() -> str:
    rows = record("decode_whole_call_h200")
    whole = [float(r["vs_baseline"]) for r in ok(rows, impl="split_kv", variant="whole call")]
    prepared = [float(r["vs_baseline"]) for r in ok(rows, impl="split_kv", variant="")]
    graphs = []
    for r in ok(rows, impl="split_kv", variant="whole call, CUDA graph"):
        same = {k: r[k] for k in ("dtype", "batch", "n_k")}
        graphs.append(float(cells.find(rows, impl="torch_flash", variant="CUDA graph", **same)["time_ms"])
                      / float(r["time_ms"]))
    graphs_vs_flash = [float(r["vs_baseline"]) for r in ok(rows, impl="split_kv", variant="whole call, CUDA graph")]
    short = [float(r["vs_baseline"]) for r in ok(rows, impl="split_kv", variant="whole call")
             if r["batch"] == "1" or r["n_k"] == "4096"]
    verdict = ("met" if min(whole) >= 0.9 and min(prepared + graphs_vs_flash) >= 1 else
               "met called whole, not prepared or in a graph" if min(whole) >= 0.9 else "not met")
    return (f"Called whole, tinyflash's decode runs at {span(whole)} SDPA flash called whole ({len(whole)} "
            f"configurations, float16 and bfloat16, measured {rows[0]['date'][:10]}); {span(short)} where the kernels "
            f"are short (one sequence, or 4,096 keys) and a call's Python (a plan looked up, three allocations, two "
            f"launches) is most of its time. Prepared once (a decode loop's `run()`), {span(prepared)}; in CUDA "
            f"graphs, {span(graphs_vs_flash)} SDPA flash called whole and {span(graphs)} SDPA's own graph. The bar, "
            f"0.9× SDPA flash called whole and 1.0× of it prepared and in a graph at every shape, is {verdict}.")


def accuracy_block() -> str:
    rows = record("accuracy_h200")
    within = sum(r["within_rule"] == "True" for r in rows)
    worst = max(float(r["err_tinyflash"]) / float(r["err_naive"]) for r in rows)
    return (tables.accuracy_table(rows) + f"\n\n{within} of {len(rows)} inputs within the rule; the largest error "
            f"{worst:.2f}× naive attention's (N = {int(rows[0]['n']):,}, B = 1, H = {rows[0]['heads']}; measured "
            f"{rows[0]['date'][:10]}, {rows[0]['device']}, torch {rows[0]['torch']}).")


def fp8_accuracy_block() -> str:
    rows = record("fp8_accuracy")
    return fp8_accuracy.table(rows) + "\n\n" + fp8_accuracy.sentence(rows)


def cold_start_block() -> str:
    return tables.cold_start_table(record("cold_start_h200"))


# --- docs/measuring.md, docs/reproducing.md ---------------------------------------------------------------


def timing_constants() -> str:
    from ..core.tolerance import F32_TOL
    from . import checking, timing

    return (f"Each peer is called {timing.WARMUP} times untimed, then, in each of {timing.ROUNDS} rounds (a benchmark "
            f"may ask for fewer), runs {timing.SETTLE_MS:.0f} ms of its own calls untimed, one call alone, and a burst of "
            f"queued calls lasting about {timing.BURST_MS:.0f} ms ({timing.MIN_BURST} to {timing.MAX_BURST} calls). "
            f"A check samples {checking.CHECK_ROWS} query rows of the first and of the last head; float32 results "
            f"must be within {F32_TOL:g} of the float64 reference (gradients {checking.F32_GRAD_TOL:g}), 16-bit ones "
            f"within 2× (gradients {checking.GRAD_FACTOR:g}×) the error of the naive computation in their type.")


def benchmark_commands() -> str:
    lines = ["```bash"]
    for bench in BENCHMARKS.values():
        records = [f"{bench.csv_stem}_{gpu}.csv" for gpu in ("h200", "h100")]  # the record of the GPU it ran on
        kept = next((name for name in records if (data_dir() / name).exists()), None)
        csv = kept or records[0]  # a benchmark without a committed record writes beside it
        lines.append(f"python -m tinyflash.bench {bench.name} --csv {'figures/data/' if kept else ''}{csv}"
                     f"  # {bench.doc}{'' if kept else ' (no committed record yet)'}")
    return "\n".join(lines + ["```"])


BLOCKS = {
    "quickstart-costs": quickstart_costs, "headlines": headlines,
    "versions": table("kernel_versions_h200"), "vector": vector_block, "sweep": sweep_block, "sweep-sentences": sweep_sentences,
    "example-32k": table("example_32k_h200"), "tensor-cores": table("tensor_cores_h200"), "tensor-cores-sentence": tensor_core_sentence,
    "tensor-core-tiles": table("tensor_core_tiles_h200"), "tensor-core-groups": groups_block, "backward": table("backward_h200"),
    "backward-longest": backward_longest,
    "backward-tensor-cores": table("backward_tensor_cores_h200"), "backward-tensor-cores-sentence": backward_tensor_cores_sentence,
    "backward-tensor-core-tiles": table("backward_tensor_core_tiles_h200"),
    "hopper": table("hopper_h200"), "hopper-ping-pong": table("hopper_ping_pong_h200"), "head-dims": table("head_dims_h200"), "decode": table("decode_h200"), "decode-bar": decode_bar, "ptxas": ptxas_block,
    "deterministic": deterministic_sentence, "training-step": table("training_step_h200"),
    "training-step-sentence": training_step_sentence, "gpt-training": gpt_training, "decode-whole-call": table("decode_whole_call_h200"),
    "decode-whole-call-bar": decode_call_bar, "cold-start": cold_start_block, "accuracy": accuracy_block,
    "fp8-accuracy": fp8_accuracy_block, "flex": table("flex_h100"), "training-head-dims": table("training_head_dims_h100"),
    "gpu-tests": gpu_tests, "timing-constants": timing_constants, "benchmark-commands": benchmark_commands,
    "memory-fit": model_sentences.memory_fit, "traffic": model_sentences.traffic, "cpu-memory": model_sentences.cpu_memory,
    "training-memory": model_sentences.training_memory, "kv-cache": model_sentences.kv_cache,
}


def doc_files() -> list[Path]:
    """README.md and docs/*.md (not the dated notes)."""
    root = repository()
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def render(text: str, made: dict) -> str:
    """``text`` with every block replaced by what ``made`` holds for it (a block without a maker: a KeyError)."""
    return MARKER.sub(lambda m: f"<!-- {m.group(1)}:start -->\n{made[m.group(1)]}\n<!-- {m.group(1)}:end -->", text)


def blocks_in(text: str) -> dict:
    """name -> the text of each block in ``text`` (without the newline before its end marker)."""
    return {m.group(1): m.group(2).removesuffix("\n") for m in MARKER.finditer(text)}


def write_docs() -> list[Path]:
    """Rewrite the blocks of README.md and docs/*.md, and the lessons' running times (``lesson_times``), from the
    record; returns the files that changed."""
    from .lesson_times import write_lessons

    made = {name: maker() for name, maker in BLOCKS.items()}
    changed = []
    for path in doc_files():
        text = path.read_text()
        new = render(text, made)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed + write_lessons()
