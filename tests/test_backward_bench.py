"""The backward benchmark's own arithmetic, on the CPU: its naive CuPy backward and its float64
reference are NumPy-compatible code, run here with NumPy standing in for CuPy, against stage 0."""

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
