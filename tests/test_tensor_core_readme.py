"""The README's stage-3 numbers, recomputed from the committed CSV and GPU-test log (as test_readme.py
does for the other stages); ``python tests/test_tensor_core_readme.py`` prints them."""

import re
from pathlib import Path

from tinyflash.measure.bench_tensor_cores import speed_table
from tinyflash.measure.harness import read_csv

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
FLAT = " ".join(README.split())
ROWS = read_csv(ROOT / "figures" / "data" / "tensor_cores_h200.csv")
RESULTS = ROOT / "benchmarks" / "results"
GPU_LOG = (RESULTS / "tensor_core_gpu_tests_h200.log").read_text()
TILES_LOG = (RESULTS / "tensor_core_tiles_h200.log").read_text()
PROTOTYPE_LOG = (RESULTS / "tensor_core_prototype_h200.log").read_text()
HOST_LOG = (RESULTS / "tensor_core_host_overhead_h200.log").read_text()


def stage3_numbers() -> dict:
    ok = [r for r in ROWS if r["status"] == "ok"]
    assert len(ok) == len(ROWS) == 56  # 16 configurations: flash, cuDNN, v6; v5 in float16; all checked
    v6 = [r for r in ok if r["variant"] == "v6" and r["n"] == "16384"]
    v5 = {(r["d"], r["causal"]): float(r["tflops"]) for r in ok if r["variant"] == "v5" and r["n"] == "16384"}
    vs_flash = sorted(float(r["speed_vs_flash"]) for r in v6)
    vs_v5 = sorted(float(r["tflops"]) / v5[r["d"], r["causal"]] for r in v6 if r["dtype"] == "float16")
    tflops = sorted(float(r["tflops"]) for r in v6)
    short = sorted(float(r["speed_vs_flash"]) for r in ok if r["variant"] == "v6" and r["n"] == "4096")
    at_least = sum(x >= 1.0 for x in vs_flash)
    out = {"TABLE": speed_table(ROWS),
           "SENTENCE": (f"At N = 16,384 kernel v6 runs at {tflops[0]:.1f} to {tflops[-1]:.1f} TFLOP/s: "
                        f"{vs_flash[0]:.2f}× to {vs_flash[-1]:.2f}× the speed of SDPA's flash backend in the same "
                        f"run ({at_least} of {len(vs_flash)} configurations at 1.0× or more), and {vs_v5[0]:.1f}× to "
                        f"{vs_v5[-1]:.1f}× stage 2's fastest kernel (v5, float16). At N = 4,096 it runs at "
                        f"{short[0]:.2f}× to {short[-1]:.2f}× of flash")}
    passed = re.search(r"(\d+) passed", GPU_LOG.strip().splitlines()[-1]).group(1)
    ex = dict(re.findall(r"32k example torch\.(\w+): first call [\d.]+ s, then ([\d.]+ ms \([\d.]+ TFLOP/s\))",
                         GPU_LOG))
    extra = re.search(r"extra memory ([\d.]+) GiB \(o \+ lse: ([\d.]+) GiB\)", GPU_LOG)
    assert extra.group(1) == extra.group(2)
    out["GPU_SENTENCE"] = (f"{passed} tests passed on the H200 (`benchmarks/results/tensor_core_gpu_tests_h200.log`); "
                           f"the 32k-token example (B = 1, H = 32, N = 32,768, d = 128, causal) took "
                           f"{ex['float16']} in float16 and {ex['bfloat16']} in bfloat16, holding "
                           f"{extra.group(1)} GiB beyond its inputs: o and lse, nothing else")
    out["SAME_RUN_SENTENCE"] = same_run_sentence()
    return out


def same_run_sentence() -> str:
    """The tiling sweep's best v6, the prototype's best (its own, earlier run), and the host's share of a call."""
    tiles = re.findall(r"N=16384 d=(\d+) causal=(\w+)\s+warps=(\d+)(?: row_tiles=(\d))?(?: q_in_smem=(\w+)\s*)? "
                       r"BC=\s*(\d+) cap=\S+\s*:\s+[\d.]+ ms\s+([\d.]+) TFLOP/s\s+regs=\d+ local=(\d+)",
                       TILES_LOG)  # row_tiles: since ROW_TILES; q_in_smem: since Q_IN_SMEM
    assert len(tiles) == TILES_LOG.count("N=16384 d="), "a line of the tiling sweep's log that this parser misses"
    best = {}
    for d, causal, warps, row_tiles, q_smem, keys, tflops, local in tiles:
        if float(tflops) > best.get((d, causal), (0.0,))[0]:
            rows = f" of {16 * int(row_tiles)} rows" if row_tiles not in ("", "1") else ""
            q_where = ", Q_i in shared memory" if q_smem == "True" else ""
            spilled = f", {local} bytes of registers spilled" if local != "0" else ""
            best[d, causal] = (float(tflops), f"{warps} warps{rows} × {keys} keys{q_where}{spilled}")
    proto = {(name, causal): float(tf) for name, causal, tf in
             re.findall(r"^\s+(tc2_\S+)\s+causal=(\d) f16=1 N= 16384:\s+[\d.]+ ms\s+([\d.]+) TFLOP/s", PROTOTYPE_LOG, re.MULTILINE)}
    whole, bare, host_us = re.search(r"tensor_core_attention: ([\d.]+) ms median;\s+the compiled kernel launched alone: "
                                     r"([\d.]+) ms;\s+difference (\d+) us", HOST_LOG).groups()
    v6 = {d: f"{best[d, 'False'][0]:.1f} / {best[d, 'True'][0]:.1f} TFLOP/s ({best[d, 'False'][1]})" for d in ("128", "64")}
    return (f"In the last tiling sweep (float16, N = 16,384, not causal / causal) the best v6 tilings reached "
            f"{v6['128']} at d = 128 and {v6['64']} at d = 64; in the earlier run that compared the two, the prototype reached "
            f"{proto['tc2_d128_w8c64_qf', '0']:.1f} / {proto['tc2_d128_w8c64_qf', '1']:.1f} (8 warps × 64 keys) and "
            f"{proto['tc2_d64_w4c32_qf', '0']:.1f} / {proto['tc2_d64_w4c32_qf', '1']:.1f} (4 warps × 32 keys). At "
            f"N = 4,096 (d = 128, float16, not causal) one call of tensor_core_attention took {whole} ms and the "
            f"compiled kernel launched alone {bare} ms: {host_us} µs of each call are the host's")


def test_stage3_table_and_sentences():
    numbers = stage3_numbers()
    m = re.search(r"<!-- tensor-cores:start -->\n(.*?)\n<!-- tensor-cores:end -->", README, re.DOTALL)
    assert m and m.group(1) == numbers["TABLE"]
    for name in ("SENTENCE", "GPU_SENTENCE", "SAME_RUN_SENTENCE"):
        assert " ".join(numbers[name].split()) in FLAT, (name, numbers[name])


if __name__ == "__main__":
    for key, value in stage3_numbers().items():
        print(f"--- {key}\n{value}")
