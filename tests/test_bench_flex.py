"""The flex benchmark's parts that need no GPU: its check with a variant's functions, its points and its baseline."""

import numpy as np
import pytest
from conftest import make_qkv

import tinyflash as tf
from tinyflash.bench import checking, runner, suites


@pytest.mark.parametrize("variant", ["documents-8", "alibi"])
def test_check_with_a_flex_variant(rng, variant):
    """The flex benchmark's check: the reference and the naive computation take the variant's functions for each
    sampled head (ALiBi's bias depends on h); the same attention without them fails."""
    from tinyflash.bench import flex

    q, k, v = make_qkv(rng, (2, 4), 64, 64, d=16, dtype=np.float16)
    mods = flex.tinyflash_mods(variant, 64, 4)
    o, lse = tf.blocked_attention(q, k, v, causal=True, score_mod=mods[0], mask_mod=mods[1], block_q=16, block_k=16)
    assert checking.check_output(o, q, k, v, causal=True, rng=rng, lse=lse, rows=16, mods=mods).ok
    plain = tf.blocked_attention(q, k, v, causal=True)[0]
    assert not checking.check_output(plain, q, k, v, causal=True, rng=rng, rows=64, mods=mods).ok
    assert flex.dense_mask(variant, 64) is None or flex.dense_mask(variant, 64).sum() < 64 * 65 // 2


def test_flex_benchmark_points_and_baseline():
    """One point per variant; the baseline is FlexAttention's peer of the point's variant."""
    bench = suites.BENCHMARKS["flex"]
    assert [pt["mods"] for pt in runner.points(bench)] == list(suites.FLEX_VARIANTS)
    times = {("torch_flex", "alibi"): {}, ("tinyflash", "alibi"): {}}
    assert runner.baseline_of(bench, times) == ("torch_flex", "alibi")
    assert runner.baseline_of(suites.BENCHMARKS["tensor-cores"], times) == ("torch_flash", "")


def test_v10_peer_and_its_table_columns():
    """tinyflash's v10 peer is named "<variant> v10" beside v6's "<variant>"; the table shows both, and a dash where
    a record holds no v10 row (the runs before v10 took flex_attention)."""
    from tinyflash.bench import flex
    from tinyflash.bench.tables import flex_table

    assert flex.flex_tinyflash("alibi").name == ("tinyflash", "alibi")
    assert flex.flex_tinyflash("alibi", "v10").name == ("tinyflash", "alibi v10")
    row = {"status": "ok", "time_ms": "2.5", "vs_baseline": "0.5", "vs_baseline_q1": "0.4", "vs_baseline_q3": "0.6",
           "latency_vs_baseline": "0.45"}
    rows = [{**row, "impl": "torch_flex", "variant": "alibi", "time_ms": "1.25", "vs_baseline": "1"},
            {**row, "impl": "tinyflash", "variant": "alibi"},
            {**row, "impl": "tinyflash", "variant": "alibi v10", "time_ms": "1.0", "vs_baseline": "1.25"},
            {**row, "impl": "torch_flex", "variant": "causal", "time_ms": "5.0", "vs_baseline": "1"}]
    lines = flex_table(rows).splitlines()
    assert lines[2] == "| alibi | 1.250 | 2.500 | 0.50× | 0.40–0.60× | 0.45× | 1.000 | 1.25× | – |"
    assert lines[3] == "| causal | 5.000 | – | – | – | – | – | – | – |"
