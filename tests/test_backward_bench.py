"""The backward benchmark's own arithmetic, on the CPU: its naive CuPy backward and its float64
reference are NumPy-compatible code, run here with NumPy standing in for CuPy, against stage 0."""

import csv
import sys

import numpy as np
import pytest
from conftest import make_qkv

import tinyflash as tf
from tinyflash.core.tolerance import assert_close
from tinyflash.measure import bench_backward


@pytest.fixture
def numpy_as_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", np)


@pytest.mark.parametrize("causal", [False, True])
def test_naive_and_reference_backward_of_the_benchmark(rng, numpy_as_cupy, causal, monkeypatch):
    monkeypatch.setattr(bench_backward, "ROW_BLOCK", 7)  # several blocks of rows, the last one ragged
    q, k, v = make_qkv(rng, (), 20, 20, d=8, dtype=np.float32)
    do = rng.standard_normal((20, 8)).astype(np.float32)
    expected = tf.reference_attention_backward(q, k, v, do, causal=causal)
    for name, a, b, c in zip(("dq", "dk", "dv"), bench_backward.naive_backward(q, k, v, do, causal),
                             bench_backward.reference_head(q, k, v, do, causal), expected):
        assert a.dtype == np.float32 and b.dtype == np.float64
        assert_close(a, c, bench_backward.F32_GRAD_TOL, f"{name} naive CuPy backward, float32")
        assert_close(b, c, 1e-12, f"{name} float64 reference")


def test_backward_flops():
    """2.5 × the forward's 4·B·H·N²·d, halved for causal: 10·B·H·N²·d."""
    assert bench_backward.backward_flops(1, 32, 16384, 16384, 128, False) == 10 * 32 * 16384**2 * 128
    assert bench_backward.backward_flops(1, 32, 16384, 16384, 128, True) == 5 * 32 * 16384**2 * 128



def test_training_memory_figure(tmp_path):
    """Naive keeps N × N matrices (S, P: at least 2·N²·4 bytes; its backward S, P, dP, dS: 4·N²·4);
    FlashAttention keeps O and lse, and its backward's peak beyond its outputs is flat in N."""
    from tinyflash.measure import plot_training_memory as ptm

    png, data = tmp_path / "training_memory.png", tmp_path / "training_memory.csv"
    assert ptm.plot_training_memory(png, data, naive_ns=[128, 256], flash_ns=[128, 256, 512], d=16, block=32,
                                    progress=False) == png
    assert png.stat().st_size > 10_000
    with open(data) as f:
        rows = list(csv.DictReader(f))
    assert [r["stage"] for r in rows] == ["naive"] * 2 + ["flash"] * 3
    for r in rows:
        n, kept, peak = int(r["n"]), int(r["kept_bytes"]), int(r["backward_peak_bytes"])
        if r["stage"] == "naive":
            assert kept >= 2 * n * n * 4 and peak >= 4 * n * n * 4, r
        else:
            assert kept == n * 16 * 4 + n * 4, r  # O (N × dv) and lse (N), float32
    # flash: the peak minus its O(N·d) arrays (dQ, dK, dV, and D, lse) is the same tile workspace at every N
    excess = [int(r["backward_peak_bytes"]) - (3 * int(r["n"]) * 16 + 2 * int(r["n"])) * 4 for r in rows[2:]]
    assert max(excess) <= 1.25 * min(excess) and max(excess) < 128 * 128 * 4, excess
    # without remeasuring, the figure is drawn from the CSV, which is left as it was
    before = data.read_bytes()
    assert ptm.plot_training_memory(png, data, progress=False, remeasure=False) == png
    assert data.read_bytes() == before


def test_backward_table_from_a_synthetic_csv():
    """The README's backward table: TFLOP/s per implementation, speed against SDPA efficient and naive, OOM shown."""
    from tinyflash.measure import report

    def row(impl, n, ms, status="ok", dtype="float32"):
        return {"benchmark": "backward", "impl": impl, "dtype": dtype, "d": "128", "causal": "False", "n": str(n),
                "status": status, "time_ms": str(ms) if status == "ok" else "",
                "tflops": str(bench_backward.backward_flops(1, 32, n, n, 128, False) / (ms * 1e9)) if status == "ok"
                else ""}

    rows = [row("tinyflash", 4096, 2.0), row("cupy_naive", 4096, 5.0), row("tinyflash", 16384, 40.0),
            row("torch_efficient", 16384, 30.0), row("torch_flash", 16384, 4.0, dtype="float16"),
            row("cupy_naive", 16384, 0, status="oom")]
    table = report.table_for(rows, 16384)
    line = table.splitlines()[2]
    tflops = bench_backward.backward_flops(1, 32, 16384, 16384, 128, False) / (40.0 * 1e9)
    assert line.startswith(f"| 128 | False | {tflops:.1f} | ") and "| OOM |" in line
    assert line.endswith("| 0.75× | 2.5× | – |"), line
