"""Memory measured with tracemalloc sits on the model: naive holds S + P + O, blocked only O + lse
and a fixed set of tiles, whatever N is."""

import tracemalloc

import numpy as np
import pytest
from conftest import make_qkv

import tinyflash as tf
from tinyflash.cost.memory import (KiB, attention_memory, blocked_workspace_bytes, max_sequence_length, measure_peak_bytes)
from tinyflash.hardware import CONSUMER_CARD_BYTES, H200

D = 64


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [512, 1024, 2048])
def test_naive_peak_is_s_plus_p_plus_o(rng, n, causal):
    """naive_attention's peak within 10% of S + P + O (float32), and never below it."""
    q, k, v = make_qkv(rng, (), n, n, D, dtype=np.float32)
    peak, (o, lse) = measure_peak_bytes(tf.naive_attention, q, k, v, causal=causal)
    model = attention_memory(n, D, dtype="float32").naive_extra
    assert model <= peak <= 1.10 * model, f"N={n}: measured {peak} bytes, model {model}"
    assert o.shape == (n, D)


def test_naive_peak_grows_as_n_squared(rng):
    """Doubling N quadruples the naive peak beyond O (to within 2%): the N × N matrices dominate."""
    beyond_o = []
    for n in (512, 1024):
        q, k, v = make_qkv(rng, (), n, n, D, dtype=np.float32)
        beyond_o.append(measure_peak_bytes(tf.naive_attention, q, k, v)[0] - n * D * 4)
    assert beyond_o[1] / beyond_o[0] == pytest.approx(4.0, rel=0.02)


@pytest.mark.parametrize("causal", [False, True])
def test_blocked_peak_is_flat_beyond_its_outputs(rng, causal):
    """blocked_attention: peak − (O + lse) is the same at N = 512, 1024, 2048 (to 1 KiB) and near the tile model."""
    block = 64
    extras = []
    for n in (512, 1024, 2048):
        q, k, v = make_qkv(rng, (), n, n, D, dtype=np.float32)
        peak, _ = measure_peak_bytes(tf.blocked_attention, q, k, v, causal=causal, block_q=block, block_k=block)
        outputs = attention_memory(n, D, dtype="float32").flash_extra  # O + lse
        extras.append(peak - outputs)
        assert peak < attention_memory(n, D, dtype="float32").scores / 4  # nowhere near one N × N matrix
    assert max(extras) - min(extras) <= KiB, f"tile workspace changed with N: {extras}"
    workspace = blocked_workspace_bytes(block, block, D, "float32")  # modelled without the causal mask
    if causal:  # the mask tile and np.where's copy of S_ij come on top: about one tile more
        assert workspace < extras[-1] < 1.5 * workspace, (extras, workspace)
    else:
        assert extras[-1] == pytest.approx(workspace, rel=0.10), (extras, workspace)


def test_measure_peak_bytes_sees_numpy_and_restores_tracing():
    n_bytes = 8 * 1_000_000
    peak, x = measure_peak_bytes(np.ones, 1_000_000)  # (1_000_000,) float64
    assert n_bytes <= peak <= n_bytes + 4 * KiB and x.nbytes == n_bytes
    assert not tracemalloc.is_tracing()  # it was off before, so it is off again
    tracemalloc.start()
    try:
        peak, _ = measure_peak_bytes(lambda: np.zeros(1000).sum())  # temporaries freed: still counted in peak
        assert 8000 <= peak <= 8000 + 4 * KiB
        assert tracemalloc.is_tracing()  # left running for whoever started it
    finally:
        tracemalloc.stop()
    with pytest.raises(TypeError, match="fn must be callable"):
        measure_peak_bytes(42)


def test_max_sequence_length_is_the_exact_boundary():
    for budget, heads, matrices in ((H200.memory_bytes, 32, 2), (CONSUMER_CARD_BYTES, 32, 2), (H200.memory_bytes, 1, 1)):
        n = max_sequence_length(budget, heads=heads, dtype="float16", matrices=matrices)
        need = lambda n: heads * matrices * n * n * 2  # noqa: E731  bytes of the N × N matrices
        assert need(n) <= budget < need(n + 1)
    # 32 heads at 32k tokens: S and P in fp16 take 128 GiB, which fits in 141 GB, just
    assert max_sequence_length(H200.memory_bytes, heads=32) == 33_189
    assert max_sequence_length(CONSUMER_CARD_BYTES, heads=32) == 14_188
    with pytest.raises(ValueError, match="heads must be a positive integer"):
        max_sequence_length(2**30, heads=0)
    with pytest.raises(ValueError, match="budget_bytes"):
        max_sequence_length(-1)


def test_blocked_workspace_model_inputs():
    assert blocked_workspace_bytes(64, 64, 64, "float32") == (2 * 64 * 64 + 4 * 64 * 64) * 4  # P·V's moment
    assert blocked_workspace_bytes(256, 256, 64, "float32") == (3 * 256 * 256 + 256 * 64) * 4  # S_ij's moment
    with pytest.raises(ValueError, match="block_k must be a positive integer"):
        blocked_workspace_bytes(64, 0, 64)
