"""HBM traffic: what blocked_attention counts equals the closed form, exactly; both sit within a
constant band of the paper's Θ bounds; standard attention's walk matches its formula."""

import time

import numpy as np
import pytest

from tinyflash.cost.memory import measure_peak_bytes
from tinyflash.cost.traffic import (SRAM_ELEMENTS, HBMCounter, flash_attention_traffic, flash_traffic_closed_form, keys_read_per_query_tile, standard_attention_traffic, standard_traffic_closed_form, theta_flash, theta_standard, tile_sizes, traffic_ratio)

# (Nq, Nk, Br, Bc): lengths that no tile divides, tiles of 1, tiles larger than N, Nq > Nk and Nq < Nk.
AWKWARD = [(1, 1, 64, 64), (63, 65, 16, 16), (65, 200, 16, 7), (200, 65, 17, 13), (129, 129, 64, 64),
           (300, 301, 64, 64), (97, 89, 1, 5), (50, 50, 128, 128)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k, block_q, block_k", AWKWARD)
def test_counted_equals_closed_form_per_tensor(n_q, n_k, block_q, block_k, causal):
    """Every tensor's bytes, read and written, counted by running blocked_attention == the formula."""
    for dtype, heads, d, d_v in (("float16", 1, 8, 8), ("float32", 2, 8, 5), ("float64", 3, 3, 7)):
        kw = dict(n_k=n_k, d_v=d_v, heads=heads, dtype=dtype, causal=causal, block_q=block_q, block_k=block_k)
        counted = flash_attention_traffic(n_q, d, **kw)
        closed = flash_traffic_closed_form(n_q, d, **kw)
        assert dict(counted.reads) == dict(closed.reads), (dtype, counted, closed)
        assert dict(counted.writes) == dict(closed.writes), (dtype, counted, closed)
        assert counted.total > 0


def test_flash_noncausal_by_hand():
    """N = 1000, d = 64, fp16, 64 × 64 tiles: Tr = 16 query tiles, each reading all 1000 keys and values."""
    io = flash_traffic_closed_form(1000, 64, dtype="float16", block_q=64, block_k=64)
    assert io.reads["Q"] == 1000 * 64 * 2
    assert io.reads["K"] == io.reads["V"] == 16 * 1000 * 64 * 2
    assert io.writes["O"] == 1000 * 64 * 2 and io.writes["lse"] == 1000 * 4
    assert io.total == 128_000 + 2 * 2_048_000 + 128_000 + 4_000


def test_flash_causal_by_hand():
    """N = 512, tiles of 64: query tile i reads key tiles 0..i, 1 + 2 + ... + 8 = 36 tiles in all."""
    io = flash_traffic_closed_form(512, 32, dtype="float32", causal=True, block_q=64, block_k=64)
    assert io.reads["K"] == io.reads["V"] == 36 * 64 * 32 * 4
    # tiles of one row and one key: query i reads keys 0..i, N(N+1)/2 in all; cheap even at N = 131,072
    start = time.perf_counter()
    io = flash_traffic_closed_form(131_072, 1, dtype="float16", causal=True, block_q=1, block_k=1)
    assert io.reads["K"] == 131_072 * 131_073 // 2 * 2
    assert time.perf_counter() - start < 1.0


def test_causal_rows_without_keys_read_nothing():
    """Nq = 200 > Nk = 65 (bottom-right causal): rows 0..134 see no key, so tiles ending by row 135 read none."""
    keys = keys_read_per_query_tile(200, 65, 16, 16, causal=True)  # (13,)
    assert keys.shape == (13,)
    assert (keys[:8] == 0).all()  # tiles 0..7 end at row 127 at the latest
    assert keys[8] == 16 and keys[-1] == 65  # tile 8 (rows 128..143) sees keys 0..8; the last tile all 65


def test_standard_walk_by_hand():
    """Standard attention, N = 1000, d = 64, fp16: inputs and O once, S and P written and read once each."""
    io = standard_attention_traffic(1000, 64, dtype="float16")
    assert io.reads == {"Q": 128_000, "K": 128_000, "S": 2_000_000, "P": 2_000_000, "V": 128_000}
    assert io.writes == {"S": 2_000_000, "P": 2_000_000, "lse": 4_000, "O": 128_000}
    assert io.total == standard_traffic_closed_form(1000, 64, dtype="float16") == 8_516_000


@pytest.mark.parametrize("n_q, n_k, d, d_v, heads, dtype, score_dtype",
                         [(1, 1, 1, 1, 1, "float16", None), (65, 200, 8, 5, 3, "float32", None),
                          (4097, 4099, 128, 64, 32, "float16", "float32"),
                          (131_072, 131_072, 128, 128, 32, "float16", None)])
def test_standard_walk_equals_closed_form(n_q, n_k, d, d_v, heads, dtype, score_dtype):
    kw = dict(n_k=n_k, d_v=d_v, heads=heads, dtype=dtype, score_dtype=score_dtype)
    assert standard_attention_traffic(n_q, d, **kw).total == standard_traffic_closed_form(n_q, d, **kw)


def test_counting_at_large_n_allocates_nothing_big():
    """The walk and the closed forms at N = 131,072 and 32 heads: no N × N array, well under a second."""
    start = time.perf_counter()
    peak, io = measure_peak_bytes(standard_attention_traffic, 131_072, 128, heads=32)
    assert io.reads["S"] == 32 * 131_072**2 * 2  # 1 TiB of scores read back...
    assert peak < 64 * 1024  # ...counted without allocating them
    Br, Bc = tile_sizes(SRAM_ELEMENTS, 128)
    peak, io = measure_peak_bytes(flash_traffic_closed_form, 131_072, 128, heads=32, causal=True, block_q=Br,
                                  block_k=Bc)
    assert peak < 16 * 131_072  # a few length-Tr vectors
    assert time.perf_counter() - start < 1.0


def test_tile_sizes():
    assert tile_sizes(SRAM_ELEMENTS, 64) == (64, 64)  # the default tiles of blocked_attention
    assert tile_sizes(16_384, 128) == (32, 32)
    assert tile_sizes(116_736, 64) == (456, 64)  # Br = ceil(M/4d), Bc capped at d
    assert tile_sizes(100, 64) == (1, 1)  # less than 4d: one row per tile
    with pytest.raises(ValueError, match="sram_elements"):
        tile_sizes(0, 64)
    with pytest.raises(TypeError, match="d must be a positive integer"):
        tile_sizes(1024, 64.0)


@pytest.mark.parametrize("n", [512, 1000, 4097, 65_537, 131_072])
def test_standard_within_constant_of_its_bound(n):
    """Counted / Θ(N·d + N²) stays between 4 and 4.1: S and P each written once and read once."""
    d = 64
    ratio = standard_traffic_closed_form(n, d, dtype="float16") / (theta_standard(n, d) * 2)
    assert 4.0 <= ratio <= 4.1, ratio


def flash_band(n, d, m):
    """Where counted / Θ(N²d²/M) must lie, from the closed form (fp16, lse in fp32), for M <= N·d.

    bytes = 2·(2N·d + Tr·N·2d) + 4N and Θ·2 = 2N²d²/M, so the ratio is
    2M/(Nd) + 2M·Tr/(Nd) + 2M/(Nd²), and N/Br <= Tr < N/Br + 1. With Br = ceil(M/4d) the middle
    term 2M/(d·Br) is close to 8 and never above it; 2M/(Nd) <= 2 when M <= N·d. So the ratio stays
    in about [8, 12] whatever N and M are: the constant hidden in the Θ.
    """
    Br, _ = tile_sizes(m, d)
    low = 2 * m / (n * d) + 2 * m / (d * Br) + 2 * m / (n * d * d)
    return low, low + 2 * m / (n * d)


@pytest.mark.parametrize("n", [256, 257, 300, 1000, 4097, 65_537, 131_072])
def test_flash_within_constant_of_its_bound_over_n(n):
    """Counted / Θ(N²d²/M) stays in a constant band over N (M = 16,384 <= N·d)."""
    d, m = 64, SRAM_ELEMENTS
    Br, Bc = tile_sizes(m, d)
    ratio = flash_traffic_closed_form(n, d, dtype="float16", block_q=Br, block_k=Bc).total / (theta_flash(n, d, m) * 2)
    low, high = flash_band(n, d, m)
    assert 7.8 <= low <= ratio < high <= 12.1, (low, ratio, high)


@pytest.mark.parametrize("n", [4096, 4099])
def test_flash_within_constant_of_its_bound_over_m(n):
    """The same band over SRAM sizes M from 4d to N·d: the 1/M law holds over the whole range."""
    d = 64
    for m in [2**p for p in range(8, 19)] + [116_736, 100_000]:  # 256 ... 262,144, and two that are not powers of 2
        Br, Bc = tile_sizes(m, d)
        moved = flash_traffic_closed_form(n, d, dtype="float16", block_q=Br, block_k=Bc).total
        ratio = moved / (theta_flash(n, d, m) * 2)
        low, high = flash_band(n, d, m)
        assert 7.8 <= low <= ratio < high <= 12.1, (m, low, ratio, high)


def test_counted_sits_in_the_band_too():
    """The same band from an actual run, not the formula: N = 1000, M = 16,384."""
    d, m = 64, SRAM_ELEMENTS
    Br, Bc = tile_sizes(m, d)
    ratio = flash_attention_traffic(1000, d, block_q=Br, block_k=Bc).total / (theta_flash(1000, d, m) * 2)
    low, high = flash_band(1000, d, m)
    assert low <= ratio <= high


def test_traffic_ratio_grows_with_sram():
    """At N = 4096, d = 64: 2× less traffic with 64 × 64 tiles, 13× with an H200's 228 KiB of fp16."""
    assert traffic_ratio(4096, 64, SRAM_ELEMENTS) == pytest.approx(2.0, abs=0.01)
    assert traffic_ratio(4096, 64, 116_736) == pytest.approx(12.98, abs=0.01)


def test_hbm_counter():
    io = HBMCounter()
    io.read("Q", np.zeros((3, 5), dtype=np.float16))
    io.read_bytes("Q", 10)
    io.write("O", np.zeros(7, dtype=np.float32))
    assert io.reads["Q"] == 40 and io.writes["O"] == 28
    assert (io.bytes_read, io.bytes_written, io.total) == (40, 28, 68)
    assert "Q" in repr(io)


@pytest.mark.parametrize("fn", [standard_attention_traffic, flash_traffic_closed_form, flash_attention_traffic])
def test_bad_inputs(fn):
    with pytest.raises(ValueError, match="n_q must be a positive integer"):
        fn(0, 64)
    with pytest.raises(TypeError, match="d must be a positive integer"):
        fn(64, "64")
    with pytest.raises(ValueError, match="n_k must be a positive integer"):
        fn(64, 8, n_k=-1)
    with pytest.raises(TypeError, match="dtype"):
        fn(8, 8, dtype="not-a-dtype")


def test_bad_causal_and_blocks():
    with pytest.raises(TypeError, match="causal must be True or False"):
        flash_traffic_closed_form(8, 8, causal="yes")
    with pytest.raises(ValueError, match="block_q must be a positive integer"):
        flash_traffic_closed_form(8, 8, block_q=0)
    with pytest.raises(TypeError, match="block_k must be a positive integer"):
        flash_attention_traffic(8, 8, block_k=2.5)
    with pytest.raises(ValueError, match="sram_elements"):
        theta_flash(8, 8, 0)
