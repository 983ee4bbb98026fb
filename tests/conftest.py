"""Shared fixtures: fresh random inputs for every test, with the seed printed for reproduction.

Also decides where CUDA kernels run, before anything imports numba: on a real GPU when CuPy sees
one (and NUMBA_ENABLE_CUDASIM is not set), otherwise on numba's CUDA simulator. Tests marked
``gpu`` need the real GPU and are skipped without one.
"""

import os
import secrets
import sys

import numpy as np
import pytest


from tinyflash.gpu.where import use_gpu_or_simulator  # imports no numba

HAS_GPU = use_gpu_or_simulator()  # a GPU if CuPy sees one, else NUMBA_ENABLE_CUDASIM=1 (before numba is imported)


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy (numba's simulator is too slow for these sizes)")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def simulator_threads_done():
    """After each test, on the simulator: the threads of a simulated kernel that raised have ended, so the
    next test compiles against numba's real ``cuda`` (``tinyflash.gpu.runtime.join_simulator_threads``)."""
    yield
    if not HAS_GPU and "numba.cuda.simulator.kernel" in sys.modules:  # numba is loaded, on its simulator
        from tinyflash.gpu.runtime import join_simulator_threads

        assert join_simulator_threads(), "a simulated kernel's threads still run 300 s after the test"


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
