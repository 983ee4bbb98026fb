"""The benchmark tooling's parts that need no GPU: the check, the naive baselines, the record's schema,
the interleaved timing on a toy clock, the runner with fake peers, the tables.

(Real timing needs CUDA events and runs on a GPU, in ``python -m tinyflash.bench``.)
"""

import csv
import math
import re
import statistics
from contextlib import nullcontext

import numpy as np
import pytest
from conftest import make_qkv

import tinyflash as tf
from tinyflash.bench import checking, peers, record, runner, suites, tables, timing
from tinyflash.core.tolerance import F32_TOL, assert_close, round_to, within_tolerance
from tinyflash.forward.kernels import VERSIONS


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
def test_naive_attention_keeps_s_and_p_in_the_input_dtype(rng, causal):
    """The baseline: on sampled rows it equals the full computation's rows; in float16 it is less
    accurate than tinyflash's naive stage (which computes in float32 and rounds once), by the root-mean-square
    error over every output (the largest single error can be the same element's final rounding in both: in 7 of
    1,200 draws it was)."""
    q, k, v = make_qkv(rng, (2,), 41, 50, d=16, dtype=np.float16)  # Nq <= Nk: every row sees a key
    rows = np.array([1, 7, 30, 40])
    full = checking.naive_attention(q, k, v, causal=causal)
    part = checking.naive_attention(q, k, v, causal=causal, rows=rows)
    assert full.dtype == np.float16 and np.array_equal(part, full[..., rows, :])
    ref = tf.reference_attention(q, k, v, causal=causal)[0]
    err16 = np.sqrt(np.mean((full.astype(np.float64) - ref) ** 2))
    err32 = np.sqrt(np.mean((tf.naive_attention(q, k, v, causal=causal)[0].astype(np.float64) - ref) ** 2))
    assert err16 > err32 > 0


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_check_passes_right_results_and_catches_wrong_ones(rng, dtype):
    q, k, v = make_qkv(rng, (2, 3), 90, 90, d=16, dtype=dtype)
    o, lse = tf.blocked_attention(q, k, v, causal=True)
    verdict = checking.check_output(o, q, k, v, causal=True, rng=rng, lse=lse, rows=16)
    assert verdict.ok and verdict.error <= verdict.tolerance
    if dtype == np.float32:
        assert verdict.tolerance == F32_TOL
    wrong = o.copy()
    wrong[-1, -1] = tf.blocked_attention(q, k, v, causal=False)[0][-1, -1]  # the last head without its mask
    assert not checking.check_output(wrong, q, k, v, causal=True, rng=rng, rows=90).ok
    assert not checking.check_output(o, q, k, v, causal=True, rng=rng, lse=lse + 1e-3, rows=90).ok


def test_check_of_grouped_query_heads(rng):
    """q (B, H, N, d) with fewer K/V heads: each checked query head is compared with its own K/V head."""
    q = rng.standard_normal((2, 4, 30, 8)).astype(np.float32)  # (B, H, Nq, d)
    k, v = (rng.standard_normal((2, 2, 40, 8)).astype(np.float32) for _ in range(2))  # (B, H_kv, Nk, d)
    o = tf.naive_attention(q, k, v)[0]
    assert checking.sampled_heads(q, 2) == [((0, 0), (0, 0)), ((1, 3), (1, 1))]
    assert checking.check_output(o, q, k, v, causal=False, rng=rng).ok
    shifted = tf.naive_attention(q, k[:, ::-1], v[:, ::-1])[0]  # every query head on the other K/V head
    assert not checking.check_output(shifted, q, k, v, causal=False, rng=rng).ok


@pytest.mark.parametrize("causal", [False, True])
def test_naive_and_reference_backward(rng, causal, monkeypatch):
    """The naive backward (float32, NumPy) and the float64 reference by blocks of rows against stage 0."""
    monkeypatch.setattr(checking, "ROW_BLOCK", 7)  # several blocks of rows, the last one ragged
    q, k, v = make_qkv(rng, (), 20, 20, d=8, dtype=np.float32)
    do = rng.standard_normal((20, 8)).astype(np.float32)
    expected = tf.reference_attention_backward(q, k, v, do, causal=causal)
    naive = checking.naive_attention_backward(q, k, v, do, causal=causal)
    reference = checking.reference_backward(q, k, v, do, causal=causal)
    for name, a, b, c in zip(("dq", "dk", "dv"), naive, reference, expected):
        assert a.dtype == np.float32 and b.dtype == np.float64
        assert_close(a, c, checking.F32_GRAD_TOL, f"{name} naive backward, float32")
        assert_close(b, c, 1e-12, f"{name} float64 reference")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_check_gradients(rng, dtype):
    """Right gradients pass (float32 within F32_GRAD_TOL; float16 by the rule for gradients), wrong ones fail."""
    q, k, v = make_qkv(rng, (2,), 24, 24, d=8, dtype=dtype)
    do = rng.standard_normal(q.shape).astype(dtype)
    o, lse = tf.blocked_attention(q, k, v, causal=True)
    grads = tf.blocked_attention_backward(q, k, v, o, lse, do, causal=True)
    assert checking.check_gradients(grads, q, k, v, do, causal=True).ok
    wrong = [g.copy() for g in grads]
    wrong[1][0, 3] *= 1.5  # one key's gradient of the first head
    assert not checking.check_gradients(wrong, q, k, v, do, causal=True).ok


def test_bfloat16_is_judged_by_flashattentions_rule():
    """bfloat16 rounds to 8 bits of mantissa; its rounding term and the rule use that type, by name."""
    x = np.array([1.0, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-9, 3.14159])
    assert list(round_to(x, "bfloat16")) == [1.0, 1.0, 1.0 + 2.0**-7, 3.140625]  # ties to even
    ref = np.linspace(-2, 2, 64)
    naive = round_to(ref, "bfloat16")
    assert within_tolerance(naive, ref, "bfloat16", naive).ok
    assert not within_tolerance(ref + 0.05, ref, "bfloat16", naive).ok
    with pytest.raises(ValueError, match="bfloat16 results are judged against a naive bfloat16 result"):
        within_tolerance(ref, ref, "bfloat16")


def test_csv_writer_keeps_to_the_schema(tmp_path):
    writer = record.CsvWriter(tmp_path / "x.csv")
    writer.write({"impl": "tinyflash", "dtype": "float32", "n_q": 64, "time_ms": 1.234567891, "status": "ok"})
    with pytest.raises(ValueError, match="outside the schema"):
        writer.write({"impl": "tinyflash", "colour": "green"})
    writer.close()
    rows = list(csv.DictReader(open(tmp_path / "x.csv")))
    assert list(rows[0]) == record.FIELDS and rows[0]["time_ms"] == "1.23457" and rows[0]["regs"] == ""
    record.CsvWriter(tmp_path / "x.csv").close()  # the same schema: replaced
    (tmp_path / "other.csv").write_text("stage,n,bytes\nnaive,256,600841\n")
    with pytest.raises(ValueError, match="other.csv holds a CSV with other columns"):
        record.CsvWriter(tmp_path / "other.csv")
    assert (tmp_path / "other.csv").read_text() == "stage,n,bytes\nnaive,256,600841\n"  # not overwritten


def test_committed_benchmark_records_keep_to_the_schema():
    """Every benchmark CSV of the record has the one schema, device, date and versions in every row, and a
    timing method where it was timed."""
    found = 0
    for path in sorted(record.data_dir().glob("*.csv")):
        with open(path, newline="") as f:
            header = next(csv.reader(f))
        if "benchmark" not in header:
            continue
        found += 1
        assert header == record.FIELDS, path.name
        for r in record.read_csv(path):
            assert r["device"] and r["date"] and r["numba_cuda"], (path.name, r)
            assert r["benchmark"] in suites.BENCHMARKS, (path.name, r["benchmark"])
            assert (r["timing"] in record.TIMINGS) == bool(r["time_ms"]), (path.name, r)
            assert r["status"].split()[0] in record.STATUSES, (path.name, r["status"])
    assert found >= 8


def test_flops():
    assert runner.attention_flops(1, 32, 4096, 4096, 128, False) == 4 * 32 * 4096**2 * 128
    assert runner.attention_flops(2, 1, 10, 20, 8, True) == 2 * 2 * 10 * 20 * 8
    assert runner.backward_flops(1, 32, 16384, 16384, 128, False) == 10 * 32 * 16384**2 * 128


def test_points_expand_the_axes():
    bench = suites.BENCHMARKS["tensor-cores"]
    found = runner.points(bench, {"d": [64], "causal": [True], "dtype": None})
    assert [(p["dtype"], p["n_q"], p["n_k"], p["d"], p["causal"]) for p in found] == [
        ("float16", 4096, 4096, 64, True), ("float16", 16384, 16384, 64, True),
        ("bfloat16", 4096, 4096, 64, True), ("bfloat16", 16384, 16384, 64, True)]
    assert all(p["batch"] == 1 and p["heads"] == p["kv_heads"] == 32 for p in found)
    decode = runner.points(suites.BENCHMARKS["decode"], {"batch": [8]})
    assert [(p["batch"], p["n_q"], p["n_k"], p["heads"], p["kv_heads"]) for p in decode] == [
        (8, 1, 4096, 32, 8), (8, 1, 32768, 32, 8), (8, 1, 131072, 32, 8)]


class ToyGpu:
    """A stand-in for the GPU and its clock: each call of a peer enqueues ``cost`` ms of GPU work after ``host``
    ms of host time; the GPU runs work in order, as soon as it is enqueued and the work before it is done.
    Events are work of no cost; ``sync`` waits for the queue."""

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
    gpu = ToyGpu()
    peers_ = {"fast kernel, slow host": (gpu.peer("a", host=0.05, cost=0.4), nullcontext),
              "slow kernel, fast host": (gpu.peer("b", host=0.01, cost=0.42), nullcontext),
              "long": (gpu.peer("c", host=0.01, cost=100.0), nullcontext)}
    out = timing.time_interleaved(peers_, rounds=6, clock=gpu)
    a, b, c = (out[name] for name in peers_)
    assert a["time_ms"] == pytest.approx(0.4) and b["time_ms"] == pytest.approx(0.42)  # the kernels' own time
    assert a["latency_ms"] == pytest.approx(0.45) and b["latency_ms"] == pytest.approx(0.43)  # host time shows
    assert a["rounds"] == len(a["rounds_ms"]) == 6
    assert a["burst"] == math.ceil(timing.BURST_MS / 0.45) and c["burst"] == timing.MIN_BURST
    timed = gpu.calls[3 * (timing.WARMUP + 1):]  # after each peer's warm-up calls and the call that sizes its burst
    settle = {"a": math.ceil(timing.SETTLE_MS / 0.45), "b": math.ceil(timing.SETTLE_MS / 0.43), "c": 2}
    calls = {p: settle[p] + 2 + out[name]["burst"] for p, name in zip("abc", peers_)}  # settle, alone, untimed, burst
    order = "abc" + "bca" + "cab" + "cba" + "acb" + "bac"  # rotated, then reversed in the second cycle
    i = 0
    for p in order:  # each peer's calls of a round together, in this order
        assert timed[i:i + calls[p]] == [p] * calls[p]
        i += calls[p]
    assert i == len(timed)
    assert [timing.round_order(list("xy"), r) for r in range(4)] == [list("xy"), list("yx"), list("yx"), list("xy")]


def fake_timer(per_round: dict):
    """A timer that returns the given queued times per round (and a latency of twice the median)."""
    def timer(calls, rounds):
        assert list(calls) == list(per_round)
        return {name: {"time_ms": statistics.median(ms), "time_min_ms": min(ms), "time_max_ms": max(ms),
                       "rounds": len(ms), "burst": 3, "latency_ms": 2 * statistics.median(ms), "rounds_ms": ms}
                for name, ms in per_round.items()}

    return timer


def test_runner_checks_first_times_what_passed_and_compares_with_the_baseline(monkeypatch):
    """A peer that fails its check gets no time; one of another dtype gets no row; the others get times, TFLOP/s
    and their speed over the baseline: median over median, the quartiles of the rounds', the latencies'."""
    def peer(impl, variant, fn, dtypes=("float32",)):
        return peers.Peer(impl, variant, lambda x: (lambda: fn(x)), dtypes)

    right = lambda x: tf.naive_attention(x["q"], x["k"], x["v"], causal=x["causal"])[0]  # noqa: E731
    found = [peer("torch_flash", "", right), peer("tinyflash", "v6", right),
             peer("tinyflash", "broken", lambda x: right(x) + 1), peer("tinyflash", "v5", right, ("float16",))]
    bench = suites.Benchmark("toy", "a toy", "forward", {"dtype": ("float32",), "d": (16,), "causal": (False,),
                                                        "n": (40,)}, lambda point: found, fixed={"batch": 1, "heads": 2},
                             library="numpy", rounds=5)
    timer = fake_timer({("torch_flash", ""): [1.0, 1.0, 1.2, 1.0, 1.0], ("tinyflash", "v6"): [0.8, 0.9, 1.0, 0.85, 1.25]})
    lines = []
    rows = runner.run(bench, timer=timer, env={"device": "toy", "date": "today", "numba_cuda": "0", "cupy": "", "torch": "", "commit": ""},
                      echo=lines.append)
    assert [(r["impl"], r["variant"]) for r in rows] == [("torch_flash", ""), ("tinyflash", "v6"),
                                                         ("tinyflash", "broken")]
    flash, v6, broken = rows
    assert "time_ms" not in broken and broken["status"].startswith("wrong (error")
    assert flash["vs_baseline"] == 1.0 and v6["vs_baseline"] == pytest.approx(1.0 / 0.9)
    ratios = [1.25, 1.0 / 0.9, 1.2, 1.0 / 0.85, 0.8]  # the rounds' flash / v6
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    assert (v6["vs_baseline_q1"], v6["vs_baseline_q3"]) == (pytest.approx(q1), pytest.approx(q3))
    assert v6["latency_vs_baseline"] == pytest.approx(1.0 / 0.9) and v6["timing"] == "interleaved"
    assert v6["tflops"] == pytest.approx(runner.attention_flops(1, 2, 40, 40, 16, False) / (0.9 * 1e9))
    assert v6["peak_bytes"] > 0 and v6["baseline"] == "torch_flash" and v6["n_q"] == v6["n_k"] == 40
    assert len(lines) == 4 and "wrong (error" in lines[-1]


@pytest.mark.simulator
@pytest.mark.grid
def test_the_forward_peers_compute_attention(rng):
    """What `python -m tinyflash.bench versions | vector | tiles | sweep` measure, each peer made once on tiny
    NumPy inputs (on the simulator without a GPU): every one passes the check the runner makes."""
    point = {"dtype": "float32", "d": 64, "causal": True, "n_q": 10, "n_k": 13}
    x = {"q": None, "causal": True}
    q, k, v = make_qkv(rng, (1, 1), 10, 13, d=64, dtype=np.float32)  # one query tile for every tiling
    x.update(q=q, k=k, v=v)
    found = suites.version_peers(point) + suites.vector_peers(point) + suites.tile_peers(point)
    assert [p.variant for p in suites.version_peers(point)] == list(VERSIONS)
    for peer in found + [p for p in suites.sweep_peers(point) if not p.impl.startswith("torch")]:
        if "float32" in peer.dtypes:
            assert checking.check_output(peer.make(x)(), q, k, v, causal=True, rng=rng).ok, peer.name
    q16, k16, v16 = make_qkv(rng, (1, 1), 37, 37, d=64, dtype=np.float16)  # a ragged tile
    stage3 = next(p for p in suites.sweep_peers(point) if p.variant == "v6")
    assert stage3.dtypes == ("float16", "bfloat16") and "float32" not in stage3.dtypes
    out = stage3.make({"q": q16, "k": k16, "v": v16, "causal": True})()
    assert checking.check_output(out, q16, k16, v16, causal=True, rng=rng, rows=37).ok


def test_every_benchmark_has_a_table_or_says_it_has_none():
    """--summary finds the table of a record by its benchmark; one without a table is refused by name."""
    for name in tables.TABLES:
        assert name in suites.BENCHMARKS
    with pytest.raises(ValueError, match="no table for the benchmark"):
        tables.summary([{"benchmark": "backward-tiles"}])


def row(benchmark, impl, variant="", status="ok", **fields):
    """A record row from keyword fields (strings, as read back from a CSV)."""
    out = {f: "" for f in record.FIELDS}
    out.update(benchmark=benchmark, impl=impl, variant=variant, status=status, batch="1", heads="32", kv_heads="32",
               causal="False", d="128", dtype="float16")
    out.update({k: str(v) for k, v in fields.items()})
    return out


def test_sweep_table_with_and_without_stage_3():
    """The sweep's table: stage 3 (v6) gets its TFLOP/s and its speed relative to SDPA flash in float16 rows,
    'OOM' where it ran out of memory, '–' in float32 rows and everywhere in a record without v6 rows."""
    ms = {("tinyflash", "v5"): 10.0, ("tinyflash", "v6"): 2.0, ("torch_flash", ""): 1.6, ("torch_efficient", ""): 3.0,
          ("naive", ""): 50.0}
    rows = [row("sweep", impl, variant, dtype=dtype, d=64, n_q=16384, time_ms=t, tflops=100 / t,
                peak_bytes=2**20 * (1000 if impl == "naive" else 10))
            for dtype in ("float16", "float32") for (impl, variant), t in ms.items()
            if not (dtype == "float32" and (impl, variant) in (("tinyflash", "v6"), ("torch_flash", "")))]
    rows.append(dict(rows[0], d="128"))  # float16, d = 128: stage 2 ran, stage 3 ran out of memory
    rows.append(dict(rows[1], d="128", status="oom", time_ms="", tflops=""))
    table = tables.sweep_table(rows).splitlines()
    assert len(table) == 2 + 3
    mem = "10 MiB / 1,000 MiB"
    assert table[2] == f"| float16 | 64 | False | 10.0 | 50.0 | 33.3 | 62.5 | 2.0 | 0.30× | 0.80× | 5.0× | {mem} |"
    assert table[3] == "| float16 | 128 | False | 10.0 | OOM | – | – | – | – | – | – | – |"
    assert table[4] == f"| float32 | 64 | False | 10.0 | – | 33.3 | – | 2.0 | 0.30× | – | 5.0× | {mem} |"
    without = tables.sweep_table([r for r in rows if r["variant"] != "v6"]).splitlines()
    assert [line.split("|")[5].strip() for line in without[2:]] == ["–"] * 3
    assert tables.summary(rows) == tables.sweep_table(rows)


def test_versions_table():
    rows = [row("versions", "tinyflash", name, dtype="float32", d=d, n_q=16384, tflops=i + d / 100)
            for i, name in enumerate(VERSIONS) for d in (64, 128)]
    table = tables.versions_table(rows).splitlines()
    assert table[0] == "| version | what changed | d = 64 | d = 128 |" and len(table) == 2 + len(VERSIONS)
    assert table[2].startswith("| v1 | ") and table[2].endswith("| 0.6 | 1.3 |")
    with pytest.raises(ValueError, match="one sequence length"):
        tables.versions_table(rows + [dict(rows[0], n_q="1024")])


def test_backward_table():
    """TFLOP/s per implementation, speed against SDPA efficient and naive attention, OOM shown."""
    flops = runner.backward_flops(1, 32, 16384, 16384, 128, False)
    rows = [row("backward", "tinyflash", "v1", dtype="float32", n_q=4096, time_ms=2.0),
            row("backward", "naive", dtype="float32", n_q=4096, time_ms=5.0),
            row("backward", "tinyflash", "v1", dtype="float32", n_q=16384, time_ms=40.0, tflops=flops / 40e9),
            row("backward", "torch_efficient", dtype="float32", n_q=16384, time_ms=30.0, tflops=flops / 30e9),
            row("backward", "torch_flash", dtype="float16", n_q=16384, time_ms=4.0, tflops=flops / 4e9),
            row("backward", "naive", dtype="float32", n_q=16384, status="oom")]
    line = tables.backward_table(rows).splitlines()[2]
    assert line.startswith(f"| 128 | False | {flops / 40e9:.1f} | ") and "| OOM |" in line
    assert line.endswith("| 0.75× | 2.5× | – |"), line


def test_decode_table_and_bar():
    """µs per call, the split count, the rate over the copy's and the bar, from a synthetic decode record."""
    def d(impl, variant="", ms=1.0, **fields):
        return row("decode", impl, variant, batch=1, n_k=4096, time_ms=ms, **fields)

    rows = [d("torch_flash", ms=0.05), d("torch_flash", "CUDA graph", ms=0.04), d("split_kv", ms=0.05, num_splits=28,
            tb_per_s=0.7), d("split_kv", "CUDA graph", ms=0.04), d("no_split", ms=0.1), d("paged", "page_size=16", ms=0.05),
            d("torch_cudnn", ms=0.06), d("copy", "device-to-device, K and V", ms=0.02, tb_per_s=1.4)]
    line = tables.decode_table(rows).splitlines()[2]
    assert line == "| 1 | 4,096 | 28 | 50.0 | 100.0 | 50.0 | 50.0 | 60.0 | 20.0 | 0.70 | 1.00× | 1.00× | 50% | 1.00 |"
    assert tables.decode_bar_sentence(rows).startswith("per call, split-KV is at 1.00× or more of SDPA flash")
    assert "the bar is not met" in tables.decode_bar_sentence(rows)  # 50% of the copy's rate < 80%


def test_the_compiled_kernels_record_covers_every_default_kernel():
    """figures/data/ptxas_sm90.csv (benchmarks/ptxas_report.py) has each kind of kernel, at most 255 registers."""
    from tinyflash.bench.record import data_dir, read_csv

    rows = read_csv(data_dir() / "ptxas_sm90.csv")
    assert {"forward v5", "forward v6", "backward v1", "decode split, tensor cores", "decode split, CUDA cores",
            "decode combine"} <= {r["kernel"] for r in rows}
    assert all(0 < int(r["registers"]) <= 255 and int(r["spill_stores"]) >= 0 for r in rows)


def test_the_commit_of_a_row(monkeypatch):
    """A row names the checkout's commit ('+': with changes), or TINYFLASH_COMMIT where a copy's .git is not its own."""
    from tinyflash.bench.record import git_commit

    monkeypatch.delenv("TINYFLASH_COMMIT", raising=False)
    assert re.fullmatch(r"[0-9a-f]{7,}\+?", git_commit())
    monkeypatch.setenv("TINYFLASH_COMMIT", "abc1234+")
    assert git_commit() == "abc1234+"


def test_a_benchmark_may_fix_sizes_per_sequence_length():
    """backward-tensor-cores: B = 4 at N = 4,096 and B = 1 at N = 16,384 (as the issue's bar is set), H = 32."""
    from tinyflash.bench.runner import points
    from tinyflash.bench.suites import BENCHMARKS

    found = {(pt["n_q"], pt["batch"], pt["heads"]) for pt in points(BENCHMARKS["backward-tensor-cores"])}
    assert found == {(4096, 4, 32), (16384, 1, 32)}


def test_hopper_tables():
    """The hopper benchmark's table: each step over flash, and hopper_attention's kernel against flash (TFLOP/s, one
    call alone) and against cuDNN by time; the tilings'."""
    VERSION = VERSIONS.default("hopper_attention").name

    times = {("tinyflash", VERSION): 8.0, ("tinyflash", "v6"): 12.0, ("torch_flash", ""): 10.0, ("torch_cudnn", ""): 6.0}
    rows = [row("hopper", impl, variant, n_q=16384, time_ms=ms, tflops=round(440 / ms, 1), vs_baseline=10.0 / ms,
                vs_baseline_q1=1.2, vs_baseline_q3=1.3, latency_vs_baseline=1.1) for (impl, variant), ms in times.items()]
    table = tables.summary(rows).splitlines()
    assert table[0].startswith(f"| dtype | d | causal | B × N | v6 / flash | {VERSION} / flash | {VERSION} TFLOP/s |")
    assert table[2] == "| float16 | 128 | False | 1 × 16,384 | 0.83× | 1.25× | 55.0 | 1.10× | 0.75× | 44.0 | 73.3 |"
    tiles = [row("hopper-tiles", "tinyflash", f"v7 warpgroups={wg} BC=128 lazy=True", n_q=16384, tflops=100 * wg,
                 vs_baseline=wg / 2) for wg in (1, 2)] + [row("hopper-tiles", "torch_flash", n_q=16384, tflops=150)]
    table = tables.summary(tiles).splitlines()
    assert table[0] == "| N | d | causal | warpgroups=1 BC=128 lazy=True | warpgroups=2 BC=128 lazy=True | SDPA flash |"
    assert table[2] == "| 16,384 | 128 | False | 100.0 (0.50×) | 200.0 (1.00×) | 150.0 |"


def test_head_dim_table_with_and_without_stage_4():
    """The head-dims table: v6, its fastest tiling, SDPA flash; hopper_attention's kernel in two more columns where
    the record has its rows (on Hopper, at d = 256), '–' at a d it did not run."""
    VERSION = VERSIONS.default("hopper_attention").name

    times = {("tinyflash", "v6"): 12.0, ("tinyflash", "v6 warps=8 BC=64 group=1"): 11.0, ("torch_flash", ""): 10.0,
             ("tinyflash", VERSION): 8.0}
    rows = [row("head-dims", impl, variant, d=d, n_q=16384, time_ms=ms, tflops=round(440 / ms, 1),
                vs_baseline=10.0 / ms, latency_vs_baseline=1.1) for d in (96, 256) for (impl, variant), ms in times.items()
            if d == 256 or variant != VERSION]
    table = tables.summary(rows).splitlines()
    assert table[0].endswith(f"| its speed / flash | {VERSION} TFLOP/s | {VERSION} / flash | SDPA flash |")
    assert table[1] == "|---" * 12 + "|"
    assert table[2] == "| float16 | 96 | False | 1 × 16,384 | 36.7 | 0.83× | 1.10× | warps=8 BC=64 | 0.91× | – | – | 44.0 |"
    assert table[3] == ("| float16 | 256 | False | 1 × 16,384 | 36.7 | 0.83× | 1.10× | warps=8 BC=64 | 0.91× | 55.0 | 1.25× "
                        "| 44.0 |")
    without = tables.head_dim_table([r for r in rows if r["variant"] != VERSION]).splitlines()
    assert without[0].endswith("| its speed / flash | SDPA flash |") and without[3].endswith("| 0.91× | 44.0 |")

