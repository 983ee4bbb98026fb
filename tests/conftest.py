"""Shared fixtures: fresh random inputs for every test, with the seed printed for reproduction.

Also decides where CUDA kernels run, before anything imports numba: on a real GPU when CuPy sees
one (and NUMBA_ENABLE_CUDASIM is not set), otherwise on numba's CUDA simulator. Tests marked
``gpu`` need the real GPU and are skipped without one.

And the tiers: ``python -m pytest`` leaves out the exhaustive grid (tests marked ``grid``, and the GPU
tests, except those marked ``smoke``) and says so in one line at the end; ``python -m pytest --grid``
runs everything.
"""

import os
import secrets
import sys

import numpy as np
import pytest


from tinyflash.gpu.where import use_gpu_or_simulator  # imports no numba

HAS_GPU = use_gpu_or_simulator()  # a GPU if CuPy sees one, else NUMBA_ENABLE_CUDASIM=1 (before numba is imported)
GRID_LEFT_OUT = pytest.StashKey[int]()  # how many tests of the grid this run left out


def pytest_addoption(parser):
    parser.addoption("--grid", action="store_true",
                     help="run the exhaustive grid too (tests marked grid, and the GPU tests not marked smoke): "
                          "every size, head dim, dtype and tiling; what CI runs")


def in_grid(item) -> bool:
    """Whether a test belongs to the exhaustive grid: marked ``grid``, or a GPU test (realistic sizes), unless it
    is marked ``smoke`` (the one run of a kernel version or entry point that every tier makes)."""
    marked = item.get_closest_marker("grid") or item.get_closest_marker("gpu")
    return bool(marked) and not item.get_closest_marker("smoke")


@pytest.hookimpl(trylast=True)  # after -m and -k have chosen: only what they kept is counted as left out
def pytest_collection_modifyitems(config, items):
    if not config.getoption("grid"):
        left_out = [item for item in items if in_grid(item)]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if not in_grid(item)]
        config.stash[GRID_LEFT_OUT] = len(left_out)
    skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy (numba's simulator is too slow for these sizes)")
    for item in items:
        if item.get_closest_marker("gpu") and not HAS_GPU:
            item.add_marker(skip)


def pytest_sessionfinish(session):
    output = getattr(session.config, "workeroutput", None)
    if output is not None:  # a pytest-xdist worker: its count goes to the controller, which prints the line
        output["grid_left_out"] = session.config.stash.get(GRID_LEFT_OUT, 0)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller: a worker's count (each worker collects every test, so any one's will do)."""
    node.config.stash[GRID_LEFT_OUT] = getattr(node, "workeroutput", {}).get("grid_left_out", 0)


def pytest_terminal_summary(terminalreporter, config):
    """One line on what the tier left out, and how to run it."""
    left_out = config.stash.get(GRID_LEFT_OUT, 0)
    if left_out:
        terminalreporter.write_line(f"left out: {left_out:,} tests of the exhaustive grid (every size, head dim, "
                                    "dtype and tiling; the GPU tests): python -m pytest --grid runs them")


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
