"""The memory model reproduces the 32k-token example exactly."""

import pytest

from tinyflash.cost.memory import (GiB, KiB, MiB, attention_memory, dtype_bytes, format_bytes, tile_bytes)


def test_32k_example_one_head():
    m = attention_memory(32_768, 128, heads=1, dtype="float16")
    assert 32_768 * 32_768 == 1_073_741_824
    assert m.scores == 2 * GiB
    assert m.logits_and_probabilities == 4 * GiB
    assert m.q == m.k == m.v == 8 * MiB
    assert m.qkv == 24 * MiB
    assert m.o == 8 * MiB


def test_32k_example_32_heads():
    m = attention_memory(32_768, 128, heads=32, dtype="float16")
    assert m.scores == 64 * GiB
    assert m.logits_and_probabilities == 128 * GiB
    assert m.flash_extra == 32 * (8 * MiB + 32_768 * 4)  # O and a float32 lse per row


def test_tile_and_formatting():
    assert tile_bytes(128, 128, "float16") == 32 * KiB
    assert format_bytes(2 * GiB) == "2 GiB"
    assert format_bytes(24 * MiB) == "24 MiB"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(100) == "100 B"
    assert dtype_bytes("float32") == 4 and dtype_bytes("bfloat16") == 2


def test_bad_dtype():
    with pytest.raises(TypeError, match="dtype must be a float dtype"):
        dtype_bytes("not-a-dtype")
