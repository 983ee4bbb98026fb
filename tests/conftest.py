"""Shared fixtures: fresh random inputs for every test, with the seed printed for reproduction."""

import os
import secrets

import numpy as np
import pytest


@pytest.fixture
def rng():
    """A generator with a fresh seed each run (set TINYFLASH_SEED to replay one); the seed is printed."""
    seed = int(os.environ.get("TINYFLASH_SEED", secrets.randbits(32)))
    print(f"random seed: {seed} (replay with TINYFLASH_SEED={seed})")
    return np.random.default_rng(seed)


def make_qkv(rng, lead, n_q, n_k, d, d_v=None, dtype=np.float64):
    """Standard-normal q (lead, Nq, d), k (lead, Nk, d), v (lead, Nk, dv), never zeros."""
    d_v = d if d_v is None else d_v
    q = rng.standard_normal((*lead, n_q, d)).astype(dtype)
    k = rng.standard_normal((*lead, n_k, d)).astype(dtype)
    v = rng.standard_normal((*lead, n_k, d_v)).astype(dtype)
    return q, k, v
