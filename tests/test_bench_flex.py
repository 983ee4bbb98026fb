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
