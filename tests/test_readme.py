"""Every number in the README is computed by code in the repository; these tests recompute them."""

import re
from pathlib import Path

from tinyflash import bench
from tinyflash.memory import CONSUMER_GPU_BYTES, GiB, H200_MEMORY_BYTES, MiB, attention_memory, max_sequence_length
from tinyflash.traffic import HOPPER_SRAM_ELEMENTS, SRAM_ELEMENTS, traffic_ratio

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BENCH = bench.read_csv(ROOT / "figures" / "data" / "bench_h200.csv")


def block(name: str) -> str:
    m = re.search(rf"<!-- {name}:start -->\n(.*?)\n<!-- {name}:end -->", README, re.S)
    assert m, f"README has no {name} block"
    return m.group(1)


def test_benchmark_table_is_generated_from_the_csv():
    assert block("bench-summary") == bench.summary_table(BENCH, 16384)


def test_seed_example_table_is_generated_from_its_csv():
    row = bench.read_csv(ROOT / "figures" / "data" / "seed_example_h200.csv")[0]
    assert block("seed-example") == bench.seed_example_table(row)
    # and the claim next to it: memory held is close to q, k, v, o and lse alone (~1 GiB)
    assert int(row["total_peak_bytes"]) <= 1.05 * int(row["model_qkvo_lse_bytes"])
    assert int(row["model_fp16_scores_bytes"]) == 64 * GiB


def test_memory_numbers():
    assert max_sequence_length(CONSUMER_GPU_BYTES, heads=32, dtype="float16") == 14_188
    assert max_sequence_length(H200_MEMORY_BYTES, heads=32, dtype="float16") == 33_189
    assert "N = 14,188" in README and "N = 33,189" in README
    m = attention_memory(32_768, 128, heads=32, dtype="float16")
    assert m.scores == 64 * GiB and attention_memory(32_768, 128).q == 8 * MiB


def test_traffic_numbers():
    assert SRAM_ELEMENTS == 16_384 and HOPPER_SRAM_ELEMENTS == 116_736
    assert f"{traffic_ratio(131_072, 64, SRAM_ELEMENTS):.1f}×" == "2.0×" and "moves 2.0× the bytes" in README
    assert f"{traffic_ratio(131_072, 64, HOPPER_SRAM_ELEMENTS):.1f}×" == "14.2×" and "and 14.2× with" in README


def _ok(impl, **key):
    return [r for r in BENCH if r["impl"] == impl and r["status"] == "ok"
            and all(r[k] == str(v) for k, v in key.items())]


def test_the_claims_about_speed():
    # "matches PyTorch's memory-efficient backend at d = 64 and reaches about 0.8x of it at d = 128"
    for d, low, high in (("64", 0.95, 1.25), ("128", 0.7, 0.9)):
        for causal in ("False", "True"):
            ours = _ok("tinyflash", dtype="float32", d=d, causal=causal, n=16384)[0]
            theirs = _ok("torch_efficient", dtype="float32", d=d, causal=causal, n=16384)[0]
            assert low <= float(theirs["time_ms"]) / float(ours["time_ms"]) <= high
    # "does not reach the 40 TFLOP/s this project aims for"
    assert max(float(r["tflops"]) for r in _ok("tinyflash")) < 40
    # "faster [than naive CuPy] from N = 4,096 up in every configuration measured"
    for r in _ok("tinyflash"):
        if int(r["n"]) >= 4096:
            for x in _ok("cupy_naive", dtype=r["dtype"], d=r["d"], causal=r["causal"], n=r["n"]):
                assert float(r["time_ms"]) < float(x["time_ms"])
    # "at N = 32,768 naive float32 attention does not fit at all"
    assert all(r["status"] == "oom" for r in BENCH if r["impl"] == "cupy_naive" and r["n"] == "32768"
               and r["dtype"] == "float32")


def test_ci_runs_the_readme_test_command():
    """.ci/run installs from requirements.txt and ends with exactly the README's test command."""
    ci_lines = [x.strip() for x in (ROOT / ".ci" / "run").read_text().splitlines() if x.strip()]
    assert "pip install -r requirements.txt" in README and any("-r requirements.txt" in x for x in ci_lines)
    assert "```bash\npython -m pytest\n```" in README and ci_lines[-1] == "python -m pytest"
    assert "python lessons/run_all.py" in README


def test_kernel_versions_sentence():
    rows = {(r["kernel"], r["d"]): float(r["tflops"])
            for r in bench.read_csv(ROOT / "figures" / "data" / "kernel_versions_h200.csv")}
    expected = (f"the simple kernel runs at {rows['simple', '64']:.1f} TFLOP/s for d = 64 and {rows['simple', '128']:.1f} "
                f"for d = 128")
    assert expected in " ".join(README.split())
    assert f"the fast one at {rows['fast', '64']:.1f} and {rows['fast', '128']:.1f}" in " ".join(README.split())
