"""The benchmark harness's parts that need no GPU: the check, the baseline, the CSV schema, the tables.

(Timing needs CUDA events and runs only on a GPU, in ``python -m tinyflash.bench``.)
"""

import csv
import math
import statistics

import numpy as np
import pytest
from conftest import make_qkv

import tinyflash as tf
from tinyflash.core.tolerance import F32_TOL, within_tolerance
from tinyflash.forward.kernels import VERSIONS
from tinyflash.measure import harness, report


@pytest.mark.parametrize("causal", [False, True])
def test_reference_on_sampled_rows_is_the_reference(rng, causal):
    """reference_attention(rows=...) computes those rows with their true causal positions."""
    q, k, v = make_qkv(rng, (), 37, 29, d=8, d_v=5)
    rows = np.array([0, 3, 8, 20, 36])
    full_o, full_lse = tf.reference_attention(q, k, v, causal=causal)
    o, lse = tf.reference_attention(q, k, v, causal=causal, rows=rows)
    assert np.array_equal(o, full_o[rows]) and np.array_equal(lse, full_lse[rows])
    with pytest.raises(ValueError, match=r"rows must be a 1-D array of query indices in \[0, 37\)"):
        tf.reference_attention(q, k, v, rows=np.array([37]))


@pytest.mark.parametrize("causal", [False, True])
def test_naive_same_precision_keeps_s_and_p_in_the_input_dtype(rng, causal):
    """The benchmark's baseline: on sampled rows it equals the full computation's rows; in float16
    it is less accurate than tinyflash's naive stage (which computes in float32)."""
    q, k, v = make_qkv(rng, (2,), 41, 50, d=16, dtype=np.float16)  # Nq <= Nk: every row sees a key
    rows = np.array([1, 7, 30, 40])
    full = harness.naive_same_precision(q, k, v, causal=causal)
    part = harness.naive_same_precision(q, k, v, causal=causal, rows=rows)
    assert full.dtype == np.float16 and np.array_equal(part, full[..., rows, :])
    ref = tf.reference_attention(q, k, v, causal=causal)[0]
    err16 = np.abs(full.astype(np.float64) - ref).max()
    err32 = np.abs(tf.naive_attention(q, k, v, causal=causal)[0].astype(np.float64) - ref).max()
    assert err16 > err32 > 0


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_check_passes_right_results_and_catches_wrong_ones(rng, dtype):
    q, k, v = make_qkv(rng, (2, 3), 90, 90, d=16, dtype=dtype)
    o = tf.blocked_attention(q, k, v, causal=True)[0]
    verdict = harness.check(o, q, k, v, causal=True, rng=rng, rows=16)
    assert verdict["ok"] and verdict["max_rel_err"] <= verdict["tolerance"]
    if dtype == np.float32:
        assert verdict["tolerance"] == F32_TOL
    wrong = o.copy()
    wrong[-1, -1] = tf.blocked_attention(q, k, v, causal=False)[0][-1, -1]  # the last head without its mask
    assert not harness.check(wrong, q, k, v, causal=True, rng=rng, rows=90)["ok"]


def test_csv_writer_keeps_to_the_schema(tmp_path):
    writer = harness.CsvWriter(tmp_path / "x.csv")
    writer.write({"impl": "tinyflash", "dtype": "float32", "n": 64, "time_ms": 1.234567891, "status": "ok"})
    with pytest.raises(ValueError, match="outside the schema"):
        writer.write({"impl": "tinyflash", "colour": "green"})
    writer.close()
    rows = list(csv.DictReader(open(tmp_path / "x.csv")))
    assert list(rows[0]) == harness.FIELDS and rows[0]["time_ms"] == "1.23457" and rows[0]["regs"] == ""
    writer = harness.CsvWriter(tmp_path / "y.csv", fields={"time_ms": 0.0, "total_peak_bytes": 0})  # its own columns
    writer.write({"time_ms": 218.14123, "total_peak_bytes": 1090912256})
    writer.close()
    assert list(csv.DictReader(open(tmp_path / "y.csv"))) == [{"time_ms": "218.141", "total_peak_bytes": "1090912256"}]


def test_flops():
    assert harness.attention_flops(1, 32, 4096, 4096, 128, False) == 4 * 32 * 4096**2 * 128
    assert harness.attention_flops(2, 1, 10, 20, 8, True) == 2 * 2 * 10 * 20 * 8


def test_versions_table_and_lines():
    rows = [dict(benchmark="versions", impl="tinyflash", variant=name, dtype="float32", causal="False", n="16384",
                 d=str(d), time_ms="10", time_min_ms="9.5", time_max_ms="11", tflops=str(i + d / 100), status="ok",
                 max_rel_err="1e-6", tolerance="1e-5", peak_bytes="100")
            for i, name in enumerate(VERSIONS) for d in (64, 128)]
    table = report.versions_table(rows).splitlines()
    assert table[0] == "| version | what changed | d = 64 | d = 128 |" and len(table) == 2 + len(VERSIONS)
    assert table[2].startswith("| v1 | ") and table[2].endswith("| 0.6 | 1.3 |")
    assert report.table_for(rows).splitlines() == table
    assert "15.0" in report.line(rows[0])  # spread: (11 - 9.5) / 10
    with pytest.raises(ValueError, match="one sequence length"):
        report.versions_table(rows + [dict(rows[0], n="1024")])


def test_summary_table_with_and_without_stage_3():
    """The README's sweep table from synthetic rows: stage 3 (tinyflash_tc, v6) gets its TFLOP/s and its
    speed relative to SDPA flash in float16 rows, 'OOM' where it ran out of memory, '–' in float32 rows
    and everywhere in a CSV without v6 rows; the other columns do not change."""
    ms = {"tinyflash": 10.0, "tinyflash_tc": 2.0, "torch_flash": 1.6, "torch_efficient": 3.0, "cupy_naive": 50.0}
    rows = [dict(benchmark="sweep", impl=impl, variant={"tinyflash": "v5", "tinyflash_tc": "v6"}.get(impl, ""),
                 dtype=dtype, d=d, causal="False", n="16384", time_ms=str(t), tflops=str(100 / t), status="ok",
                 peak_bytes=str(2**20 * (1000 if impl == "cupy_naive" else 10)))
            for dtype, d in (("float16", "64"), ("float32", "64")) for impl, t in ms.items()
            if not (dtype == "float32" and impl in ("tinyflash_tc", "torch_flash"))]
    rows.append(dict(rows[0], d="128"))  # float16, d = 128: stage 2 ran, stage 3 ran out of memory
    rows.append(dict(rows[1], d="128", status="oom", time_ms="", tflops=""))
    table = report.summary_table(rows).splitlines()
    assert table[0] == ("| dtype | d | causal | stage 2 (v5) TFLOP/s | stage 3 (v6) TFLOP/s | SDPA efficient | "
                        "SDPA flash | naive CuPy | stage 2 / efficient | stage 3 / flash | speed-up over naive | "
                        "extra memory, stage 2 / naive |") and len(table) == 2 + 3
    mem = "10 MiB / 1000 MiB"
    assert table[2] == f"| float16 | 64 | False | 10.0 | 50.0 | 33.3 | 62.5 | 2.0 | 0.30× | 0.80× | 5.0× | {mem} |"
    assert table[3] == "| float16 | 128 | False | 10.0 | OOM | – | – | – | – | – | – | – |"
    assert table[4] == f"| float32 | 64 | False | 10.0 | – | 33.3 | – | 2.0 | 0.30× | – | 5.0× | {mem} |"
    without = report.summary_table([r for r in rows if r["impl"] != "tinyflash_tc"]).splitlines()

    def drop_stage_3(line):
        cells = line.split("|")
        return cells[:5] + cells[6:10] + cells[11:]

    assert [line.split("|")[5].strip() for line in without[2:]] == ["–"] * 3
    assert [line.split("|")[10].strip() for line in without[2:]] == ["–"] * 3
    assert [drop_stage_3(x) for x in without] == [drop_stage_3(x) for x in table]


@pytest.mark.simulator
def test_benchmark_variants_compute_attention(rng):
    """What `python -m tinyflash.bench versions | vector | tiles` measure, run once each at a tiny
    size (on the simulator without a GPU): every variant's function gives the reference's output."""
    from tinyflash.measure import bench

    q, k, v = make_qkv(rng, (1, 1), 10, 13, d=64, dtype=np.float32)  # one query tile for every tiling
    ref = tf.reference_attention(q, k, v, causal=True)[0]
    float32_versions = [name for name, v in VERSIONS.items() if v.accepts(np.float32, 64, 64)]  # v6 takes 16-bit only
    variants = bench.version_variants(64, np.float32) + bench.vector_variants() + bench.tile_variants(64, np.float32)
    assert [x.variant for x in variants[:len(float32_versions)]] == float32_versions
    assert len(variants) == len(float32_versions) + 2 + len(bench.TILE_SWEEP[64])
    assert [x.variant for x in bench.version_variants(64, np.float16)] == list(VERSIONS)
    for variant in variants:
        assert variant.impl == "tinyflash"
        assert within_tolerance(variant.fn(q, k, v, True), ref, np.float32).ok, variant.variant


@pytest.mark.simulator
def test_the_sweep_times_stage_3_on_float16_only(rng):
    """`python -m tinyflash.bench` (the sweep) adds v6 (impl tinyflash_tc) where the registry says it
    takes the inputs: float16 at d = 64 and 128, never float32 (no row at all, not an 'unsupported'
    one); its function passes the harness's check, as every variant must before it is timed."""
    from tinyflash.forward.kernels import LATEST
    from tinyflash.measure import bench

    def measured(d, dtype):  # tinyflash's and naive CuPy's; PyTorch's, where it is installed, follow
        return [(x.impl, x.variant) for x in bench.sdpa_variants(d, dtype) if not x.impl.startswith("torch")]

    for d in (64, 128):
        assert measured(d, np.float16) == [("tinyflash", LATEST), ("tinyflash_tc", "v6"), ("cupy_naive", "")]
        assert measured(d, np.float32) == [("tinyflash", LATEST), ("cupy_naive", "")]
    assert "tinyflash_tc" not in [x.impl for x in bench.sdpa_variants(96, np.float16)]
    q, k, v = make_qkv(rng, (1, 1), 37, 37, d=64, dtype=np.float16)  # (B, H, N, d): a ragged tile
    stage_3 = bench.sdpa_variants(64, np.float16)[1]
    verdict = harness.check(stage_3.fn(q, k, v, True), q, k, v, causal=True, rng=rng, rows=37)
    assert verdict["ok"], verdict


class ToyGpu:
    """A stand-in for the GPU and its clock, for time_interleaved: each call of a peer enqueues ``cost`` ms
    of GPU work after ``host`` ms of host time; the GPU runs work in order, as soon as it is enqueued and
    the work before it is done. Events are work of no cost; ``sync`` waits for the queue."""

    def __init__(self):
        self.host_now, self.gpu_free, self.calls = 0.0, 0.0, []

    def peer(self, name, host, cost):
        def call():
            self.calls.append(name)
            self.host_now += host
            self.gpu_free = max(self.gpu_free, self.host_now) + cost
        return call

    def _event(self):
        self.gpu_free = max(self.gpu_free, self.host_now)
        return self.gpu_free

    def sync(self):
        self.host_now = max(self.host_now, self.gpu_free)

    def elapsed_ms(self, work):
        start = self._event()
        work()
        end = self._event()
        self.sync()
        return end - start


def test_time_interleaved_queued_hides_host_time_and_latency_shows_it():
    """Queued, the GPU time per call (host time hidden behind the GPU's); alone, host + GPU; the peers take
    turns, each leading some rounds; a burst lasts about BURST_MS, within its bounds, after SETTLE_MS of
    untimed calls."""
    from contextlib import nullcontext

    gpu = ToyGpu()
    peers = {"fast kernel, slow host": (gpu.peer("a", host=0.05, cost=0.4), nullcontext),
             "slow kernel, fast host": (gpu.peer("b", host=0.01, cost=0.42), nullcontext),
             "long": (gpu.peer("c", host=0.01, cost=100.0), nullcontext)}
    out = harness.time_interleaved(peers, rounds=6, clock=gpu)
    a, b, c = (out[name] for name in peers)
    assert a["time_ms"] == pytest.approx(0.4) and b["time_ms"] == pytest.approx(0.42)  # the kernels' own time
    assert a["latency_ms"] == pytest.approx(0.45) and b["latency_ms"] == pytest.approx(0.43)  # host time shows
    assert a["reps"] == len(a["rounds_ms"]) == 6
    assert a["burst"] == math.ceil(harness.BURST_MS / 0.45) and c["burst"] == harness.MIN_BURST
    assert harness.MIN_BURST <= a["burst"] <= harness.MAX_BURST
    timed = gpu.calls[3 * (harness.WARMUP + 1):]  # after each peer's warm-up calls and the call that sizes its burst
    settle = {"a": math.ceil(harness.SETTLE_MS / 0.45), "b": math.ceil(harness.SETTLE_MS / 0.43), "c": 2}
    calls = {p: settle[p] + 2 + out[name]["burst"] for p, name in zip("abc", peers)}  # settle, alone, untimed, burst
    order = "abc" + "bca" + "cab" + "cba" + "acb" + "bac"  # rotated, then reversed in the second cycle
    i = 0
    for p in order:  # each peer's calls of a round together, in this order
        assert timed[i:i + calls[p]] == [p] * calls[p]
        i += calls[p]
    assert i == len(timed)
    assert [harness.round_order(list("xy"), r) for r in range(4)] == [list("xy"), list("yx"), list("yx"), list("xy")]


def test_measure_peers_checks_first_and_compares_with_flash():
    """A peer that fails its check gets no time; the others get times and speeds over the flash backend:
    median over median, the quartiles of the rounds' ratios, and the latencies' ratio."""
    from contextlib import nullcontext

    from tinyflash.measure import bench_tensor_cores as btc

    def check(fn, q, k, v, causal, rng):
        return {"status": "ok" if fn() else "wrong (error 1 > 0)", "max_rel_err": 0.0, "tolerance": 1.0}

    peer_list = [("torch_flash", "", lambda: True, ("float16",), nullcontext),
                 ("tinyflash", "v6", lambda: True, ("float16",), nullcontext),
                 ("tinyflash", "broken", lambda: False, ("float16",), nullcontext),
                 ("tinyflash", "v5", lambda: True, ("float32",), nullcontext)]  # not this dtype: no row

    def timer(timed):
        assert list(timed) == [("torch_flash", ""), ("tinyflash", "v6")]
        rounds = {("torch_flash", ""): [1.0, 1.0, 1.2, 1.0, 1.0], ("tinyflash", "v6"): [0.8, 0.9, 1.0, 0.85, 1.25]}
        return {key: {"time_ms": statistics.median(ms), "time_min_ms": min(ms), "time_max_ms": max(ms), "reps": 5,
                      "burst": 3, "latency_ms": 2.0 if key[0] == "torch_flash" else 2.5, "rounds_ms": ms}
                for key, ms in rounds.items()}

    rows = btc.measure_peers(*(lambda: True,) * 3, False, None, "float16", 1, 2, 64, 16, peer_list=[
        (impl, var, (lambda f: lambda q, k, v, causal: f())(fn), dts, ar) for impl, var, fn, dts, ar in peer_list],
        timer=timer, check=lambda fn, q, k, v, causal, rng: check(lambda: fn(q, k, v, causal), q, k, v, causal, rng))
    assert [(r["impl"], r["variant"]) for r in rows] == [("torch_flash", ""), ("tinyflash", "v6"),
                                                         ("tinyflash", "broken")]
    flash, v6, broken = rows
    assert "time_ms" not in broken and broken["status"].startswith("wrong")
    assert flash["speed_vs_flash"] == 1.0 and v6["speed_vs_flash"] == pytest.approx(1.0 / 0.9)
    ratios = [1.25, 1.0 / 0.9, 1.2, 1.0 / 0.85, 0.8]  # the rounds' flash / v6
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    assert (v6["speed_vs_flash_q1"], v6["speed_vs_flash_q3"]) == (pytest.approx(q1), pytest.approx(q3))
    assert v6["latency_vs_flash"] == pytest.approx(0.8) and v6["tflops"] == pytest.approx(
        harness.attention_flops(1, 2, 64, 64, 16, False) / (0.9 * 1e9))
    assert btc.vs_flash_cells(v6).split()[0] == "1.111" and btc.vs_flash_cells(broken) == ""
