"""Every figure function writes a real PNG (and its data) from tiny inputs; the GPU figures from a
synthetic benchmark CSV and without one. The synthetic CSV lives in tmp_path only."""

import csv
import shutil
from pathlib import Path

import pytest
from matplotlib.image import imread

from tinyflash import plots
from tinyflash.bench import record
from tinyflash.plots import gpu as plot_gpu
from tinyflash.plots import memory as plot_memory
from tinyflash.plots import traffic as plot_traffic
from tinyflash.cost.memory import GiB, attention_memory

DEVICE = "NVIDIA H200 (synthetic test data)"
FIGURES = Path(__file__).resolve().parents[1] / "figures"


def assert_png(path, min_size=(400, 300)):
    """A PNG of at least ``min_size`` pixels that is not blank."""
    image = imread(path)  # (height, width, channels) floats in [0, 1]
    assert image.shape[1] >= min_size[0] and image.shape[0] >= min_size[1], image.shape
    assert (image[..., :3] < 0.5).mean() > 0.005, "the image is (almost) blank"


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_bench_csv(path, rows):
    """Write rows in the record's schema (``n``: Nq = Nk; ``impl`` 'stage 2' and 'stage 3': tinyflash's v5 and v6);
    fields not given get harmless defaults."""
    defaults = dict(device=DEVICE, date="2025-01-01", numpy="2.4.6", numba_cuda="0.30.4", cupy="14.2.0",
                    torch="", benchmark="sweep", variant="", dtype="float16", causal="False", batch=1, heads=2,
                    kv_heads=2, d=64, time_ms="", tflops="", peak_bytes="", status="ok", max_rel_err="")
    stage = {"stage 2": ("tinyflash", "v5"), "stage 3": ("tinyflash", "v6")}
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=record.FIELDS)
        writer.writeheader()
        for row in rows:
            row = dict(row)
            n = row.pop("n")
            impl, variant = stage.get(row["impl"], (row["impl"], row.get("variant", "")))
            writer.writerow({**defaults, **row, "impl": impl, "variant": variant, "n_q": n, "n_k": n})
    return path


def synthetic_rows():
    """stage 2 slower than naive attention up to N = 1024, faster from 2048 on; naive out of memory at 8192."""
    naive_ms = {256: 0.05, 512: 0.1, 1024: 0.3, 2048: 1.5, 4096: 6.0}
    flash_ms = {256: 0.2, 512: 0.3, 1024: 0.5, 2048: 1.0, 4096: 3.0, 8192: 12.0}
    rows = []
    for dtype in ("float16", "float32"):
        for n, t in flash_ms.items():
            m = attention_memory(n, 64, heads=2, dtype=dtype)
            rows.append(dict(impl="stage 2", dtype=dtype, n=n, time_ms=t, tflops=4 * 2 * n * n * 64 / t / 1e9,
                             peak_bytes=m.flash_extra, max_rel_err=3e-4))
            if n in naive_ms:
                rows.append(dict(impl="naive", dtype=dtype, n=n, time_ms=naive_ms[n], peak_bytes=m.naive_extra,
                                 tflops=4 * 2 * n * n * 64 / naive_ms[n] / 1e9, max_rel_err=2e-4))
            else:
                rows.append(dict(impl="naive", dtype=dtype, n=n, status="oom"))
            rows.append(dict(impl="torch_flash", dtype=dtype, n=n, status="unsupported" if dtype == "float32" else "ok",
                             time_ms=t / 10, tflops=1.0, peak_bytes=m.flash_extra))
    # one result that failed the benchmark's check before timing: no time, as tinyflash.bench writes it
    rows.append(dict(impl="torch_flash", dtype="float16", n=16_384, status="wrong (error 2.00e-02 > 1e-02)",
                     peak_bytes=1000, max_rel_err=0.02))
    return rows


# --- the three CPU figures -----------------------------------------------------------------


def test_memory_model_figure(tmp_path):
    png, data = tmp_path / "memory_model.png", tmp_path / "data" / "memory_model.csv"
    assert plot_memory.plot_memory_model(png, data, ns=[512, 4096, 32_768]) == png
    assert_png(png)
    rows = read_rows(data)
    assert len(rows) == 2 * 2 * 3  # heads × dtypes × ns
    one = next(r for r in rows if (r["heads"], r["dtype"], r["n"]) == ("1", "float16", "32768"))
    assert int(one["scores_bytes"]) == 2 * GiB  # the 32k-token example, one head
    all32 = next(r for r in rows if (r["heads"], r["dtype"], r["n"]) == ("32", "float16", "32768"))
    assert int(all32["scores_and_probabilities_bytes"]) == 128 * GiB


def test_memory_cpu_figure(tmp_path):
    png, data = tmp_path / "cpu.png", tmp_path / "cpu.csv"
    plot_memory.plot_memory_cpu_measured(png, data, naive_ns=[256, 512], blocked_ns=[256, 512, 1024], block=64,
                                   progress=False)
    assert_png(png)
    rows = read_rows(data)
    assert [r["stage"] for r in rows] == ["naive"] * 2 + ["blocked"] * 3
    for r in rows:  # measured points on the model: naive within 10%, blocked (N >= 2·Br) within 10%
        if r["stage"] == "naive" or int(r["n"]) >= 128:
            assert abs(int(r["measured_peak_bytes"]) / int(r["model_bytes"]) - 1) <= 0.10, r


def test_hbm_traffic_figure(tmp_path):
    png = tmp_path / "traffic.png"
    plot_traffic.plot_hbm_traffic(png, tmp_path, ns=[512, 1000, 2048], m_panel_n=1000, count_max_n=1000, progress=False)
    assert_png(png)
    by_n = read_rows(tmp_path / "hbm_traffic_vs_n.csv")
    flash = [r for r in by_n if r["algorithm"] == "flash"]
    assert {r["how"] for r in flash if int(r["n"]) <= 1000} == {"counted"}  # counted where asked...
    assert {r["how"] for r in flash if int(r["n"]) > 1000} == {"closed_form"}  # ...closed form beyond
    std = {int(r["n"]): int(r["bytes"]) for r in by_n if r["algorithm"] == "standard"}
    assert std[1000] == 8_516_000  # by hand: see test_traffic.test_standard_walk_by_hand
    by_m = read_rows(tmp_path / "hbm_traffic_vs_m.csv")
    moved = [int(r["bytes"]) for r in by_m if r["algorithm"] == "flash"]
    assert moved == sorted(moved, reverse=True)  # more SRAM, never more traffic
    assert any(r["how"] == "counted" for r in by_m)
    cross = [int(r["m"]) for r in by_m if r["algorithm"] == "crossover"]  # where flash starts to move fewer bytes
    std_m = next(int(r["bytes"]) for r in by_m if r["algorithm"] == "standard")
    flash_at = {int(r["m"]): int(r["bytes"]) for r in by_m if r["algorithm"] == "flash"}
    assert len(cross) == 1 and flash_at[cross[0]] < std_m <= flash_at[cross[0] - 4 * 64]
    assert f"below M = {cross[0]:,} elements" in plot_traffic.crossover_sentence(
        [{**r, "m": int(r["m"]) if r["m"] else ""} for r in by_m])


def test_counted_and_closed_form_disagreeing_is_an_error(monkeypatch):
    """The figure refuses to draw a count that differs from the formula."""
    class Off:
        total = 1

    monkeypatch.setattr(plot_traffic, "flash_attention_traffic", lambda *a, **k: Off())
    with pytest.raises(AssertionError, match="counted traffic 1 != closed form"):
        plot_traffic._flash_traffic(256, 64, 16_384, False, True, "float16")


# --- the two GPU figures -------------------------------------------------------------------


def test_gpu_figures_without_csv_show_a_placeholder(tmp_path):
    missing = tmp_path / "data" / "bench_h200.csv"
    assert plot_gpu.read_bench_csv(missing) is None
    for fn, name in ((plot_gpu.plot_memory_gpu_measured, "mem.png"), (plot_gpu.plot_time_gpu, "time.png")):
        fn(tmp_path / name, missing)
        assert_png(tmp_path / name)
        assert imread(tmp_path / name).shape[:2] == (440, 1100)  # the placeholder's fixed size


def test_gpu_figures_from_a_synthetic_csv(tmp_path):
    path = write_bench_csv(tmp_path / "bench.csv", synthetic_rows())
    rows = plot_gpu.read_bench_csv(path)
    assert all(r["status"] != "unsupported" for r in rows)  # torch_flash fp32 rows dropped
    wrong = [r for r in rows if r["status"] == "wrong"]
    assert len(wrong) == 1 and wrong[0]["time_ms"] is None and wrong[0]["status_detail"].startswith("wrong (error")
    assert plot_gpu._impl_label(rows, "torch_flash") == "PyTorch SDPA, flash backend"  # failed rows give no error bound
    assert plot_gpu._impl_label(rows, "stage 2") == "tinyflash stage 2 (CUDA cores, v5) (max rel. error 3.0e-04)"
    assert plot_gpu.gpu_panels(rows) == [("float16", 64, False, 1, 2), ("float32", 64, False, 1, 2)]
    for fn, name in ((plot_gpu.plot_memory_gpu_measured, "mem.png"), (plot_gpu.plot_time_gpu, "time.png")):
        fn(tmp_path / name, path)
        assert_png(tmp_path / name, min_size=(1000, 500))


def stage_3_rows():
    """Stage 3 (v6) as the sweep writes it: float16 only, faster than naive attention at every N."""
    ms = {256: 0.04, 512: 0.05, 1024: 0.08, 2048: 0.2, 4096: 0.5, 8192: 1.8}
    return [dict(impl="stage 3", dtype="float16", n=n, time_ms=t, tflops=4 * 2 * n * n * 64 / t / 1e9,
                 peak_bytes=attention_memory(n, 64, heads=2, dtype="float16").flash_extra, max_rel_err=5e-4)
            for n, t in ms.items()]


def test_gpu_figures_draw_stage_3_only_where_it_has_rows(tmp_path, monkeypatch):
    """With stage 3's rows: a line of its own in the float16 panels of both figures, none in the
    float32 ones; without them (the CSV before stage 3 joined the sweep): no line and no legend entry.
    The crossover and out-of-memory marks still compare stage 2 with naive attention."""
    from matplotlib.figure import Figure

    from tinyflash.bench import suites

    monkeypatch.setattr(suites.p, "has_torch", lambda: True)  # the peers with PyTorch installed, as on the GPU
    sweep = [p.name for p in suites.sweep_peers({})]  # every peer the sweep times has a line, a colour and a label
    assert {plot_gpu.LINE_OF.get(name, name[0]) for name in sweep} == set(plot_gpu.IMPLS)
    label = "tinyflash stage 3 (tensor cores, v6)"
    assert plot_gpu.IMPLS["stage 3"][0] == label
    assert len({(c, m) for _, c, m in plot_gpu.IMPLS.values()}) == len(plot_gpu.IMPLS)  # told apart at a glance
    without = plot_gpu.read_bench_csv(write_bench_csv(tmp_path / "without.csv", synthetic_rows()))
    path = write_bench_csv(tmp_path / "with.csv", synthetic_rows() + stage_3_rows())
    rows = plot_gpu.read_bench_csv(path)
    assert plot_gpu._impl_label(rows, "stage 3") == f"{label} (max rel. error 5.0e-04)"
    assert plot_gpu.gpu_panels(rows) == plot_gpu.gpu_panels(without)  # the same panels, one more line

    def drawn(rows, config):
        """{label: number of points} of the lines in the time panel, and the memory panel's labels."""
        ax_t, ax_f, ax_m = Figure().subplots(3)
        plot_gpu._draw_gpu_time(ax_t, ax_f, rows, config)
        plot_gpu._draw_gpu_memory(ax_m, rows, config)
        labels = [line.get_label() for line in ax_m.get_lines()]
        return {line.get_label(): len(line.get_xdata()) for line in ax_t.get_lines()}, labels

    fp16, fp32 = ("float16", 64, False, 1, 2), ("float32", 64, False, 1, 2)
    times, memory = drawn(rows, fp16)
    assert times[f"{label} (max rel. error 5.0e-04)"] == len(stage_3_rows())
    assert f"{label} (max rel. error 5.0e-04)" in memory
    for rows_, config in ((rows, fp32), (without, fp16), (without, fp32)):
        times, memory = drawn(rows_, config)
        assert not any(label in x for x in [*times, *memory]), config
    assert plot_gpu.crossover_n(rows, fp16) == plot_gpu.crossover_n(without, fp16) == 2048  # stage 2's
    assert plot_gpu.first_oom_n(rows, fp16) == 8192 and plot_gpu.first_oom_n(rows, fp16, impl="stage 3") is None
    for fn, name in ((plot_gpu.plot_memory_gpu_measured, "mem"), (plot_gpu.plot_time_gpu, "time")):
        fn(tmp_path / f"{name}_with.png", path)
        fn(tmp_path / f"{name}_without.png", tmp_path / "without.csv")
        assert_png(tmp_path / f"{name}_with.png", min_size=(1000, 500))
        assert (tmp_path / f"{name}_with.png").read_bytes() != (tmp_path / f"{name}_without.png").read_bytes()


def test_crossover_and_oom_come_from_the_data():
    rows = [{**r, "line": r["impl"], "causal": False, "batch": 1, "heads": 2, "d": 64, "time_ms": r.get("time_ms"),
             "status": r.get("status", "ok")} for r in synthetic_rows()]
    config = ("float16", 64, False, 1, 2)
    assert plot_gpu.crossover_n(rows, config) == 2048
    assert plot_gpu.first_oom_n(rows, config) == 8192
    assert plot_gpu.first_oom_n(rows, config, impl="stage 2") is None
    # tinyflash slower at the largest N both ran: no crossover; faster everywhere: the first N
    slower = [dict(r, time_ms=100.0) if r["line"] == "stage 2" else r for r in rows]
    assert plot_gpu.crossover_n(slower, config) is None
    faster = [dict(r, time_ms=0.001) if r["line"] == "stage 2" else r for r in rows]
    assert plot_gpu.crossover_n(faster, config) == 256
    # a win at a short N that is lost again later does not count as the crossover
    wobbly = [dict(r, time_ms=0.01) if r["line"] == "stage 2" and r["n"] == 256 else r for r in rows]
    assert plot_gpu.crossover_n(wobbly, config) == 2048


def test_bench_csv_errors_name_the_problem(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("device,impl,n_q\nH200,tinyflash,256\n")
    with pytest.raises(ValueError, match="lacks the columns"):
        plot_gpu.read_bench_csv(bad)
    path = write_bench_csv(tmp_path / "status.csv", [dict(impl="tinyflash", n=256, status="crashed")])
    with pytest.raises(ValueError, match=r"status must be ok, oom, unsupported or wrong \(...\); got 'crashed'"):
        plot_gpu.read_bench_csv(path)


# --- the command line ----------------------------------------------------------------------


def test_main_writes_named_figures(tmp_path, capsys):
    assert plots.main(["--out", str(tmp_path), "--only", "memory_model", "time_gpu", "--no-progress"]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["memory_model.png", "time_gpu.png"]
    assert (tmp_path / "data" / "memory_model.csv").exists()
    assert not (tmp_path / "data" / "bench_h200.csv").exists()  # the GPU CSV is input, never written here
    assert "done in" in capsys.readouterr().out
    with pytest.raises(ValueError, match="unknown"):
        plots.make_figures(tmp_path, ["memory_model", "nope"])
    assert plots.FIGURE_NAMES == ("memory_model", "memory_cpu_measured", "memory_gpu_measured", "hbm_traffic",
                                  "time_gpu", "training_memory", "kv_cache", "gpt_training", "block_sparsity")


def test_remeasure_gpu_calls_the_benchmark_with_the_csv_path(tmp_path, monkeypatch):
    calls = []

    class Done:
        returncode = 0

    monkeypatch.setattr(plots.subprocess, "run", lambda cmd: calls.append(cmd) or Done())
    plots.main(["--out", str(tmp_path), "--remeasure-gpu", "--only", "time_gpu", "--no-progress"])
    assert calls and calls[0][1:] == ["-m", "tinyflash.bench", "sweep", "--csv", str(tmp_path / "data" / "bench_h200.csv")]
    Done.returncode = 3
    with pytest.raises(SystemExit, match="exit code 3"):
        plots.main(["--out", str(tmp_path), "--remeasure-gpu", "--only", "time_gpu", "--no-progress"])


@pytest.mark.grid  # every figure drawn anew: the first tier draws each kind from the synthetic CSVs above
def test_a_plots_run_leaves_the_committed_figures_and_data_as_they_are(tmp_path, monkeypatch):
    """``python -m tinyflash.plots`` draws the CPU figure from its committed CSV (no tracemalloc run)
    and computes every other figure's data the same way each time: on a copy of figures/data it
    writes byte for byte the committed CSVs and PNGs, so a run leaves the checkout clean."""
    def no_measuring(*args, **kwargs):
        raise AssertionError("the CPU memory sweep ran without --remeasure-cpu")

    monkeypatch.setattr(plot_memory, "memory_cpu_data", no_measuring)
    shutil.copytree(FIGURES / "data", tmp_path / "data")
    assert plots.main(["--out", str(tmp_path), "--no-progress"]) == 0
    for committed in sorted((FIGURES / "data").glob("*.csv")) + [FIGURES / f"{n}.png" for n in plots.FIGURE_NAMES]:
        made = tmp_path / committed.relative_to(FIGURES)
        assert made.read_bytes() == committed.read_bytes(), f"{committed.name} differs: run python -m tinyflash.plots"


def test_remeasure_cpu_measures_and_writes_the_csv(tmp_path, monkeypatch):
    real, calls = plot_memory.memory_cpu_data, []

    def tiny(*args, **kwargs):
        calls.append(1)
        return real([256, 512], [256, 512, 1024], d=64, block=64, progress=False)

    monkeypatch.setattr(plot_memory, "memory_cpu_data", tiny)
    plots.main(["--out", str(tmp_path), "--only", "memory_cpu_measured", "--remeasure-cpu", "--no-progress"])
    assert calls == [1] and [r["stage"] for r in read_rows(tmp_path / "data" / "memory_cpu_measured.csv")] == \
        ["naive"] * 2 + ["blocked"] * 3
    plots.main(["--out", str(tmp_path), "--only", "memory_cpu_measured", "--no-progress"])  # from the CSV now
    assert calls == [1]
    assert_png(tmp_path / "memory_cpu_measured.png")


def test_bad_sequence_lengths():
    with pytest.raises(ValueError, match="ns must be a non-empty list"):
        plot_memory.memory_model_data([])
    with pytest.raises(ValueError, match="naive_ns"):
        plot_memory.memory_cpu_data([0], [256], progress=False)


def test_kv_cache_figure(tmp_path):
    """The KV-cache figure and its data: GQA's 8 K/V heads take 1/4 of MHA's bytes, int8 half of float16."""
    from tinyflash.plots import kv_cache as plot_kv_cache

    png = plot_kv_cache.plot_kv_cache(tmp_path / "kv_cache.png", tmp_path / "kv_cache.csv", contexts=[1024, 4096])
    assert_png(png)
    rows = {(r["variant"], r["dtype"], int(r["context"])): int(r["bytes"]) for r in read_rows(tmp_path / "kv_cache.csv")}
    assert rows["MHA", "float16", 4096] == 4 * rows["GQA", "float16", 4096] == 32 * rows["MQA", "float16", 4096]
    assert rows["GQA", "float16", 1024] == 2 * rows["GQA", "int8", 1024]


def test_block_sparsity_figure(tmp_path):
    """The block-mask figure and its data at N = 2,048 (16 × 16 tiles): the fractions counted by hand."""
    from tinyflash.plots import block_sparsity as plot_block_sparsity

    png = plot_block_sparsity.plot_block_sparsity(tmp_path / "b.png", tmp_path / "b.csv", n=2048, picture_n=1024)
    assert_png(png)
    rows = {r["variant"]: {k: float(r[k]) for k in ("empty", "partial", "full")} for r in read_rows(tmp_path / "b.csv")}
    assert rows["dense (softcap, ALiBi)"] == {"empty": 0.0, "partial": 0.0, "full": 1.0}
    tiles = 16 * 16  # causal: 16 diagonal tiles partial, the 120 below full, the 120 above empty
    assert rows["causal"] == {"empty": 120 / tiles, "partial": 16 / tiles, "full": 120 / tiles}
    # a window of 1,024 keys = 8 tiles: per query tile the diagonal and the window's far edge are partial,
    # the 7 between full (fewer in the first 8 rows of tiles)
    assert rows["sliding window 1,024"]["partial"] == (16 + 8) / tiles
    for fractions in rows.values():
        assert sum(fractions.values()) == pytest.approx(1.0)


def test_provenance_names_every_run():
    """A CSV measured in two runs (float16 rows later than float32 ones) says both dates in the title."""
    from tinyflash.plots.gpu import _provenance

    base = {"device": "GPU", "numpy": "2", "numba_cuda": "0.30", "cupy": "14", "torch": ""}
    one = [{**base, "date": "d1", "dtype": "float32"}]
    assert "GPU, d1;" in _provenance(one)
    two = one + [{**base, "date": "d2", "dtype": "float16"}]
    assert "d1 (float32), d2 (float16)" in _provenance(two)
