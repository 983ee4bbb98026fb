"""The README's stage-3 numbers, recomputed from the committed CSVs and logs (as test_readme.py does
for the other stages); ``python tests/test_tensor_core_readme.py`` prints them."""

import re
from pathlib import Path

from tinyflash.measure.bench_tensor_cores import speed_table
from tinyflash.measure.harness import read_csv

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
FLAT = " ".join(README.split())
RESULTS = ROOT / "benchmarks" / "results"
ROWS = read_csv(ROOT / "figures" / "data" / "tensor_cores_h200.csv")
EARLIER_ROWS = read_csv(RESULTS / "tensor_cores_h200_run3.csv")  # the run before, same code, same day
GPU_LOG = (RESULTS / "tensor_core_gpu_tests_h200.log").read_text()  # the last tree's run, the 32k example printed
WITH_PTX_LOG = (RESULTS / "tensor_core_gpu_tests_h200_run4.log").read_text()  # the run before, with the PTX tests
TILES_LOG = (RESULTS / "tensor_core_tiles_h200.log").read_text()
HOST_LOG = (RESULTS / "tensor_core_host_overhead_h200.log").read_text()
TILE_LINE = re.compile(r"N=(\d+) d=(\d+) causal=(\w+)\s+warps=(\d+) row_tiles=(\d) q_in_smem=(\w+)\s+BC=\s*(\d+) "
                       r"cap=\S+\s+lazy=(\w+)\s*:\s+[\d.]+ ms\s+([\d.]+) TFLOP/s\s+([\d.]+)x flash\s+regs=(\d+) "
                       r"local=(\d+) smem=\d+\s+ok")


def v6_ratios(rows) -> dict:
    """(dtype, d, causal, n) -> v6's speed over SDPA flash, for the checked rows of one run."""
    assert all(r["status"] == "ok" for r in rows) and len(rows) == 56  # flash, cuDNN, v6; v5 in float16
    return {(r["dtype"], r["d"], r["causal"], r["n"]): float(r["speed_vs_flash"]) for r in rows
            if r["variant"] == "v6"}


def worst(ratios: dict) -> str:
    (dtype, d, causal, n), ratio = min(ratios.items(), key=lambda kv: kv[1])
    return f"{ratio:.2f}× ({dtype}, d = {d}, {'causal' if causal == 'True' else 'not causal'}, N = {int(n):,})"


def stage3_numbers() -> dict:
    ok = [r for r in ROWS if r["status"] == "ok"]
    ratios, earlier = v6_ratios(ROWS), v6_ratios(EARLIER_ROWS)
    v6 = [r for r in ok if r["variant"] == "v6" and r["n"] == "16384"]
    v5 = {(r["d"], r["causal"]): float(r["tflops"]) for r in ok if r["variant"] == "v5" and r["n"] == "16384"}
    long = sorted(float(r["speed_vs_flash"]) for r in v6)
    vs_v5 = sorted(float(r["tflops"]) / v5[r["d"], r["causal"]] for r in v6 if r["dtype"] == "float16")
    tflops = sorted(float(r["tflops"]) for r in v6)
    short = sorted(x for key, x in ratios.items() if key[3] == "4096")
    out = {"TABLE": speed_table(ROWS),
           "SENTENCE": (f"At N = 16,384 kernel v6 runs at {tflops[0]:.1f} to {tflops[-1]:.1f} TFLOP/s: "
                        f"{long[0]:.2f}× to {long[-1]:.2f}× the speed of SDPA's flash backend in the same run, and "
                        f"{vs_v5[0]:.1f}× to {vs_v5[-1]:.1f}× stage 2's fastest kernel (v5, float16). At N = 4,096 "
                        f"it runs at {short[0]:.2f}× to {short[-1]:.2f}× of flash. "
                        f"{sum(x >= 1.0 for x in ratios.values())} of {len(ratios)} configurations are at 1.0× or "
                        f"more; the slowest is {worst(ratios)}. In the run before it, the same day with the same "
                        f"code (`benchmarks/results/tensor_cores_h200_run3.csv`), "
                        f"{sum(x >= 1.0 for x in earlier.values())} of {len(earlier)} were, the slowest "
                        f"{worst(earlier)}")}
    passed = re.search(r"(\d+) passed", GPU_LOG.strip().splitlines()[-1]).group(1)
    with_ptx = re.search(r"(\d+) passed", WITH_PTX_LOG.strip().splitlines()[-1]).group(1)
    ex = dict(re.findall(r"32k example torch\.(\w+): first call [\d.]+ s, then ([\d.]+ ms \([\d.]+ TFLOP/s\))",
                         GPU_LOG))
    extra = re.search(r"extra memory ([\d.]+) GiB \(o \+ lse: ([\d.]+) GiB\)", GPU_LOG)
    assert extra.group(1) == extra.group(2)
    out["GPU_SENTENCE"] = (f"{passed} tests passed on the H200 with this kernel "
                           f"(`benchmarks/results/tensor_core_gpu_tests_h200.log`; {with_ptx} in the run before, "
                           f"with the PTX instruction tests: `tensor_core_gpu_tests_h200_run4.log`); the 32k-token "
                           f"example (B = 1, H = 32, N = 32,768, d = 128, causal) took {ex['float16']} in float16 and "
                           f"{ex['bfloat16']} in bfloat16, holding {extra.group(1)} GiB beyond its inputs: o and "
                           f"lse, nothing else")
    out["TILES"] = tiles_table()
    out["HOST_SENTENCE"] = host_sentence()
    return out


def tiles_table() -> str:
    """The tiling sweep's log as a table: each (N, d, causal) row, each tiling's speed over flash (kernel alone)."""
    lines = TILE_LINE.findall(TILES_LOG)
    assert len(lines) == TILES_LOG.count(" ok\n") == 24, "a line of the tiling sweep's log that this parser misses"
    columns = sorted({(int(w), q, lazy) for _, _, _, w, _, q, _, lazy, *_ in lines}, reverse=True)
    cells = {((n, d, causal), (int(w), q, lazy)): (float(tf), float(x)) for n, d, causal, w, _, q, _, lazy, tf, x, *_ in
             lines}
    head = " | ".join(f"{w} warps, Q in {'smem' if q == 'True' else 'registers'}, {'lazy' if lazy == 'True' else 'eager'}"
                      for w, q, lazy in columns)
    out = [f"| N | d | causal | {head} |", "|---|---|---|" + "---|" * len(columns)]
    for key in sorted({k for k, _ in cells}, key=lambda k: (int(k[0]), -int(k[1]), k[2])):
        row = [f"{cells[key, c][0]:.1f} ({cells[key, c][1]:.2f}×)" if (key, c) in cells else "–" for c in columns]
        out.append(f"| {int(key[0]):,} | {key[1]} | {key[2]} | {' | '.join(row)} |")
    return "\n".join(out)


def host_sentence() -> str:
    """What the host costs per call: the steps, ours against SDPA's, from the host-overhead log."""
    step = dict((name.strip(), float(us)) for name, us in re.findall(r"^ {4}(\S.*?)\s{2,}([\d.]+)$", HOST_LOG,
                                                                      re.MULTILINE))
    ours, theirs = re.search(r"tensor_core_attention ([\d.]+) us, SDPA flash ([\d.]+) us", HOST_LOG).groups()
    nc = re.search(r"d=128 causal=False\s+tinyflash: call\s+([\d.]+) us, kernel alone\s+([\d.]+) us \(host\s+([\d.]+)\);"
                   r"\s+SDPA flash: call\s+[\d.]+ us \(backend set outside:\s+([\d.]+)\), graph\s+([\d.]+) us", HOST_LOG)
    call, alone, host, flash_call, flash_graph = (float(x) for x in nc.groups())
    launch = [v for k, v in step.items() if k.startswith("cuLaunchKernel")]
    return (f"Timed on the host step by step (N = 16, B·H = 32), a call of tensor_core_attention "
            f"costs {step['the whole call']:.0f} µs of host time: {step['call_key'] + step['plan lookup (dict)']:.1f} "
            f"to find its plan, {step['empty(q, out_shape)'] + step['empty(q, lse_shape, float32)']:.1f} for the two "
            f"allocations, {step['param_values (5 arrays, 5 scalars)'] + step['pack (struct.pack_into)']:.1f} to read "
            f"and pack the arguments, {launch[0]:.1f} for cuLaunchKernel; a loop of such calls, synchronised at "
            f"the end, runs at {ours} µs a call, SDPA flash's at {theirs} µs. At N = 4,096 (d = 128, float16, not "
            f"causal) a call took {call:.1f} µs and "
            f"the kernel launched alone {alone:.1f} µs ({host:.1f} µs of host time seen by the GPU); SDPA flash "
            f"{flash_call:.1f} µs, and {flash_graph:.1f} µs replayed from a CUDA graph")


def test_stage3_table_and_sentences():
    numbers = stage3_numbers()
    m = re.search(r"<!-- tensor-cores:start -->\n(.*?)\n<!-- tensor-cores:end -->", README, re.DOTALL)
    assert m and m.group(1) == numbers["TABLE"]
    m = re.search(r"<!-- tensor-core-tiles:start -->\n(.*?)\n<!-- tensor-core-tiles:end -->", README, re.DOTALL)
    assert m and m.group(1) == numbers["TILES"]
    for name in ("SENTENCE", "GPU_SENTENCE", "HOST_SENTENCE"):
        assert " ".join(numbers[name].split()) in FLAT, (name, numbers[name])


def test_the_default_tilings_are_the_sweeps_fastest():
    """v6.default_tiling picks, for each (N, d, causal) the sweep measured, its fastest tiling."""
    from tinyflash.forward.kernels import v6_tensor_cores as v6

    best = {}
    for n, d, causal, w, rt, q, bc, lazy, tf, *_ in TILE_LINE.findall(TILES_LOG):
        if float(tf) > best.get((n, d, causal), (0.0,))[0]:
            best[n, d, causal] = (float(tf), (int(w), int(rt), q == "True", int(bc), lazy == "True"))
    for (n, d, causal), (_, tiling) in best.items():
        cfg = v6.default_tiling(int(d), causal == "True", int(n))
        assert (cfg.WARPS, cfg.ROW_TILES, cfg.Q_IN_SMEM, cfg.BC, cfg.LAZY_RESCALE) == tiling, (n, d, causal)


if __name__ == "__main__":
    for key, value in stage3_numbers().items():
        print(f"--- {key}\n{value}")
