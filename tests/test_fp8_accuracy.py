"""The FP8 accuracy study's tooling (tinyflash.bench.fp8_accuracy) and its committed record."""

import numpy as np

from tinyflash.bench import fp8_accuracy
from tinyflash.bench.record import data_dir, read_csv
from tinyflash.core.tolerance import round_to


def test_bfloat16_rounding_is_the_projects(rng):
    """ml_dtypes' bfloat16 and core.tolerance.round_to's bit arithmetic agree (both round to nearest even)."""
    x = (rng.standard_normal(10_000) * np.exp2(rng.uniform(-20, 20, 10_000))).astype(np.float32)
    assert np.array_equal(fp8_accuracy.to_bfloat16(x).astype(np.float64), round_to(x, "bfloat16"))


def test_the_study_orders_what_it_must(rng):
    """On a small input: bfloat16 beats every FP8 method, P's rounding alone is below per-tensor FP8's whole error,
    and per tensor's ratio to itself is 1."""
    seed = int(rng.integers(2**31))
    rmse = fp8_accuracy.measure(64, seed, n=96, heads=2, block=32)
    assert set(rmse) == set(fp8_accuracy.METHODS) and all(np.isfinite(x) and x > 0 for x in rmse.values())
    fp8 = [x for m, x in rmse.items() if m.startswith("fp8")]
    assert rmse["bfloat16"] < min(fp8) and rmse["e4m3 P only"] < rmse["fp8 per tensor"]
    rows = list(fp8_accuracy.rows(head_dims=(16,), seeds=(seed,), n=40, heads=1, block=16))
    assert [r["method"] for r in rows] == list(fp8_accuracy.METHODS)
    assert next(r for r in rows if r["method"] == "fp8 per tensor")["rmse_vs_per_tensor"] == 1.0


def test_the_record_is_whole():
    """figures/data/fp8_accuracy.csv: the schema, every (d, seed, method) once, a clean commit, and its table."""
    record = read_csv(data_dir() / "fp8_accuracy.csv")
    assert list(record[0]) == fp8_accuracy.FIELDS
    keys = [(int(r["d"]), int(r["seed"]), r["method"]) for r in record]
    assert sorted(keys) == sorted((d, s, m) for d in fp8_accuracy.HEAD_DIMS for s in fp8_accuracy.SEEDS
                                  for m in fp8_accuracy.METHODS)
    assert all(r["commit"] and not r["commit"].endswith("+") for r in record)
    assert fp8_accuracy.table(record).count("\n") == len(fp8_accuracy.METHODS) + 1
